// The lifecycle of a QP's connection, as one state machine (qp_state.cc).
//
// An RC QP has two states. The IB state (RESET, INIT, RTR, RTS, SQD, SQE, ERR: qp->state) is
// the application's, moved by ibv_modify_qp through the IB spec's transition table (qp.cc),
// and by errors to ERR (qp_set_error). The connection state (qp->conn_state, below) is the
// TCP/MPA stream's: whether FPDUs flow, and how the socket was torn down.
//
//   from \ event   established   peer_closed_idle   error    reset, destroy
//   idle           up            -                  failed   idle
//   up             -             peer_gone          failed   idle
//   peer_gone      up            -                  failed   idle
//   failed         -             -                  failed   idle
//
//   idle       no connection: RESET and INIT, or RTR/RTS before the handshake completes
//   up         conn.fd carries FPDUs; TX and RX run
//   peer_gone  an out-of-band peer closed while nothing was outstanding: the socket is
//              closed and the QP stays in RTS, as an IB requester learns of a vanished
//              peer only through its retries; the next send fails with RETRY_EXC_ERR
//   failed     the QP went to ERR: the socket is shut down both ways so the peer sees the
//              connection end (siw tears down the same way); fd kept until reset/destroy
//
// Every change of it goes through conn_transition_locked on the progress thread with
// rx_mu and tx_mu held, which owns the teardown each arrow needs. rdma_cm and the verbs
// layer never write QP fields or take QP locks: they call the functions below.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace sv::engine {

struct Qp;
class Endpoint;

enum class ConnState : uint8_t { idle, up, peer_gone, failed };
enum class ConnEvent : uint8_t {
  established,       // the MPA handshake completed and the QP takes the socket
  peer_closed_idle,  // EOF or reset from an out-of-band peer with nothing outstanding
  error,             // the QP went to ERR
  reset,             // ibv_modify_qp to RESET
  destroy,           // ibv_destroy_qp
};

const char* conn_state_name(ConnState s);
const char* conn_event_name(ConnEvent e);
const char* qp_state_name(ibv_qp_state s);

// The transition table: the state `ev` leads to from `s`, or nullopt if `ev` cannot happen
// in `s` (a pure function: tests/unit/test_engine_qp_state.cc).
std::optional<ConnState> conn_next(ConnState s, ConnEvent ev);

// ---- driven by the engine ---------------------------------------------------------------
// Moves the connection to conn_next(state, ev) and tears down what that arrow needs:
// established registers the socket; peer_closed_idle closes it; error shuts it down both
// ways; reset and destroy send the acks the peer waits for, then close with a FIN after
// queued data (linger). Progress thread, rx_mu and tx_mu held. False if `ev` is not valid in
// the current state (nothing changes).
bool conn_transition_locked(Qp* qp, ConnEvent ev);
// The same, run on the progress thread with the locks taken; waits for it.
void conn_transition_sync(Qp* qp, ConnEvent ev);

// ---- driven by rdma_cm (src/rdmacm) -------------------------------------------------------
using DisconnectFn = void (*)(void* cm_id, uint64_t cm_serial);
// rdma_cm owns this QP's set-up: it is told (on the progress thread, no QP lock held) when
// the connection ends; ibv_modify_qp to RTR starts no out-of-band handshake.
void qp_cm_bind(Qp* qp, void* cm_id, uint64_t cm_serial, DisconnectFn on_disconnect);
// The destination QPN rdma_init_qp_attr's RTR step gives (QP1, IB's GSI QP, which no RC QP
// can reach): a program that moves its own QP with rdma_cm's attributes (an external QP)
// has no peer yet, and rdma_cm connects it later. Its RTR starts no out-of-band handshake.
inline constexpr uint32_t kRdmaCmPlaceholderQpn = 1;
// rdma_connect/rdma_accept naming the application's own QP (conn_param.qp_num): binds it as
// qp_cm_bind does, unless it cannot be this id's: a UD QP, one bound to another id, one
// connected, or one whose out-of-band handshake is under way (RTR with a real peer). EINVAL
// then, and the QP is left as it was.
int qp_cm_adopt(Qp* qp, void* cm_id, uint64_t cm_serial, DisconnectFn on_disconnect);
// rdma_destroy_qp: no more disconnect calls for this id.
void qp_cm_unbind(Qp* qp);
// The connection's MPA exchange completed: the QP goes through RTR to RTS with the
// negotiated IRD/ORD (as iw_cm_init_qp_attr and siw do) and takes the socket. False if the
// application moved the QP to ERR or RESET meanwhile: it stays there, as siw refuses RTS
// then, and the caller fails the connection. `timeout` is the RTS attribute (local ACK
// timeout exponent, 0-31): rdma_cm's default, or what RDMA_OPTION_ID_ACK_TIMEOUT set.
bool qp_cm_established(Qp* qp, Endpoint* ep, uint8_t timeout);
// Whether IB's completion rule is in effect on this QP's connection (verbs_ext.h).
bool qp_ib_completion_in_effect(Qp* qp);

}  // namespace sv::engine
