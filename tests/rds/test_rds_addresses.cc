// Addresses: every message is reported from the address its socket is bound to and goes to
// the socket bound to the address it was sent to, also when processes have sockets on
// several addresses (net/rds keys connections by (laddr, faddr)); port 0 of an address
// answers pings as long as any process is bound there.
#include <sys/wait.h>

#include <string>

#include "rds_test_util.h"

using namespace rdstest;

namespace {

int bound_at(const char* ip, uint16_t p) {
  const int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in a = addr(p, ip);
  if (svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  return fd;
}

ssize_t send_at(int fd, const char* ip, uint16_t p, const std::string& text) {
  sockaddr_in d = addr(p, ip);
  return svrds_sendto(fd, text.data(), text.size(), 0, reinterpret_cast<sockaddr*>(&d), sizeof d);
}

// One datagram on fd: its text and source "ip:port" (empty on timeout).
// Waits up to 20 s: a first message to another process waits for its connection, and a
// connect that must be retried waits a randomised backoff of up to 1 s per attempt (net/rds's
// rds_queue_reconnect). Under TSan on a loaded 2-core machine a first ping once went unanswered
// for recv_one's 5 s (a rehearsal of CI; not reproduced in 37 runs since, under load or not).
std::pair<std::string, std::string> receive(int fd) {
  std::vector<char> buf(256);
  sockaddr_in from{};
  const ssize_t n = recv_one(fd, buf, &from, 0, 20000);
  if (n < 0) return {};
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
  return {std::string(buf.data(), static_cast<size_t>(n)),
          std::string(ip) + ":" + std::to_string(ntohs(from.sin_port))};
}

std::string at(const char* ip, uint16_t p) {
  return std::string(ip) + ":" + std::to_string(p);
}

int wait_child(pid_t pid) {
  for (int i = 0; i < 3000; ++i) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

}  // namespace

TEST(RdsAddresses, WithinOneProcessEveryMessageComesFromItsSocketsAddress) {
  const uint16_t p1 = port(0), p2 = port(1), p3 = port(2);
  const int a = bound_at("127.0.0.2", p1), b = bound_at("127.0.0.1", p2);
  const int c = bound_at("127.0.0.1", p3);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_EQ(send_at(a, "127.0.0.1", p2, "from .2"), 7);
  EXPECT_EQ(receive(b), std::make_pair(std::string("from .2"), at("127.0.0.2", p1)));
  ASSERT_EQ(send_at(c, "127.0.0.1", p2, "from .1"), 7);
  EXPECT_EQ(receive(b), std::make_pair(std::string("from .1"), at("127.0.0.1", p3)));
  ASSERT_EQ(send_at(b, "127.0.0.2", p1, "back"), 4);
  EXPECT_EQ(receive(a), std::make_pair(std::string("back"), at("127.0.0.1", p2)));
  for (int fd : {a, b, c}) svrds_close(fd);
}

TEST(RdsAddresses, TwoProcessesOnTwoAddressesEachReportTheRightSourceBothWays) {
  // Process P: sockets on 127.0.0.1 and 127.0.0.2. Process Q (a child): sockets on
  // 127.0.0.1 and 127.0.0.3 with the same port, so the receive-side lookup must use the
  // address the message was sent to, not only the port.
  const uint16_t pp1 = port(10), pp2 = port(11), qp = port(12);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t q = fork();
  if (q == 0) {
    const int q1 = bound_at("127.0.0.1", qp), q3 = bound_at("127.0.0.3", qp);
    if (q1 < 0 || q3 < 0) _exit(40);
    char x = 1;
    if (write(ready[1], &x, 1) != 1) _exit(41);
    // Four messages: P's two sockets to each of ours. Each answers to its sender.
    int got = 0;
    for (int i = 0; i < 4 && got < 4; ++i) {
      for (int fd : {q1, q3}) {
        pollfd pf{fd, POLLIN, 0};
        if (poll(&pf, 1, i == 0 ? 5000 : 2000) <= 0) continue;
        auto [text, from] = receive(fd);
        // The text names the address it was sent to and the address it comes from.
        const std::string mine = fd == q1 ? "127.0.0.1" : "127.0.0.3";
        if (text.find("to " + mine) == std::string::npos) _exit(42);
        if (text.find("from " + from) == std::string::npos) _exit(43);
        const auto colon = from.find(':');
        const std::string ip = from.substr(0, colon);
        const auto port = static_cast<uint16_t>(std::stoi(from.substr(colon + 1)));
        const std::string reply = "reply from " + at(mine.c_str(), qp);
        if (send_at(fd, ip.c_str(), port, reply) != static_cast<ssize_t>(reply.size())) _exit(44);
        ++got;
      }
    }
    if (read(done[0], &x, 1) != 1) _exit(45);  // P has its replies: our acks went out
    _exit(got == 4 ? 0 : 46);
  }
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  const int s1 = bound_at("127.0.0.1", pp1), s2 = bound_at("127.0.0.2", pp2);
  ASSERT_GE(s1, 0);
  ASSERT_GE(s2, 0);
  for (auto [fd, ip, p] : {std::tuple{s1, "127.0.0.1", pp1}, std::tuple{s2, "127.0.0.2", pp2}})
    for (const char* to : {"127.0.0.1", "127.0.0.3"}) {
      const std::string text = std::string("to ") + to + " from " + at(ip, p);
      ASSERT_EQ(send_at(fd, to, qp, text), static_cast<ssize_t>(text.size()));
    }
  for (auto [fd, ip] : {std::pair{s1, "127.0.0.1"}, std::pair{s2, "127.0.0.2"}}) {
    std::multiset<std::string> got;
    for (int i = 0; i < 2; ++i) {
      auto [text, from] = receive(fd);
      EXPECT_EQ(text, "reply from " + from) << "at " << ip;
      got.insert(from);
    }
    EXPECT_EQ(got, (std::multiset<std::string>{at("127.0.0.1", qp), at("127.0.0.3", qp)}))
        << "at " << ip;
  }
  ASSERT_EQ(write(done[1], "x", 1), 1);
  EXPECT_EQ(wait_child(q), 0);
  svrds_close(s1);
  svrds_close(s2);
}

TEST(RdsAddresses, PortZeroAnswersPingsWhileAnyProcessIsBoundThere) {
  // 127.0.0.77 is used by this test only: A binds there first (it answers pings), B second;
  // after A exits, B must answer.
  const char* ip = "127.0.0.77";
  const uint16_t pa = port(20), pb = port(21), me = port(22);
  int a_ready[2], b_ready[2], a_go[2], b_go[2];
  for (int* p : {a_ready, b_ready, a_go, b_go}) ASSERT_EQ(pipe(p), 0);
  auto holder = [&](uint16_t p, int ready_fd, int go_fd) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = bound_at(ip, p);
      char x = fd >= 0 ? 1 : 0;
      if (write(ready_fd, &x, 1) != 1) _exit(50);
      if (read(go_fd, &x, 1) < 0) _exit(51);  // until told (or the parent is gone)
      _exit(fd >= 0 ? 0 : 52);
    }
    char x = 0;
    EXPECT_EQ(read(ready_fd == a_ready[1] ? a_ready[0] : b_ready[0], &x, 1), 1);
    EXPECT_EQ(x, 1);
    return pid;
  };
  const pid_t a = holder(pa, a_ready[1], a_go[0]);
  const pid_t b = holder(pb, b_ready[1], b_go[0]);
  const int s = bound_socket(me);
  auto ping = [&] {
    sockaddr_in d = addr(0, ip);
    if (svrds_sendto(s, nullptr, 0, 0, reinterpret_cast<sockaddr*>(&d), sizeof d) != 0)
      return std::string("send failed");
    return receive(s).second;  // the pong: zero bytes from (ip, 0)
  };
  EXPECT_EQ(ping(), at(ip, 0));
  ASSERT_EQ(write(a_go[1], "x", 1), 1);
  EXPECT_EQ(wait_child(a), 0);
  EXPECT_EQ(ping(), at(ip, 0)) << "nobody answered once the first process bound there exited";
  EXPECT_EQ(ping(), at(ip, 0));
  ASSERT_EQ(write(b_go[1], "x", 1), 1);
  EXPECT_EQ(wait_child(b), 0);
  svrds_close(s);
}
