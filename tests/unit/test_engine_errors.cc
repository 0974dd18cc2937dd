// Every error mapping (engine/errors.cc) as one table: what we detect -> the Terminate we send
// (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8; siw's choices where the RFCs leave room) -> the
// completion status a peer's requester reports when it receives that Terminate.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "engine/qp.h"

namespace {

using namespace sv::engine;
using namespace sv::wire;

struct Row {
  std::string what;
  std::function<Terminate()> make;
  TermLayer layer;
  uint8_t etype;
  uint8_t ecode;
  ibv_wc_status peer_status;  // terminate_to_wc_status of the result
};

uint8_t u(auto e) {
  return static_cast<uint8_t>(e);
}

std::vector<Row> rows() {
  const uint8_t tagged = u(DdpEtype::tagged), untagged = u(DdpEtype::untagged);
  const uint8_t prot = u(RdmapEtype::remote_protection), op = u(RdmapEtype::remote_operation);
  return {
      // Tagged placement (RDMA Write, Read Response): DDP tagged buffer errors, except rights.
      {"write bad stag", [] { return access_to_terminate(AccessResult::invalid_key, true); },
       TermLayer::ddp, tagged, u(DdpTaggedEcode::invalid_stag), IBV_WC_REM_ACCESS_ERR},
      {"write bounds", [] { return access_to_terminate(AccessResult::bounds, true); },
       TermLayer::ddp, tagged, u(DdpTaggedEcode::base_bounds), IBV_WC_REM_ACCESS_ERR},
      {"write other pd", [] { return access_to_terminate(AccessResult::wrong_pd, true); },
       TermLayer::ddp, tagged, u(DdpTaggedEcode::stag_not_associated), IBV_WC_REM_ACCESS_ERR},
      {"write rights", [] { return access_to_terminate(AccessResult::access_rights, true); },
       TermLayer::rdmap, prot, u(RdmapEcode::access_rights), IBV_WC_REM_ACCESS_ERR},
      // Read Request / Atomic sources: RDMAP remote protection.
      {"read bad stag", [] { return access_to_terminate(AccessResult::invalid_key, false); },
       TermLayer::rdmap, prot, u(RdmapEcode::invalid_stag), IBV_WC_REM_ACCESS_ERR},
      {"read bounds", [] { return access_to_terminate(AccessResult::bounds, false); },
       TermLayer::rdmap, prot, u(RdmapEcode::base_bounds), IBV_WC_REM_ACCESS_ERR},
      {"read other pd", [] { return access_to_terminate(AccessResult::wrong_pd, false); },
       TermLayer::rdmap, prot, u(RdmapEcode::stag_not_associated), IBV_WC_REM_ACCESS_ERR},
      {"read rights", [] { return access_to_terminate(AccessResult::access_rights, false); },
       TermLayer::rdmap, prot, u(RdmapEcode::access_rights), IBV_WC_REM_ACCESS_ERR},
      // Send with Invalidate naming a region, a type 1 window or nothing (RFC 5040 §7.2).
      {"cannot invalidate", [] { return rdmap_prot_term(RdmapEcode::cannot_invalidate); },
       TermLayer::rdmap, prot, u(RdmapEcode::cannot_invalidate), IBV_WC_REM_INV_REQ_ERR},
      // Our own receive buffer fails its check (siw: DDP catastrophic); IB's REM_OP_ERR.
      {"receive buffer", [] { return ddp_catastrophic_term(); }, TermLayer::ddp,
       u(DdpEtype::catastrophic), 0, IBV_WC_REM_OP_ERR},
      // More Read/Atomic Requests than the IRD we advertised (RFC 5040 §5.2).
      {"ird overrun", [] { return rdmap_catastrophic_term(); }, TermLayer::rdmap,
       u(RdmapEtype::catastrophic), 0, IBV_WC_FATAL_ERR},
      // Headers we refuse.
      {"ddp version", [] { return ddp_error_term(DdpError::ddp_version); }, TermLayer::ddp,
       untagged, u(DdpUntaggedEcode::invalid_version), IBV_WC_REM_INV_REQ_ERR},
      {"rdmap version", [] { return ddp_error_term(DdpError::rdmap_version); }, TermLayer::rdmap,
       op, u(RdmapEcode::invalid_version), IBV_WC_REM_OP_ERR},
      {"bad qn", [] { return ddp_error_term(DdpError::bad_qn); }, TermLayer::ddp, untagged,
       u(DdpUntaggedEcode::invalid_qn), IBV_WC_REM_INV_REQ_ERR},
      {"unknown opcode", [] { return ddp_error_term(DdpError::bad_opcode); }, TermLayer::rdmap, op,
       u(RdmapEcode::unexpected_opcode), IBV_WC_REM_OP_ERR},
      {"payload on a request", [] { return ddp_error_term(DdpError::unexpected_payload); },
       TermLayer::rdmap, op, u(RdmapEcode::unexpected_opcode), IBV_WC_REM_OP_ERR},
      {"short ulpdu", [] { return ddp_error_term(DdpError::short_ulpdu); }, TermLayer::rdmap, op,
       u(RdmapEcode::unexpected_opcode), IBV_WC_REM_OP_ERR},
      // Untagged buffers.
      {"no buffer", [] { return untagged_term(DdpUntaggedEcode::no_buffer); }, TermLayer::ddp,
       untagged, u(DdpUntaggedEcode::no_buffer), IBV_WC_RNR_RETRY_EXC_ERR},
      {"msn range", [] { return untagged_term(DdpUntaggedEcode::msn_range); }, TermLayer::ddp,
       untagged, u(DdpUntaggedEcode::msn_range), IBV_WC_REM_INV_REQ_ERR},
      {"invalid mo", [] { return untagged_term(DdpUntaggedEcode::invalid_mo); }, TermLayer::ddp,
       untagged, u(DdpUntaggedEcode::invalid_mo), IBV_WC_REM_INV_REQ_ERR},
      {"send too long", [] { return untagged_term(DdpUntaggedEcode::too_long); }, TermLayer::ddp,
       untagged, u(DdpUntaggedEcode::too_long), IBV_WC_REM_INV_REQ_ERR},
      // RDMAP operation errors and the LLP.
      {"unexpected opcode", [] { return rdmap_op_term(RdmapEcode::unexpected_opcode); },
       TermLayer::rdmap, op, u(RdmapEcode::unexpected_opcode), IBV_WC_REM_OP_ERR},
      {"catastrophic stream", [] { return rdmap_op_term(RdmapEcode::catastrophic_stream); },
       TermLayer::rdmap, op, u(RdmapEcode::catastrophic_stream), IBV_WC_REM_OP_ERR},
      {"mpa crc", [] { return llp_term(LlpEcode::crc_error); }, TermLayer::llp, 0,
       u(LlpEcode::crc_error), IBV_WC_RETRY_EXC_ERR},
      {"mpa stream lost", [] { return llp_term(LlpEcode::stream_lost); }, TermLayer::llp, 0,
       u(LlpEcode::stream_lost), IBV_WC_RETRY_EXC_ERR},
  };
}

TEST(ErrorMapping, EveryDetectedErrorHasItsTerminateAndPeerStatus) {
  for (const Row& r : rows()) {
    SCOPED_TRACE(r.what);
    const Terminate t = r.make();
    EXPECT_EQ(t.layer, r.layer);
    EXPECT_EQ(t.etype, r.etype);
    EXPECT_EQ(t.ecode, r.ecode);
    EXPECT_EQ(terminate_to_wc_status(t), r.peer_status);
  }
}

// A misaligned Atomic: RFC 7306 has no code for it, so the responder sends Remote Operation /
// Catastrophic (Stream); the requester's Atomic at the head of its SQ reports IB's
// IBV_WC_REM_INV_REQ_ERR (rxe), anything else the Terminate's own status.
TEST(ErrorMapping, AMisalignedAtomicIsAnInvalidRequestOnlyForAnAtomic) {
  const Terminate t = rdmap_op_term(RdmapEcode::catastrophic_stream);
  EXPECT_EQ(terminate_to_wc_status(t, true), IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(terminate_to_wc_status(t, false), IBV_WC_REM_OP_ERR);
  EXPECT_EQ(terminate_to_wc_status(rdmap_op_term(RdmapEcode::unexpected_opcode), true),
            IBV_WC_REM_OP_ERR);
}

// A Terminate with a layer or type nobody sends still maps to an error, never to success.
TEST(ErrorMapping, UnknownTerminatesAreErrors) {
  for (int layer = 0; layer < 4; ++layer)
    for (int etype = 0; etype < 16; ++etype) {
      Terminate t;
      t.layer = static_cast<TermLayer>(layer);
      t.etype = static_cast<uint8_t>(etype);
      t.ecode = 0x77;
      EXPECT_NE(terminate_to_wc_status(t), IBV_WC_SUCCESS) << layer << "/" << etype;
    }
}

}  // namespace
