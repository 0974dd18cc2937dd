// UD datagram headers (BTH+DETH+ImmDt) and the GRH a receiver finds in its buffer.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "hex.h"
#include "wire/ud.h"

namespace sv::wire {
namespace {

std::vector<std::byte> bytes(std::initializer_list<int> l) {
  std::vector<std::byte> v;
  for (int b : l) v.push_back(std::byte(b));
  return v;
}

TEST(WireUd, SendOnlyMatchesTheIbaLayout) {
  UdHeader h;
  h.dest_qp = 0x1234FF;
  h.psn = 0x000001;
  h.qkey = 0x11111111;
  h.src_qp = 0xABCDFF;
  std::array<std::byte, kUdMaxHdrLen> out{};
  ASSERT_EQ(encode_ud_header(h, out.data()), kBthLen + kDethLen);
  // BTH: opcode 0x64 (UD SEND Only), SE/M/Pad/TVer 0, P_Key ffff, resv, DestQP, A/resv, PSN;
  // DETH: Q_Key, resv, SrcQP (IBA 9.2, 9.3.2).
  const auto want = bytes({0x64, 0x00, 0xff, 0xff, 0x00, 0x12, 0x34, 0xff, 0x00, 0x00,
                           0x00, 0x01, 0x11, 0x11, 0x11, 0x11, 0x00, 0xab, 0xcd, 0xff});
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), want.size()));
}

TEST(WireUd, ImmediateAndSolicitedRoundTrip) {
  UdHeader h;
  h.has_imm = true;
  h.solicited = true;
  h.dest_qp = 0x00AAFF;
  h.src_qp = 0x00BBFF;
  h.qkey = 0x80000001;
  h.psn = 0xFFFFFF;
  const uint8_t imm[4] = {0xde, 0xad, 0xbe, 0xef};
  std::memcpy(&h.imm_be, imm, 4);
  std::vector<std::byte> d(kUdMaxHdrLen + 5);
  ASSERT_EQ(encode_ud_header(h, d.data()), kUdMaxHdrLen);
  EXPECT_EQ(d[0], std::byte{0x65});
  EXPECT_EQ(d[1], std::byte{0x80});
  EXPECT_EQ(0, std::memcmp(d.data() + 20, imm, 4));  // ImmDt in network order
  UdHeader g;
  size_t hl = 0, pl = 0;
  ASSERT_EQ(decode_ud_header(d.data(), d.size(), g, &hl, &pl), UdError::ok);
  EXPECT_EQ(hl, kUdMaxHdrLen);
  EXPECT_EQ(pl, 5u);
  EXPECT_TRUE(g.has_imm);
  EXPECT_TRUE(g.solicited);
  EXPECT_EQ(g.dest_qp, h.dest_qp);
  EXPECT_EQ(g.src_qp, h.src_qp);
  EXPECT_EQ(g.qkey, h.qkey);
  EXPECT_EQ(g.psn, h.psn);
  EXPECT_EQ(g.imm_be, h.imm_be);
  EXPECT_EQ(g.pkey, kDefaultPkey);
}

TEST(WireUd, RefusesWhatIsNotAUdSend) {
  UdHeader h;
  std::vector<std::byte> d(kBthLen + kDethLen + 8);
  encode_ud_header(h, d.data());
  UdHeader g;
  size_t hl, pl;
  for (size_t n = 0; n < kBthLen + kDethLen; ++n)
    EXPECT_EQ(decode_ud_header(d.data(), n, g, &hl, &pl), UdError::short_datagram) << n;
  auto bad = d;
  bad[1] = std::byte{0x01};  // TVer 1
  EXPECT_EQ(decode_ud_header(bad.data(), bad.size(), g, &hl, &pl), UdError::bad_version);
  for (int op : {0x04, 0x00, 0x0a, 0x66, 0x81, 0xff}) {  // RC SEND Only, RC First, Write, ...
    bad = d;
    bad[0] = std::byte(op);
    EXPECT_EQ(decode_ud_header(bad.data(), bad.size(), g, &hl, &pl), UdError::bad_opcode) << op;
  }
  // With Immediate but cut inside the ImmDt.
  bad = d;
  bad[0] = std::byte{kUdSendOnlyImm};
  EXPECT_EQ(decode_ud_header(bad.data(), kBthLen + kDethLen + 3, g, &hl, &pl),
            UdError::short_datagram);
  // A pad count longer than what follows the headers.
  bad = d;
  bad[1] = std::byte{0x30};
  EXPECT_EQ(decode_ud_header(bad.data(), kBthLen + kDethLen + 2, g, &hl, &pl),
            UdError::short_datagram);
  ASSERT_EQ(decode_ud_header(bad.data(), kBthLen + kDethLen + 8, g, &hl, &pl), UdError::ok);
  EXPECT_EQ(pl, 5u);  // pad bytes are not payload
}

Grh v4_grh() {
  Grh g;
  g.sgid[10] = g.sgid[11] = g.dgid[10] = g.dgid[11] = 0xff;
  const uint8_t s[4] = {10, 1, 2, 3}, d[4] = {127, 0, 0, 1};
  std::memcpy(g.sgid + 12, s, 4);
  std::memcpy(g.dgid + 12, d, 4);
  g.hop_limit = 64;
  return g;
}

TEST(WireUd, Ipv4GrhIsZeroesThenAnIpv4Header) {
  std::array<std::byte, kGrhLen> out;
  encode_grh(v4_grh(), 100, out.data());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(out[i], std::byte{0}) << i;
  EXPECT_EQ(out[20], std::byte{0x45});
  EXPECT_EQ(out[29], std::byte{17});  // UDP
  EXPECT_EQ(static_cast<int>(out[28]), 64);
  // Total length: IP 20 + UDP 8 + BTH 12 + DETH 8 + payload.
  EXPECT_EQ((static_cast<int>(out[22]) << 8) | static_cast<int>(out[23]), 20 + 8 + 20 + 100);
  const uint8_t want_src[4] = {10, 1, 2, 3};
  EXPECT_EQ(0, std::memcmp(out.data() + 32, want_src, 4));
  // The checksum verifies (RFC 1071: the sum over the header is all ones).
  uint32_t sum = 0;
  for (int i = 20; i < 40; i += 2)
    sum += (static_cast<uint32_t>(out[i]) << 8) | static_cast<uint32_t>(out[i + 1]);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  EXPECT_EQ(sum, 0xFFFFu);
  Grh back;
  ASSERT_TRUE(decode_grh(out.data(), back));
  EXPECT_EQ(back.ip_version, 4);
  EXPECT_EQ(0, std::memcmp(back.sgid, v4_grh().sgid, 16));
  EXPECT_EQ(0, std::memcmp(back.dgid, v4_grh().dgid, 16));
  // A corrupted IPv4 header is not a GRH.
  out[33] ^= std::byte{1};
  EXPECT_FALSE(decode_grh(out.data(), back));
}

TEST(WireUd, Ipv6GrhRoundTrip) {
  Grh g;
  for (int i = 0; i < 16; ++i) {
    g.sgid[i] = static_cast<uint8_t>(0x20 + i);
    g.dgid[i] = static_cast<uint8_t>(0x40 + i);
  }
  g.traffic_class = 0x12;
  g.flow_label = 0xABCDE;
  g.hop_limit = 7;
  std::array<std::byte, kGrhLen> out;
  encode_grh(g, 8, out.data());
  EXPECT_EQ(static_cast<int>(out[0]) >> 4, 6);
  Grh back;
  ASSERT_TRUE(decode_grh(out.data(), back));
  EXPECT_EQ(back.ip_version, 6);
  EXPECT_EQ(back.traffic_class, 0x12);
  EXPECT_EQ(back.flow_label, 0xABCDEu);
  EXPECT_EQ(back.hop_limit, 7);
  EXPECT_EQ(0, std::memcmp(back.sgid, g.sgid, 16));
  EXPECT_EQ(0, std::memcmp(back.dgid, g.dgid, 16));
  // Neither version 6 nor an IPv4 header at offset 20.
  std::array<std::byte, kGrhLen> junk{};
  EXPECT_FALSE(decode_grh(junk.data(), back));
}

}  // namespace
}  // namespace sv::wire
