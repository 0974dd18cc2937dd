// The sysfs view of softverbs0 (src/verbs/sysfs.cc): where ibv_get_sysfs_path points, what
// the tree says, and when we refuse to publish. The root is fixed at the first call, and
// CTest runs each case in its own process, so every case sets its environment first.
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

// rdma-core's signature (not in the public headers; Open MPI's openib BTL calls it with it
// and crashed on an int (char *, size_t) one).
const char* sysfs_path() {
  using Fn = const char* (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "ibv_get_sysfs_path"));
  EXPECT_NE(fn, nullptr);
  return fn ? fn() : nullptr;
}

using ReadFn = int (*)(const char*, const char*, char*, size_t);
ReadFn read_sysfs() {
  auto fn = reinterpret_cast<ReadFn>(dlsym(RTLD_DEFAULT, "ibv_read_sysfs_file"));
  EXPECT_NE(fn, nullptr);
  return fn;
}

class Sysfs : public ::testing::Test {
 protected:
  std::string temp_dir() {
    char t[] = "/tmp/sv-sysfs-test.XXXXXX";
    EXPECT_NE(mkdtemp(t), nullptr);
    dirs_.push_back(t);
    return t;
  }
  void TearDown() override {
    for (auto& d : dirs_) std::filesystem::remove_all(d);
  }

 private:
  std::vector<std::string> dirs_;
};

std::string slurp(const std::string& p) {
  FILE* f = std::fopen(p.c_str(), "r");
  if (!f) return "<missing " + p + ">";
  char b[256];
  size_t n = std::fread(b, 1, sizeof b, f);
  std::fclose(f);
  return std::string(b, n);
}

TEST_F(Sysfs, TreeDescribesTheDeviceAsTheKernelWould) {
  std::string root = temp_dir() + "/sysfs";  // we create it, 0700
  setenv("SOFTVERBS_SYSFS", root.c_str(), 1);
  unsetenv("SYSFS_PATH");
  const char* p = sysfs_path();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p, root);
  struct stat st;
  ASSERT_EQ(stat(root.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_EQ(n, 1);
  std::string dev = root + "/class/infiniband/" + ibv_get_device_name(list[0]);
  EXPECT_EQ(slurp(dev + "/node_type"), "1: CA\n");
  char guid[32];
  uint64_t g = be64toh(ibv_get_device_guid(list[0]));
  std::snprintf(guid, sizeof guid, "%04x:%04x:%04x:%04x\n", unsigned(g >> 48 & 0xffff),
                unsigned(g >> 32 & 0xffff), unsigned(g >> 16 & 0xffff), unsigned(g & 0xffff));
  EXPECT_EQ(slurp(dev + "/node_guid"), guid);
  EXPECT_EQ(slurp(dev + "/ports/1/state"), "4: ACTIVE\n");
  EXPECT_EQ(slurp(dev + "/ports/1/link_layer"), "Ethernet\n");

  ibv_context* ctx = ibv_open_device(list[0]);
  ASSERT_NE(ctx, nullptr);
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
  std::string want;
  for (int i = 0; i < 16; i += 2) {
    char b[8];
    std::snprintf(b, sizeof b, "%s%02x%02x", i ? ":" : "", gid.raw[i], gid.raw[i + 1]);
    want += b;
  }
  EXPECT_EQ(slurp(dev + "/ports/1/gids/0"), want + "\n");
  EXPECT_EQ(slurp(root + "/class/infiniband_verbs/" + list[0]->dev_name + "/ibdev"),
            std::string(ibv_get_device_name(list[0])) + "\n");
  ibv_close_device(ctx);
  ibv_free_device_list(list);
}

// rdma-core's SYSFS_PATH moves the root: used as given (trailing slashes dropped), and we
// write nothing into a tree the user pointed us at.
TEST_F(Sysfs, SysfsPathIsHonouredAndLeftAlone) {
  std::string d = temp_dir();
  setenv("SYSFS_PATH", (d + "//").c_str(), 1);
  EXPECT_STREQ(sysfs_path(), d.c_str());
  struct stat st;
  EXPECT_NE(stat((d + "/class").c_str(), &st), 0);
}

// A directory someone else could write (or a symlink to one) is not ours to publish in:
// report the kernel's /sys and write nothing.
TEST_F(Sysfs, ASharedDirectoryIsNotTrusted) {
  std::string d = temp_dir();
  ASSERT_EQ(chmod(d.c_str(), 0777), 0);
  unsetenv("SYSFS_PATH");
  setenv("SOFTVERBS_SYSFS", d.c_str(), 1);
  EXPECT_STREQ(sysfs_path(), "/sys");
  struct stat st;
  EXPECT_NE(stat((d + "/class").c_str(), &st), 0);
}

TEST_F(Sysfs, ASymlinkIsNotTrusted) {
  std::string d = temp_dir();
  std::string link = d + "/link";
  ASSERT_EQ(symlink(d.c_str(), link.c_str()), 0);
  unsetenv("SYSFS_PATH");
  setenv("SOFTVERBS_SYSFS", link.c_str(), 1);
  EXPECT_STREQ(sysfs_path(), "/sys");
  struct stat st;
  EXPECT_NE(stat((d + "/class").c_str(), &st), 0);
}

// rdma-core: the file's text without its trailing newline, NUL-terminated, its length;
// -1 with errno when it is absent or does not fit with its terminator.
TEST_F(Sysfs, ReadSysfsFileAsRdmaCoreDoes) {
  std::string root = temp_dir() + "/sysfs";
  setenv("SOFTVERBS_SYSFS", root.c_str(), 1);
  unsetenv("SYSFS_PATH");
  ASSERT_EQ(sysfs_path(), root);
  ReadFn rd = read_sysfs();
  ASSERT_NE(rd, nullptr);
  std::string dev = root + "/class/infiniband/softverbs0";
  char buf[64];
  std::memset(buf, 'x', sizeof buf);
  EXPECT_EQ(rd(dev.c_str(), "node_type", buf, sizeof buf), 5);
  EXPECT_STREQ(buf, "1: CA");
  errno = 0;
  EXPECT_EQ(rd(dev.c_str(), "no_such_file", buf, sizeof buf), -1);
  EXPECT_EQ(errno, ENOENT);
  char small[3];
  errno = 0;
  EXPECT_EQ(rd(dev.c_str(), "node_type", small, sizeof small), -1);
  EXPECT_EQ(errno, EOVERFLOW);
  errno = 0;
  EXPECT_EQ(rd(nullptr, "node_type", buf, sizeof buf), -1);
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
