// Responder: validates and executes inbound RDMAP messages (RFC 5040 §5), and matches
// Read/Atomic responses for the completer. Caller holds rx_mu throughout.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine/app_memory.h"
#include "engine/iw_cm.h"
#include "engine/log.h"
#include "engine/peer_guard.h"
#include "engine/rx_dispatch.h"
#include "wire/be.h"
#include "wire/terminate_codes.h"

namespace sv::engine {
namespace {

using wire::RdmapOpcode;
using wire::Terminate;

}  // namespace

bool take_recv(Qp* qp, RecvWqe& out, std::array<ibv_sge, kMaxSge>& sge) {
  if (qp->srq) {
    Srq* s = qp->srq;
    bool limit_event = false;
    {
      std::lock_guard lk(s->mu);
      if (!s->count) return false;
      RecvWqe& r = s->ring[s->head];
      out = r;
      std::copy(r.sge, r.sge + r.num_sge, sge.begin());
      s->head = (s->head + 1) % s->max_wr;
      --s->count;
      if (s->limit && s->count < s->limit) {
        s->limit = 0;  // one-shot, as armed by ibv_modify_srq(IBV_SRQ_LIMIT)
        limit_event = true;
      }
    }
    if (limit_event) {
      ibv_async_event ev{};
      ev.element.srq = &s->srq;
      ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
      qp->ctx->post_async(ev);
    }
  } else {
    std::lock_guard lk(qp->rq_mu);
    if (!qp->rq_count) return false;
    RecvWqe& r = qp->rq[qp->rq_head & (qp->cap.max_recv_wr - 1)];
    out = r;
    std::copy(r.sge, r.sge + r.num_sge, sge.begin());
    ++qp->rq_head;
    --qp->rq_count;
  }
  out.sge = sge.data();
  return true;
}

bool recv_posted(Qp* qp) {
  if (qp->srq) {
    std::lock_guard lk(qp->srq->mu);
    return qp->srq->count != 0;
  }
  std::lock_guard lk(qp->rq_mu);
  return qp->rq_count != 0;
}

// An SRQ's receives belong to the SRQ's PD (IB spec 10.2.9; rxe and siw check it), not to
// the PD of the QP that happens to consume them.
bool recv_keys_ok(Qp* qp, const RecvWqe& w) {
  return KeyTable::get().local_sgl_ok(w.sge, w.num_sge, qp->srq ? qp->srq->pd : qp->pd,
                                      IBV_ACCESS_LOCAL_WRITE);
}

bool recv_keys_ok_guarded(Qp* qp, const RecvWqe& w) {
  return KeyTable::get().local_sgl_ok_locked(w.sge, w.num_sge, qp->srq ? qp->srq->pd : qp->pd,
                                             IBV_ACCESS_LOCAL_WRITE);
}

namespace {

// Finds the oldest WQE awaiting a response of this kind.
SendWqe* oldest_awaiting(Qp* qp, bool atomic) {
  const uint32_t mask = qp->cap.max_send_wr - 1;
  for (uint32_t i = qp->sq_head; i != qp->sq_tx; ++i) {
    SendWqe& w = qp->sq[i & mask];
    if (w.state != WqeState::awaiting_response) continue;
    const bool is_atomic =
        w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    if (is_atomic == atomic) return &w;
  }
  return nullptr;
}

// IB spec table "RNR NAK timer field encoding", in microseconds (code 0 = 655.36 ms).
constexpr uint32_t kRnrTimerUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                      160,    240,   320,   480,    640,    960,    1280,   1920,
                                      2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                      40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};

// Receiver not ready. iWARP has no RNR NAK (siw terminates at once with DDP "no
// buffer"); we wait with TCP back-pressure, forever for rnr_retry 7 (what perftest and
// rping ask for), else for (rnr_retry + 1) RNR timeouts, then end the connection with
// that Terminate, which the requester reports as IBV_WC_RNR_RETRY_EXC_ERR. The counts are
// this QP's own (set with IBV_QP_RNR_RETRY): the requester's never reaches us over iWARP.
void arm_rnr_timer(Qp* qp, Conn& c) {
  const uint32_t gen = ++c.rnr_gen;
  // 7 means forever; a QP that never set a count (perftest's receiving server stays in
  // RTR) waits forever too rather than give up on the default 0.
  if (!qp->rnr_retry_set || qp->attr.rnr_retry >= 7) return;
  const uint64_t us =
      static_cast<uint64_t>(kRnrTimerUs[qp->attr.min_rnr_timer & 31]) * (qp->attr.rnr_retry + 1u);
  const auto ms = std::chrono::milliseconds(std::max<uint64_t>(1, (us + 999) / 1000));
  Progress::get().post_after(ms, [ref = QpRef(qp), gen] {
    if (!ref.live()) return;
    Qp* qp = ref.get();
    std::lock_guard lk(qp->rx_mu);
    if (qp->conn.rnr_gen != gen || !qp->rx_stalled || qp->conn.have_recv ||
        qp->state.load() == IBV_QPS_ERR)
      return;  // a receive arrived meanwhile
    rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::no_buffer), RxBlame::peer);
  });
}

// UC (IB spec 9.9.3 class D, rxe_responder's RESPST_ERR_RNR / _RKEY_VIOLATION / _LENGTH for
// UC): the message is dropped, the QP stays as it is and the requester is not told. This
// segment and the rest of the message are discarded (rx_on_segment_end ends the drop).
RxAction uc_drop(Qp* qp, Conn& c, Conn::UcDrop kind, const char* why) {
  SV_DBG("qp %u: UC message dropped: %s", qp->qpn(), why);
  stats::add(qp->stats, stats::Ctr::uc_dropped);
  c.uc_drop = kind;
  c.place.kind = Placement::Kind::discard;
  return RxAction::place;
}

bool is_send(RdmapOpcode op) {
  return op == RdmapOpcode::send || op == RdmapOpcode::send_inv || op == RdmapOpcode::send_se ||
         op == RdmapOpcode::send_se_inv;
}

// A segment of the UC message being dropped (same queue, same message): discarded.
bool uc_dropping(const Conn& c) {
  return (c.uc_drop == Conn::UcDrop::send && is_send(c.seg.opcode) && c.seg.msn == c.recv_msn) ||
         (c.uc_drop == Conn::UcDrop::write && c.seg.opcode == RdmapOpcode::rdma_write);
}

RxAction on_send(Qp* qp, Conn& c) {
  const auto& s = c.seg;
  if (s.msn != c.recv_msn) {
    rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::msn_range), RxBlame::peer);
    return RxAction::dead;
  }
  if (!c.have_recv) {
    if (s.mo != 0) {
      rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::invalid_mo), RxBlame::peer);
      return RxAction::dead;
    }
    if (!take_recv(qp, c.cur_recv, c.cur_sge)) {
      if (qp->uc) return uc_drop(qp, c, Conn::UcDrop::send, "no receive posted");
      arm_rnr_timer(qp, c);
      return RxAction::stall;  // receiver not ready: TCP back-pressure while we wait
    }
    c.have_recv = true;
    if (!recv_keys_ok(qp, c.cur_recv)) {
      // The sender sees IBV_WC_REM_OP_ERR, as an IB requester does for this (rxe, mlx5).
      rx_fail(qp, ddp_catastrophic_term(), RxBlame::peer, IBV_WC_LOC_PROT_ERR);
      return RxAction::dead;
    }
  } else if (c.recv_reuse) {
    if (s.mo != 0) {
      rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::invalid_mo), RxBlame::peer);
      return RxAction::dead;
    }
    c.recv_reuse = false;
  } else if (s.mo != c.place.offset) {
    rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::invalid_mo), RxBlame::peer);
    return RxAction::dead;
  }
  if (static_cast<uint64_t>(s.mo) + s.payload_len > c.cur_recv.length) {
    if (qp->uc) {
      // rxe's class D1: the receive goes back to what it was, for the next Send. Kept for
      // an SRQ's receive too (rxe completes that one with REM_INV_REQ_ERR), so that a UC
      // QP never reports an error for a message its peer sent.
      c.recv_reuse = true;
      return uc_drop(qp, c, Conn::UcDrop::send, "message too long");
    }
    // RFC 5041 §7.3 "message too long"; the local receive fails with LOC_LEN_ERR.
    rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::too_long), RxBlame::peer, IBV_WC_LOC_LEN_ERR);
    return RxAction::dead;
  }
  c.place.kind = Placement::Kind::sgl;
  c.place.sge = c.cur_recv.sge;
  c.place.num_sge = c.cur_recv.num_sge;
  c.place.offset = s.mo;
  return RxAction::place;
}

// The data bytes a tagged segment places: its payload, or what its reference names.
uint32_t tagged_len(const wire::DdpSegment& s) {
  return s.sv_ref ? s.ref_len : s.payload_len;
}

// A segment by reference (kDdpSvRef): its data is read from the peer at the segment's end,
// into `place`, once the FPDU has passed its checks (iw_rx.cc).
void expect_ref(Conn& c) {
  if (!c.seg.sv_ref) return;
  c.ref_pending = true;
  c.ref_addr = c.seg.ref_addr;
  c.ref_len = c.seg.ref_len;
}

RxAction on_write(Qp* qp, Conn& c) {
  const auto& s = c.seg;
  c.place.kind = Placement::Kind::discard;
  const uint32_t len = tagged_len(s);
  if (len == 0) return RxAction::place;  // zero-length Write, e.g. the RTR
  AccessResult r = AccessResult::access_rights;
  std::byte* p = nullptr;
  if (qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) {
    auto& kt = KeyTable::get();
    auto g = kt.read_guard();
    r = kt.check(s.stag, qp->pd, s.to, len, IBV_ACCESS_REMOTE_WRITE, true, &p, qp);
  }
  if (r != AccessResult::ok) {
    SV_INFO("qp %u: write to stag %#x denied", qp->qpn(), s.stag);
    if (qp->uc) {
      // Still a guess at our STags: it counts against the peer's address (peer_guard.h).
      if (c.fd >= 0) peer_guard::protection_error(transport::peer_addr(c.fd));
      return uc_drop(qp, c, Conn::UcDrop::write, "write access denied");
    }
    rx_fail(qp, access_to_terminate(r, true), RxBlame::peer);
    return RxAction::dead;
  }
  c.place.kind = Placement::Kind::contiguous;
  c.place.ptr = p;
  c.write_len += len;
  expect_ref(c);
  return RxAction::place;
}

// Read and Atomic Requests share the IRQ, bounded by the IRD we advertised: one more is the
// peer ignoring its ORD (RFC 5040 §5.2 / siw: catastrophic), and is refused before it is
// executed. Called with tx_mu held; true if the QP was ended.
bool irq_overrun_locked(Qp* qp, Conn& c) {
  const uint32_t ird =
      std::min<uint32_t>(static_cast<uint32_t>(qp->irq.size()),
                         std::max<uint32_t>({qp->attr.max_dest_rd_atomic, c.ird, 1u}));
  if (qp->irq_count < ird) return false;
  tx_terminate_locked(qp, rdmap_catastrophic_term());
  qp->tx_mu.unlock();
  qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, true);
  qp->tx_mu.lock();
  return true;
}

RxAction on_read_request(Qp* qp, Conn& c) {
  const auto& s = c.seg;
  if (s.msn != c.rreq_msn) {
    rx_fail(qp, untagged_term(wire::DdpUntaggedEcode::msn_range), RxBlame::peer);
    return RxAction::dead;
  }
  const wire::ReadRequest rr = wire::decode_read_request(&c.hdr[2 + wire::kDdpUntaggedHdrLen]);
  AccessResult r = AccessResult::ok;
  std::byte* p = nullptr;
  if (rr.read_size) {
    r = AccessResult::access_rights;
    if (qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_READ) {
      auto& kt = KeyTable::get();
      auto g = kt.read_guard();
      r = kt.check(rr.source_stag, qp->pd, rr.source_to, rr.read_size, IBV_ACCESS_REMOTE_READ, true,
                   &p, qp);
    }
  }
  if (r != AccessResult::ok) {
    rx_fail(qp, access_to_terminate(r, false), RxBlame::peer);
    return RxAction::dead;
  }
  std::lock_guard lk(qp->tx_mu);
  if (irq_overrun_locked(qp, c)) return RxAction::dead;
  IrqEntry& e = qp->irq[(qp->irq_head + qp->irq_count) % qp->irq.size()];
  e = IrqEntry{};
  e.sink_stag = rr.sink_stag;
  e.sink_to = rr.sink_to;
  e.src = p;
  e.src_stag = rr.source_stag;
  e.src_to = rr.source_to;
  e.length = rr.read_size;
  ++qp->irq_count;
  ++c.rreq_msn;
  c.place.kind = Placement::Kind::discard;
  return RxAction::place;
}

RxAction on_atomic_request(Qp* qp, Conn& c) {
  const auto& s = c.seg;
  if (!c.peer_sv || s.msn != c.rreq_msn) {
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
    return RxAction::dead;
  }
  wire::AtomicRequest ar;
  if (!wire::decode_atomic_request(&c.hdr[2 + wire::kDdpUntaggedHdrLen], ar)) {
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
    return RxAction::dead;
  }
  if (ar.to & 7) {
    // Misaligned target: an invalid request (IB spec o10-31 / C9-40 analogue).
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::catastrophic_stream), RxBlame::peer);
    return RxAction::dead;
  }
  {
    std::lock_guard lk(qp->tx_mu);  // only this thread adds to the IRQ: room stays
    if (irq_overrun_locked(qp, c)) return RxAction::dead;
  }
  AccessResult r = AccessResult::access_rights;
  std::byte* p = nullptr;
  auto& kt = KeyTable::get();
  auto g = kt.read_guard();
  if (qp->attr.qp_access_flags & IBV_ACCESS_REMOTE_ATOMIC)
    r = kt.check(ar.stag, qp->pd, ar.to, 8, IBV_ACCESS_REMOTE_ATOMIC, true, &p, qp);
  if (r != AccessResult::ok) {
    g.unlock();
    rx_fail(qp, access_to_terminate(r, false), RxBlame::peer);
    return RxAction::dead;
  }
  const uint64_t orig = app_atomic(reinterpret_cast<uint64_t*>(p), ar);
  g.unlock();
  std::lock_guard lk(qp->tx_mu);
  IrqEntry& e = qp->irq[(qp->irq_head + qp->irq_count) % qp->irq.size()];
  e = IrqEntry{};
  e.atomic = true;
  e.aresp = wire::AtomicResponse{ar.req_id, orig};
  ++qp->irq_count;
  ++c.rreq_msn;
  c.place.kind = Placement::Kind::discard;
  return RxAction::place;
}

RxAction on_read_response(Qp* qp, Conn& c) {
  const auto& s = c.seg;
  std::lock_guard lk(qp->tx_mu);
  SendWqe* w = oldest_awaiting(qp, false);
  const uint32_t sink_stag = w && w->num_sge ? w->sge[0].lkey : 0;
  const uint64_t sink_to = w && w->num_sge ? w->sge[0].addr : 0;
  const uint32_t len = tagged_len(s);
  // RFC 5040 §4.5: the response targets exactly the Sink STag/TO we asked for, in order.
  if (!w || (len && s.stag != sink_stag) || s.to != sink_to + w->resp_bytes ||
      static_cast<uint64_t>(w->resp_bytes) + len > w->length) {
    // A response we did not ask for is a tagged placement error (RFC 5041 §7.2).
    SV_INFO("qp %u: read response stag %#x to %#llx len %u, expected stag %#x to %#llx of %u",
            qp->qpn(), s.stag, static_cast<unsigned long long>(s.to), len, sink_stag,
            static_cast<unsigned long long>(sink_to + (w ? w->resp_bytes : 0)), w ? w->length : 0);
    tx_terminate_locked(
        qp,
        access_to_terminate(
            !w || s.stag != sink_stag ? AccessResult::invalid_key : AccessResult::bounds, true));
    qp->tx_mu.unlock();
    qp_set_error(qp, IBV_WC_BAD_RESP_ERR, true);
    qp->tx_mu.lock();
    return RxAction::dead;
  }
  c.place.kind = Placement::Kind::sgl;
  c.place.sge = w->sge;
  c.place.num_sge = w->num_sge;
  c.place.offset = w->resp_bytes;
  w->resp_bytes += len;
  expect_ref(c);
  return RxAction::place;
}

RxAction on_atomic_response(Qp* qp, Conn& c) {
  const wire::AtomicResponse ar =
      wire::decode_atomic_response(&c.hdr[2 + wire::kDdpUntaggedHdrLen]);
  std::lock_guard lk(qp->tx_mu);
  SendWqe* w = oldest_awaiting(qp, true);
  if (!w || w->msn != ar.req_id) {
    qp->tx_mu.unlock();
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::response);
    qp->tx_mu.lock();
    return RxAction::dead;
  }
  // The original value lands in the local buffer in host order, as on IB HCAs.
  copy_to_app(reinterpret_cast<std::byte*>(w->sge[0].addr),
              reinterpret_cast<const std::byte*>(&ar.original), 8);
  w->state = WqeState::done;
  --qp->orq_used;
  c.place.kind = Placement::Kind::discard;
  return RxAction::place;
}

// A message of the peer's ULP placed: it counts toward the Placement Ack (units_rx) and makes
// our next post an answer that doorbell batching does not hold (rx_turns).
void count_peer_message(Qp* qp, Conn& c) {
  ++c.units_rx;
  qp->rx_turns.fetch_add(1, std::memory_order_relaxed);
}

RxAction on_imm(Qp* qp, Conn& c) {
  const auto& s = c.seg;
  if (!c.peer_sv || s.msn != c.recv_msn) {
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
    return RxAction::dead;
  }
  const std::byte* body = &c.hdr[2 + wire::kDdpUntaggedHdrLen];
  uint32_t imm;
  std::memcpy(&imm, body, 4);  // stays big-endian, as ibv_wc.imm_data is
  const bool attached = wire::load_be32(body + 4) == kSvImmAttached;
  const unsigned se = s.opcode == RdmapOpcode::imm_data_se ? (1u << 31) : 0;
  if (attached) {
    if (!c.imm_pending) {
      rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
      return RxAction::dead;
    }
    c.imm_pending = false;
    complete_recv(qp, c.imm_recv, IBV_WC_SUCCESS, c.imm_len, IBV_WC_RECV, IBV_WC_WITH_IMM | se, imm,
                  0);
  } else {
    RecvWqe w;
    if (!take_recv(qp, w, c.tmp_sge)) {
      if (!qp->uc) return RxAction::stall;
      // The Write with Immediate is dropped whole; its data may have landed (IB leaves the
      // target's contents undefined for a dropped message).
      ++c.recv_msn;
      c.last_write_len = 0;
      return uc_drop(qp, c, Conn::UcDrop::none, "no receive posted for immediate data");
    }
    // byte_len is the Write's length, as rxe and mlx5 report (ibv_poll_cq(3)).
    complete_recv(qp, w, IBV_WC_SUCCESS, c.last_write_len, IBV_WC_RECV_RDMA_WITH_IMM,
                  IBV_WC_WITH_IMM | se, imm, 0);
    c.last_write_len = 0;
  }
  ++c.recv_msn;
  count_peer_message(qp, c);
  c.ack_requested |= s.sv_ack_req;
  c.place.kind = Placement::Kind::discard;
  return RxAction::place;
}

// tx_mu held: the peer has placed our messages up to count n. False for a count of
// messages we never sent, or one going backwards: a broken or hostile peer.
bool take_ack_locked(Qp* qp, uint32_t n) {
  Conn& c = qp->conn;
  if (!c.wait_acks || static_cast<int32_t>(n - c.peer_acked) < 0 ||
      static_cast<int32_t>(c.units_tx - n) < 0) {
    SV_WARN("qp %u: bad Placement Ack %u (had %u, sent %u)", qp->qpn(), n, c.peer_acked,
            c.units_tx);
    return false;
  }
  c.peer_acked = n;
  return true;
}

// A stashed ack nobody has folded in yet: taken as soon as tx_mu is free, without waiting
// for it (the holder folds it first if it finishes a batch meanwhile). Retried after 20 us,
// doubling up to 1 ms: tx_mu may be held for a Terminate's drain (200 ms).
void fold_later(QpRef ref, uint32_t delay_us = 20) {
  if (!ref.live()) return;
  Qp* qp = ref.get();
  if (!qp->ack_stashed.load(std::memory_order_acquire)) return;
  if (!qp->tx_mu.try_lock()) {
    Progress::get().post_after(std::chrono::microseconds(delay_us),
                               [ref = std::move(ref), delay_us]() mutable {
                                 fold_later(std::move(ref), std::min(delay_us * 2, 1000u));
                               });
    return;
  }
  complete_sq_locked(qp);  // folds it
  qp->tx_mu.unlock();
}

// The peer has placed our messages up to a count: their WQEs may complete. A thread that
// holds tx_mu is writing to the socket (a 1 MiB Write's sendmsg runs for a millisecond),
// and the ack is not worth waiting for: its count is left for that thread
// (Qp::ack_stash). Waiting, the two threads took turns on the socket: a 1 MiB stream's
// sender made twice RFC 5040's sendmsg calls and 14 times its futex calls.
RxAction on_sv_ack(Qp* qp, Conn& c) {
  const uint32_t n = c.seg.msn;
  c.place.kind = Placement::Kind::discard;
  std::unique_lock lk(qp->tx_mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    qp->ack_stash.store(n, std::memory_order_relaxed);
    qp->ack_stashed.store(true, std::memory_order_release);
    Progress::get().post([ref = QpRef(qp)]() mutable { fold_later(std::move(ref)); });
    return RxAction::place;
  }
  fold_stashed_ack_locked(qp);  // an older one first: counts only go forward
  if (!take_ack_locked(qp, n)) {
    lk.unlock();  // rx_fail takes tx_mu to send its Terminate
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
    return RxAction::dead;
  }
  complete_sq_locked(qp);
  return RxAction::place;
}

}  // namespace

void fold_stashed_ack_locked(Qp* qp) {
  // exchange: the flag's latest store is the one we take, with the count stored before it;
  // a newer count whose flag comes after stays flagged for a later fold (its reader's task).
  // A load first: this runs at every look at the SQ's completions, and an exchange is a
  // locked instruction (it waits for the ring's bytes stored before it to reach the peer).
  if (!qp->ack_stashed.load(std::memory_order_relaxed) ||
      !qp->ack_stashed.exchange(false, std::memory_order_acq_rel))
    return;
  const uint32_t n = qp->ack_stash.load(std::memory_order_relaxed);
  if (take_ack_locked(qp, n)) return;
  // tx_mu is ours, and rx_fail takes it: the Terminate goes from the progress thread, as
  // the RNR timer's does.
  Progress::get().post([ref = QpRef(qp)] {
    if (!ref.live()) return;
    Qp* qp = ref.get();
    std::lock_guard lk(qp->rx_mu);
    if (qp->state.load() == IBV_QPS_ERR) return;
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
  });
}

void rx_fail(Qp* qp, const Terminate& t, RxBlame blame, ibv_wc_status recv_status) {
  Conn& c = qp->conn;
  const bool remote_access = terminate_to_wc_status(t) == IBV_WC_REM_ACCESS_ERR;
  // A remote access error is the peer guessing (or misusing) our STags: it counts against
  // its address, and enough of them keep it from reconnecting for a while (peer_guard.h).
  if (remote_access && c.fd >= 0) peer_guard::protection_error(transport::peer_addr(c.fd));
  {
    std::lock_guard lk(qp->tx_mu);
    // What was placed before this is acked ahead of the Terminate (softverbs peers).
    if (c.send_acks) c.ack_to_send = c.units_rx;
    tx_terminate_locked(qp, t);
  }
  qp->rx_stalled = true;
  // An access violation here (a peer's bad STag, bounds or rights; our own receive buffer
  // failing its check) is the IB spec's Local Access Violation Work Queue Error (11.6.2):
  // IBV_EVENT_QP_ACCESS_ERR, as siw raises; anything else is QP_FATAL.
  const bool access = remote_access || recv_status == IBV_WC_LOC_PROT_ERR;
  const ibv_wc_status ours = blame == RxBlame::response ? IBV_WC_BAD_RESP_ERR
                             : blame == RxBlame::stream ? IBV_WC_RETRY_EXC_ERR
                                                        : IBV_WC_WR_FLUSH_ERR;
  qp_set_error(qp, ours, true, access ? IBV_EVENT_QP_ACCESS_ERR : IBV_EVENT_QP_FATAL, [&] {
    // The failed receive completes once the QP is in ERR, ahead of the flush: a poller that
    // sees its status and queries the QP finds ERR (siw moves the QP before it reports the
    // WQE).
    if (!c.have_recv) return;
    complete_recv(qp, c.cur_recv, recv_status, 0, IBV_WC_RECV, 0, 0, 0);
    c.have_recv = false;
  });
}

RxAction rx_on_header(Qp* qp) {
  Conn& c = qp->conn;
  if (qp->state.load() == IBV_QPS_ERR) return RxAction::dead;
  c.ref_pending = false;
  if (c.seg.sv_ref && !(qp->rx_ring.load(std::memory_order_relaxed) && c.shm && c.shm->we_pull))
      [[unlikely]] {
    // A reference we never agreed to take (over TCP, or from a peer whose memory we cannot
    // read): no such opcode here.
    SV_WARN("qp %u: a segment by reference, not agreed", qp->qpn());
    rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
    return RxAction::dead;
  }
  if (uc_dropping(c)) {
    c.place.kind = Placement::Kind::discard;
    return RxAction::place;
  }
  if (c.uc_drop_imm) {
    // Right behind a dropped Send or Write: its Immediate Data is part of it.
    c.uc_drop_imm = false;
    const bool imm =
        c.seg.opcode == RdmapOpcode::imm_data || c.seg.opcode == RdmapOpcode::imm_data_se;
    if (imm && c.seg.msn == c.recv_msn) {
      ++c.recv_msn;
      c.place.kind = Placement::Kind::discard;
      return RxAction::place;
    }
  }
  switch (c.seg.opcode) {
    case RdmapOpcode::send:
    case RdmapOpcode::send_inv:
    case RdmapOpcode::send_se:
    case RdmapOpcode::send_se_inv:
      return on_send(qp, c);
    case RdmapOpcode::rdma_write:
      return on_write(qp, c);
    case RdmapOpcode::read_request:
      return on_read_request(qp, c);
    case RdmapOpcode::read_response:
      return on_read_response(qp, c);
    case RdmapOpcode::atomic_request:
      return on_atomic_request(qp, c);
    case RdmapOpcode::atomic_response:
      return on_atomic_response(qp, c);
    case RdmapOpcode::imm_data:
    case RdmapOpcode::imm_data_se:
      return on_imm(qp, c);
    case RdmapOpcode::sv_ack:
      return on_sv_ack(qp, c);
    case RdmapOpcode::sv_shm: {
      c.place.kind = Placement::Kind::discard;
      const char* why = nullptr;
      if (!shm_on_ctrl(qp, &why)) {
        SV_WARN("qp %u: shared-memory control message refused: %s", qp->qpn(), why);
        rx_fail(qp, rdmap_op_term(wire::RdmapEcode::unexpected_opcode), RxBlame::peer);
        return RxAction::dead;
      }
      return RxAction::place;
    }
    case RdmapOpcode::terminate: {
      const Terminate t = wire::decode_terminate(&c.hdr[2 + wire::kDdpUntaggedHdrLen]);
      SV_INFO("qp %u: Terminate layer %d etype %d ecode %#x", qp->qpn(), int(t.layer), t.etype,
              t.ecode);
      if (c.have_recv) {
        complete_recv(qp, c.cur_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
        c.have_recv = false;
      }
      qp->rx_stalled = true;
      bool head_is_atomic;
      {
        std::lock_guard lk(qp->tx_mu);
        const SendWqe* w = oldest_awaiting(qp, true);
        head_is_atomic = w && qp->sq_count && w == &qp->sq[qp->sq_head & (qp->cap.max_send_wr - 1)];
      }
      qp_set_error(qp, terminate_to_wc_status(t, head_is_atomic), true);
      return RxAction::dead;
    }
  }
  return RxAction::dead;
}

bool rx_on_segment_end(Qp* qp) {
  Conn& c = qp->conn;
  const auto& s = c.seg;
  if (uc_dropping(c)) {
    if (!s.last) return true;
    // The dropped message is over. A Send's MSN is used up; an Immediate Data message right
    // behind it (Send with Immediate) or behind a Write (Write with Immediate) goes too.
    if (c.uc_drop == Conn::UcDrop::send) {
      ++c.recv_msn;
      c.uc_drop_imm = c.peer_sv && s.rsvd_ulp == kSvImmFollows;
    } else {
      c.uc_drop_imm = true;
      c.write_len = 0;
    }
    c.uc_drop = Conn::UcDrop::none;
    return true;
  }
  switch (s.opcode) {
    case RdmapOpcode::send:
    case RdmapOpcode::send_inv:
    case RdmapOpcode::send_se:
    case RdmapOpcode::send_se_inv: {
      if (!s.last) return true;
      const bool inv = s.opcode == RdmapOpcode::send_inv || s.opcode == RdmapOpcode::send_se_inv;
      const unsigned se = (s.opcode == RdmapOpcode::send_se || s.opcode == RdmapOpcode::send_se_inv)
                              ? (1u << 31)
                              : 0;
      const uint32_t len = c.place.offset;
      if (inv && !KeyTable::get().invalidate(qp, qp->pd, s.rsvd_ulp)) {
        // RFC 5040 §7.2 "STag cannot be invalidated" (siw's Terminate too); the receive
        // completes with IBV_WC_REM_INV_REQ_ERR, as on rxe and siw (IB class J).
        SV_INFO("qp %u: Send with Invalidate of stag %#x refused", qp->qpn(), s.rsvd_ulp);
        rx_fail(qp, rdmap_prot_term(wire::RdmapEcode::cannot_invalidate), RxBlame::peer,
                IBV_WC_REM_INV_REQ_ERR);
        return false;
      }
      c.have_recv = false;
      ++c.recv_msn;
      count_peer_message(qp, c);
      c.ack_requested |= s.sv_ack_req;
      if (!inv && c.peer_sv && s.rsvd_ulp == kSvImmFollows) {
        // The Immediate Data message right behind completes this receive.
        c.imm_pending = true;
        c.imm_recv = c.cur_recv;
        c.imm_sge = c.cur_sge;
        c.imm_recv.sge = c.imm_sge.data();
        c.imm_len = len;
        return true;
      }
      complete_recv(qp, c.cur_recv, IBV_WC_SUCCESS, len, IBV_WC_RECV,
                    (inv ? IBV_WC_WITH_INV : 0) | se, 0, inv ? s.rsvd_ulp : 0);
      return true;
    }
    case RdmapOpcode::rdma_write:
      if (s.last) {
        c.last_write_len = c.write_len;
        c.write_len = 0;
        if (!c.expect_rtr) count_peer_message(qp, c);  // the RTR is no message of the peer's ULP
        c.ack_requested |= s.sv_ack_req;
      }
      return true;
    case RdmapOpcode::read_response: {
      if (!s.last) return true;
      qp->rx_turns.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lk(qp->tx_mu);
      SendWqe* w = oldest_awaiting(qp, false);
      if (w) {
        w->state = WqeState::done;
        --qp->orq_used;
      }
      tx_run_locked(qp);  // ORD/fence may have held the SQ
      return true;
    }
    case RdmapOpcode::atomic_response:
      qp->rx_turns.fetch_add(1, std::memory_order_relaxed);
      [[fallthrough]];
    case RdmapOpcode::read_request:
    case RdmapOpcode::atomic_request: {
      std::lock_guard lk(qp->tx_mu);
      tx_run_locked(qp);
      return true;
    }
    default:
      return true;
  }
}

}  // namespace sv::engine
