// poll() on RDS descriptors through the LD_PRELOAD shim (src/rds_preload): a thread that
// blocks there also waits on the stack's wait descriptor (svrds_block_prepare), so the bytes of
// its next message wake it and it takes them in itself, instead of the device's progress thread
// doing so and then waking it. ctest runs the binary twice: as it ships, and with
// SOFTVERBS_RDS_WAIT_RX=0, where the progress thread delivers and the caller only sleeps.
// Either way poll() must keep its contract: readiness of the caller's descriptors only, the
// timeout honoured.
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "../unit/thread_state.h"
#include "rds_test_util.h"

using namespace rdstest;

namespace {

// Two bound sockets, a on port(pa) and b on port(pb), with their connection up: one
// message from a to b taken.
bool connected_pair(int pa, int pb, int* a, int* b) {
  *a = bound_socket(port(pa));
  *b = bound_socket(port(pb));
  std::vector<char> buf(64);
  uint32_t v = 1;
  return send_to(*a, port(pb), &v, 4) == 4 && recv_one(*b, buf) == 4;
}

bool wait_rx_on() {
  const char* e = std::getenv("SOFTVERBS_RDS_WAIT_RX");
  return !(e && std::strcmp(e, "0") == 0);
}

TEST(RdsPoll, ABlockedPollerTakesInItsOwnMessage) {
  const bool on = wait_rx_on();
  const int rc = in_private_child([on] {
    int a, b;
    if (!connected_pair(52, 53, &a, &b)) return 10;
    std::vector<char> buf(64);
    if (on != (svrds_block_prepare() >= 0)) return 11;
    const pid_t poller = svtest::this_tid();
    for (uint32_t i = 0; i < 20; ++i) {
      const uint64_t before = counter(a, "busy_poll_completions");
      std::thread sender([&] {
        // The poller is asleep (on a loaded machine 20 ms may pass before it gets there).
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        svtest::thread_asleep(poller);
        if (send_to(a, port(53), &i, 4) != 4) _exit(12);
      });
      pollfd p{b, POLLIN, 0};
      const int r = poll(&p, 1, 5000);
      sender.join();
      if (r != 1 || !(p.revents & POLLIN)) return 13;
      if (svrds_recvfrom(b, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 4) return 14;
      if (std::memcmp(buf.data(), &i, 4) != 0) return 15;
      const uint64_t after = counter(a, "busy_poll_completions");
      // On: the message's completion was taken on this thread. Off: never here.
      if (on ? after == before : after != before) return on ? 16 : 17;
    }
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: set-up, 11: svrds_block_prepare, 12/13/14/15: send, poll, recv, "
                      "data; 16: the poller was woken by another thread's delivery; 17: the "
                      "poller took completions with SOFTVERBS_RDS_WAIT_RX=0";
}

TEST(RdsPoll, TimeoutAndOtherDescriptorsStillWork) {
  const int rc = in_private_child([] {
    int a, b;
    if (!connected_pair(54, 55, &a, &b)) return 10;
    uint32_t v = 1;
    // Nothing comes: 0 after the timeout, not before it and not long after it.
    pollfd p{b, POLLIN, 0};
    const auto t0 = std::chrono::steady_clock::now();
    const int r = poll(&p, 1, 100);
    const auto took = std::chrono::steady_clock::now() - t0;
    if (r != 0 || p.revents != 0) return 11;
    if (took < std::chrono::milliseconds(100) || took > std::chrono::seconds(3)) return 12;
    // Another descriptor turns ready while the RDS socket stays quiet: only it is reported.
    int pfd[2];
    if (pipe(pfd) != 0) return 13;
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (write(pfd[1], "x", 1) != 1) _exit(14);
    });
    pollfd two[2] = {{b, POLLIN, 0}, {pfd[0], POLLIN, 0}};
    const int r2 = poll(two, 2, 5000);
    writer.join();
    if (r2 != 1 || two[0].revents != 0 || !(two[1].revents & POLLIN)) return 15;
    // A message and the pipe both ready: both reported, the message on the RDS descriptor.
    if (send_to(a, port(55), &v, 4) != 4) return 16;
    two[0].revents = two[1].revents = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    int r3 = 0;
    while ((r3 = poll(two, 2, 100)) < 2 && std::chrono::steady_clock::now() < until) {
    }
    if (r3 != 2 || !(two[0].revents & POLLIN) || !(two[1].revents & POLLIN)) return 17;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: set-up, 11/12: poll returned early, late or with events, 13/14: "
                      "pipe, 15: the pipe's readiness was not reported alone, 16/17: message";
}

}  // namespace

namespace {

// The kernel's own answer, whatever poll() is interposed by.
int kernel_poll(pollfd* p, nfds_t n) {
  return static_cast<int>(syscall(SYS_poll, p, n, 0));
}

// Lazy tokens are on unless switched off, or a sanitizer's interceptors come before the
// shim's readiness calls (then the shim does not see every call, and keeps them off).
bool lazy_tokens_checked() {
  const char* e = std::getenv("SOFTVERBS_RDS_LAZY_TOKEN");
  const bool off = e && std::strcmp(e, "0") == 0;
  const bool lazy = svrds_lazy_tokens() != 0;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  EXPECT_TRUE(!off || !lazy);
#else
  EXPECT_EQ(lazy, !off);
#endif
  return lazy;
}

// The shim's poll() asks the stack, not the kernel, whether RDS descriptors are ready
// (svrds_poll_ready). For a descriptor the kernel may be asked about (here: registered with
// epoll, which the shim sees), both answers must agree in every state a socket goes through;
// and the stack must decline what it cannot answer for.
TEST(RdsPoll, ReadinessFromMemoryIsTheKernels) {
  const int rc = in_private_child([] {
    int a, b;
    if (!connected_pair(56, 57, &a, &b)) return 10;
    std::vector<char> buf(64);
    uint32_t v = 1;
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev) != 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) != 0)
      return 20;
    auto same = [](pollfd* p, nfds_t n) {
      std::vector<pollfd> k(p, p + n), m(p, p + n);
      const int rk = kernel_poll(k.data(), n);
      const int rm = svrds_poll_ready(m.data(), n);
      bool ok = rk == rm;
      for (nfds_t i = 0; i < n; ++i) ok = ok && k[i].revents == m[i].revents;
      if (!ok) {
        std::fprintf(stderr, "kernel %d, stack %d:", rk, rm);
        for (nfds_t i = 0; i < n; ++i)
          std::fprintf(stderr, " fd %d %#x/%#x", p[i].fd, k[i].revents, m[i].revents);
        std::fprintf(stderr, "\n");
        return false;
      }
      std::copy(m.begin(), m.end(), p);
      return true;
    };
    // Idle: writable, not readable; a negative descriptor is skipped, as poll() does.
    pollfd p[3] = {{b, POLLIN | POLLOUT, 0}, {-1, POLLIN, 0}, {a, POLLIN, 0}};
    if (!same(p, 3) || p[0].revents != (POLLOUT) || p[1].revents || p[2].revents) return 11;
    // A message queued: readable, with only the events asked for reported.
    if (send_to(a, port(57), &v, 4) != 4) return 12;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    pollfd in{b, POLLIN, 0};
    while (kernel_poll(&in, 1) == 0 && std::chrono::steady_clock::now() < until) {
    }
    if (!same(p, 3) || p[0].revents != (POLLIN | POLLOUT) || p[2].revents) return 13;
    pollfd rd{b, POLLRDNORM, 0};
    if (!same(&rd, 1) || rd.revents != POLLRDNORM) return 14;
    // Taken: not readable any more.
    if (svrds_recvfrom(b, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 4) return 15;
    if (!same(p, 3) || p[0].revents != POLLOUT) return 16;
    // Not ours to answer for: a pipe, a closed RDS socket.
    int pfd[2];
    if (pipe(pfd) != 0) return 17;
    pollfd mixed[2] = {{b, POLLIN, 0}, {pfd[0], POLLIN, 0}};
    if (svrds_poll_ready(mixed, 2) != -1) return 18;
    const int c = bound_socket(port(58));
    svrds_close(c);
    pollfd closed{c, POLLIN, 0};
    if (svrds_poll_ready(&closed, 1) != -1) return 19;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: set-up, 20: epoll, 11: idle, 12: send, 13/14: readable, 15/16: "
                      "after the receive, 18: a pipe was answered for, 19: a closed socket was";
}

// Lazy tokens: while only the shim's poll() asks, a message costs no POLLIN byte (the kernel
// is not told); the moment another readiness call appears (select, epoll, a poll() that
// must sleep in the kernel), the kernel is told what is pending, and from then on kept told.
TEST(RdsPoll, LazyTokensAreKeptForWhoeverAsksTheKernel) {
  const bool lazy = lazy_tokens_checked();
  const int rc = in_private_child([lazy] {
    int a, b;
    if (!connected_pair(59, 60, &a, &b)) return 10;
    const int c = bound_socket(port(61));
    std::vector<char> buf(64);
    uint32_t v = 1;
    // The shim's poll(), as a spinning program calls it: never sleeping in the kernel, so
    // nobody there needs telling.
    auto arrived = [](int fd) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      pollfd p{fd, POLLIN, 0};
      while (poll(&p, 1, 0) == 0 && std::chrono::steady_clock::now() < until) {
      }
      return (p.revents & POLLIN) != 0;
    };
    auto kernel_readable = [](int fd) {
      pollfd p{fd, POLLIN, 0};
      return kernel_poll(&p, 1) == 1;
    };
    // 1. The shim's poll() alone: the kernel hears of the message only without lazy tokens.
    const uint64_t writes0 = counter(a, "poll_token_writes");
    for (uint32_t i = 0; i < 20; ++i) {
      if (send_to(a, port(60), &i, 4) != 4 || !arrived(b)) return 11;
      if (kernel_readable(b) == lazy) return 12;
      if (svrds_recvfrom(b, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 4) return 13;
    }
    const uint64_t writes = counter(a, "poll_token_writes") - writes0;
    if (lazy ? writes != 0 : writes < 20) return 14;
    // 2. select() on a socket with a message pending: it is told at once, and kept told.
    if (send_to(a, port(60), &v, 4) != 4 || !arrived(b)) return 15;
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(b, &rs);
    timeval zero{0, 0};
    if (select(b + 1, &rs, nullptr, nullptr, &zero) != 1 || !FD_ISSET(b, &rs)) return 16;
    if (!kernel_readable(b)) return 17;
    if (svrds_recvfrom(b, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 4) return 18;
    if (kernel_readable(b)) return 19;
    if (send_to(a, port(60), &v, 4) != 4) return 20;
    FD_ZERO(&rs);
    FD_SET(b, &rs);
    timeval five{5, 0};
    if (select(b + 1, &rs, nullptr, nullptr, &five) != 1) return 21;
    if (svrds_recvfrom(b, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 4) return 22;
    // 3. epoll: registered after the message came, it still reports it.
    if (send_to(a, port(61), &v, 4) != 4 || !arrived(c)) return 23;
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) != 0) return 24;
    epoll_event out{};
    if (epoll_wait(ep, &out, 1, 5000) != 1 || !(out.events & EPOLLIN)) return 25;
    if (svrds_recvfrom(c, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 4) return 26;
    if (epoll_wait(ep, &out, 1, 0) != 0) return 27;  // and taken back once drained
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: set-up, 11: a message did not arrive, 12: the kernel was told (lazy) "
                      "or not told (not lazy), 13: receive, 14: POLLIN byte writes, 15-22: "
                      "select, 23-27: epoll";
}

}  // namespace
