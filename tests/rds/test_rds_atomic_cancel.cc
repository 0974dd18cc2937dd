// RDS behaviours beyond plain send/recv, as Linux net/rds has them (rds-api.md):
//   - atomics (RDS_CMSG_ATOMIC_* and RDS_CMSG_MASKED_ATOMIC_*) on a peer's RDS_GET_MR region,
//   - RDS_CANCEL_SENT_TO dropping messages queued toward a destination nobody can reach yet,
//   - close() with queued messages, and what survives it,
//   - poll() while a destination is congested (POLLOUT is send-buffer space, not congestion),
//   - IPv6 addressing (bind with AF_INET6, v4/v6 mismatch on send).
//
// Messages "queued while the connection cannot be made" need a peer that is bound but does not
// answer: the binary re-executes itself as a peer process (--rds-peer=collect) that binds the
// ports it is given and reports every datagram on stdout; the test SIGSTOPs it before sending,
// so the connection stays in the connecting state and everything sent stays on the send queue
// (visible through RDS_INFO_SEND_MESSAGES), then SIGCONTs it and reads what arrived.
//
#include <fcntl.h>
#include <linux/rds.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "rds_test_util.h"

extern char** environ;

using namespace rdstest;

namespace {

// "prefix" + std::to_string(n), built by appending: GCC 12 at -O3 reports a false -Wrestrict
// on operator+(const char*, std::string&&) (GCC PR 105329).
std::string tag(const char* prefix, long n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

using Clock = std::chrono::steady_clock;

// ---- helpers --------------------------------------------------------------------------------

// One cmsg for sendmsg: level SOL_RDS, `type`, payload `data`.
struct Cmsg {
  int type;
  std::vector<char> data;
  template <typename T>
  static Cmsg of(int type, const T& v) {
    Cmsg c{type, std::vector<char>(sizeof v)};
    std::memcpy(c.data.data(), &v, sizeof v);
    return c;
  }
};

ssize_t send_with(int fd, uint16_t dport, const std::string& payload,
                  const std::vector<Cmsg>& cmsgs, int flags = 0) {
  size_t space = 0;
  for (const Cmsg& c : cmsgs) space += CMSG_SPACE(c.data.size());
  std::vector<char> ctl(space ? space : 1, 0);
  iovec v{const_cast<char*>(payload.data()), payload.size()};
  sockaddr_in d = addr(dport);
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  if (space) {
    m.msg_control = ctl.data();
    m.msg_controllen = space;
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    for (const Cmsg& c : cmsgs) {
      cm->cmsg_level = SOL_RDS;
      cm->cmsg_type = c.type;
      cm->cmsg_len = CMSG_LEN(c.data.size());
      std::memcpy(CMSG_DATA(cm), c.data.data(), c.data.size());
      cm = CMSG_NXTHDR(&m, cm);
    }
  }
  return svrds_sendmsg(fd, &m, flags);
}

rds_atomic_args atomic_args(uint64_t cookie, uint64_t* local, uint64_t remote_off, uint64_t token,
                            uint64_t flags = RDS_RDMA_NOTIFY_ME) {
  rds_atomic_args a{};
  a.cookie = cookie;
  a.local_addr = reinterpret_cast<uint64_t>(local);
  a.remote_addr = remote_off;
  a.flags = flags;
  a.user_token = token;
  return a;
}

// RDMA_ARGS for a Write of the one local iovec `lv` to the start of the cookie's region,
// with NOTIFY_ME and `token`.
rds_rdma_args write_args(uint64_t cookie, const rds_iovec& lv, uint64_t token) {
  rds_rdma_args ra{};
  ra.cookie = cookie;
  ra.remote_vec = {0, lv.bytes};
  ra.local_vec_addr = reinterpret_cast<uint64_t>(&lv);
  ra.nr_local = 1;
  ra.flags = RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME;
  ra.user_token = token;
  return ra;
}

uint64_t load(const uint64_t* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

// Polls `cond` every few ms until it holds or `ms` passed (a bounded wait, not a sleep).
template <typename F>
bool eventually(F cond, int ms = 3000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (!cond()) {
    if (Clock::now() >= deadline) return false;
    poll(nullptr, 0, 2);
  }
  return true;
}

// The client (memory owner) registers `len` bytes at `region` and ships the cookie to the
// server in a message, as rds-stress does; returns the cookie the server received.
uint64_t share_region(Pair& p, void* region, size_t len) {
  const uint64_t cookie = get_mr(p.client, region, len);
  std::string msg(reinterpret_cast<const char*>(&cookie), sizeof cookie);
  EXPECT_EQ(send_with(p.client, p.sport, msg, {}), 8);
  std::vector<char> buf(16);
  EXPECT_EQ(recv_one(p.server, buf), 8);
  uint64_t got = 0;
  std::memcpy(&got, buf.data(), 8);
  EXPECT_EQ(got, cookie);
  return got;
}

// A plain round trip both ways; skips older datagrams still queued at the client.
bool round_trip(Pair& p, const std::string& tag) {
  std::vector<char> buf(4096);
  if (send_with(p.server, p.cport, tag, {}) != static_cast<ssize_t>(tag.size())) return false;
  for (int i = 0; i < 16; ++i) {
    const ssize_t n = recv_one(p.client, buf);
    if (n < 0) return false;
    if (std::string(buf.data(), static_cast<size_t>(n)) == tag) break;
    if (i == 15) return false;
  }
  if (send_with(p.client, p.sport, tag, {}) != static_cast<ssize_t>(tag.size())) return false;
  return recv_one(p.server, buf) == static_cast<ssize_t>(tag.size());
}

// The client's region: 8-byte words, away from anything else on the page.
struct alignas(64) Words {
  uint64_t w[8];
};

// ---- the peer process -------------------------------------------------------------------------

// Binds 127.0.0.1:<port> for every port given, prints "ready", then prints
// "msg <port> <payload>" for every datagram until each port has received "END".
int peer_collect(int n, char** ports) {
  std::vector<int> fds;
  std::vector<uint16_t> ps;
  for (int i = 0; i < n; ++i) {
    const auto p = static_cast<uint16_t>(std::atoi(ports[i]));
    int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
    sockaddr_in a = addr(p);
    if (fd < 0 || svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      dprintf(1, "error bind %u %s\n", p, strerror(errno));
      return 2;
    }
    fds.push_back(fd);
    ps.push_back(p);
  }
  dprintf(1, "ready\n");
  std::set<uint16_t> ended;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (ended.size() < ps.size() && Clock::now() < deadline) {
    std::vector<pollfd> pf;
    for (int fd : fds) pf.push_back({fd, POLLIN, 0});
    if (poll(pf.data(), pf.size(), 200) <= 0) continue;
    for (size_t i = 0; i < pf.size(); ++i) {
      if (!(pf[i].revents & POLLIN)) continue;
      char b[2048];
      const ssize_t r = svrds_recvfrom(fds[i], b, sizeof b, MSG_DONTWAIT, nullptr, nullptr);
      if (r < 0) continue;
      const std::string s(b, static_cast<size_t>(r));
      dprintf(1, "msg %u %s\n", ps[i], s.c_str());
      if (s == "END") ended.insert(ps[i]);
    }
  }
  dprintf(1, "done\n");
  for (int fd : fds) svrds_close(fd);
  return ended.size() == ps.size() ? 0 : 3;
}

// Peer mode "uniform": binds one port and reports each datagram as "msg <port> <length> <c>",
// c its byte if every byte is the same, else '?', until "END"; then "done", and it stays
// (its connections with it) until killed.
int peer_uniform(const char* port_arg) {
  const auto p = static_cast<uint16_t>(std::atoi(port_arg));
  const int fd = bound_socket(p);
  if (fd < 0) return 2;
  dprintf(1, "ready\n");
  std::vector<char> b((1 << 20) + 1);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0) continue;
    const ssize_t r = svrds_recvfrom(fd, b.data(), b.size(), MSG_DONTWAIT, nullptr, nullptr);
    if (r < 0) continue;
    if (r == 3 && std::memcmp(b.data(), "END", 3) == 0) {
      dprintf(1, "done\n");
      for (;;) pause();
    }
    const bool same =
        r > 0 && std::all_of(b.begin(), b.begin() + r, [&](char x) { return x == b[0]; });
    dprintf(1, "msg %u %zd %c\n", p, r, same ? b[0] : '?');
  }
  return 3;
}

// The parent's handle on a peer process; the destructor kills it whatever happened.
// Peer mode "region": binds one port, registers a region and prints its cookie, then
// receives until killed (the test kills it under an atomic).
int peer_region(const char* port_arg) {
  const auto p = static_cast<uint16_t>(std::atoi(port_arg));
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in a = addr(p);
  if (fd < 0 || svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    dprintf(1, "error bind %u %s\n", p, strerror(errno));
    return 2;
  }
  static uint64_t region[512];
  uint64_t cookie = 0;
  rds_get_mr_args g{
      {reinterpret_cast<uint64_t>(region), sizeof region}, reinterpret_cast<uint64_t>(&cookie), 0};
  if (svrds_setsockopt(fd, SOL_RDS, RDS_GET_MR, &g, sizeof g) != 0) return 2;
  dprintf(1, "ready\ncookie %llu\n", static_cast<unsigned long long>(cookie));
  for (;;) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0) continue;
    char b[256];
    (void)svrds_recvfrom(fd, b, sizeof b, MSG_DONTWAIT, nullptr, nullptr);
  }
}

// Peer mode "atomic": binds the first port, prints "ready", sends one atomic to the second
// port and prints "sendmsg <result> <errno>", then a plain message: "plain <result>".
int peer_atomic(const char* from_arg, const char* to_arg) {
  const auto from = static_cast<uint16_t>(std::atoi(from_arg));
  const auto to = static_cast<uint16_t>(std::atoi(to_arg));
  const int fd = bound_socket(from);
  if (fd < 0) return 2;
  dprintf(1, "ready\n");
  alignas(8) static uint64_t old = 0;
  rds_atomic_args a = atomic_args(0x100, &old, 0, 1);
  a.fadd.add = 1;
  errno = 0;
  const ssize_t r = send_with(fd, to, "atomic", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)});
  dprintf(1, "sendmsg %zd %d\n", r, r < 0 ? errno : 0);
  dprintf(1, "plain %zd\n", send_with(fd, to, "plain", {}));
  svrds_close(fd);
  return 0;
}

struct Peer {
  pid_t pid = -1;
  int out = -1;
  std::string pending;
  bool stopped = false;

  bool start(const std::vector<uint16_t>& ports, const std::string& mode = "collect") {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return false;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    std::vector<std::string> args{"rds_peer", "--rds-peer=" + mode};
    for (uint16_t x : ports) args.push_back(std::to_string(x));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int r = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    out = p[0];
    if (r != 0) {
      pid = -1;
      return false;
    }
    std::string line;
    return next_line(line, 5000) && line == "ready";
  }
  // Next stdout line of the peer (bounded wait).
  bool next_line(std::string& line, int ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      const size_t nl = pending.find('\n');
      if (nl != std::string::npos) {
        line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        return true;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd pf{out, POLLIN, 0};
      if (poll(&pf, 1, static_cast<int>(left)) <= 0) return false;
      char b[4096];
      const ssize_t n = read(out, b, sizeof b);
      if (n <= 0) return false;
      pending.append(b, static_cast<size_t>(n));
    }
  }
  // Messages the peer reports until "done": (port, payload) in arrival order.
  bool collect(std::vector<std::pair<uint16_t, std::string>>& got, int ms = 5000) {
    std::string line;
    while (next_line(line, ms)) {
      if (line == "done") return true;
      std::istringstream is(line);
      std::string tag, payload;
      unsigned port = 0;
      is >> tag >> port;
      std::getline(is, payload);
      if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
      if (tag == "msg") got.emplace_back(static_cast<uint16_t>(port), payload);
    }
    return false;
  }
  bool stop() {
    if (kill(pid, SIGSTOP) != 0) return false;
    int st = 0;
    stopped = waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st);
    return stopped;
  }
  void cont() {
    kill(pid, SIGCONT);
    stopped = false;
  }
  int wait_exit() {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    pid = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Peer() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out >= 0) close(out);
  }
};

std::vector<std::string> payloads_to(const std::vector<std::pair<uint16_t, std::string>>& got,
                                     uint16_t port) {
  std::vector<std::string> v;
  for (auto& [p, s] : got)
    if (p == port) v.push_back(s);
  return v;
}

}  // namespace

// =============================================================================================
// 1. Atomics (rds-api.md §2.2: the cookie selects the peer's MR, target = remote_addr + cookie
//    offset, local_addr (8-byte aligned) receives the original value; NOTIFY_ME as for RDMA).
// =============================================================================================

TEST(RdsAtomic, FetchAddAndCompareSwapOnPeerRegion) {
  Pair p(0);
  Words region{{11, 100, 22, 0, 0, 0, 0, 0}};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  std::vector<char> buf(64);
  alignas(8) uint64_t old = 0xAAAAAAAAAAAAAAAAull;
  rds_rdma_notify note{};

  // FADD: word 1 += 5; the original value comes back into local_addr.
  rds_atomic_args a = atomic_args(cookie, &old, 8, 101);
  a.fadd.add = 5;
  ASSERT_EQ(send_with(p.server, p.cport, "fadd", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}), 4);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(load(&region.w[1]), 105u) << "the atomic is done when its message arrives";
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 101u);
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&old), 100u) << "local_addr receives the original value";

  // CSWP that matches: 105 -> 7.
  old = 0;
  a = atomic_args(cookie, &old, 8, 102);
  a.cswp.compare = 105;
  a.cswp.swap = 7;
  ASSERT_EQ(send_with(p.server, p.cport, "cswp", {Cmsg::of(RDS_CMSG_ATOMIC_CSWP, a)}), 4);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(load(&region.w[1]), 7u);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 102u);
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&old), 105u);

  // CSWP that does not match: memory unchanged, the op still succeeds and returns the value.
  old = 0;
  a = atomic_args(cookie, &old, 8, 103);
  a.cswp.compare = 999;
  a.cswp.swap = 1;
  ASSERT_EQ(send_with(p.server, p.cport, "miss", {Cmsg::of(RDS_CMSG_ATOMIC_CSWP, a)}), 4);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(load(&region.w[1]), 7u) << "compare mismatch leaves memory unchanged";
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 103u);
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&old), 7u) << "a failed compare still returns the current value";

  // FADD wraps modulo 2^64 (plain add, nocarry_mask 0).
  region.w[2] = ~0ull;
  a = atomic_args(cookie, &old, 16, 104);
  a.fadd.add = 2;
  ASSERT_EQ(send_with(p.server, p.cport, "wrap", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}), 4);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(load(&region.w[2]), 1u);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&old), ~0ull);
  // Neighbours untouched.
  EXPECT_EQ(load(&region.w[0]), 11u);
  EXPECT_EQ(load(&region.w[3]), 0u);
}

TEST(RdsAtomic, AtomicAtCookieOffsetWithoutNotifyStillReturnsOldValue) {
  Pair p(2);
  Words region{{1, 2, 3, 4, 5, 6, 7, 8}};
  // Register from word 2 on: the cookie carries the in-page offset, remote_addr is relative
  // to the registered start.
  const uint64_t cookie = share_region(p, &region.w[2], 6 * sizeof(uint64_t));
  alignas(8) uint64_t old = 0;
  rds_atomic_args a = atomic_args(cookie, &old, 8, 0, 0);  // word 3, no NOTIFY_ME
  a.fadd.add = 40;
  ASSERT_EQ(send_with(p.server, p.cport, "x", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}), 1);
  std::vector<char> buf(8);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  EXPECT_EQ(load(&region.w[3]), 44u);
  EXPECT_EQ(load(&region.w[2]), 3u);
  EXPECT_EQ(load(&region.w[4]), 5u);
  // No NOTIFY_ME, no RECVERR: no notification. A plain message round trip afterwards proves
  // the op's message was acked; the old value is in place by then.
  ASSERT_EQ(send_with(p.client, p.sport, "ping", {}), 4);
  ASSERT_EQ(recv_one(p.server, buf), 4) << "no notification was queued ahead of the data";
  EXPECT_TRUE(eventually([&] { return load(&old) == 4u; }));
}

// Linux converts every atomic to a masked one and posts IB_WR_MASKED_ATOMIC_FETCH_AND_ADD with
// compare_add_mask = m_fadd.nocarry_mask (net/rds rdma.c rds_cmsg_atomic, ib_send.c
// rds_ib_xmit_atomic; rds-api.md §2.2). The mask is a field boundary mask (kernel commit
// 5e80ba8ff0bd "IB/core: Add support for masked atomic operations"): a set bit ends a field,
// the carry out of that bit is dropped. softverbs runs it as a compare-and-swap loop (rdma.cc).
TEST(RdsAtomic, MaskedFetchAddHonoursNocarryMask) {
  Pair p(4);
  Words region{{0x00000001FFFFFFFFull, 0x00000001FFFFFFFFull, 0, 0, 0, 0, 0, 0}};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  std::vector<char> buf(8);
  rds_rdma_notify note{};
  alignas(8) uint64_t old = 0;

  // Two 32-bit fields (boundary at bit 31): the low field wraps, its carry is not propagated.
  rds_atomic_args a = atomic_args(cookie, &old, 0, 201);
  a.m_fadd.add = 0x0000000100000001ull;
  a.m_fadd.nocarry_mask = 1ull << 31;
  ASSERT_EQ(send_with(p.server, p.cport, "m", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_FADD, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&old), 0x00000001FFFFFFFFull);
  EXPECT_EQ(load(&region.w[0]), 0x0000000200000000ull)
      << "carry out of bit 31 must not reach bit 32 (a plain add gives 0x300000000)";

  // nocarry_mask 0 is a plain 64-bit add.
  a = atomic_args(cookie, &old, 8, 202);
  a.m_fadd.add = 0x0000000100000001ull;
  a.m_fadd.nocarry_mask = 0;
  ASSERT_EQ(send_with(p.server, p.cport, "m", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_FADD, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(load(&region.w[1]), 0x0000000300000000ull);

  // Every bit a boundary: add without any carry is XOR.
  region.w[2] = 0xF0F0F0F0F0F0F0F0ull;
  a = atomic_args(cookie, &old, 16, 203);
  a.m_fadd.add = 0xFFFF0000FFFF0000ull;
  a.m_fadd.nocarry_mask = ~0ull;
  ASSERT_EQ(send_with(p.server, p.cport, "m", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_FADD, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(load(&region.w[2]), 0xF0F0F0F0F0F0F0F0ull ^ 0xFFFF0000FFFF0000ull);
}

// Linux posts IB_WR_MASKED_ATOMIC_CMP_AND_SWP with compare_add_mask = m_cswp.compare_mask and
// swap_mask = m_cswp.swap_mask (same sources as above):
//   if (!((compare ^ *va) & compare_mask)) *va = (*va & ~swap_mask) | (swap & swap_mask)
TEST(RdsAtomic, MaskedCompareSwapHonoursMasks) {
  Pair p(6);
  Words region{{0x1122334455667788ull, 0x1122334455667788ull, 0, 0, 0, 0, 0, 0}};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  std::vector<char> buf(8);
  rds_rdma_notify note{};
  alignas(8) uint64_t old = 0;

  // Compare only the high half (it matches), swap only the low half.
  rds_atomic_args a = atomic_args(cookie, &old, 0, 301);
  a.m_cswp.compare = 0x1122334400000000ull;
  a.m_cswp.compare_mask = 0xFFFFFFFF00000000ull;
  a.m_cswp.swap = 0xDEADBEEFAAAAAAAAull;
  a.m_cswp.swap_mask = 0x00000000FFFFFFFFull;
  ASSERT_EQ(send_with(p.server, p.cport, "c", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_CSWP, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&old), 0x1122334455667788ull);
  EXPECT_EQ(load(&region.w[0]), 0x11223344AAAAAAAAull)
      << "masked compare matched: only the swap_mask bits are replaced";

  // Compare mismatch inside the compare mask: unchanged.
  a = atomic_args(cookie, &old, 8, 302);
  a.m_cswp.compare = 0x9922334455667788ull;
  a.m_cswp.compare_mask = 0xFF00000000000000ull;
  a.m_cswp.swap = 0;
  a.m_cswp.swap_mask = ~0ull;
  ASSERT_EQ(send_with(p.server, p.cport, "c", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_CSWP, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(load(&region.w[1]), 0x1122334455667788ull);
  EXPECT_EQ(load(&old), 0x1122334455667788ull);

  // Compare mask 0 always matches; swap_mask selects bits to set.
  a = atomic_args(cookie, &old, 8, 303);
  a.m_cswp.compare = 0;
  a.m_cswp.compare_mask = 0;
  a.m_cswp.swap = ~0ull;
  a.m_cswp.swap_mask = 0x00000000000000FFull;
  ASSERT_EQ(send_with(p.server, p.cport, "c", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_CSWP, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(load(&region.w[1]), 0x11223344556677FFull);
}

// Masks of all ones / zero make the masked forms equal to the plain ones (what
// rds_cmsg_atomic does for RDS_CMSG_ATOMIC_*): this part holds even where masks are ignored.
TEST(RdsAtomic, MaskedFormsWithTrivialMasksBehaveAsPlain) {
  Pair p(8);
  Words region{{50, 60, 0, 0, 0, 0, 0, 0}};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  std::vector<char> buf(8);
  rds_rdma_notify note{};
  alignas(8) uint64_t old = 0;
  rds_atomic_args a = atomic_args(cookie, &old, 0, 1);
  a.m_fadd.add = 9;
  a.m_fadd.nocarry_mask = 0;
  ASSERT_EQ(send_with(p.server, p.cport, "f", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_FADD, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&region.w[0]), 59u);
  EXPECT_EQ(load(&old), 50u);
  a = atomic_args(cookie, &old, 8, 2);
  a.m_cswp.compare = 60;
  a.m_cswp.swap = 61;
  a.m_cswp.compare_mask = ~0ull;
  a.m_cswp.swap_mask = ~0ull;
  ASSERT_EQ(send_with(p.server, p.cport, "c", {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_CSWP, a)}), 1);
  ASSERT_EQ(recv_one(p.client, buf), 1);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&region.w[1]), 61u);
  EXPECT_EQ(load(&old), 60u);
}

TEST(RdsAtomic, BadArgumentsAreRefused) {
  Pair p(10);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  alignas(8) char local[16] = {};
  // local_addr not 8-byte aligned: EFAULT (net/rds rdma.c rds_cmsg_atomic).
  rds_atomic_args a = atomic_args(cookie, reinterpret_cast<uint64_t*>(local + 4), 0, 1);
  a.fadd.add = 1;
  EXPECT_EQ(send_with(p.server, p.cport, "x", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}), -1);
  EXPECT_EQ(errno, EFAULT);
  a = atomic_args(cookie, reinterpret_cast<uint64_t*>(local), 0, 1);
  a.fadd.add = 1;
  // Two atomics in one message: EINVAL (op_active already set).
  EXPECT_EQ(send_with(p.server, p.cport, "x",
                      {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a), Cmsg::of(RDS_CMSG_ATOMIC_CSWP, a)}),
            -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(send_with(p.server, p.cport, "x",
                      {Cmsg::of(RDS_CMSG_MASKED_ATOMIC_FADD, a),
                       Cmsg::of(RDS_CMSG_MASKED_ATOMIC_FADD, a)}),
            -1);
  EXPECT_EQ(errno, EINVAL);
  // An atomic with RDMA_DEST or RDMA_MAP (the other cmsg group): EINVAL (rds_rm_size).
  uint64_t mine = get_mr(p.server, local, sizeof local);
  EXPECT_EQ(send_with(p.server, p.cport, "x",
                      {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a), Cmsg::of(RDS_CMSG_RDMA_DEST, mine)}),
            -1);
  EXPECT_EQ(errno, EINVAL);
  uint64_t mapped = 0;
  rds_get_mr_args map{
      {reinterpret_cast<uint64_t>(local), 8}, reinterpret_cast<uint64_t>(&mapped), 0};
  EXPECT_EQ(send_with(p.server, p.cport, "x",
                      {Cmsg::of(RDS_CMSG_RDMA_MAP, map), Cmsg::of(RDS_CMSG_ATOMIC_CSWP, a)}),
            -1);
  EXPECT_EQ(errno, EINVAL);
  // A short atomic cmsg: EINVAL.
  Cmsg shortc{RDS_CMSG_ATOMIC_FADD, std::vector<char>(sizeof(rds_atomic_args) - 8)};
  EXPECT_EQ(send_with(p.server, p.cport, "x", {shortc}), -1);
  EXPECT_EQ(errno, EINVAL);
  // None of the refused ones touched the region or reached the client.
  EXPECT_EQ(load(&region.w[0]), 0u);
  EXPECT_EQ(wait_for(p.client, POLLIN, 0) & POLLIN, 0);
}

// In Linux RDMA_ARGS and the atomics are the same cmsg group (rds_rm_size sets
// cmsg_groups |= 1 for both; only {DEST, MAP} x {ARGS, ATOMIC} is EINVAL), a message carries
// at most one of each (rds-api.md §2.1 step 3), and rds_send_xmit issues the RDMA, then the
// atomic, then the data (§2.1 step 4).
TEST(RdsAtomic, RdmaArgsAndAtomicInOneMessageBothHappen) {
  Pair p(12);
  struct alignas(64) Region {
    char data[64];
    uint64_t counter;
  } region{};
  std::memset(region.data, '.', sizeof region.data);
  region.counter = 1000;
  const uint64_t cookie = share_region(p, &region, sizeof region);
  std::vector<char> src(16, 'W');
  rds_iovec lv{reinterpret_cast<uint64_t>(src.data()), src.size()};
  const rds_rdma_args ra = write_args(cookie, lv, 401);
  alignas(8) uint64_t old = 0;
  rds_atomic_args a = atomic_args(cookie, &old, offsetof(Region, counter), 402);
  a.fadd.add = 1;
  ASSERT_EQ(send_with(p.server, p.cport, "both",
                      {Cmsg::of(RDS_CMSG_RDMA_ARGS, ra), Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}),
            4)
      << "RDMA_ARGS + one atomic is a legal combination in Linux";
  std::vector<char> buf(8);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(std::memcmp(region.data, src.data(), src.size()), 0) << "the RDMA write happened";
  EXPECT_EQ(load(&region.counter), 1001u) << "the atomic happened";
  // One notification per op, each with its own token.
  std::set<uint64_t> tokens;
  rds_rdma_notify note{};
  for (int i = 0; i < 2 && get_notify(p.server, note); ++i) {
    EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
    tokens.insert(note.user_token);
  }
  EXPECT_EQ(tokens, (std::set<uint64_t>{401, 402}));
  EXPECT_EQ(load(&old), 1000u);
}

// Both or neither: when the message's RDMA fails (bad cookie), its atomic does not run (it
// reports DROPPED) and the message is not delivered; the next message still is.
TEST(RdsAtomic, FailedRdmaTakesItsAtomicAndMessageWithIt) {
  Pair p(62);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  std::vector<char> src(16, 'W');
  rds_iovec lv{reinterpret_cast<uint64_t>(src.data()), src.size()};
  const rds_rdma_args ra = write_args(0x0badc0deull, lv, 411);  // not a registered key
  alignas(8) uint64_t old = 77;
  rds_atomic_args a = atomic_args(cookie, &old, 0, 412);
  a.fadd.add = 1;
  ASSERT_EQ(send_with(p.server, p.cport, "neither",
                      {Cmsg::of(RDS_CMSG_RDMA_ARGS, ra), Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}),
            7);
  std::map<uint64_t, int> status;
  rds_rdma_notify note{};
  for (int i = 0; i < 2 && get_notify(p.server, note); ++i) status[note.user_token] = note.status;
  EXPECT_EQ(status,
            (std::map<uint64_t, int>{{411, RDS_RDMA_REMOTE_ERROR}, {412, RDS_RDMA_DROPPED}}));
  EXPECT_EQ(load(&region.w[0]), 0u) << "the atomic did not run";
  EXPECT_EQ(load(&old), 77u);
  ASSERT_EQ(send_with(p.server, p.cport, "next", {}), 4);
  std::vector<char> buf(16);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(std::string(buf.data(), 4), "next") << "\"neither\" is never delivered";
}

namespace {

// Sends one FADD with `cookie` at `remote_off` and returns its notification status (-1 if none
// came); the client's view of traffic afterwards is checked with a round trip.
int bad_atomic_status(Pair& p, uint64_t cookie, uint64_t remote_off, uint64_t token) {
  alignas(8) uint64_t old = 0;
  rds_atomic_args a = atomic_args(cookie, &old, remote_off, token);
  a.fadd.add = 1;
  if (send_with(p.server, p.cport, "bad", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}) != 3) return -2;
  rds_rdma_notify note{};
  if (!get_notify(p.server, note)) return -1;
  EXPECT_EQ(note.user_token, token);
  // The failed op takes the connection down (as a bad R_Key does on IB): wait until traffic
  // flows again so that the next op is not posted on the dying connection.
  EXPECT_TRUE(round_trip(p, tag("sync", token)));
  return note.status;
}

}  // namespace

TEST(RdsAtomic, UnknownKeyReportsRemoteError) {
  Pair p(14);
  Words region{};
  share_region(p, region.w, sizeof region.w);
  EXPECT_EQ(bad_atomic_status(p, 0x0badc0deull, 0, 501), RDS_RDMA_REMOTE_ERROR);
  EXPECT_EQ(load(&region.w[0]), 0u);
  // Plain traffic keeps flowing between the two sockets afterwards.
  EXPECT_TRUE(round_trip(p, "after"));
}

TEST(RdsAtomic, OutsideTheRegionReportsRemoteError) {
  Pair p(16);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  // The right key, 16 KiB past the registered pages.
  EXPECT_EQ(bad_atomic_status(p, cookie, 4096 * 4, 502), RDS_RDMA_REMOTE_ERROR);
  EXPECT_EQ(load(&region.w[0]), 0u);
}

// Any other failure of the op itself is RDS_RDMA_OTHER_ERROR (Linux rds_atomic_send_complete:
// everything but IB_WC_REM_ACCESS_ERR). An atomic target must be 8-byte aligned; a misaligned
// one is an invalid request, not an access error (our device refuses it when it is posted, a
// NIC fails it at completion), and it must not block the ops behind it.
TEST(RdsAtomic, MisalignedRemoteAddressReportsOtherError) {
  Pair p(60);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  EXPECT_EQ(bad_atomic_status(p, cookie, 4, 504), RDS_RDMA_OTHER_ERROR);
  EXPECT_EQ(load(&region.w[0]), 0u);
  EXPECT_EQ(load(&region.w[1]), 0u);
}

TEST(RdsAtomic, FreedRegionReportsRemoteError) {
  Pair p(18);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  rds_free_mr_args f{cookie, 0};
  ASSERT_EQ(svrds_setsockopt(p.client, SOL_RDS, RDS_FREE_MR, &f, sizeof f), 0);
  EXPECT_EQ(bad_atomic_status(p, cookie, 0, 503), RDS_RDMA_REMOTE_ERROR);
  EXPECT_EQ(load(&region.w[0]), 0u) << "nothing changed through a freed cookie";
}

// A failing op reports its own completion status (Linux: IB_WC_REM_ACCESS_ERR ->
// RDS_RDMA_REMOTE_ERROR, rds_ib_send_cqe_handler), never DROPPED. Before ops had a QP of their
// own this failed about once in 300-3000 ops: the shared connection's reset could run before
// the op's own error completion was reaped, and the op was then reported DROPPED. Now the
// op's error completion is what tears its RDMA channel down.
TEST(RdsAtomic, RemoteErrorIsNeverReportedAsDropped) {
  // 300 protection errors from one address is what the engine's peer_guard takes for an
  // STag guesser: after 32 it admits one reconnect of the RDMA channel per 250 ms, and this
  // test took 67 s. The guard has its own tests (hostile_guess); here it gets out of the way.
  // (Read at the process' first protection error: under ctest, each test is its own.)
  setenv("SOFTVERBS_PROT_ERR_BURST", "100000", 1);
  Pair p(56);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  int remote = 0, dropped = 0, other = 0;
  int dropped_by_kind[3] = {};
  for (int i = 0; i < 300; ++i) {
    // Rotate through the three ways to get it wrong: unknown key, out of bounds, freed key.
    uint64_t c = 0x0badc0deull, off = 0;
    if (i % 3 == 1) {
      c = cookie;
      off = 4096 * 4;
    } else if (i % 3 == 2) {
      c = get_mr(p.client, &region.w[4], 8);
      rds_free_mr_args f{c, 0};
      EXPECT_EQ(svrds_setsockopt(p.client, SOL_RDS, RDS_FREE_MR, &f, sizeof f), 0);
    }
    const int st = bad_atomic_status(p, c, off, 1000 + static_cast<uint64_t>(i));
    if (st == RDS_RDMA_REMOTE_ERROR)
      ++remote;
    else if (st == RDS_RDMA_DROPPED)
      ++dropped, ++dropped_by_kind[i % 3];
    else
      ++other;
    if (other) break;
  }
  EXPECT_EQ(dropped, 0) << remote << " REMOTE_ERROR, " << dropped << " DROPPED (unknown key "
                        << dropped_by_kind[0] << ", out of bounds " << dropped_by_kind[1]
                        << ", freed key " << dropped_by_kind[2] << ")";
  EXPECT_EQ(other, 0);
}

// A peer that refuses our RDMA channel (its peer_guard, after one protection error) is
// retried with backoff, not on every message sent meanwhile: each send kicks the channel, and
// kicks used to connect at once, thousands of connects a second at a peer refusing them all.
TEST(RdsAtomic, ARefusedRdmaChannelIsRetriedWithBackoffNotOnEveryMessage) {
  // The connect count is this process' only: RDS_INFO_COUNTERS sums the host, and a test
  // beside it under ctest -j (RemoteErrorIsNeverReportedAsDropped: 300 channel resets) made
  // it 195 once.
  PrivateRegistry own;
  setenv("SOFTVERBS_PROT_ERR_BURST", "1", 1);    // one error empties the bucket...
  setenv("SOFTVERBS_PROT_ERR_PER_SEC", "1", 1);  // ... for a second
  Pair p(58);
  Words region{};
  const uint64_t cookie = share_region(p, region.w, sizeof region.w);
  ASSERT_EQ(bad_atomic_status(p, 0x0badc0deull, 0, 301), RDS_RDMA_REMOTE_ERROR);
  const uint64_t attempts = counter(p.server, "rdma_chan_connect_attempts");
  const auto from = std::chrono::steady_clock::now();
  alignas(8) uint64_t old = 0;
  rds_atomic_args a = atomic_args(cookie, &old, 0, 302);
  a.fadd.add = 5;
  ASSERT_EQ(send_with(p.server, p.cport, "good", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}), 4);
  // Plain traffic meanwhile on another connection of this process (127.0.0.2: the pair's
  // waits behind the op), each completion a kick of every connection with queued messages.
  const int far = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in fa = addr(port(60), "127.0.0.2");
  ASSERT_EQ(svrds_bind(far, reinterpret_cast<sockaddr*>(&fa), sizeof fa), 0);
  const int near = bound_socket(port(61));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int kicks = 0;
  std::vector<char> buf(64);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(svrds_sendto(near, "k", 1, 0, reinterpret_cast<sockaddr*>(&fa), sizeof fa), 1);
    ASSERT_EQ(recv_one(far, buf), 1);
    ++kicks;
  }
  svrds_close(far);
  svrds_close(near);
  const uint64_t tried = counter(p.server, "rdma_chan_connect_attempts") - attempts;
  // Backoff 1, 2, 4 ... 1000 ms allows about 10 in the first second and one a second after
  // (a sanitized run's first message alone may take a second; TSan saw 17); a connect per
  // kick would be hundreds.
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - from)
          .count();
  EXPECT_LE(tried, 20u + 2u * static_cast<uint64_t>(secs))
      << kicks << " messages in " << secs << " s; backoff 1, 2, 4 ... ms allows about 9";
  // The op still completes once the guard lets the channel in.
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note, 10000));
  EXPECT_EQ(note.user_token, 302u);
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(load(&region.w[0]), 5u);
}

// =============================================================================================
// 2. RDS_CANCEL_SENT_TO (rds-api.md §1.4: drops every queued and sent-but-unacked message of
//    this socket to addr:port; RDMA/atomic notifiers fire with RDS_RDMA_CANCELED; the send
//    buffer space is returned).
// =============================================================================================

TEST(RdsCancel, CancelDropsQueuedMessagesToOneDestinationOnly) {
  const uint16_t pa = port(20), pb = port(21), me = port(22);
  Peer peer;
  ASSERT_TRUE(peer.start({pa, pb})) << "peer process did not come up";
  ASSERT_TRUE(peer.stop());
  int tx = bound_socket(me);
  int sndbuf = 6000;
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf), 0);
  const std::string k(990, 'k');
  // 3 plain messages to A, 2 to B, then an RDMA op and an atomic to A, both NOTIFY_ME: the
  // peer cannot answer, so all of it stays queued.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(send_with(tx, pa, tag("A", i) + k, {}), 992);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(send_with(tx, pb, tag("B", i) + k, {}), 992);
  std::vector<char> src(64, 'r');
  rds_iovec lv{reinterpret_cast<uint64_t>(src.data()), src.size()};
  const rds_rdma_args ra = write_args(0x1234, lv, 77);  // never used: cancelled before it is posted
  ASSERT_EQ(send_with(tx, pa, "Ardma" + k, {Cmsg::of(RDS_CMSG_RDMA_ARGS, ra)}), 995);
  alignas(8) uint64_t old = 0;
  rds_atomic_args at = atomic_args(0x1234, &old, 0, 78);
  at.fadd.add = 1;
  ASSERT_EQ(send_with(tx, pa, "Aatomic" + k, {Cmsg::of(RDS_CMSG_ATOMIC_FADD, at)}), 997);
  EXPECT_EQ(count_info_messages(tx, RDS_INFO_SEND_MESSAGES, me, pa), 5);
  EXPECT_EQ(count_info_messages(tx, RDS_INFO_SEND_MESSAGES, me, pb), 2);
  // 6 KB queued against a 6000-byte send buffer: no POLLOUT, EAGAIN.
  EXPECT_EQ(wait_for(tx, POLLOUT, 0) & POLLOUT, 0);
  EXPECT_EQ(send_with(tx, pb, "B-extra", {}, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);

  sockaddr_in da = addr(pa);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CANCEL_SENT_TO, &da, sizeof da), 0);
  // A's messages are gone from the send queue, B's are still there.
  EXPECT_EQ(count_info_messages(tx, RDS_INFO_SEND_MESSAGES, me, pa), 0);
  EXPECT_EQ(count_info_messages(tx, RDS_INFO_SEND_MESSAGES, me, pb), 2);
  // Their send-buffer space is back.
  EXPECT_TRUE(wait_for(tx, POLLOUT, 1000) & POLLOUT) << "cancel releases send-buffer space";
  // The RDMA and the atomic each report CANCELED, once.
  std::set<uint64_t> cancelled;
  rds_rdma_notify note{};
  for (int i = 0; i < 2 && get_notify(tx, note, 1000); ++i) {
    EXPECT_EQ(note.status, RDS_RDMA_CANCELED) << "token " << note.user_token;
    cancelled.insert(note.user_token);
  }
  EXPECT_EQ(cancelled, (std::set<uint64_t>{77, 78}));
  EXPECT_EQ(wait_for(tx, POLLIN, 0) & POLLIN, 0) << "no further notification";
  // Sends after the cancel go out normally, to A too.
  ASSERT_EQ(send_with(tx, pa, "A-after", {}, MSG_DONTWAIT), 7);
  ASSERT_EQ(send_with(tx, pa, "END", {}), 3);
  ASSERT_EQ(send_with(tx, pb, "END", {}), 3);

  peer.cont();
  std::vector<std::pair<uint16_t, std::string>> got;
  ASSERT_TRUE(peer.collect(got)) << "peer did not receive END on both ports";
  EXPECT_EQ(peer.wait_exit(), 0);
  const auto a = payloads_to(got, pa), b = payloads_to(got, pb);
  EXPECT_EQ(a, (std::vector<std::string>{"A-after", "END"}))
      << "cancelled messages must never be delivered";
  EXPECT_EQ(b, (std::vector<std::string>{"B0" + k, "B1" + k, "END"}))
      << "other destinations are not affected";
  EXPECT_EQ(load(&old), 0u) << "the cancelled atomic never ran";
  // Everything left is acked: the send buffer drains completely.
  EXPECT_TRUE(all_acked(tx, me, pb)) << "the send buffer did not drain";
  svrds_close(tx);
}

// The zero-copy cookies completed at fd, as they come within wait_ms of each other.
std::vector<uint32_t> zcopy_cookies(int fd, int wait_ms) {
  std::vector<uint32_t> got;
  while (wait_for(fd, POLLIN, wait_ms) & POLLIN) {
    char ctl[CMSG_SPACE(sizeof(rds_zcopy_cookies))];
    char c;
    iovec v{&c, 1};
    msghdr m{};
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (svrds_recvmsg(fd, &m, MSG_DONTWAIT) != 0) break;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
      if (cm->cmsg_level != SOL_RDS || cm->cmsg_type != RDS_CMSG_ZCOPY_COMPLETION) continue;
      rds_zcopy_cookies z;
      std::memcpy(&z, CMSG_DATA(cm), sizeof z);
      for (uint32_t k = 0; k < z.num && k < RDS_MAX_ZCOOKIES; ++k) got.push_back(z.cookies[k]);
    }
  }
  return got;
}

// A peer in "uniform" mode on pa whose connection with `tx` is up, then stopped.
bool uniform_peer_stopped(Peer& peer, int tx, uint16_t pa) {
  if (!peer.start({pa}, "uniform") || send_with(tx, pa, "up", {}) != 2) return false;
  std::string line;
  return peer.next_line(line, 5000) && line == "msg " + std::to_string(pa) + " 2 ?" && peer.stop();
}

// Reads a "uniform" peer's reports up to its "done": true if END came and every message
// before it was `len` bytes of one of the first `kinds` letters (as sent: 'a', 'b', ...).
testing::AssertionResult all_intact_until_end(Peer& peer, size_t len, int kinds) {
  std::string line;
  while (peer.next_line(line, 10000) && line != "done") {
    std::istringstream is(line);
    std::string tag;
    unsigned port = 0;
    size_t n = 0;
    char c = 0;
    is >> tag >> port >> n >> c;
    if (n != len || c < 'a' || c >= 'a' + kinds)
      return testing::AssertionFailure() << "a message not as sent: " << line;
  }
  if (line != "done") return testing::AssertionFailure() << "END never arrived";
  return testing::AssertionSuccess();
}

// A zero-copy message is gathered from the sender's own buffers, which the device reads
// until the message's SENDs retire (at the peer's Placement Ack, under IB's completion rule).
// Cancelled before that, it stays off every queue, but its buffers stay registered and its
// cookie waits until then: freed at once, the device read an unregistered region
// (LOC_PROT_ERR, the connection reset), and an application that reused the buffer of a
// completed cookie changed bytes still to be sent.
TEST(RdsCancel, CancelledZeroCopySendsKeepTheirBuffersUntilTheDeviceIsDone) {
  PrivateRegistry own;  // the reset count below is of these two processes only
  const uint16_t pa = port(62), me = port(63);
  Peer peer;
  int tx = bound_socket(me);
  ASSERT_TRUE(uniform_peer_stopped(peer, tx, pa)) << "no peer with a connection up";
  const uint64_t resets_before = counter(tx, "conn_reset");
  int on = 1, big = 64 << 20;
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &on, sizeof on), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  // 8 messages of 1 MiB: the first four fill the connection's 64 send slots (posted, not
  // retired while the peer is stopped), the rest wait on the send queue.
  constexpr int kMsgs = 8;
  constexpr size_t kLen = 1 << 20;
  std::vector<std::string> bufs;
  for (int i = 0; i < kMsgs; ++i) bufs.emplace_back(kLen, static_cast<char>('a' + i));
  for (int i = 0; i < kMsgs; ++i) {
    const uint32_t cookie = 500 + static_cast<uint32_t>(i);
    ASSERT_EQ(send_with(tx, pa, bufs[static_cast<size_t>(i)],
                        {Cmsg::of(RDS_CMSG_ZCOPY_COOKIE, cookie)}, MSG_ZEROCOPY),
              static_cast<ssize_t>(kLen))
        << i << ": " << strerror(errno);
  }
  sockaddr_in da = addr(pa);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CANCEL_SENT_TO, &da, sizeof da), 0);
  // A completed cookie hands its buffer back: the application reuses it at once.
  std::multiset<uint32_t> done;
  auto take_cookies = [&](int wait_ms) {
    for (uint32_t k : zcopy_cookies(tx, wait_ms)) {
      done.insert(k);
      if (k - 500 < kMsgs) std::fill(bufs[k - 500].begin(), bufs[k - 500].end(), '#');
    }
  };
  take_cookies(300);
  EXPECT_LT(done.size(), static_cast<size_t>(kMsgs))
      << "the posted messages' cookies wait for their SENDs to retire";
  peer.cont();
  ASSERT_EQ(send_with(tx, pa, "END", {}), 3);
  EXPECT_TRUE(all_intact_until_end(peer, kLen, kMsgs));
  // Every cookie completes, once.
  for (int rounds = 0; rounds < 50 && done.size() < kMsgs; ++rounds) take_cookies(100);
  std::multiset<uint32_t> want;
  for (int i = 0; i < kMsgs; ++i) want.insert(500 + static_cast<uint32_t>(i));
  EXPECT_EQ(done, want);
  EXPECT_EQ(counter(tx, "conn_reset"), resets_before) << "the cancel cost the connection";
  svrds_close(tx);
}

// ... and one whose last SEND went unsignaled is not left waiting for a later signaled send
// that a quiet connection may never make (ctest runs this once more with the idle trim and
// the idle close, which would otherwise post one, turned off): the cancel asks for one.
TEST(RdsCancel, ACancelledZeroCopyMessageOnAQuietConnectionStillCompletes) {
  const uint16_t pa = port(38), me = port(39);
  Peer peer;
  int tx = bound_socket(me);
  ASSERT_TRUE(uniform_peer_stopped(peer, tx, pa)) << "no peer with a connection up";
  int on = 1;
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &on, sizeof on), 0);
  const std::string buf(100, 'q');  // one small SEND, posted unsignaled
  const uint32_t cookie = 900;
  ASSERT_EQ(send_with(tx, pa, buf, {Cmsg::of(RDS_CMSG_ZCOPY_COOKIE, cookie)}, MSG_ZEROCOPY), 100);
  sockaddr_in da = addr(pa);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CANCEL_SENT_TO, &da, sizeof da), 0);
  peer.cont();
  std::vector<uint32_t> got;
  for (int i = 0; i < 100 && got.empty(); ++i) got = zcopy_cookies(tx, 100);
  EXPECT_EQ(got, std::vector<uint32_t>{cookie});
  svrds_close(tx);
}

// close() cancels like RDS_CANCEL_SENT_TO: zero-copy SENDs already posted keep their buffers
// until the device is done with them, and go out whole; the connection stays up for the
// process's other sockets.
TEST(RdsClose, CloseWithZeroCopySendsInTheDevicesHandsKeepsTheirBuffers) {
  PrivateRegistry own;  // the reset count below is of these two processes only
  const uint16_t pa = port(47), me = port(48), other = port(49);
  Peer peer;
  int tx = bound_socket(me);
  ASSERT_TRUE(uniform_peer_stopped(peer, tx, pa)) << "no peer with a connection up";
  const uint64_t resets_before = counter(tx, "conn_reset");
  int on = 1, big = 64 << 20;
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &on, sizeof on), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  constexpr size_t kLen = 1 << 20;
  std::vector<std::string> bufs;
  for (int i = 0; i < 6; ++i) bufs.emplace_back(kLen, static_cast<char>('a' + i));
  for (int i = 0; i < 6; ++i) {
    const uint32_t cookie = 700 + static_cast<uint32_t>(i);
    ASSERT_EQ(send_with(tx, pa, bufs[static_cast<size_t>(i)],
                        {Cmsg::of(RDS_CMSG_ZCOPY_COOKIE, cookie)}, MSG_ZEROCOPY),
              static_cast<ssize_t>(kLen));
  }
  ASSERT_EQ(svrds_close(tx), 0);
  peer.cont();
  const int tx2 = bound_socket(other);
  ASSERT_EQ(send_with(tx2, pa, "END", {}), 3);
  EXPECT_TRUE(all_intact_until_end(peer, kLen, 6));
  EXPECT_EQ(counter(tx2, "conn_reset"), resets_before) << "the close cost the connection";
  svrds_close(tx2);
}

// The accepting process reads its connection's ESTABLISHED event on the engine thread, but
// takes the peer's messages in wherever it polls. One that got its messages, closed and exited
// before that event was read never acked them (acks go only on a connection that is up): its
// senders kept them queued for nobody. The hook holds the event back for good, so only the
// first receive (IB's COMM_EST) can bring the connection up.
TEST(RdsAck, APeerThatExitsBeforeItsEstablishedEventStillAcksWhatItGot) {
  const uint16_t pa = port(59), me = port(60);
  setenv("SOFTVERBS_RDS_TEST_LATE_ESTABLISHED", "1", 1);
  Peer peer;
  const bool up = peer.start({pa});
  unsetenv("SOFTVERBS_RDS_TEST_LATE_ESTABLISHED");
  ASSERT_TRUE(up) << "peer process did not come up";
  int tx = bound_socket(me);
  ASSERT_EQ(send_with(tx, pa, "A0", {}), 2);
  ASSERT_EQ(send_with(tx, pa, "A1", {}), 2);
  ASSERT_EQ(send_with(tx, pa, "END", {}), 3);
  std::vector<std::pair<uint16_t, std::string>> got;
  ASSERT_TRUE(peer.collect(got)) << "peer did not receive END";
  EXPECT_EQ(peer.wait_exit(), 0);
  EXPECT_EQ(payloads_to(got, pa), (std::vector<std::string>{"A0", "A1", "END"}));
  EXPECT_TRUE(all_acked(tx, me, pa)) << "the peer never acked what it got";
  svrds_close(tx);
}

// sendmsg posts with the stack lock let go (send.cc xmit, net/rds's RDS_IN_XMIT), and the
// connection stays its own until it has the lock back: a disconnect the engine thread takes
// in meanwhile puts its teardown off to the poster (conn_down_deferred), which tears the QP
// down once its post is accounted for. The test hook holds each such post open 2 s; the peer
// is killed 300 ms into one. The send succeeds, the connection is torn down after it, and a
// new peer on the port gets the next messages, and the lost one at most once.
TEST(RdsXmit, ADisconnectWhileASendPostsOffTheLockWaitsForThePoster) {
  const int rc = in_private_child([] {
    setenv("SOFTVERBS_RDS_TEST_POST_WINDOW_MS", "2000", 1);
    const uint16_t pa = port(10), me = port(11);
    auto peer = std::make_unique<Peer>();
    if (!peer->start({pa})) return 10;
    const int tx = bound_socket(me);
    if (tx < 0 || send_with(tx, pa, "w", {}) != 1) return 11;
    std::string line;
    if (!peer->next_line(line, 5000) || line != "msg " + std::to_string(pa) + " w") return 11;
    const uint64_t deferred = counter(tx, "conn_down_deferred");
    const uint64_t unlocked = counter(tx, "send_post_unlocked");
    const uint64_t by_poster = counter(tx, "conn_down_by_poster");
    std::atomic<ssize_t> sent{-2};
    // Long enough to be posted with the lock let go (send.cc kPostOffLock).
    const std::string m1 = "m1" + std::string(20000, '.');
    std::thread sender([&] { sent = send_with(tx, pa, m1, {}); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    peer.reset();  // SIGKILL: its end of every connection closes under the post
    sender.join();
    if (sent.load() != static_cast<ssize_t>(m1.size())) return 12;
    if (counter(tx, "conn_down_deferred") <= deferred) return 13;
    if (counter(tx, "send_post_unlocked") <= unlocked) return 14;
    if (counter(tx, "conn_down_by_poster") != by_poster + 1) return 19;  // the poster ran it
    unsetenv("SOFTVERBS_RDS_TEST_POST_WINDOW_MS");  // the new peer's own sends: no window
    Peer again;
    if (!again.start({pa})) return 15;
    if (send_with(tx, pa, "m2", {}) != 2 || send_with(tx, pa, "END", {}) != 3) return 16;
    std::vector<std::pair<uint16_t, std::string>> got;
    if (!again.collect(got, 15000)) return 17;
    // m1 went down with the connection: dropped, or rerouted to the new peer (before m2 or
    // after it, as the failed reconnect to the dead one found it), never twice.
    std::map<std::string, int> seen;
    for (const auto& s : payloads_to(got, pa)) ++seen[s.rfind("m1", 0) == 0 ? "m1" : s];
    if (seen["m2"] != 1 || seen["END"] != 1 || seen["m1"] > 1 || seen.size() > 3) return 18;
    svrds_close(tx);
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10/11: set-up; 12: the send failed; 13: no teardown was put off; 14: no "
                      "post was made off the lock; 15-17: the new peer; 18: it got a message "
                      "twice, or not m2; 19: the poster did not tear the connection down";
}

TEST(RdsCancel, CancelOnlyAffectsTheCallingSocket) {
  const uint16_t pa = port(23), me1 = port(24), me2 = port(25);
  Peer peer;
  ASSERT_TRUE(peer.start({pa}));
  ASSERT_TRUE(peer.stop());
  int s1 = bound_socket(me1), s2 = bound_socket(me2);
  ASSERT_EQ(send_with(s1, pa, "s1-a", {}), 4);
  ASSERT_EQ(send_with(s2, pa, "s2-a", {}), 4);
  sockaddr_in da = addr(pa);
  ASSERT_EQ(svrds_setsockopt(s1, SOL_RDS, RDS_CANCEL_SENT_TO, &da, sizeof da), 0);
  // A different port on the same address is a different destination.
  sockaddr_in other = addr(static_cast<uint16_t>(pa + 100));
  ASSERT_EQ(svrds_setsockopt(s2, SOL_RDS, RDS_CANCEL_SENT_TO, &other, sizeof other), 0);
  EXPECT_EQ(count_info_messages(s1, RDS_INFO_SEND_MESSAGES, me1, pa), 0);
  EXPECT_EQ(count_info_messages(s1, RDS_INFO_SEND_MESSAGES, me2, pa), 1);
  ASSERT_EQ(send_with(s2, pa, "END", {}), 3);
  peer.cont();
  std::vector<std::pair<uint16_t, std::string>> got;
  ASSERT_TRUE(peer.collect(got));
  EXPECT_EQ(payloads_to(got, pa), (std::vector<std::string>{"s2-a", "END"}));
  svrds_close(s1);
  svrds_close(s2);
}

// =============================================================================================
// 3. close() (rds-api.md §1.6: closing the sending socket cancels its pending messages; queued
//    messages at a receiving socket are delivered; net/rds af_rds.c rds_release).
// =============================================================================================

TEST(RdsClose, DeliveredMessagesSurviveTheSendersCloseAndThePortIsFree) {
  const uint16_t pa = port(30), pb = port(31);
  int a = bound_socket(pa), b = bound_socket(pb);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(send_with(a, pb, tag("m", i), {}), 2);
  // All five are queued at b (RDS_INFO_RECV_MESSAGES lists b's receive queue) before a closes.
  ASSERT_TRUE(
      eventually([&] { return count_info_messages(b, RDS_INFO_RECV_MESSAGES, pb, pa) == 5; }));
  ASSERT_EQ(svrds_close(a), 0);
  // The port is free at once: a new socket binds it.
  int a2 = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in sa = addr(pa);
  ASSERT_EQ(svrds_bind(a2, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
  // b still reads everything a sent, in order, with a's address.
  std::vector<char> buf(16);
  for (int i = 0; i < 5; ++i) {
    sockaddr_in from{};
    ASSERT_EQ(recv_one(b, buf, &from), 2);
    EXPECT_EQ(std::string(buf.data(), 2), tag("m", i));
    EXPECT_EQ(ntohs(from.sin_port), pa);
  }
  // The new owner of the port sends and receives normally.
  ASSERT_EQ(send_with(a2, pb, "new", {}), 3);
  ASSERT_EQ(recv_one(b, buf), 3);
  EXPECT_EQ(std::string(buf.data(), 3), "new");
  ASSERT_EQ(send_with(b, pa, "back", {}), 4);
  ASSERT_EQ(recv_one(a2, buf), 4);
  svrds_close(a2);
  // Sending to a port nobody is bound to succeeds; the datagram is silently dropped (§1.6).
  ASSERT_EQ(send_with(b, pa, "void", {}), 4);
  ASSERT_TRUE(all_acked(b, pb, pa)) << "it is done with before anyone binds the port again";
  int a3 = bound_socket(pa);
  ASSERT_EQ(send_with(b, pa, "fresh", {}), 5);
  ASSERT_EQ(recv_one(a3, buf), 5);
  EXPECT_EQ(std::string(buf.data(), 5), "fresh") << "the dropped datagram is not delivered later";
  svrds_close(a3);
  svrds_close(b);
}

TEST(RdsClose, ReceiverKeepsWorkingAfterASenderClosesMidStream) {
  // The receiving socket keeps working for other senders after one sender closed with
  // messages still being acked.
  const uint16_t pa = port(32), pb = port(33), pc = port(34);
  int a = bound_socket(pa), b = bound_socket(pb), c = bound_socket(pc);
  std::string big(60000, 'x');
  int sz = 1 << 20;
  ASSERT_EQ(svrds_setsockopt(b, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz), 0);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(send_with(a, pb, big, {}), 60000);
  ASSERT_EQ(svrds_close(a), 0);  // some may still be in flight: may or may not be seen
  ASSERT_EQ(send_with(c, pb, "from-c", {}), 6);
  std::vector<char> buf(65536);
  bool got_c = false;
  for (int i = 0; i < 9 && !got_c; ++i) {
    sockaddr_in from{};
    const ssize_t n = recv_one(b, buf, &from);
    ASSERT_GT(n, 0) << "b stopped receiving after a's close";
    if (ntohs(from.sin_port) == pc) {
      EXPECT_EQ(std::string(buf.data(), static_cast<size_t>(n)), "from-c");
      got_c = true;
    } else {
      EXPECT_EQ(n, 60000);
    }
  }
  EXPECT_TRUE(got_c);
  svrds_close(b);
  svrds_close(c);
}

TEST(RdsClose, CloseWithQueuedUnsentMessagesCancelsThem) {
  const uint16_t pa = port(35), me = port(36);
  Peer peer;
  ASSERT_TRUE(peer.start({pa}));
  ASSERT_TRUE(peer.stop());
  int tx = bound_socket(me);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(send_with(tx, pa, tag("old", i), {}), 4);
  // An RDMA op with NOTIFY_ME queued as well: close must not crash on it.
  std::vector<char> src(32, 'r');
  rds_iovec lv{reinterpret_cast<uint64_t>(src.data()), src.size()};
  const rds_rdma_args ra = write_args(0x1234, lv, 0);
  ASSERT_EQ(send_with(tx, pa, "oldrdma", {Cmsg::of(RDS_CMSG_RDMA_ARGS, ra)}), 7);
  ASSERT_EQ(count_info_messages(tx, RDS_INFO_SEND_MESSAGES, me, pa), 4);
  ASSERT_EQ(svrds_close(tx), 0);
  int probe = bound_socket(port(37));
  EXPECT_EQ(count_info_messages(probe, RDS_INFO_SEND_MESSAGES, me, pa), 0)
      << "close cancels what the socket still had queued (rds_release -> rds_send_drop_to)";
  // The port is free immediately, and its new owner's messages flow once the peer answers.
  int tx2 = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in sa = addr(me);
  ASSERT_EQ(svrds_bind(tx2, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
  ASSERT_EQ(send_with(tx2, pa, "new", {}), 3);
  ASSERT_EQ(send_with(tx2, pa, "END", {}), 3);
  peer.cont();
  std::vector<std::pair<uint16_t, std::string>> got;
  ASSERT_TRUE(peer.collect(got));
  EXPECT_EQ(payloads_to(got, pa), (std::vector<std::string>{"new", "END"}))
      << "messages cancelled by close were never transmitted, so never seen";
  EXPECT_EQ(peer.wait_exit(), 0);
  svrds_close(tx2);
  svrds_close(probe);
}

// =============================================================================================
// 4. poll() and congestion (rds-api.md §1.7, §3): POLLOUT means rs_snd_bytes < sndbuf, not that
//    the destination accepts; a congested destination is ENOBUFS for MSG_DONTWAIT.
// =============================================================================================

namespace {

// Sends 1000-byte messages from tx to dport until ENOBUFS (bounded); returns how many went.
int fill_until_enobufs(int tx, uint16_t dport) {
  std::string m(1000, 'c');
  int accepted = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(4);
  while (Clock::now() < deadline) {
    if (send_with(tx, dport, m, {}, MSG_DONTWAIT) == 1000) {
      ++accepted;
    } else if (errno == ENOBUFS) {
      return accepted;
    } else {
      EXPECT_EQ(errno, EAGAIN);
      wait_for(tx, POLLOUT, 100);
    }
  }
  return -1;
}

// Reads everything queued at rx (nothing is in flight any more); counts datagrams.
int drain(int rx) {
  std::vector<char> buf(4096);
  int n = 0;
  while (svrds_recvfrom(rx, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) >= 0) ++n;
  EXPECT_EQ(errno, EAGAIN);
  return n;
}

}  // namespace

TEST(RdsCongPoll, PollOutReflectsSendSpaceNotCongestion) {
  const uint16_t ptx = port(40), prx = port(41);
  int tx = bound_socket(ptx), rx = bound_socket(prx);
  int small = 4096, big = 1 << 20, one = 1;
  ASSERT_EQ(svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CONG_MONITOR, &one, sizeof one), 0);
  const int accepted = fill_until_enobufs(tx, prx);
  ASSERT_GE(accepted, 4);
  ASSERT_TRUE(all_acked(tx, ptx, prx));
  // The destination is congested, the send buffer is empty: POLLOUT is set (it only says
  // rs_snd_bytes < sndbuf) and the next send is still ENOBUFS.
  EXPECT_TRUE(wait_for(tx, POLLOUT, 0) & POLLOUT);
  EXPECT_EQ(send_with(tx, prx, "still", {}, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, ENOBUFS);
  EXPECT_EQ(wait_for(tx, POLLIN, 0) & POLLIN, 0) << "no relief before the receiver drains";
  // The receiver drains (below rcvbuf/2 its port leaves the map): the monitor reports the
  // port's group as RDS_CMSG_CONG_UPDATE.
  EXPECT_EQ(drain(rx), accepted);
  ASSERT_TRUE(wait_for(tx, POLLIN, 2000) & POLLIN) << "congestion relief must wake the sender";
  uint64_t mask = 0;
  ASSERT_TRUE(get_cong_update(tx, mask, 0)) << "an RDS_CMSG_CONG_UPDATE is queued";
  EXPECT_EQ(mask, RDS_CONG_MONITOR_MASK(prx)) << "exactly the port group that was refused";
  // Reading the update clears it; the destination takes messages again.
  EXPECT_EQ(wait_for(tx, POLLIN, 0) & POLLIN, 0);
  EXPECT_EQ(send_with(tx, prx, "again", {}, MSG_DONTWAIT), 5);
  EXPECT_TRUE(wait_for(tx, POLLOUT, 0) & POLLOUT);
  svrds_close(tx);
  svrds_close(rx);
}

TEST(RdsCongPoll, CongestionOfOneDestinationDoesNotBlockAnother) {
  const uint16_t ptx = port(42), prx = port(43), pok = port(44);
  int tx = bound_socket(ptx), rx = bound_socket(prx), ok = bound_socket(pok);
  int small = 4096;
  ASSERT_EQ(svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_GE(fill_until_enobufs(tx, prx), 4);
  // Congestion is per destination port: another port of the same peer takes messages.
  ASSERT_EQ(send_with(tx, pok, "fine", {}, MSG_DONTWAIT), 4);
  std::vector<char> buf(16);
  ASSERT_EQ(recv_one(ok, buf), 4);
  EXPECT_EQ(send_with(tx, prx, "no", {}, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, ENOBUFS);
  svrds_close(tx);
  svrds_close(rx);
  svrds_close(ok);
}

// Without RDS_CONG_MONITOR, Linux reports POLLIN|POLLRDNORM|POLLWRBAND once per congestion map
// update since the socket last polled (rds_poll: rds_cong_updated_since on the global
// rds_cong_generation), and a socket that got ENOBUFS is parked on rds_poll_waitq, which every
// map update wakes (rds-api.md §1.7, §3.2: "apps retry ENOBUFS'd sends after POLLIN").
// softverbs cannot see poll() itself: a socket that got ENOBUFS gets POLLIN when an update
// frees a port and keeps it until its next recvmsg/sendmsg (cong.cc cong_map_received).
TEST(RdsCongPoll, WithoutMonitorMapUpdateRaisesPollIn) {
  const uint16_t ptx = port(45), prx = port(46);
  int tx = bound_socket(ptx), rx = bound_socket(prx);
  int small = 4096;
  ASSERT_EQ(svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  const int accepted = fill_until_enobufs(tx, prx);
  ASSERT_GE(accepted, 4);
  ASSERT_TRUE(all_acked(tx, ptx, prx));
  // The update that set the congested bit was already seen; poll once to consume it, after
  // which nothing is pending.
  (void)wait_for(tx, POLLIN, 0);
  EXPECT_EQ(wait_for(tx, POLLIN, 0) & POLLIN, 0);
  // Drain the receiver; the update clearing the bit must wake the sender's poll(POLLIN).
  EXPECT_EQ(drain(rx), accepted);
  EXPECT_TRUE(wait_for(tx, POLLIN, 2000) & POLLIN)
      << "a congestion map update must raise POLLIN on a non-monitoring socket";
  // There is nothing to read (recvmsg: EAGAIN), and the destination takes messages again.
  char b[8];
  EXPECT_EQ(svrds_recvfrom(tx, b, sizeof b, MSG_DONTWAIT, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_TRUE(eventually([&] { return send_with(tx, prx, "go", {}, MSG_DONTWAIT) == 2; }));
  svrds_close(tx);
  svrds_close(rx);
}

// An atomic whose connection is lost under it may or may not have run at the peer: it reports
// RDS_RDMA_DROPPED (every RDS RDMA op reports, failures included), it is not repeated (Writes
// and Reads would be), and its message is not delivered.
TEST(RdsAtomic, ConnectionLostUnderAnAtomicReportsDropped) {
  const uint16_t pp = port(57), me = port(58);
  Peer peer;
  ASSERT_TRUE(peer.start({pp}, "region")) << "peer process did not come up";
  std::string line;
  ASSERT_TRUE(peer.next_line(line, 5000));
  ASSERT_EQ(line.rfind("cookie ", 0), 0u) << line;
  const uint64_t cookie = std::stoull(line.substr(7));
  int tx = bound_socket(me);
  alignas(8) uint64_t old = 0;
  // The first atomic brings the RDMA channel up.
  rds_atomic_args a = atomic_args(cookie, &old, 0, 1);
  a.fadd.add = 5;
  ASSERT_EQ(send_with(tx, pp, "one", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}), 3);
  rds_rdma_notify n{};
  ASSERT_TRUE(get_notify(tx, n, 5000));
  EXPECT_EQ(n.user_token, 1u);
  EXPECT_EQ(n.status, RDS_RDMA_SUCCESS);
  // The second goes out to a peer that cannot answer, and the peer then dies.
  ASSERT_TRUE(peer.stop());
  rds_atomic_args b = atomic_args(cookie, &old, 0, 2);
  b.fadd.add = 7;
  ASSERT_EQ(send_with(tx, pp, "two", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, b)}), 3);
  EXPECT_FALSE(get_notify(tx, n, 300)) << "no answer from a stopped peer";
  kill(peer.pid, SIGKILL);
  EXPECT_EQ(peer.wait_exit(), 128 + SIGKILL);
  ASSERT_TRUE(get_notify(tx, n, 10000)) << "the lost atomic must still report";
  EXPECT_EQ(n.user_token, 2u);
  EXPECT_EQ(n.status, RDS_RDMA_DROPPED);
  EXPECT_FALSE(get_notify(tx, n, 300)) << "reported once";
  svrds_close(tx);
}

// A peer whose device has no atomics (Linux siw; here softverbs with SOFTVERBS_RFC7306=0,
// which turns off RFC 7306 and so reports atomic_cap IBV_ATOMIC_NONE) says so in its
// connection's private data. An atomic queued before that is known fails alone at post,
// OTHER_ERROR, its message with it; once known, sendmsg refuses atomics with EOPNOTSUPP, as
// Linux RDS does on a transport without atomics (send.c). Either way the RDMA channel stays
// up: posted, the atomic would have cost the channel its connection (the peer's Terminate),
// and every op queued behind it a reconnect.
TEST(RdsAtomic, APeerWithoutAtomicsRefusesThemWithoutLosingTheRdmaChannel) {
  const uint16_t pp = port(40), me = port(41);
  PrivateRegistry own;  // the reset count below is of these two processes only
  setenv("SOFTVERBS_RFC7306", "0", 1);
  Peer peer;
  const bool up = peer.start({pp}, "region");
  unsetenv("SOFTVERBS_RFC7306");
  ASSERT_TRUE(up) << "peer process did not come up";
  std::string line;
  ASSERT_TRUE(peer.next_line(line, 5000));
  ASSERT_EQ(line.rfind("cookie ", 0), 0u) << line;
  const uint64_t cookie = std::stoull(line.substr(7));
  int tx = bound_socket(me);
  const uint64_t resets = counter(tx, "rdma_chan_reset");
  const uint64_t unsupported = counter(tx, "send_atomic_unsupported");
  // The first message to the peer: nothing is known of it yet, so its Write and atomic are
  // queued; the atomic is refused before the Write goes (both or neither).
  std::vector<char> src(16, 'W');
  rds_iovec lv{reinterpret_cast<uint64_t>(src.data()), src.size()};
  alignas(8) uint64_t old = 0;
  rds_atomic_args a = atomic_args(cookie, &old, 0, 1);
  a.fadd.add = 5;
  ASSERT_EQ(send_with(tx, pp, "one",
                      {Cmsg::of(RDS_CMSG_RDMA_ARGS, write_args(cookie, lv, 4)),
                       Cmsg::of(RDS_CMSG_ATOMIC_FADD, a)}),
            3);
  std::map<uint64_t, int> got;  // token -> status
  rds_rdma_notify n{};
  for (int i = 0; i < 2 && get_notify(tx, n, 5000); ++i) got[n.user_token] = n.status;
  EXPECT_EQ(got, (std::map<uint64_t, int>{{1, RDS_RDMA_OTHER_ERROR}, {4, RDS_RDMA_DROPPED}}))
      << "the atomic refused, its message's Write not done";
  EXPECT_GE(counter(tx, "send_atomic_unsupported"), unsupported + 1);
  // Now it is known: refused at sendmsg, nothing queued, nothing to report.
  rds_atomic_args b = atomic_args(cookie, &old, 0, 2);
  b.fadd.add = 7;
  EXPECT_EQ(send_with(tx, pp, "two", {Cmsg::of(RDS_CMSG_ATOMIC_FADD, b)}), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // The channel that carried the refused atomic still carries a Write, at once.
  const rds_rdma_args ra = write_args(cookie, lv, 3);
  ASSERT_EQ(send_with(tx, pp, "three", {Cmsg::of(RDS_CMSG_RDMA_ARGS, ra)}), 5);
  ASSERT_TRUE(get_notify(tx, n, 5000));
  EXPECT_EQ(n.user_token, 3u);
  EXPECT_EQ(n.status, RDS_RDMA_SUCCESS);
  EXPECT_FALSE(get_notify(tx, n, 200)) << "the refused atomic reported nothing";
  EXPECT_EQ(counter(tx, "rdma_chan_reset"), resets) << "no RDMA channel was lost";
  svrds_close(tx);
}

// A process whose own device has no atomics refuses them at sendmsg (EOPNOTSUPP, Linux RDS
// on a transport without xmit_atomic), before anything is queued or connected.
TEST(RdsAtomic, ADeviceWithoutAtomicsRefusesThemAtSendmsg) {
  const uint16_t pp = port(42), from = port(43);
  Peer target;
  ASSERT_TRUE(target.start({pp}, "region")) << "peer process did not come up";
  setenv("SOFTVERBS_RFC7306", "0", 1);
  Peer sender;  // its own process: this one's device may be open already, with atomics
  const bool up = sender.start({from, pp}, "atomic");
  unsetenv("SOFTVERBS_RFC7306");
  ASSERT_TRUE(up) << "sender process did not come up";
  std::string line;
  ASSERT_TRUE(sender.next_line(line, 5000));
  EXPECT_EQ(line, "sendmsg -1 " + std::to_string(EOPNOTSUPP));
  ASSERT_TRUE(sender.next_line(line, 5000));
  EXPECT_EQ(line, "plain 5") << "a plain message from the same socket still goes";
  EXPECT_EQ(sender.wait_exit(), 0);
}

// =============================================================================================
// 5. IPv6 (rds-api.md §1.3: bind takes sockaddr_in or sockaddr_in6, v4 stored v4-mapped; §1.4:
//    v4<->v6 mismatch on send is EOPNOTSUPP). Linux: net/rds bind.c rds_bind, send.c
//    rds_sendmsg, af_rds.c rds_getname.
//
// Linux never answers EAFNOSUPPORT here: with CONFIG_IPV6 it validates the v6 address (EINVAL
// for ::, multicast, short length, link-local without scope id, mapped any/broadcast/multicast),
// binds ::1 to the loopback transport and v4-mapped addresses as IPv4. softverbs does the same
// (af_rds.cc classify_v6, bind6); its transport carries IPv4 only (see ENETUNREACH below).
// =============================================================================================

namespace {

sockaddr_in6 addr6(const char* ip, uint16_t p, uint32_t scope = 0) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(p);
  a.sin6_scope_id = scope;
  inet_pton(AF_INET6, ip, &a.sin6_addr);
  return a;
}

int bind6(int fd, const sockaddr_in6& a, socklen_t len = sizeof(sockaddr_in6)) {
  return svrds_bind(fd, reinterpret_cast<const sockaddr*>(&a), len);
}

}  // namespace

TEST(RdsIpv6, BindRejectsBadV6AddressesWithEinval) {
  const uint16_t p = port(50);
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  ASSERT_GE(fd, 0);
  struct Case {
    const char* ip;
    uint32_t scope;
    socklen_t len;
    const char* why;
  } cases[] = {
      {"::1", 0, sizeof(sockaddr_in), "addr_len < sizeof(sockaddr_in6)"},
      {"::", 0, sizeof(sockaddr_in6), "unspecified address"},
      {"ff02::1", 0, sizeof(sockaddr_in6), "multicast"},
      {"fe80::1", 0, sizeof(sockaddr_in6), "link-local without scope id"},
      {"::ffff:0.0.0.0", 0, sizeof(sockaddr_in6), "v4-mapped INADDR_ANY"},
      {"::ffff:255.255.255.255", 0, sizeof(sockaddr_in6), "v4-mapped broadcast"},
      {"::ffff:224.0.0.1", 0, sizeof(sockaddr_in6), "v4-mapped multicast"},
  };
  for (const Case& c : cases) {
    errno = 0;
    EXPECT_EQ(bind6(fd, addr6(c.ip, p, c.scope), c.len), -1) << c.why;
    EXPECT_EQ(errno, EINVAL) << c.why << ": " << strerror(errno);
  }
  // A well-formed unicast address this host does not have: no transport takes it.
  errno = 0;
  EXPECT_EQ(bind6(fd, addr6("2001:db8::1", p)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL) << strerror(errno);
  // None of that bound the socket: a v4 bind still works.
  sockaddr_in a = addr(p);
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  svrds_close(fd);
}

TEST(RdsIpv6, BindLoopbackV6AndV4Mapped) {
  const uint16_t p6 = port(51), pm = port(52);
  // ::1 goes to the loopback transport (rds_trans_get_preferred), no interface lookup needed.
  int s6 = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  ASSERT_EQ(bind6(s6, addr6("::1", p6)), 0) << strerror(errno);
  sockaddr_in6 name{};
  socklen_t nl = sizeof name;
  ASSERT_EQ(svrds_getsockname(s6, reinterpret_cast<sockaddr*>(&name), &nl), 0);
  EXPECT_EQ(nl, sizeof(sockaddr_in6));
  EXPECT_EQ(name.sin6_family, AF_INET6);
  EXPECT_EQ(ntohs(name.sin6_port), p6);
  const unsigned char loop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(std::memcmp(&name.sin6_addr, loop6, 16), 0) << "::1";
  // Re-bind is EINVAL whatever the family.
  sockaddr_in v4 = addr(p6);
  EXPECT_EQ(svrds_bind(s6, reinterpret_cast<sockaddr*>(&v4), sizeof v4), -1);
  EXPECT_EQ(errno, EINVAL);
  // A v6-bound socket cannot send to an IPv4 destination.
  EXPECT_EQ(send_with(s6, p6, "x", {}), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // softverbs' transport carries IPv4 only: a v6 socket's send to a v6 peer is ENETUNREACH
  // (Linux would carry it), and nothing is queued.
  {
    sockaddr_in6 d = addr6("::1", p6);
    iovec v{const_cast<char*>("y"), 1};
    msghdr m{};
    m.msg_name = &d;
    m.msg_namelen = sizeof d;
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    EXPECT_EQ(svrds_sendmsg(s6, &m, 0), -1);
    EXPECT_EQ(errno, ENETUNREACH);
  }
  // ::ffff:127.0.0.1 is the IPv4 address 127.0.0.1: getsockname says AF_INET, and the
  // same port through AF_INET is taken.
  int sm = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  ASSERT_EQ(bind6(sm, addr6("::ffff:127.0.0.1", pm)), 0) << strerror(errno);
  sockaddr_in n4{};
  socklen_t l4 = sizeof n4;
  ASSERT_EQ(svrds_getsockname(sm, reinterpret_cast<sockaddr*>(&n4), &l4), 0);
  EXPECT_EQ(n4.sin_family, AF_INET);
  EXPECT_EQ(ntohs(n4.sin_port), pm);
  EXPECT_EQ(n4.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  int dup = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in same = addr(pm);
  EXPECT_EQ(svrds_bind(dup, reinterpret_cast<sockaddr*>(&same), sizeof same), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  svrds_close(dup);
  svrds_close(sm);
  svrds_close(s6);
}

TEST(RdsIpv6, V6DestinationsFromAnIpv4Socket) {
  const uint16_t pa = port(53), pb = port(54);
  int a = bound_socket(pa), b = bound_socket(pb);
  auto send6 = [&](const sockaddr_in6& d, socklen_t len, const char* what) {
    iovec v{const_cast<char*>(what), std::strlen(what)};
    msghdr m{};
    m.msg_name = const_cast<sockaddr_in6*>(&d);
    m.msg_namelen = len;
    m.msg_iov = &v;
    m.msg_iovlen = 1;
    return svrds_sendmsg(a, &m, 0);
  };
  // A real IPv6 destination from an IPv4-bound socket: EOPNOTSUPP (address family mismatch).
  EXPECT_EQ(send6(addr6("::1", pb), sizeof(sockaddr_in6), "v6"), -1);
  EXPECT_EQ(errno, EOPNOTSUPP) << strerror(errno);
  // Invalid v6 destinations: EINVAL.
  EXPECT_EQ(send6(addr6("ff02::1", pb), sizeof(sockaddr_in6), "mc"), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(send6(addr6("::ffff:127.0.0.1", pb), sizeof(sockaddr_in), "short"), -1);
  EXPECT_EQ(errno, EINVAL);
  // A v4-mapped destination is the IPv4 address: delivered to b.
  ASSERT_EQ(send6(addr6("::ffff:127.0.0.1", pb), sizeof(sockaddr_in6), "mapped"), 6)
      << strerror(errno);
  std::vector<char> buf(16);
  sockaddr_in from{};
  ASSERT_EQ(recv_one(b, buf, &from), 6);
  EXPECT_EQ(std::string(buf.data(), 6), "mapped");
  EXPECT_EQ(from.sin_family, AF_INET);
  EXPECT_EQ(ntohs(from.sin_port), pa);
  svrds_close(a);
  svrds_close(b);
}

// ---- main: the test binary, or (--rds-peer=...) the peer process of a test ----------------

int main(int argc, char** argv) {
  setenv("SOFTVERBS_NETDEV", "lo", 0);
  signal(SIGPIPE, SIG_IGN);
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--rds-peer=collect") == 0)
      return peer_collect(argc - i - 1, argv + i + 1);
    else if (std::strcmp(argv[i], "--rds-peer=uniform") == 0 && i + 1 < argc)
      return peer_uniform(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rds-peer=region") == 0 && i + 1 < argc)
      return peer_region(argv[i + 1]);
    else if (std::strcmp(argv[i], "--rds-peer=atomic") == 0 && i + 2 < argc)
      return peer_atomic(argv[i + 1], argv[i + 2]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
