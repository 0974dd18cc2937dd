// ibv_get_sysfs_path / ibv_read_sysfs_file, and the sysfs view of our device.
//
// Programs probe sysfs before they touch verbs: Open MPI's openib BTL declines quietly
// unless "<ibv_get_sysfs_path()>/class/infiniband" is a directory with an entry in it
// (opal_common_verbs_check_basics). softverbs has no kernel device there, so, as rdma-core
// lets SYSFS_PATH move the sysfs root, we publish a small tree of our own and report its
// root: class/infiniband/softverbs0 (node type, GUIDs, firmware, port 1 with state, link layer
// and GID table) and class/infiniband_verbs/uverbs0, in the kernel's file formats.
//
// Where: $SYSFS_PATH if the user set it (rdma-core's variable, used as given, trailing
// slashes dropped); else $SOFTVERBS_SYSFS; else /dev/shm/softverbs-sysfs-<uid>. A directory
// we create is 0700 and trusted only if it is a real directory owned by us; otherwise we
// fall back to "/sys" and publish nothing (so nobody else's tree is ever reported as ours).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "engine/device.h"
#include "engine/log.h"
#include "util/private_dir.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using sv::engine::Device;

bool mkdirs(const std::string& root, const std::string& rel) {
  std::string p = root;
  size_t i = 0;
  while (i < rel.size()) {
    size_t j = rel.find('/', i);
    if (j == std::string::npos) j = rel.size();
    p += '/';
    p.append(rel, i, j - i);
    if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) return false;
    i = j + 1;
  }
  return true;
}

// Atomic replace: processes that publish at the same time never leave a half-written file.
void put(const std::string& root, const std::string& rel, const std::string& text) {
  std::string p = root + "/" + rel;
  std::string tmp = p + ".tmp" + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), p.c_str()) != 0) unlink(tmp.c_str());
}

std::string guid_text(uint64_t g) {  // kernel format: 4 groups of 4 hex digits
  char b[24];
  std::snprintf(b, sizeof b, "%04x:%04x:%04x:%04x", unsigned(g >> 48 & 0xffff),
                unsigned(g >> 32 & 0xffff), unsigned(g >> 16 & 0xffff), unsigned(g & 0xffff));
  return b;
}

std::string gid_text(const ibv_gid& gid) {
  char b[INET6_ADDRSTRLEN];
  std::string s;
  for (int i = 0; i < 16; i += 2) {  // kernel format: 8 groups of 4 hex digits, no "::"
    std::snprintf(b, sizeof b, "%s%02x%02x", i ? ":" : "", gid.raw[i], gid.raw[i + 1]);
    s += b;
  }
  return s;
}

void publish(const std::string& root, Device* d) {
  const std::string dev = std::string("class/infiniband/") + d->dev.name;
  const std::string port = dev + "/ports/1";
  const std::string uverbs = std::string("class/infiniband_verbs/") + d->dev.dev_name;
  if (!mkdirs(root, port + "/gids") || !mkdirs(root, port + "/gid_attrs/types") ||
      !mkdirs(root, uverbs))
    return;
  sv::engine::refresh_gids(d);
  ibv_device_attr da;
  ibv_port_attr pa;
  sv::engine::fill_device_attr(d, &da);
  sv::engine::fill_port_attr(d, &pa);
  put(root, dev + "/node_type", "1: CA\n");
  put(root, dev + "/node_guid", guid_text(d->guid) + "\n");
  put(root, dev + "/sys_image_guid", guid_text(d->guid) + "\n");
  put(root, dev + "/fw_ver", std::string(da.fw_ver) + "\n");
  put(root, dev + "/hw_rev", "0x0\n");
  put(root, dev + "/hca_type", "softverbs\n");
  put(root, dev + "/node_desc", "softverbs user-space RDMA\n");
  put(root, port + "/state", "4: ACTIVE\n");
  put(root, port + "/phys_state", "5: LinkUp\n");
  put(root, port + "/link_layer", "Ethernet\n");
  put(root, port + "/lid", "0x0\n");
  put(root, port + "/sm_lid", "0x0\n");
  put(root, port + "/lid_mask_count", "0\n");
  put(root, port + "/cap_mask", "0x00010000\n");  // IBV_PORT_CM_SUP
  put(root, port + "/rate", "100 Gb/sec (4X EDR)\n");
  for (size_t i = 0; i < d->gids.size(); ++i) {
    put(root, port + "/gids/" + std::to_string(i), gid_text(d->gids[i]) + "\n");
    put(root, port + "/gid_attrs/types/" + std::to_string(i), "RoCE v2\n");
  }
  put(root, uverbs + "/ibdev", std::string(d->dev.name) + "\n");
  put(root, uverbs + "/abi_version", "1\n");
  put(root, "class/infiniband_verbs/abi_version", "6\n");
}

std::string compute_root() {
  if (const char* s = std::getenv("SYSFS_PATH"); s && *s) {
    std::string r = s;
    while (r.size() > 1 && r.back() == '/') r.pop_back();
    return r;
  }
  std::string r;
  if (const char* s = std::getenv("SOFTVERBS_SYSFS"); s && *s)
    r = s;
  else
    r = "/dev/shm/softverbs-sysfs-" + std::to_string(geteuid());
  if (!sv::own_private_dir(r)) {
    SV_WARN("sysfs: %s is not a private directory of ours; reporting /sys", r.c_str());
    return "/sys";
  }
  publish(r, sv::engine::the_device());
  return r;
}

}  // namespace

// rdma-core: const char *ibv_get_sysfs_path(void) (libibverbs/sysfs.c, not in the public
// headers; Open MPI's openib BTL calls it). The root is fixed at the first call.
SV_EXPORT const char* ibv_get_sysfs_path(void) {
  static const std::string root = compute_root();
  return root.c_str();
}

// rdma-core: reads "<dir>/<file>" into buf (NUL-terminated, trailing newline dropped) and
// returns its length, or -1 with errno.
SV_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (!dir || !file || !buf || size == 0) {
    errno = EINVAL;
    return -1;
  }
  std::string p = std::string(dir) + "/" + file;
  int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size);
  int e = errno;
  close(fd);
  if (n < 0) {
    errno = e;
    return -1;
  }
  if (n > 0) {
    if (buf[n - 1] == '\n') {
      buf[--n] = '\0';
    } else if (static_cast<size_t>(n) < size) {
      buf[n] = '\0';
    } else {  // no room for the terminator: fail now rather than hand out an open string
      errno = EOVERFLOW;
      return -1;
    }
  }
  return static_cast<int>(n);
}
