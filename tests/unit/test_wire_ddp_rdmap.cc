// DDP (RFC 5041 §5) and RDMAP (RFC 5040 §4, RFC 7306 §5) headers inside MPA FPDUs (RFC 5044
// §4), against the FPDUs captured from Linux siw in iwarp-wire.md §1.6, plus every DdpError.
#include <gtest/gtest.h>

#include <iterator>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "hex.h"
#include "wire/be.h"
#include "wire/crc32c.h"
#include "wire/ddp_rdmap.h"

namespace sv::wire {
namespace {

using test::Bytes;
using test::cat;
using test::hex;
using test::to_hex;

// 16 payload bytes of the real SEND in iwarp-wire.md §1.2 (the §1.6 copy elides them).
const Bytes kSendPayload = hex("0000 5575 9b21 4370 7f92 7800 0000 0040");

// iwarp-wire.md §1.6. CRC off except where noted: the trailer is 00000000.
Bytes golden_send() {
  return cat(
      {hex("00 22 41 43 00000000 00000000 00000001 00000000"), kSendPayload, hex("00000000")});
}
Bytes golden_read_request() {
  return hex(
      "00 2e 41 41 00000000 00000001 00000001 00000000"
      "00abcd01 0000100000000000 00000040 0e9ce100 00005564b3dd7370 00000000");
}
// The captured Read Response's payload and CRC are elided in the doc; fill in 64 bytes 0..63
// and the correct CRC.
Bytes golden_read_response() {
  Bytes payload(64);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte(static_cast<uint8_t>(i));
  Bytes f = cat({hex("00 4e c1 42 00abcd01 0000100000000000"), payload, hex("00000000")});
  store_le32(f.data() + f.size() - 4, crc32c(f.data(), f.size() - 4));
  return f;
}
Bytes golden_write_rtr() {
  return hex("00 0e c1 40 00000001 0000000000000000 00000000");
}

// Splits an FPDU the way the RX path does: ULPDU_Length, then the header the control bytes ask for.
struct Parsed {
  DdpError err;
  DdpSegment seg;
  uint16_t ulpdu_len;
};
Parsed parse(const Bytes& fpdu) {
  Parsed p{};
  p.ulpdu_len = load_be16(fpdu.data());
  const auto ulpdu = std::span(fpdu).subspan(2, p.ulpdu_len);
  EXPECT_NE(ddp_header_len(ulpdu.first<2>()), 0u);
  p.err = ddp_decode(ulpdu, p.ulpdu_len, p.seg);
  return p;
}

// ---------------------------------------------------------------- golden frames, decode

TEST(DdpRdmap, GoldenSiwSendDecodes) {
  const Bytes f = golden_send();
  ASSERT_EQ(f.size(), 40u);
  const Parsed p = parse(f);
  ASSERT_EQ(p.err, DdpError::ok);
  EXPECT_EQ(p.ulpdu_len, 34);
  EXPECT_EQ(fpdu_len(p.ulpdu_len), 40u);
  EXPECT_EQ(fpdu_pad(p.ulpdu_len), 0u);
  EXPECT_EQ(p.seg.opcode, RdmapOpcode::send);
  EXPECT_FALSE(p.seg.tagged);
  EXPECT_TRUE(p.seg.last);
  EXPECT_EQ(p.seg.rsvd_ulp, 0u);
  EXPECT_EQ(p.seg.qn, kQnSend);
  EXPECT_EQ(p.seg.msn, 1u);  // RFC 5041 §5.3: MSN starts at 1
  EXPECT_EQ(p.seg.mo, 0u);
  EXPECT_EQ(p.seg.hdr_len, 18);
  EXPECT_EQ(p.seg.payload_len, 16);
  EXPECT_EQ(to_hex(std::span(f).subspan(2 + p.seg.hdr_len, p.seg.payload_len)),
            to_hex(kSendPayload));
}

TEST(DdpRdmap, Rfc5044Sec4CrcTrailerOfRealSiwSend) {
  // The same SEND with CRC on, as captured (iwarp-wire.md §1.2).
  Bytes f = golden_send();
  const size_t body = fpdu_len(34) - kMpaCrcLen;
  EXPECT_EQ(crc32c(f.data(), body), 0x045278C2u);
  store_le32(f.data() + body, crc32c(f.data(), body));
  EXPECT_EQ(to_hex(std::span(f).last(4)), "c2 78 52 04");
}

TEST(DdpRdmap, GoldenSiwReadRequestDecodes) {
  const Bytes f = golden_read_request();
  ASSERT_EQ(f.size(), 52u);
  const Parsed p = parse(f);
  ASSERT_EQ(p.err, DdpError::ok);
  EXPECT_EQ(p.ulpdu_len, 46);
  EXPECT_EQ(fpdu_len(p.ulpdu_len), 52u);
  EXPECT_EQ(p.seg.opcode, RdmapOpcode::read_request);
  EXPECT_FALSE(p.seg.tagged);
  EXPECT_TRUE(p.seg.last);
  EXPECT_EQ(p.seg.rsvd_ulp, 0u);
  EXPECT_EQ(p.seg.qn, kQnReadRequest);
  EXPECT_EQ(p.seg.msn, 1u);
  EXPECT_EQ(p.seg.mo, 0u);
  EXPECT_EQ(p.seg.hdr_len, 46);
  EXPECT_EQ(p.seg.payload_len, 0);

  const ReadRequest r = decode_read_request(f.data() + 2 + kDdpUntaggedHdrLen);
  EXPECT_EQ(r.sink_stag, 0x00abcd01u);
  EXPECT_EQ(r.sink_to, 0x0000100000000000ull);
  EXPECT_EQ(r.read_size, 64u);
  EXPECT_EQ(r.source_stag, 0x0e9ce100u);
  EXPECT_EQ(r.source_to, 0x00005564b3dd7370ull);
}

TEST(DdpRdmap, GoldenSiwReadResponseDecodes) {
  const Bytes f = golden_read_response();
  ASSERT_EQ(f.size(), 84u);
  const Parsed p = parse(f);
  ASSERT_EQ(p.err, DdpError::ok);
  EXPECT_EQ(p.ulpdu_len, 78);
  EXPECT_EQ(fpdu_len(p.ulpdu_len), 84u);
  EXPECT_EQ(p.seg.opcode, RdmapOpcode::read_response);
  EXPECT_TRUE(p.seg.tagged);
  EXPECT_TRUE(p.seg.last);
  // RFC 5040 §4.5: the Read Response targets the Read Request's Sink STag/TO.
  const ReadRequest req = decode_read_request(golden_read_request().data() + 20);
  EXPECT_EQ(p.seg.stag, req.sink_stag);
  EXPECT_EQ(p.seg.to, req.sink_to);
  EXPECT_EQ(p.seg.stag, 0x00abcd01u);
  EXPECT_EQ(p.seg.to, 0x0000100000000000ull);
  EXPECT_EQ(p.seg.hdr_len, 14);
  EXPECT_EQ(p.seg.payload_len, req.read_size);
  EXPECT_EQ(crc32c(f.data(), 80), load_le32(f.data() + 80));
}

TEST(DdpRdmap, GoldenSiwZeroLengthWriteRtrDecodes) {
  const Bytes f = golden_write_rtr();
  ASSERT_EQ(f.size(), 20u);
  const Parsed p = parse(f);
  ASSERT_EQ(p.err, DdpError::ok);
  EXPECT_EQ(p.ulpdu_len, 14);
  EXPECT_EQ(fpdu_len(p.ulpdu_len), 20u);
  EXPECT_EQ(p.seg.opcode, RdmapOpcode::rdma_write);
  EXPECT_TRUE(p.seg.tagged);
  EXPECT_TRUE(p.seg.last);
  EXPECT_EQ(p.seg.stag, 1u);
  EXPECT_EQ(p.seg.to, 0u);
  EXPECT_EQ(p.seg.hdr_len, 14);
  EXPECT_EQ(p.seg.payload_len, 0);
}

// ---------------------------------------------------------------- golden frames, encode

TEST(DdpRdmap, GoldenSendHeaderEncodesByteExact) {
  std::byte h[kDdpUntaggedHdrLen];
  ASSERT_EQ(encode_untagged(h, RdmapOpcode::send, true, 0, kQnSend, 1, 0), kDdpUntaggedHdrLen);
  const Bytes g = golden_send();
  EXPECT_EQ(to_hex(h), to_hex(std::span(g).subspan(2, 18)));
}

TEST(DdpRdmap, GoldenReadRequestHeaderEncodesByteExact) {
  const Bytes g = golden_read_request();
  std::byte h[kDdpUntaggedHdrLen + kReadRequestLen];
  ASSERT_EQ(encode_untagged(h, RdmapOpcode::read_request, true, 0, kQnReadRequest, 1, 0), 18u);
  encode_read_request(h + 18, ReadRequest{0x00abcd01, 0x0000100000000000ull, 64, 0x0e9ce100,
                                          0x00005564b3dd7370ull});
  EXPECT_EQ(to_hex(h), to_hex(std::span(g).subspan(2, 46)));
  // And decode(encode(x)) == x on the decoded golden request.
  const ReadRequest r = decode_read_request(g.data() + 20);
  std::byte again[kReadRequestLen];
  encode_read_request(again, r);
  EXPECT_EQ(to_hex(again), to_hex(std::span(g).subspan(20, 28)));
}

TEST(DdpRdmap, GoldenReadResponseHeaderEncodesByteExact) {
  std::byte h[kDdpTaggedHdrLen];
  ASSERT_EQ(encode_tagged(h, RdmapOpcode::read_response, true, 0x00abcd01, 0x0000100000000000ull),
            kDdpTaggedHdrLen);
  const Bytes g = golden_read_response();
  EXPECT_EQ(to_hex(h), to_hex(std::span(g).subspan(2, 14)));
}

TEST(DdpRdmap, GoldenWriteRtrHeaderEncodesByteExact) {
  std::byte h[kDdpTaggedHdrLen];
  ASSERT_EQ(encode_tagged(h, RdmapOpcode::rdma_write, true, 1, 0), kDdpTaggedHdrLen);
  const Bytes g = golden_write_rtr();
  EXPECT_EQ(to_hex(h), to_hex(std::span(g).subspan(2, 14)));
}

TEST(DdpRdmap, ControlWordsSeenLiveFromSiw) {
  // iwarp-wire.md §1.3 table of DDP/RDMAP control bytes.
  std::byte h[kDdpUntaggedHdrLen];
  encode_untagged(h, RdmapOpcode::send, true, 0, 0, 1, 0);
  EXPECT_EQ(to_hex(std::span(h).first(2)), "41 43");
  encode_untagged(h, RdmapOpcode::read_request, true, 0, 1, 1, 0);
  EXPECT_EQ(to_hex(std::span(h).first(2)), "41 41");
  encode_tagged(h, RdmapOpcode::read_response, true, 0, 0);
  EXPECT_EQ(to_hex(std::span(h).first(2)), "c1 42");
  encode_tagged(h, RdmapOpcode::read_response, false, 0, 0);
  EXPECT_EQ(to_hex(std::span(h).first(2)), "81 42");
  encode_tagged(h, RdmapOpcode::rdma_write, true, 0, 0);
  EXPECT_EQ(to_hex(std::span(h).first(2)), "c1 40");
  encode_untagged(h, RdmapOpcode::terminate, true, 0, kQnTerminate, 1, 0);
  EXPECT_EQ(to_hex(std::span(h).first(2)), "41 47");
}

TEST(DdpRdmap, Rfc5041Sec5_3UntaggedFieldsGoInOrder) {
  std::byte h[kDdpUntaggedHdrLen];
  encode_untagged(h, RdmapOpcode::send_se_inv, false, 0xdeadbe01, kQnSend, 0x01020304, 0x0a0b0c0d);
  EXPECT_EQ(to_hex(h), "01 46 de ad be 01 00 00 00 00 01 02 03 04 0a 0b 0c 0d");
  DdpSegment s;
  ASSERT_EQ(ddp_decode(h, 18 + 100, s), DdpError::ok);
  EXPECT_EQ(s.opcode, RdmapOpcode::send_se_inv);
  EXPECT_FALSE(s.last);
  EXPECT_EQ(s.rsvd_ulp, 0xdeadbe01u);
  EXPECT_EQ(s.msn, 0x01020304u);
  EXPECT_EQ(s.mo, 0x0a0b0c0du);
  EXPECT_EQ(s.payload_len, 100);
}

TEST(DdpRdmap, Rfc5041Sec5_2TaggedFieldsGoInOrder) {
  std::byte h[kDdpTaggedHdrLen];
  encode_tagged(h, RdmapOpcode::rdma_write, false, 0x11223344, 0x8877665544332211ull);
  EXPECT_EQ(to_hex(h), "81 40 11 22 33 44 88 77 66 55 44 33 22 11");
  DdpSegment s;
  ASSERT_EQ(ddp_decode(h, 14 + 1436, s), DdpError::ok);
  EXPECT_FALSE(s.last);
  EXPECT_EQ(s.stag, 0x11223344u);
  EXPECT_EQ(s.to, 0x8877665544332211ull);
  EXPECT_EQ(s.payload_len, 1436);
}

// ---------------------------------------------------------------- DdpError paths

Bytes send_hdr() {
  const Bytes f = golden_send();
  return Bytes(f.begin() + 2, f.begin() + 2 + kDdpUntaggedHdrLen);
}

TEST(DdpRdmap, Rfc5041Sec5_1DdpVersionNot1) {
  for (uint8_t dv : {0, 2, 3}) {
    Bytes h = send_hdr();
    h[0] = std::byte{static_cast<uint8_t>(0x40 | dv)};
    DdpSegment s;
    EXPECT_EQ(ddp_decode(h, 34, s), DdpError::ddp_version) << "DV " << int(dv);
  }
}

TEST(DdpRdmap, Rfc5040Sec4_2RdmapVersionNot1) {
  for (uint8_t rv : {0, 2, 3}) {
    Bytes h = send_hdr();
    h[1] = std::byte{static_cast<uint8_t>((rv << 6) | 0x03)};
    DdpSegment s;
    EXPECT_EQ(ddp_decode(h, 34, s), DdpError::rdmap_version) << "RV " << int(rv);
  }
}

// 12 is softverbs' Placement Ack, 13 its shared-memory control (sent only between softverbs
// peers).
TEST(DdpRdmap, Rfc5040Sec4_1Opcodes14To15AreBad) {
  for (uint8_t op = 14; op <= 15; ++op) {
    for (uint8_t ddp : {0x41, 0xc1}) {  // untagged and tagged
      Bytes h(80);
      h[0] = std::byte{ddp};
      h[1] = std::byte{static_cast<uint8_t>(0x40 | op)};
      DdpSegment s;
      EXPECT_EQ(ddp_decode(h, 80, s), DdpError::bad_opcode) << "opcode " << int(op);
      EXPECT_EQ(ddp_header_len(std::span(h).first<2>()), 0u) << "opcode " << int(op);
    }
  }
}

TEST(DdpRdmap, Rfc5040Sec4_1TaggedBitMustMatchOpcode) {
  for (unsigned op = 0; op < kRdmapOpcodeCount; ++op) {
    const OpcodeInfo& info = kOpcodeTable[op];
    Bytes h(96);
    // Right model: everything else valid (QN from the table), so the T bit alone decides.
    h[0] = std::byte{static_cast<uint8_t>(info.tagged ? 0xc1 : 0x41)};
    h[1] = std::byte{static_cast<uint8_t>(0x40 | op)};
    if (!info.tagged) store_be32(h.data() + 6, info.qn);
    DdpSegment s;
    EXPECT_EQ(ddp_decode(h, info.hdr_len, s), DdpError::ok) << info.name;
    h[0] ^= std::byte{0x80};
    EXPECT_EQ(ddp_decode(h, info.hdr_len, s), DdpError::bad_opcode) << info.name;
  }
}

TEST(DdpRdmap, Rfc5041ShortUlpdu) {
  DdpSegment s;
  const Bytes send = send_hdr();
  EXPECT_EQ(ddp_decode(send, 17, s), DdpError::short_ulpdu);  // one byte short of 18
  EXPECT_EQ(ddp_decode(send, 18, s), DdpError::ok);           // zero-length send is fine
  EXPECT_EQ(s.payload_len, 0);
  EXPECT_EQ(ddp_decode(send, 1, s), DdpError::short_ulpdu);
  EXPECT_EQ(ddp_decode(send, 0, s), DdpError::short_ulpdu);
  // Header buffer shorter than the opcode's header even though ULPDU_Length is enough.
  EXPECT_EQ(ddp_decode(std::span(send).first(17), 34, s), DdpError::short_ulpdu);
  EXPECT_EQ(ddp_decode(std::span(send).first(1), 34, s), DdpError::short_ulpdu);

  const Bytes rr = golden_read_request();
  const auto rr_hdr = std::span(rr).subspan(2, 46);
  EXPECT_EQ(ddp_decode(rr_hdr, 45, s), DdpError::short_ulpdu);
  EXPECT_EQ(ddp_decode(rr_hdr.first(45), 46, s), DdpError::short_ulpdu);
  EXPECT_EQ(ddp_decode(rr_hdr.first(18), 18, s), DdpError::short_ulpdu);

  const Bytes w = golden_write_rtr();
  EXPECT_EQ(ddp_decode(std::span(w).subspan(2, 14), 13, s), DdpError::short_ulpdu);
}

TEST(DdpRdmap, Rfc5040Sec4_4PayloadOnReadRequest) {
  Bytes rr = golden_read_request();
  rr.insert(rr.begin() + 48, std::byte{0xAB});  // one stray byte after the 28-byte header
  DdpSegment s;
  EXPECT_EQ(ddp_decode(std::span(rr).subspan(2, 47), 47, s), DdpError::unexpected_payload);
}

TEST(DdpRdmap, Rfc7306HeaderOnlyMessagesRefusePayload) {
  for (RdmapOpcode op : {RdmapOpcode::imm_data, RdmapOpcode::imm_data_se,
                         RdmapOpcode::atomic_request, RdmapOpcode::atomic_response}) {
    const OpcodeInfo& info = opcode_info(op);
    Bytes h(info.hdr_len + 1);
    encode_untagged(h.data(), op, true, 0, info.qn, 1, 0);
    DdpSegment s;
    EXPECT_EQ(ddp_decode(h, info.hdr_len, s), DdpError::ok) << info.name;
    EXPECT_EQ(ddp_decode(h, info.hdr_len + 1, s), DdpError::unexpected_payload) << info.name;
  }
}

TEST(DdpRdmap, Rfc5040Sec5_1WrongQueueNumber) {
  DdpSegment s;
  Bytes h = send_hdr();
  for (uint32_t qn : {1u, 2u, 3u, 0xFFFFFFFFu}) {
    store_be32(h.data() + 6, qn);
    EXPECT_EQ(ddp_decode(h, 34, s), DdpError::bad_qn) << "send on QN " << qn;
  }
  Bytes rr = golden_read_request();
  store_be32(rr.data() + 2 + 6, kQnSend);
  EXPECT_EQ(ddp_decode(std::span(rr).subspan(2, 46), 46, s), DdpError::bad_qn);

  Bytes t(kDdpUntaggedHdrLen + kTerminateCtrlLen);
  encode_untagged(t.data(), RdmapOpcode::terminate, true, 0, kQnSend, 1, 0);
  EXPECT_EQ(ddp_decode(t, 22, s), DdpError::bad_qn);
  Bytes ar(kDdpUntaggedHdrLen + kAtomicResponseLen);
  encode_untagged(ar.data(), RdmapOpcode::atomic_response, true, 0, kQnReadRequest, 1, 0);
  EXPECT_EQ(ddp_decode(ar, 30, s), DdpError::bad_qn);
}

TEST(DdpRdmap, ErrorNamesAreDistinct) {
  std::set<std::string> names;
  for (auto e :
       {DdpError::ok, DdpError::ddp_version, DdpError::rdmap_version, DdpError::bad_opcode,
        DdpError::short_ulpdu, DdpError::unexpected_payload, DdpError::bad_qn, DdpError::bad_ref}) {
    EXPECT_STRNE(to_string(e), "?");
    names.insert(to_string(e));
  }
  EXPECT_EQ(names.size(), 8u);
}

// ---------------------------------------------------------------- RFC 7306 and Terminate

TEST(DdpRdmap, Rfc7306Sec5_2AtomicRequestRoundTrip) {
  AtomicRequest r;
  r.op = AtomicOp::compare_swap;
  r.req_id = 0xA1A2A3A4;
  r.stag = 0x00abcd01;
  r.to = 0x0000100000000008ull;
  r.add_swap = 0x1111111111111111ull;
  r.add_swap_mask = 0xFFFFFFFF00000000ull;
  r.compare = 0x2222222222222222ull;
  r.compare_mask = 0x00000000FFFFFFFFull;
  std::byte b[kAtomicRequestLen];
  encode_atomic_request(b, r);
  EXPECT_EQ(to_hex(b), to_hex(hex("00000002 a1a2a3a4 00abcd01 0000100000000008"
                                  "1111111111111111 ffffffff00000000"
                                  "2222222222222222 00000000ffffffff")));
  AtomicRequest d;
  ASSERT_TRUE(decode_atomic_request(b, d));
  EXPECT_EQ(d.op, r.op);
  EXPECT_EQ(d.req_id, r.req_id);
  EXPECT_EQ(d.stag, r.stag);
  EXPECT_EQ(d.to, r.to);
  EXPECT_EQ(d.add_swap, r.add_swap);
  EXPECT_EQ(d.add_swap_mask, r.add_swap_mask);
  EXPECT_EQ(d.compare, r.compare);
  EXPECT_EQ(d.compare_mask, r.compare_mask);

  for (AtomicOp op : {AtomicOp::fetch_add, AtomicOp::swap}) {
    r.op = op;
    encode_atomic_request(b, r);
    EXPECT_EQ(load_be32(b), static_cast<uint32_t>(op));
    ASSERT_TRUE(decode_atomic_request(b, d));
    EXPECT_EQ(d.op, op);
  }

  // Unknown AtomicOpCodes are refused.
  for (uint32_t code : {3u, 7u, 15u}) {
    store_be32(b, code);
    EXPECT_FALSE(decode_atomic_request(b, d)) << code;
  }
}

TEST(DdpRdmap, Rfc7306Sec5_2AtomicRequestInsideAnFpdu) {
  std::byte u[kDdpUntaggedHdrLen + kAtomicRequestLen];
  encode_untagged(u, RdmapOpcode::atomic_request, true, 0, kQnReadRequest, 3, 0);
  AtomicRequest r;
  r.op = AtomicOp::fetch_add;
  r.req_id = 7;
  r.stag = 0x1234;
  r.to = 0x40;
  r.add_swap = 5;
  encode_atomic_request(u + kDdpUntaggedHdrLen, r);
  DdpSegment s;
  ASSERT_EQ(ddp_header_len(std::span(u).first<2>()), 70u);
  ASSERT_EQ(ddp_decode(u, 70, s), DdpError::ok);
  EXPECT_EQ(s.opcode, RdmapOpcode::atomic_request);
  EXPECT_EQ(s.qn, kQnReadRequest);
  EXPECT_EQ(s.msn, 3u);
  EXPECT_EQ(s.hdr_len, 70);
  AtomicRequest d;
  ASSERT_TRUE(decode_atomic_request(u + kDdpUntaggedHdrLen, d));
  EXPECT_EQ(d.req_id, 7u);
  EXPECT_EQ(d.add_swap, 5u);
}

TEST(DdpRdmap, Rfc7306Sec5_3AtomicResponseRoundTrip) {
  std::byte b[kAtomicResponseLen];
  encode_atomic_response(b, AtomicResponse{0xA1A2A3A4, 0x0102030405060708ull});
  EXPECT_EQ(to_hex(b), "a1 a2 a3 a4 01 02 03 04 05 06 07 08");
  const AtomicResponse d = decode_atomic_response(b);
  EXPECT_EQ(d.req_id, 0xA1A2A3A4u);
  EXPECT_EQ(d.original, 0x0102030405060708ull);
}

TEST(DdpRdmap, Rfc5040Sec4_8TerminateExactBytes) {
  struct Case {
    Terminate t;
    const char* wire;
  };
  const Case cases[] = {
      // LLP CRC error (RFC 5044 §8).
      {{TermLayer::llp, 0, 0x02, false, false, false}, "20 02 00 00"},
      // What siw sends for an RFC 7306 opcode: RDMAP, remote operation, unexpected opcode,
      // with the DDP and RDMAP headers included.
      {{TermLayer::rdmap, 2, 0x06, false, true, true}, "02 06 60 00"},
      // DDP untagged, invalid QN, segment length valid + DDP header.
      {{TermLayer::ddp, 2, 0x01, true, true, false}, "12 01 c0 00"},
      // RDMAP unspecified, every flag.
      {{TermLayer::rdmap, 2, 0xFF, true, true, true}, "02 ff e0 00"},
      // Out-of-range nibbles are masked, not smeared into neighbours.
      {{static_cast<TermLayer>(0x1F), 0x1F, 0x00, false, false, false}, "ff 00 00 00"},
  };
  for (const auto& c : cases) {
    std::byte b[kTerminateCtrlLen];
    encode_terminate(b, c.t);
    EXPECT_EQ(to_hex(b), to_hex(hex(c.wire))) << c.wire;
  }
}

TEST(DdpRdmap, Rfc5040Sec4_8TerminateRoundTripsEveryField) {
  for (uint8_t layer = 0; layer < 16; ++layer) {
    for (uint8_t etype = 0; etype < 16; ++etype) {
      for (unsigned flags = 0; flags < 8; ++flags) {
        Terminate t;
        t.layer = static_cast<TermLayer>(layer);
        t.etype = etype;
        t.ecode = static_cast<uint8_t>(layer * 16 + etype + flags);
        t.m = flags & 4;
        t.d = flags & 2;
        t.r = flags & 1;
        std::byte b[kTerminateCtrlLen];
        encode_terminate(b, t);
        EXPECT_EQ(load_be32(b) & 0x1FFF, 0u);  // Rsvd(13) sent as zero
        const Terminate d = decode_terminate(b);
        ASSERT_EQ(d.layer, t.layer);
        ASSERT_EQ(d.etype, t.etype);
        ASSERT_EQ(d.ecode, t.ecode);
        ASSERT_EQ(d.m, t.m);
        ASSERT_EQ(d.d, t.d);
        ASSERT_EQ(d.r, t.r);
      }
    }
  }
  // Rsvd bits on receive are ignored.
  std::byte b[4];
  store_be32(b, 0x12011FFFu);
  const Terminate d = decode_terminate(b);
  EXPECT_EQ(d.layer, TermLayer::ddp);
  EXPECT_EQ(d.etype, 2);
  EXPECT_EQ(d.ecode, 1);
  EXPECT_FALSE(d.m || d.d || d.r);
}

TEST(DdpRdmap, Rfc5040Sec4_8TerminateFpduDecodes) {
  // A Terminate carrying the terminated DDP header (untagged, 18 bytes + 2 length bytes).
  Bytes u(kDdpUntaggedHdrLen + kTerminateCtrlLen + 2 + kDdpUntaggedHdrLen);
  encode_untagged(u.data(), RdmapOpcode::terminate, true, 0, kQnTerminate, 1, 0);
  encode_terminate(u.data() + 18, Terminate{TermLayer::ddp, 2, 0x01, true, true, false});
  DdpSegment s;
  ASSERT_EQ(ddp_decode(u, static_cast<uint16_t>(u.size()), s), DdpError::ok);
  EXPECT_EQ(s.opcode, RdmapOpcode::terminate);
  EXPECT_EQ(s.hdr_len, 22);
  EXPECT_EQ(s.payload_len, 20);
}

// ---------------------------------------------------------------- framing and the opcode table

TEST(DdpRdmap, Rfc5044Sec4PadAndFpduLength) {
  struct Row {
    size_t ulpdu, pad, len;
  };
  constexpr Row rows[] = {
      {0, 2, 8},  {1, 1, 8},  {2, 0, 8},  {3, 3, 12}, {4, 2, 12},
      {5, 1, 12}, {6, 0, 12}, {7, 3, 16}, {8, 2, 16}, {65535, 3, 65544},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(fpdu_pad(r.ulpdu), r.pad) << r.ulpdu;
    EXPECT_EQ(fpdu_len(r.ulpdu), r.len) << r.ulpdu;
    EXPECT_EQ((2 + r.ulpdu + fpdu_pad(r.ulpdu)) % 4, 0u) << r.ulpdu;
  }
  static_assert(fpdu_len(46) == 52, "Read Request FPDU is always 52 bytes");
  static_assert(fpdu_len(kMaxUlpduLen) == 65544);
}

TEST(DdpRdmap, OpcodeTableMatchesHeaderConstants) {
  struct Want {
    RdmapOpcode op;
    bool tagged;
    uint32_t qn;
    size_t hdr_len;
    bool rfc7306;
    bool has_payload;
  };
  const Want want[] = {
      {RdmapOpcode::rdma_write, true, 0, 14, false, true},
      {RdmapOpcode::read_request, false, kQnReadRequest, 46, false, false},
      {RdmapOpcode::read_response, true, 0, 14, false, true},
      {RdmapOpcode::send, false, kQnSend, 18, false, true},
      {RdmapOpcode::send_inv, false, kQnSend, 18, false, true},
      {RdmapOpcode::send_se, false, kQnSend, 18, false, true},
      {RdmapOpcode::send_se_inv, false, kQnSend, 18, false, true},
      {RdmapOpcode::terminate, false, kQnTerminate, 22, false, true},
      {RdmapOpcode::imm_data, false, kQnSend, 26, true, false},
      {RdmapOpcode::imm_data_se, false, kQnSend, 26, true, false},
      {RdmapOpcode::atomic_request, false, kQnReadRequest, 70, true, false},
      {RdmapOpcode::atomic_response, false, kQnAtomicResponse, 30, true, false},
      {RdmapOpcode::sv_ack, false, kQnSvAck, 18, true, false},
      {RdmapOpcode::sv_shm, false, kQnSvShm, 82, true, false},
  };
  ASSERT_EQ(std::size(want), kRdmapOpcodeCount);
  EXPECT_EQ(kDdpTaggedHdrLen, 14u);
  EXPECT_EQ(kDdpUntaggedHdrLen + kReadRequestLen, 46u);
  EXPECT_EQ(kDdpUntaggedHdrLen + kTerminateCtrlLen, 22u);
  EXPECT_EQ(kDdpUntaggedHdrLen + kImmDataLen, 26u);
  EXPECT_EQ(kDdpUntaggedHdrLen + kAtomicRequestLen, 70u);
  EXPECT_EQ(kDdpUntaggedHdrLen + kAtomicResponseLen, 30u);
  std::set<std::string> names;
  for (unsigned i = 0; i < kRdmapOpcodeCount; ++i) {
    const Want& w = want[i];
    ASSERT_EQ(static_cast<unsigned>(w.op), i);
    const OpcodeInfo& info = opcode_info(w.op);
    EXPECT_EQ(&info, &kOpcodeTable[i]);
    EXPECT_EQ(info.tagged, w.tagged) << info.name;
    if (!w.tagged) {
      EXPECT_EQ(info.qn, w.qn) << info.name;
    }
    EXPECT_EQ(info.hdr_len, w.hdr_len) << info.name;
    EXPECT_EQ(info.rfc7306, w.rfc7306) << info.name;
    EXPECT_EQ(info.has_payload, w.has_payload) << info.name;
    EXPECT_STREQ(to_string(w.op), info.name);
    names.insert(info.name);
    // ddp_header_len asks the same table from the two control bytes.
    std::byte ctrl[2] = {std::byte{static_cast<uint8_t>(w.tagged ? 0xc1 : 0x41)},
                         std::byte{static_cast<uint8_t>(0x40 | i)}};
    EXPECT_EQ(ddp_header_len(ctrl), w.hdr_len) << info.name;
  }
  EXPECT_EQ(names.size(), kRdmapOpcodeCount);
  EXPECT_STREQ(to_string(static_cast<RdmapOpcode>(14)), "unknown opcode");
}

TEST(DdpRdmap, ShmCtrlRoundTripsAndRefusesUnknownTypes) {
  ShmCtrl c;
  c.type = ShmCtrl::Type::offer;
  c.ring_bytes = 1u << 18;
  c.nonce = 0x0123456789abcdefull;
  c.pid = 4242;
  c.fd = 17;
  for (size_t i = 0; i < c.boot_id.size(); ++i) c.boot_id[i] = std::byte{static_cast<uint8_t>(i)};
  c.netns = 4026531840ull;
  c.base_addr = 0x7ffd12345678ull;
  c.flags = ShmCtrl::kPeerPull;
  Bytes b(kShmCtrlLen, std::byte{0xEE});
  encode_shm_ctrl(b.data(), c);
  EXPECT_EQ(b[0], std::byte{1});
  EXPECT_EQ(b[kShmCtrlLen - 1], std::byte{0});  // reserved bytes are zero
  ShmCtrl d;
  ASSERT_TRUE(decode_shm_ctrl(b.data(), d));
  EXPECT_EQ(d.type, c.type);
  EXPECT_EQ(d.ring_bytes, c.ring_bytes);
  EXPECT_EQ(d.nonce, c.nonce);
  EXPECT_EQ(d.pid, c.pid);
  EXPECT_EQ(d.fd, c.fd);
  EXPECT_EQ(d.boot_id, c.boot_id);
  EXPECT_EQ(d.netns, c.netns);
  EXPECT_EQ(d.base_addr, c.base_addr);
  EXPECT_EQ(d.flags, ShmCtrl::kPeerPull);
  for (uint8_t t : {0, 5, 255}) {
    b[0] = std::byte{t};
    EXPECT_FALSE(decode_shm_ctrl(b.data(), d)) << int(t);
  }
}

// A Write or Read Response by reference (kDdpSvRef): the tagged header, then address and
// length; the header length follows the bit, so the parser collects the reference as header.
TEST(DdpRdmap, SegmentsByReferenceRoundTrip) {
  for (RdmapOpcode op : {RdmapOpcode::rdma_write, RdmapOpcode::read_response}) {
    SCOPED_TRACE(to_string(op));
    Bytes b(kDdpTaggedHdrLen + kSvRefLen);
    ASSERT_EQ(encode_tagged_ref(b.data(), op, true, 0x1234, 0x10000, 0x7f0011223344ull, 70000),
              b.size());
    EXPECT_EQ(static_cast<uint8_t>(b[0]) & kDdpSvRef, kDdpSvRef);
    EXPECT_EQ(ddp_header_len(std::span<const std::byte, 2>(b.data(), 2)), b.size());
    DdpSegment s;
    ASSERT_EQ(ddp_decode(b, static_cast<uint16_t>(b.size()), s), DdpError::ok);
    EXPECT_TRUE(s.sv_ref);
    EXPECT_TRUE(s.last);
    EXPECT_EQ(s.stag, 0x1234u);
    EXPECT_EQ(s.to, 0x10000u);
    EXPECT_EQ(s.ref_addr, 0x7f0011223344ull);
    EXPECT_EQ(s.ref_len, 70000u);
    EXPECT_EQ(s.hdr_len, b.size());
    EXPECT_EQ(s.payload_len, 0u);
    // Data after a reference, or a reference to nothing, is a broken peer.
    Bytes more = b;
    more.push_back(std::byte{0});
    EXPECT_EQ(ddp_decode(more, static_cast<uint16_t>(more.size()), s), DdpError::bad_ref);
    Bytes none = b;
    store_be32(none.data() + kDdpTaggedHdrLen + 8, 0);
    EXPECT_EQ(ddp_decode(none, static_cast<uint16_t>(none.size()), s), DdpError::bad_ref);
    // Cut short: the reference is part of the header.
    EXPECT_EQ(ddp_decode(std::span(b).first(b.size() - 1), static_cast<uint16_t>(b.size() - 1), s),
              DdpError::short_ulpdu);
  }
  // On any other opcode the bit is reserved: ignored (RFC 5041 §5.1), the header as always.
  Bytes u(kDdpUntaggedHdrLen + 4);
  encode_untagged(u.data(), RdmapOpcode::send, true, 0, kQnSend, 1, 0);
  u[0] |= std::byte{kDdpSvRef};
  EXPECT_EQ(ddp_header_len(std::span<const std::byte, 2>(u.data(), 2)), kDdpUntaggedHdrLen);
  DdpSegment s;
  ASSERT_EQ(ddp_decode(u, static_cast<uint16_t>(u.size()), s), DdpError::ok);
  EXPECT_FALSE(s.sv_ref);
  EXPECT_EQ(s.payload_len, 4u);
}

}  // namespace
}  // namespace sv::wire
