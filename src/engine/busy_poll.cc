#include "engine/busy_poll.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "engine/cq.h"
#include "engine/iw_cm.h"
#include "engine/progress.h"
#include "engine/qp.h"
#include "util/cancel_unwind.h"
#include "util/clock.h"
#include "util/settings.h"

namespace sv::engine {
namespace {

using sv::mono_ns;

// Until when a poller owns the QP's receive path: either CQ counts, since a poll of either
// drives the QP's whole receive path (Cq::qps holds the QPs of both roles).
uint64_t owned_until(const Qp* qp) {
  return std::max(qp->scq->busy_until.load(), qp->rcq->busy_until.load());
}

// A blocker waits on the sockets of its CQ's wait set: RC QPs only (qp_wait_sync).
bool blocked_on(const Qp* qp) {
  return !qp->ud && (qp->scq->blockers.load() > 0 || qp->rcq->blockers.load() > 0);
}

void recheck(Qp* qp);

// Wakes whoever sleeps on the wait set of either of the QP's CQs.
void kick_wait_sets(Qp* qp) {
  cq_kick(qp->scq);
  if (qp->rcq != qp->scq) cq_kick(qp->rcq);
}

// A recheck `delay_ns` from now, unless one is due sooner. A later one still pending then
// runs too, harmlessly: only the soonest matters.
void schedule_recheck(Qp* qp, uint64_t delay_ns) {
  const uint64_t at = mono_ns() + delay_ns;
  if (qp->yield_timer_at && qp->yield_timer_at <= at) return;
  qp->yield_timer_at = at;
  Progress::get().post_after(std::chrono::microseconds(delay_ns / 1000 + 1), [ref = QpRef(qp), at] {
    if (!ref.live()) return;  // destroyed meanwhile
    Qp* qp = ref.get();
    if (qp->yield_timer_at == at) qp->yield_timer_at = 0;
    recheck(qp);
  });
}

// A recheck of every QP of cq, soon, on the progress thread (its poller stopped).
void post_recheck(Cq* cq) {
  std::vector<QpRef> qps;
  {
    std::lock_guard lk(cq->qps_mu);
    qps.reserve(cq->qps.size());
    for (Qp* qp : cq->qps) qps.emplace_back(qp);
  }
  Progress::get().post([qps = std::move(qps)] {
    for (const QpRef& ref : qps)
      if (ref.live()) recheck(ref.get());
  });
}

uint64_t block_gen(const Qp* qp) {
  return qp->scq->block_gen.load() + qp->rcq->block_gen.load();
}

// Progress thread: take the socket back once nobody polls for it any more.
void recheck(Qp* qp) {
  if (!qp->rx_yielded) return;
  if (blocked_on(qp)) {
    // A thread sleeps on the wait set, and the bytes it waits for wake it, not us. Parked
    // first, then looked again (seq_cst, as cq_block_end does the reverse): either we see
    // that it has gone, or its cq_block_end sees the flag. The next look is kBlockRecheckNs
    // away, and doubles while the same sleep lasts (an idle sleeper costs the progress
    // thread almost no wake-ups); a sleep that long posts a recheck when it ends.
    qp->scq->recheck_parked.store(true);
    qp->rcq->recheck_parked.store(true);
    if (blocked_on(qp)) {
      // The sleeper needs bells; bytes that came while the spinner said none wake it now.
      // (If a receive pass holds rx_mu, it wakes them anyway: a spurious wake costs a poll.)
      if (qp->rx_ring.load()) {
        std::unique_lock lk(qp->rx_mu, std::try_to_lock);
        if (!lk.owns_lock() || shm_ring_on_locked(qp)) kick_wait_sets(qp);
      }
      const uint64_t gen = block_gen(qp);
      const bool same = gen == qp->park_gen;
      qp->park_gen = gen;
      qp->park_backoff = same ? std::min<uint32_t>(qp->park_backoff * 2, 1024) : 1;
      schedule_recheck(qp, kBlockRecheckNs * qp->park_backoff);
      return;
    }
  }
  const uint64_t now = mono_ns();
  const uint64_t until = owned_until(qp);
  if (until > now) {
    // Still polled: look again later and later, up to kMaxRecheckNs (or 4 hold times, if
    // longer), so a long spin costs the progress thread a few hundred wake-ups a second, not
    // one per hold time: each one pre-empts a spinner on a small machine (a busy-polled RDS
    // round trip: 38-43 us with rechecks 4 holds apart, 28-32 us with 64). A poller that
    // stops without arming waits at most that long for the socket to go back; one that
    // arms or says softverbs_cq_busy_poll(cq, 0), not at all.
    const uint64_t hold = busy_poll_hold_ns();
    qp->yield_backoff = std::min<uint32_t>(qp->yield_backoff ? qp->yield_backoff * 2 : 2, 1024);
    const uint64_t delay = std::min(hold * qp->yield_backoff, std::max(4 * hold, kMaxRecheckNs));
    schedule_recheck(qp, std::max(until - now, delay));
    return;
  }
  qp->rx_yielded = false;
  qp->rx_handed.store(false);  // before rx_mu: a quiet the poller still owed comes first
  qp_update_interest(qp);      // EPOLLIN again: level-triggered, so nothing waiting is missed
  // ... except bytes in a shared-memory ring whose producer was told not to ring: bells on,
  // and what is there is read now. Under rx_mu, waited for: a poller holding it may have
  // made its last read before the bytes came (and the consumer's index is rx_mu's).
  if (qp->rx_ring.load()) {
    std::lock_guard lk(qp->rx_mu);
    if (shm_ring_on_locked(qp)) qp_rx_locked(qp);
  }
}

}  // namespace

uint64_t busy_poll_hold_ns() {
  static const uint64_t ns = sv::setting_us_as_ns(SV_SETTING("SOFTVERBS_BUSY_POLL_US"));
  return ns;
}

namespace {
// A token per thread: the address of a thread-local.
uintptr_t thread_token() {
  thread_local char t;
  return reinterpret_cast<uintptr_t>(&t);
}

void set_owner(Cq* cq) {
  const uintptr_t me = thread_token();
  if (cq->busy_owner.load(std::memory_order_relaxed) != me)
    cq->busy_owner.store(me, std::memory_order_relaxed);
}
}  // namespace

void cq_busy_poll_mark(Cq* cq, uint64_t now) {
  const uint64_t hold = busy_poll_hold_ns();
  if (!hold) return;
  set_owner(cq);
  cq->busy_until.store(now + hold, std::memory_order_relaxed);
}

bool cq_owned_elsewhere(const Cq* cq, uint64_t now) {
  if (cq->busy_owner.load(std::memory_order_relaxed) == thread_token()) return false;
  if (cq->blockers.load(std::memory_order_relaxed) > 0) return true;
  const uint64_t until = cq->busy_until.load(std::memory_order_relaxed);
  return until && until > now;
}

void cq_busy_poll_armed(Cq* cq) {
  const uintptr_t me = thread_token();
  // A thread that sleeps in ibv_get_cq_event arms between two sleeps there (channel_block):
  // handing the sockets back would cost the progress thread a wake-up per message, and the
  // next sleep takes them again. If it sleeps elsewhere instead, the recheck takes them back
  // within a hold time (at most kMaxRecheckNs).
  if (cq_channel_sleeper_is_me(cq)) return;
  if (cq->busy_owner.load(std::memory_order_relaxed) == me) cq_busy_poll_end(cq);
}

uint64_t spin_yield_ns() {
  static const uint64_t ns = sv::setting_us_as_ns(SV_SETTING("SOFTVERBS_SPIN_YIELD_US"));
  return ns;
}

bool cq_busy_poll_empty(Cq* cq, uint64_t now) {
  if (Progress::get().on_thread()) return false;
  const bool streak = now - cq->last_empty.load(std::memory_order_relaxed) <= kSpinGapNs;
  const uint32_t n = streak ? cq->empty_polls.load(std::memory_order_relaxed) + 1 : 1;
  cq->empty_polls.store(n, std::memory_order_relaxed);  // racy count, only a heuristic
  // Once a spinner, each empty poll of the streak extends its hold; another thread's empty
  // polls of the CQ (a consumer's event thread draining it) make it no owner.
  if (streak && !cq->armed.load(std::memory_order_relaxed) &&
      (n >= kSpinPolls || (cq->busy_until.load(std::memory_order_relaxed) &&
                           cq->busy_owner.load(std::memory_order_relaxed) == thread_token())))
    cq_busy_poll_mark(cq, now);
  // A spin this long waits for something slow (perftest -R's server spins on its control
  // CQ for the whole test). On a small machine it takes the CPU that the device threads,
  // ours and the peer's, need to move the very data it waits for: a NIC needs no CPU, we
  // do. So from then on each empty poll yields (sched_yield returns at once when nothing
  // else is runnable here); a short wait, a ping-pong's, never gets there.
  const uint64_t after = spin_yield_ns();
  if (!after) return false;
  if (n == 1) {
    cq->empty_since.store(now, std::memory_order_relaxed);
    cq->yield_from.store(~0u, std::memory_order_relaxed);
  } else if ((n & 63) == 0 && cq->yield_from.load(std::memory_order_relaxed) == ~0u &&
             now - cq->empty_since.load(std::memory_order_relaxed) >= after) {
    cq->yield_from.store(n, std::memory_order_relaxed);
  }
  if (n < cq->yield_from.load(std::memory_order_relaxed)) return false;
  sched_yield();
  return true;
}

void cq_busy_poll_empty_done(Cq* cq, uint64_t now) {
  if (!Progress::get().on_thread()) cq->last_empty.store(now, std::memory_order_relaxed);
}

bool cq_spinning(const Cq* cq, uint64_t now) {
  return cq->empty_polls.load(std::memory_order_relaxed) > 0 &&
         now - cq->last_empty.load(std::memory_order_relaxed) <= kSpinGapNs;
}

void cq_busy_poll_end(Cq* cq) {
  cq->empty_polls.store(0, std::memory_order_relaxed);
  if (cq->busy_until.load(std::memory_order_relaxed) != 0) cq->busy_until.store(0);
  // Paired with qp_busy_step_back's store of `yielded` then load of busy_until (all seq_cst):
  // either it sees our 0 and keeps the socket, or we see its flag and hand the socket back.
  if (!cq->yielded.exchange(false)) return;
  post_recheck(cq);
}

bool qp_busy_step_back(Qp* qp) {
  if (qp->rx_yielded) return true;  // an event reported before the interest changed
  if (!busy_poll_hold_ns()) return false;
  const uint64_t now = mono_ns();
  if (owned_until(qp) <= now && !blocked_on(qp)) return false;
  qp->scq->yielded.store(true);
  qp->rcq->yielded.store(true);
  const uint64_t until = owned_until(qp);
  if (until <= now && !blocked_on(qp)) return false;  // the poller ended meanwhile
  qp->rx_yielded = true;
  qp->rx_handed.store(true);
  qp->yield_backoff = 0;
  // A spinner takes the ring's bytes itself: the peer need not ring (no send and recv per
  // message). A thread that blocks later turns bells back on (cq_block_begin, which counts
  // itself a blocker first: seq_cst, against this look at blocked_on after quieting).
  if (!blocked_on(qp) && qp->rx_ring.load()) {
    std::unique_lock lk(qp->rx_mu, std::try_to_lock);
    if (lk.owns_lock())
      qp_busy_quiet_locked(qp);
    else
      qp->rx_quiet_due.store(true);  // the poller in its pass does it after (qp_progress)
  }
  schedule_recheck(qp, until > now ? until - now : busy_poll_hold_ns());
  return true;
}

void qp_busy_bell_taken_locked(Qp* qp) {
  if (Progress::get().on_thread()) return;
  const uintptr_t me = thread_token();
  if (qp->scq->busy_owner.load(std::memory_order_relaxed) != me &&
      qp->rcq->busy_owner.load(std::memory_order_relaxed) != me)
    return;
  const uint64_t now = mono_ns();
  if (owned_until(qp) <= now) return;
  if (qp->rx_handed.load(std::memory_order_relaxed)) {
    // Ours already, and yet the peer rang: a sleep of ours since the step-back turned its
    // bells on (cq_block_begin), and nothing turned them off when it woke. A spinner again
    // (its last poll was empty, moments ago: not a sleeper just woken, which would only
    // turn them on again at its next sleep, visiting every QP of the CQ): quiet again.
    // Else a busy-polled RDS round trip paid a send and a recv per message for the rest
    // of the run after a single sleep (6.1 us, not 2.8).
    if (cq_spinning(qp->scq, now) || cq_spinning(qp->rcq, now)) qp_busy_quiet_locked(qp);
    return;
  }
  if (qp->step_back_asked.exchange(true)) return;
  Progress::get().post([ref = QpRef(qp)] {
    if (!ref.live()) return;
    Qp* q = ref.get();
    q->step_back_asked.store(false);
    if (q->conn.fd >= 0 && qp_busy_step_back(q)) qp_update_interest(q);
  });
}

void qp_busy_quiet_locked(Qp* qp) {
  qp->rx_quiet_due.store(false, std::memory_order_relaxed);
  // Still the poller's (a recheck that handed the socket back clears rx_handed before it
  // takes rx_mu to turn the bells on, so it comes after us), and nobody sleeping on it.
  if (!qp->rx_handed.load()) return;
  // Marked before the look at blockers (seq_cst): a blocker that counted itself after it
  // is seen below, one that counted itself before finds the mark and visits us.
  qp->scq->quiet_rings.store(true);
  qp->rcq->quiet_rings.store(true);
  if (blocked_on(qp)) return;
  shm_quiet_locked(qp);
  if (blocked_on(qp) && shm_ring_on_locked(qp)) kick_wait_sets(qp);
}

namespace {
// Empties the kick eventfd. errno is kept: softverbs_cq_block runs right around the caller's
// own poll(), whose errno (EINTR) the caller reads after it (the RDS shim's poll returns it
// to rds-stress, which retries on EINTR and dies on the EAGAIN an empty eventfd would leave).
// Every drain reads: a flag saying "kicked since the last drain" saved 4 reads per message of
// an event-driven ping-pong, but a drain that ran between a kick's write and its flag left
// the set readable after the sleeper took everything (WaitFdWakesTheBlockerWhoseOwnPollReceives
// saw it under ctest -j2).
void drain_kick(Cq* cq) {
  const int kick = cq->kick_fd.load();
  if (kick < 0) return;
  const int saved = errno;
  uint64_t v;
  (void)!read(kick, &v, sizeof v);
  errno = saved;
}
}  // namespace

void cq_block_begin(Cq* cq, bool drain) {
  if (!busy_poll_hold_ns()) return;
  set_owner(cq);
  if (cq->blockers.fetch_add(1) == 0) {
    cq->block_since.store(mono_ns(), std::memory_order_relaxed);
    cq->block_gen.fetch_add(1);
  }
  // Shared-memory rings a spinner told not to ring: this thread is about to sleep, so they
  // ring again, and what came meanwhile wakes it at once (qp_shm.cc). After counting itself
  // a blocker: a step-back that quiets a ring then sees it and turns bells back on.
  if (drain) drain_kick(cq);
  // Only if a ring may have been quieted since the last blocker looked: a CQ of thousands of
  // QPs (RDS with as many peers) is not visited, each under its rx_mu, on every sleep.
  if (!cq->quiet_rings.exchange(false)) return;
  bool waiting = false;
  {
    std::lock_guard lk(cq->qps_mu);
    for (Qp* qp : cq->qps) waiting |= shm_wake_locked_out(qp);
  }
  if (waiting) cq_kick(cq);
}

void cq_kick(Cq* cq) {
  if (cq->blockers.load() == 0) return;  // nobody sleeps on the set: no stale readiness
  // Counted, then looked again (seq_cst, the reverse of cq_block_end): either the last
  // blocker's decrement comes first and we do not write, or it sees us and waits for the
  // write before it drains.
  // Let go by a guard: write() is a cancellation point, and an application thread cancelled
  // in it (glibc unwinds) must not leave the count up, or every last blocker would wait.
  struct Kicking {
    Cq* cq;
    explicit Kicking(Cq* c) : cq(c) { cq->kickers.fetch_add(1); }
    ~Kicking() { cq->kickers.fetch_sub(1); }
    Kicking(const Kicking&) = delete;
    Kicking& operator=(const Kicking&) = delete;
  } const kicking(cq);
  if (const int kick = cq->kick_fd.load(); kick >= 0 && cq->blockers.load() != 0) {
    const int saved = errno;
    const uint64_t one = 1;
    (void)!write(kick, &one, sizeof one);
    errno = saved;
  }
}

void cq_block_end(Cq* cq, bool drain) {
  if (!busy_poll_hold_ns()) return;
  cq_busy_poll_mark(cq);  // it takes in what woke it, then ownership decays as a spinner's
  const uint64_t since = cq->block_since.load(std::memory_order_relaxed);
  const bool last = cq->blockers.fetch_sub(1) == 1;
  if (drain) {
    // What it woke for is taken in next. The last one out first lets a kick that saw it
    // asleep finish (a write, no lock taken), or the set would stay readable after its poll
    // took everything (WaitFdWakesTheBlockerWhoseOwnPollReceives, under TSan in CI).
    while (last && cq->kickers.load() != 0) std::this_thread::yield();
    drain_kick(cq);
  }
  if (!last || !cq->recheck_parked.exchange(false)) return;
  // A short sleep leaves the recheck to the timer already set, at most kBlockRecheckNs out
  // (set in this sleep, or by an earlier short one; a long one posted when it ended). A
  // long sleep may have pushed the timer further: look now. One post per long sleep, while a
  // ping-pong's sleeps cost none.
  if (mono_ns() - since < kBlockRecheckNs) return;
  post_recheck(cq);
}

namespace {
// The QP's CQs, each once: bit 0 is the send CQ's wait set, bit 1 the receive CQ's.
template <class Fn>
void for_each_wait_set(Qp* qp, Fn fn) {
  fn(qp->scq, uint8_t{1});
  if (qp->rcq != qp->scq) fn(qp->rcq, uint8_t{2});
}

void wait_set(Qp* qp, bool want) {
  for_each_wait_set(qp, [&](Cq* cq, uint8_t bit) {
    const int epfd = cq ? cq->wait_epfd.load() : -1;
    if (epfd < 0 || want == ((qp->wait_sets & bit) != 0)) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = qp->qpn();
    if (epoll_ctl(epfd, want ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, qp->conn.fd, &ev) == 0 || !want)
      qp->wait_sets = static_cast<uint8_t>(want ? qp->wait_sets | bit : qp->wait_sets & ~bit);
  });
}
}  // namespace

void qp_wait_sync(Qp* qp) {
  if (qp->ud) return;  // UD receives on its own socket, driven by the progress thread
  wait_set(qp, qp->conn.fd >= 0 && qp->conn_up() && !qp->rx_stalled.load() &&
                   qp->fault_held.load() == 0 && qp->state.load() != IBV_QPS_ERR);
}

void qp_wait_drop(Qp* qp) {
  if (qp->wait_sets && qp->conn.fd >= 0) wait_set(qp, false);
  qp->wait_sets = 0;
}

bool cq_channel_sleeper_is_me(const Cq* cq) {
  return cq->channel_owner.load(std::memory_order_relaxed) == thread_token();
}

void channel_cq_add(CompChannel* ch, Cq* cq) {
  std::lock_guard lk(ch->mu);
  ch->cqs.push_back(cq);
}

void channel_cq_remove(CompChannel* ch, Cq* cq) {
  std::unique_lock lk(ch->mu);
  ch->cqs.erase(std::remove(ch->cqs.begin(), ch->cqs.end(), cq), ch->cqs.end());
  // A sleeper holding it wakes on its kick (it has no QP left: ibv_destroy_cq refuses a CQ
  // with QPs) and lets go.
  while (cq->channel_sleepers > 0) {
    cq_kick(cq);
    ch->cv.wait_for(lk, std::chrono::milliseconds(1));
  }
}

namespace {
constexpr size_t kMaxChannelCqs = 8;  // perftest and rping have 1 or 2; more: no ownership

// The CQs a channel_block sleep holds, undone in the destructor. Cancellation is off in
// channel_block but for its poll (rping cancels its CQ thread there): glibc cancels by
// unwinding, which runs this, and no other cancellation point can leave a CQ half begun or
// a receive pass's rx_mu held.
struct ChannelSleep {
  CompChannel* ch;
  Cq* cqs[kMaxChannelCqs];
  size_t n = 0;      // held (channel_sleepers counted)
  size_t begun = 0;  // cq_block_begin'd
  void end_blocks() {
    for (size_t i = 0; i < begun; ++i) cq_block_end(cqs[i], false);
    begun = 0;
  }
  ~ChannelSleep() {
    end_blocks();
    if (!n) return;
    std::lock_guard lk(ch->mu);
    for (size_t i = 0; i < n; ++i) --cqs[i]->channel_sleepers;
    ch->cv.notify_all();
  }
};

// The receive pass of every QP of the CQs whose wait sets fired, each QP once: a QP's send
// and receive CQs (perftest's) both fire for its socket, and a second pass would only read
// EAGAIN. (No tl_polling: these CQs have no completion handler.)
void run_receive_once(Cq* const* cqs, size_t n, const pollfd* fired) {
  constexpr size_t kMaxSeen = 16;
  Qp* seen[kMaxSeen];
  size_t nseen = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!fired[i].revents) continue;
    std::lock_guard lk(cqs[i]->qps_mu);
    for (Qp* qp : cqs[i]->qps) {
      if (std::find(seen, seen + nseen, qp) != seen + nseen) continue;
      if (nseen < kMaxSeen) seen[nseen++] = qp;
      qp_progress(qp);
    }
  }
}

struct NoCancel {
  int old = PTHREAD_CANCEL_ENABLE;
  NoCancel() { pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old); }
  ~NoCancel() { pthread_setcancelstate(old, nullptr); }
  // A poll that may be cancelled if the caller allowed it.
  int poll(pollfd* p, nfds_t n) {
    pthread_setcancelstate(old, nullptr);
    const int r = util::cancellation_point([&] { return ::poll(p, n, -1); });
    const int e = errno;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, nullptr);
    errno = e;
    return r;
  }
};

// Whether some installed signal handler lacks SA_RESTART (a blocking read it interrupts fails
// with EINTR). Asked only after a signal interrupted a sleep.
bool some_handler_interrupts() {
  for (int sig = 1; sig < NSIG; ++sig) {
    // Faults are the thread's own and interrupt no sleep (sanitizers handle SIGSEGV so).
    if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP ||
        sig == SIGSYS)
      continue;
    struct sigaction sa {};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    const bool handled = (sa.sa_flags & SA_SIGINFO)
                             ? sa.sa_sigaction != nullptr
                             : sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
    if (handled && !(sa.sa_flags & SA_RESTART)) return true;
  }
  return false;
}

// Ownership for this sleep? Not with a completion handler (RDS's runs on the progress
// thread), nor with a UD QP: its socket is in no wait set, so it would wait for the progress
// thread, which steps back from an owned CQ's QPs (up to a hold time per datagram).
bool channel_cq_ownable(Cq* cq) {
  if (cq->nud.load(std::memory_order_relaxed)) return false;
  std::lock_guard lk(cq->mu);
  return cq->comp_handler == nullptr;
}
}  // namespace

int channel_block(CompChannel* ch) {
  if (!busy_poll_hold_ns() || ch->events.queued()) return 0;
  const int fd = ch->events.fd();
  const int fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
  if (fl < 0 || (fl & O_NONBLOCK)) return 0;
  NoCancel nc;
  const uintptr_t me = thread_token();
  while (!ch->events.queued()) {
    ChannelSleep s{ch};
    {
      std::lock_guard lk(ch->mu);
      if (ch->cqs.empty() || ch->cqs.size() > kMaxChannelCqs) return 0;
      for (Cq* cq : ch->cqs)
        if (!channel_cq_ownable(cq)) return 0;
      for (Cq* cq : ch->cqs) {
        s.cqs[s.n++] = cq;
        ++cq->channel_sleepers;
      }
    }
    // The channel, each CQ's wait set, then each CQ's kick: the kick is in its wait set too,
    // but polled on its own it says whether it fired, so it is read only then (a drain before
    // and after every sleep was 4 reads per message, all but never finding a kick).
    pollfd p[2 * kMaxChannelCqs + 1];
    p[0] = {fd, POLLIN, 0};
    for (size_t i = 0; i < s.n; ++i) {
      const int wfd = cq_wait_fd(s.cqs[i]);
      if (wfd < 0) return 0;  // no wait set: the progress thread receives, as before
      p[i + 1] = {wfd, POLLIN, 0};
      p[s.n + i + 1] = {s.cqs[i]->kick_fd.load(), POLLIN, 0};
    }
    // A thread about to sleep posts no answer: what waits for one (a Placement Ack held for
    // it, doorbell-batched posts) leaves now (softverbs_cq_block does the same).
    for (size_t i = 0; i < s.n; ++i) s.cqs[i]->flush_deferred_tx();
    for (; s.begun < s.n; ++s.begun) {
      s.cqs[s.begun]->channel_owner.store(me, std::memory_order_relaxed);
      cq_block_begin(s.cqs[s.begun], false);
    }
    const int r = nc.poll(p, 2 * s.n + 1);
    s.end_blocks();
    // A kick that fired is read, whatever else woke the sleep: one left would wake the next.
    // Its CQ's receive pass runs too: poll may have looked at the wait set just before the
    // kick made it readable, and the ring the kick is for rings no more.
    bool kicked = false;
    if (r > 0)
      for (size_t i = 0; i < s.n; ++i)
        if (p[s.n + i + 1].revents) {
          drain_kick(s.cqs[i]);
          p[i + 1].revents |= POLLIN;
          kicked = true;
        }
    // An event, but a kick too: the ring it is for is read first, or it would wait for the
    // next sleep, which no longer sees the kick.
    // (Its notifications are counted: the sleeper reads the event already queued first.)
    if (p[0].revents && kicked) run_receive_once(s.cqs, s.n, p + 1);
    if (r < 0) {
      // A signal. The sleep this replaces, a read of the descriptor, would have been
      // restarted if the handler said SA_RESTART, and failed with EINTR if not; poll never
      // is restarted, and which signal came is not known here. So: EINTR if any handler
      // lacks SA_RESTART (a program that installed one expects EINTR from a blocking call),
      // else the plain read, which sleeps unowned: the sockets go back to the progress
      // thread now, not after a hold.
      const int e = errno;
      for (size_t i = 0; i < s.n; ++i) cq_busy_poll_end(s.cqs[i]);
      errno = e;
      return e == EINTR && some_handler_interrupts() ? -1 : 0;
    }
    if (p[0].revents) return 0;  // an event (or the channel went: the read says so)
    // The peer's bytes: run the receive path here; a completion's notification goes to the
    // channel (no completion handler), and the loop finds it queued.
    {
      // What it raises first, it reads next (EventQueue::push_for_self).
      struct Self {
        explicit Self(CompChannel* c) { tl_channel_self = c; }
        ~Self() { tl_channel_self = nullptr; }
      } self(ch);
      run_receive_once(s.cqs, s.n, p + 1);
    }
  }
  return 0;
}

int cq_wait_fd(Cq* cq) {
  if (const int fd = cq->wait_epfd.load(); fd >= 0) return fd;
  int err = 0;
  Progress::get().run_sync([cq, &err] {
    if (cq->wait_epfd.load() >= 0) return;
    const int fd = epoll_create1(EPOLL_CLOEXEC);
    if (fd < 0) {
      err = errno;
      return;
    }
    // The kick (Cq::kick_fd): without it a sleeper could miss bytes in a quiet ring, so no
    // wait set without it either (the caller, RDS, then waits without one).
    const int kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = 0;  // no QP's
    if (kick < 0 || epoll_ctl(fd, EPOLL_CTL_ADD, kick, &ev) != 0) {
      err = errno;
      if (kick >= 0) close(kick);
      close(fd);
      return;
    }
    cq->kick_fd.store(kick);
    cq->wait_epfd.store(fd);
    std::lock_guard lk(cq->qps_mu);
    for (Qp* qp : cq->qps) qp_wait_sync(qp);
  });
  if (err) errno = err;
  return cq->wait_epfd.load();
}

}  // namespace sv::engine
