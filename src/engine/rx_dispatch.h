// Per-opcode handling of inbound segments, shared by iw_rx.cc (the parser) and
// qp_responder.cc (which implements it). Caller holds rx_mu.
#pragma once
#include "engine/qp.h"

namespace sv::engine {

enum class RxAction : uint8_t {
  place,  // payload goes to conn.place
  stall,  // no receive buffer yet: stop reading until one is posted
  dead,   // protocol or access error: the QP is in error, stop parsing
};

// Called when a segment header is complete (conn.seg decoded).
RxAction rx_on_header(Qp* qp);
// Called after the segment's trailer; false if the QP went to error.
bool rx_on_segment_end(Qp* qp);
// Fails the QP from the RX side: completes the receive in progress with `recv_status`,
// sends Terminate `t` (if send_term) and errors the QP.
void rx_fail(Qp* qp, const wire::Terminate& t, bool send_term, ibv_wc_status send_status,
             ibv_wc_status recv_status);

}  // namespace sv::engine
