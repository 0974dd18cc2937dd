// libFuzzer target for the wire codecs: the input is a TCP byte stream as an iWARP receiver
// sees it, an MPA Request or Reply (RFC 5044 §7.1, RFC 6581) followed by FPDUs (RFC 5044 §4)
// carrying DDP/RDMAP segments (RFC 5041, RFC 5040, RFC 7306).
//
// Beyond "no crash, no ASan/UBSan report", it traps on broken invariants:
//  - an MPA frame that decodes re-encodes to exactly the same bytes and decodes to the same fields;
//  - the 256- and 512-byte private data limits agree except for pd_length 257..512;
//  - a DDP header that decodes agrees with ddp_header_len, re-encodes to the same bytes (reserved
//    bits aside), and does not decode from one byte less of header;
//  - the SSE4.2 and table CRC32c paths agree, one-shot and split.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "fuzz_check.h"
#include "wire/be.h"
#include "wire/crc32c.h"
#include "wire/ddp_rdmap.h"
#include "wire/mpa.h"

using namespace sv::wire;

namespace {

using Bytes = std::span<const std::byte>;

bool same_bytes(Bytes a, Bytes b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

bool same_frame(const MpaFrame& a, const MpaFrame& b) {
  return a.kind == b.kind && a.markers == b.markers && a.crc == b.crc && a.reject == b.reject &&
         a.enhanced == b.enhanced && a.res == b.res && a.rev == b.rev && a.v2.p2p == b.v2.p2p &&
         a.v2.rtr_send == b.v2.rtr_send && a.v2.rtr_write == b.v2.rtr_write &&
         a.v2.rtr_read == b.v2.rtr_read && a.v2.ird == b.v2.ird && a.v2.ord == b.v2.ord &&
         same_bytes(a.ulp_pdata, b.ulp_pdata);
}

// Decodes as `kind` under both limits; returns the frame length on success, else 0.
size_t fuzz_mpa(Bytes in, MpaKind kind) {
  MpaFrame f256, f512;
  const MpaError e256 = mpa_decode(in, kind, kMpaSiwMaxPrivData, f256);
  const MpaError e512 = mpa_decode(in, kind, kMpaRfcMaxPrivData, f512);
  const size_t flen = mpa_frame_len(in);
  if (e256 != e512) {
    // Only a pd_length the siw limit refuses and the RFC limit allows may differ.
    FUZZ_CHECK(e256 == MpaError::pdata_too_long);
    FUZZ_CHECK(flen > kMpaHeaderLen + kMpaSiwMaxPrivData &&
               flen <= kMpaHeaderLen + kMpaRfcMaxPrivData);
  } else if (e256 == MpaError::ok) {
    FUZZ_CHECK(same_frame(f256, f512));
  }
  if (e512 != MpaError::ok) return 0;

  const MpaFrame& f = f512;
  FUZZ_CHECK(flen >= kMpaHeaderLen && flen <= in.size());
  FUZZ_CHECK(f.kind == kind);
  FUZZ_CHECK(f.rev <= 2);
  // The private data lies inside the frame.
  FUZZ_CHECK(f.ulp_pdata.empty() || (f.ulp_pdata.data() >= in.data() + kMpaHeaderLen &&
                                     f.ulp_pdata.data() + f.ulp_pdata.size() == in.data() + flen));

  // Re-encode: same length, same bytes, same fields when decoded again.
  FUZZ_CHECK(mpa_encoded_len(f) == flen);
  std::byte out[kMpaHeaderLen + kMpaRfcMaxPrivData];
  const size_t n = mpa_encode(f, out);
  FUZZ_CHECK(n == flen);
  FUZZ_CHECK(same_bytes(Bytes(out, n), in.first(flen)));
  MpaFrame again;
  FUZZ_CHECK(mpa_decode(Bytes(out, n), kind, kMpaRfcMaxPrivData, again) == MpaError::ok);
  FUZZ_CHECK(same_frame(again, f));  // ulp_pdata compared by content
  return flen;
}

// The opcode-specific header after the DDP header: decode, re-encode, compare.
void fuzz_rdmap_header(const DdpSegment& seg, const std::byte* h) {
  switch (seg.opcode) {
    case RdmapOpcode::read_request: {
      const ReadRequest r = decode_read_request(h);
      std::byte out[kReadRequestLen];
      encode_read_request(out, r);
      FUZZ_CHECK(std::memcmp(out, h, kReadRequestLen) == 0);
      break;
    }
    case RdmapOpcode::terminate: {
      const Terminate t = decode_terminate(h);
      std::byte out[kTerminateCtrlLen];
      encode_terminate(out, t);
      FUZZ_CHECK(load_be32(out) == (load_be32(h) & ~0x1FFFu));  // Rsvd(13) not kept
      break;
    }
    case RdmapOpcode::atomic_request: {
      AtomicRequest r;
      if (!decode_atomic_request(h, r)) {
        FUZZ_CHECK((load_be32(h) & 0x0F) > 2);
        break;
      }
      std::byte out[kAtomicRequestLen];
      encode_atomic_request(out, r);
      FUZZ_CHECK(load_be32(out) == (load_be32(h) & 0x0F));  // Rsvd(28) not kept
      FUZZ_CHECK(std::memcmp(out + 4, h + 4, kAtomicRequestLen - 4) == 0);
      break;
    }
    case RdmapOpcode::sv_shm: {
      // Type, flags, ring size, nonce, pid, fd, boot id, namespace and nonce address survive
      // a round trip; the reserved bytes (2-3, 56-63) are not kept; an unknown type is
      // refused.
      ShmCtrl c;
      if (!decode_shm_ctrl(h, c)) {
        const auto t = static_cast<uint8_t>(h[0]);
        FUZZ_CHECK(t < 1 || t > 4);
        break;
      }
      std::byte out[kShmCtrlLen];
      encode_shm_ctrl(out, c);
      FUZZ_CHECK(out[0] == h[0] && out[1] == h[1]);
      FUZZ_CHECK(std::memcmp(out + 4, h + 4, 52) == 0);
      break;
    }
    case RdmapOpcode::atomic_response: {
      const AtomicResponse r = decode_atomic_response(h);
      std::byte out[kAtomicResponseLen];
      encode_atomic_response(out, r);
      FUZZ_CHECK(std::memcmp(out, h, kAtomicResponseLen) == 0);
      break;
    }
    case RdmapOpcode::imm_data:
    case RdmapOpcode::imm_data_se: {
      volatile uint64_t imm = load_be64(h);  // 8 bytes must be there
      (void)imm;
      break;
    }
    case RdmapOpcode::rdma_write:
    case RdmapOpcode::read_response:
    case RdmapOpcode::send:
    case RdmapOpcode::send_inv:
    case RdmapOpcode::send_se:
    case RdmapOpcode::send_se_inv:
    case RdmapOpcode::sv_ack:  // header only: the count is the MSN
      break;
  }
}

void fuzz_ddp(Bytes ulpdu, uint16_t ulpdu_len) {
  // `ulpdu` holds what arrived so far of the ULPDU (maybe fewer than ulpdu_len bytes).
  const size_t need = ulpdu.size() >= 2 ? ddp_header_len(ulpdu.first<2>()) : 0;
  DdpSegment seg;
  const DdpError e = ddp_decode(ulpdu, ulpdu_len, seg);
  if (e != DdpError::ok) return;

  FUZZ_CHECK(need != 0 && seg.hdr_len == need);
  FUZZ_CHECK(seg.hdr_len <= ulpdu.size() && seg.hdr_len <= ulpdu_len);
  FUZZ_CHECK(size_t{seg.hdr_len} + seg.payload_len == ulpdu_len);
  const OpcodeInfo& info = opcode_info(seg.opcode);
  FUZZ_CHECK(info.hdr_len + (seg.sv_ref ? kSvRefLen : 0) == seg.hdr_len &&
             info.tagged == seg.tagged);
  // A segment by reference exactly when the bit is set on a tagged Write or Read Response;
  // then it has no payload, and a length.
  const bool ref_bit = (ulpdu[0] & std::byte{kDdpSvRef}) != std::byte{0};
  const bool ref_op =
      seg.opcode == RdmapOpcode::rdma_write || seg.opcode == RdmapOpcode::read_response;
  FUZZ_CHECK(seg.sv_ref == (ref_bit && ref_op));
  FUZZ_CHECK(!seg.sv_ref || (seg.payload_len == 0 && seg.ref_len != 0));
  FUZZ_CHECK(info.has_payload || seg.payload_len == 0);
  FUZZ_CHECK(seg.tagged || seg.qn == info.qn);

  // One byte less of header must not decode.
  DdpSegment short_seg;
  FUZZ_CHECK(ddp_decode(ulpdu.first(seg.hdr_len - 1), ulpdu_len, short_seg) != DdpError::ok);

  // Re-encode the DDP header; reserved bits of the two control bytes are not kept.
  std::byte out[kDdpUntaggedHdrLen];
  const size_t n = seg.tagged ? encode_tagged(out, seg.opcode, seg.last, seg.stag, seg.to)
                              : encode_untagged(out, seg.opcode, seg.last, seg.rsvd_ulp, seg.qn,
                                                seg.msn, seg.mo);
  FUZZ_CHECK(n == (seg.tagged ? kDdpTaggedHdrLen : kDdpUntaggedHdrLen));
  FUZZ_CHECK(out[0] == (ulpdu[0] & std::byte{0xC3}));  // |T|L|Rsvd(4)|DV(2)|
  FUZZ_CHECK(out[1] == (ulpdu[1] & std::byte{0xCF}));  // |RV(2)|Rsvd(2)|Opcode(4)|
  FUZZ_CHECK(std::memcmp(out + 2, ulpdu.data() + 2, n - 2) == 0);
  // The one reserved bit we read back: softverbs' ack request.
  FUZZ_CHECK(seg.sv_ack_req == ((ulpdu[0] & std::byte{kDdpSvAckReq}) != std::byte{0}));
  if (seg.sv_ref) {
    // The reference survives a round trip (its reserved word is not kept).
    std::byte ref[kDdpTaggedHdrLen + kSvRefLen];
    FUZZ_CHECK(encode_tagged_ref(ref, seg.opcode, seg.last, seg.stag, seg.to, seg.ref_addr,
                                 seg.ref_len) == sizeof ref);
    FUZZ_CHECK(ref[0] == (ulpdu[0] & std::byte{0xC3 | kDdpSvRef}));
    FUZZ_CHECK(ref[1] == (ulpdu[1] & std::byte{0xCF}));
    FUZZ_CHECK(std::memcmp(ref + 2, ulpdu.data() + 2, sizeof ref - 2 - 4) == 0);
    return;
  }

  if (seg.hdr_len > n) fuzz_rdmap_header(seg, ulpdu.data() + n);
}

void fuzz_crc(Bytes body, size_t split) {
  const uint32_t sw = crc32c_update_sw(kCrc32cInit, body.data(), body.size());
  const uint32_t hw = crc32c_update(kCrc32cInit, body.data(), body.size());
  FUZZ_CHECK(sw == hw);
  split = split % (body.size() + 1);
  const uint32_t a = crc32c_update(kCrc32cInit, body.data(), split);
  FUZZ_CHECK(crc32c_update_sw(a, body.data() + split, body.size() - split) == sw);
  FUZZ_CHECK(crc32c(body.data(), body.size()) == crc32c_final(sw));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Bytes in(reinterpret_cast<const std::byte*>(data), size);

  // MPA set-up frame, tried both ways. With neither, the whole input is an FPDU stream.
  const size_t req_len = fuzz_mpa(in, MpaKind::request);
  const size_t rep_len = fuzz_mpa(in, MpaKind::reply);
  FUZZ_CHECK(req_len == 0 || rep_len == 0);  // the two keys differ
  Bytes rest = in.subspan(req_len + rep_len);

  while (rest.size() >= 2) {
    const uint16_t ulpdu_len = load_be16(rest.data());
    const size_t have = rest.size() - 2 < ulpdu_len ? rest.size() - 2 : ulpdu_len;
    fuzz_ddp(rest.subspan(2, have), ulpdu_len);

    const size_t total = fpdu_len(ulpdu_len);
    FUZZ_CHECK(total % 4 == 0 && total >= 2 + size_t{ulpdu_len} + kMpaCrcLen);
    if (rest.size() < total) break;  // truncated: wait for more, as the RX path would
    fuzz_crc(rest.first(total - kMpaCrcLen), ulpdu_len);
    rest = rest.subspan(total);
  }
  return 0;
}
