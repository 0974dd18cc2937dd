// rpoll and rselect (rsocket_impl.h): readiness of rsockets and ordinary descriptors in one
// call. librspreload sends every select() here, and poll() whenever an rsocket is in the set,
// so ordinary fds must work exactly as with poll(2).
//
// As rdma-core's rpoll: check everything without sleeping; if nothing is ready, arm each
// rsocket's CQ and check again; then sleep in poll(2) on the ordinary fds plus, per rsocket,
// its completion channel, its rdma_cm channel and its own eventfd (written by a thread whose
// progress may have made this socket ready).
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>
#include <time.h>

#include <cerrno>
#include <vector>

#include "rdmacm/rsocket_impl.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

namespace sv::rsock {
namespace {

bool fd_readable_now(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

short revents_locked(Rs* s, short events, bool armed) {
  short r = 0;
  switch (s->state) {
    case State::init:
    case State::bound:
      r = POLLHUP;
      break;
    case State::listening:
      if (s->cm_ch && fd_readable_now(s->cm_ch->fd)) r = POLLIN;
      break;
    case State::connecting:
      connect_poll_locked(s);
      if (s->state == State::connecting) return 0;
      if (s->state == State::error)
        return static_cast<short>((POLLIN | POLLOUT | POLLERR) & (events | POLLERR));
      [[fallthrough]];
    default:
      pump_locked(s, armed);
      if (!s->rmsg.empty() || !s->readable) r |= POLLIN;
      if (s->state == State::connected && s->writable && can_send_locked(s)) r |= POLLOUT;
      // As TCP after a peer's FIN: data still queued is POLLIN only; POLLHUP once it is read.
      // (rdma-core raises POLLHUP at once, and rstream -T a, which treats POLLHUP as an
      // error, then fails when the peer's last data and its disconnect arrive together.)
      if (s->state == State::disconnected && s->rmsg.empty()) r |= POLLHUP;
      if (s->state == State::error) r |= POLLERR | POLLHUP;
  }
  return static_cast<short>(r & (events | POLLERR | POLLHUP | POLLNVAL));
}

// One pass over the set; fills revents and returns how many are ready. `arm`: arm CQs first.
int check(pollfd* fds, nfds_t nfds, bool arm) {
  int ready = 0;
  std::vector<pollfd> plain;
  std::vector<nfds_t> plain_at;
  for (nfds_t i = 0; i < nfds; ++i) {
    fds[i].revents = 0;
    const RsRef ref = get(fds[i].fd);
    Rs* s = ref.get();
    if (!s) {
      if (fds[i].fd >= 0) {
        plain.push_back({fds[i].fd, fds[i].events, 0});
        plain_at.push_back(i);
      }
      continue;
    }
    std::lock_guard lk(s->mu);
    if (arm) arm_locked(s);
    fds[i].revents = revents_locked(s, fds[i].events, arm);
    if (fds[i].revents) ++ready;
  }
  if (!plain.empty() && ::poll(plain.data(), plain.size(), 0) > 0) {
    for (size_t k = 0; k < plain.size(); ++k) {
      fds[plain_at[k]].revents = plain[k].revents;
      if (plain[k].revents) ++ready;
    }
  }
  return ready;
}

int64_t now_ms() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000 + t.tv_nsec / 1000000;
}

}  // namespace
}  // namespace sv::rsock

using namespace sv::rsock;

SV_EXPORT int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  if (nfds && !fds) return errno = EFAULT, -1;
  const int64_t deadline = timeout > 0 ? now_ms() + timeout : 0;
  for (;;) {
    int ready = check(fds, nfds, false);
    if (ready || timeout == 0) return ready;
    ready = check(fds, nfds, true);
    if (ready) return ready;
    // Sleep on real fds.
    std::vector<pollfd> sleep;
    std::vector<RsRef> sockets;  // held across the sleep: an rclose meanwhile frees nothing
    bool closed = false;
    for (nfds_t i = 0; i < nfds; ++i) {
      RsRef s = get(fds[i].fd);
      if (!s) {
        sleep.push_back({fds[i].fd, fds[i].events, 0});
        continue;
      }
      std::lock_guard lk(s->mu);
      // Closed since check(): its wake-up may be spent already, so no sleep on it; the next
      // pass finds the descriptor gone (POLLNVAL once it is closed, as poll(2) says).
      if (s->closed) {
        closed = true;
        continue;
      }
      sockets.push_back(s);
      pollfd p[kSleepFds];
      const nfds_t n = enter_sleep_locked(s.get(), p);
      sleep.insert(sleep.end(), p, p + n);
    }
    int wait = closed ? 0 : -1;
    if (!closed && timeout > 0) {
      const int64_t left = deadline - now_ms();
      wait = left > 0 ? static_cast<int>(left) : 0;
    }
    const int r = ::poll(sleep.data(), sleep.size(), wait);
    const int e = errno;
    for (const RsRef& s : sockets) {
      std::lock_guard lk(s->mu);
      leave_sleep_locked(s.get());
    }
    if (r < 0) return errno = e, -1;
    if (timeout > 0 && now_ms() >= deadline) return check(fds, nfds, false);
  }
}

SV_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds,
                      timeval* timeout) {
  if (nfds < 0 || nfds > FD_SETSIZE) return errno = EINVAL, -1;
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT;
    if (exceptfds && FD_ISSET(fd, exceptfds)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  const int ms = timeout ? static_cast<int>(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
  const int r = rpoll(p.data(), p.size(), ms);
  if (r < 0) return -1;
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  int n = 0;
  for (const auto& q : p) {
    if (q.revents & POLLNVAL) return errno = EBADF, -1;
    if (readfds && (q.revents & (POLLIN | POLLHUP | POLLERR)) && (q.events & POLLIN)) {
      FD_SET(q.fd, readfds);
      ++n;
    }
    if (writefds && (q.revents & (POLLOUT | POLLERR)) && (q.events & POLLOUT)) {
      FD_SET(q.fd, writefds);
      ++n;
    }
    if (exceptfds && (q.revents & POLLPRI) && (q.events & POLLPRI)) {
      FD_SET(q.fd, exceptfds);
      ++n;
    }
  }
  if (timeout && r == 0) timeout->tv_sec = timeout->tv_usec = 0;
  return n;
}
