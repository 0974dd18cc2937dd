// The rsocket descriptor table and the wait helpers: the socket behind a descriptor, and how
// a thread sleeps on a socket and wakes the others. rsocket.cc (descriptors, set-up),
// rsocket_data.cc (the data path) and rpoll.cc call down into this file; it calls none of
// them, so no two files call each other.
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "rdmacm/rsocket_impl.h"

namespace sv::rsock {

namespace {
// Allocated a chunk of descriptors at a time, on first use, and never freed: a socket still
// in the table at exit is not torn down by a static destructor behind the engine's back.
// A slot is read and written under one of kStripes mutexes (by descriptor), held only to copy
// a reference: calls on different sockets rarely meet on one. (Not std::atomic<shared_ptr>:
// GCC 12's has no ThreadSanitizer annotations, and the sanitized suite stops at a report.)
inline constexpr int kChunk = 1024;
inline constexpr int kStripes = 64;
std::atomic<RsRef*> g_chunks[kMaxFds / kChunk];
std::mutex g_stripes[kStripes];

RsRef* slot(int fd, bool make) {
  std::atomic<RsRef*>& c = g_chunks[fd / kChunk];
  RsRef* chunk = c.load(std::memory_order_acquire);
  if (!chunk && make) {
    auto* fresh = new RsRef[kChunk];
    if (c.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel))
      chunk = fresh;
    else
      delete[] fresh;  // another thread's chunk won
  }
  return chunk ? &chunk[fd % kChunk] : nullptr;
}

std::mutex& stripe(int fd) {
  return g_stripes[fd % kStripes];
}
}  // namespace

int fail(int e) {
  errno = e;
  return -1;
}

void publish(const RsRef& s) {
  RsRef* at = slot(s->fd, true);
  std::lock_guard lk(stripe(s->fd));
  *at = s;
}

bool unpublish(const Rs* s) {
  RsRef* at = slot(s->fd, false);
  if (!at) return false;
  RsRef gone;  // dropped after the stripe is let go: it may be the last reference
  std::lock_guard lk(stripe(s->fd));
  // Only the socket itself: two rcloses of one descriptor take it out once.
  if (at->get() != s) return false;
  gone = std::move(*at);
  return true;
}

RsRef get(int fd) {
  if (fd < 0 || fd >= kMaxFds) return nullptr;
  RsRef* at = slot(fd, false);
  if (!at) return nullptr;
  std::lock_guard lk(stripe(fd));
  return *at;
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
  // Closed by another thread: nothing will wake a sleep on a descriptor nobody can reach any
  // more, so every blocking call leaves with what a call after the close gets.
  if (s->closed) return fail(EBADF);
  pollfd p[kSleepFds];
  const nfds_t n = enter_sleep_locked(s, p);
  lk.unlock();
  const int r = poll(p, n, timeout_ms);
  const int e = errno;
  lk.lock();
  leave_sleep_locked(s);
  if (s->closed) return fail(EBADF);
  if (r < 0 && e == EINTR) return fail(EINTR);
  return 0;
}

}  // namespace sv::rsock
