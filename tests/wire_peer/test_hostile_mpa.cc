// Hostile MPA peers against real listeners (rdma_cm's and the out-of-band QP listener):
// connections that never send their MPA Request are closed after the handshake timeout
// (SOFTVERBS_MPA_TIMEOUT_MS, set short in this process), and a process out of descriptors
// does not spin on its listener: it serves a legitimate client once they are freed.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

namespace {

// A short handshake timeout for this process (read once, at the first handshake).
const bool g_short_timeout = setenv("SOFTVERBS_MPA_TIMEOUT_MS", "300", 1) == 0;

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int open_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// A TCP connection that says nothing.
int silent_peer(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the peer closed fd (EOF or reset) within ms.
bool closed_by_peer(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return false;
  char b;
  return recv(fd, &b, 1, MSG_DONTWAIT) <= 0;
}

struct CmListener {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  uint16_t port = 0;
  CmListener() {
    EXPECT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
    sockaddr_in a = loopback(0);
    EXPECT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)), 0);
    EXPECT_EQ(rdma_listen(id, 1024), 0);
    port = ntohs(rdma_get_src_port(id));
  }
  ~CmListener() {
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
  }
};

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST(HostileMpa, SilentConnectionsAreClosedAfterTheHandshakeTimeout) {
  CmListener l;
  ASSERT_NE(l.port, 0);
  const int before = open_fds();
  std::vector<int> peers;
  for (int i = 0; i < 200; ++i) {
    const int fd = silent_peer(l.port);
    ASSERT_GE(fd, 0);
    peers.push_back(fd);
  }
  // SOFTVERBS_MPA_TIMEOUT_MS=300: every one is closed by the listener's side.
  ASSERT_TRUE(g_short_timeout);
  int closed = 0;
  for (int fd : peers) closed += closed_by_peer(fd, 5000);
  EXPECT_EQ(closed, 200);
  for (int fd : peers) close(fd);
  // And our side's sockets are gone too (the test's own were just closed); the engine keeps
  // one spare descriptor from its first accept on, for refusing connections at EMFILE.
  for (int i = 0; i < 50 && open_fds() > before + 1; ++i) usleep(20000);
  EXPECT_LE(open_fds(), before + 1);
}

TEST(HostileMpa, OutOfDescriptorsTheListenerWaitsInsteadOfSpinningThenServes) {
  CmListener l;
  // One handshake from start to time-out first, with descriptors to spare: under UBSan the
  // first dynamic-type check of an endpoint probes memory through a pipe(2), which fails at
  // EMFILE and reports a false "invalid vptr"; after this one the result is cached.
  const int warm = silent_peer(l.port);
  ASSERT_GE(warm, 0);
  ASSERT_TRUE(closed_by_peer(warm, 5000));
  close(warm);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its dispose has run
  // Leave room for a few accepts only.
  rlimit old{};
  getrlimit(RLIMIT_NOFILE, &old);
  rlimit low = old;
  low.rlim_cur = static_cast<rlim_t>(open_fds() + 24);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  // The attacking connections come from another process, so only the listener's side
  // counts against our limit.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t attacker = fork();
  if (attacker == 0) {
    std::vector<int> fds;
    for (int i = 0; i < 100; ++i) fds.push_back(silent_peer(l.port));
    char x;
    (void)!read(pipefd[0], &x, 1);  // until told
    _exit(0);
  }
  // One second with the backlog full and no descriptor to accept it into: the process must
  // not burn that second spinning on the listener (it did: 1 s of CPU per s). It refuses
  // what it cannot serve, with the spare descriptor it keeps for that.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double cpu0 = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(cpu_seconds() - cpu0, 0.5) << "CPU seconds spent in one second";
  // The silent ones time out, descriptors come back, and the listener still accepts.
  ASSERT_EQ(write(pipefd[1], "x", 1), 1);
  int st;
  waitpid(attacker, &st, 0);
  setrlimit(RLIMIT_NOFILE, &old);
  const int fd = silent_peer(l.port);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(closed_by_peer(fd, 5000)) << "the listener no longer accepts";
  close(fd);
}
