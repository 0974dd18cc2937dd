// What a fired fault does to a connected QP. Which frame it hits is fault.cc's decision;
// the requester (TX) and iw_rx (RX) ask it per FPDU, qp_ud.cc per datagram.
#include <sys/socket.h>

#include <cerrno>

#include "engine/log.h"
#include "engine/qp.h"

namespace sv::engine {

void qp_fault_count(Qp* qp, fault::FaultAction a) {
  stats::add(qp->stats, fault::counter_of(a));
}

void qp_fault_hold(Qp* qp, uint32_t ms) {
  uint32_t gen = qp->fault_hold_gen.fetch_add(1, std::memory_order_relaxed) + 1;
  if (gen == 0) gen = qp->fault_hold_gen.fetch_add(1, std::memory_order_relaxed) + 1;  // 0: free
  qp->fault_held.store(gen, std::memory_order_release);
  qp_update_interest(qp);  // out of the epoll set while held (a HUP must not spin us)
  Progress::get().post_after(std::chrono::milliseconds(ms), [ref = QpRef(qp), gen] {
    if (!ref.live()) return;
    Qp* q = ref.get();
    // A later stall extends the hold: only its own timer ends it (and a QP reset ended it).
    uint32_t mine = gen;
    if (!q->fault_held.compare_exchange_strong(mine, 0, std::memory_order_acq_rel)) return;
    qp_update_interest(q);
    {
      std::lock_guard lk(q->rx_mu);
      if (q->conn.fd >= 0) qp_rx_locked(q);
    }
    tx_kick(q);
  });
}

void qp_fault_reset_locked(Qp* qp) {
  const int fd = qp->conn.fd;
  if (fd < 0) return;
  // connect(AF_UNSPEC) disconnects a TCP socket with a RST (tcp_disconnect) and keeps the
  // descriptor ours: its number stays valid until reset or destroy (qp_state.cc), as a
  // close with SO_LINGER 0 would not.
  sockaddr sa{};
  sa.sa_family = AF_UNSPEC;
  if (connect(fd, &sa, sizeof sa) < 0) SV_WARN("qp %u: fault reset: errno %d", qp->qpn(), errno);
  // A pulled cable: what was outstanding fails as when retries run out (IB spec 9.7.5.1.5).
  Progress::get().post([ref = QpRef(qp)] {
    if (ref.live()) qp_conn_lost(ref.get(), IBV_WC_RETRY_EXC_ERR);
  });
}

int qp_inject_fault(Qp* qp, const char* what) {
  fault::FaultAction a;
  uint32_t ms = 0;
  if (!fault::parse_inject(what, a, ms)) return EINVAL;
  if (qp->ud) return EOPNOTSUPP;  // datagrams: the drop/dup/delay rules of SOFTVERBS_FAULT
  std::lock_guard lk(qp->tx_mu);
  if (qp->conn.fd < 0 || !qp->conn_up()) return ENOTCONN;
  switch (a) {
    case fault::FaultAction::reset:
      SV_WARN("fault: qp %u reset (injected)", qp->qpn());
      qp_fault_count(qp, a);
      qp_fault_reset_locked(qp);
      return 0;
    case fault::FaultAction::stall:
      SV_WARN("fault: qp %u stall %u ms (injected)", qp->qpn(), ms);
      qp_fault_count(qp, a);
      qp_fault_hold(qp, ms);
      return 0;
    case fault::FaultAction::corrupt:
      // Only a CRC catches a flipped bit; without one it would be silently wrong data.
      if (!qp->conn.crc) return EOPNOTSUPP;
      qp->fault_corrupt_armed.store(true, std::memory_order_relaxed);  // the next FPDU
      tx_run_locked(qp);
      return 0;
    default:
      return EINVAL;
  }
}

}  // namespace sv::engine
