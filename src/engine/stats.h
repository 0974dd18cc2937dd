// Per-QP counters, published live for softverbs-stat (the file format: wire/stats_file.h).
//
// Each QP owns a slot of the process's statistics file, a MAP_SHARED mapping of
// /dev/shm/softverbs-stats-<uid>/<pid>: counting is one relaxed atomic add into memory that
// another process can read, with no lock and no syscall. The file is created with the first
// QP and removed when the process exits; a directory that is not privately ours, a full slot
// table or SOFTVERBS_STATS=0 leave the counters in process memory (still counted, not
// published). A forked child starts a file of its own (util/fork_local.h).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/tcp.h"
#include "wire/stats_file.h"

namespace sv::engine::stats {

using wire::Ctr;

// Overlays one slot of the file (layout: wire/stats_file.h), or a private fallback.
struct Slot {
  std::atomic<uint32_t> qpn;
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> qp_type;
  std::atomic<uint32_t> dest_qpn;
  uint16_t family;
  uint16_t port;
  uint8_t addr[16];
  std::atomic<uint32_t> transport;  // wire::kTransportShm or 0
  std::atomic<uint64_t> ctr[wire::kCtrCount];
  std::atomic<uint64_t> wc[wire::kWcStatusCount];
};
static_assert(sizeof(Slot) == wire::kSlotSize);
static_assert(offsetof(Slot, ctr) == wire::kSlotCounters);
static_assert(offsetof(Slot, addr) == wire::kSlotAddr);
static_assert(offsetof(Slot, transport) == wire::kSlotTransport);

// A slot for a new QP (never null).
Slot* attach(uint32_t qpn, uint32_t qp_type);
// Adds the slot's counts to the destroyed-QP totals and frees it.
void detach(Slot* s);
// Counts into the process's totals directly: events of no QP (rdma_cm's UD set-up messages).
void add_retired(Ctr c, uint64_t n = 1);

inline void add(Slot* s, Ctr c, uint64_t n = 1) {
  s->ctr[static_cast<size_t>(c)].fetch_add(n, std::memory_order_relaxed);
}
// The same for a counter that one thread at a time adds to: a QP's TX counters (sent_*),
// added only with its tx_mu held, and its RX counters (rcvd_*, rnr_waits, shm_pulls), only
// with its rx_mu held (a UD QP's are added elsewhere, with add). No locked instruction: a
// locked add waits until every store before it is visible, and on shared memory those are
// the ring's bytes on their way to the peer's core: these adds alone cost the sender of
// ib_send_bw 8 B over shared memory 8% of its message rate (1.08x without them). The reader
// (softverbs-stat) still sees whole 64-bit values.
inline void add_serial(Slot* s, Ctr c, uint64_t n = 1) {
  auto& v = s->ctr[static_cast<size_t>(c)];
  v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
inline void count_wc(Slot* s, int status) {
  if (status >= 0 && static_cast<size_t>(status) < wire::kWcStatusCount)
    s->wc[status].fetch_add(1, std::memory_order_relaxed);
}
inline void set_state(Slot* s, uint32_t state) {
  s->state.store(state, std::memory_order_relaxed);
}
void set_peer(Slot* s, const transport::SockAddr& peer, uint32_t dest_qpn);
inline void set_transport(Slot* s, uint32_t t) {
  s->transport.store(t, std::memory_order_relaxed);
}

// The path of this process's statistics file, or "" when it publishes none.
const char* file_path();

}  // namespace sv::engine::stats
