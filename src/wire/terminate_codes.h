// Terminate error types and codes, RFC 5040 §7 (RDMAP), RFC 5041 §7 (DDP), RFC 5044 §8 +
// RFC 6581 §7 (LLP/MPA). Tagged and untagged DDP codes stay separate as in the RFC.
#pragma once
#include <cstdint>

namespace sv::wire {

enum class RdmapEtype : uint8_t { catastrophic = 0, remote_protection = 1, remote_operation = 2 };
enum class RdmapEcode : uint8_t {
  // remote protection
  invalid_stag = 0x00,
  base_bounds = 0x01,
  access_rights = 0x02,
  stag_not_associated = 0x03,
  to_wrap = 0x04,
  // remote operation
  invalid_version = 0x05,
  unexpected_opcode = 0x06,
  catastrophic_stream = 0x07,
  catastrophic_global = 0x08,
  cannot_invalidate = 0x09,
  unspecified = 0xFF,
};

enum class DdpEtype : uint8_t { catastrophic = 0, tagged = 1, untagged = 2 };
enum class DdpTaggedEcode : uint8_t {
  invalid_stag = 0x00,
  base_bounds = 0x01,
  stag_not_associated = 0x02,
  to_wrap = 0x03,
  invalid_version = 0x04,
};
enum class DdpUntaggedEcode : uint8_t {
  invalid_qn = 0x01,
  no_buffer = 0x02,
  msn_range = 0x03,
  invalid_mo = 0x04,
  too_long = 0x05,
  invalid_version = 0x06,
};

enum class LlpEcode : uint8_t {
  stream_lost = 0x01,
  crc_error = 0x02,
  fpdu_start = 0x03,
  invalid_req_resp = 0x04,
  local_catastrophic = 0x05,
  insufficient_ird = 0x06,
  no_matching_rtr = 0x07,
};

}  // namespace sv::wire
