// The rsocket descriptor table and the wait helpers: the socket behind a descriptor, and how
// a thread sleeps on a socket and wakes the others. rsocket.cc (descriptors, set-up),
// rsocket_data.cc (the data path) and rpoll.cc call down into this file; it calls none of
// them, so no two files call each other.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "rdmacm/rsocket_impl.h"

namespace sv::rsock {

namespace {
std::atomic<Rs*> g_table[kMaxFds];
}  // namespace

int fail(int e) {
  errno = e;
  return -1;
}

void publish(Rs* s) {
  g_table[s->fd].store(s, std::memory_order_release);
}

void unpublish(Rs* s) {
  g_table[s->fd].store(nullptr, std::memory_order_release);
}

Rs* get(int fd) {
  if (fd < 0 || fd >= kMaxFds) return nullptr;
  return g_table[fd].load(std::memory_order_acquire);
}

void signal_waiters(Rs* s) {
  const uint64_t one = 1;
  ssize_t r = write(s->fd, &one, sizeof one);
  (void)r;
}

void arm_locked(Rs* s) {
  if (s->cq) ibv_req_notify_cq(s->cq, 0);
}

nfds_t enter_sleep_locked(Rs* s, pollfd out[kSleepFds]) {
  nfds_t n = 0;
  out[n++] = {s->fd, POLLIN, 0};
  // While connecting, completions (a grant the peer sent at once) wait for the connect.
  if (s->cc && s->state != State::connecting) out[n++] = {s->cc->fd, POLLIN, 0};
  if (s->cm_ch) out[n++] = {s->cm_ch->fd, POLLIN, 0};
  ++s->waiters;
  return n;
}

void leave_sleep_locked(Rs* s) {
  // The last sleeper out clears the wake-up, so none misses one (rdma-core's pollcnt).
  if (--s->waiters == 0) {
    uint64_t v;
    ssize_t r = read(s->fd, &v, sizeof v);
    (void)r;
  }
}

int sleep_once(Rs* s, std::unique_lock<std::mutex>& lk, int timeout_ms) {
  pollfd p[kSleepFds];
  const nfds_t n = enter_sleep_locked(s, p);
  lk.unlock();
  const int r = poll(p, n, timeout_ms);
  const int e = errno;
  lk.lock();
  leave_sleep_locked(s);
  if (r < 0 && e == EINTR) return fail(EINTR);
  return 0;
}

}  // namespace sv::rsock
