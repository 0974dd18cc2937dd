// Completer: retires send WQEs in order (IB spec 10.8.5: completions are returned in the
// order WQEs were posted) and writes receive completions.
#include <algorithm>

#include "engine/qp.h"

namespace sv::engine {
namespace {

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    default:
      return IBV_WC_SEND;
  }
}

void push_cq(Qp* qp, Cq* cq, const ibv_wc& wc, bool solicited) {
  stats::count_wc(qp->stats, wc.status);
  if (!cq->push(wc, solicited)) {
    ibv_async_event ev{};
    ev.element.cq = cq->ibcq();
    ev.event_type = IBV_EVENT_CQ_ERR;
    qp->ctx->post_async(ev);
  }
}

void complete_send(Qp* qp, const SendWqe& w, ibv_wc_status st) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = st;
  wc.opcode = wc_opcode(w.opcode);
  wc.qp_num = qp->qpn();
  if (st == IBV_WC_SUCCESS) {
    if (w.opcode == IBV_WR_RDMA_READ)
      wc.byte_len = w.length;
    else if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
      wc.byte_len = 8;
    else
      wc.byte_len = w.length;
  }
  push_cq(qp, qp->scq, wc, false);
}

// During an RNR stall (Conn::acks_unseen) on shared memory, a WR completes once the peer's
// count of placed messages in the segment covers it: IB's ACK does not queue behind the
// responder's own requests, nor does this; and a Write the peer reads from our memory
// (SendWqe::by_ref) could not complete on transmit.
bool placed_in_shm(const Conn& c, const SendWqe& w) {
  return static_cast<int32_t>(c.shm->tx.peer_placed() - w.ack_seq) >= 0;
}

}  // namespace

void complete_sq_locked(Qp* qp) {
  fold_stashed_ack_locked(qp);
  const uint32_t mask = qp->cap.max_send_wr - 1;
  while (qp->sq_count) {
    SendWqe& w = qp->sq[qp->sq_head & mask];
    // A Send or Write is complete when TCP has it (RFC 5040: iWARP has no ACKs) or, when we
    // asked a softverbs peer for Placement Acks, once its ack says it placed it (IB's rule),
    // unless our RX cannot read acks for now (Conn::acks_unseen): then on shared memory once
    // the peer's count there says it placed it, else on transmit.
    const Conn& c = qp->conn;
    const bool done = w.state == WqeState::done ||
                      (w.state == WqeState::sent && w.stream_end <= c.tx_sent &&
                       (!c.wait_acks || static_cast<int32_t>(c.peer_acked - w.ack_seq) >= 0 ||
                        (c.acks_unseen && (c.shm_placed ? placed_in_shm(c, w) : !w.by_ref))));
    if (!done) break;
    if (w.status != IBV_WC_SUCCESS) break;  // errors are completed by the flush
    if (w.signaled) complete_send(qp, w, IBV_WC_SUCCESS);
    ++qp->sq_head;
    --qp->sq_count;
    if (static_cast<int32_t>(qp->sq_tx - qp->sq_head) < 0) qp->sq_tx = qp->sq_head;
  }
  // On shared memory, WRs sent during an RNR stall complete on the peer's count in the
  // segment: nothing tells us when it moves, so a timer looks again until it covers them.
  if (qp->conn.acks_unseen) [[unlikely]]
    shm_watch_placed_locked(qp);
}

void flush_qp_locked(Qp* qp, ibv_wc_status first_status) {
  complete_sq_locked(qp);
  // The WRs below go back to the application, which may reuse their buffers, and the Read
  // Responses we framed are dropped: what our segments by reference name must no longer be
  // read (the peer checks after each read).
  if (qp->conn.shm && qp->tx_ring.load(std::memory_order_relaxed)) qp->conn.shm->tx.revoke();
  const uint32_t mask = qp->cap.max_send_wr - 1;
  // The cause goes to the WQE it belongs to: a remote access error can only come from
  // an RDMA Read/Write or atomic (a Send cannot provoke one), so it skips Sends; any
  // other cause goes to the oldest outstanding WQE.
  auto is_rdma = [](const SendWqe& w) {
    return w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
           w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
           w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  };
  uint32_t culprit = qp->sq_head;
  if (first_status == IBV_WC_REM_ACCESS_ERR) {
    for (uint32_t i = qp->sq_head; i != qp->sq_head + qp->sq_count; ++i)
      if (is_rdma(qp->sq[i & mask])) {
        culprit = i;
        break;
      }
  }
  while (qp->sq_count) {
    SendWqe& w = qp->sq[qp->sq_head & mask];
    ibv_wc_status st = IBV_WC_WR_FLUSH_ERR;
    if (w.status != IBV_WC_SUCCESS)
      st = w.status;
    else if (qp->sq_head == culprit && first_status != IBV_WC_WR_FLUSH_ERR)
      st = first_status;
    // Error completions are always generated, signaled or not.
    complete_send(qp, w, st);
    ++qp->sq_head;
    --qp->sq_count;
  }
  qp->sq_tx = qp->sq_head;
  qp->orq_used = 0;
  qp->irq_head = qp->irq_count = 0;
  if (!qp->srq) {
    std::lock_guard lk(qp->rq_mu);
    const uint32_t rmask = qp->cap.max_recv_wr - 1;
    while (qp->rq_count) {
      RecvWqe& r = qp->rq[qp->rq_head & rmask];
      complete_recv(qp, r, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
      ++qp->rq_head;
      --qp->rq_count;
    }
  }
}

void complete_recv(Qp* qp, const RecvWqe& w, ibv_wc_status st, uint32_t byte_len, ibv_wc_opcode op,
                   unsigned wc_flags, uint32_t imm, uint32_t inv) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = st == IBV_WC_SUCCESS ? byte_len : 0;
  wc.qp_num = qp->qpn();
  wc.src_qp = qp->attr.dest_qp_num;
  wc.wc_flags = wc_flags & ~(1u << 31);  // bit 31: solicited, internal only
  if (wc_flags & IBV_WC_WITH_IMM) wc.imm_data = imm;
  if (wc_flags & IBV_WC_WITH_INV) wc.invalidated_rkey = inv;
  push_cq(qp, qp->rcq, wc, (wc_flags & (1u << 31)) != 0);
}

void complete_recv_ud(Qp* qp, const RecvWqe& w, ibv_wc_status st, uint32_t byte_len,
                      uint32_t src_qp, bool imm, uint32_t imm_be, bool solicited, uint8_t l3_type) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = st;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qp->qpn();
  if (st == IBV_WC_SUCCESS) {
    wc.byte_len = byte_len;  // the GRH's 40 bytes included (IBA 11.4.1.1)
    wc.src_qp = src_qp;
    wc.wc_flags = IBV_WC_GRH | (imm ? IBV_WC_WITH_IMM : 0);
    if (imm) wc.imm_data = imm_be;
    wc.pkey_index = 0;
    // SL has no meaning for a RoCE receive; mlx5 reports the packet's L3 header type there
    // (PRM: 1 IPv6, 2 IPv4) and UCX's UD transport reads it to find the destination GID in
    // the GRH, so we do as mlx5 does.
    wc.sl = l3_type;
  }
  push_cq(qp, qp->rcq, wc, solicited);
}

}  // namespace sv::engine
