// RDS socket API conformance: errno values and semantics of Linux RDS (net/rds af_rds.c,
// bind.c, send.c, recv.c; rds-api.md §1), exercised through libsvrds.
#include <fcntl.h>
#include <linux/rds.h>

#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <thread>

#include "rds_test_util.h"

using namespace rdstest;

TEST(RdsSocket, TypeAndProtocolChecked) {
  EXPECT_EQ(svrds_socket(AF_RDS, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, ESOCKTNOSUPPORT);
  EXPECT_EQ(svrds_socket(AF_RDS, SOCK_SEQPACKET, 6), -1);
  EXPECT_EQ(errno, ESOCKTNOSUPPORT);
  EXPECT_EQ(svrds_socket(AF_INET, SOCK_SEQPACKET, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(fcntl(fd, F_GETFL) & O_NONBLOCK);
  EXPECT_EQ(svrds_close(fd), 0);
  EXPECT_EQ(svrds_close(fd), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(RdsBind, Errors) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in any = addr(port(0), "0.0.0.0");
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in mc = addr(port(0), "224.0.0.1");
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&mc), sizeof mc), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in probe = addr(1);
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&probe), sizeof probe), -1);
  EXPECT_EQ(errno, EINVAL) << "port 1 is RDS_FLAG_PROBE_PORT";
  sockaddr_in remote = addr(port(0), "203.0.113.9");  // not an address of this host
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  sockaddr_in ok = addr(port(0));
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&ok), sizeof ok - 1), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&ok), sizeof ok), 0);
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&ok), sizeof ok), -1);
  EXPECT_EQ(errno, EINVAL) << "re-bind";
  int fd2 = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  EXPECT_EQ(svrds_bind(fd2, reinterpret_cast<sockaddr*>(&ok), sizeof ok), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  svrds_close(fd);
  // The port is free again once its owner closed.
  EXPECT_EQ(svrds_bind(fd2, reinterpret_cast<sockaddr*>(&ok), sizeof ok), 0);
  sockaddr_in name{};
  socklen_t nl = sizeof name;
  ASSERT_EQ(svrds_getsockname(fd2, reinterpret_cast<sockaddr*>(&name), &nl), 0);
  EXPECT_EQ(name.sin_port, ok.sin_port);
  svrds_close(fd2);
}

TEST(RdsBind, PortZeroPicksAPort) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in a = addr(0);
  ASSERT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  sockaddr_in name{};
  socklen_t nl = sizeof name;
  ASSERT_EQ(svrds_getsockname(fd, reinterpret_cast<sockaddr*>(&name), &nl), 0);
  EXPECT_GE(ntohs(name.sin_port), 2);
  svrds_close(fd);
}

TEST(RdsConnect, Errors) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in any = addr(5, "0.0.0.0");
  EXPECT_EQ(svrds_connect(fd, reinterpret_cast<sockaddr*>(&any), sizeof any), -1);
  EXPECT_EQ(errno, EDESTADDRREQ);
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  EXPECT_EQ(svrds_connect(fd, reinterpret_cast<sockaddr*>(&v6), sizeof v6), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  sockaddr_in peer{};
  socklen_t pl = sizeof peer;
  EXPECT_EQ(svrds_getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl), -1);
  EXPECT_EQ(errno, ENOTCONN);
  svrds_close(fd);
}

TEST(RdsSend, ErrorPrecedence) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  char b[8] = {};
  // unbound: ENOTCONN
  EXPECT_EQ(send_to(fd, port(1), b, sizeof b), -1);
  EXPECT_EQ(errno, ENOTCONN);
  sockaddr_in me = addr(port(2));
  ASSERT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
  // bad flags first
  EXPECT_EQ(send_to(fd, port(1), b, sizeof b, MSG_OOB), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // no destination
  iovec v{b, sizeof b};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  // bad destinations
  sockaddr_in bc = addr(port(1), "255.255.255.255");
  EXPECT_EQ(svrds_sendto(fd, b, sizeof b, 0, reinterpret_cast<sockaddr*>(&bc), sizeof bc), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in d = addr(port(1));
  EXPECT_EQ(svrds_sendto(fd, b, sizeof b, 0, reinterpret_cast<sockaddr*>(&d), 4), -1);
  EXPECT_EQ(errno, EINVAL);
  // too large
  std::vector<char> big((1 << 20) + 1);
  EXPECT_EQ(send_to(fd, port(1), big.data(), big.size()), -1);
  EXPECT_EQ(errno, EMSGSIZE);
  int small = 1024;
  ASSERT_EQ(svrds_setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  // The kernel's floor: sk_sndbuf = SOCK_MIN_SNDBUF (4608), of which RDS uses half.
  int got = 0;
  socklen_t glen = sizeof got;
  ASSERT_EQ(svrds_getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &glen), 0);
  EXPECT_EQ(got, 4608);
  EXPECT_EQ(send_to(fd, port(1), big.data(), 2305), -1);
  EXPECT_EQ(errno, EMSGSIZE) << "payload larger than sndbuf";
  EXPECT_EQ(send_to(fd, port(1), big.data(), 2304), 2304) << "the floor's worth is accepted";
  // unknown SOL_RDS cmsg
  char ctl[CMSG_SPACE(8)] = {};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  cmsghdr* cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = 99;
  cm->cmsg_len = CMSG_LEN(8);
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  svrds_close(fd);
}

// What sendmsg(2) refuses before RDS sees the call, and the control messages RDS checks with
// CMSG_OK: iovec lengths whose sum wraps a size_t were summed to a small size, and a copy of
// the real lengths then ran past the payload; a control message longer than the control
// buffer, or shorter than its own header, was read past its end. Flags RDS does not take,
// MSG_NOSIGNAL among them, are EOPNOTSUPP as in net/rds.
TEST(RdsSend, IovecsAndControlMessagesAreCheckedBeforeAnythingIsCopied) {
  int fd = bound_socket(port(62));
  char b[8] = {};
  sockaddr_in d = addr(port(63));
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  // Four lengths of 2^62: each is a valid ssize_t, their sum wraps to 0. Past any user
  // address space: access_ok's EFAULT. Sixteen of 2^52 (within it, summing to 2^56): their
  // size, EMSGSIZE.
  iovec wrap[16];
  for (iovec& v : wrap) v = {b, size_t{1} << 62};
  m.msg_iov = wrap;
  m.msg_iovlen = 4;
  errno = 0;
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EFAULT);
  for (iovec& v : wrap) v = {b, size_t{1} << 52};
  m.msg_iovlen = 16;
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EMSGSIZE);
  iovec huge[2] = {{b, SIZE_MAX}, {b, 2}};  // past SSIZE_MAX: import_iovec's EINVAL
  m.msg_iov = huge;
  m.msg_iovlen = 2;
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  std::vector<iovec> many(UIO_MAXIOV + 1, iovec{b, 0});
  m.msg_iov = many.data();
  m.msg_iovlen = many.size();
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EMSGSIZE) << "more iovecs than UIO_MAXIOV";
  iovec v{b, sizeof b};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  EXPECT_EQ(svrds_sendmsg(fd, &m, MSG_NOSIGNAL), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // A control message that claims more than the buffer holds, then one shorter than a header.
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(rds_rdma_args))] = {};
  m.msg_control = ctl;
  m.msg_controllen = CMSG_SPACE(8);
  cmsghdr* cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_RDMA_ARGS;
  cm->cmsg_len = CMSG_LEN(sizeof(rds_rdma_args));
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EINVAL) << "a control message past the control buffer";
  cm->cmsg_level = SOL_SOCKET;  // whatever the level
  cm->cmsg_len = sizeof(cmsghdr) - 1;
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EINVAL) << "a control message shorter than its header";
  // The same message, well formed and without control data, goes.
  m.msg_control = nullptr;
  m.msg_controllen = 0;
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), static_cast<ssize_t>(sizeof b));
  svrds_close(fd);
}

TEST(RdsSend, MixingRdmaGroupsIsEinval) {
  int fd = bound_socket(port(3));
  char b[4] = {};
  rds_rdma_args ra{};
  rds_iovec lv{reinterpret_cast<uint64_t>(b), sizeof b};
  ra.local_vec_addr = reinterpret_cast<uint64_t>(&lv);
  ra.nr_local = 1;
  uint64_t cookie = 0;
  char ctl[CMSG_SPACE(sizeof ra) + CMSG_SPACE(8)] = {};
  iovec v{b, sizeof b};
  sockaddr_in d = addr(port(4));
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_iov = &v;
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
  cm->cmsg_type = RDS_CMSG_RDMA_DEST;
  cm->cmsg_len = CMSG_LEN(8);
  std::memcpy(CMSG_DATA(cm), &cookie, 8);
  EXPECT_EQ(svrds_sendmsg(fd, &m, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  svrds_close(fd);
}

TEST(RdsSockopt, Errors) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  int one = 1;
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, 12345, &one, sizeof one), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  EXPECT_EQ(svrds_setsockopt(fd, SOL_IP, 1, &one, sizeof one), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  rds_get_mr_args g{};
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_GET_MR, &g, sizeof g - 1), -1);
  EXPECT_EQ(errno, EINVAL) << "optlen must be exact";
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_GET_MR, &g, sizeof g), -1);
  EXPECT_EQ(errno, ENOTCONN) << "unbound";
  sockaddr_in d = addr(port(5));
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_CANCEL_SENT_TO, &d, sizeof d), -1);
  EXPECT_EQ(errno, ENOTCONN);
  int t = RDS_TRANS_IB, got = 0;
  socklen_t gl = sizeof got;
  ASSERT_EQ(svrds_getsockopt(fd, SOL_RDS, SO_RDS_TRANSPORT, &got, &gl), 0);
  EXPECT_EQ(got, static_cast<int>(RDS_TRANS_NONE)) << "unbound socket has no transport";
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, SO_RDS_TRANSPORT, &t, sizeof t), 0);
  int bad = 7;
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, SO_RDS_TRANSPORT, &bad, sizeof bad), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in me = addr(port(6));
  ASSERT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, SO_RDS_TRANSPORT, &t, sizeof t), -1);
  EXPECT_EQ(errno, EOPNOTSUPP) << "transport fixed at bind";
  gl = sizeof got;
  ASSERT_EQ(svrds_getsockopt(fd, SOL_RDS, SO_RDS_TRANSPORT, &got, &gl), 0);
  EXPECT_EQ(got, RDS_TRANS_IB);
  rds_free_mr_args f{0x1234, 0};
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_FREE_MR, &f, sizeof f), -1);
  EXPECT_EQ(errno, EINVAL) << "unknown key";
  f.cookie = 0;
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_FREE_MR, &f, sizeof f), 0) << "cookie 0 flushes";
  ASSERT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_RECVERR, &one, sizeof one), 0);
  got = 0;
  gl = sizeof got;
  ASSERT_EQ(svrds_getsockopt(fd, SOL_RDS, RDS_RECVERR, &got, &gl), 0);
  EXPECT_EQ(got, 1);
  svrds_close(fd);
}

TEST(RdsInfo, ProbeThenFetch) {
  int fd = bound_socket(port(7));
  // rds-info's probe: a NULL buffer with length 0 answers ENOSPC and the length needed
  // (net/rds rds_info_getsockopt), as does a buffer too short.
  socklen_t len = 0;
  EXPECT_EQ(svrds_getsockopt(fd, SOL_RDS, RDS_INFO_SOCKETS, nullptr, &len), -1);
  EXPECT_EQ(errno, ENOSPC);
  ASSERT_GE(len, sizeof(rds_info_socket));
  char tiny[1];
  len = 0;
  EXPECT_EQ(svrds_getsockopt(fd, SOL_RDS, RDS_INFO_SOCKETS, tiny, &len), -1);
  EXPECT_EQ(errno, ENOSPC);
  ASSERT_GE(len, sizeof(rds_info_socket));
  // A NULL buffer with a length is EFAULT; a length that could wrap is EINVAL; no length
  // pointer is EFAULT.
  socklen_t some = 64;
  EXPECT_EQ(svrds_getsockopt(fd, SOL_RDS, RDS_INFO_SOCKETS, nullptr, &some), -1);
  EXPECT_EQ(errno, EFAULT);
  socklen_t huge = 0xFFFFFFF0u;
  EXPECT_EQ(svrds_getsockopt(fd, SOL_RDS, RDS_INFO_SOCKETS, tiny, &huge), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(svrds_getsockopt(fd, SOL_RDS, RDS_INFO_SOCKETS, tiny, nullptr), -1);
  EXPECT_EQ(errno, EFAULT);
  // Other processes' snapshots may grow between the probe and the fetch: retry like
  // rds-info does.
  std::vector<char> buf;
  int each = -1;
  for (int tries = 0; tries < 20 && each < 0; ++tries) {
    buf.resize(len + 4096);
    len = static_cast<socklen_t>(buf.size());
    each = svrds_getsockopt(fd, SOL_RDS, RDS_INFO_SOCKETS, buf.data(), &len);
    if (each < 0) {
      ASSERT_EQ(errno, ENOSPC);
    }
  }
  ASSERT_EQ(each, static_cast<int>(sizeof(rds_info_socket)));
  bool found = false;
  for (size_t off = 0; off + each <= len; off += each) {
    rds_info_socket s;
    std::memcpy(&s, buf.data() + off, sizeof s);
    if (s.bound_port == htons(port(7))) found = true;
  }
  EXPECT_TRUE(found);
  svrds_close(fd);
}

TEST(RdsData, SendRecvPeekTruncZeroLengthAndPoll) {
  int a = bound_socket(port(8)), b = bound_socket(port(9));
  // nothing yet: EAGAIN, no POLLIN, POLLOUT present
  std::vector<char> buf(64);
  EXPECT_EQ(svrds_recvfrom(b, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(wait_for(b, POLLIN, 0) & POLLIN, 0);
  EXPECT_TRUE(wait_for(a, POLLOUT, 0) & POLLOUT);
  const char msg[] = "0123456789abcdef";
  ASSERT_EQ(send_to(a, port(9), msg, 16), 16);
  ASSERT_EQ(send_to(a, port(9), msg, 0), 0) << "zero-length datagrams are legal";
  sockaddr_in from{};
  // MSG_PEEK leaves it queued; MSG_TRUNC reports the full length.
  std::vector<char> small(4);
  ASSERT_TRUE(wait_for(b, POLLIN) & POLLIN);
  socklen_t fl = sizeof from;
  EXPECT_EQ(svrds_recvfrom(b, small.data(), small.size(), MSG_PEEK | MSG_TRUNC,
                           reinterpret_cast<sockaddr*>(&from), &fl),
            16);
  EXPECT_EQ(ntohs(from.sin_port), port(8));
  iovec v{buf.data(), 8};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  EXPECT_EQ(svrds_recvmsg(b, &m, 0), 8);
  EXPECT_TRUE(m.msg_flags & MSG_TRUNC);
  EXPECT_EQ(std::memcmp(buf.data(), msg, 8), 0);
  EXPECT_EQ(recv_one(b, buf), 0) << "the zero-length one, in order";
  EXPECT_EQ(wait_for(b, POLLIN, 0) & POLLIN, 0) << "drained";
  svrds_close(a);
  svrds_close(b);
}

TEST(RdsData, OneMebibyteAndManyInOrderFromOneSocket) {
  int a = bound_socket(port(10)), b = bound_socket(port(11));
  std::vector<char> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + 3);
  int sz = 4 << 20;
  svrds_setsockopt(a, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  svrds_setsockopt(b, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  ASSERT_EQ(send_to(a, port(11), big.data(), big.size()), static_cast<ssize_t>(big.size()));
  std::vector<char> got(1 << 20);
  ASSERT_EQ(recv_one(b, got), static_cast<ssize_t>(big.size()));
  EXPECT_EQ(got, big);
  for (uint32_t i = 0; i < 500; ++i) {
    while (send_to(a, port(11), &i, sizeof i, MSG_DONTWAIT) < 0) {
      ASSERT_EQ(errno, EAGAIN);
      ASSERT_TRUE(wait_for(a, POLLOUT) & POLLOUT);
    }
  }
  std::vector<char> buf(16);
  for (uint32_t i = 0; i < 500; ++i) {
    ASSERT_EQ(recv_one(b, buf), 4);
    uint32_t v;
    std::memcpy(&v, buf.data(), 4);
    ASSERT_EQ(v, i) << "in order, exactly once";
  }
  svrds_close(a);
  svrds_close(b);
}

// On softverbs the stack takes its completions on the device's progress thread
// (softverbs_cq_set_comp_handler), with no engine-thread hop; SOFTVERBS_RDS_CQ_HANDLER=0 turns
// that off and the engine thread does it all, as on any other verbs provider. ctest runs this
// binary both ways (rds_api_engine_thread). RDS_INFO_COUNTERS sums the whole host, so the
// exchange runs in a child with a directory of its own: the counters are its alone.
TEST(RdsData, CompletionsTakenOnTheDeviceThreadUnlessTurnedOff) {
  const char* e = std::getenv("SOFTVERBS_RDS_CQ_HANDLER");
  const bool handler = !(e && std::strcmp(e, "0") == 0);
  const int rc = in_private_child([handler] {
    int a = -1, b = -1;
    if (!bound_pair(port(50), port(51), &a, &b)) return 10;
    std::vector<char> buf(64);
    for (uint32_t i = 0; i < 50; ++i) {
      uint32_t v = ~i;
      if (send_to(a, port(51), &i, sizeof i) != 4 || recv_one(b, buf) != 4) return 11;
      std::memcpy(&v, buf.data(), 4);
      if (v != i) return 12;
    }
    // A handler that finds the stack lock taken leaves its work to the holder (deferred):
    // under load (TSan, ctest -j2) the sender often still holds it as the message arrives.
    const uint64_t took = counter(a, "cq_handler_runs") + counter(a, "cq_handler_deferred");
    return handler ? (took > 0 ? 0 : 20) : (took == 0 ? 0 : 21);
  });
  EXPECT_NE(rc, 20) << "every completion went through the engine thread";
  EXPECT_NE(rc, 21) << "the handler ran although turned off";
  EXPECT_EQ(rc, 0) << "10: bind, 11: send/recv, 12: wrong data, >= 100: killed";
}

// The stack's own posts (sendmsg, recvmsg, its engine thread) are quiet (softverbs_cq_quiet):
// what completes at once is taken in under the same lock, with no CQ event. And the
// completion handler never gives a notification up (a holder of the stack lock takes its work
// in, and nobody sleeps holding it). So with the handler on, the engine thread gets no CQ
// event at all; without quiet posts every 16th Send (a signaled one) woke it, and a handler
// that came while a thread slept in a blocking call gave its work up to it.
TEST(RdsData, TheEngineThreadGetsNoCqEventWhileTheHandlerRuns) {
  const char* e = std::getenv("SOFTVERBS_RDS_CQ_HANDLER");
  if (e && std::strcmp(e, "0") == 0) return;  // every notification is its: nothing to check
  const int rc = in_private_child([] {
    int a = -1, b = -1;
    if (!bound_pair(port(56), port(57), &a, &b)) return 10;
    std::vector<char> buf(64);
    for (uint32_t i = 0; i < 200; ++i)
      if (send_to(a, port(57), &i, sizeof i) != 4 || recv_one(b, buf) != 4) return 11;
    const uint64_t events = counter(a, "engine_cq_events");
    if (counter(a, "send_queued") < 200) return 12;
    return events == 0 ? 0 : 20;
  });
  EXPECT_EQ(rc, 0) << "10: bind, 11: send/recv, 12: counters, 20: the engine thread got CQ "
                      "events, >= 100: killed";
}

// A completion handler that finds the stack lock taken leaves its completions to the lock's
// holder, who takes them in as it lets go (StackMutex: net/core/sock.c's socket backlog). It
// gave up instead, and the engine thread took them after a wake-up and a wait for that same
// lock. Here a thread takes the lock over and over (getsockopt in a loop) while 300 messages
// go from a to b: each arrives intact, the engine thread
// gets no CQ event (no handler gave its work up), and the holder's calls keep their own errno.
TEST(RdsData, AHandlerThatFindsTheLockTakenLeavesItsWorkToTheHolder) {
  const char* e = std::getenv("SOFTVERBS_RDS_CQ_HANDLER");
  if (e && std::strcmp(e, "0") == 0) return;  // no handler: nothing to check
  const int rc = in_private_child([] {
    int a = -1, b = -1;
    if (!bound_pair(port(60), port(61), &a, &b)) return 10;
    std::atomic<bool> stop{false};
    std::atomic<int> wrong_errno{0};
    // Each call fails, ENOPROTOOPT, whatever the backlog it ran as it let go left in errno
    // (its receive path reads sockets until EAGAIN).
    std::thread holder([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        int v = 0;
        socklen_t l = sizeof v;
        errno = 0;
        if (svrds_getsockopt(a, SOL_SOCKET, 0x7fff, &v, &l) != -1 || errno != ENOPROTOOPT)
          wrong_errno.fetch_add(1);
      }
    });
    std::vector<char> buf(64);
    int bad = 0;
    for (uint32_t i = 0; i < 300 && !bad; ++i) {
      uint32_t v = ~i;
      if (send_to(a, port(61), &i, sizeof i) != 4 || recv_one(b, buf) != 4) bad = 11;
      std::memcpy(&v, buf.data(), 4);
      if (!bad && v != i) bad = 12;
    }
    stop = true;
    holder.join();
    if (bad) return bad;
    if (wrong_errno.load()) return 13;
    const uint64_t events = counter(a, "engine_cq_events");
    std::printf(
        "handler runs %llu, left to the holder %llu, backlog runs %llu, engine CQ "
        "events %llu\n",
        static_cast<unsigned long long>(counter(a, "cq_handler_runs")),
        static_cast<unsigned long long>(counter(a, "cq_handler_deferred")),
        static_cast<unsigned long long>(counter(a, "cq_backlog_runs")),
        static_cast<unsigned long long>(events));
    std::fflush(stdout);  // the child leaves with _exit
    return events == 0 ? 0 : 20;
  });
  EXPECT_EQ(rc, 0) << "10: bind, 11: send/recv, 12: wrong data, 13: a failed call's errno "
                      "was not its own, 20: a handler gave its work up, >= 100: killed";
}

TEST(RdsData, SendBufferFullIsEagainAndPollOutReturns) {
  int a = bound_socket(port(12));
  int b = bound_socket(port(13));
  int small = 4096;
  ASSERT_EQ(svrds_setsockopt(a, SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
  std::vector<char> m(3000);
  // Accepted while snd_bytes < sndbuf; once at/over it, EAGAIN until the peer acks.
  int sent = 0, eagain = 0;
  for (int i = 0; i < 50 && !eagain; ++i) {
    if (send_to(a, port(13), m.data(), m.size(), MSG_DONTWAIT) == 3000)
      ++sent;
    else if (errno == EAGAIN)
      ++eagain;
  }
  EXPECT_GE(sent, 1);
  // Acks free the buffer: POLLOUT comes back without the receiver reading.
  EXPECT_TRUE(wait_for(a, POLLOUT) & POLLOUT);
  svrds_close(a);
  svrds_close(b);
}

namespace {
// One RDS_INFO_* table as rds-info reads it: probe with NULL/0, then fetch (retrying while
// other processes' snapshots grow). Returns the record size, or -errno.
int info_table(int fd, int id, std::vector<char>& buf) {
  socklen_t len = 0;
  int each = svrds_getsockopt(fd, SOL_RDS, id, nullptr, &len);
  for (int tries = 0; tries < 20 && each < 0; ++tries) {
    if (errno != ENOSPC) return -errno;
    buf.resize(len + 4096);
    len = static_cast<socklen_t>(buf.size());
    each = svrds_getsockopt(fd, SOL_RDS, id, buf.data(), &len);
  }
  buf.resize(each < 0 ? 0 : len);
  return each;
}

template <class Rec>
std::vector<Rec> records(int fd, int id) {
  std::vector<char> buf;
  const int each = info_table(fd, id, buf);
  EXPECT_EQ(each, static_cast<int>(sizeof(Rec))) << "id " << id;
  std::vector<Rec> v;
  for (size_t off = 0; each > 0 && off + sizeof(Rec) <= buf.size(); off += sizeof(Rec)) {
    Rec r;
    std::memcpy(&r, buf.data() + off, sizeof r);
    v.push_back(r);
  }
  return v;
}
}  // namespace

TEST(RdsInfo, EverySocketHasItsOwnInodeAsProcShowsIt) {
  const int a = bound_socket(port(40)), b = bound_socket(port(41));
  std::map<uint16_t, uint64_t> inum;
  for (const auto& r : records<rds_info_socket>(a, RDS_INFO_SOCKETS))
    if (r.bound_port == htons(port(40)) || r.bound_port == htons(port(41)))
      inum[ntohs(r.bound_port)] = r.inum;
  ASSERT_EQ(inum.size(), 2u);
  EXPECT_NE(inum[port(40)], inum[port(41)]);
  // The inode is the descriptor's, as /proc/self/fd shows it (socket:[N]).
  struct stat st {};
  ASSERT_EQ(fstat(a, &st), 0);
  EXPECT_EQ(inum[port(40)], st.st_ino);
  // RDS6_INFO_SOCKETS lists IPv4 sockets too, v4-mapped.
  bool found = false;
  for (const auto& r : records<rds6_info_socket>(a, RDS6_INFO_SOCKETS))
    if (r.bound_port == htons(port(40))) {
      found = true;
      const in6_addr bound = r.bound_addr;
      EXPECT_EQ(bound.s6_addr[10], 0xff);  // ::ffff:a.b.c.d
      EXPECT_EQ(bound.s6_addr[11], 0xff);
      EXPECT_EQ(r.inum, st.st_ino);
    }
  EXPECT_TRUE(found);
  svrds_close(a);
  svrds_close(b);
}

TEST(RdsInfo, IbConnectionsListOurRcConnections) {
  // A connection from 127.0.0.2 to 127.0.0.1 (this process to itself).
  const int a = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in la = addr(port(42), "127.0.0.2");
  ASSERT_EQ(svrds_bind(a, reinterpret_cast<sockaddr*>(&la), sizeof la), 0);
  const int b = bound_socket(port(43));
  ASSERT_EQ(send_to(a, port(43), "hi", 2), 2);
  std::vector<char> got(8);
  ASSERT_EQ(recv_one(b, got), 2);
  const uint32_t two = la.sin_addr.s_addr, one = addr(0).sin_addr.s_addr;
  // The table is the host's, as Linux's: under ctest -j2 another test's process may have a
  // connection between the same addresses still being made (no GIDs yet). Ours is up.
  bool found = false;
  for (const auto& r : records<rds_info_rdma_connection>(a, RDS_INFO_IB_CONNECTIONS)) {
    if (r.src_addr != two || r.dst_addr != one) continue;
    EXPECT_GT(r.max_send_wr, 0u);
    EXPECT_GT(r.max_recv_wr, 0u);
    EXPECT_GT(r.max_send_sge, 0u);
    EXPECT_GT(r.rdma_mr_max, 0u);
    // GIDs once connected: the addresses, IPv4-mapped as the device's GID table has them.
    found |= r.src_gid[10] == 0xff && std::memcmp(&r.src_gid[12], &two, 4) == 0 &&
             std::memcmp(&r.dst_gid[12], &one, 4) == 0;
  }
  EXPECT_TRUE(found) << "no connected IB connection 127.0.0.2 -> 127.0.0.1 with its GIDs";
  found = false;
  for (const auto& r : records<rds6_info_rdma_connection>(a, RDS6_INFO_IB_CONNECTIONS))
    found |= std::memcmp(&r.src_addr.s6_addr[12], &two, 4) == 0 &&
             std::memcmp(&r.dst_addr.s6_addr[12], &one, 4) == 0;
  EXPECT_TRUE(found);
  // And the plain connection table agrees.
  found = false;
  for (const auto& r : records<rds_info_connection>(a, RDS_INFO_CONNECTIONS))
    found |= r.laddr == two && r.faddr == one && (r.flags & RDS_INFO_CONNECTION_FLAG_CONNECTED);
  EXPECT_TRUE(found);
  svrds_close(a);
  svrds_close(b);
}

TEST(RdsInfo, TablesUpstreamLinuxLacksHereAreEnoprotoopt) {
  // No RDS/TCP transport (as a host with rds_rdma and no rds_tcp), and ids upstream never
  // registers; UEK-only ids beyond RDS_INFO_LAST.
  const int fd = bound_socket(port(44));
  std::vector<char> buf;
  for (int id : {RDS_INFO_TCP_SOCKETS, RDS6_INFO_TCP_SOCKETS, RDS_INFO_CONNECTION_STATS,
                 RDS_INFO_IWARP_CONNECTIONS, RDS_INFO_LAST + 3})
    EXPECT_EQ(info_table(fd, id, buf), -ENOPROTOOPT) << "id " << id;
  for (int id :
       {RDS_INFO_COUNTERS, RDS_INFO_CONNECTIONS, RDS_INFO_SEND_MESSAGES, RDS_INFO_RETRANS_MESSAGES,
        RDS_INFO_RECV_MESSAGES, RDS_INFO_SOCKETS, RDS_INFO_IB_CONNECTIONS, RDS6_INFO_CONNECTIONS,
        RDS6_INFO_SEND_MESSAGES, RDS6_INFO_RETRANS_MESSAGES, RDS6_INFO_RECV_MESSAGES,
        RDS6_INFO_SOCKETS, RDS6_INFO_IB_CONNECTIONS})
    EXPECT_GT(info_table(fd, id, buf), 0) << "id " << id;
  svrds_close(fd);
}
