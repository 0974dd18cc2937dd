// DDP segment headers (RFC 5041 §5.1-5.3) and RDMAP messages (RFC 5040 §4, RFC 7306 §4-6)
// as they sit inside one MPA FPDU (RFC 5044 §4). Pure codecs over byte spans.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace sv::wire {

// RDMAP opcodes, RFC 5040 §4.1 Table 3 plus RFC 7306 §5.
enum class RdmapOpcode : uint8_t {
  rdma_write = 0,
  read_request = 1,
  read_response = 2,
  send = 3,
  send_inv = 4,
  send_se = 5,
  send_se_inv = 6,
  terminate = 7,
  imm_data = 8,          // RFC 7306
  imm_data_se = 9,       // RFC 7306
  atomic_request = 10,   // RFC 7306
  atomic_response = 11,  // RFC 7306
  // softverbs only (a reserved RDMAP opcode, sent only to a softverbs peer that asked for it
  // in MPA, SOFTVERBS_IB_COMPLETION=1): the responder's cumulative count of Send, RDMA Write
  // and Immediate Data messages it has placed, in the MSN field of an untagged QN 4 header.
  // It gives InfiniBand's completion rule (a Send or Write completes once the responder has
  // it) and puts a remote error on the WQE that caused it.
  sv_ack = 12,
  // softverbs only: a shared-memory control message (issue 29), untagged QN 5, its fixed
  // kShmCtrlLen bytes in the header (ShmCtrl). Sent only to a peer that said in MPA that it
  // is softverbs; the two move the connection's FPDU stream into shared memory rings.
  sv_shm = 13,
};
inline constexpr unsigned kRdmapOpcodeCount = 14;

// Untagged queue numbers, RFC 5040 §5.1 (0-2) and RFC 7306 §5 (3).
inline constexpr uint32_t kQnSend = 0;
inline constexpr uint32_t kQnReadRequest = 1;  // also RFC 7306 Atomic Requests
inline constexpr uint32_t kQnTerminate = 2;
inline constexpr uint32_t kQnAtomicResponse = 3;
inline constexpr uint32_t kQnSvAck = 4;  // softverbs Placement Ack
inline constexpr uint32_t kQnSvShm = 5;  // softverbs shared-memory control

inline constexpr uint8_t kDdpVersion = 1;         // RFC 5041 §5.1 DV
inline constexpr uint8_t kRdmapVersion = 1;       // RFC 5040 §4.2 RV
inline constexpr size_t kDdpTaggedHdrLen = 14;    // ctrl(2) STag(4) TO(8)
inline constexpr size_t kDdpUntaggedHdrLen = 18;  // ctrl(2) RsvdULP(4) QN(4) MSN(4) MO(4)
inline constexpr size_t kReadRequestLen = 28;     // RFC 5040 §4.4
inline constexpr size_t kTerminateCtrlLen = 4;    // RFC 5040 §4.8
inline constexpr size_t kAtomicRequestLen = 52;   // RFC 7306 §5.2
inline constexpr size_t kAtomicResponseLen = 12;  // RFC 7306 §5.3
inline constexpr size_t kImmDataLen = 8;          // RFC 7306 §6: 8 bytes of immediate data
inline constexpr size_t kShmCtrlLen = 64;         // softverbs ShmCtrl
inline constexpr size_t kMaxUlpduLen = 65535;     // 16-bit ULPDU_Length, RFC 5044 §4.1

struct OpcodeInfo {
  const char* name;
  bool tagged;
  uint8_t qn;        // untagged queue (ignored for tagged)
  uint8_t hdr_len;   // DDP header + RDMAP header bytes before the payload
  bool rfc7306;      // only sent to a peer known to implement RFC 7306
  bool has_payload;  // false: a payload is a protocol error
};

// One entry per opcode; dispatch and names derive from it.
inline constexpr std::array<OpcodeInfo, kRdmapOpcodeCount> kOpcodeTable{{
    {"RDMA Write", true, 0, kDdpTaggedHdrLen, false, true},
    {"RDMA Read Request", false, kQnReadRequest, kDdpUntaggedHdrLen + kReadRequestLen, false,
     false},
    {"RDMA Read Response", true, 0, kDdpTaggedHdrLen, false, true},
    {"Send", false, kQnSend, kDdpUntaggedHdrLen, false, true},
    {"Send with Invalidate", false, kQnSend, kDdpUntaggedHdrLen, false, true},
    {"Send with SE", false, kQnSend, kDdpUntaggedHdrLen, false, true},
    {"Send with SE and Invalidate", false, kQnSend, kDdpUntaggedHdrLen, false, true},
    {"Terminate", false, kQnTerminate, kDdpUntaggedHdrLen + kTerminateCtrlLen, false, true},
    {"Immediate Data", false, kQnSend, kDdpUntaggedHdrLen + kImmDataLen, true, false},
    {"Immediate Data with SE", false, kQnSend, kDdpUntaggedHdrLen + kImmDataLen, true, false},
    {"Atomic Request", false, kQnReadRequest, kDdpUntaggedHdrLen + kAtomicRequestLen, true, false},
    {"Atomic Response", false, kQnAtomicResponse, kDdpUntaggedHdrLen + kAtomicResponseLen, true,
     false},
    {"softverbs Placement Ack", false, kQnSvAck, kDdpUntaggedHdrLen, true, false},
    {"softverbs shared memory", false, kQnSvShm, kDdpUntaggedHdrLen + kShmCtrlLen, true, false},
}};
static_assert(kOpcodeTable.size() == kRdmapOpcodeCount);

inline const OpcodeInfo& opcode_info(RdmapOpcode op) {
  return kOpcodeTable[static_cast<unsigned>(op)];
}
const char* to_string(RdmapOpcode op) noexcept;

// Decoded DDP + RDMAP control of one segment.
struct DdpSegment {
  RdmapOpcode opcode = RdmapOpcode::send;
  bool tagged = false;
  bool last = false;
  // tagged model (RFC 5041 §5.2)
  uint32_t stag = 0;
  uint64_t to = 0;
  // untagged model (RFC 5041 §5.3)
  uint32_t rsvd_ulp = 0;  // Invalidate STag for Send with Invalidate (RFC 5040 §4.3)
  uint32_t qn = 0;
  uint32_t msn = 0;
  uint32_t mo = 0;
  uint16_t hdr_len = 0;      // header bytes including the opcode's extra RDMAP header
  uint16_t payload_len = 0;  // ULPDU_Length - hdr_len
  bool sv_ack_req = false;   // kDdpSvAckReq
  bool sv_shm_cap = false;   // kDdpSvShmCap
  // kDdpSvRef (a tagged RDMA Write or Read Response): the data is not in this segment but
  // at ref_addr in the sender's memory, ref_len bytes (SvRef).
  bool sv_ref = false;
  uint64_t ref_addr = 0;
  uint32_t ref_len = 0;
};

// A reserved DDP control bit (RFC 5041 §5.1: zero on transmit, ignored on receive) that
// softverbs sets, only toward a peer that asked for Placement Acks, on the last segment of a
// message whose placement it wants acked now (IB's AckReq): a signaled WR, or a periodic one
// so unsignaled WRs can retire.
inline constexpr uint8_t kDdpSvAckReq = 0x20;
// Another reserved DDP control bit, set by softverbs on every FPDU toward a softverbs peer when
// it understands the shared-memory messages (RdmapOpcode::sv_shm) and would accept an offer.
// An initiator offers only once it has seen it: a softverbs build without shared memory ignores
// the bit (RFC 5041 §5.1), and never receives an opcode it would refuse.
inline constexpr uint8_t kDdpSvShmCap = 0x10;
// A third reserved DDP control bit, on a tagged RDMA Write or Read Response segment only, sent
// only through a shared-memory ring to a peer that proved at set-up that it can read our memory
// (process_vm_readv, ShmCtrl::kPeerPull): the segment carries no data but an SvRef after its
// tagged header, naming the data in the sender's address space. The receiver checks the
// STag, TO and length as for the data itself and copies it straight into the target: one copy
// instead of two through the ring. On any other opcode the bit is ignored (RFC 5041 §5.1).
inline constexpr uint8_t kDdpSvRef = 0x08;
inline constexpr size_t kSvRefLen = 16;  // address(8) length(4) reserved(4)

// Why a segment header was refused; errors.cc maps each to a Terminate triple.
enum class DdpError : uint8_t {
  ok,
  ddp_version,         // DV != 1
  rdmap_version,       // RV != 1
  bad_opcode,          // > kRdmapOpcodeCount or tagged bit does not match the opcode
  short_ulpdu,         // ULPDU_Length smaller than the opcode's header
  unexpected_payload,  // Read Request / Atomic / Immediate carrying extra bytes
  bad_qn,              // untagged queue number not the one the opcode uses
  bad_ref,             // a segment by reference (kDdpSvRef) with data, or of no length
};
const char* to_string(DdpError e) noexcept;

// Decodes the header of a ULPDU of length ulpdu_len; `hdr` must hold at least
// min(ulpdu_len, 2) bytes, and all the opcode's header bytes once known (use
// ddp_header_len to ask how many are needed).
[[nodiscard]] DdpError ddp_decode(std::span<const std::byte> hdr, uint16_t ulpdu_len,
                                  DdpSegment& out) noexcept;
// Header bytes needed to decode a ULPDU whose first two bytes are `ctrl` (0 if the
// opcode is invalid: ddp_decode will report why).
size_t ddp_header_len(std::span<const std::byte, 2> ctrl) noexcept;

// Encoders write the DDP + RDMAP control header and return its length.
size_t encode_tagged(std::byte* out, RdmapOpcode op, bool last, uint32_t stag,
                     uint64_t to) noexcept;
size_t encode_untagged(std::byte* out, RdmapOpcode op, bool last, uint32_t rsvd_ulp, uint32_t qn,
                       uint32_t msn, uint32_t mo) noexcept;
// A tagged segment by reference (kDdpSvRef): the tagged header, then the SvRef.
size_t encode_tagged_ref(std::byte* out, RdmapOpcode op, bool last, uint32_t stag, uint64_t to,
                         uint64_t addr, uint32_t len) noexcept;

// RFC 5040 §4.4 RDMA Read Request header.
struct ReadRequest {
  uint32_t sink_stag = 0;
  uint64_t sink_to = 0;
  uint32_t read_size = 0;
  uint32_t source_stag = 0;
  uint64_t source_to = 0;
};
void encode_read_request(std::byte* out, const ReadRequest& r) noexcept;
ReadRequest decode_read_request(const std::byte* in) noexcept;

// RFC 7306 §5.2 Atomic Request header.
enum class AtomicOp : uint8_t { fetch_add = 0, swap = 1, compare_swap = 2 };
struct AtomicRequest {
  AtomicOp op = AtomicOp::fetch_add;
  uint32_t req_id = 0;
  uint32_t stag = 0;
  uint64_t to = 0;
  uint64_t add_swap = 0;
  uint64_t add_swap_mask = 0;
  uint64_t compare = 0;
  uint64_t compare_mask = 0;
};
void encode_atomic_request(std::byte* out, const AtomicRequest& r) noexcept;
// Returns false for an unknown AtomicOpCode.
bool decode_atomic_request(const std::byte* in, AtomicRequest& r) noexcept;

// RFC 7306 §5.3 Atomic Response header.
struct AtomicResponse {
  uint32_t req_id = 0;
  uint64_t original = 0;
};
void encode_atomic_response(std::byte* out, const AtomicResponse& r) noexcept;
AtomicResponse decode_atomic_response(const std::byte* in) noexcept;

// softverbs shared-memory set-up (issue 29), carried in order on the TCP stream:
//   initiator -> offer  (a sealed memfd: its owner's pid and descriptor, the nonce written in
//                        its header, the ring size, the host's boot id);
//   responder -> accept (everything it sends after this goes through the ring) or decline;
//   initiator -> switch (everything it sends after this goes through the ring).
// After each side's accept/switch, the TCP stream carries only doorbell bytes (shm_ring.h).
struct ShmCtrl {
  enum class Type : uint8_t { offer = 1, accept = 2, decline = 3, switch_over = 4 };
  Type type = Type::offer;
  uint32_t ring_bytes = 0;
  uint64_t nonce = 0;
  uint32_t pid = 0;
  uint32_t fd = 0;
  std::array<std::byte, 16> boot_id{};
  uint64_t netns = 0;  // the offering process' network namespace (its inode number)
  // Offer and accept: where the sender's own mapping of the segment starts, so that the peer
  // can prove it may read the sender's memory (process_vm_readv of a challenge it writes into
  // the segment's header, read back through this address) before it takes kDdpSvRef segments.
  uint64_t base_addr = 0;
  // Accept and switch: kPeerPull if the sender read its challenge back that way, so the peer
  // may send it kDdpSvRef segments.
  static constexpr uint8_t kPeerPull = 1;
  // Offer and accept: the sender keeps its count of the peer's messages it placed in the
  // segment (transport::ShmRingCtrl::placed).
  static constexpr uint8_t kPublishesPlaced = 2;
  uint8_t flags = 0;
};
void encode_shm_ctrl(std::byte* out, const ShmCtrl& c) noexcept;  // kShmCtrlLen bytes
// False if the type is unknown.
[[nodiscard]] bool decode_shm_ctrl(const std::byte* in, ShmCtrl& out) noexcept;

// RFC 5040 §4.8 Terminate control word.
enum class TermLayer : uint8_t { rdmap = 0, ddp = 1, llp = 2 };
struct Terminate {
  TermLayer layer = TermLayer::rdmap;
  uint8_t etype = 0;
  uint8_t ecode = 0;
  bool m = false;  // DDP segment length valid
  bool d = false;  // DDP header included
  bool r = false;  // RDMAP header included
};
void encode_terminate(std::byte* out, const Terminate& t) noexcept;
Terminate decode_terminate(const std::byte* in) noexcept;

// FPDU framing (RFC 5044 §4): ULPDU_Length(2) | ULPDU | pad to 4 | CRC32c(4).
inline constexpr size_t fpdu_pad(size_t ulpdu_len) {
  return (4 - ((2 + ulpdu_len) & 3)) & 3;
}
inline constexpr size_t fpdu_len(size_t ulpdu_len) {
  return 2 + ulpdu_len + fpdu_pad(ulpdu_len) + 4;
}
inline constexpr size_t kMpaCrcLen = 4;

}  // namespace sv::wire
