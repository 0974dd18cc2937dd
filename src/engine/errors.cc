// Every error mapping in one place: internal access results, DDP header errors, untagged
// and RDMAP operation errors and LLP (MPA) errors -> RFC 5040/5041/5044 Terminate codes,
// and Terminate codes -> ibv_wc_status for the WQE that provoked them. Table-tested in
// tests/unit/test_engine_errors.cc.
#include "engine/qp.h"
#include "wire/terminate_codes.h"

namespace sv::engine {

using namespace wire;

namespace {
Terminate term(TermLayer layer, uint8_t etype, uint8_t ecode) {
  Terminate t;
  t.layer = layer;
  t.etype = etype;
  t.ecode = ecode;
  return t;
}
}  // namespace

Terminate access_to_terminate(AccessResult r, bool tagged) {
  Terminate t;
  if (tagged) {
    // RFC 5041 §7.2: tagged buffer errors are DDP layer, etype 1.
    t.layer = TermLayer::ddp;
    t.etype = static_cast<uint8_t>(DdpEtype::tagged);
    switch (r) {
      case AccessResult::invalid_key:
        t.ecode = static_cast<uint8_t>(DdpTaggedEcode::invalid_stag);
        break;
      case AccessResult::bounds:
        t.ecode = static_cast<uint8_t>(DdpTaggedEcode::base_bounds);
        break;
      case AccessResult::wrong_pd:
        t.ecode = static_cast<uint8_t>(DdpTaggedEcode::stag_not_associated);
        break;
      case AccessResult::access_rights:
      case AccessResult::ok:
        // DDP has no access-rights code (RFC 5041 §7.2); RDMAP does (RFC 5040 §7.2).
        t.layer = TermLayer::rdmap;
        t.etype = static_cast<uint8_t>(RdmapEtype::remote_protection);
        t.ecode = static_cast<uint8_t>(RdmapEcode::access_rights);
        break;
    }
    return t;
  }
  // Read Request / Atomic source checks: RDMAP remote protection (RFC 5040 §7.2).
  t.layer = TermLayer::rdmap;
  t.etype = static_cast<uint8_t>(RdmapEtype::remote_protection);
  switch (r) {
    case AccessResult::invalid_key:
      t.ecode = static_cast<uint8_t>(RdmapEcode::invalid_stag);
      break;
    case AccessResult::bounds:
      t.ecode = static_cast<uint8_t>(RdmapEcode::base_bounds);
      break;
    case AccessResult::wrong_pd:
      t.ecode = static_cast<uint8_t>(RdmapEcode::stag_not_associated);
      break;
    case AccessResult::access_rights:
    case AccessResult::ok:
      t.ecode = static_cast<uint8_t>(RdmapEcode::access_rights);
      break;
  }
  return t;
}

Terminate llp_term(LlpEcode e) {
  return term(TermLayer::llp, 0, static_cast<uint8_t>(e));
}

Terminate ddp_error_term(DdpError e) {
  Terminate t;
  switch (e) {
    case DdpError::ddp_version:
      t.layer = TermLayer::ddp;
      t.etype = static_cast<uint8_t>(DdpEtype::untagged);
      t.ecode = static_cast<uint8_t>(DdpUntaggedEcode::invalid_version);
      break;
    case DdpError::rdmap_version:
      t.layer = TermLayer::rdmap;
      t.etype = static_cast<uint8_t>(RdmapEtype::remote_operation);
      t.ecode = static_cast<uint8_t>(RdmapEcode::invalid_version);
      break;
    case DdpError::bad_qn:
      t.layer = TermLayer::ddp;
      t.etype = static_cast<uint8_t>(DdpEtype::untagged);
      t.ecode = static_cast<uint8_t>(DdpUntaggedEcode::invalid_qn);
      break;
    case DdpError::bad_opcode:
    case DdpError::bad_ref:
    case DdpError::unexpected_payload:
    case DdpError::short_ulpdu:
    case DdpError::ok:
      // siw answers unknown opcodes (e.g. RFC 7306 ones) with RDMAP remote-operation 0x06.
      t.layer = TermLayer::rdmap;
      t.etype = static_cast<uint8_t>(RdmapEtype::remote_operation);
      t.ecode = static_cast<uint8_t>(RdmapEcode::unexpected_opcode);
      break;
  }
  return t;
}

Terminate untagged_term(DdpUntaggedEcode e) {
  return term(TermLayer::ddp, static_cast<uint8_t>(DdpEtype::untagged), static_cast<uint8_t>(e));
}

Terminate rdmap_op_term(RdmapEcode e) {
  return term(TermLayer::rdmap, static_cast<uint8_t>(RdmapEtype::remote_operation),
              static_cast<uint8_t>(e));
}

// siw's answer to a receive buffer that fails its own check (siw_proc_send): DDP catastrophic.
Terminate ddp_catastrophic_term() {
  return term(TermLayer::ddp, static_cast<uint8_t>(DdpEtype::catastrophic), 0);
}

Terminate rdmap_catastrophic_term() {
  return term(TermLayer::rdmap, static_cast<uint8_t>(RdmapEtype::catastrophic), 0);
}

Terminate rdmap_prot_term(RdmapEcode e) {
  return term(TermLayer::rdmap, static_cast<uint8_t>(RdmapEtype::remote_protection),
              static_cast<uint8_t>(e));
}

ibv_wc_status terminate_to_wc_status(const Terminate& t, bool head_is_atomic) {
  // RFC 7306 names no Terminate code for a misaligned Atomic: softverbs' responder answers
  // it with Remote Operation / Catastrophic (Stream), and an Atomic at the head of the SQ
  // reports it as IB does, IBV_WC_REM_INV_REQ_ERR (rxe: RESPST_ERR_MISALIGNED_ATOMIC).
  if (head_is_atomic && t.layer == TermLayer::rdmap &&
      t.etype == static_cast<uint8_t>(RdmapEtype::remote_operation) &&
      t.ecode == static_cast<uint8_t>(RdmapEcode::catastrophic_stream))
    return IBV_WC_REM_INV_REQ_ERR;
  switch (t.layer) {
    case TermLayer::rdmap:
      if (t.etype == static_cast<uint8_t>(RdmapEtype::remote_protection)) {
        // A Send with Invalidate naming what the peer cannot invalidate: an invalid request
        // (IB class J), not an access violation.
        if (t.ecode == static_cast<uint8_t>(RdmapEcode::cannot_invalidate))
          return IBV_WC_REM_INV_REQ_ERR;
        return IBV_WC_REM_ACCESS_ERR;
      }
      if (t.etype == static_cast<uint8_t>(RdmapEtype::remote_operation)) return IBV_WC_REM_OP_ERR;
      return IBV_WC_FATAL_ERR;
    case TermLayer::ddp:
      if (t.etype == static_cast<uint8_t>(DdpEtype::tagged)) return IBV_WC_REM_ACCESS_ERR;
      if (t.etype == static_cast<uint8_t>(DdpEtype::untagged)) {
        // No receive buffer: the responder gave up waiting (its RNR retries ran out).
        if (t.ecode == static_cast<uint8_t>(DdpUntaggedEcode::no_buffer))
          return IBV_WC_RNR_RETRY_EXC_ERR;
        // Message too long and the rest: the request was invalid for the responder.
        return IBV_WC_REM_INV_REQ_ERR;
      }
      // A local error at the responder (its receive buffer failed its own check): IB's
      // Remote Operational Error.
      if (t.etype == static_cast<uint8_t>(DdpEtype::catastrophic)) return IBV_WC_REM_OP_ERR;
      return IBV_WC_FATAL_ERR;
    case TermLayer::llp:
      return IBV_WC_RETRY_EXC_ERR;
  }
  return IBV_WC_GENERAL_ERR;
}

}  // namespace sv::engine
