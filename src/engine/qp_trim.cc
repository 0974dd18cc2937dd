// Each connection has a receive buffer (256 KiB: headers, trailers and small payloads read
// from the stream) and a TX header arena (128 KiB). A burst of traffic leaves their pages
// resident, which is most of what an idle QP costs (250-400 KiB once it has carried data).
// rxe and siw hold no such buffers (the kernel's socket buffers and skbs are shared), so an
// idle softverbs QP should cost about what it costs before any traffic.
//
// The sweep runs on the progress thread, where connections change state, so a QP it finds in
// the registry is not destroyed or reset while it looks. It only try-locks: a QP whose RX or
// TX is running is busy, not idle. Between two sweeps the data path records that it used a
// buffer (one store per read or batch); a buffer unused for a whole period and empty is given
// back with MADV_DONTNEED, and refaults as zero pages when traffic resumes. A shared-memory
// connection's own ring goes with its arena (MADV_REMOVE: the pages are the memfd's).
#include "engine/qp_trim.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "engine/iw_cm.h"
#include "engine/progress.h"
#include "engine/qp.h"
#include "engine/stats.h"
#include "util/fork_local.h"
#include "util/settings.h"

namespace sv::engine {

namespace {

struct TrimState {
  std::atomic<bool> running{false};
};
ForkLocal<TrimState> g_trim;

// Buffers given back per sweep at most, so that a sweep after 10,000 connections went quiet
// at once holds the progress thread for milliseconds, not a second; the rest wait a period.
constexpr int kMaxTrimsPerSweep = 1024;
int g_trims_left = 0;  // progress thread only

std::chrono::milliseconds period() {
  static const auto ms = settings::uint_value(SV_SETTING("SOFTVERBS_IDLE_TRIM_MS"));
  return std::chrono::milliseconds(ms);
}

// The whole pages inside [p, p + n): the allocator's own header before p is never touched.
void give_back(std::byte* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

// One buffer's turn: used this period -> resident (look again next period); unused for a
// whole period, empty and resident -> given back.
bool idle_now(bool& active, bool& resident, bool empty) {
  if (active) {
    active = false;
    resident = true;
    return false;
  }
  if (!resident || !empty || g_trims_left <= 0) return false;
  --g_trims_left;
  resident = false;
  return true;
}

void trim_qp(Qp* qp) {
  if (qp->destroyed.load(std::memory_order_acquire)) return;
  Conn& c = qp->conn;
  if (qp->rx_mu.try_lock()) {
    if (c.fd >= 0 && idle_now(c.rx_active, c.rx_resident, c.rx_begin == c.rx_end) &&
        !c.rxbuf.empty()) {
      give_back(c.rxbuf.data(), c.rxbuf.size());
      stats::add(qp->stats, stats::Ctr::idle_trims);
    }
    qp->rx_mu.unlock();
  }
  if (qp->tx_mu.try_lock()) {
    if (c.fd >= 0 && idle_now(c.tx_active, c.tx_resident, c.arena_used == 0 && c.iov_n == 0) &&
        !c.arena.empty()) {
      give_back(c.arena.data(), c.arena.size());
      stats::add(qp->stats, stats::Ctr::idle_trims);
      // Our shared-memory ring too, once the peer has read all of it: only we write its data
      // area, and the peer reads only what we wrote since its head, so nothing in it is
      // wanted. MADV_REMOVE frees the memfd's pages (for both mappings), not just ours.
      if (qp->tx_ring.load(std::memory_order_relaxed) && c.shm->tx.drained())
        madvise(c.shm->tx.data(), c.shm->tx.capacity(), MADV_REMOVE);
    }
    qp->tx_mu.unlock();
  }
}

// The registry's QPs, listed under its lock and trimmed after it: QP creation and lookups on
// other threads do not wait for the madvise calls. Each stays valid meanwhile: a QP leaves
// the registry on this thread (qp_destroy's run_sync) before it is freed.
// Progress thread only. Never destroyed: the progress thread may still sweep while exit()
// runs the static destructors.
std::vector<Qp*>& listed() {
  static auto* v = new std::vector<Qp*>();
  return *v;
}

void list_qp(Qp* qp) {
  listed().push_back(qp);
}

void sweep() {
  g_trims_left = kMaxTrimsPerSweep;
  listed().clear();
  oob::for_each_qp(list_qp);
  for (Qp* qp : listed()) trim_qp(qp);
  // Runs for the life of the process once a connection was up: one wake-up a period.
  Progress::get().post_after(period(), sweep);
}

}  // namespace

void qp_trim_start() {
  if (period().count() == 0) return;
  if (g_trim.get().running.exchange(true, std::memory_order_acq_rel)) return;
  Progress::get().post_after(period(), sweep);
}

}  // namespace sv::engine
