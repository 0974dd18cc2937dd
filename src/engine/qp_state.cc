// The QP connection lifecycle (qp_state.h): its transition table, the teardown each
// transition owns, the move to ERR with its flush and async event, and the calls through
// which rdma_cm drives a QP.
#include "engine/qp_state.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "engine/busy_poll.h"
#include "engine/iw_cm.h"
#include "engine/linger.h"
#include "engine/log.h"
#include "engine/qp.h"
#include "engine/qp_trim.h"
#include "util/settings.h"
#include "wire/stats_file.h"

namespace sv::engine {

const char* conn_state_name(ConnState s) {
  switch (s) {
    case ConnState::idle:
      return "idle";
    case ConnState::up:
      return "up";
    case ConnState::peer_gone:
      return "peer_gone";
    case ConnState::failed:
      return "failed";
  }
  return "?";
}

const char* conn_event_name(ConnEvent e) {
  switch (e) {
    case ConnEvent::established:
      return "established";
    case ConnEvent::peer_closed_idle:
      return "peer_closed_idle";
    case ConnEvent::error:
      return "error";
    case ConnEvent::reset:
      return "reset";
    case ConnEvent::destroy:
      return "destroy";
  }
  return "?";
}

const char* qp_state_name(ibv_qp_state s) {
  static_assert(IBV_QPS_RESET == 0 && IBV_QPS_ERR == 6);  // the table's order
  return wire::qp_state_name(static_cast<uint32_t>(s));
}

std::optional<ConnState> conn_next(ConnState s, ConnEvent ev) {
  switch (ev) {
    case ConnEvent::established:
      // A QP that was failed never takes a socket (qp_take_endpoint checks its IB state
      // first); one whose idle peer left may be connected again by a new handshake.
      if (s == ConnState::idle || s == ConnState::peer_gone) return ConnState::up;
      return std::nullopt;
    case ConnEvent::peer_closed_idle:
      if (s == ConnState::up) return ConnState::peer_gone;
      return std::nullopt;
    case ConnEvent::error:
      return ConnState::failed;
    case ConnEvent::reset:
    case ConnEvent::destroy:
      return ConnState::idle;
  }
  return std::nullopt;
}

namespace {

// Out of the progress thread's epoll set and the blocked pollers' wait sets.
void unregister_locked(Qp* qp) {
  qp_wait_drop(qp);
  if (qp->conn.registered) Progress::get().del(qp->conn.fd);
  qp->conn.registered = false;
}

}  // namespace

// The Placement Ack of everything placed, framed now (softverbs peers that asked for it).
static void send_last_ack_locked(Qp* qp, ConnState from) {
  Conn& c = qp->conn;
  if (c.fd < 0 || from != ConnState::up || !c.send_acks || c.ack_sent == c.units_rx) return;
  c.ack_to_send = c.units_rx;
  tx_run_locked(qp);
}

bool conn_transition_locked(Qp* qp, ConnEvent ev) {
  const ConnState from = qp->conn_state.load(std::memory_order_relaxed);
  const std::optional<ConnState> to = conn_next(from, ev);
  if (!to) {
    SV_DBG("qp %u: connection %s ignores %s", qp->qpn(), conn_state_name(from),
           conn_event_name(ev));
    return false;
  }
  Conn& c = qp->conn;
  switch (ev) {
    case ConnEvent::established:
      // The socket is in conn.fd (qp_take_endpoint); TX and RX may run from now on.
      qp->conn_state.store(*to, std::memory_order_release);
      break;
    case ConnEvent::peer_closed_idle:
      // Closed at once: nothing is outstanding, and nothing more can arrive.
      qp->conn_state.store(*to, std::memory_order_release);
      if (c.fd >= 0) {
        unregister_locked(qp);
        close(c.fd);
        c.fd = -1;
      }
      break;
    case ConnEvent::error:
      // Receives taken from an SRQ and not completed when the QP failed complete with a
      // flush error, oldest first; the SRQ keeps the rest (IB spec 10.2.9.5; rxe flushes
      // the WQE in progress). Lost, each would be a buffer its owner never gets back: an
      // SRQ's owner reposts what completes, whatever the status.
      if (qp->srq && c.imm_pending) {
        complete_recv(qp, c.imm_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
        c.imm_pending = false;
      }
      if (qp->srq && c.have_recv) {
        complete_recv(qp, c.cur_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
        c.have_recv = false;
      }
      // What we placed is acked first, as a NIC acked it on arrival: a Placement Ack held
      // for an answer that will not come now (rdma_disconnect right after the last receive:
      // libfabric's fi_pingpong) would otherwise fail the peer's last Send with a flush.
      send_last_ack_locked(qp, from);
      // Shut down, not closed: the descriptor's number stays ours until reset or destroy,
      // so nothing that read conn.fd without a lock can reach a reused descriptor.
      qp->conn_state.store(*to, std::memory_order_release);
      if (c.fd >= 0) {
        unregister_locked(qp);
        shutdown(c.fd, SHUT_RDWR);
      }
      break;
    case ConnEvent::reset:
    case ConnEvent::destroy:
      // Destroy and RESET complete nothing (IB spec 10.3.1): receives an SRQ's QP took and
      // never completed go back to the SRQ, as mlx5 returns them when it cleans the CQ. (A
      // QP destroyed on the progress thread right after it failed gets here before its
      // error transition, which then finds it gone.)
      // One that no longer fits (its owner filled the ring since) completes with a flush
      // error instead, so that it still comes back.
      if (qp->srq) {
        if (c.imm_pending && !srq_requeue(qp->srq, c.imm_recv))
          complete_recv(qp, c.imm_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
        if (c.have_recv && !srq_requeue(qp->srq, c.cur_recv))
          complete_recv(qp, c.cur_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
        c.imm_pending = c.have_recv = false;
      }
      send_last_ack_locked(qp, from);  // the peer's last messages completed before our FIN
      // Our WRs are the application's again, with no completion (IB spec 10.3.1): what our
      // segments by reference name must no longer be read (qp_shm.cc).
      if (c.shm) c.shm->tx.revoke();
      qp->conn_state.store(*to, std::memory_order_release);
      if (c.fd >= 0) {
        unregister_locked(qp);
        linger_close(c.fd);  // FIN after our queued data; no RST for late bytes
        c.fd = -1;
      }
      if (ev == ConnEvent::reset) {
        // IB spec 10.3.1: RESET empties the QP; a new connection starts from nothing, fault
        // holds and injections included.
        Conn fresh;
        std::swap(qp->conn, fresh);
        qp->fault_held.store(0, std::memory_order_release);
        qp->ack_stashed.store(false, std::memory_order_relaxed);  // the old stream's
        qp->fault_corrupt_armed.store(false, std::memory_order_relaxed);
        qp->rx_stalled = false;
        qp->tx_blocked = false;
        qp->tx_ring.store(false);
        qp->rx_ring.store(false);
        qp->shm_gone.store(false);
        qp->ud_tx_failed = false;
        qp->ack_answers = 0;   // a new connection's ping-pong starts over (qp.cc tx_ack_locked)
        qp->ack_held = false;  // the old stream's hold (tx_flush_locked)
      }
      break;
  }
  SV_DBG("qp %u: connection %s -> %s (%s)", qp->qpn(), conn_state_name(from), conn_state_name(*to),
         conn_event_name(ev));
  return true;
}

void conn_transition_sync(Qp* qp, ConnEvent ev) {
  Progress::get().run_sync([qp, ev] {
    std::lock_guard rx(qp->rx_mu);
    std::lock_guard tx(qp->tx_mu);
    conn_transition_locked(qp, ev);
  });
}

void qp_set_state_locked(Qp* qp, ibv_qp_state s) {
  qp->state = s;
  qp->attr.qp_state = s;
  qp->attr.cur_qp_state = s;
  qp->qpx.qp_base.state = s;
  stats::set_state(qp->stats, s);
}

void qp_set_error(Qp* qp, ibv_wc_status status, bool fatal, ibv_event_type event,
                  const std::function<void()>& report) {
  bool first = false;
  {
    std::lock_guard lk(qp->tx_mu);
    // sq_count under tx_mu: the application's post_send writes it (TSan saw the race).
    SV_INFO("qp %u: error, cause %s, %u WQEs outstanding", qp->qpn(), wire::wc_status_name(status),
            qp->sq_count);
    if (qp->state.load() != IBV_QPS_ERR) {
      qp_set_state_locked(qp, IBV_QPS_ERR);
      first = true;
    }
    if (report) report();
    flush_qp_locked(qp, first ? status : IBV_WC_WR_FLUSH_ERR);
  }
  if (!first) return;
  if (fatal && !qp->error_reported) {
    qp->error_reported = true;
    ibv_async_event ev{};
    ev.element.qp = qp->ibqp();
    ev.event_type = event;
    qp->ctx->post_async(ev);
  }
  // The peer sees the connection end (siw tears down the same way). On the progress
  // thread: we may be inside RX here, with rx_mu held.
  Progress::get().post([ref = QpRef(qp)] {
    if (!ref.live()) return;
    Qp* q = ref.get();
    std::lock_guard rx(q->rx_mu);
    std::lock_guard tx(q->tx_mu);
    // Unless the application reset the QP meanwhile: its next connection is not this one.
    if (q->state.load() == IBV_QPS_ERR) conn_transition_locked(q, ConnEvent::error);
  });
  // Told from the progress thread, with no QP lock held: rdma_cm takes its id lock and
  // then QP locks on its own paths, and we may be inside RX (rx_mu) here.
  if (auto fn = qp->on_disconnect.load()) {
    void* id = qp->cm_id;
    const uint64_t serial = qp->cm_serial;
    Progress::get().post([fn, id, serial] { fn(id, serial); });
  }
}

void qp_conn_lost(Qp* qp, ibv_wc_status status) {
  // rdma_cm QPs: the peer's disconnect is normal, everything outstanding is flushed.
  if (qp->cm_managed) {
    qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, false);
    return;
  }
  {
    // An IB RC requester notices a vanished peer only through its retries: with nothing
    // outstanding the QP stays in RTS and posted receives stay posted (ibv_rc_pingpong's
    // server may exit before the client reaped its last completions). The next send fails.
    std::lock_guard lk(qp->tx_mu);
    if (qp->sq_count == 0 && qp->irq_count == 0 && !qp->conn.have_recv &&
        qp->state.load() != IBV_QPS_ERR) {
      Progress::get().post([ref = QpRef(qp), gen = qp->conn_gen] {
        if (!ref.live()) return;
        Qp* q = ref.get();
        std::lock_guard rx(q->rx_mu);
        std::lock_guard tx(q->tx_mu);
        if (q->conn_gen == gen) conn_transition_locked(q, ConnEvent::peer_closed_idle);
      });
      return;
    }
  }
  qp_set_error(qp, status, true);
}

void qp_take_endpoint(Qp* qp, Endpoint* ep) {
  const MpaOutcome& o = ep->outcome();
  std::lock_guard rx(qp->rx_mu);
  std::lock_guard tx(qp->tx_mu);
  const ibv_qp_state st = qp->state.load();
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) {
    // The QP was moved to ERR or RESET while its connection was being set up: the connection
    // has no QP any more, and the caller's dispose() closes it, so the peer sees it end (as
    // qp_set_error closes a live one). Attached, its socket stayed registered with this QP's
    // handler after RESET swapped in a fresh Conn, and events reached the handler once the QP
    // was freed (a TSan-found use after free).
    SV_INFO("qp %u: connection set up after the QP left RTR (state %s): closed", qp->qpn(),
            qp_state_name(st));
    return;
  }
  if (!conn_next(qp->conn_state.load(std::memory_order_relaxed), ConnEvent::established)) {
    SV_INFO("qp %u: a second connection while %s: closed", qp->qpn(),
            conn_state_name(qp->conn_state.load()));
    return;
  }
  Conn& c = qp->conn;
  // A connection after an idle peer left (peer_gone) starts a new stream: the last one may
  // have ended mid-FPDU, or with reading stopped (conn_eof, a reset fault).
  c.phase = RxPhase::header;
  c.hdr_have = 0;
  c.ulpdu_len = 0;
  c.trailer_have = 0;
  c.rx_begin = c.rx_end = 0;
  qp->rx_stalled = false;
  c.acks_unseen = false;  // the stall that hid the old stream's acks is over with it
  // A new stream starts on TCP; shared memory is offered again (qp_shm.cc).
  c.shm.reset();
  c.shm_placed = false;
  c.shm_tx_due = 0;
  c.shm_wait_answer = c.shm_wait_switch = c.shm_tx_switch = false;
  c.rx_switch_after_seg = false;
  qp->tx_ring.store(false);
  qp->rx_ring.store(false);
  qp->shm_gone.store(false);
  stats::set_transport(qp->stats, 0);
  c.fd = ep->release_fd();
  c.crc = o.crc;
  c.peer_sv = o.peer_sv;
  c.send_acks = o.send_acks;
  c.wait_acks = o.wait_acks;
  c.ird = ep->negotiated_ird();
  c.ord = ep->negotiated_ord();
  const bool passive = ep->role() == Endpoint::Role::passive;
  c.tx_gated = passive;  // RFC 6581 §4 / siw: the responder waits for the first FPDU
  c.send_rtr = !passive && o.p2p;
  c.expect_rtr = passive && o.p2p;
  if (c.peer_sv) {
    c.max_ulpdu = wire::kMaxUlpduLen & ~7u;
  } else {
    // siw sizes whole FPDUs to mss & ~7 and hardware peers want FPDUs <= MSS.
    const int mss = transport::tcp_mss(c.fd);
    c.max_ulpdu = static_cast<uint32_t>((mss & ~7) - 2 - 4 - 4);
  }
  c.rxbuf.allocate(256 * 1024);
  c.iov.allocate(Conn::kMaxIov);
  c.arena.allocate(Conn::kHdrArena);
  qp_trim_start();  // idle connections give these two back
  // Shared memory (qp_shm.cc): both sides say they can; the initiator offers once it has
  // seen the responder say so on an FPDU.
  c.shm_cap_tx = c.peer_sv && shm_wanted();
  c.shm_offer_on_cap = c.shm_cap_tx && !passive;
  c.shm_passive = passive;
  ++qp->conn_gen;
  conn_transition_locked(qp, ConnEvent::established);
  qp_attach_conn(qp);
}

void qp_attach_conn(Qp* qp) {
  const transport::SockAddr peer = transport::peer_addr(qp->conn.fd);
  stats::set_peer(qp->stats, peer, qp->attr.dest_qp_num);
  if (qp->faults) qp->faults->set_peer(peer);
  // SOFTVERBS_SNDBUF=bytes fixes the socket's send buffer (the kernel's autotuning otherwise):
  // a knob for tuning, and for tests that need a transmit that stops when the peer stops reading.
  static const int sndbuf = static_cast<int>(settings::uint_value(SV_SETTING("SOFTVERBS_SNDBUF")));
  if (sndbuf > 0) setsockopt(qp->conn.fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  transport::set_nonblock(qp->conn.fd, true);
  transport::set_nodelay(qp->conn.fd);
  SV_INFO("qp %u connected fd %d crc %d sv %d acks out %d in %d", qp->qpn(), qp->conn.fd,
          qp->conn.crc, qp->conn.peer_sv, qp->conn.send_acks, qp->conn.wait_acks);
  qp_update_interest(qp);
  if (qp->state.load() == IBV_QPS_RTS || qp->conn.send_rtr) tx_run_locked(qp);
  if (qp->state.load() == IBV_QPS_ERR) flush_qp_locked(qp, IBV_WC_WR_FLUSH_ERR);
}

// ---- rdma_cm -------------------------------------------------------------------------------

static void cm_bind_locked(Qp* qp, void* cm_id, uint64_t cm_serial, DisconnectFn on_disconnect) {
  qp->cm_managed = true;
  qp->cm_id = cm_id;
  qp->cm_serial = cm_serial;
  qp->on_disconnect = on_disconnect;
}

void qp_cm_bind(Qp* qp, void* cm_id, uint64_t cm_serial, DisconnectFn on_disconnect) {
  // Before the QP leaves RESET (rdma_create_qp_ex), so no connection can see it half bound.
  std::lock_guard lk(qp->tx_mu);
  cm_bind_locked(qp, cm_id, cm_serial, on_disconnect);
}

int qp_cm_adopt(Qp* qp, void* cm_id, uint64_t cm_serial, DisconnectFn on_disconnect) {
  std::lock_guard lk(qp->tx_mu);
  if (qp->ud) return EINVAL;
  if (qp->cm_managed) return qp->cm_id == cm_id && qp->cm_serial == cm_serial ? 0 : EINVAL;
  const ibv_qp_state st = qp->state.load();
  if (qp->conn_up() || st == IBV_QPS_ERR || st == IBV_QPS_SQE ||
      ((st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD) &&
       qp->attr.dest_qp_num != kRdmaCmPlaceholderQpn))
    return EINVAL;
  cm_bind_locked(qp, cm_id, cm_serial, on_disconnect);
  return 0;
}

void qp_cm_unbind(Qp* qp) {
  qp->on_disconnect = nullptr;
}

bool qp_cm_established(Qp* qp, Endpoint* ep, uint8_t timeout) {
  {
    std::lock_guard lk(qp->tx_mu);
    const ibv_qp_state st = qp->state.load();
    if (st == IBV_QPS_ERR || st == IBV_QPS_RESET) return false;
    // iw_cm_init_qp_attr's RTR and RTS attributes; IRD and ORD as the MPA exchange set them.
    qp->attr.max_rd_atomic = static_cast<uint8_t>(std::max<uint16_t>(ep->negotiated_ord(), 1));
    qp->attr.max_dest_rd_atomic = static_cast<uint8_t>(std::max<uint16_t>(ep->negotiated_ird(), 1));
    qp->attr.rnr_retry = 7;
    qp->attr.retry_cnt = 7;
    qp->attr.timeout = timeout;
    qp->attr.path_mtu = IBV_MTU_4096;
    qp->attr.dest_qp_num = 0;
    qp_set_state_locked(qp, IBV_QPS_RTS);  // through RTR: the connection sets both up
  }
  qp_take_endpoint(qp, ep);
  return true;
}

bool qp_ib_completion_in_effect(Qp* qp) {
  std::lock_guard lk(qp->tx_mu);
  return qp->conn.wait_acks;
}

}  // namespace sv::engine
