#include "engine/cq.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "engine/progress.h"
#include "engine/qp.h"

namespace sv::engine {

thread_local Cq* tl_polling = nullptr;
thread_local CompChannel* tl_channel_self = nullptr;
thread_local Cq* tl_quiet = nullptr;
thread_local int tl_quiet_made = 0;

namespace {
uint64_t clock_ns(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}
}  // namespace

bool Cq::push(const ibv_wc& wc, bool solicited) {
  bool notify = false;
  bool handler = false;
  {
    std::lock_guard lk(mu);
    const uint32_t n = count.load(std::memory_order_relaxed);
    if (n == ring.size()) {
      overflowed = true;
      return false;
    }
    const size_t slot = (head + n) % ring.size();
    ring[slot] = wc;
    if (!ts.empty()) ts[slot] = clock_ns(CLOCK_MONOTONIC);
    if (!wall.empty()) wall[slot] = clock_ns(CLOCK_REALTIME);
    count.store(n + 1, std::memory_order_relaxed);
    // A thread that asked for quiet (softverbs_cq_quiet) polls for what it made itself.
    const bool quiet = tl_quiet == this;
    if (quiet) ++tl_quiet_made;
    // With a completion handler, a completion made by the consumer's own ibv_poll_cq of this
    // CQ (it drove the receive path) is returned by that poll: the CQ stays armed for the
    // next one instead of handing the consumer an event about what it is already holding.
    if (armed && (!solicited_only || solicited || wc.status != IBV_WC_SUCCESS) && !quiet &&
        !(comp_handler && tl_polling == this)) {
      armed = false;
      notify = true;
      handler = comp_handler != nullptr;
    }
  }
  if (!notify) return true;
  // Elsewhere than on the progress thread a caller may hold any engine lock (a poller
  // driving RX holds rx_mu): the handler would run under it, so the channel gets it.
  if (handler && Progress::get().on_thread()) {
    Progress::get().defer_cq(this);
  } else if (channel && channel == tl_channel_self) {
    // Only the pass's first: its sleeper reads one record next, and a second uncounted one
    // would be invisible to poll and to a thread blocked reading the descriptor.
    tl_channel_self = nullptr;
    channel->events.push_for_self(ibcq());
  } else if (channel) {
    channel->events.push(ibcq());
  }
  return true;
}

void Cq::run_handler() {
  bool (*fn)(ibv_cq*, void*);
  void* arg;
  {
    std::lock_guard lk(mu);
    fn = comp_handler;
    arg = comp_arg;
  }
  if (fn && fn(ibcq(), arg)) return;
  if (channel) channel->events.push(ibcq());
}

int Cq::poll(int n, ibv_wc* out) {
  // Empty now is the answer a poll under mu just before the next push would give.
  if (count.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard lk(mu);
  const uint32_t have = count.load(std::memory_order_relaxed);
  const int k = std::min<int>(n, static_cast<int>(have));
  const auto cap = static_cast<uint32_t>(ring.size());
  for (int i = 0; i < k; ++i) {
    out[i] = ring[head];
    head = head + 1 == cap ? 0 : head + 1;
  }
  count.store(have - static_cast<uint32_t>(k), std::memory_order_relaxed);
  return k;
}

void Cq::clean(uint32_t qpn, bool keep_recv) {
  std::lock_guard lk(mu);
  const auto cap = static_cast<uint32_t>(ring.size());
  uint32_t kept = 0;
  const uint32_t have = count.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < have; ++i) {
    const uint32_t from = (head + i) % cap;
    if (ring[from].qp_num == qpn && !(keep_recv && (ring[from].opcode & IBV_WC_RECV))) continue;
    const uint32_t to = (head + kept) % cap;
    if (to != from) {
      ring[to] = ring[from];
      if (!ts.empty()) ts[to] = ts[from];
      if (!wall.empty()) wall[to] = wall[from];
    }
    ++kept;
  }
  count.store(kept, std::memory_order_relaxed);
}

bool Cq::pop_current() {
  std::lock_guard lk(mu);
  const uint32_t have = count.load(std::memory_order_relaxed);
  if (have == 0) return false;
  cur = ring[head];
  cur_ts = ts.empty() ? 0 : ts[head];
  cur_wall = wall.empty() ? 0 : wall[head];
  head = head + 1 == ring.size() ? 0 : head + 1;
  count.store(have - 1, std::memory_order_relaxed);
  return true;
}

int Cq::arm(bool solicited) {
  {
    std::lock_guard lk(mu);
    // Arming a CQ that already holds completions still waits for the next one, as in
    // the kernel; apps poll after arming to close that window.
    // A CQ armed for any completion stays so when asked for solicited ones only; an arm
    // for solicited ones is widened by a request for any (rxe_req_notify_cq).
    if (!armed || solicited_only) solicited_only = solicited;
    armed = true;
  }
  return 0;
}

void Cq::attach(Qp* qp) {
  std::lock_guard lk(qps_mu);
  if (std::find(qps.begin(), qps.end(), qp) != qps.end()) return;
  qps.push_back(qp);
  if (qp->ud) nud.fetch_add(1);
  nqps.store(static_cast<int>(qps.size()), std::memory_order_release);
}

void Cq::detach(Qp* qp) {
  std::lock_guard lk(qps_mu);
  const auto it = std::remove(qps.begin(), qps.end(), qp);
  if (it == qps.end()) return;
  qps.erase(it, qps.end());
  if (qp->ud) nud.fetch_sub(1);
  nqps.store(static_cast<int>(qps.size()), std::memory_order_release);
}

bool Cq::progress_qps() {
  std::lock_guard lk(qps_mu);
  tl_polling = this;
  bool took = false;
  for (Qp* qp : qps) took |= qp_progress(qp);
  tl_polling = nullptr;
  return took;
}

void Cq::flush_deferred_tx(bool with_acks) {
  if (!tx_deferred.load(std::memory_order_acquire)) return;
  tx_deferred.store(false, std::memory_order_relaxed);
  std::lock_guard lk(qps_mu);
  bool kept = false;
  for (Qp* qp : qps) kept |= !qp_tx_flush(qp, with_acks);
  if (kept) tx_deferred.store(true, std::memory_order_relaxed);
}

void Cq::set_comp_handler(bool (*handler)(ibv_cq*, void*), void* arg) {
  {
    std::lock_guard lk(mu);
    comp_handler = handler;
    comp_arg = arg;
  }
  // A notification deferred under the old handler must not reach the new one's arg.
  if (!handler) Progress::get().run_sync([this] { Progress::get().forget_cq(this); });
}

uint32_t Cq::pending() {
  std::lock_guard lk(mu);
  return count.load(std::memory_order_relaxed);
}

int Cq::resize(int new_cqe) {
  std::lock_guard lk(mu);
  const uint32_t have = count.load(std::memory_order_relaxed);
  if (static_cast<uint32_t>(new_cqe) < have) return EINVAL;
  util::RawArray<ibv_wc> moved_ring;
  moved_ring.allocate(static_cast<size_t>(new_cqe) + 1);
  for (uint32_t i = 0; i < have; ++i) moved_ring[i] = ring[(head + i) % ring.size()];
  ring.swap(moved_ring);
  // Completion times move with their completions (extended CQs that asked for them).
  for (auto* t : {&ts, &wall}) {
    if (t->empty()) continue;
    std::vector<uint64_t> moved(ring.size());
    for (uint32_t i = 0; i < have; ++i) moved[i] = (*t)[(head + i) % t->size()];
    t->swap(moved);
  }
  head = 0;
  cqe = new_cqe;
  cqx.cqe = new_cqe;
  return 0;
}

}  // namespace sv::engine
