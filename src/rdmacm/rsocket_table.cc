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
// Allocated a chunk of descriptors at a time, on first use, and never freed: a socket still
// in the table at exit is not torn down by a static destructor behind the engine's back.
using Slot = std::atomic<RsRef>;
inline constexpr int kChunk = 1024;
std::atomic<Slot*> g_chunks[kMaxFds / kChunk];

Slot* slot(int fd, bool make) {
  std::atomic<Slot*>& c = g_chunks[fd / kChunk];
  Slot* chunk = c.load(std::memory_order_acquire);
  if (!chunk && make) {
    auto* fresh = new Slot[kChunk];
    if (c.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel))
      chunk = fresh;
    else
      delete[] fresh;  // another thread's chunk won
  }
  return chunk ? &chunk[fd % kChunk] : nullptr;
}
}  // namespace

int fail(int e) {
  errno = e;
  return -1;
}

void publish(const RsRef& s) {
  slot(s->fd, true)->store(s);
}

bool unpublish(const Rs* s) {
  Slot* at = slot(s->fd, false);
  if (!at) return false;
  RsRef cur = at->load();
  // Only the socket itself: two rcloses of one descriptor take it out once.
  return cur.get() == s && at->compare_exchange_strong(cur, nullptr);
}

RsRef get(int fd) {
  if (fd < 0 || fd >= kMaxFds) return nullptr;
  Slot* at = slot(fd, false);
  return at ? at->load() : nullptr;
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
