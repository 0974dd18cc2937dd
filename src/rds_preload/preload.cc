// LD_PRELOAD shim: unmodified programs that open socket(AF_RDS, SOCK_SEQPACKET, 0) get
// softverbs RDS. Calls on RDS descriptors go to libsvrds; everything else goes on to the
// next definition (libc). poll/epoll/select/fcntl need no shim: the descriptor is real.
// poll() is interposed only for opt-in busy polling (SOFTVERBS_RDS_BUSY_POLL_US).
#include <dlfcn.h>
#include <poll.h>
#include <softverbs/rds.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>

#define SHIM extern "C" __attribute__((visibility("default")))

namespace {
template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
}  // namespace

SHIM int socket(int domain, int type, int protocol) {
  if (domain == AF_RDS) return svrds_socket(domain, type, protocol);
  static auto real = next<int (*)(int, int, int)>("socket");
  return real(domain, type, protocol);
}

SHIM int bind(int fd, const sockaddr* a, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_bind(fd, a, l);
  static auto real = next<int (*)(int, const sockaddr*, socklen_t)>("bind");
  return real(fd, a, l);
}

SHIM int connect(int fd, const sockaddr* a, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_connect(fd, a, l);
  static auto real = next<int (*)(int, const sockaddr*, socklen_t)>("connect");
  return real(fd, a, l);
}

SHIM ssize_t sendmsg(int fd, const msghdr* m, int f) {
  if (svrds_is_rds(fd)) return svrds_sendmsg(fd, m, f);
  static auto real = next<ssize_t (*)(int, const msghdr*, int)>("sendmsg");
  return real(fd, m, f);
}

SHIM ssize_t sendto(int fd, const void* b, size_t n, int f, const sockaddr* a, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_sendto(fd, b, n, f, a, l);
  static auto real =
      next<ssize_t (*)(int, const void*, size_t, int, const sockaddr*, socklen_t)>("sendto");
  return real(fd, b, n, f, a, l);
}

SHIM ssize_t send(int fd, const void* b, size_t n, int f) {
  if (svrds_is_rds(fd)) return svrds_sendto(fd, b, n, f, nullptr, 0);
  static auto real = next<ssize_t (*)(int, const void*, size_t, int)>("send");
  return real(fd, b, n, f);
}

SHIM ssize_t recvmsg(int fd, msghdr* m, int f) {
  if (svrds_is_rds(fd)) return svrds_recvmsg(fd, m, f);
  static auto real = next<ssize_t (*)(int, msghdr*, int)>("recvmsg");
  return real(fd, m, f);
}

SHIM ssize_t recvfrom(int fd, void* b, size_t n, int f, sockaddr* a, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_recvfrom(fd, b, n, f, a, l);
  static auto real = next<ssize_t (*)(int, void*, size_t, int, sockaddr*, socklen_t*)>("recvfrom");
  return real(fd, b, n, f, a, l);
}

SHIM ssize_t recv(int fd, void* b, size_t n, int f) {
  if (svrds_is_rds(fd)) return svrds_recvfrom(fd, b, n, f, nullptr, nullptr);
  static auto real = next<ssize_t (*)(int, void*, size_t, int)>("recv");
  return real(fd, b, n, f);
}

SHIM int setsockopt(int fd, int lvl, int name, const void* v, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_setsockopt(fd, lvl, name, v, l);
  static auto real = next<int (*)(int, int, int, const void*, socklen_t)>("setsockopt");
  return real(fd, lvl, name, v, l);
}

SHIM int getsockopt(int fd, int lvl, int name, void* v, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_getsockopt(fd, lvl, name, v, l);
  static auto real = next<int (*)(int, int, int, void*, socklen_t*)>("getsockopt");
  return real(fd, lvl, name, v, l);
}

SHIM int getsockname(int fd, sockaddr* a, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_getsockname(fd, a, l);
  static auto real = next<int (*)(int, sockaddr*, socklen_t*)>("getsockname");
  return real(fd, a, l);
}

SHIM int getpeername(int fd, sockaddr* a, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_getpeername(fd, a, l);
  static auto real = next<int (*)(int, sockaddr*, socklen_t*)>("getpeername");
  return real(fd, a, l);
}

SHIM int close(int fd) {
  if (svrds_is_rds(fd)) return svrds_close(fd);
  static auto real = next<int (*)(int)>("close");
  return real(fd);
}

// listen/accept/shutdown on RDS are sock_no_* in Linux: EOPNOTSUPP.
SHIM int listen(int fd, int backlog) {
  if (svrds_is_rds(fd)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  static auto real = next<int (*)(int, int)>("listen");
  return real(fd, backlog);
}

SHIM int shutdown(int fd, int how) {
  if (svrds_is_rds(fd)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  static auto real = next<int (*)(int, int)>("shutdown");
  return real(fd, how);
}

namespace {
// Busy-poll budget in microseconds, like net.core.busy_poll (0: off, the default).
long busy_poll_us() {
  static const long us = [] {
    const char* e = std::getenv("SOFTVERBS_RDS_BUSY_POLL_US");
    return e ? std::strtol(e, nullptr, 10) : 0L;
  }();
  return us;
}
}  // namespace

// With a busy-poll budget, a poll() that includes an RDS descriptor first spins: it does
// the stack's completion work on this thread (svrds_busy_poll) and re-checks readiness,
// then, if nothing is ready within the budget, blocks for the rest of the timeout.
SHIM int poll(pollfd* fds, nfds_t n, int timeout) {
  static auto real = next<int (*)(pollfd*, nfds_t, int)>("poll");
  const long budget = busy_poll_us();
  bool rds = false;
  for (nfds_t i = 0; budget > 0 && i < n && !rds; ++i) rds = svrds_is_rds(fds[i].fd);
  if (!rds || timeout == 0) return real(fds, n, timeout);
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + std::chrono::microseconds(budget);
  for (;;) {
    svrds_busy_poll();
    const int r = real(fds, n, 0);
    if (r != 0) return r;
    if (std::chrono::steady_clock::now() >= until) break;
  }
  if (timeout < 0) return real(fds, n, timeout);
  const auto spent =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  return real(fds, n, timeout > spent.count() ? timeout - static_cast<int>(spent.count()) : 0);
}
