// The socket table and poll tokens (net/rds af_rds.c's socket side): which descriptors are
// RDS sockets, the Sock behind a descriptor, and the POLLIN/POLLOUT state the kernel sees on
// the application's end of each socketpair. The socket calls (af_rds.cc), send.cc, recv.cc
// and cong.cc all call down into this file; it calls none of them.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "rds/rds_impl.h"

namespace sv::rds {

std::atomic<uint8_t> g_is_rds[kMaxFd];

namespace {
// The socket behind each descriptor below kMaxFd, read with no lock: every socket call starts
// by finding its socket, and a receive or a poll must not wait for the stack lock to do it.
// Higher descriptors are looked up in Global::socks under its leaf lock, socks_mu. A Sock is
// never freed (af_rds.cc g_closed), so a pointer read here stays valid; `closing` says
// whether it is still the descriptor's.
std::atomic<Sock*> g_sock_at[kMaxFd];
}  // namespace

void sock_table_add(Sock* s) {
  Global& G = g();
  std::lock_guard lk(G.socks_mu);
  G.socks[s->app_fd] = s;
  if (s->app_fd < kMaxFd) {
    g_sock_at[s->app_fd].store(s, std::memory_order_release);
    g_is_rds[s->app_fd] = 1;
  }
}

void sock_table_remove(int fd) {
  Global& G = g();
  std::lock_guard lk(G.socks_mu);
  G.socks.erase(fd);
  if (fd >= 0 && fd < kMaxFd) {
    g_sock_at[fd].store(nullptr, std::memory_order_release);
    g_is_rds[fd] = 0;
  }
}

ssize_t raw_send(int fd, const void* b, size_t n, int flags) {
  return syscall(SYS_sendto, fd, b, n, flags, nullptr, 0);
}
ssize_t raw_recv(int fd, void* b, size_t n, int flags) {
  return syscall(SYS_recvfrom, fd, b, n, flags, nullptr, nullptr);
}
int raw_poll(pollfd* p, nfds_t n, int timeout_ms) {
  timespec ts{timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  return static_cast<int>(syscall(SYS_ppoll, p, n, timeout_ms < 0 ? nullptr : &ts, nullptr, 0));
}
#if defined(__SANITIZE_THREAD__)
extern "C" int __close(int);  // glibc's alias: TSan intercepts it, the shim does not
#endif
int raw_close(int fd) {
#if defined(__SANITIZE_THREAD__)
  // TSan follows a descriptor from its creation to its close. A close it cannot see makes
  // the number's next owner, created on another thread (the engine thread's snapshot
  // files), look like a race with the socket that had it before.
  return __close(fd);
#else
  return static_cast<int>(syscall(SYS_close, fd));
#endif
}

int no_sock(int fd) {
  return fd >= 0 && fd < kMaxFd && g_is_rds[fd].load() == kInherited ? EBADFD : EBADF;
}

void sock_fork_release(Sock* s) {
  // The child's copies of our ends: the parent's stack keeps its own. The registry closes
  // its own (bind.cc owner_release).
  if (s->lib_fd >= 0) raw_close(s->lib_fd);
  if (s->app_fd >= 0 && s->app_fd < kMaxFd) {
    g_sock_at[s->app_fd].store(nullptr, std::memory_order_relaxed);
    g_is_rds[s->app_fd] = kInherited;
  }
}

Sock* sock_of(int fd) {
  Global& G = g();  // first: in a forked child, the parent's stack is let go of here
  Sock* s = nullptr;
  if (fd >= 0 && fd < kMaxFd) {
    s = g_sock_at[fd].load(std::memory_order_acquire);
  } else {
    std::lock_guard lk(G.socks_mu);
    if (auto it = G.socks.find(fd); it != G.socks.end()) s = it->second;
  }
  return s && !s->closing.load(std::memory_order_acquire) ? s : nullptr;
}

Sock* sock_of_recv_locked(int fd, std::unique_lock<std::mutex>& lk) {
  for (;;) {
    Sock* s = sock_of(fd);
    if (!s) return nullptr;
    lk = std::unique_lock(s->rs_recv_lock);
    if (!s->closing) return s;
    lk.unlock();  // closed between the look and the lock: fd may be a new socket's by now
  }
}

void sock_wake(Sock* s) {
  s->rs_recv_cv.notify_all();
}

bool sock_readable(const Sock* s) {
  return !s->rq.empty() || !s->notify.empty() || !s->zcookies.empty() || s->cong_notify ||
         s->cong_poll;
}

std::atomic<bool> g_lazy_tokens{false};

void sock_update_poll(Sock* s) {
  std::lock_guard lk(s->rs_recv_lock);
  sock_update_poll_locked(s);
}

void sock_update_poll_locked(Sock* s) {
  if (s->lib_fd < 0) return;
  // POLLIN: readable while data, notifications or congestion updates are queued. The byte
  // that says so to the kernel costs a send and a receive per message; while nobody can ask
  // the kernel (the shim's poll() answers from memory, svrds_poll_ready) it is owed, not
  // sent, and sent when a thread is about to sleep on app_fd or app_fd is exposed to a
  // readiness call the stack does not answer. A byte that was sent is always taken back.
  // So the kernel never sees POLLIN that is not there; it may not see POLLIN that is, but
  // only while nobody asks it.
  const bool readable = sock_readable(s);
  const bool kernel_asks =
      !g_lazy_tokens.load(std::memory_order_relaxed) || s->exposed || s->sleepers > 0;
  if (readable && !s->token && kernel_asks) {
    const char b = 1;
    count(Ctr::poll_token_writes);
    if (raw_send(s->lib_fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) s->token = true;
  } else if (!readable && s->token) {
    char b;
    if (raw_recv(s->app_fd, &b, 1, MSG_DONTWAIT) == 1) s->token = false;
  }
  // POLLOUT: writable while send space remains (snd_bytes < sndbuf); otherwise the
  // application end's send direction is kept full.
  const bool writable = s->snd_bytes < s->sndbuf;
  if (!writable && !s->blocked) {
    char junk[4096] = {};
    while (raw_send(s->app_fd, junk, sizeof junk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
    }
    s->blocked = true;
  } else if (writable && s->blocked) {
    char junk[4096];
    while (raw_recv(s->lib_fd, junk, sizeof junk, MSG_DONTWAIT) > 0) {
    }
    s->blocked = false;
  }
}

// IPv6 addresses as net/rds bind.c/send.c sort them: a v4-mapped address is that IPv4 address
// (returns 4, *v4 filled); the unspecified address, multicast and link-local without a scope
// id are EINVAL; anything else is a real IPv6 address (returns 6).
int classify_v6(const sockaddr_in6& a, sockaddr_in* v4) {
  if (IN6_IS_ADDR_V4MAPPED(&a.sin6_addr)) {
    *v4 = sockaddr_in{};
    v4->sin_family = AF_INET;
    v4->sin_port = a.sin6_port;
    std::memcpy(&v4->sin_addr, &a.sin6_addr.s6_addr[12], 4);
    return bad_unicast(*v4) ? -EINVAL : 4;
  }
  if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr) || IN6_IS_ADDR_MULTICAST(&a.sin6_addr)) return -EINVAL;
  if (IN6_IS_ADDR_LINKLOCAL(&a.sin6_addr) && a.sin6_scope_id == 0) return -EINVAL;
  return 6;
}

}  // namespace sv::rds
