// Requester: frames SQ WQEs and IRQ responses into MPA FPDUs (RFC 5044 §4) and writes them
// with one sendmsg per batch. Messages are framed back to back, never interleaved
// (siw_get_hdr refuses interleaved tagged or untagged messages).
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <utility>

#include "engine/app_memory.h"
#include "engine/iw_cm.h"
#include "engine/log.h"
#include "engine/qp.h"
#include "wire/be.h"
#include "wire/crc32c.h"

namespace sv::engine {
namespace {

using wire::RdmapOpcode;

constexpr size_t kMaxFpduHdr = 2 + 82;  // length + largest header (softverbs shared memory)
constexpr size_t kCopyBelow = 64;       // small payloads are copied next to their header
// A segment by reference names at most this much: one process_vm_readv moves less than 2 GiB
// (MAX_RW_COUNT), and a message may be 2 GiB.
constexpr uint32_t kMaxRef = 1u << 30;

// Builder for one FPDU inside the current batch. Headers, small payloads and trailers go
// into the arena; adjacent arena bytes share one iovec, large payloads are referenced.
struct Framer {
  Conn& c;
  Qp* qp = nullptr;          // for fault rules; null on the Terminate path (no faults there)
  std::byte* hdr = nullptr;  // start of ULPDU_Length in the arena
  size_t ulpdu = 0;
  size_t mark = 0;       // arena bytes from here are not yet in the iovec list
  size_t first = 0;      // this FPDU starts in iov[first] ...
  size_t first_off = 0;  // ... at this offset
  uint64_t fpdus = 0;    // FPDUs framed: counted once per batch

  bool room(size_t pieces) const {
    return !c.fault_reset && c.iov_n + pieces + 3 <= Conn::kMaxIov &&
           c.arena_used + kMaxFpduHdr + kCopyBelow + 8 <= c.arena.size();
  }
  void add_iov(std::byte* p, size_t len) {
    if (!len) return;
    if (c.iov_n) {
      iovec& last = c.iov[c.iov_n - 1];
      if (static_cast<std::byte*>(last.iov_base) + last.iov_len == p) {
        last.iov_len += len;
        return;
      }
    }
    c.iov[c.iov_n++] = iovec{p, len};
  }
  void flush_arena() {
    if (c.arena_used > mark) add_iov(&c.arena[mark], c.arena_used - mark);
    mark = c.arena_used;
  }
  void start() {
    mark = c.arena_used;
    first = c.iov_n ? c.iov_n - 1 : 0;
    first_off = c.iov_n ? c.iov[c.iov_n - 1].iov_len : 0;
  }
  // Reserves ULPDU_Length + header; returns where the DDP header goes.
  std::byte* begin(size_t hdr_len) {
    hdr = &c.arena[c.arena_used];
    c.arena_used += 2 + hdr_len;
    ulpdu = hdr_len;
    return hdr + 2;
  }
  void payload(const std::byte* p, size_t len) {
    if (!len) return;
    if (len <= kCopyBelow) {
      copy_from_app(&c.arena[c.arena_used], p, len);
      c.arena_used += len;
    } else {
      flush_arena();
      add_iov(const_cast<std::byte*>(p), len);
    }
    ulpdu += len;
  }
  bool on_fault();
  // Closes the FPDU. False if a reset fault cut it: the caller records nothing of it as
  // sent (no WQE, IRQ or ack progress) and frames nothing more.
  bool end() {
    ++fpdus;
    wire::store_be16(hdr, static_cast<uint16_t>(ulpdu));
    if (c.shm_cap_tx) hdr[2] |= std::byte{wire::kDdpSvShmCap};
    const size_t pad = wire::fpdu_pad(ulpdu);
    std::memset(&c.arena[c.arena_used], 0, pad + 4);
    c.arena_used += pad;
    flush_arena();
    if (c.crc) {
      // CRC over ULPDU_Length, ULPDU and pad, in wire order (RFC 5044 §4.4).
      uint32_t s = wire::kCrc32cInit;
      for (size_t i = first; i < c.iov_n; ++i) {
        auto* b = static_cast<const std::byte*>(c.iov[i].iov_base);
        size_t len = c.iov[i].iov_len;
        if (i == first) {
          b += first_off;
          len -= first_off;
        }
        s = wire::crc32c_update(s, b, len);
      }
      wire::store_le32(&c.arena[c.arena_used], wire::crc32c_final(s));
    }
    if (qp && (qp->faults || qp->fault_corrupt_armed.load(std::memory_order_relaxed)))
        [[unlikely]] {
      if (!on_fault()) return false;
    }
    c.arena_used += 4;
    flush_arena();
    c.tx_queued += 2 + ulpdu + pad + 4;
    return true;
  }
};

// A fault rule's frame (SOFTVERBS_FAULT), with its CRC at arena_used. False if a reset
// cut it: this FPDU and all after it are lost with the connection, as on a pulled cable.
bool Framer::on_fault() {
  fault::Fired fx;
  // Every frame is numbered, injected or not, so rules fire on the same frames either way.
  const bool ruled = qp->faults && qp->faults->on_frame(fault::FaultDir::tx, false, fx);
  if (!ruled) {
    if (!qp->fault_corrupt_armed.exchange(false, std::memory_order_relaxed)) return true;
    fx.action = fault::FaultAction::corrupt;
    fx.bit = static_cast<uint32_t>(c.tx_queued % 32);
    SV_WARN("fault: qp %u corrupt tx (injected)", qp->qpn());
  }
  qp_fault_count(qp, fx.action);
  switch (fx.action) {
    case fault::FaultAction::corrupt:
      // One bit of the MPA CRC: the receiver's check fails for certain (RFC 5044 §4.4 then
      // Terminates), and no header or payload byte that could be placed is touched.
      if (!c.crc) {
        SV_WARN("qp %u: corrupt fault on a connection without MPA CRC: not applied", qp->qpn());
        return true;
      }
      c.arena[c.arena_used + fx.bit / 8] ^= static_cast<std::byte>(1u << (fx.bit % 8));
      return true;
    case fault::FaultAction::stall:
      qp_fault_hold(qp, fx.ms);  // this batch waits too: tx_run_locked checks the hold
      return true;
    case fault::FaultAction::reset:
      if (first_off) {
        c.iov_n = first + 1;
        c.iov[first].iov_len = first_off;
      } else {
        c.iov_n = first;
      }
      --fpdus;
      c.fault_reset = true;  // room() is false from now on; tx_run_locked sends the RST
      return false;
    default:
      return true;
  }
}

// The gather-list piece at payload offset `off`: its address and the bytes left in it.
std::pair<const std::byte*, uint32_t> sge_piece(const SendWqe& w, uint32_t off) {
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    const ibv_sge& s = w.sge[i];
    if (off < s.length) return {reinterpret_cast<const std::byte*>(s.addr) + off, s.length - off};
    off -= s.length;
  }
  return {nullptr, 0};
}

// Adds payload bytes [off, off+len) of a WQE's gather list.
void gather(Framer& f, const SendWqe& w, uint32_t off, uint32_t len) {
  for (uint32_t i = 0; i < w.num_sge && len; ++i) {
    const ibv_sge& s = w.sge[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const uint32_t take = std::min(len, s.length - off);
    f.payload(reinterpret_cast<const std::byte*>(s.addr) + off, take);
    len -= take;
    off = 0;
  }
}

bool local_keys_ok(Qp* qp, const SendWqe& w, int need) {
  return (w.flags & IBV_SEND_INLINE) ||
         KeyTable::get().local_sgl_ok(w.sge, w.num_sge, qp->pd, need);
}

uint32_t ord_limit(const Qp* qp) {
  uint32_t ord = std::max<uint32_t>(qp->attr.max_rd_atomic, 1);
  if (qp->conn.ord) ord = std::min<uint32_t>(ord, qp->conn.ord);
  return std::max<uint32_t>(ord, 1);
}

// The source of a Read Response is checked again as each segment is framed: the region may
// have been deregistered since the Request was accepted, and its memory is then no longer
// ours to send. The QP ends as for a bad STag on arrival (a Terminate, a remote access error
// for the requester), from the progress thread since we hold tx_mu mid-batch.
bool read_source_still_valid(Qp* qp, IrqEntry& e, uint32_t chunk) {
  if (qp->conn.tx_gated || qp->conn.tx_stopped) return false;
  auto& kt = KeyTable::get();
  auto g = kt.read_guard();
  std::byte* p = nullptr;
  const AccessResult r =
      kt.check(e.src_stag, qp->pd, e.src_to + e.sent, chunk, IBV_ACCESS_REMOTE_READ, true, &p, qp);
  if (r == AccessResult::ok && p == e.src + e.sent) return true;
  qp->conn.tx_stopped = true;  // nothing more is framed; the Terminate below goes first
  const wire::Terminate t =
      access_to_terminate(r == AccessResult::ok ? AccessResult::invalid_key : r, false);
  Progress::get().post([ref = QpRef(qp), t] {
    if (!ref.live()) return;
    Qp* qp = ref.get();
    {
      std::lock_guard lk(qp->tx_mu);
      tx_terminate_locked(qp, t);
    }
    qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, true, IBV_EVENT_QP_ACCESS_ERR);
  });
  return false;
}

// Frames as much of the IRQ head as fits. Returns false when the batch is full.
bool frame_irq(Qp* qp, Framer& f) {
  Conn& c = qp->conn;
  while (qp->irq_count) {
    IrqEntry& e = qp->irq[qp->irq_head];
    if (!f.room(1)) return false;
    f.start();
    const uint32_t left = e.length - e.sent;
    if (!e.atomic && left && shm_sends_refs(qp, left)) {
      // One copy (kDdpSvRef): the requester reads the rest straight from the region.
      const uint32_t chunk = std::min(left, kMaxRef);
      const bool last = chunk == left;
      if (!read_source_still_valid(qp, e, chunk)) return false;
      std::byte* h = f.begin(wire::kDdpTaggedHdrLen + wire::kSvRefLen);
      wire::encode_tagged_ref(h, RdmapOpcode::read_response, last, e.sink_stag, e.sink_to + e.sent,
                              reinterpret_cast<uintptr_t>(e.src + e.sent), chunk);
      if (!f.end()) return false;
      // The peer reads them (shm_pull).
      stats::add_serial(qp->stats, stats::Ctr::sent_bytes, chunk);
      e.sent += chunk;
      if (!last) continue;
    } else if (e.atomic) {
      std::byte* h = f.begin(wire::kDdpUntaggedHdrLen + wire::kAtomicResponseLen);
      wire::encode_untagged(h, RdmapOpcode::atomic_response, true, 0, wire::kQnAtomicResponse,
                            ++c.aresp_msn_tx, 0);
      wire::encode_atomic_response(h + wire::kDdpUntaggedHdrLen, e.aresp);
      if (!f.end()) return false;
    } else {
      const uint32_t chunk =
          std::min<uint32_t>(e.length - e.sent, c.max_ulpdu - wire::kDdpTaggedHdrLen);
      const bool last = e.sent + chunk == e.length;
      if (chunk && !read_source_still_valid(qp, e, chunk)) return false;
      std::byte* h = f.begin(wire::kDdpTaggedHdrLen);
      wire::encode_tagged(h, RdmapOpcode::read_response, last, e.sink_stag, e.sink_to + e.sent);
      f.payload(e.src + e.sent, chunk);
      if (!f.end()) return false;
      e.sent += chunk;
      if (!last) continue;
    }
    qp->irq_head = (qp->irq_head + 1) % qp->irq.size();
    --qp->irq_count;
  }
  return true;
}

void set_error_in_tx(Qp* qp, SendWqe& w, ibv_wc_status st) {
  w.status = st;
  w.state = WqeState::done;
  // qp_set_error takes tx_mu, which we hold: finish on the progress thread.
  Progress::get().post([ref = QpRef(qp)] {
    if (ref.live()) qp_set_error(ref.get(), IBV_WC_WR_FLUSH_ERR, true);
  });
}

// With Placement Acks (IB's completion rule), the last frame of a WR's message asks for an
// ack now (IB's AckReq) when the WR is signaled, or when three quarters of the SQ has been
// framed since the last request: the window nears its end, and the slots of unsignaled WRs
// retire only on an ack. Asking for more costs a streaming responder a sendmsg per ack
// (a stream has no reverse traffic to carry them) and ping-pongs a lone ack ahead of each
// answer; asking for less is safe, since an application reuses an unsignaled WR's slot only
// after a later signaled WR completes (as on IB). The responder acks the others lazily.
void mark_ack_request(const Qp* qp, Conn& c, const SendWqe& w, std::byte* hdr) {
  if (!c.wait_acks) return;
  const uint32_t window_end = std::max<uint32_t>(1, static_cast<uint32_t>(qp->sq.size()) * 3 / 4);
  if (!w.signaled && ++c.unrequested < window_end) return;
  c.unrequested = 0;
  hdr[0] |= std::byte{wire::kDdpSvAckReq};
}

// The rest of a Send's or Write's data segment once its header is framed: the ack request on
// the message's last segment (unless Immediate Data follows, which asks instead), the payload
// (`with_payload`; a segment by reference has none), the FPDU's end. -1: a reset fault cut it;
// 0: more segments of the message follow; 1: its data is all framed (its unit counted).
int end_data_segment(Qp* qp, Framer& f, SendWqe& w, std::byte* h, bool last, uint32_t len,
                     bool with_payload) {
  Conn& c = qp->conn;
  const bool imm_follows =
      w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (last && !imm_follows) mark_ack_request(qp, c, w, h);
  if (with_payload) gather(f, w, w.sent, len);
  if (!f.end()) return -1;
  w.sent += len;
  if (!last) return 0;
  ++c.units_tx;
  return 1;
}

// Memory window operations run on the requester, in SQ order, and put nothing on the wire:
// a Bind takes effect before any later WR leaves (so a Send behind it may carry the new
// rkey), and a refused one stops the SQ (rxe: IBV_WC_MW_BIND_ERR, LOC_QP_OP_ERR for an
// invalidation, the QP to ERR).
bool run_local_op(Qp* qp, SendWqe& w) {
  auto& kt = KeyTable::get();
  if (w.opcode == IBV_WR_BIND_MW) {
    if (!kt.bind(qp, qp->pd, w.bind)) {
      set_error_in_tx(qp, w, IBV_WC_MW_BIND_ERR);
      return false;
    }
  } else if (!kt.invalidate(nullptr, qp->pd, w.imm_or_inv)) {
    set_error_in_tx(qp, w, IBV_WC_LOC_QP_OP_ERR);
    return false;
  }
  w.state = WqeState::done;
  return true;
}

// Frames SQ WQEs from sq_tx. Returns false when the batch is full or the SQ must wait.
// *local_ops counts the memory window operations executed on the way.
bool frame_sq(Qp* qp, Framer& f, uint32_t& local_ops) {
  Conn& c = qp->conn;
  const uint32_t mask = qp->cap.max_send_wr - 1;
  while (qp->sq_tx != qp->sq_head + qp->sq_count) {
    SendWqe& w = qp->sq[qp->sq_tx & mask];
    // A WQE that failed locally stops the SQ: nothing behind it may reach the wire
    // (the QP is going to ERR and everything after it is flushed).
    if (w.state == WqeState::done) return false;
    const bool is_read = w.opcode == IBV_WR_RDMA_READ;
    const bool is_atomic =
        w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (w.state == WqeState::queued) {
      // Fence: wait for earlier Reads/Atomics (IB spec 10.8.3.3).
      if ((w.flags & IBV_SEND_FENCE) && qp->orq_used) return false;
      if (w.opcode == IBV_WR_BIND_MW || w.opcode == IBV_WR_LOCAL_INV) {
        if (!run_local_op(qp, w)) return false;
        ++local_ops;
        ++qp->sq_tx;
        continue;
      }
      if ((is_read || is_atomic) && qp->orq_used >= ord_limit(qp)) return false;
      const bool needs_sv =
          is_atomic || w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
      if (needs_sv && !c.peer_sv) {
        set_error_in_tx(qp, w, IBV_WC_LOC_QP_OP_ERR);
        return false;
      }
      if (is_atomic && (w.length != 8 || w.num_sge != 1)) {
        // The original value needs exactly one 8-byte local buffer (IB spec 9.4.5).
        set_error_in_tx(qp, w, IBV_WC_LOC_LEN_ERR);
        return false;
      }
      if (!local_keys_ok(qp, w, (is_read || is_atomic) ? IBV_ACCESS_LOCAL_WRITE : 0)) {
        set_error_in_tx(qp, w, IBV_WC_LOC_PROT_ERR);
        return false;
      }
      w.state = WqeState::sending;
      stats::add_serial(qp->stats,
                        is_read     ? stats::Ctr::sent_read_reqs
                        : is_atomic ? stats::Ctr::sent_atomics
                        : (w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
                            ? stats::Ctr::sent_writes
                            : stats::Ctr::sent_sends);
    }
    // A message whose data went out in an earlier batch (only its Immediate Data was cut
    // off by a full batch) is not framed again: it goes on to the Immediate Data.
    if (!w.data_framed) {
      if (!f.room(w.num_sge)) return false;
      f.start();
      switch (w.opcode) {
        case IBV_WR_SEND:
        case IBV_WR_SEND_WITH_IMM:
        case IBV_WR_SEND_WITH_INV: {
          if (w.sent == 0) w.msn = ++c.send_msn;
          const bool se = w.flags & IBV_SEND_SOLICITED;
          const bool inv = w.opcode == IBV_WR_SEND_WITH_INV;
          const RdmapOpcode op = inv ? (se ? RdmapOpcode::send_se_inv : RdmapOpcode::send_inv)
                                     : (se ? RdmapOpcode::send_se : RdmapOpcode::send);
          const uint32_t rsvd =
              inv ? w.imm_or_inv : (w.opcode == IBV_WR_SEND_WITH_IMM ? kSvImmFollows : 0);
          const uint32_t chunk =
              std::min<uint32_t>(w.length - w.sent, c.max_ulpdu - wire::kDdpUntaggedHdrLen);
          const bool last = w.sent + chunk == w.length;
          std::byte* h = f.begin(wire::kDdpUntaggedHdrLen);
          wire::encode_untagged(h, op, last, rsvd, wire::kQnSend, w.msn, w.sent);
          const int r = end_data_segment(qp, f, w, h, last, chunk, true);
          if (r < 0) return false;
          if (r == 0) continue;
          break;
        }
        case IBV_WR_RDMA_WRITE:
        case IBV_WR_RDMA_WRITE_WITH_IMM: {
          // One copy (kDdpSvRef): the responder reads each gather piece from our memory. Only
          // when its Placement Ack completes the WR (IB's rule): that ack is what says the
          // buffer is ours again (or, during an RNR stall, its count in the segment).
          if (c.wait_acks && shm_sends_refs(qp, w.length)) {
            const auto [src, whole] = sge_piece(w, w.sent);
            const uint32_t piece = std::min(whole, kMaxRef);
            const bool last = w.sent + piece == w.length;
            std::byte* h = f.begin(wire::kDdpTaggedHdrLen + wire::kSvRefLen);
            wire::encode_tagged_ref(h, RdmapOpcode::rdma_write, last, w.rkey,
                                    w.remote_addr + w.sent, reinterpret_cast<uintptr_t>(src),
                                    piece);
            const int r = end_data_segment(qp, f, w, h, last, piece, false);
            if (r < 0) return false;
            stats::add_serial(qp->stats, stats::Ctr::sent_bytes, piece);  // the peer reads them
            w.by_ref = true;
            if (r == 0) continue;
            break;
          }
          const uint32_t chunk =
              std::min<uint32_t>(w.length - w.sent, c.max_ulpdu - wire::kDdpTaggedHdrLen);
          const bool last = w.sent + chunk == w.length;
          std::byte* h = f.begin(wire::kDdpTaggedHdrLen);
          wire::encode_tagged(h, RdmapOpcode::rdma_write, last, w.rkey, w.remote_addr + w.sent);
          const int r = end_data_segment(qp, f, w, h, last, chunk, true);
          if (r < 0) return false;
          if (r == 0) continue;
          break;
        }
        case IBV_WR_RDMA_READ: {
          w.msn = ++c.rreq_msn_tx;
          std::byte* h = f.begin(wire::kDdpUntaggedHdrLen + wire::kReadRequestLen);
          wire::encode_untagged(h, RdmapOpcode::read_request, true, 0, wire::kQnReadRequest, w.msn,
                                0);
          wire::ReadRequest rr;
          rr.sink_stag = w.num_sge ? w.sge[0].lkey : 0;
          rr.sink_to = w.num_sge ? w.sge[0].addr : 0;
          rr.read_size = w.length;
          rr.source_stag = w.rkey;
          rr.source_to = w.remote_addr;
          wire::encode_read_request(h + wire::kDdpUntaggedHdrLen, rr);
          if (!f.end()) return false;
          break;
        }
        case IBV_WR_ATOMIC_CMP_AND_SWP:
        case IBV_WR_ATOMIC_FETCH_AND_ADD: {
          w.msn = ++c.rreq_msn_tx;  // Atomic Requests share QN 1 with Read Requests
          std::byte* h = f.begin(wire::kDdpUntaggedHdrLen + wire::kAtomicRequestLen);
          wire::encode_untagged(h, RdmapOpcode::atomic_request, true, 0, wire::kQnReadRequest,
                                w.msn, 0);
          wire::AtomicRequest ar;
          const bool cas = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
          ar.op = cas ? wire::AtomicOp::compare_swap : wire::AtomicOp::fetch_add;
          ar.req_id = w.msn;
          ar.stag = w.rkey;
          ar.to = w.remote_addr;
          ar.add_swap = cas ? w.swap : w.compare_add;
          ar.add_swap_mask = ~0ull;
          ar.compare = cas ? w.compare_add : 0;
          ar.compare_mask = ~0ull;
          wire::encode_atomic_request(h + wire::kDdpUntaggedHdrLen, ar);
          if (!f.end()) return false;
          break;
        }
        default:
          break;
      }
      w.data_framed = true;
    }
    if (is_read || is_atomic) {
      w.state = WqeState::awaiting_response;
      ++qp->orq_used;
    } else {
      if (w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        // RFC 7306 §6 Immediate Data: 4 bytes of imm, 4 bytes saying whether it belongs to
        // the Send just sent (softverbs) or stands alone (Write with immediate).
        if (!f.room(0)) return false;  // the message's last FPDU was cut (a reset fault)
        f.start();
        const bool se = w.flags & IBV_SEND_SOLICITED;
        std::byte* h = f.begin(wire::kDdpUntaggedHdrLen + wire::kImmDataLen);
        wire::encode_untagged(h, se ? RdmapOpcode::imm_data_se : RdmapOpcode::imm_data, true, 0,
                              wire::kQnSend, ++c.send_msn, 0);
        std::memcpy(h + wire::kDdpUntaggedHdrLen, &w.imm_or_inv, 4);  // already big-endian
        wire::store_be32(h + wire::kDdpUntaggedHdrLen + 4,
                         w.opcode == IBV_WR_SEND_WITH_IMM ? kSvImmAttached : 0);
        mark_ack_request(qp, c, w, h);
        if (!f.end()) return false;
        ++c.units_tx;
      }
      w.state = WqeState::sent;
      w.stream_end = c.tx_queued;
      w.ack_seq = c.units_tx;
    }
    ++qp->sq_tx;
  }
  return true;
}

// Drops the first n bytes of the pending iovecs (after a possibly partial sendmsg).
void consume_iov(Conn& c, size_t n) {
  while (n && c.iov_pos < c.iov_n) {
    iovec& v = c.iov[c.iov_pos];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++c.iov_pos;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
}

// One sendmsg of what is queued from iov_pos, its bytes accounted (tx_sent, sent_bytes) and
// consumed. Returns what sendmsg returned.
ssize_t send_queued(Qp* qp) {
  Conn& c = qp->conn;
  msghdr mh{};
  mh.msg_iov = &c.iov[c.iov_pos];
  mh.msg_iovlen = std::min<size_t>(c.iov_n - c.iov_pos, IOV_MAX);
  const ssize_t n = qp->tx_ring.load(std::memory_order_relaxed)
                        ? shm_tx_write(qp, mh.msg_iov, mh.msg_iovlen)
                        : transport::sys_sendmsg(c.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    c.tx_sent += static_cast<uint64_t>(n);
    stats::add_serial(qp->stats, stats::Ctr::sent_bytes, static_cast<uint64_t>(n));
    consume_iov(c, static_cast<size_t>(n));
  }
  return n;
}

// Builds the next batch. Returns true if anything was framed.
bool build_batch(Qp* qp) {
  Conn& c = qp->conn;
  if (c.tx_gated || c.tx_stopped) return false;
  Framer f{c, qp};
  const size_t before = c.iov_n;
  uint32_t local_ops = 0;
  if (c.send_rtr) {
    // RFC 6581 §4: peer-to-peer RTR, a zero-length RDMA Write the responder does not
    // surface to its ULP.
    f.start();
    std::byte* h = f.begin(wire::kDdpTaggedHdrLen);
    wire::encode_tagged(h, RdmapOpcode::rdma_write, true, 0, 0);
    if (f.end()) c.send_rtr = false;
  }
  if (c.shm_tx_due && f.room(0)) {
    // Shared-memory set-up (qp_shm.cc). An accept or switch goes alone in its batch: once
    // the batch is sent, everything after it goes to the ring.
    const uint8_t type = c.shm_tx_due;
    f.start();
    std::byte* h = f.begin(wire::kDdpUntaggedHdrLen + wire::kShmCtrlLen);
    wire::encode_untagged(h, RdmapOpcode::sv_shm, true, 0, wire::kQnSvShm, 0, 0);
    shm_encode_ctrl(qp, type, h + wire::kDdpUntaggedHdrLen);
    if (!f.end()) return true;  // a reset fault cut it: the connection ends
    c.shm_tx_due = 0;
    if (type == static_cast<uint8_t>(wire::ShmCtrl::Type::accept) ||
        type == static_cast<uint8_t>(wire::ShmCtrl::Type::switch_over)) {
      c.shm_tx_switch = true;
      stats::add_serial(qp->stats, stats::Ctr::sent_pkts, f.fpdus);
      return true;
    }
  }
  if (c.ack_to_send != c.ack_sent && f.room(0)) {
    // Placement Ack (softverbs peers only): ahead of anything else, so an answer framed in
    // this batch never overtakes the ack of what it answers.
    f.start();
    std::byte* h = f.begin(wire::kDdpUntaggedHdrLen);
    wire::encode_untagged(h, RdmapOpcode::sv_ack, true, 0, wire::kQnSvAck, c.ack_to_send, 0);
    if (f.end()) c.ack_sent = c.ack_to_send;
  }
  const ibv_qp_state st = qp->state.load();
  if (st == IBV_QPS_RTS || st == IBV_QPS_SQD || st == IBV_QPS_RTR) {
    // Responses first: the peer's Reads are waiting on them. A partially framed SQ
    // message is finished before anything else so messages never interleave.
    const uint32_t mask = qp->cap.max_send_wr - 1;
    const bool sq_mid = qp->sq_tx != qp->sq_head + qp->sq_count &&
                        qp->sq[qp->sq_tx & mask].state == WqeState::sending &&
                        qp->sq[qp->sq_tx & mask].sent > 0;
    if (!sq_mid) frame_irq(qp, f);
    if (st == IBV_QPS_RTS) frame_sq(qp, f, local_ops);
    if (sq_mid) frame_irq(qp, f);
  }
  stats::add_serial(qp->stats, stats::Ctr::sent_pkts, f.fpdus);
  // Local operations alone still need their completions: report progress.
  return c.iov_n > before || local_ops;
}

}  // namespace

void tx_run_locked(Qp* qp) {
  Conn& c = qp->conn;
  if (c.fd < 0 || c.iov.empty()) return;
  for (;;) {
    // A stall fault holds everything, queued bytes included; its timer kicks TX again.
    if (qp->fault_held.load(std::memory_order_acquire) != 0) [[unlikely]]
      return;
    while (c.iov_pos < c.iov_n) {
      if (send_queued(qp) < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) {
          if (!qp->tx_blocked) {
            qp->tx_blocked = true;
            qp_update_interest(qp);
          }
          // A full ring: the consumer's bell for room may have been taken (by any receive
          // pass) before tx_blocked was visible, and no one would kick us. Look once more
          // now that it is (seq_cst, against the taker's load of tx_blocked).
          if (qp->tx_ring.load() && c.shm->tx.has_room()) continue;
          return;
        }
        // The peer is gone; RX sees the same and errors the QP.
        qp->tx_blocked = false;
        c.iov_n = c.iov_pos = 0;
        Progress::get().post([ref = QpRef(qp)] {
          if (ref.live()) qp_conn_lost(ref.get(), IBV_WC_RETRY_EXC_ERR);
        });
        return;
      }
    }
    if (c.shm_tx_switch) [[unlikely]] {
      c.shm_tx_switch = false;
      shm_tx_switched_locked(qp);
    }
    if (c.fault_reset) [[unlikely]] {
      // Everything before the cut FPDU is on its way: now the RST, and nothing after it.
      c.fault_reset = false;
      c.tx_stopped = true;
      c.iov_n = c.iov_pos = 0;
      c.arena_used = 0;
      if (qp->tx_blocked) {
        qp->tx_blocked = false;
        qp_update_interest(qp);
      }
      qp_fault_reset_locked(qp);
      return;
    }
    if (qp->tx_blocked) {
      qp->tx_blocked = false;
      qp_update_interest(qp);
    }
    c.iov_n = c.iov_pos = 0;
    if (c.arena_used) c.tx_active = true;
    c.arena_used = 0;
    complete_sq_locked(qp);
    if (!build_batch(qp) && !c.fault_reset) return;
  }
}

void tx_kick(Qp* qp) {
  std::lock_guard lk(qp->tx_mu);
  tx_run_locked(qp);
}

namespace {
constexpr int kTermDrainMs = 200;

// Writes what is queued, waiting for the socket at most until `deadline` (the Terminate path
// only: the connection closes right after, and what is still queued then is lost).
void drain_until(Qp* qp, std::chrono::steady_clock::time_point deadline) {
  Conn& c = qp->conn;
  while (c.iov_pos < c.iov_n) {
    const ssize_t n = send_queued(qp);
    if (n > 0) {
      if (c.iov_pos == c.iov_n) {
        c.iov_n = c.iov_pos = c.arena_used = 0;  // as tx_run_locked
        if (c.shm_tx_switch) {                   // the batch carried our accept or switch
          c.shm_tx_switch = false;
          shm_tx_switched_locked(qp);
        }
      }
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    if (qp->tx_ring.load()) {
      // A full ring: nothing to wait on here (the consumer's bell comes to RX); look again.
      ::poll(nullptr, 0, 1);
      continue;
    }
    pollfd p{c.fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
  }
}
}  // namespace

void tx_terminate_locked(Qp* qp, const wire::Terminate& t) {
  Conn& c = qp->conn;
  if (c.fd < 0 || c.iov.empty()) return;
  // Finish what is queued so the Terminate starts on an FPDU boundary, then send it. The
  // peer may be slow to read (a full socket is how a Read Response stalls): give it a short,
  // bounded time, since the connection closes after the Terminate and would drop it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTermDrainMs);
  // A batch that carries our shared-memory accept or switch goes out first: the peer reads
  // nothing on TCP after it, so the Terminate must follow it into the ring.
  if (c.shm_tx_switch) drain_until(qp, deadline);
  if (c.shm_tx_switch) return;
  Framer f{c};
  if (!f.room(1)) drain_until(qp, deadline);
  if (!f.room(1)) return;
  if (c.ack_to_send != c.ack_sent) {
    // What was placed before the failure is acked first: the Terminate then belongs to the
    // oldest WQE the peer still waits on, the one that caused it.
    f.start();
    std::byte* a = f.begin(wire::kDdpUntaggedHdrLen);
    wire::encode_untagged(a, RdmapOpcode::sv_ack, true, 0, wire::kQnSvAck, c.ack_to_send, 0);
    f.end();
    c.ack_sent = c.ack_to_send;
  }
  f.start();
  std::byte* h = f.begin(wire::kDdpUntaggedHdrLen + wire::kTerminateCtrlLen);
  // siw sends its Terminate with MSN 1 on QN 2.
  wire::encode_untagged(h, RdmapOpcode::terminate, true, 0, wire::kQnTerminate, ++c.term_msn_tx, 0);
  wire::encode_terminate(h + wire::kDdpUntaggedHdrLen, t);
  f.end();
  c.tx_stopped = true;  // nothing after the Terminate
  stats::add_serial(qp->stats, stats::Ctr::sent_terminates);
  stats::add_serial(qp->stats, stats::Ctr::sent_pkts, f.fpdus);
  drain_until(qp, deadline);
}

}  // namespace sv::engine
