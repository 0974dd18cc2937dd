// Extended CQs (libibverbs' ibv_create_cq_ex, man ibv_create_cq_ex(3)): the same CQ as
// ibv_create_cq, polled one completion at a time through ibv_start_poll / ibv_next_poll /
// ibv_end_poll and the ibv_wc_read_* accessors. As in rdma-core's providers, a poll lock is
// held from a successful start_poll to end_poll (pollers of one CQ take turns), and an empty
// start_poll (ENOENT) returns without it. The ring's own lock is taken per completion only:
// the poller posts inside the window (ibv_rc_pingpong does), and posting may complete.
// Completion timestamps, when asked for, are taken when the completion is queued.
#include "verbs/cq_ex.h"

#include <time.h>

#include <cerrno>

#include "engine/busy_poll.h"
#include "verbs/handles.h"

namespace sv::verbs {

using engine::Cq;

namespace {

// rxe's set plus both timestamps; CVLAN, FLOW_TAG and TM_INFO describe hardware we lack.
constexpr uint64_t kSupportedWcFlags = uint64_t{IBV_WC_STANDARD_FLAGS} |
                                       uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
                                       uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK};

Cq* of(ibv_cq_ex* c) {
  return reinterpret_cast<Cq*>(c);
}

void make_current(ibv_cq_ex* c) {
  c->wr_id = of(c)->cur.wr_id;
  c->status = of(c)->cur.status;
}

int start_poll(ibv_cq_ex* c, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  Cq* cq = of(c);
  cq->lock_poll();
  if (cq->pop_current()) {
    cq_busy_poll_found(cq);
  } else {
    // As ibv_poll_cq: an empty CQ runs its QPs' receive path before saying so.
    drive_empty_cq(cq);
    if (!cq->pop_current()) {
      cq->unlock_poll();
      return ENOENT;
    }
    cq_busy_poll_found(cq);  // the pass's completions end the empty streak (op_poll_cq)
  }
  make_current(c);
  return 0;
}

int next_poll(ibv_cq_ex* c) {
  if (!of(c)->pop_current()) return ENOENT;
  make_current(c);
  return 0;
}

void end_poll(ibv_cq_ex* c) {
  of(c)->unlock_poll();
}

ibv_wc_opcode read_opcode(ibv_cq_ex* c) {
  return of(c)->cur.opcode;
}
uint32_t read_vendor_err(ibv_cq_ex* c) {
  return of(c)->cur.vendor_err;
}
uint32_t read_byte_len(ibv_cq_ex* c) {
  return of(c)->cur.byte_len;
}
__be32 read_imm_data(ibv_cq_ex* c) {
  return of(c)->cur.imm_data;
}
uint32_t read_qp_num(ibv_cq_ex* c) {
  return of(c)->cur.qp_num;
}
uint32_t read_src_qp(ibv_cq_ex* c) {
  return of(c)->cur.src_qp;
}
unsigned int read_wc_flags(ibv_cq_ex* c) {
  return of(c)->cur.wc_flags;
}
uint32_t read_slid(ibv_cq_ex* c) {
  return of(c)->cur.slid;
}
uint8_t read_sl(ibv_cq_ex* c) {
  return of(c)->cur.sl;
}
uint8_t read_dlid_path_bits(ibv_cq_ex* c) {
  return of(c)->cur.dlid_path_bits;
}
uint64_t read_completion_ts(ibv_cq_ex* c) {
  return of(c)->cur_ts;
}
uint64_t read_completion_wallclock_ns(ibv_cq_ex* c) {
  return of(c)->cur_wall;
}

}  // namespace

ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  if (!attr) {
    errno = EINVAL;
    return nullptr;
  }
  // A parent domain (IBV_CQ_INIT_ATTR_MASK_PD) and flags other than the single-threaded hint
  // are not supported (rxe answers the same).
  if (attr->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS) ||
      ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
       (attr->flags & ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED))) ||
      (attr->wc_flags & ~kSupportedWcFlags)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  Cq* cq = cq_new(ctx, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                  static_cast<int>(attr->comp_vector));
  if (!cq) return nullptr;
  if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) cq->ts.resize(cq->ring.size());
  if (attr->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)
    cq->wall.resize(cq->ring.size());
  ibv_cq_ex& c = cq->cqx;
  c.comp_mask = 0;
  c.start_poll = start_poll;
  c.next_poll = next_poll;
  c.end_poll = end_poll;
  c.read_opcode = read_opcode;
  c.read_vendor_err = read_vendor_err;
  c.read_byte_len = read_byte_len;
  c.read_imm_data = read_imm_data;
  c.read_qp_num = read_qp_num;
  c.read_src_qp = read_src_qp;
  c.read_wc_flags = read_wc_flags;
  c.read_slid = read_slid;
  c.read_sl = read_sl;
  c.read_dlid_path_bits = read_dlid_path_bits;
  c.read_completion_ts = read_completion_ts;
  c.read_completion_wallclock_ns = read_completion_wallclock_ns;
  handle_add(HKind::cq, cq->ibcq(), ctx);
  return &c;
}

// ibv_query_rt_values_ex: the HCA clock now, in the units of read_completion_ts (as mlx5,
// the raw value in tv_nsec).
int query_rt_values(ibv_context* ctx, ibv_values_ex* values) {
  if (!handle_ok(HKind::context, ctx) || !values) return EINVAL;
  if (values->comp_mask & ~static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK)) return EOPNOTSUPP;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec =
        static_cast<long>(static_cast<uint64_t>(t.tv_sec) * 1000000000u + t.tv_nsec);
  }
  return 0;
}

}  // namespace sv::verbs
