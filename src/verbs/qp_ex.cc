// ibv_create_qp_ex and the ibv_wr_* API (man ibv_wr_post(3)): work requests built between
// ibv_wr_start and ibv_wr_complete and posted as one batch, all or nothing ("no work is
// executed to the queue until ibv_wr_complete() returns success"). Each builder starts a WR
// with the QP's wr_id and wr_flags; the setters give it data. A misuse (a setter with no WR,
// too many SGEs, inline data beyond max_inline_data) is remembered and reported by
// ibv_wr_complete as EINVAL, nothing posted, as providers report at completion.
#include "verbs/qp_ex.h"

#include <cerrno>
#include <cstring>

#include "engine/qp.h"
#include "verbs/handles.h"

namespace sv::verbs {

using engine::Qp;
using engine::WrBatch;

namespace {

// What softverbs executes: every RC opcode of ibv_post_send, memory window binds and local
// invalidation included. TSO and ATOMIC_WRITE are refused at creation with EOPNOTSUPP.
constexpr uint64_t kSupportedSendOps =
    IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
    IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_BIND_MW |
    IBV_QP_EX_WITH_LOCAL_INV;
// What a UD QP carries (engine/qp_ud.cc): Sends, each addressed by ibv_wr_set_ud_addr.
constexpr uint64_t kSupportedUdSendOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
// UC: RC's, less the operations that need the responder's answer (Read, Atomics).
constexpr uint64_t kSupportedUcSendOps =
    kSupportedSendOps & ~(IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                          IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);

Qp* of(ibv_qp_ex* q) {
  return reinterpret_cast<Qp*>(q);
}
WrBatch& batch(ibv_qp_ex* q) {
  return *of(q)->wr_batch;
}

ibv_send_wr& begin(ibv_qp_ex* q, ibv_wr_opcode op) {
  WrBatch& b = batch(q);
  ibv_send_wr w{};
  w.wr_id = q->wr_id;
  w.send_flags = q->wr_flags;
  w.opcode = op;
  b.wrs.push_back(w);
  b.first_sge.push_back(static_cast<uint32_t>(b.sges.size()));
  return b.wrs.back();
}

void wr_start(ibv_qp_ex* q) {
  WrBatch& b = batch(q);
  b.wrs.clear();
  b.first_sge.clear();
  b.sges.clear();
  b.inline_data.clear();
  b.err = 0;
}

void wr_abort(ibv_qp_ex* q) {
  wr_start(q);  // discards the batch
}

int wr_complete(ibv_qp_ex* q) {
  WrBatch& b = batch(q);
  if (b.err || b.wrs.empty()) {
    const int e = b.err;
    wr_start(q);
    return e;
  }
  for (size_t i = 0; i < b.wrs.size(); ++i) {
    ibv_send_wr& w = b.wrs[i];
    w.next = i + 1 < b.wrs.size() ? &b.wrs[i + 1] : nullptr;
    w.sg_list = w.num_sge ? &b.sges[b.first_sge[i]] : nullptr;
    if (w.send_flags & IBV_SEND_INLINE)
      for (int k = 0; k < w.num_sge; ++k) {
        ibv_sge& s = b.sges[b.first_sge[i] + k];
        s.addr = reinterpret_cast<uintptr_t>(b.inline_data.data()) + s.addr;
      }
  }
  ibv_send_wr* bad = nullptr;
  const int r = engine::qp_post_send(of(q), b.wrs.data(), &bad, true);
  wr_start(q);
  return r;
}

void wr_send(ibv_qp_ex* q) {
  begin(q, IBV_WR_SEND);
}
void wr_send_imm(ibv_qp_ex* q, __be32 imm) {
  begin(q, IBV_WR_SEND_WITH_IMM).imm_data = imm;
}
void wr_send_inv(ibv_qp_ex* q, uint32_t rkey) {
  begin(q, IBV_WR_SEND_WITH_INV).invalidate_rkey = rkey;
}
void wr_rdma_write(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  ibv_send_wr& w = begin(q, IBV_WR_RDMA_WRITE);
  w.wr.rdma = {addr, rkey};
}
void wr_rdma_write_imm(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, __be32 imm) {
  ibv_send_wr& w = begin(q, IBV_WR_RDMA_WRITE_WITH_IMM);
  w.wr.rdma = {addr, rkey};
  w.imm_data = imm;
}
void wr_rdma_read(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  ibv_send_wr& w = begin(q, IBV_WR_RDMA_READ);
  w.wr.rdma = {addr, rkey};
}
void wr_atomic_cmp_swp(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, uint64_t compare,
                       uint64_t swap) {
  ibv_send_wr& w = begin(q, IBV_WR_ATOMIC_CMP_AND_SWP);
  w.wr.atomic = {addr, compare, swap, rkey};
}
void wr_atomic_fetch_add(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, uint64_t add) {
  ibv_send_wr& w = begin(q, IBV_WR_ATOMIC_FETCH_AND_ADD);
  w.wr.atomic = {addr, add, 0, rkey};
}
void wr_bind_mw(ibv_qp_ex* q, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  ibv_send_wr& w = begin(q, IBV_WR_BIND_MW);
  if (!info) {
    batch(q).err = EINVAL;
    return;
  }
  w.bind_mw.mw = mw;
  w.bind_mw.rkey = rkey;
  w.bind_mw.bind_info = *info;
}
void wr_local_inv(ibv_qp_ex* q, uint32_t rkey) {
  begin(q, IBV_WR_LOCAL_INV).invalidate_rkey = rkey;
}

// The current WR for a data setter, or null (and the batch fails) if there is none or it
// already has its data.
ibv_send_wr* data_target(ibv_qp_ex* q) {
  WrBatch& b = batch(q);
  if (b.wrs.empty() || b.wrs.back().num_sge || (b.wrs.back().send_flags & IBV_SEND_INLINE)) {
    b.err = EINVAL;
    return nullptr;
  }
  return &b.wrs.back();
}

void wr_set_sge_list(ibv_qp_ex* q, size_t n, const ibv_sge* list) {
  ibv_send_wr* w = data_target(q);
  if (!w) return;
  WrBatch& b = batch(q);
  if (n > of(q)->cap.max_send_sge || (n && !list)) {
    b.err = EINVAL;
    return;
  }
  b.sges.insert(b.sges.end(), list, list + n);
  w->num_sge = static_cast<int>(n);
}

void wr_set_sge(ibv_qp_ex* q, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge s{addr, length, lkey};
  wr_set_sge_list(q, 1, &s);
}

// Copies the data now (the caller may reuse its buffers when the setter returns).
void wr_set_inline_data_list(ibv_qp_ex* q, size_t n, const ibv_data_buf* bufs) {
  ibv_send_wr* w = data_target(q);
  if (!w) return;
  WrBatch& b = batch(q);
  const ibv_wr_opcode op = w->opcode;
  size_t len = 0;
  for (size_t i = 0; i < n; ++i) len += bufs[i].length;
  if ((op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM && op != IBV_WR_SEND_WITH_INV &&
       op != IBV_WR_RDMA_WRITE && op != IBV_WR_RDMA_WRITE_WITH_IMM) ||
      len > of(q)->cap.max_inline_data || (n && !bufs)) {
    b.err = EINVAL;
    return;
  }
  const size_t off = b.inline_data.size();
  b.inline_data.resize(off + len);
  size_t at = off;
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i].length) std::memcpy(b.inline_data.data() + at, bufs[i].addr, bufs[i].length);
    at += bufs[i].length;
  }
  b.sges.push_back(ibv_sge{off, static_cast<uint32_t>(len), 0});  // addr: offset until complete
  w->num_sge = 1;
  w->send_flags |= IBV_SEND_INLINE;
}

void wr_set_inline_data(ibv_qp_ex* q, void* addr, size_t length) {
  const ibv_data_buf d{addr, length};
  wr_set_inline_data_list(q, 1, &d);
}

// The current WR's destination (UD QPs; on RC it is a misuse).
void wr_set_ud_addr(ibv_qp_ex* q, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  WrBatch& b = batch(q);
  if (!of(q)->ud || b.wrs.empty() || !ah) {
    b.err = EINVAL;
    return;
  }
  b.wrs.back().wr.ud = {ah, remote_qpn, remote_qkey};
}

// Builders and setters for what this QP cannot do (never requested: creation refuses them).
void fail_batch(ibv_qp_ex* q) {
  batch(q).err = EOPNOTSUPP;
}
void wr_send_tso(ibv_qp_ex* q, void*, uint16_t, uint16_t) {
  fail_batch(q);
}
void wr_set_xrc_srqn(ibv_qp_ex* q, uint32_t) {
  fail_batch(q);
}
void wr_atomic_write(ibv_qp_ex* q, uint32_t, uint64_t, const void*) {
  fail_batch(q);
}

}  // namespace

ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr) {
  if (!attr || !handle_ok(HKind::context, ctx)) {
    errno = EINVAL;
    return nullptr;
  }
  // CREATE_FLAGS with no flag asks for nothing: taken (rdma-core's tests set the mask with
  // flags 0 on every device but mlx4/mlx5). Any flag is refused, as rxe_create_qp does.
  constexpr uint32_t kSupportedMask =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  if (attr->comp_mask & ~kSupportedMask ||
      ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags)) {
    errno = EOPNOTSUPP;  // XRC domains, any create flag, TSO, RSS: not offered
    return nullptr;
  }
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    errno = EINVAL;
    return nullptr;
  }
  if (const int e = handle_check(HKind::pd, attr->pd, ctx)) {
    errno = e;
    return nullptr;
  }
  const bool ex = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  const uint64_t ops = attr->qp_type == IBV_QPT_RC   ? kSupportedSendOps
                       : attr->qp_type == IBV_QPT_UC ? kSupportedUcSendOps
                       : attr->qp_type == IBV_QPT_UD ? kSupportedUdSendOps
                                                     : 0;
  if (ex && (attr->send_ops_flags & ~ops || !ops)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_qp_init_attr init{};
  init.qp_context = attr->qp_context;
  init.send_cq = attr->send_cq;
  init.recv_cq = attr->recv_cq;
  init.srq = attr->srq;
  init.cap = attr->cap;
  init.qp_type = attr->qp_type;
  init.sq_sig_all = attr->sq_sig_all;
  ibv_qp* ibqp = qp_new(attr->pd, &init);
  if (!ibqp) return nullptr;
  attr->cap = init.cap;
  if (!ex) return ibqp;
  Qp* qp = Qp::from(ibqp);
  qp->wr_batch = std::make_unique<WrBatch>();
  ibv_qp_ex& x = qp->qpx;
  x.comp_mask = 0;
  x.wr_id = 0;
  x.wr_flags = 0;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
  return ibqp;
}

}  // namespace sv::verbs
