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
// Whose fault an RX failure is, and so what our own outstanding send WQEs complete with.
// What the peer's WQE completes with is the Terminate's to say (terminate_to_wc_status).
enum class RxBlame : uint8_t {
  peer,      // the peer's message broke a rule: it learns from our Terminate; ours are
             // flushed (IBV_WC_WR_FLUSH_ERR), as an IB responder's own queue is
  response,  // a response to our own request is wrong: IBV_WC_BAD_RESP_ERR (IB 10.8.3.1)
  stream,    // the byte stream is corrupt (MPA CRC, RFC 5044 §6): IBV_WC_RETRY_EXC_ERR, as
             // when IB's retries run out on a link that corrupts every packet
};

// Fails the QP from the RX side: sends Terminate `t`, moves the QP to ERR, and completes
// the receive in progress with `recv_status` (ahead of the flush). An access violation
// (the Terminate says remote access error, or our own receive buffer failed its check:
// recv_status IBV_WC_LOC_PROT_ERR) raises IBV_EVENT_QP_ACCESS_ERR, anything else
// IBV_EVENT_QP_FATAL.
void rx_fail(Qp* qp, const wire::Terminate& t, RxBlame blame,
             ibv_wc_status recv_status = IBV_WC_WR_FLUSH_ERR);

}  // namespace sv::engine
