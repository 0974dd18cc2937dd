// rsockets (src/rdmacm/rsocket*.cc, rpoll.cc): the socket API's errors, stream semantics
// (ring wrap, MSG_PEEK, MSG_WAITALL, half-close, peer close), rpoll/rselect over rsockets and
// ordinary fds together, option inheritance, iomaps, and what a hostile peer speaking raw
// rdma_cm/verbs can and cannot do: bad connection data is refused, and a DATA word beyond the
// granted receive space fails the connection (EPROTO) instead of being read.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "cm_util.h"
#include "wire/rsocket_wire.h"

namespace rs = sv::wire::rs;

namespace {

using cmtest::loopback;

uint16_t test_port(int i) {
  return cmtest::test_port(24000, i);
}

int listener(uint16_t port) {
  int l = rsocket(AF_INET, SOCK_STREAM, 0);
  if (l < 0) return -1;
  sockaddr_in a = loopback(port);
  if (rbind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) || rlisten(l, 4)) {
    const int e = errno;  // the failure's, not rclose's
    rclose(l);
    errno = e;
    return -1;
  }
  return l;
}

// A connected pair through listener `l`: a non-blocking connect (the request goes out at
// once), a blocking accept, then the connect completes.
void connect_pair(int l, uint16_t port, int& client, int& server, int client_iomap = 0) {
  client = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  if (client_iomap) {
    ASSERT_EQ(rsetsockopt(client, SOL_RDMA, RDMA_IOMAPSIZE, &client_iomap, sizeof client_iomap), 0);
  }
  ASSERT_EQ(rfcntl(client, F_SETFL, O_NONBLOCK), 0);
  sockaddr_in a = loopback(port);
  const int r = rconnect(client, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ASSERT_TRUE(r == 0 || errno == EINPROGRESS) << strerror(errno);
  server = raccept(l, nullptr, nullptr);
  ASSERT_GE(server, 0) << strerror(errno);
  pollfd p{client, POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);
  int err = -1;
  socklen_t len = sizeof err;
  ASSERT_EQ(rgetsockopt(client, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, 0);
  ASSERT_EQ(rfcntl(client, F_SETFL, 0), 0);
}

struct Pair : ::testing::Test {
  int l = -1, c = -1, s = -1;
  uint16_t port = 0;
  void open(int i) {
    port = test_port(i);
    l = listener(port);
    ASSERT_GE(l, 0) << strerror(errno);
    connect_pair(l, port, c, s);
  }
  void TearDown() override {
    for (int fd : {c, s, l})
      if (fd >= 0) rclose(fd);
  }
};

ssize_t send_all(int fd, const void* b, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = rsend(fd, static_cast<const char*>(b) + done, n - done, 0);
    if (r <= 0) return r;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

}  // namespace

TEST(RsocketErrors, BadDomainsTypesAndDescriptors) {
  errno = 0;
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, EAFNOSUPPORT);
  // Datagram rsockets are not offered: librspreload then falls back to a real socket.
  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, 0), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP), -1);
  EXPECT_EQ(errno, ENOTSUP);
  char b[4];
  EXPECT_EQ(rsend(-1, b, 4, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rrecv(0, b, 4, 0), -1);  // stdin is no rsocket
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rclose(123456), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(RsocketErrors, UnconnectedSocket) {
  int fd = rsocket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(rfcntl(fd, F_GETFD), FD_CLOEXEC);
  char b[4] = {};
  EXPECT_EQ(rrecv(fd, b, 4, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(rsend(fd, b, 4, 0), -1);
  EXPECT_EQ(errno, ENOTCONN);
  sockaddr_in a{};
  socklen_t len = sizeof a;
  EXPECT_EQ(rgetpeername(fd, reinterpret_cast<sockaddr*>(&a), &len), -1);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(raccept(fd, nullptr, nullptr), -1);  // not listening
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rshutdown(fd, SHUT_RDWR), -1);
  EXPECT_EQ(errno, ENOTCONN);
  EXPECT_EQ(rshutdown(fd, 7), -1);
  EXPECT_EQ(errno, EINVAL);
  int v = 1;
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_BROADCAST, &v, sizeof v), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  EXPECT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_ROUTE, &v, sizeof v), -1);
  EXPECT_EQ(errno, ENOPROTOOPT);
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &v, 1), -1);  // optlen too short
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rclose(fd), 0);
}

TEST(RsocketErrors, ConnectWithNoListenerIsRefused) {
  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a = loopback(test_port(0));
  EXPECT_EQ(rconnect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  // A failed connect leaves the socket unusable for another, as rdma-core's rs_connect_error.
  EXPECT_EQ(rconnect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, ENOTCONN);
  rclose(fd);
}

// I/O on a socket whose non-blocking connect is under way drives the connect (rdma-core's
// rs_do_connect from rrecv and rsend) and says EAGAIN meanwhile. It used to read the
// connect's rdma_cm events as a connected socket's and drop them: the connect stopped at
// its first event for good, and rrecv said EOF.
TEST(RsocketConnect, IoWhileConnectingDrivesTheConnectAndIsEagain) {
  const uint16_t port = test_port(16);
  const int l = listener(port);
  ASSERT_GE(l, 0) << strerror(errno);
  ASSERT_EQ(rfcntl(l, F_SETFL, O_NONBLOCK), 0);
  const int c = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(c, 0);
  ASSERT_EQ(rfcntl(c, F_SETFL, O_NONBLOCK), 0);
  sockaddr_in a = loopback(port);
  const int r = rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ASSERT_TRUE(r == 0 || errno == EINPROGRESS) << strerror(errno);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its first events queued
  char b = 0;
  EXPECT_EQ(rrecv(c, &b, 1, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(rsend(c, "x", 1, 0), -1);  // nobody accepted yet: still connecting
  EXPECT_EQ(errno, EAGAIN);
  pollfd lp{l, POLLIN, 0};
  ASSERT_EQ(rpoll(&lp, 1, 5000), 1) << "the connect request never came";
  const int s = raccept(l, nullptr, nullptr);
  ASSERT_GE(s, 0) << strerror(errno);
  pollfd p{c, POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1) << "the connect never ended";
  EXPECT_EQ(rsend(c, "x", 1, 0), 1);
  pollfd sp{s, POLLIN, 0};
  ASSERT_EQ(rpoll(&sp, 1, 5000), 1);
  EXPECT_EQ(rrecv(s, &b, 1, 0), 1);
  EXPECT_EQ(b, 'x');
  for (int fd : {c, s, l}) rclose(fd);
}

TEST(RsocketErrors, ListenerPortInUse) {
  const uint16_t port = test_port(1);
  int l = listener(port);
  ASSERT_GE(l, 0);
  int m = rsocket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  EXPECT_EQ(rbind(m, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  ASSERT_EQ(rfcntl(l, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(raccept(l, nullptr, nullptr), -1);  // nothing pending
  EXPECT_EQ(errno, EAGAIN);
  rclose(m);
  rclose(l);
}

TEST(RsocketErrors, ClosingAListenerRefusesWhatItNeverAccepted) {
  const uint16_t port = test_port(15);
  int l = listener(port);
  ASSERT_GE(l, 0);
  int c = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  ASSERT_GE(c, 0);
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  ASSERT_EQ(errno, EINPROGRESS);
  pollfd p{l, POLLIN, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);  // the request is queued: the listener is readable
  ASSERT_EQ(rclose(l), 0);
  p = {c, POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, 5000), 1);
  EXPECT_TRUE(p.revents & POLLERR);
  int err = 0;
  socklen_t len = sizeof err;
  ASSERT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, ECONNREFUSED);
  ASSERT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, 0);  // read once, then cleared
  rclose(c);
}

// rclose while other threads sleep on the same descriptors: each is woken, and nothing is
// freed under it. The listener's raccept gets EBADF, what a call made after the close gets
// (on the old code it slept on for good). The connected socket's rrecv gets either the EOF
// of the shutdown rclose makes first, or EBADF if it wakes after the close (rdma-core's
// rclose frees the socket under it; ASan sees any read of freed memory here). Whether a
// thread is asleep yet when rclose comes does not change what it may get.
TEST_F(Pair, RcloseWakesThreadsAsleepOnTheSocketWithEbadf) {
  open(17);
  ssize_t got = 0;
  int recv_err = 0, accept_ret = 0, accept_err = 0;
  std::thread reader([&] {
    char b[16];
    got = rrecv(s, b, sizeof b, 0);  // nothing is ever sent
    recv_err = errno;
  });
  std::thread acceptor([&] {
    accept_ret = raccept(l, nullptr, nullptr);  // nobody else connects
    accept_err = errno;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(rclose(s), 0);
  EXPECT_EQ(rclose(l), 0);
  reader.join();
  acceptor.join();
  EXPECT_TRUE(got == 0 || (got == -1 && recv_err == EBADF)) << got << " " << strerror(recv_err);
  EXPECT_EQ(accept_ret, -1);
  EXPECT_EQ(accept_err, EBADF);
  // Gone from the table: a second close, and any call, is EBADF.
  EXPECT_EQ(rclose(s), -1);
  EXPECT_EQ(errno, EBADF);
  char b[4];
  EXPECT_EQ(rrecv(s, b, sizeof b, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EBADF);
  s = l = -1;
  // The peer sees the connection end: the close shut it down first.
  EXPECT_EQ(rrecv(c, b, sizeof b, 0), 0);
}

TEST_F(Pair, ConnectedSocketRefusesResizingAndReconnecting) {
  open(2);
  int v = 64;
  EXPECT_EQ(rsetsockopt(c, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), -1);  // rs_opening
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in a = loopback(port);
  EXPECT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, EISCONN);
  EXPECT_EQ(rlisten(c, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  // Names agree across the connection.
  sockaddr_in cl{}, sp{};
  socklen_t n1 = sizeof cl, n2 = sizeof sp;
  ASSERT_EQ(rgetsockname(c, reinterpret_cast<sockaddr*>(&cl), &n1), 0);
  ASSERT_EQ(rgetpeername(s, reinterpret_cast<sockaddr*>(&sp), &n2), 0);
  EXPECT_EQ(cl.sin_port, sp.sin_port);
  EXPECT_EQ(cl.sin_addr.s_addr, sp.sin_addr.s_addr);
}

TEST_F(Pair, NonBlockingReadWithNothingQueuedIsEagain) {
  open(3);
  char b[8];
  EXPECT_EQ(rrecv(s, b, sizeof b, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd p{s, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 0), 0);
  EXPECT_EQ(rpoll(&p, 1, 50), 0);  // times out
}

TEST_F(Pair, StreamWrapsTheRingManyTimesInOrder) {
  port = test_port(4);
  l = listener(port);
  ASSERT_GE(l, 0);
  // A 16 KiB ring on the listener (inherited by the accepted socket), 4 MiB through it.
  int v = 8192;
  ASSERT_EQ(rsetsockopt(l, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  ASSERT_NO_FATAL_FAILURE(connect_pair(l, port, c, s));
  socklen_t len = sizeof v;
  ASSERT_EQ(rgetsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, &len), 0);
  EXPECT_EQ(v, 16384);
  std::vector<uint32_t> out(1 << 20);
  std::iota(out.begin(), out.end(), 7u);
  std::thread tx(
      [&] { EXPECT_EQ(send_all(c, out.data(), out.size() * 4), ssize_t(out.size() * 4)); });
  std::vector<uint32_t> in(out.size());
  size_t got = 0;
  auto* p = reinterpret_cast<char*>(in.data());
  while (got < in.size() * 4) {
    // Odd sizes, so reads end inside messages.
    ssize_t r = rrecv(s, p + got, std::min<size_t>(in.size() * 4 - got, 3001), 0);
    ASSERT_GT(r, 0) << strerror(errno);
    got += static_cast<size_t>(r);
  }
  tx.join();
  EXPECT_EQ(in, out);
}

TEST_F(Pair, PeekLeavesDataAndWaitallFillsTheBuffer) {
  open(5);
  ASSERT_EQ(rsend(c, "abcdef", 6, 0), 6);
  char b[16] = {};
  ASSERT_EQ(rrecv(s, b, 3, MSG_PEEK), 3);
  EXPECT_EQ(std::string(b, 3), "abc");
  std::thread tx([&] {
    usleep(20000);
    EXPECT_EQ(rsend(c, "ghij", 4, 0), 4);
  });
  ASSERT_EQ(rrecv(s, b, 10, MSG_WAITALL), 10);  // 6 queued + 4 that come later
  EXPECT_EQ(std::string(b, 10), "abcdefghij");
  tx.join();
}

TEST_F(Pair, HalfCloseGivesEofToThePeerWhichCanStillSend) {
  open(6);
  ASSERT_EQ(rsend(c, "last", 4, 0), 4);
  ASSERT_EQ(rshutdown(c, SHUT_WR), 0);
  EXPECT_EQ(rsend(c, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);  // rdma-core: rsend on a socket no longer writable
  char b[8];
  ASSERT_EQ(rrecv(s, b, sizeof b, 0), 4);
  EXPECT_EQ(rrecv(s, b, sizeof b, 0), 0);  // EOF after the data
  pollfd p{s, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 0), 1);  // EOF is readable
  ASSERT_EQ(rsend(s, "back", 4, 0), 4);
  ASSERT_EQ(rrecv(c, b, 4, MSG_WAITALL), 4);
  EXPECT_EQ(std::string(b, 4), "back");
}

TEST_F(Pair, PeerCloseDrainsThenEof) {
  open(7);
  ASSERT_EQ(rsend(c, "bye", 3, 0), 3);
  ASSERT_EQ(rclose(c), 0);
  c = -1;
  // Once the disconnect is seen (no longer writable), queued data is still POLLIN only, as
  // TCP after a FIN: rstream -T a treats POLLHUP as an error and lost its last transfer.
  pollfd q{s, POLLIN | POLLOUT, 0};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (rpoll(&q, 1, 0) >= 0 && (q.revents & POLLOUT) && std::chrono::steady_clock::now() < end)
    std::this_thread::yield();
  EXPECT_FALSE(q.revents & POLLOUT);
  EXPECT_EQ(q.revents, POLLIN);
  char b[8];
  ASSERT_EQ(rrecv(s, b, sizeof b, 0), 3);
  EXPECT_EQ(rrecv(s, b, sizeof b, 0), 0);
  pollfd p{s, POLLIN | POLLOUT, 0};
  ASSERT_EQ(rpoll(&p, 1, 1000), 1);
  EXPECT_TRUE(p.revents & (POLLIN | POLLHUP));
  EXPECT_FALSE(p.revents & POLLOUT);
  EXPECT_EQ(rsend(s, "x", 1, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);
}

TEST_F(Pair, RpollAndRselectMixRsocketsWithOrdinaryFds) {
  open(8);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pollfd p[2] = {{pipefd[0], POLLIN, 0}, {s, POLLIN, 0}};
  std::thread w([&] {
    usleep(20000);
    ASSERT_EQ(write(pipefd[1], "p", 1), 1);
  });
  ASSERT_EQ(rpoll(p, 2, 5000), 1);  // woken by the pipe while asleep
  EXPECT_EQ(p[0].revents, POLLIN);
  EXPECT_EQ(p[1].revents, 0);
  w.join();
  char ch;
  ASSERT_EQ(read(pipefd[0], &ch, 1), 1);
  std::thread t([&] {
    usleep(20000);
    EXPECT_EQ(rsend(c, "r", 1, 0), 1);
  });
  ASSERT_EQ(rpoll(p, 2, 5000), 1);  // woken by the rsocket
  EXPECT_EQ(p[0].revents, 0);
  EXPECT_EQ(p[1].revents, POLLIN);
  t.join();
  fd_set rd, wr;
  FD_ZERO(&rd);
  FD_ZERO(&wr);
  FD_SET(pipefd[0], &rd);
  FD_SET(s, &rd);
  FD_SET(c, &wr);
  timeval tv{1, 0};
  ASSERT_EQ(rselect(std::max({pipefd[0], s, c}) + 1, &rd, &wr, nullptr, &tv), 2);
  EXPECT_FALSE(FD_ISSET(pipefd[0], &rd));
  EXPECT_TRUE(FD_ISSET(s, &rd));
  EXPECT_TRUE(FD_ISSET(c, &wr));
  close(pipefd[0]);
  close(pipefd[1]);
}

TEST_F(Pair, AcceptedSocketInheritsTheListenersOptions) {
  port = test_port(9);
  l = listener(port);
  ASSERT_GE(l, 0);
  int v = 100, in = 0;
  ASSERT_EQ(rsetsockopt(l, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), 0);
  v = 1;
  ASSERT_EQ(rsetsockopt(l, SOL_RDMA, RDMA_IOMAPSIZE, &v, sizeof v), 0);
  ASSERT_NO_FATAL_FAILURE(connect_pair(l, port, c, s));
  socklen_t len = sizeof in;
  ASSERT_EQ(rgetsockopt(s, SOL_RDMA, RDMA_SQSIZE, &in, &len), 0);
  EXPECT_EQ(in, 100);
  ASSERT_EQ(rgetsockopt(s, SOL_RDMA, RDMA_IOMAPSIZE, &in, &len), 0);
  EXPECT_EQ(in, 1);
  ASSERT_EQ(rgetsockopt(c, SOL_RDMA, RDMA_SQSIZE, &in, &len), 0);
  EXPECT_EQ(in, 384);  // rdma-core's default
}

TEST_F(Pair, RiowriteLandsInThePeersMapAndNowhereElse) {
  port = test_port(10);
  l = listener(port);
  ASSERT_GE(l, 0);
  int v = 1;
  ASSERT_EQ(rsetsockopt(l, SOL_RDMA, RDMA_IOMAPSIZE, &v, sizeof v), 0);
  // The server's map goes into the client's table, which the client sizes.
  ASSERT_NO_FATAL_FAILURE(connect_pair(l, port, c, s, 1));
  std::vector<char> target(4096, 0);
  EXPECT_EQ(riomap(s, target.data(), target.size(), PROT_READ, 0, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(riomap(s, target.data(), target.size(), PROT_WRITE, 0, 4096), 4096);
  // The client's table has one slot, now taken: a second map is ENOMEM (rs_get_iomap_mr).
  std::vector<char> more(4096, 0);
  EXPECT_EQ(riomap(s, more.data(), more.size(), PROT_WRITE, 0, 8192), -1);
  EXPECT_EQ(errno, ENOMEM);
  // The map record travels before the next message; the client learns of it with that message.
  ASSERT_EQ(rsend(s, "m", 1, 0), 1);
  char b;
  ASSERT_EQ(rrecv(c, &b, 1, 0), 1);
  std::vector<char> src(100, 'W');
  EXPECT_EQ(riowrite(c, src.data(), src.size(), 4096 + 10, 0), src.size());
  EXPECT_EQ(riowrite(c, src.data(), 1, 0, 0), static_cast<size_t>(-1));  // not mapped
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(riowrite(c, src.data(), 1, 4096 + 4096, 0), static_cast<size_t>(-1));  // past end
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rsend(c, "d", 1, 0), 1);  // after the write (in order): it has landed
  ASSERT_EQ(rrecv(s, &b, 1, 0), 1);
  EXPECT_EQ(std::string(target.data() + 10, 100), std::string(100, 'W'));
  EXPECT_EQ(target[9], 0);
  EXPECT_EQ(target[110], 0);
  EXPECT_EQ(riounmap(s, target.data(), target.size()), 0);
  EXPECT_EQ(riounmap(s, target.data(), target.size()), -1);
  EXPECT_EQ(errno, EINVAL);
}

// ---- a hostile peer: raw rdma_cm and verbs, speaking the wire by hand -------------------

namespace {

struct RawPeer {
  rdma_cm_id* id = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint32_t> slots = std::vector<uint32_t>(64);
  std::vector<char> rbuf = std::vector<char>(65536);
  rs::ConnData peer;

  bool make_qp() {
    pd = ibv_alloc_pd(id->verbs);
    cq = ibv_create_cq(id->verbs, 256, nullptr, nullptr, 0);
    mr = ibv_reg_mr(pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 64;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = 64;
    return pd && cq && mr && rdma_create_qp(id, pd, &a) == 0;
  }
  std::vector<std::byte> conn_data(uint8_t version) {
    rs::ConnData d;
    d.credits = 32;
    d.target_sgl = {reinterpret_cast<uintptr_t>(rbuf.data()), mr->rkey, rs::kSglEntries};
    d.data_buf = {reinterpret_cast<uintptr_t>(rbuf.data() + 4096), mr->rkey, 4096};
    std::vector<std::byte> b(rs::kConnDataLen);
    rs::encode_conn_data(d, b.data());
    b[0] = std::byte(version);
    return b;
  }
  bool send_word(uint32_t w) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(&w), 4, 0};
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(id->qp, &wr, &bad) == 0;
  }
  ~RawPeer() {
    if (id && id->qp) rdma_destroy_qp(id);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (id) rdma_destroy_id(id);
  }
};

// Connects a synchronous raw id to `port` with `pdata`. 0 or the errno of the failure.
int raw_connect(RawPeer& p, uint16_t port, const std::vector<std::byte>* pdata) {
  if (rdma_create_id(nullptr, &p.id, nullptr, RDMA_PS_TCP)) return errno;
  sockaddr_in a = loopback(port);
  if (rdma_resolve_addr(p.id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000)) return errno;
  if (rdma_resolve_route(p.id, 2000)) return errno;
  if (!p.make_qp()) return errno;
  std::vector<std::byte> d = pdata ? *pdata : p.conn_data(rs::kVersion);
  rdma_conn_param cp{};
  cp.private_data = d.data();
  cp.private_data_len = static_cast<uint8_t>(d.size());
  cp.initiator_depth = 1;
  return rdma_connect(p.id, &cp) ? errno : 0;
}

// An rsocket listener on `port` and a raw peer `p` connected to it with good rsocket data; s
// is the accepted rsocket.
void accept_raw_peer(uint16_t port, RawPeer& p, int& l, int& s) {
  l = listener(port);
  ASSERT_GE(l, 0);
  std::thread srv([&] { s = raccept(l, nullptr, nullptr); });
  const int r = raw_connect(p, port, nullptr);
  srv.join();
  ASSERT_EQ(r, 0) << strerror(r);
  ASSERT_GE(s, 0);
}

}  // namespace

TEST(RsocketHostile, ListenerRefusesPeersThatAreNotVersion1Rsockets) {
  const uint16_t port = test_port(11);
  int l = listener(port);
  ASSERT_GE(l, 0);
  std::thread srv([&] {
    // The bad peers are refused inside raccept, which then serves the good one.
    int s = raccept(l, nullptr, nullptr);
    EXPECT_GE(s, 0) << strerror(errno);
    if (s >= 0) rclose(s);
  });
  {
    RawPeer v2;
    std::vector<std::byte> d(rs::kConnDataLen, std::byte{0});
    d[0] = std::byte{2};
    EXPECT_EQ(raw_connect(v2, port, &d), ECONNREFUSED);
  }
  {
    RawPeer shortdata;
    std::vector<std::byte> d(12, std::byte{1});
    EXPECT_EQ(raw_connect(shortdata, port, &d), ECONNREFUSED);
  }
  int c = rsocket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  EXPECT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  srv.join();
  rclose(c);
  rclose(l);
}

TEST(RsocketHostile, ServerAnsweringWithoutRsocketDataFailsTheConnect) {
  const uint16_t port = test_port(12);
  rdma_cm_id* lid = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &lid, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rdma_bind_addr(lid, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(lid, 1), 0);
  std::thread srv([&] {
    rdma_cm_id* cid = nullptr;
    ASSERT_EQ(rdma_get_request(lid, &cid), 0);
    RawPeer p;
    p.id = cid;
    ASSERT_TRUE(p.make_qp());
    auto d = p.conn_data(9);  // a future version
    rdma_conn_param cp{};
    cp.private_data = d.data();
    cp.private_data_len = static_cast<uint8_t>(d.size());
    rdma_accept(cid, &cp);
  });
  int c = rsocket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, ENOTSUP);  // rs_do_connect: not a version 1 rsocket
  srv.join();
  rclose(c);
  rdma_destroy_id(lid);
}

TEST(RsocketHostile, DataBeyondTheGrantFailsTheConnectionAndIsNotRead) {
  RawPeer p;
  int l = -1, s = -1;
  ASSERT_NO_FATAL_FAILURE(accept_raw_peer(test_port(13), p, l, s));
  // The listener granted half its ring (64 KiB by default); announce more than that.
  ASSERT_TRUE(p.send_word(rs::msg(rs::Op::data, 1u << 20)));
  char b[16];
  EXPECT_EQ(rrecv(s, b, sizeof b, 0), -1);
  EXPECT_EQ(errno, EPROTO);
  EXPECT_EQ(rrecv(s, b, sizeof b, 0), 0);  // the error is reported once, then EOF
  EXPECT_EQ(rsend(s, b, 1, 0), -1);
  rclose(s);
  rclose(l);
}

TEST(RsocketHostile, UnknownOpsAndBadIomapIndexesFailTheConnection) {
  for (uint32_t word : {rs::msg(static_cast<rs::Op>(5), 0), rs::msg(rs::Op::iomap_sgl, 3)}) {
    RawPeer p;
    int l = -1, s = -1;
    ASSERT_NO_FATAL_FAILURE(accept_raw_peer(test_port(14), p, l, s));
    ASSERT_TRUE(p.send_word(word));
    char b[4];
    EXPECT_EQ(rrecv(s, b, sizeof b, 0), -1);
    EXPECT_EQ(errno, EPROTO) << std::hex << word;
    rclose(s);
    rclose(l);
  }
}
