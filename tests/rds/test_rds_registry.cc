// The host registry's live tables (rds/bind.cc, wire/rds_files.h): a sender checks the answer it
// cached for a port of another process with two loads from that process' sealed table, not a
// system call per send. What must hold is what held with a peek per send: the first send after
// the owner let the port go, or died, finds it gone; and a table that another process could
// forge, or a hello that is not one, is not believed (the answer is checked by its connection).
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <dirent.h>

#include <fstream>
#include <string>
#include <vector>

#include "rds_test_util.h"

using namespace rdstest;
namespace wire = sv::wire;

namespace {

// Live tables mapped in this process (our own, and the owners' whose hellos we took).
int live_tables() {
  std::ifstream f("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);)
    if (line.find("softverbs-rds-live") != std::string::npos) ++n;
  return n;
}

bool wait_byte(int fd, char want, int ms) {
  pollfd p{fd, POLLIN, 0};
  char c = 0;
  return poll(&p, 1, ms) == 1 && read(fd, &c, 1) == 1 && c == want;
}

void put_byte(int fd, char c) {
  if (write(fd, &c, 1) != 1) _exit(90);
}

pid_t reap(pid_t pid) {
  kill(pid, SIGKILL);
  return waitpid(pid, nullptr, 0);
}

}  // namespace

// A port its owner let go of, then one whose owner was killed: each is found gone by the very
// next send (the message is dropped, as nobody holds the port), with the owner's table mapped
// beforehand (so the send believed the table, not a peek). Then both tables are let go.
TEST(RdsRegistry, ThePortsOfAnOwnerThatLetsGoOrDiesAreGoneAtTheNextSend) {
  const uint16_t mine = port(20), p1 = port(21), p2 = port(22);
  const int rc = in_private_child([&] {
    int cmd[2], ack[2];
    if (pipe(cmd) || pipe(ack)) return 1;
    // Forked before this process starts its stack (see RdsFork's MessageForAProcessThatDied).
    const pid_t owner = fork();
    if (owner == 0) {
      const int s1 = bound_socket(p1), s2 = bound_socket(p2);
      if (s1 < 0 || s2 < 0) _exit(2);
      put_byte(ack[1], 'r');
      if (!wait_byte(cmd[0], 'c', 60000)) _exit(3);
      svrds_close(s1);
      put_byte(ack[1], 'c');
      for (;;) pause();
    }
    int result = 0;
    if (!wait_byte(ack[0], 'r', 30000)) result = 4;
    const int a = result ? -1 : bound_socket(mine);
    const int before = live_tables();  // our own
    // The owner's registry thread takes each new querier in and sends its hello; the next
    // lookup maps the table.
    for (int i = 0; !result && i < 3000 && live_tables() < before + 2; ++i) {
      send_to(a, p1, "x", 1);
      send_to(a, p2, "y", 1);
      usleep(10000);
    }
    if (!result && live_tables() < before + 2) result = 10;
    // The loop's own messages acked first: one still unacked when the owner dies is put
    // back, and once the reconnect fails, dropped in the background (conn_reroute_orphans),
    // a count the exact ones below would take for theirs.
    if (!result && (!all_acked(a, mine, p1) || !all_acked(a, mine, p2))) result = 8;
    const uint64_t dropped = result ? 0 : counter(a, "send_drop_no_sock");
    if (!result) {
      put_byte(cmd[1], 'c');
      if (!wait_byte(ack[0], 'c', 30000)) result = 5;
    }
    if (!result && send_to(a, p1, "let go", 6) != 6) result = 6;
    if (!result && counter(a, "send_drop_no_sock") != dropped + 1) result = 11;
    reap(owner);
    if (!result && send_to(a, p2, "dead", 4) != 4) result = 7;
    if (!result && counter(a, "send_drop_no_sock") == dropped + 1) result = 12;
    if (!result && counter(a, "send_drop_no_sock") != dropped + 2) result = 14;
    if (!result && live_tables() != before) result = 13;
    if (a >= 0) svrds_close(a);
    return result;
  });
  EXPECT_EQ(rc, 0) << "1-8: set-up; 10: the owner's tables were never mapped; 11: a port let go "
                      "was still believed held; 12: a dead owner's port was; 13: a table "
                      "outlived the answers it checked; 14: more drops than the two sends";
}

namespace {

// A fake owner's hello on connection q: `slot` and `token` of the table fd (with `extra` more
// descriptors in the same message), the lock word claiming our thread.
void fake_hello(int q, int fd, int extra, bool bad_magic) {
  wire::RegistryHello h{0, static_cast<uint32_t>(syscall(SYS_gettid)), 77};
  std::byte b[wire::kRegistryHelloLen];
  wire::registry_hello_encode(h, b);
  if (bad_magic) b[0] ^= std::byte{1};
  int fds[8] = {fd, fd, fd, fd, fd, fd, fd, fd};
  const int n = 1 + extra;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof fds)] = {};
  iovec iov{b, sizeof b};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = CMSG_SPACE(sizeof(int) * static_cast<size_t>(n));
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * static_cast<size_t>(n));
  std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * static_cast<size_t>(n));
  (void)sendmsg(q, &mh, MSG_NOSIGNAL);
}

// A table that says "held" for ever: our thread in the lock word, token 77 in slot 0; `size`
// bytes, with `seals`.
int forged_table(int seals, size_t size = wire::kLiveTableBytes) {
  const int fd = memfd_create("softverbs-rds-live", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(wire::kLiveTableBytes)) != 0) return -1;
  void* p = mmap(nullptr, wire::kLiveTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  const auto tid = static_cast<uint32_t>(syscall(SYS_gettid));
  const uint64_t token = 77;
  std::memcpy(static_cast<char*>(p) + wire::kLiveLockOffset, &tid, sizeof tid);
  std::memcpy(static_cast<char*>(p) + wire::kLiveSlotsOffset, &token, sizeof token);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return -1;
  if (seals && fcntl(fd, F_ADD_SEALS, seals) != 0) return -1;
  return fd;
}

// This process' descriptors whose link starts with `kind` ("pipe:", "/memfd:").
int fds_of(const char* kind) {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char t[256] = {};
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      if (readlink(path.c_str(), t, sizeof t - 1) > 0 && std::strncmp(t, kind, strlen(kind)) == 0)
        ++n;
    }
    closedir(d);
  }
  return n;
}

}  // namespace

// A process that holds port names and sends its queriers hellos that are not to be believed:
// an unsealed table (anyone it went to could write it), one sealed against shrinking only
// (still writable by them), a short one, a good one under a bad magic, a pipe in four
// descriptors, a table in eight (more than a querier takes: MSG_CTRUNC). No table is mapped,
// no descriptor stays, and each querier goes on checking by its connection: once the fake
// owner lets the names go (closing them and its queriers' connections, its tables still
// saying "held"), the next send to each port finds nobody and drops the message.
TEST(RdsRegistry, ATableAnotherProcessCouldForgeOrABadHelloIsNotBelieved) {
  constexpr int kFake = 6;
  const uint16_t mine = port(23), real = port(24);
  uint16_t fake[kFake];
  for (int i = 0; i < kFake; ++i) fake[i] = port(25 + i);
  const int rc = in_private_child([&] {
    int cmd[2], ack[2];
    if (pipe(cmd) || pipe(ack)) return 1;
    const pid_t owner = fork();
    if (owner == 0) {
      // A stack of its own, so that its process name holds a real rdma_cm port and lookups of
      // the fake ports find it; then the fake ports' names, held by hand.
      if (bound_socket(real) < 0) _exit(2);
      int pipefd[2];
      constexpr int kSealed = F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE;
      const int tables[kFake] = {forged_table(0),
                                 forged_table(F_SEAL_SHRINK),
                                 forged_table(kSealed, wire::kLiveTableBytes - 4096),
                                 forged_table(kSealed),
                                 pipe(pipefd) ? -1 : pipefd[0],
                                 forged_table(kSealed)};
      const int extra[kFake] = {0, 0, 0, 0, 3, 7};
      for (int t : tables)
        if (t < 0) _exit(3);
      int listeners[kFake], conns[kFake];
      for (int i = 0; i < kFake; ++i) {
        conns[i] = -1;
        sockaddr_un su;
        const socklen_t len = registry_addr(fake[i], &su);
        listeners[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (listeners[i] < 0 || bind(listeners[i], reinterpret_cast<sockaddr*>(&su), len) ||
            listen(listeners[i], 16))
          _exit(4);
      }
      put_byte(ack[1], 'r');
      // Takes each port's querier in, sends its hello, and reports once all three were read.
      bool reported = false;
      for (;;) {
        pollfd p[kFake + 1] = {{cmd[0], POLLIN, 0}};
        for (int i = 0; i < kFake; ++i) p[i + 1] = {conns[i] < 0 ? listeners[i] : -1, POLLIN, 0};
        poll(p, kFake + 1, 10);
        if (p[0].revents) break;
        for (int i = 0; i < kFake; ++i) {
          if (!(p[i + 1].revents & POLLIN)) continue;
          conns[i] = accept4(listeners[i], nullptr, nullptr, SOCK_CLOEXEC);
          fake_hello(conns[i], tables[i], extra[i], i == 3);
        }
        int unread = 0;
        for (int i = 0; i < kFake; ++i) {
          int q = 1;
          if (conns[i] < 0 || ioctl(conns[i], TIOCOUTQ, &q) != 0 || q != 0) ++unread;
        }
        if (!unread && !reported) {
          put_byte(ack[1], 'h');
          reported = true;
        }
      }
      for (int i = 0; i < kFake; ++i) {
        close(listeners[i]);
        if (conns[i] >= 0) close(conns[i]);
      }
      put_byte(ack[1], 'c');
      for (;;) pause();
    }
    int result = 0;
    if (!wait_byte(ack[0], 'r', 30000)) result = 5;
    const int a = result ? -1 : bound_socket(mine);
    const int before = live_tables(), pipes = fds_of("pipe:"), memfds = fds_of("/memfd:");
    // Sends until the fake owner saw every hello read (the second lookup of each port reads it).
    bool read_all = false;
    for (int i = 0; !result && i < 3000 && !read_all; ++i) {
      for (uint16_t f : fake) send_to(a, f, "x", 1);
      read_all = wait_byte(ack[0], 'h', 10);
    }
    if (!result && !read_all) result = 10;
    if (!result && live_tables() != before) result = 11;  // a bad table was mapped
    if (!result && (fds_of("pipe:") != pipes || fds_of("/memfd:") != memfds))
      result = 12;  // a descriptor that came with a hello stayed
    const uint64_t dropped = result ? 0 : counter(a, "send_drop_no_sock");
    if (!result) {
      put_byte(cmd[1], 'c');
      if (!wait_byte(ack[0], 'c', 30000)) result = 6;
    }
    for (int i = 0; !result && i < kFake; ++i) {
      if (send_to(a, fake[i], "gone", 4) != 4) result = 7;
      if (!result && counter(a, "send_drop_no_sock") != dropped + static_cast<uint64_t>(i) + 1)
        result = 20 + i;  // port i was still believed held
    }
    reap(owner);
    if (a >= 0) svrds_close(a);
    return result;
  });
  EXPECT_EQ(rc, 0) << "1-7: set-up; 10: the hellos were not read; 11: a bad table was mapped; "
                      "12: a descriptor from a hello stayed; 20-25: the port whose hello was an "
                      "unsealed table, one sealed against shrinking only, a short one, a bad "
                      "magic, a pipe, eight descriptors was still believed held after its owner "
                      "let it go";
}
