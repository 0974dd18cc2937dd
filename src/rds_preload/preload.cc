// LD_PRELOAD shim: unmodified programs that open socket(AF_RDS, SOCK_SEQPACKET, 0) get
// softverbs RDS. Calls on RDS descriptors go to libsvrds; everything else goes on to the
// next definition (libc). The descriptor is real, so every readiness call works on it; the
// shim's poll() answers for RDS descriptors from the stack's state, busy-polls on request
// (SOFTVERBS_RDS_BUSY_POLL_US) and lets a blocked caller take its own messages in. With it,
// the stack keeps the descriptor's POLLIN byte in step only while the kernel may be asked
// (lazy tokens, softverbs/rds.h): the other readiness calls are seen here to say when.
#include <dlfcn.h>
#include <poll.h>
#include <softverbs/rds.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "util/settings.h"

#define SHIM extern "C" __attribute__((visibility("default")))

namespace {
template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

// The next definitions, resolved once at load, before any thread exists: these are called
// from every thread, the library's own included.
int (*real_socket)(int, int, int) = nullptr;
int (*real_bind)(int, const sockaddr*, socklen_t) = nullptr;
int (*real_connect)(int, const sockaddr*, socklen_t) = nullptr;
ssize_t (*real_sendmsg)(int, const msghdr*, int) = nullptr;
ssize_t (*real_sendto)(int, const void*, size_t, int, const sockaddr*, socklen_t) = nullptr;
ssize_t (*real_send)(int, const void*, size_t, int) = nullptr;
ssize_t (*real_recvmsg)(int, msghdr*, int) = nullptr;
ssize_t (*real_recvfrom)(int, void*, size_t, int, sockaddr*, socklen_t*) = nullptr;
ssize_t (*real_recv)(int, void*, size_t, int) = nullptr;
int (*real_setsockopt)(int, int, int, const void*, socklen_t) = nullptr;
int (*real_getsockopt)(int, int, int, void*, socklen_t*) = nullptr;
int (*real_getsockname)(int, sockaddr*, socklen_t*) = nullptr;
int (*real_getpeername)(int, sockaddr*, socklen_t*) = nullptr;
int (*real_close)(int) = nullptr;
int (*real_listen)(int, int) = nullptr;
int (*real_shutdown)(int, int) = nullptr;
__attribute__((constructor)) void resolve_next() {
  real_socket = next<int (*)(int, int, int)>("socket");
  real_bind = next<int (*)(int, const sockaddr*, socklen_t)>("bind");
  real_connect = next<int (*)(int, const sockaddr*, socklen_t)>("connect");
  real_sendmsg = next<ssize_t (*)(int, const msghdr*, int)>("sendmsg");
  real_sendto =
      next<ssize_t (*)(int, const void*, size_t, int, const sockaddr*, socklen_t)>("sendto");
  real_send = next<ssize_t (*)(int, const void*, size_t, int)>("send");
  real_recvmsg = next<ssize_t (*)(int, msghdr*, int)>("recvmsg");
  real_recvfrom = next<ssize_t (*)(int, void*, size_t, int, sockaddr*, socklen_t*)>("recvfrom");
  real_recv = next<ssize_t (*)(int, void*, size_t, int)>("recv");
  real_setsockopt = next<int (*)(int, int, int, const void*, socklen_t)>("setsockopt");
  real_getsockopt = next<int (*)(int, int, int, void*, socklen_t*)>("getsockopt");
  real_getsockname = next<int (*)(int, sockaddr*, socklen_t*)>("getsockname");
  real_getpeername = next<int (*)(int, sockaddr*, socklen_t*)>("getpeername");
  real_close = next<int (*)(int)>("close");
  real_listen = next<int (*)(int, int)>("listen");
  real_shutdown = next<int (*)(int, int)>("shutdown");
}
}  // namespace

SHIM int socket(int domain, int type, int protocol) {
  if (domain == AF_RDS) return svrds_socket(domain, type, protocol);
  auto* real = real_socket;
  return real(domain, type, protocol);
}

SHIM int bind(int fd, const sockaddr* a, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_bind(fd, a, l);
  auto* real = real_bind;
  return real(fd, a, l);
}

SHIM int connect(int fd, const sockaddr* a, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_connect(fd, a, l);
  auto* real = real_connect;
  return real(fd, a, l);
}

SHIM ssize_t sendmsg(int fd, const msghdr* m, int f) {
  if (svrds_is_rds(fd)) return svrds_sendmsg(fd, m, f);
  auto* real = real_sendmsg;
  return real(fd, m, f);
}

SHIM ssize_t sendto(int fd, const void* b, size_t n, int f, const sockaddr* a, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_sendto(fd, b, n, f, a, l);
  auto* real = real_sendto;
  return real(fd, b, n, f, a, l);
}

SHIM ssize_t send(int fd, const void* b, size_t n, int f) {
  if (svrds_is_rds(fd)) return svrds_sendto(fd, b, n, f, nullptr, 0);
  auto* real = real_send;
  return real(fd, b, n, f);
}

SHIM ssize_t recvmsg(int fd, msghdr* m, int f) {
  if (svrds_is_rds(fd)) return svrds_recvmsg(fd, m, f);
  auto* real = real_recvmsg;
  return real(fd, m, f);
}

SHIM ssize_t recvfrom(int fd, void* b, size_t n, int f, sockaddr* a, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_recvfrom(fd, b, n, f, a, l);
  auto* real = real_recvfrom;
  return real(fd, b, n, f, a, l);
}

SHIM ssize_t recv(int fd, void* b, size_t n, int f) {
  if (svrds_is_rds(fd)) return svrds_recvfrom(fd, b, n, f, nullptr, nullptr);
  auto* real = real_recv;
  return real(fd, b, n, f);
}

SHIM int setsockopt(int fd, int lvl, int name, const void* v, socklen_t l) {
  if (svrds_is_rds(fd)) return svrds_setsockopt(fd, lvl, name, v, l);
  auto* real = real_setsockopt;
  return real(fd, lvl, name, v, l);
}

SHIM int getsockopt(int fd, int lvl, int name, void* v, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_getsockopt(fd, lvl, name, v, l);
  auto* real = real_getsockopt;
  return real(fd, lvl, name, v, l);
}

SHIM int getsockname(int fd, sockaddr* a, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_getsockname(fd, a, l);
  auto* real = real_getsockname;
  return real(fd, a, l);
}

SHIM int getpeername(int fd, sockaddr* a, socklen_t* l) {
  if (svrds_is_rds(fd)) return svrds_getpeername(fd, a, l);
  auto* real = real_getpeername;
  return real(fd, a, l);
}

SHIM int close(int fd) {
  if (svrds_is_rds(fd)) return svrds_close(fd);
  auto* real = real_close;
  return real(fd);
}

// listen/accept/shutdown on RDS are sock_no_* in Linux: EOPNOTSUPP.
SHIM int listen(int fd, int backlog) {
  if (svrds_is_rds(fd)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  auto* real = real_listen;
  return real(fd, backlog);
}

SHIM int shutdown(int fd, int how) {
  if (svrds_is_rds(fd)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  auto* real = real_shutdown;
  return real(fd, how);
}

namespace {
// Busy-poll budget in microseconds, like net.core.busy_poll (0: off, the default). Read once
// at load, before any thread exists: poll() runs on every thread, the library's own included.
long g_busy_poll_us = 0;
int (*g_real_poll)(pollfd*, nfds_t, int) = nullptr;
int (*g_real_ppoll)(pollfd*, nfds_t, const timespec*, const sigset_t*) = nullptr;
int (*g_real_select)(int, fd_set*, fd_set*, fd_set*, timeval*) = nullptr;
int (*g_real_pselect)(int, fd_set*, fd_set*, fd_set*, const timespec*, const sigset_t*) = nullptr;
int (*g_real_epoll_ctl)(int, int, int, epoll_event*) = nullptr;

// The readiness calls the shim sees. Lazy tokens (svrds_shim_attach) are only safe when every
// one of them is this library's in the process, not a definition that comes before it (a
// sanitizer's interceptor, or the shim loaded late with dlopen).
constexpr const char* kReadinessCalls[] = {"poll",        "__poll", "__poll_chk", "ppoll",
                                           "__ppoll_chk", "select", "pselect",    "epoll_ctl"};
bool readiness_calls_are_ours() {
  Dl_info self{};
  if (!dladdr(reinterpret_cast<void*>(&readiness_calls_are_ours), &self)) return false;
  for (const char* name : kReadinessCalls) {
    Dl_info d{};
    void* f = dlsym(RTLD_DEFAULT, name);
    if (!f || !dladdr(f, &d) || d.dli_fbase != self.dli_fbase) return false;
  }
  return true;
}

__attribute__((constructor)) void init_poll() {
  g_busy_poll_us =
      static_cast<long>(sv::settings::uint_value(SV_SETTING("SOFTVERBS_RDS_BUSY_POLL_US")));
  g_real_poll = next<int (*)(pollfd*, nfds_t, int)>("poll");
  g_real_ppoll = next<decltype(g_real_ppoll)>("ppoll");
  g_real_select = next<decltype(g_real_select)>("select");
  g_real_pselect = next<decltype(g_real_pselect)>("pselect");
  g_real_epoll_ctl = next<decltype(g_real_epoll_ctl)>("epoll_ctl");
  if (readiness_calls_are_ours()) svrds_shim_attach();
}
long busy_poll_us() {
  return g_busy_poll_us;
}
}  // namespace

namespace {
// Milliseconds left until deadline, rounded up (poll's unit); -1 when there is none.
int ms_left(std::chrono::steady_clock::time_point deadline, bool forever) {
  if (forever) return -1;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
  return ns <= 0 ? 0 : static_cast<int>((ns + 999'999) / 1'000'000);
}
}  // namespace

namespace {
// The kernel is asked about RDS descriptors only inside this bracket: the stack then keeps
// their POLLIN byte in step (lazy tokens, svrds_shim_attach), for as long as the call sleeps.
class KernelWait {
 public:
  KernelWait(const pollfd* fds, nfds_t n) : n_(n) {
    if (n > std::size(small_)) {
      big_.resize(n);
      socks_ = big_.data();
    }
    svrds_kernel_wait_begin(fds, n, socks_);
  }
  ~KernelWait() { svrds_kernel_wait_end(socks_, n_); }
  KernelWait(const KernelWait&) = delete;
  KernelWait& operator=(const KernelWait&) = delete;

 private:
  nfds_t n_;
  void* small_[17];
  std::vector<void*> big_;
  void** socks_ = small_;
};

// The caller's descriptors as they are now: from the stack's state when all are RDS
// descriptors it knows, otherwise from the kernel.
int ready_now(pollfd* fds, nfds_t n, bool all_rds) {
  if (all_rds)
    if (const int r = svrds_poll_ready(fds, n); r >= 0) return r;
  KernelWait k(fds, n);
  return g_real_poll(fds, n, 0);
}
}  // namespace

// A poll() that includes an RDS descriptor:
//  - with a busy-poll budget (SOFTVERBS_RDS_BUSY_POLL_US), first spins: it does the stack's
//    completion work on this thread (svrds_busy_poll) and re-checks readiness;
//  - then blocks on the stack's wait descriptor too (svrds_block_prepare), so that the bytes
//    of the next message wake this thread, which takes them in itself and looks again, rather
//    than waking the device's progress thread, which would then wake this one.
// Readiness of RDS descriptors comes from the stack (svrds_poll_ready) whenever it can tell;
// the kernel is asked only inside a KernelWait. What it returns concerns the caller's
// descriptors only.
SHIM int poll(pollfd* fds, nfds_t n, int timeout) {
  auto* real = g_real_poll;
  bool rds = false, all_rds = true;
  for (nfds_t i = 0; i < n; ++i) {
    const bool r = svrds_is_rds(fds[i].fd);
    rds = rds || r;
    all_rds = all_rds && (r || fds[i].fd < 0);
  }
  if (!rds) return real(fds, n, timeout);
  if (timeout == 0) return ready_now(fds, n, all_rds);
  const auto t0 = std::chrono::steady_clock::now();
  const bool forever = timeout < 0;
  const auto deadline = t0 + std::chrono::milliseconds(forever ? 0 : timeout);
  if (const long budget = busy_poll_us(); budget > 0) {
    const auto until = t0 + std::chrono::microseconds(budget);
    for (;;) {
      svrds_busy_poll();
      if (const int r = ready_now(fds, n, all_rds); r != 0) return r;
      if (std::chrono::steady_clock::now() >= until) break;
    }
  } else if (const int r = ready_now(fds, n, all_rds); r != 0) {
    return r;
  }
  pollfd small[17];
  std::vector<pollfd> big;
  pollfd* w = small;
  if (n + 1 > std::size(small)) {
    big.resize(n + 1);
    w = big.data();
  }
  for (;;) {
    const int wfd = svrds_block_prepare();
    if (wfd < 0) {
      svrds_busy_poll_stop();  // a spin's sockets go back to the progress thread now
      KernelWait k(fds, n);
      return real(fds, n, ms_left(deadline, forever));
    }
    std::copy(fds, fds + n, w);
    w[n] = pollfd{wfd, POLLIN, 0};
    int r;
    {
      KernelWait k(fds, n);
      r = real(w, n + 1, ms_left(deadline, forever));
    }
    svrds_block_done();
    if (r <= 0) return r;
    if (!w[n].revents) {
      for (nfds_t i = 0; i < n; ++i) fds[i].revents = w[i].revents;
      return r;
    }
    svrds_busy_poll();  // the stack's bytes came in: take them in here
    if (const int ready = ready_now(fds, n, all_rds); ready != 0) return ready;
    if (!forever && std::chrono::steady_clock::now() >= deadline) return 0;
  }
}

// glibc's _FORTIFY_SOURCE poll and ppoll: the same checks, then ours.
SHIM int __poll_chk(pollfd* fds, nfds_t n, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) std::abort();  // __chk_fail
  return poll(fds, n, timeout);
}

SHIM int __poll(pollfd* fds, nfds_t n, int timeout) {
  return poll(fds, n, timeout);
}

namespace {
// A readiness call the stack does not answer: its RDS descriptors keep their POLLIN byte in
// step for good (svrds_expose).
void expose_set(int nfds, const fd_set* r, const fd_set* w, const fd_set* e) {
  for (int fd = 0; fd < nfds && fd < FD_SETSIZE; ++fd)
    if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))) &&
        svrds_is_rds(fd))
      svrds_expose(fd);
}
}  // namespace

SHIM int ppoll(pollfd* fds, nfds_t n, const timespec* ts, const sigset_t* mask) {
  for (nfds_t i = 0; i < n; ++i)
    if (svrds_is_rds(fds[i].fd)) svrds_expose(fds[i].fd);
  return g_real_ppoll(fds, n, ts, mask);
}

SHIM int __ppoll_chk(pollfd* fds, nfds_t n, const timespec* ts, const sigset_t* mask,
                     size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) std::abort();
  return ppoll(fds, n, ts, mask);
}

SHIM int select(int nfds, fd_set* r, fd_set* w, fd_set* e, timeval* tv) {
  expose_set(nfds, r, w, e);
  return g_real_select(nfds, r, w, e, tv);
}

SHIM int pselect(int nfds, fd_set* r, fd_set* w, fd_set* e, const timespec* ts,
                 const sigset_t* mask) {
  expose_set(nfds, r, w, e);
  return g_real_pselect(nfds, r, w, e, ts, mask);
}

SHIM int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && svrds_is_rds(fd)) svrds_expose(fd);
  return g_real_epoll_ctl(epfd, op, fd, ev);
}
