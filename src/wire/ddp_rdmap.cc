#include "wire/ddp_rdmap.h"

#include <cstring>

#include "wire/be.h"

namespace sv::wire {
namespace {

// RFC 5041 §5.1: |T|L|Rsvd(4)|DV(2)|  RFC 5040 §4.2: |RV(2)|Rsvd(2)|Opcode(4)|
constexpr uint8_t kDdpTagged = 0x80;
constexpr uint8_t kDdpLast = 0x40;
constexpr uint8_t kDdpDvMask = 0x03;
constexpr unsigned kRdmapRvShift = 6;
constexpr uint8_t kRdmapOpMask = 0x0F;

uint8_t ddp_ctrl(bool tagged, bool last) {
  return static_cast<uint8_t>((tagged ? kDdpTagged : 0) | (last ? kDdpLast : 0) | kDdpVersion);
}
uint8_t rdmap_ctrl(RdmapOpcode op) {
  return static_cast<uint8_t>((kRdmapVersion << kRdmapRvShift) | static_cast<uint8_t>(op));
}

}  // namespace

const char* to_string(RdmapOpcode op) noexcept {
  const auto i = static_cast<unsigned>(op);
  return i < kRdmapOpcodeCount ? kOpcodeTable[i].name : "unknown opcode";
}

const char* to_string(DdpError e) noexcept {
  switch (e) {
    case DdpError::ok:
      return "ok";
    case DdpError::ddp_version:
      return "DDP version";
    case DdpError::rdmap_version:
      return "RDMAP version";
    case DdpError::bad_opcode:
      return "unexpected RDMAP opcode";
    case DdpError::short_ulpdu:
      return "ULPDU shorter than its header";
    case DdpError::unexpected_payload:
      return "payload on a header-only message";
    case DdpError::bad_qn:
      return "invalid queue number";
    case DdpError::bad_ref:
      return "bad segment by reference";
  }
  return "?";
}

namespace {
// kDdpSvRef counts only on the two tagged opcodes that carry data.
bool by_ref(uint8_t ddp, unsigned op) {
  return (ddp & kDdpSvRef) && (ddp & kDdpTagged) &&
         (op == static_cast<unsigned>(RdmapOpcode::rdma_write) ||
          op == static_cast<unsigned>(RdmapOpcode::read_response));
}
}  // namespace

size_t ddp_header_len(std::span<const std::byte, 2> ctrl) noexcept {
  const unsigned op = static_cast<uint8_t>(ctrl[1]) & kRdmapOpMask;
  if (op >= kRdmapOpcodeCount) return 0;
  return kOpcodeTable[op].hdr_len + (by_ref(static_cast<uint8_t>(ctrl[0]), op) ? kSvRefLen : 0);
}

DdpError ddp_decode(std::span<const std::byte> hdr, uint16_t ulpdu_len, DdpSegment& out) noexcept {
  if (ulpdu_len < 2 || hdr.size() < 2) return DdpError::short_ulpdu;
  const auto d = static_cast<uint8_t>(hdr[0]);
  const auto r = static_cast<uint8_t>(hdr[1]);
  if ((d & kDdpDvMask) != kDdpVersion) return DdpError::ddp_version;
  if ((r >> kRdmapRvShift) != kRdmapVersion) return DdpError::rdmap_version;
  const unsigned op = r & kRdmapOpMask;
  if (op >= kRdmapOpcodeCount) return DdpError::bad_opcode;
  const OpcodeInfo& info = kOpcodeTable[op];
  const bool tagged = d & kDdpTagged;
  if (tagged != info.tagged) return DdpError::bad_opcode;
  const size_t hdr_len = info.hdr_len + (by_ref(d, op) ? kSvRefLen : 0);
  if (ulpdu_len < hdr_len || hdr.size() < hdr_len) return DdpError::short_ulpdu;
  out = DdpSegment{};
  out.opcode = static_cast<RdmapOpcode>(op);
  out.tagged = tagged;
  out.last = d & kDdpLast;
  out.sv_ack_req = d & kDdpSvAckReq;
  out.sv_shm_cap = d & kDdpSvShmCap;
  out.hdr_len = static_cast<uint16_t>(hdr_len);
  out.payload_len = static_cast<uint16_t>(ulpdu_len - hdr_len);
  if (tagged) {
    out.stag = load_be32(hdr.data() + 2);
    out.to = load_be64(hdr.data() + 6);
    if (by_ref(d, op)) {
      out.sv_ref = true;
      out.ref_addr = load_be64(hdr.data() + kDdpTaggedHdrLen);
      out.ref_len = load_be32(hdr.data() + kDdpTaggedHdrLen + 8);
      if (out.payload_len != 0 || out.ref_len == 0) return DdpError::bad_ref;
    }
    return DdpError::ok;
  }
  out.rsvd_ulp = load_be32(hdr.data() + 2);
  out.qn = load_be32(hdr.data() + 6);
  out.msn = load_be32(hdr.data() + 10);
  out.mo = load_be32(hdr.data() + 14);
  if (out.qn != info.qn) return DdpError::bad_qn;
  if (!info.has_payload && out.payload_len != 0) return DdpError::unexpected_payload;
  return DdpError::ok;
}

size_t encode_tagged(std::byte* out, RdmapOpcode op, bool last, uint32_t stag,
                     uint64_t to) noexcept {
  out[0] = std::byte{ddp_ctrl(true, last)};
  out[1] = std::byte{rdmap_ctrl(op)};
  store_be32(out + 2, stag);
  store_be64(out + 6, to);
  return kDdpTaggedHdrLen;
}

size_t encode_untagged(std::byte* out, RdmapOpcode op, bool last, uint32_t rsvd_ulp, uint32_t qn,
                       uint32_t msn, uint32_t mo) noexcept {
  out[0] = std::byte{ddp_ctrl(false, last)};
  out[1] = std::byte{rdmap_ctrl(op)};
  store_be32(out + 2, rsvd_ulp);
  store_be32(out + 6, qn);
  store_be32(out + 10, msn);
  store_be32(out + 14, mo);
  return kDdpUntaggedHdrLen;
}

size_t encode_tagged_ref(std::byte* out, RdmapOpcode op, bool last, uint32_t stag, uint64_t to,
                         uint64_t addr, uint32_t len) noexcept {
  encode_tagged(out, op, last, stag, to);
  out[0] |= std::byte{kDdpSvRef};
  store_be64(out + kDdpTaggedHdrLen, addr);
  store_be32(out + kDdpTaggedHdrLen + 8, len);
  store_be32(out + kDdpTaggedHdrLen + 12, 0);
  return kDdpTaggedHdrLen + kSvRefLen;
}

void encode_read_request(std::byte* out, const ReadRequest& r) noexcept {
  store_be32(out, r.sink_stag);
  store_be64(out + 4, r.sink_to);
  store_be32(out + 12, r.read_size);
  store_be32(out + 16, r.source_stag);
  store_be64(out + 20, r.source_to);
}

ReadRequest decode_read_request(const std::byte* in) noexcept {
  return ReadRequest{load_be32(in), load_be64(in + 4), load_be32(in + 12), load_be32(in + 16),
                     load_be64(in + 20)};
}

void encode_atomic_request(std::byte* out, const AtomicRequest& r) noexcept {
  store_be32(out, static_cast<uint32_t>(r.op) & 0x0F);
  store_be32(out + 4, r.req_id);
  store_be32(out + 8, r.stag);
  store_be64(out + 12, r.to);
  store_be64(out + 20, r.add_swap);
  store_be64(out + 28, r.add_swap_mask);
  store_be64(out + 36, r.compare);
  store_be64(out + 44, r.compare_mask);
}

bool decode_atomic_request(const std::byte* in, AtomicRequest& r) noexcept {
  const uint32_t code = load_be32(in) & 0x0F;
  if (code > static_cast<uint32_t>(AtomicOp::compare_swap)) return false;
  r.op = static_cast<AtomicOp>(code);
  r.req_id = load_be32(in + 4);
  r.stag = load_be32(in + 8);
  r.to = load_be64(in + 12);
  r.add_swap = load_be64(in + 20);
  r.add_swap_mask = load_be64(in + 28);
  r.compare = load_be64(in + 36);
  r.compare_mask = load_be64(in + 44);
  return true;
}

void encode_atomic_response(std::byte* out, const AtomicResponse& r) noexcept {
  store_be32(out, r.req_id);
  store_be64(out + 4, r.original);
}

AtomicResponse decode_atomic_response(const std::byte* in) noexcept {
  return AtomicResponse{load_be32(in), load_be64(in + 4)};
}

// |Layer(4)|EType(4)|ErrorCode(8)|M|D|R|Rsvd(13)|
void encode_terminate(std::byte* out, const Terminate& t) noexcept {
  uint32_t w = (static_cast<uint32_t>(t.layer) & 0xF) << 28;
  w |= (static_cast<uint32_t>(t.etype) & 0xF) << 24;
  w |= static_cast<uint32_t>(t.ecode) << 16;
  if (t.m) w |= 1u << 15;
  if (t.d) w |= 1u << 14;
  if (t.r) w |= 1u << 13;
  store_be32(out, w);
}

Terminate decode_terminate(const std::byte* in) noexcept {
  const uint32_t w = load_be32(in);
  Terminate t;
  t.layer = static_cast<TermLayer>((w >> 28) & 0xF);
  t.etype = static_cast<uint8_t>((w >> 24) & 0xF);
  t.ecode = static_cast<uint8_t>((w >> 16) & 0xFF);
  t.m = w & (1u << 15);
  t.d = w & (1u << 14);
  t.r = w & (1u << 13);
  return t;
}

void encode_shm_ctrl(std::byte* out, const ShmCtrl& c) noexcept {
  std::memset(out, 0, kShmCtrlLen);
  out[0] = std::byte{static_cast<uint8_t>(c.type)};
  store_be32(out + 4, c.ring_bytes);
  store_be64(out + 8, c.nonce);
  store_be32(out + 16, c.pid);
  store_be32(out + 20, c.fd);
  std::memcpy(out + 24, c.boot_id.data(), c.boot_id.size());
  store_be64(out + 40, c.netns);
  out[1] = std::byte{c.flags};
  store_be64(out + 48, c.base_addr);
}

bool decode_shm_ctrl(const std::byte* in, ShmCtrl& out) noexcept {
  const auto t = static_cast<uint8_t>(in[0]);
  if (t < 1 || t > 4) return false;
  out.type = static_cast<ShmCtrl::Type>(t);
  out.ring_bytes = load_be32(in + 4);
  out.nonce = load_be64(in + 8);
  out.pid = load_be32(in + 16);
  out.fd = load_be32(in + 20);
  std::memcpy(out.boot_id.data(), in + 24, out.boot_id.size());
  out.netns = load_be64(in + 40);
  out.flags = static_cast<uint8_t>(in[1]);
  out.base_addr = load_be64(in + 48);
  return true;
}

}  // namespace sv::wire
