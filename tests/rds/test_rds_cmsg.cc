// Receive-side control messages and zero-copy send, as upstream Linux RDS has them:
// SO_RDS_MSG_RXPATH_LATENCY + RDS_CMSG_RXPATH_LATENCY, SO_TIMESTAMP(_NEW) on RDS sockets,
// SO_ZEROCOPY + MSG_ZEROCOPY with RDS_CMSG_ZCOPY_COOKIE and RDS_CMSG_ZCOPY_COMPLETION.
#include <sys/time.h>

#include <map>
#include <numeric>

#include "rds_test_util.h"

using namespace rdstest;

namespace {

struct Received {
  ssize_t n = -1;
  std::vector<char> data;
  std::vector<std::pair<int, int>> cmsgs;  // (level, type) in order
  std::map<int, std::vector<char>> payload;
  int flags = 0;
};

Received receive_with_cmsgs(int fd, size_t ctl_room = 256, int wait_ms = 5000) {
  Received r;
  if (!(wait_for(fd, POLLIN, wait_ms) & POLLIN)) return r;
  r.data.resize(300 * 1024);
  alignas(cmsghdr) char ctl[512];
  iovec v{r.data.data(), r.data.size()};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = ctl_room;
  r.n = svrds_recvmsg(fd, &m, MSG_DONTWAIT);
  r.flags = m.msg_flags;
  if (r.n < 0) return r;
  r.data.resize(static_cast<size_t>(r.n));
  for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
    r.cmsgs.emplace_back(cm->cmsg_level, cm->cmsg_type);
    const auto* d = reinterpret_cast<const char*>(CMSG_DATA(cm));
    r.payload[cm->cmsg_type].assign(d, d + (cm->cmsg_len - CMSG_LEN(0)));
  }
  return r;
}

template <class T>
T as(const std::vector<char>& b) {
  T t{};
  std::memcpy(&t, b.data(), std::min(sizeof t, b.size()));
  return t;
}

int64_t now_us() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  return static_cast<int64_t>(tv.tv_sec) * 1000000 + tv.tv_usec;
}

ssize_t send_zcopy(int fd, uint16_t dport, const std::vector<iovec>& iov, const uint32_t* cookie,
                   int flags = MSG_ZEROCOPY) {
  sockaddr_in d = addr(dport);
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(uint32_t))] = {};
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_iov = const_cast<iovec*>(iov.data());
  m.msg_iovlen = iov.size();
  if (cookie) {
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    cmsghdr* cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_RDS;
    cm->cmsg_type = RDS_CMSG_ZCOPY_COOKIE;
    cm->cmsg_len = CMSG_LEN(sizeof(uint32_t));
    std::memcpy(CMSG_DATA(cm), cookie, sizeof *cookie);
  }
  return svrds_sendmsg(fd, &m, flags);
}

}  // namespace

TEST(RdsRxpathLatency, BadTraceRequestsAreEfault) {
  const int fd = bound_socket(port(0));
  rds_rx_trace_so t{};
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, &t, sizeof t - 1), -1);
  EXPECT_EQ(errno, EFAULT);
  t.rx_traces = RDS_MSG_RX_DGRAM_TRACE_MAX + 1;
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, &t, sizeof t), -1);
  EXPECT_EQ(errno, EFAULT);
  t.rx_traces = 2;
  t.rx_trace_pos[0] = RDS_MSG_RX_HDR_TO_DGRAM_START;
  t.rx_trace_pos[1] = RDS_MSG_RX_DGRAM_TRACE_MAX;  // not a trace point
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, &t, sizeof t), -1);
  EXPECT_EQ(errno, EFAULT);
  // ... and tracing is off after such a request (rds_recv_track_latency resets it).
  ASSERT_EQ(send_to(fd, port(0), "x", 1), 1);
  const Received r = receive_with_cmsgs(fd);
  ASSERT_EQ(r.n, 1);
  EXPECT_TRUE(r.cmsgs.empty());
  svrds_close(fd);
}

TEST(RdsRxpathLatency, EachRequestedPointIsReportedInNanoseconds) {
  const int a = bound_socket(port(1)), b = bound_socket(port(2));
  rds_rx_trace_so t{};
  t.rx_traces = 3;
  t.rx_trace_pos[0] = RDS_MSG_RX_DGRAM_DELIVERED;  // any order, echoed back
  t.rx_trace_pos[1] = RDS_MSG_RX_HDR_TO_DGRAM_START;
  t.rx_trace_pos[2] = RDS_MSG_RX_DGRAM_REASSEMBLE;
  ASSERT_EQ(svrds_setsockopt(b, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, &t, sizeof t), 0);
  std::vector<char> big(200 * 1024, 'z');  // several fragments
  ASSERT_EQ(send_to(a, port(2), big.data(), big.size()), static_cast<ssize_t>(big.size()));
  ASSERT_TRUE(wait_for(b, POLLIN) & POLLIN);
  usleep(20000);  // the datagram waits 20 ms between delivery and recvmsg
  const Received r = receive_with_cmsgs(b);
  ASSERT_EQ(r.n, static_cast<ssize_t>(big.size()));
  ASSERT_EQ(r.cmsgs, (std::vector<std::pair<int, int>>{{SOL_RDS, RDS_CMSG_RXPATH_LATENCY}}));
  const auto tr = as<rds_cmsg_rx_trace>(r.payload.at(RDS_CMSG_RXPATH_LATENCY));
  EXPECT_EQ(tr.rx_traces, 3);
  EXPECT_EQ(tr.rx_trace_pos[0], RDS_MSG_RX_DGRAM_DELIVERED);
  EXPECT_EQ(tr.rx_trace_pos[1], RDS_MSG_RX_HDR_TO_DGRAM_START);
  EXPECT_EQ(tr.rx_trace_pos[2], RDS_MSG_RX_DGRAM_REASSEMBLE);
  // Delivered -> recvmsg spans the 20 ms wait; every delta is a sane duration.
  EXPECT_GE(tr.rx_trace[0], 20'000'000u);
  for (int i = 0; i < 3; ++i) EXPECT_LT(tr.rx_trace[i], 10'000'000'000u) << i;
  svrds_close(a);
  svrds_close(b);
}

TEST(RdsTimestamp, SoTimestampAttachesTheReceiveTime) {
  const int a = bound_socket(port(3)), b = bound_socket(port(4));
  int on = 1;
  ASSERT_EQ(svrds_setsockopt(b, SOL_SOCKET, SO_TIMESTAMP_OLD, &on, sizeof on), 0);
  int v = 0;
  socklen_t vl = sizeof v;
  ASSERT_EQ(svrds_getsockopt(b, SOL_SOCKET, SO_TIMESTAMP_OLD, &v, &vl), 0);
  EXPECT_EQ(v, 1);
  const int64_t before = now_us();
  ASSERT_EQ(send_to(a, port(4), "t", 1), 1);
  Received r = receive_with_cmsgs(b);
  const int64_t after = now_us();
  ASSERT_EQ(r.n, 1);
  ASSERT_EQ(r.cmsgs, (std::vector<std::pair<int, int>>{{SOL_SOCKET, SO_TIMESTAMP_OLD}}));
  const auto tv = as<timeval>(r.payload.at(SO_TIMESTAMP_OLD));
  const int64_t at = static_cast<int64_t>(tv.tv_sec) * 1000000 + tv.tv_usec;
  EXPECT_GE(at, before);
  EXPECT_LE(at, after);
  // SO_TIMESTAMP_NEW set at SOL_RDS (rds_enable_recvtstamp): 64-bit seconds and usecs; with a
  // trace requested too, the timestamp comes first.
  ASSERT_EQ(svrds_setsockopt(b, SOL_RDS, SO_TIMESTAMP_NEW, &on, sizeof on), 0);
  rds_rx_trace_so t{};
  t.rx_traces = 1;
  ASSERT_EQ(svrds_setsockopt(b, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, &t, sizeof t), 0);
  ASSERT_EQ(send_to(a, port(4), "u", 1), 1);
  r = receive_with_cmsgs(b);
  ASSERT_EQ(r.n, 1);
  ASSERT_EQ(r.cmsgs, (std::vector<std::pair<int, int>>{{SOL_SOCKET, SO_TIMESTAMP_NEW},
                                                       {SOL_RDS, RDS_CMSG_RXPATH_LATENCY}}));
  struct {
    int64_t sec, usec;
  } t64 = as<decltype(t64)>(r.payload.at(SO_TIMESTAMP_NEW));
  EXPECT_GE(t64.sec * 1000000 + t64.usec, before);
  EXPECT_LE(t64.sec * 1000000 + t64.usec, now_us());
  // No room for the trace: it is dropped with MSG_CTRUNC, the timestamp still comes.
  ASSERT_EQ(send_to(a, port(4), "v", 1), 1);
  r = receive_with_cmsgs(b, CMSG_SPACE(16));
  ASSERT_EQ(r.n, 1);
  EXPECT_EQ(r.cmsgs, (std::vector<std::pair<int, int>>{{SOL_SOCKET, SO_TIMESTAMP_NEW}}));
  EXPECT_TRUE(r.flags & MSG_CTRUNC);
  // Errors: at SOL_RDS a short option is EFAULT, at SOL_SOCKET EINVAL. Off: no timestamp.
  EXPECT_EQ(svrds_setsockopt(b, SOL_RDS, SO_TIMESTAMP_OLD, &on, 2), -1);
  EXPECT_EQ(errno, EFAULT);
  EXPECT_EQ(svrds_setsockopt(b, SOL_SOCKET, SO_TIMESTAMP_OLD, &on, 2), -1);
  EXPECT_EQ(errno, EINVAL);
  int off = 0;
  ASSERT_EQ(svrds_setsockopt(b, SOL_SOCKET, SO_TIMESTAMP_OLD, &off, sizeof off), 0);
  t.rx_traces = 0;
  ASSERT_EQ(svrds_setsockopt(b, SOL_RDS, SO_RDS_MSG_RXPATH_LATENCY, &t, sizeof t), 0);
  ASSERT_EQ(send_to(a, port(4), "w", 1), 1);
  r = receive_with_cmsgs(b);
  ASSERT_EQ(r.n, 1);
  EXPECT_TRUE(r.cmsgs.empty());
  svrds_close(a);
  svrds_close(b);
}

TEST(RdsZerocopy, MisuseGetsLinuxsErrors) {
  const int a = bound_socket(port(5));
  char buf[16] = "abc";
  std::vector<iovec> iov{{buf, 3}};
  const uint32_t cookie = 7;
  int two = 2;
  EXPECT_EQ(svrds_setsockopt(a, SOL_SOCKET, SO_ZEROCOPY, &two, sizeof two), -1);
  EXPECT_EQ(errno, EINVAL);
  // MSG_ZEROCOPY without a cookie; a cookie without SO_ZEROCOPY, or without MSG_ZEROCOPY.
  EXPECT_EQ(send_zcopy(a, port(6), iov, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(send_zcopy(a, port(6), iov, &cookie), -1);
  EXPECT_EQ(errno, EINVAL);
  int on = 1;
  ASSERT_EQ(svrds_setsockopt(a, SOL_SOCKET, SO_ZEROCOPY, &on, sizeof on), 0);
  int v = 0;
  socklen_t vl = sizeof v;
  ASSERT_EQ(svrds_getsockopt(a, SOL_SOCKET, SO_ZEROCOPY, &v, &vl), 0);
  EXPECT_EQ(v, 1);
  EXPECT_EQ(send_zcopy(a, port(6), iov, &cookie, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  // A zero-length zero-copy send has nothing to pin: EINVAL.
  std::vector<iovec> none;
  EXPECT_EQ(send_zcopy(a, port(6), none, &cookie), -1);
  EXPECT_EQ(errno, EINVAL);
  // A cookie may not travel with RDMA_ARGS (groups of rds_rm_size).
  rds_rdma_args ra{};
  ra.nr_local = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof ra) + CMSG_SPACE(sizeof cookie)] = {};
  sockaddr_in d = addr(port(6));
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_iov = iov.data();
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  cmsghdr* cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_RDMA_ARGS;
  cm->cmsg_len = CMSG_LEN(sizeof ra);
  std::memcpy(CMSG_DATA(cm), &ra, sizeof ra);
  cm = CMSG_NXTHDR(&m, cm);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_ZCOPY_COOKIE;
  cm->cmsg_len = CMSG_LEN(sizeof cookie);
  std::memcpy(CMSG_DATA(cm), &cookie, sizeof cookie);
  EXPECT_EQ(svrds_sendmsg(a, &m, MSG_ZEROCOPY), -1);
  EXPECT_EQ(errno, EINVAL);
  // A cookie cmsg too short for a u32.
  cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_type = RDS_CMSG_ZCOPY_COOKIE;
  cm->cmsg_len = CMSG_LEN(2);
  m.msg_controllen = CMSG_SPACE(2);
  EXPECT_EQ(svrds_sendmsg(a, &m, MSG_ZEROCOPY), -1);
  EXPECT_EQ(errno, EINVAL);
  svrds_close(a);
}

TEST(RdsZerocopy, EveryCookieCompletesOnceAndTheDataArrivesIntact) {
  const int a = bound_socket(port(7)), b = bound_socket(port(8));
  const uint64_t zcopy_before = counter(a, "send_zcopy");
  int on = 1;
  ASSERT_EQ(svrds_setsockopt(a, SOL_SOCKET, SO_ZEROCOPY, &on, sizeof on), 0);
  // 20 messages: single and multi-iovec, multi-fragment, one with more iovecs than a SEND
  // can gather (copied, but it still completes), one to a port nobody holds.
  constexpr int kMsgs = 20;
  std::vector<std::vector<char>> bufs;
  for (int i = 0; i < kMsgs; ++i) {
    bufs.emplace_back(i % 5 == 0 ? 150 * 1024 + i : 100 + i);
    for (size_t j = 0; j < bufs.back().size(); ++j) bufs.back()[j] = static_cast<char>(i * 7 + j);
  }
  for (int i = 0; i < kMsgs; ++i) {
    std::vector<char>& buf = bufs[static_cast<size_t>(i)];
    std::vector<iovec> iov;
    const size_t parts = i == 3 ? 20 : 1 + i % 3;
    size_t off = 0;
    for (size_t p = 0; p < parts; ++p) {
      const size_t n = p + 1 == parts ? buf.size() - off : buf.size() / parts;
      iov.push_back({buf.data() + off, n});
      off += n;
    }
    const uint32_t cookie = 1000 + static_cast<uint32_t>(i);
    const uint16_t to = i == 11 ? port(9) : port(8);  // port(9): nobody bound
    ASSERT_EQ(send_zcopy(a, to, iov, &cookie), static_cast<ssize_t>(buf.size())) << i;
    if (i == 11) continue;
    std::vector<char> got(200 * 1024);
    const ssize_t n = recv_one(b, got);
    ASSERT_EQ(n, static_cast<ssize_t>(bufs[static_cast<size_t>(i)].size())) << i;
    EXPECT_EQ(std::memcmp(got.data(), bufs[static_cast<size_t>(i)].data(), n), 0) << i;
  }
  // Completions: POLLIN, then non-blocking recvmsg returns 0 with one
  // RDS_CMSG_ZCOPY_COMPLETION of at most RDS_MAX_ZCOOKIES cookies.
  std::multiset<uint32_t> done;
  for (int rounds = 0; rounds < 100 && done.size() < kMsgs; ++rounds) {
    const Received r = receive_with_cmsgs(a, 256, 2000);
    if (r.n < 0) continue;
    ASSERT_EQ(r.n, 0);
    ASSERT_EQ(r.cmsgs, (std::vector<std::pair<int, int>>{{SOL_RDS, RDS_CMSG_ZCOPY_COMPLETION}}));
    const auto z = as<rds_zcopy_cookies>(r.payload.at(RDS_CMSG_ZCOPY_COMPLETION));
    ASSERT_GE(z.num, 1u);
    ASSERT_LE(z.num, static_cast<uint32_t>(RDS_MAX_ZCOOKIES));
    for (uint32_t k = 0; k < z.num; ++k) done.insert(z.cookies[k]);
  }
  std::multiset<uint32_t> want;
  for (int i = 0; i < kMsgs; ++i) want.insert(1000 + static_cast<uint32_t>(i));
  EXPECT_EQ(done, want);
  // Nothing more: EAGAIN, and the socket is no longer readable.
  char c;
  EXPECT_EQ(svrds_recvfrom(a, &c, 1, MSG_DONTWAIT, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(wait_for(a, POLLIN, 50), 0);
  EXPECT_GT(counter(a, "send_zcopy"), zcopy_before);
  svrds_close(a);
  svrds_close(b);
}
