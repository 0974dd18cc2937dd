// linger_close (engine/linger.h): a connection closed while our data is still queued and the
// peer's bytes sit unread must still deliver every byte, then a clean EOF, never a RST.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "engine/linger.h"
#include "engine/progress.h"

namespace {

// A connected pair of loopback TCP sockets (a, b).
void tcp_pair(int& a, int& b) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(l, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(listen(l, 1), 0);
  a = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  b = accept(l, nullptr, nullptr);
  ASSERT_GE(b, 0);
  close(l);
}

// Reads b to EOF; the byte count, or -errno.
long read_all(int b) {
  std::vector<char> buf(1 << 16);
  long total = 0;
  for (;;) {
    pollfd p{b, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return -ETIMEDOUT;
    const ssize_t n = read(b, buf.data(), buf.size());
    if (n == 0) return total;
    if (n < 0) return -errno;
    total += n;
  }
}

TEST(Linger, QueuedDataReachesThePeerThoughItsBytesArriveAfterTheClose) {
  using sv::engine::Progress;
  int a = -1, b = -1;
  ASSERT_NO_FATAL_FAILURE(tcp_pair(a, b));
  // More than the loopback socket buffers hold while b does not read: some stays queued in a.
  const size_t n = 8u << 20;
  std::vector<char> data(n, 'x');
  size_t sent = 0;
  while (sent < n) {
    pollfd p{a, POLLOUT, 0};
    if (poll(&p, 1, 100) != 1) break;  // a's buffers are full
    const ssize_t k = send(a, data.data() + sent, n - sent, MSG_DONTWAIT);
    if (k <= 0) break;
    sent += static_cast<size_t>(k);
  }
  ASSERT_GT(sent, 0u);
  ASSERT_EQ(write(b, "late", 4), 4);  // unread by a when it closes
  Progress::get().run_sync([a] { sv::engine::linger_close(a); });
  // With close() this was a RST: b saw ECONNRESET and lost what a still held.
  EXPECT_EQ(read_all(b), static_cast<long>(sent));
  ASSERT_EQ(write(b, "more", 4), 4);  // after a's FIN: still drained, no RST
  close(b);
}

TEST(Linger, ASocketThatIsNotConnectedIsJustClosed) {
  using sv::engine::Progress;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  Progress::get().run_sync([s] { sv::engine::linger_close(s); });
  errno = 0;
  EXPECT_EQ(fcntl(s, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
