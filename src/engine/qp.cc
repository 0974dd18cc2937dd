#include "engine/qp.h"

#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>
#include <vector>

#include "engine/app_memory.h"
#include "engine/busy_poll.h"
#include "engine/iw_cm.h"
#include "engine/log.h"
#include "util/clock.h"
#include "util/pages.h"
#include "util/settings.h"

namespace sv::engine {
namespace {

uint32_t round_up_pow2(uint32_t v) {
  uint32_t r = 1;
  while (r < v) r <<= 1;
  return r;
}

struct QpIo : Progress::Handler {
  Qp* qp;
  explicit QpIo(Qp* q) : qp(q) {}
  void on_event(uint32_t ev) override {
    // A busy poller owns the receive path: leave the bytes to it (NAPI busy poll).
    const bool to_poller =
        (ev & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) == 0 && (ev & EPOLLIN) && qp_busy_step_back(qp);
    if ((ev & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) && !to_poller) {
      std::lock_guard lk(qp->rx_mu);
      // On shared memory the socket holds doorbells (or says the peer is gone): take them,
      // then read the ring, where the bytes are.
      if (qp->rx_ring.load() && qp->conn.fd >= 0) shm_take_bells_locked(qp);
      if (qp->ud || qp->conn.fd >= 0) qp_rx_locked(qp);
    } else if ((ev & EPOLLIN) && to_poller && qp->tx_blocked && qp->rx_ring.load()) {
      // The poller owns the ring; the socket is watched for our full one. A bell taken here
      // may be the peer's for data too: what it announced is read now, or a thread asleep
      // on the CQ's wait set would find the socket empty and sleep on with bytes in the ring.
      std::lock_guard lk(qp->rx_mu);
      if (qp->conn.fd >= 0 && qp->conn.shm) {
        shm_take_bells_locked(qp);
        if (qp->conn.shm->rx.available() != 0) qp_rx_locked(qp);
      }
    }
    if (ev & EPOLLOUT) tx_kick(qp);
    qp_update_interest(qp);
  }
};

// IB spec 11.2.4.2 / the kernel's qp_state_table: attributes required and allowed per
// transition for RC. IBV_QP_STATE is always allowed; a transition to the current state does
// not require it (modify_qp with IBV_QP_ACCESS_FLAGS alone in RTS is RTS -> RTS).
struct Transition {
  bool valid;
  int required;
  int optional;
};

// The same table for UD (qp_state_table's IB_QPT_UD columns): a Q_Key instead of paths,
// PSNs, IRD/ORD and retry counts.
Transition transition_ud(ibv_qp_state cur, ibv_qp_state next) {
  constexpr int kS = IBV_QP_STATE;
  constexpr int kQ = IBV_QP_QKEY;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return {true, kS, 0};
  switch (cur) {
    case IBV_QPS_RESET:
      if (next == IBV_QPS_INIT) return {true, kS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | kQ, 0};
      break;
    case IBV_QPS_INIT:
      if (next == IBV_QPS_INIT) return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | kQ};
      if (next == IBV_QPS_RTR) return {true, kS, IBV_QP_PKEY_INDEX | kQ};
      break;
    case IBV_QPS_RTR:
      if (next == IBV_QPS_RTS) return {true, kS | IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | kQ};
      break;
    case IBV_QPS_RTS:
      if (next == IBV_QPS_RTS) return {true, 0, IBV_QP_CUR_STATE | kQ};
      if (next == IBV_QPS_SQD) return {true, kS, IBV_QP_EN_SQD_ASYNC_NOTIFY};
      break;
    case IBV_QPS_SQD:
      if (next == IBV_QPS_RTS) return {true, kS, IBV_QP_CUR_STATE | kQ};
      if (next == IBV_QPS_SQD) return {true, 0, IBV_QP_PKEY_INDEX | kQ};
      break;
    case IBV_QPS_SQE:
      if (next == IBV_QPS_RTS) return {true, kS, IBV_QP_CUR_STATE | kQ};
      break;
    default:
      break;
  }
  return {false, 0, 0};
}

Transition transition(ibv_qp_state cur, ibv_qp_state next) {
  constexpr int kS = IBV_QP_STATE;
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return {true, kS, 0};
  switch (cur) {
    case IBV_QPS_RESET:
      if (next == IBV_QPS_INIT)
        return {true, kS | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
      break;
    case IBV_QPS_INIT:
      if (next == IBV_QPS_INIT)
        return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
      if (next == IBV_QPS_RTR)
        return {true,
                kS | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
      break;
    case IBV_QPS_RTR:
      if (next == IBV_QPS_RTS)
        return {true,
                kS | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                    IBV_QP_MAX_QP_RD_ATOMIC,
                IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                    IBV_QP_PATH_MIG_STATE};
      break;
    case IBV_QPS_RTS:
      if (next == IBV_QPS_RTS)
        return {true, 0,
                IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                    IBV_QP_MIN_RNR_TIMER};
      if (next == IBV_QPS_SQD) return {true, kS, IBV_QP_EN_SQD_ASYNC_NOTIFY};
      break;
    case IBV_QPS_SQD:
      if (next == IBV_QPS_RTS)
        return {true, kS,
                IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                    IBV_QP_MIN_RNR_TIMER};
      if (next == IBV_QPS_SQD)
        return {true, 0,
                IBV_QP_AV | IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
                    IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_QP_RD_ATOMIC |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PKEY_INDEX | IBV_QP_TIMEOUT |
                    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY};
      break;
    case IBV_QPS_SQE:
      if (next == IBV_QPS_RTS) return {true, kS, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS};
      break;
    default:
      break;
  }
  return {false, 0, 0};
}

// UC's columns of the same table (qp_state_table, IB spec 11.2.4.2 table 91): RC's, less
// what only a reliable connection has: IRD/ORD, the RNR timer and the retry counts. Giving
// one of them is EINVAL, as ib_modify_qp_is_ok says for UC.
Transition transition_uc(ibv_qp_state cur, ibv_qp_state next) {
  constexpr int kRcOnly = IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
                          IBV_QP_MIN_RNR_TIMER | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY;
  Transition t = transition(cur, next);
  t.required &= ~kRcOnly;
  t.optional &= ~kRcOnly;
  return t;
}

constexpr int kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

void flush_all_at_exit();  // below, with doorbell batching

}  // namespace

Qp* qp_create(Context* ctx, Pd* pd, const ibv_qp_init_attr* init, int* err) {
  *err = EINVAL;
  if (!pd || !init || !init->send_cq || !init->recv_cq) return nullptr;
  if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC && init->qp_type != IBV_QPT_UD) {
    *err = EOPNOTSUPP;
    return nullptr;
  }
  const bool ud = init->qp_type == IBV_QPT_UD;
  const auto& c = init->cap;
  if (c.max_send_wr > static_cast<uint32_t>(kMaxQpWr) ||
      c.max_recv_wr > static_cast<uint32_t>(kMaxQpWr) ||
      c.max_send_sge > static_cast<uint32_t>(kMaxSge) ||
      c.max_recv_sge > static_cast<uint32_t>(kMaxSge) ||
      c.max_inline_data > static_cast<uint32_t>(kMaxInline))
    return nullptr;
  static const int at_exit = std::atexit(flush_all_at_exit);
  (void)at_exit;
  auto* qp = new Qp();
  qp->ctx = ctx;
  qp->pd = pd;
  qp->uc = init->qp_type == IBV_QPT_UC;
  qp->scq = Cq::from(init->send_cq);
  qp->rcq = Cq::from(init->recv_cq);
  qp->srq = init->srq ? reinterpret_cast<Srq*>(init->srq) : nullptr;
  qp->sq_sig_all = init->sq_sig_all;
  // Report what we really allocate, like providers do (rounded up).
  qp->cap.max_send_wr = std::max<uint32_t>(round_up_pow2(std::max<uint32_t>(c.max_send_wr, 1)), 1);
  qp->cap.max_recv_wr = qp->srq ? 0 : round_up_pow2(std::max<uint32_t>(c.max_recv_wr, 1));
  qp->cap.max_send_sge = std::max<uint32_t>(c.max_send_sge, 1);
  qp->cap.max_recv_sge = qp->srq ? 0 : std::max<uint32_t>(c.max_recv_sge, 1);
  qp->cap.max_inline_data = kMaxInline;
  qp->sq.resize(qp->cap.max_send_wr);
  // A slot's SGEs are pointed to when it is posted (qp_post_send).
  qp->sq_sge.allocate(static_cast<size_t>(qp->cap.max_send_wr) * qp->cap.max_send_sge);
  qp->sq_inline.allocate(static_cast<size_t>(qp->cap.max_send_wr) * kMaxInline);
  if (!qp->srq) {
    qp->rq.resize(qp->cap.max_recv_wr);
    qp->rq_sge.resize(static_cast<size_t>(qp->cap.max_recv_wr) * qp->cap.max_recv_sge);
    for (uint32_t i = 0; i < qp->cap.max_recv_wr; ++i)
      qp->rq[i].sge = &qp->rq_sge[static_cast<size_t>(i) * qp->cap.max_recv_sge];
  }
  qp->irq.resize(kMaxRdAtom);

  ibv_qp& b = qp->qpx.qp_base;
  b.context = ctx->ibctx();
  b.qp_context = init->qp_context;
  b.pd = &pd->pd;
  b.send_cq = init->send_cq;
  b.recv_cq = init->recv_cq;
  b.srq = init->srq;
  b.state = IBV_QPS_RESET;
  b.qp_type = init->qp_type;
  pthread_mutex_init(&b.mutex, nullptr);
  pthread_cond_init(&b.cond, nullptr);
  b.events_completed = 0;
  qp->io = std::make_unique<QpIo>(qp);
  if (ud) {
    if (const int e = ud_open(qp)) {
      delete qp;
      *err = e == EMFILE || e == ENFILE ? ENOMEM : e;
      return nullptr;
    }
  } else {
    const uint32_t qpn = oob::alloc_qpn(qp);
    if (!qpn) {
      delete qp;
      *err = ENOMEM;
      return nullptr;
    }
    b.qp_num = qpn;
    b.handle = qpn;
  }
  qp->stats = stats::attach(b.qp_num, init->qp_type);
  qp->faults = fault::attach(b.qp_num);
  qp->attr.qp_state = IBV_QPS_RESET;
  qp->attr.cap = qp->cap;
  qp->attr.path_mtu = IBV_MTU_4096;
  qp->attr.port_num = 1;
  qp->scq->attach(qp);
  if (qp->rcq != qp->scq) qp->rcq->attach(qp);
  if (qp->srq) {
    std::lock_guard lk(qp->srq->qps_mu);
    qp->srq->qps.push_back(qp);
  }
  *err = 0;
  return qp;
}

int qp_destroy(Qp* qp) {
  Progress::get().run_sync([qp] {
    // On the progress thread, where deferred work runs: none runs on this QP after this.
    qp->destroyed.store(true, std::memory_order_release);
    oob::forget(qp);
    oob::free_qpn(qp->qpn());
  });
  if (qp->ud) ud_close(qp);
  conn_transition_sync(qp, ConnEvent::destroy);
  qp->scq->detach(qp);
  if (qp->rcq != qp->scq) qp->rcq->detach(qp);
  if (qp->srq) {
    std::lock_guard lk(qp->srq->qps_mu);
    auto& v = qp->srq->qps;
    v.erase(std::remove(v.begin(), v.end(), qp), v.end());
  }
  {
    // Wait out any thread still inside this QP's engines.
    std::lock_guard a(qp->rx_mu);
    std::lock_guard b(qp->tx_mu);
  }
  KeyTable::get().qp_gone(qp);  // its type 2 windows become free
  pthread_mutex_lock(&qp->qpx.qp_base.mutex);
  const uint32_t reported = qp->events_reported;
  pthread_mutex_unlock(&qp->qpx.qp_base.mutex);
  qp->ctx->retire_async(qp->ibqp(), reported);
  pthread_mutex_destroy(&qp->qpx.qp_base.mutex);
  pthread_cond_destroy(&qp->qpx.qp_base.cond);
  stats::detach(qp->stats);
  qp_put(qp);  // ibv_create_qp's reference; deferred work may still hold one
  return 0;
}

int qp_modify(Qp* qp, ibv_qp_attr* a, int mask) {
  if (!a || (mask & ~((IBV_QP_RATE_LIMIT << 1) - 1))) return EINVAL;
  std::unique_lock lk(qp->tx_mu);
  const ibv_qp_state cur = (mask & IBV_QP_CUR_STATE) ? a->cur_qp_state : qp->state.load();
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
  const Transition t = qp->ud   ? transition_ud(qp->state.load(), next)
                       : qp->uc ? transition_uc(qp->state.load(), next)
                                : transition(qp->state.load(), next);
  if (!t.valid || cur != qp->state.load()) return EINVAL;
  if ((mask & t.required) != t.required || (mask & ~(t.required | t.optional | IBV_QP_STATE)) != 0)
    return EINVAL;
  // Validate every attribute before changing anything (rxe_qp_chk_attr).
  if ((mask & IBV_QP_PORT) && a->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > kMaxRdAtom) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > kMaxRdAtom) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
    return EINVAL;
  if ((mask & IBV_QP_AV) && a->ah_attr.is_global &&
      a->ah_attr.grh.sgid_index >= the_device()->gids.size())
    return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && (a->dest_qp_num == 0 || a->dest_qp_num > 0xFFFFFF)) return EINVAL;
  if ((mask & IBV_QP_CAP)) return EINVAL;

  auto& s = qp->attr;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a->qp_access_flags & kKnownAccess;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a->pkey_index;
  if (mask & IBV_QP_QKEY) s.qkey = a->qkey;
  if (mask & IBV_QP_PORT) s.port_num = a->port_num;
  if (mask & IBV_QP_AV) s.ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = a->rq_psn & 0xFFFFFF;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = a->sq_psn & 0xFFFFFF;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) {
    s.rnr_retry = a->rnr_retry;
    qp->rnr_retry_set = true;
  }
  if (mask & IBV_QP_EN_SQD_ASYNC_NOTIFY) s.en_sqd_async_notify = a->en_sqd_async_notify;
  if (mask & IBV_QP_ALT_PATH) s.alt_ah_attr = a->alt_ah_attr;
  if (mask & IBV_QP_PATH_MIG_STATE) s.path_mig_state = a->path_mig_state;

  const ibv_qp_state prev = qp->state.load();
  if (!(mask & IBV_QP_STATE) || next == prev) {
    return 0;
  }
  if (next == IBV_QPS_ERR) {
    lk.unlock();
    qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, false);
    return 0;
  }
  if (next == IBV_QPS_RESET) {
    // Discard everything without completions (IB spec 10.3.1: RESET empties the queues).
    qp->sq_head = qp->sq_tx = qp->sq_count = 0;
    qp->orq_used = 0;
    qp->irq_head = qp->irq_count = 0;
    {
      std::lock_guard rq(qp->rq_mu);
      qp->rq_head = qp->rq_count = 0;
    }
    qp_set_state_locked(qp, IBV_QPS_RESET);
    qp->error_reported = false;
    lk.unlock();
    conn_transition_sync(qp, ConnEvent::reset);
    std::lock_guard rx(qp->rx_mu);
    std::lock_guard tx(qp->tx_mu);
    qp->scq->clean(qp->qpn(), qp->srq != nullptr);
    if (qp->rcq != qp->scq) qp->rcq->clean(qp->qpn(), qp->srq != nullptr);
    if (qp->ud) ud_update_interest(qp);
    return 0;
  }
  qp_set_state_locked(qp, next);
  if (qp->ud) {
    if (next == IBV_QPS_RTS) ud_tx_locked(qp);  // what was posted while in SQD
  } else {
    if (next == IBV_QPS_RTR && !qp->cm_managed && qp->attr.dest_qp_num != kRdmaCmPlaceholderQpn)
      oob::start(qp);
    if (next == IBV_QPS_RTS && prev != IBV_QPS_RTS) tx_run_locked(qp);
  }
  if (next == IBV_QPS_SQD && s.en_sqd_async_notify) {
    // Nothing is ever in flight between WQEs for long: the SQ drains immediately.
    lk.unlock();
    ibv_async_event ev{};
    ev.element.qp = qp->ibqp();
    ev.event_type = IBV_EVENT_SQ_DRAINED;
    qp->ctx->post_async(ev);
  }
  return 0;
}

int qp_query(Qp* qp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  std::lock_guard lk(qp->tx_mu);
  *attr = qp->attr;
  attr->qp_state = qp->state.load();
  attr->cur_qp_state = attr->qp_state;
  attr->cap = qp->cap;
  attr->sq_draining = 0;
  if (init) {
    std::memset(init, 0, sizeof *init);
    init->qp_context = qp->qpx.qp_base.qp_context;
    init->send_cq = qp->qpx.qp_base.send_cq;
    init->recv_cq = qp->qpx.qp_base.recv_cq;
    init->srq = qp->qpx.qp_base.srq;
    init->cap = qp->cap;
    init->qp_type = qp->qpx.qp_base.qp_type;
    init->sq_sig_all = qp->sq_sig_all;
  }
  return 0;
}

// A verbs opcode a UD QP cannot carry: RC's.
static bool ud_opcode_unsupported(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_LOCAL_INV:
    case IBV_WR_BIND_MW:
      return true;
    default:
      return false;
  }
}

static int check_send_wr(const Qp* qp, const ibv_send_wr* wr) {
  if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge) return EINVAL;
  if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
  uint64_t len = 0;
  for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
  if (len > kMaxMsgSize) return EINVAL;
  if (qp->ud) {
    // UD carries Sends only, each to the address handle its WR names (IBA 10.8.2). Another
    // known opcode is taken, as mlx5's provider takes it (no opcode check for UD), and
    // completes with IBV_WC_LOC_QP_OP_ERR, the QP going to ERR, as rxe's provider does
    // (ud_tx_locked).
    if (wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM) {
      if (!ud_opcode_unsupported(wr->opcode)) return EINVAL;
      return (wr->send_flags & IBV_SEND_INLINE) && len > qp->cap.max_inline_data ? EINVAL : 0;
    }
    if (!wr->wr.ud.ah || wr->wr.ud.remote_qpn > 0xFFFFFF) return EINVAL;
    if ((wr->send_flags & IBV_SEND_INLINE) && len > qp->cap.max_inline_data) return EINVAL;
    return 0;
  }
  switch (wr->opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_INV:
    case IBV_WR_RDMA_WRITE:
      break;
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      // Immediate data needs RFC 7306 on the peer; toward any other peer the WR completes
      // with IBV_WC_LOC_QP_OP_ERR when it is processed (qp_requester.cc).
      break;
    case IBV_WR_RDMA_READ:
      // Reads and Atomics need the responder's answer, which UC has no way to carry (IB
      // spec table 37; rxe_wr_opcode_info has no UC mask for them: EINVAL at post).
      if (qp->uc || (wr->send_flags & IBV_SEND_INLINE)) return EINVAL;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      if (qp->uc) return EINVAL;
      // Size and alignment are not checked here: as on rxe, a wrong local size completes
      // with IBV_WC_LOC_LEN_ERR and a misaligned target with the responder's
      // IBV_WC_REM_INV_REQ_ERR (qp_requester.cc, qp_responder.cc).
      if (wr->send_flags & IBV_SEND_INLINE) return EINVAL;
      break;
    case IBV_WR_BIND_MW:
      // What the window, region and range allow is checked when the WR executes, in order
      // (IBV_WC_MW_BIND_ERR then, as on rxe); here only what cannot be carried.
      if (!wr->bind_mw.mw || (wr->bind_mw.bind_info.length && !wr->bind_mw.bind_info.mr))
        return EINVAL;
      if (wr->num_sge || (wr->send_flags & IBV_SEND_INLINE)) return EINVAL;
      break;
    case IBV_WR_LOCAL_INV:
      if (wr->num_sge || (wr->send_flags & IBV_SEND_INLINE)) return EINVAL;
      break;
    default:
      return EINVAL;
  }
  if ((wr->send_flags & IBV_SEND_INLINE) && len > qp->cap.max_inline_data) return EINVAL;
  return 0;
}

// At most this many extra periods for a set-up in flight (oob::setup_in_flight).
constexpr uint16_t kMaxSetupDeferrals = 64;

// Work posted while the connection to the peer is not up (its QP has not reached RTR, or is
// not there): an IB requester retransmits retry_cnt times, each after the local ACK timeout
// (4.096 us * 2^timeout), then completes with IBV_WC_RETRY_EXC_ERR (IB spec 9.7.6.1.3). We
// give the connection that long to come up. timeout 0 means infinite, as in the spec.
// Called with tx_mu held.
static void arm_transport_timer(Qp* qp) {
  if (qp->ack_timer_armed || qp->attr.timeout == 0) return;
  qp->ack_timer_armed = true;
  const uint64_t us =
      (uint64_t{qp->attr.retry_cnt} + 1) * 4096 * (uint64_t{1} << qp->attr.timeout) / 1000;
  const auto delay = std::chrono::milliseconds(std::max<uint64_t>(us / 1000, 1));
  Progress::get().post_after(delay, [ref = QpRef(qp), delay] {
    if (!ref.live()) return;  // destroyed meanwhile
    Qp* qp = ref.get();
    // Packets in flight do not time out: a set-up still under way with a peer that has not
    // said its QP is not ready (oob::setup_in_flight) gets another period.
    const bool in_flight = !qp->conn_up() && oob::setup_in_flight(qp, delay);
    bool expired;
    {
      std::lock_guard lk(qp->tx_mu);
      qp->ack_timer_armed = false;
      expired = !qp->conn_up() && qp->sq_count && qp->state.load() != IBV_QPS_ERR;
      // Bounded: a set-up that is always "in flight" (a peer that keeps connecting other
      // QPs to us, never this one) still ends.
      if (expired && in_flight && qp->setup_deferrals < kMaxSetupDeferrals) {
        ++qp->setup_deferrals;
        arm_transport_timer(qp);
        return;
      }
    }
    if (!expired) return;
    SV_INFO("qp %u: peer never reached RTR within the transport timeout", qp->qpn());
    qp_set_error(qp, IBV_WC_RETRY_EXC_ERR, true);
  });
}

int qp_post_send(Qp* qp, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing) {
  std::unique_lock lk(qp->tx_mu);
  const ibv_qp_state st = qp->state.load(std::memory_order_acquire);
  int err = 0;
  if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR) err = EINVAL;
  const uint32_t cap = qp->cap.max_send_wr;
  if (all_or_nothing) {
    uint32_t n = 0;
    for (ibv_send_wr* w = wr; w && !err; w = w->next, ++n)
      if ((err = check_send_wr(qp, w))) wr = w;
    if (!err && n > cap - qp->sq_count) err = ENOMEM;
    if (err) {
      *bad = wr;
      return err;
    }
  }
  for (; wr && !err; wr = wr->next) {
    if ((err = check_send_wr(qp, wr))) break;
    if (qp->sq_count == cap) {
      err = ENOMEM;
      break;
    }
    const uint32_t slot = (qp->sq_head + qp->sq_count) & (cap - 1);
    SendWqe& w = qp->sq[slot];
    ibv_sge* sge = &qp->sq_sge[static_cast<size_t>(slot) * qp->cap.max_send_sge];
    w = SendWqe{};
    w.sge = sge;
    w.wr_id = wr->wr_id;
    w.opcode = wr->opcode;
    w.flags = wr->send_flags;
    w.signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
    w.length = static_cast<uint32_t>(len);
    if (wr->send_flags & IBV_SEND_INLINE) {
      // Copy now: the caller may reuse the buffer as soon as post_send returns. A read of
      // application memory (engine/app_memory.h), as every other.
      std::byte* dst = &qp->sq_inline[static_cast<size_t>(slot) * kMaxInline];
      size_t off = 0;
      for (int i = 0; i < wr->num_sge; ++i) {
        copy_from_app(dst + off, reinterpret_cast<const std::byte*>(wr->sg_list[i].addr),
                      wr->sg_list[i].length);
        off += wr->sg_list[i].length;
      }
      sge[0] = ibv_sge{reinterpret_cast<uint64_t>(dst), w.length, 0};
      w.num_sge = w.length ? 1 : 0;
    } else {
      std::copy(wr->sg_list, wr->sg_list + wr->num_sge, sge);
      w.num_sge = static_cast<uint32_t>(wr->num_sge);
    }
    // A UD WR of RC's: nothing of it is read beyond this (its union is not an AH).
    const bool ud_refused = qp->ud && ud_opcode_unsupported(wr->opcode);
    switch (ud_refused ? IBV_WR_SEND : wr->opcode) {
      case IBV_WR_SEND_WITH_IMM:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
        w.imm_or_inv = wr->imm_data;
        break;
      case IBV_WR_SEND_WITH_INV:
      case IBV_WR_LOCAL_INV:
        w.imm_or_inv = wr->invalidate_rkey;
        break;
      case IBV_WR_BIND_MW: {
        // Keys, not pointers: the window or region may be gone by the time this executes.
        const ibv_mw_bind_info& b = wr->bind_mw.bind_info;
        w.bind.mw_rkey = wr->bind_mw.mw->rkey;
        w.bind.new_rkey = wr->bind_mw.rkey;
        w.bind.mr_lkey = b.length ? b.mr->lkey : 0;
        w.bind.addr = b.addr;
        w.bind.length = b.length;
        w.bind.access = static_cast<int>(b.mw_access_flags);
        break;
      }
      default:
        break;
    }
    if (ud_refused) {
      // completes with IBV_WC_LOC_QP_OP_ERR (ud_tx_locked)
    } else if (qp->ud) {
      w.dgid = Ah::from(wr->wr.ud.ah)->attr.grh.dgid;
      w.sgid_index = Ah::from(wr->wr.ud.ah)->attr.grh.sgid_index;
      w.remote_qpn = wr->wr.ud.remote_qpn;
      w.remote_qkey = wr->wr.ud.remote_qkey;
    } else if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ||
               wr->opcode == IBV_WR_RDMA_READ) {
      w.remote_addr = wr->wr.rdma.remote_addr;
      w.rkey = wr->wr.rdma.rkey;
    } else if (wr->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
               wr->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      w.remote_addr = wr->wr.atomic.remote_addr;
      w.rkey = wr->wr.atomic.rkey;
      w.compare_add = wr->wr.atomic.compare_add;
      w.swap = wr->wr.atomic.swap;
    }
    ++qp->sq_count;
  }
  if (err) *bad = wr;
  if (qp->ud && qp->state.load() != IBV_QPS_ERR) {
    ud_tx_locked(qp);  // datagrams leave now; in ERR, the flush below completes them
    return err;
  }
  if (qp->conn_state.load() == ConnState::peer_gone && qp->sq_count &&
      qp->state.load() != IBV_QPS_ERR) {
    // Retries toward a peer that is gone are exhausted (IB spec 9.7.5.1.5 analogue).
    lk.unlock();
    qp_set_error(qp, IBV_WC_RETRY_EXC_ERR, true);
    return err;
  }
  if (qp->state.load() == IBV_QPS_ERR) {
    flush_qp_locked(qp, IBV_WC_WR_FLUSH_ERR);
  } else if (st == IBV_QPS_RTS) {
    if (!qp->conn_up() && qp->sq_count) arm_transport_timer(qp);
    tx_post_locked(qp);
  }
  return err;
}

namespace {
// A ping-pong's held acks (tx_ack_locked): after this many answers in a row carried one,
// the hold's timer is kPingPongAckHold wide.
constexpr uint8_t kPingPongAnswers = 8;
constexpr uint64_t kPingPongAckHold = 1'000'000;  // ns
// The wide net saves a busy poller's thread the timer posts that wake the progress thread
// (on 2 cores each wake pre-empts a spinner). Through a ring, only while a poller owns the
// receive path (busy_poll.h): the ring's 8 B ib_send_lat averaged 3.8-4.0 us with the 50 us
// hold (its timer posts: 30k context switches per 200k round trips), 1.1-1.6 with the wide
// net, typical unchanged. Not for a consumer that sleeps in ibv_get_cq_event, which has no
// spinner to pre-empt: there the 50 us timer's wake-ups keep the CPUs out of the idle state
// whose wake-up costs this VM 30-40 us (blocking sockperf: 44 us one-way), and ib_send_lat
// -e measured 7.2-10 us typical with it, 36-41 without, over TCP and between namespaces alike,
// with the same system calls per round trip and less CPU (37 us against 57 per round trip).
bool wide_net_ok(const Qp* qp) {
  return qp->scq->channel_owner.load(std::memory_order_relaxed) == 0 &&
         qp->rcq->channel_owner.load(std::memory_order_relaxed) == 0 &&
         (!qp->tx_ring.load(std::memory_order_relaxed) ||
          qp->rx_handed.load(std::memory_order_relaxed));
}

// SOFTVERBS_TX_BATCH_US (default 10, 0: off): the doorbell batching window.
uint64_t tx_batch_ns() {
  static const uint64_t ns = sv::setting_us_as_ns(SV_SETTING("SOFTVERBS_TX_BATCH_US"));
  return ns;
}

// When a held ack last left without an answer (held_ack_flushed_at), mono ns.
std::atomic<uint64_t> g_acks_flushed_at{0};

// Sends what doorbell batching deferred. Caller holds tx_mu. A held Placement Ack that
// leaves here left without an answer to carry it: the ping-pong, if there was one, is over
// (tx_ack_locked).
void tx_flush_locked(Qp* qp) {
  if (!qp->tx_deferred.exchange(false)) return;
  const Conn& c = qp->conn;
  if (c.ack_to_send != c.ack_sent) {
    qp->ack_answers = 0;
    // Only if the ack held is among those leaving now: it may have gone meanwhile with the
    // lazy timer, an RTR or the shm ring, and what leaves now was never held.
    if (qp->ack_held && static_cast<int32_t>(qp->ack_held_to - c.ack_sent) > 0)
      g_acks_flushed_at.store(sv::mono_ns(), std::memory_order_relaxed);
  }
  qp->ack_held = false;
  tx_run_locked(qp);
}

}  // namespace

// One sendmsg per post caps the message rate (a loopback sendmsg costs microseconds, most
// of it the receiver's TCP work done in the sender's call). A post with nothing sent just
// before goes out at once, so a lone post (a ping-pong, an RPC) pays nothing; posts that
// follow it within the window are queued and leave together at the first flush point.
// This is the doorbell batching a NIC driver does with a WR list, for callers that post
// one WR at a time.
namespace {
// Only for a consumer that polls: with either CQ armed it is about to block on a channel
// (or has a completion handler, as RDS does) and may never poll or arm again to flush.
bool may_defer(const Qp* qp) {
  return qp->conn_up() && !qp->tx_blocked && !qp->scq->armed.load(std::memory_order_relaxed) &&
         !qp->rcq->armed.load(std::memory_order_relaxed);
}

// Then what is posted but not yet in a socket gets a bounded wait. ibv_modify_qp(RTS)
// returns before the TCP/MPA connection is up (the progress thread sets it up), and a full
// socket holds frames back; a NIC has the WRs on the wire microseconds after the post, so a
// program that posts and exits without polling expects them delivered. A QP that leaves
// RTS (its peer refused, or is gone) stops the wait; a peer that never shows costs
// kExitSendWait.
constexpr uint64_t kExitSendWaitNs = 500'000'000;
std::atomic<bool> g_exit_unsent{false};
bool unsent_locked(const Qp* qp) {
  const auto st = qp->state.load();
  if (st != IBV_QPS_RTS && st != IBV_QPS_SQD) return false;
  return qp->sq_tx != qp->sq_head + qp->sq_count || qp->conn.tx_sent != qp->conn.tx_queued;
}
void wait_unsent_at_exit() {
  const uint64_t deadline = mono_ns() + kExitSendWaitNs;
  do {
    g_exit_unsent.store(false);
    oob::for_each_qp([](Qp* qp) {
      if (!qp->tx_mu.try_lock()) {  // in use: the progress thread is sending
        g_exit_unsent.store(true);
        return;
      }
      if (unsent_locked(qp)) g_exit_unsent.store(true);
      qp->tx_mu.unlock();
    });
    if (!g_exit_unsent.load()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } while (mono_ns() < deadline);
}

void flush_all_at_exit() {
  qp_flush_deferred_all();
  wait_unsent_at_exit();
}

// The flush timer for what tx_defer_locked holds, due at `at` (mono ns). Caller holds tx_mu.
void post_flush_timer_locked(Qp* qp, uint64_t at, uint64_t now);

// Leaves the batch for the next flush point: a post, a poll or arm of either CQ (a caller
// may wait for the answer on its receive CQ), or the timer `window` ns from now. A pending
// timer due by then serves; one due later (a ping-pong's wide net) does not, and a sooner
// one takes over from it (Qp::flush_timer_at).
void tx_defer_locked(Qp* qp, uint64_t window) {
  const uint64_t now = sv::mono_ns();
  qp->tx_defer_due = qp->tx_deferred.load(std::memory_order_relaxed)
                         ? std::min(qp->tx_defer_due, now + window)
                         : now + window;
  qp->tx_deferred.store(true);
  qp->scq->tx_deferred.store(true, std::memory_order_release);
  qp->rcq->tx_deferred.store(true, std::memory_order_release);
  if (qp->flush_timer_at && qp->flush_timer_at <= qp->tx_defer_due) return;
  post_flush_timer_locked(qp, qp->tx_defer_due, now);
}

// Usually the answer or a poll takes what was held long before the timer is due. The timer
// is kept all the same, to its due time: while it is pending, the holds that follow post
// none, and a post from an application thread is what costs: it wakes the progress thread
// to shorten its sleep, and on a small machine that wake-up pre-empts a spinner. Dropping a
// moot timer before the sleep saved its run but left that wake-up, one per message of a
// ping-pong; kept, a busy ping-pong pays one post and one run per hold time (50 us: 25
// round trips of 8 B through shared memory). A timer that finds a newer hold waits for the
// newer one's due time (from the progress thread: no wake-up) rather than send its ack
// alone before the answer can carry it.
//
// In a ping-pong over TCP (Qp::ack_answers, tx_ack_locked) the timer that finds nothing held
// waits another kPingPongAckHold if the QP held an ack since it last looked: the ping-pong
// goes on, and its next hold then posts no timer from an application thread. A QP that held
// nothing for that long lets it lapse.
//
// Only the timer due at Qp::flush_timer_at acts: one a sooner timer took over from finds
// another time there and does nothing. tx_mu is only tried: its holder may be sending a
// large batch (a 1 MiB sendmsg takes a millisecond) or draining for a Terminate, and the
// progress thread must not wait for it; the timer looks again, 20 us on, doubling to 200.
void flush_timer_fired(QpRef ref, uint64_t at, uint32_t retry_us) {
  if (!ref.live()) return;  // destroyed meanwhile
  Qp* qp = ref.get();
  if (!qp->tx_mu.try_lock()) {
    Progress::get().post_after(
        std::chrono::microseconds(retry_us), [ref = std::move(ref), at, retry_us]() mutable {
          flush_timer_fired(std::move(ref), at, std::min(retry_us * 2, 200u));
        });
    return;
  }
  std::lock_guard lk(qp->tx_mu, std::adopt_lock);
  if (qp->flush_timer_at != at) return;  // a sooner timer took over
  qp->flush_timer_at = 0;
  const uint64_t now = sv::mono_ns();
  if (qp->tx_deferred.load(std::memory_order_relaxed)) {
    if (now < qp->tx_defer_due)
      post_flush_timer_locked(qp, qp->tx_defer_due, now);
    else
      tx_flush_locked(qp);
    return;
  }
  if (qp->ack_answers >= kPingPongAnswers && qp->holds != qp->holds_seen && wide_net_ok(qp)) {
    qp->holds_seen = qp->holds;
    post_flush_timer_locked(qp, now + kPingPongAckHold, now);
  }
}

void post_flush_timer_locked(Qp* qp, uint64_t at, uint64_t now) {
  qp->flush_timer_at = at;
  Progress::get().post_after(
      std::chrono::microseconds((at > now ? at - now : 0) / 1000 + 1),
      [ref = QpRef(qp), at]() mutable { flush_timer_fired(std::move(ref), at, 20); });
}
}  // namespace

void tx_post_locked(Qp* qp) {
  // A post that answers what the peer sent since the last one is a ping-pong's turn: when
  // the round trip is shorter than the window, holding it back would cost every turn a
  // flush (a poll, or the timer) -- 10-12 us per 8 B SEND one-way instead of 4-6.
  const uint32_t turns = qp->rx_turns.load(std::memory_order_relaxed);
  const bool answers = turns != qp->tx_turns_seen;
  qp->tx_turns_seen = turns;
  // An answer that carries the ack held for it: one more turn of a ping-pong.
  auto send_now = [&] {
    if (answers && qp->conn.ack_to_send != qp->conn.ack_sent && qp->ack_answers < UINT8_MAX)
      ++qp->ack_answers;
    qp->tx_deferred.store(false, std::memory_order_relaxed);  // what was held leaves with it
    qp->ack_held = false;
    tx_run_locked(qp);
  };
  // Through a shared-memory ring a frame costs no system call: nothing to batch. Its turns
  // count all the same, for the wide net (wide_net_ok).
  if (qp->tx_ring.load(std::memory_order_relaxed)) {
    send_now();
    return;
  }
  const uint64_t window = tx_batch_ns();
  const uint64_t now = window ? sv::mono_ns() : 0;
  if (window && !answers && now < qp->tx_window_end_ns && may_defer(qp)) {
    tx_defer_locked(qp, window);
    return;
  }
  send_now();
  if (window) qp->tx_window_end_ns = now + window;
}

namespace {
// The unrequested ack's timer. While the peer's stream keeps placing messages (the count to
// ack moved since the timer was armed) it waits again, up to kLazyAckMaxWait in all: a
// requester that needs an ack asks for it (mark_ack_request), so on a busy stream the lazy
// ack only costs both ends a wakeup and the sender a receive (ib_write_bw 1 MiB: one per
// 200 us, a context switch per MiB at the sender). IB's responder coalesces the same way
// (an ACK may cover many requests, IBA 9.7.5.1.1); the bound keeps a quiet stream's last
// messages from waiting longer than that for their ack.
constexpr uint64_t kLazyAckDelayUs = 200;
constexpr uint32_t kLazyAckMaxRearms = 10;  // kLazyAckMaxWait: 11 x 200 us

void arm_lazy_ack_locked(Qp* qp) {
  qp->lazy_ack_armed_at = qp->conn.ack_to_send;
  Progress::get().post_after(std::chrono::microseconds(kLazyAckDelayUs), [ref = QpRef(qp)] {
    if (!ref.live()) return;  // destroyed meanwhile
    Qp* qp = ref.get();
    std::lock_guard lk(qp->tx_mu);
    const Conn& c = qp->conn;
    if (c.ack_to_send == c.ack_sent) {
      qp->lazy_ack_timer = false;  // something else carried it
      return;
    }
    if (c.ack_to_send != qp->lazy_ack_armed_at && qp->lazy_ack_rearms < kLazyAckMaxRearms) {
      ++qp->lazy_ack_rearms;
      arm_lazy_ack_locked(qp);
      return;
    }
    qp->lazy_ack_timer = false;
    tx_run_locked(qp);
  });
}
}  // namespace

// A Placement Ack after a receive pass. One the peer asked for (a signaled WR, or its window
// nearing its end) after a pass that placed one message waits for the application's
// answer, posted next, to carry it (one sendmsg, not two), whoever ran the pass: a Send's
// answer is a Send, an RDMA Write's (ib_write_lat, riostream: the application sees the
// Write in memory) a Write. Without an answer it leaves at the poller's second empty poll
// in a row, an arm or block of the CQ, an rdma_cm call of the process (perftest -R:
// qp_flush_deferred_all), or the hold's timer (tx_defer_locked). A pass that placed a stream
// (several messages) has no one answer: its ack leaves at once, as an IB responder's. An ack nobody
// asked for is lazy: it rides with whatever leaves next, or with the timer (arm_lazy_ack_locked),
// never alone at a flush point; a WQE that needs it asked (mark_ack_request), so a stream of small
// messages costs the responder one ack per request, not one sendmsg per receive pass. One pass's
// messages share one ack.
void tx_ack_locked(Qp* qp, bool requested, bool no_one_answer) {
  // SOFTVERBS_ACK_HOLD_US (default 50, 0: never held): how long that ack waits for the answer.
  static const uint64_t hold_ns = sv::setting_us_as_ns(SV_SETTING("SOFTVERBS_ACK_HOLD_US"));
  if (requested && (hold_ns == 0 || no_one_answer)) {
    tx_run_locked(qp);
    return;
  }
  if (requested) {
    // In a ping-pong whose answers have carried the last kPingPongAnswers held acks, the
    // hold's timer is only a safety net for the turn that gets no answer, and each timer
    // an application thread posts wakes the progress thread, which on a small machine
    // pre-empts a spinner: one per hold time cost ib_send_lat 8 B over TCP 1.3-1.5x the
    // latency of RFC 5040's rule (no acks). So while the answers come, the net is
    // kPingPongAckHold wide: a turn that gets none acks up to that late, once; its flush
    // (tx_flush_locked) ends the streak. (IB's responder acks at once, in hardware: what
    // this saves is our sendmsg of an ack alone, the cost IB does not have.)
    ++qp->holds;
    const bool ping_pong = qp->ack_answers >= kPingPongAnswers && wide_net_ok(qp);
    const uint64_t hold = ping_pong ? std::max(hold_ns, kPingPongAckHold) : hold_ns;
    qp->ack_held = true;
    qp->ack_held_to = qp->conn.ack_to_send;
    tx_defer_locked(qp, hold);
    return;
  }
  if (qp->lazy_ack_timer) return;
  qp->lazy_ack_timer = true;
  qp->lazy_ack_rearms = 0;
  arm_lazy_ack_locked(qp);
}

// try_lock: a thread that holds a QP's tx_mu is sending (its frames carry what was held), or
// the process is ending under it.
void qp_flush_deferred_all() {
  oob::for_each_qp([](Qp* qp) {
    if (!qp->tx_deferred.load() || !qp->tx_mu.try_lock()) return;
    tx_flush_locked(qp);
    qp->tx_mu.unlock();
  });
}

uint64_t held_ack_flushed_at() {
  return g_acks_flushed_at.load(std::memory_order_relaxed);
}

bool qp_tx_flush(Qp* qp, bool with_acks) {
  if (!qp->tx_deferred.load(std::memory_order_acquire)) return true;
  std::lock_guard lk(qp->tx_mu);
  if (!with_acks && qp->tx_deferred.load(std::memory_order_relaxed) && !unsent_locked(qp) &&
      qp->conn.ack_to_send != qp->conn.ack_sent)
    return false;
  tx_flush_locked(qp);
  return true;
}

// Copies a receive WR into its ring slot (the slot keeps its own SGE storage).
static void fill_recv_wqe(RecvWqe& r, const ibv_recv_wr* wr) {
  r.wr_id = wr->wr_id;
  r.num_sge = static_cast<uint32_t>(wr->num_sge);
  std::copy(wr->sg_list, wr->sg_list + wr->num_sge, r.sge);
  uint64_t len = 0;
  for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
  r.length = static_cast<uint32_t>(std::min<uint64_t>(len, UINT32_MAX));
}

static int check_recv_wr(uint32_t max_sge, const ibv_recv_wr* wr) {
  if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge) return EINVAL;
  if (wr->num_sge > 0 && !wr->sg_list) return EINVAL;
  return 0;
}

static void restart_rx(Qp* qp) {
  // A receive was posted while RX waited for one: resume parsing.
  if (!qp->rx_stalled) return;
  if (Progress::get().on_thread() || qp->rx_mu.try_lock()) {
    if (!Progress::get().on_thread()) {
      qp_rx_locked(qp);
      qp->rx_mu.unlock();
    } else {
      std::lock_guard lk(qp->rx_mu);
      qp_rx_locked(qp);
    }
    qp_update_interest(qp);
  } else {
    Progress::get().post([ref = QpRef(qp)] {
      if (!ref.live()) return;  // destroyed meanwhile
      Qp* qp = ref.get();
      std::lock_guard lk(qp->rx_mu);
      qp_rx_locked(qp);
      qp_update_interest(qp);
    });
  }
}

int qp_post_recv(Qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (qp->srq) {
    *bad = wr;
    return EINVAL;
  }
  int err = 0;
  {
    std::lock_guard lk(qp->rq_mu);
    if (qp->state.load() == IBV_QPS_RESET) err = EINVAL;
    const uint32_t cap = qp->cap.max_recv_wr;
    for (; wr && !err; wr = wr->next) {
      if ((err = check_recv_wr(qp->cap.max_recv_sge, wr))) break;
      if (qp->rq_count == cap) {
        err = ENOMEM;
        break;
      }
      const uint32_t slot = (qp->rq_head + qp->rq_count) & (cap - 1);
      fill_recv_wqe(qp->rq[slot], wr);
      ++qp->rq_count;
    }
    if (err) *bad = wr;
  }
  if (qp->state.load() == IBV_QPS_ERR) {
    std::lock_guard lk(qp->tx_mu);
    flush_qp_locked(qp, IBV_WC_WR_FLUSH_ERR);
  } else {
    restart_rx(qp);
  }
  return err;
}

int srq_post_recv(Srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  int err = 0;
  {
    std::lock_guard lk(srq->mu);
    for (; wr && !err; wr = wr->next) {
      if ((err = check_recv_wr(srq->max_sge, wr))) break;
      if (srq->count == srq->max_wr) {
        err = ENOMEM;
        break;
      }
      const uint32_t slot = (srq->head + srq->count) % srq->max_wr;
      fill_recv_wqe(srq->ring[slot], wr);
      ++srq->count;
    }
    if (err) *bad = wr;
  }
  // Only the QPs waiting for a receive are restarted, outside the lock (RX may complete a
  // receive whose handler posts to this SRQ again), each held by a reference taken under it
  // (a QP destroyed meanwhile is left alone). An SRQ shared by a thousand connections is
  // posted to once a message: no copy of its QP list each time, and no visit at all unless a
  // QP stalled since the last look. A stalling QP marks the SRQ, then looks at the receives
  // under mu (srq_mark_stalled); we add ours under mu, then look at the mark. mu orders the
  // two looks: if its came first, its mark happened before our look; if ours, it sees them.
  if (!srq->maybe_stalled.load(std::memory_order_relaxed) ||
      !srq->maybe_stalled.exchange(false, std::memory_order_seq_cst))
    return err;
  std::vector<QpRef> stalled;
  {
    std::lock_guard lk(srq->qps_mu);
    for (Qp* qp : srq->qps)
      if (qp->rx_stalled.load(std::memory_order_acquire)) stalled.emplace_back(qp);
  }
  for (const QpRef& ref : stalled)
    if (ref.live()) restart_rx(ref.get());
  return err;
}

bool srq_mark_stalled(Qp* qp) {
  if (!qp->srq) return false;
  qp->srq->maybe_stalled.store(true, std::memory_order_seq_cst);
  std::lock_guard lk(qp->srq->mu);
  return qp->srq->count != 0;
}

bool srq_requeue(Srq* srq, const RecvWqe& w) {
  std::lock_guard lk(srq->mu);
  // Full if its owner posted more once w was taken (max_wr bounds what the ring holds).
  if (srq->count == srq->max_wr) return false;
  RecvWqe& r = srq->ring[(srq->head + srq->count) % srq->max_wr];
  r.wr_id = w.wr_id;
  r.num_sge = w.num_sge;
  r.length = w.length;
  std::copy(w.sge, w.sge + w.num_sge, r.sge);
  ++srq->count;
  // A QP stalled on this SRQ waits for the next post to restart it (this runs under a
  // destroyed QP's locks, where another QP's RX may not run).
  return true;
}

int srq_modify(Srq* s, const ibv_srq_attr* attr, int mask) {
  std::lock_guard lk(s->mu);
  if (mask & IBV_SRQ_MAX_WR) {
    if (attr->max_wr == 0 || attr->max_wr > static_cast<uint32_t>(kMaxSrqWr) ||
        attr->max_wr < s->count)
      return EINVAL;
    std::vector<RecvWqe> ring(attr->max_wr);
    std::vector<ibv_sge> sge(static_cast<size_t>(attr->max_wr) * s->max_sge);
    for (uint32_t i = 0; i < attr->max_wr; ++i) ring[i].sge = &sge[i * s->max_sge];
    for (uint32_t i = 0; i < s->count; ++i) {
      const RecvWqe& o = s->ring[(s->head + i) % s->max_wr];
      RecvWqe& n = ring[i];
      n.wr_id = o.wr_id;
      n.num_sge = o.num_sge;
      n.length = o.length;
      std::copy(o.sge, o.sge + o.num_sge, n.sge);
    }
    s->ring.swap(ring);
    s->sge.swap(sge);
    s->head = 0;
    s->max_wr = attr->max_wr;
  }
  if (mask & IBV_SRQ_LIMIT) {
    if (attr->srq_limit > s->max_wr) return EINVAL;
    s->limit = attr->srq_limit;
  }
  return 0;
}

void srq_query(Srq* s, ibv_srq_attr* attr) {
  std::lock_guard lk(s->mu);
  attr->max_wr = s->max_wr;
  attr->max_sge = s->max_sge;
  attr->srq_limit = s->limit;
}

size_t srq_trim(Srq* s) {
  // Only memory the device could write anyway: an SGE whose lkey names a region of the SRQ's
  // PD with local write (what take_recv's check would accept). A WQE with a bad key fails
  // when taken, and its range may be anything of the application's, a private file mapping
  // whose changes MADV_DONTNEED would drop.
  auto& kt = KeyTable::get();
  auto guard = kt.read_guard();
  // Held while the pages go: a WQE still in the ring is taken (take_recv) under it, and no
  // one writes a posted buffer before taking it, so nothing being written is dropped.
  std::lock_guard lk(s->mu);
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  spans.reserve(s->count);
  for (uint32_t i = 0; i < s->count; ++i) {
    const RecvWqe& w = s->ring[(s->head + i) % s->max_wr];
    for (uint32_t j = 0; j < w.num_sge; ++j) {
      const ibv_sge& g = w.sge[j];
      std::byte* p = nullptr;
      if (!g.length || kt.check(g.lkey, s->pd, g.addr, g.length, IBV_ACCESS_LOCAL_WRITE, false,
                                &p) != AccessResult::ok)
        continue;
      const auto a = reinterpret_cast<uintptr_t>(p);
      spans.emplace_back(a, a + g.length);
    }
  }
  // Adjacent buffers (a pool carved from one region) share their edge pages: merged, those
  // pages go too; a page partly outside every posted buffer stays.
  std::sort(spans.begin(), spans.end());
  size_t trimmed = 0;
  for (size_t i = 0; i < spans.size();) {
    uintptr_t from = spans[i].first, to = spans[i].second;
    for (++i; i < spans.size() && spans[i].first <= to; ++i) to = std::max(to, spans[i].second);
    trimmed += give_back_pages(from, to);  // hugetlb or locked pages stay, as if not posted
  }
  return trimmed;
}

bool srq_in_use(Srq* s) {
  std::lock_guard lk(s->qps_mu);
  return !s->qps.empty();
}

void qp_update_interest(Qp* qp) {
  if (qp->ud) {
    ud_update_interest(qp);
    return;
  }
  auto apply = [qp] {
    // Only a connection that is up is watched (a failed one is shut down, qp_state.cc).
    if (qp->conn.fd < 0 || !qp->conn_up()) return;
    if (qp->fault_held.load(std::memory_order_acquire) != 0) [[unlikely]] {
      // A stall fault: unwatched, even for a hang-up, until its timer (qp_fault_hold).
      if (qp->conn.registered) Progress::get().del(qp->conn.fd);
      qp->conn.registered = false;
      qp->conn.events = 0;
      qp_wait_sync(qp);
      return;
    }
    uint32_t ev = 0;
    if (!qp->rx_stalled && !qp->rx_yielded) ev |= EPOLLIN;
    if (qp->tx_blocked) {
      if (!qp->tx_ring.load())
        ev |= EPOLLOUT;
      else if (qp->rx_ring.load() && !qp->shm_gone.load())
        ev |= EPOLLIN;  // the consumer's bell for room
      else if (!qp->shm_gone.load())
        shm_tx_retry_later(qp);  // its bells would sit behind FPDUs we do not read yet
    }
    if (!qp->conn.registered) {
      Progress::get().add(qp->conn.fd, ev, qp->io.get());
      qp->conn.registered = true;
    } else if (ev != qp->conn.events) {
      Progress::get().mod(qp->conn.fd, ev, qp->io.get());
    }
    qp->conn.events = ev;
    qp_wait_sync(qp);
  };
  if (Progress::get().on_thread()) {
    apply();
  } else {
    // Deferred work holds a reference (QpRef): qp_destroy marks the QP on the progress
    // thread, and frees it only when the last reference goes.
    Progress::get().post([ref = QpRef(qp), apply] {
      if (ref.live()) apply();
    });
  }
}

bool qp_progress(Qp* qp) {
  if (qp->ud) {
    // A busy poller drives the receive path itself; a stalled QP waits for a post_recv.
    if (!qp->rx_stalled && qp->rx_mu.try_lock()) {
      ud_rx_run_locked(qp);
      qp->rx_mu.unlock();
      if (qp->rx_stalled) ud_update_interest(qp);
    }
    return true;  // (whether it received is not tracked: take the clock again)
  }
  if (!qp->conn_up()) return false;
  bool took = false;
  if (qp->rx_mu.try_lock()) {
    const uint64_t reads = qp->conn.rx_reads;
    rx_run_locked(qp);
    took = qp->conn.rx_reads != reads;
    if (qp->rx_quiet_due.load(std::memory_order_relaxed)) [[unlikely]]
      qp_busy_quiet_locked(qp);
    qp->rx_mu.unlock();
  }
  if (qp->tx_blocked && qp->tx_mu.try_lock()) {
    tx_run_locked(qp);
    qp->tx_mu.unlock();
  }
  return took;
}

}  // namespace sv::engine
