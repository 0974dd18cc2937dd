// Hostile MPA peers against real listeners (rdma_cm's and the out-of-band QP listener):
// connections that never send their MPA Request are closed after the handshake timeout
// (SOFTVERBS_MPA_TIMEOUT_MS, set short in this process), a process out of descriptors
// does not spin on its listener: it serves a legitimate client once they are freed, and
// Requests parked for a QP not yet in RTR go when their peer does, and cannot pile up.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

// A TCP connection that says nothing, from 127.0.0.<from> if given.
int silent_peer(uint16_t port, int from = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (from) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(INADDR_LOOPBACK & ~0xFFu) | htonl(static_cast<uint32_t>(from));
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
      close(fd);
      return -1;
    }
  }
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

// A QP of this process in INIT: out-of-band Requests for it are parked until RTR.
struct InitQp {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  InitQp() {
    int n = 0;
    ibv_device** l = ibv_get_device_list(&n);
    EXPECT_GT(n, 0);
    ctx = ibv_open_device(l[0]);
    ibv_free_device_list(l);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {1, 1, 1, 1, 0};
    qp = ibv_create_qp(pd, &ia);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    EXPECT_EQ(
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);
  }
  ~InitQp() {
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
  // Out-of-band QP numbers are (listener port << 8 | index) (engine/iw_cm.h).
  uint16_t port() const { return static_cast<uint16_t>(qp->qp_num >> 8); }
};

// An MPA v2 Request whose private data is the out-of-band header naming dst and src QPs,
// as an initiator of the first release sent it (no flags word), or with flags.
std::vector<uint8_t> oob_request(uint32_t dst, uint32_t src) {
  std::vector<uint8_t> b(20 + 16);
  std::memcpy(b.data(), "MPA ID Req Frame", 16);
  b[16] = 0x10;  // enhanced (MPA v2, RFC 6581)
  b[17] = 2;
  b[19] = 16;  // private data: IRD/ORD word + 12-byte header
  const uint32_t words[4] = {htonl(0x00080008), htonl(0x53564F42), htonl(dst), htonl(src)};
  std::memcpy(b.data() + 20, words, sizeof words);
  return b;
}
std::vector<uint8_t> oob_request(uint32_t dst, uint32_t src, uint32_t flags) {
  std::vector<uint8_t> b = oob_request(dst, src);
  b[19] = 20;
  const uint32_t f = htonl(flags);
  const auto* p = reinterpret_cast<const uint8_t*>(&f);
  b.insert(b.end(), p, p + 4);
  return b;
}

// True once the peer closed fd within ms, whatever it wrote first (a rejecting Reply).
bool eof_within(int fd, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          end - std::chrono::steady_clock::now())
                          .count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char b[256];
    const ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (n <= 0) return true;
  }
}

// The floods below hold thousands of descriptors (both ends are in this process).
void raise_fd_limit() {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = std::min<rlim_t>(r.rlim_max, 16384);
  setrlimit(RLIMIT_NOFILE, &r);
  ASSERT_GE(r.rlim_cur, 4096u) << "this test needs 4,096 descriptors (ulimit -Hn)";
}

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

TEST(HostileMpa, AParkedRequestGoesWhenItsPeerLeaves) {
  InitQp q;
  ASSERT_NE(q.qp, nullptr);
  const int fd = silent_peer(q.port());
  ASSERT_GE(fd, 0);
  const auto req = oob_request(q.qp->qp_num, 0x123456);
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  // Parked (the QP is in INIT): no answer, the connection stays, past the handshake timeout.
  EXPECT_FALSE(eof_within(fd, 600)) << "a parked Request was answered or dropped";
  const int with = open_fds();
  close(fd);
  // Our side of it is closed once the peer has left.
  for (int i = 0; i < 100 && open_fds() > with - 2; ++i) usleep(20000);
  EXPECT_EQ(open_fds(), with - 2) << "the parked endpoint kept its socket";
}

TEST(HostileMpa, RequestsParkedForOneQpCannotPileUp) {
  InitQp q;
  ASSERT_NE(q.qp, nullptr);
  std::vector<int> fds;
  for (uint32_t i = 0; i < 6; ++i) {
    const int fd = silent_peer(q.port());
    ASSERT_GE(fd, 0);
    const auto req = oob_request(q.qp->qp_num, 0x100 + i);
    ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    fds.push_back(fd);
    usleep(50000);  // parked in this order
  }
  // Four may wait; the two oldest were refused and closed to make room.
  EXPECT_TRUE(eof_within(fds[0], 2000));
  EXPECT_TRUE(eof_within(fds[1], 2000));
  for (size_t i = 2; i < fds.size(); ++i) EXPECT_FALSE(eof_within(fds[i], 100)) << i;
  for (int fd : fds) close(fd);
}

// An initiator that says it understands the park notice (OobHeader::kParkNotice) learns at
// once that the QP it asked for is not in RTR yet: "SVPK", then nothing until RTR.
TEST(HostileMpa, AParkedRequestIsToldItWaitsIfItAskedToBe) {
  InitQp q;
  ASSERT_NE(q.qp, nullptr);
  const int fd = silent_peer(q.port());
  ASSERT_GE(fd, 0);
  const auto req = oob_request(q.qp->qp_num, 0x123456, 1);
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1) << "no park notice";
  char b[8];
  ASSERT_EQ(recv(fd, b, sizeof b, 0), 4);
  EXPECT_EQ(std::memcmp(b, "SVPK", 4), 0);
  EXPECT_FALSE(eof_within(fd, 400)) << "a parked Request was answered or dropped";
  close(fd);
  // One without the flag (an older initiator) is sent nothing.
  const int old = silent_peer(q.port());
  const auto req0 = oob_request(q.qp->qp_num, 0x123457);
  ASSERT_EQ(send(old, req0.data(), req0.size(), 0), static_cast<ssize_t>(req0.size()));
  p = pollfd{old, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 400), 0) << "an initiator that did not ask was sent a park notice";
  close(old);
}

// One address holding many silent connections is refused more, at once; another address
// is still served (here: closed by the handshake timeout, which means it was accepted).
TEST(HostileMpa, OneAddressCannotHoldAllHandshakeSlots) {
  ASSERT_NO_FATAL_FAILURE(raise_fd_limit());
  CmListener l;
  ASSERT_NE(l.port, 0);
  constexpr int kFlood = 600, kBound = 256;  // Endpoint::kMaxPendingPerAddr
  std::vector<int> flood;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kFlood; ++i) {
    const int fd = silent_peer(l.port, 2);
    ASSERT_GE(fd, 0) << i;
    flood.push_back(fd);
  }
  // Those beyond the bound are closed as soon as they are accepted, long before the
  // handshake timeout (300 ms from their accept) closes the others. Looked at 250 ms after
  // the first connect, not after the last: on a loaded machine the flood itself takes tens
  // of milliseconds, and the first connections accepted reached their timeout before the
  // look (counted as refused: 440-516 of 600 in 1 run of 6).
  std::this_thread::sleep_until(start + std::chrono::milliseconds(250));
  int refused = 0;
  for (int fd : flood) refused += closed_by_peer(fd, 0) ? 1 : 0;
  const int other = silent_peer(l.port, 3);
  ASSERT_GE(other, 0);
  EXPECT_TRUE(closed_by_peer(other, 5000)) << "another address was not served";
  close(other);
  for (int fd : flood) close(fd);
  EXPECT_LE(refused, kFlood - kBound) << "connections within the per-address bound were refused";
  EXPECT_GE(refused, (kFlood - kBound) / 2) << "connections past the per-address bound were kept";
}

// Past the bound on handshakes in progress the listener stops accepting: connections wait
// in the kernel's backlog and are served when slots free up, none is refused.
TEST(HostileMpa, PastTheBoundConnectionsWaitInTheBacklogInsteadOfBeingRefused) {
  ASSERT_NO_FATAL_FAILURE(raise_fd_limit());
  CmListener l;
  ASSERT_NE(l.port, 0);
  // 1,200: past Endpoint::kMaxPendingRequests, within kMaxPendingPerAddr for each address.
  constexpr int kPerAddr = 240, kAddrs = 5;
  std::vector<int> fds;
  for (int a = 0; a < kAddrs; ++a)
    for (int i = 0; i < kPerAddr; ++i) {
      const int fd = silent_peer(l.port, 10 + a);
      ASSERT_GE(fd, 0);
      fds.push_back(fd);
    }
  const auto t0 = std::chrono::steady_clock::now();
  // Every one is accepted in its turn and closed by the handshake timeout (300 ms): the
  // last ones only after the first ones' slots were freed.
  int closed = 0;
  for (int fd : fds) closed += closed_by_peer(fd, 10000);
  EXPECT_EQ(closed, kPerAddr * kAddrs);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(450))
      << "the connections past the bound were not held back";
  for (int fd : fds) close(fd);
}

// An address whose Requests keep coming is a busy peer, not a slowloris: its connections
// past the per-address bound are not refused (a peer connecting thousands of QPs has more
// than that many connected whose Requests are still on their way).
TEST(HostileMpa, ABusyAddressIsNotRefusedPastTheBound) {
  ASSERT_NO_FATAL_FAILURE(raise_fd_limit());
  InitQp q;
  ASSERT_NE(q.qp, nullptr);
  // Requests for a QP that does not exist: answered at once with a rejecting Reply.
  auto answered = [](int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    char b[20];
    return poll(&p, 1, ms) == 1 && recv(fd, b, sizeof b, MSG_WAITALL) == 20 &&
           std::memcmp(b, "MPA ID Rep Frame", 16) == 0;
  };
  const auto unknown = oob_request(0x7FFFFF, 0x100);
  for (int i = 0; i < 10; ++i) {  // the address has just completed Requests
    const int fd = silent_peer(q.port(), 4);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, unknown.data(), unknown.size(), 0), static_cast<ssize_t>(unknown.size()));
    EXPECT_TRUE(answered(fd, 5000));
    close(fd);
  }
  constexpr int kConns = 320;  // past Endpoint::kMaxPendingPerAddr (256)
  std::vector<int> fds;
  std::vector<std::chrono::steady_clock::time_point> at;
  for (int i = 0; i < kConns; ++i) {
    const int fd = silent_peer(q.port(), 4);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    at.push_back(std::chrono::steady_clock::now());
  }
  // A refused connection is closed as it is accepted, before the handshake timeout (300 ms)
  // could close it: count those closed by now that are younger than that.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int refused = 0;
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < kConns; ++i)
    if (now - at[i] < std::chrono::milliseconds(250) && closed_by_peer(fds[i], 0)) ++refused;
  for (int fd : fds) (void)!send(fd, unknown.data(), unknown.size(), MSG_NOSIGNAL);
  int served = 0;
  for (int fd : fds) {
    served += answered(fd, 5000) ? 1 : 0;
    close(fd);
  }
  EXPECT_EQ(refused, 0) << "a busy address was refused";
  EXPECT_GT(served, 256) << "too few answered to show the bound was passed";
}
