// libFuzzer target for what a UD peer (any host that can reach a UD QP's UDP port) controls:
// the datagram's BTH/DETH/ImmDt headers and, read back by ibv_init_ah_from_wc, the GRH
// (src/wire/ud.h).
//
// Input: byte 0 (mod 3) picks the parser; the rest is its input.
//  0: a datagram. Traps if a decoded header's length, payload and pad do not add up to the
//     datagram, or if re-encoding the header does not decode to the same fields.
//  1: a GRH. Traps if a decoded GRH does not survive encode/decode with its addresses,
//     version (IPv4 for IPv4-mapped addresses), traffic class, flow label and hop limit.
//  2: an rdma_cm SIDR message on a PS_UDP port. Traps if a decoded message's private data
//     is not inside the input or beyond its kind's limit, or if it does not re-encode to
//     the same bytes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_check.h"
#include "wire/ud.h"

namespace w = sv::wire;

namespace {

void datagram(const std::byte* d, size_t n) {
  w::UdHeader h;
  size_t hl = 0, pl = 0;
  if (w::decode_ud_header(d, n, h, &hl, &pl) != w::UdError::ok) return;
  FUZZ_CHECK(hl == w::kBthLen + w::kDethLen + (h.has_imm ? w::kImmDtLen : 0));
  FUZZ_CHECK(hl + pl + h.pad == n);
  FUZZ_CHECK(h.dest_qp <= 0xFFFFFF && h.src_qp <= 0xFFFFFF && h.psn <= 0xFFFFFF);
  std::array<std::byte, w::kUdMaxHdrLen + 3> again{};
  const size_t el = w::encode_ud_header(h, again.data());
  FUZZ_CHECK(el == hl);
  w::UdHeader g;
  size_t hl2 = 0, pl2 = 0;
  FUZZ_CHECK(w::decode_ud_header(again.data(), el + h.pad, g, &hl2, &pl2) == w::UdError::ok);
  FUZZ_CHECK(hl2 == hl && pl2 == 0 && g.pad == h.pad && g.has_imm == h.has_imm &&
             g.solicited == h.solicited && g.pkey == h.pkey && g.dest_qp == h.dest_qp &&
             g.psn == h.psn && g.qkey == h.qkey && g.src_qp == h.src_qp &&
             g.imm_be == (h.has_imm ? h.imm_be : 0));
}

void grh(const std::byte* d, size_t n) {
  if (n < w::kGrhLen) return;
  w::Grh g;
  if (!w::decode_grh(d, g)) return;
  FUZZ_CHECK(g.ip_version == 4 || g.ip_version == 6);
  if (g.ip_version == 4) FUZZ_CHECK(w::gid_is_v4(g.sgid) && w::gid_is_v4(g.dgid));
  std::array<std::byte, w::kGrhLen> out;
  w::encode_grh(g, 0, out.data());
  w::Grh back;
  FUZZ_CHECK(w::decode_grh(out.data(), back));
  // IPv4-mapped addresses are written as IPv4 (RoCEv2 never puts them in an IPv6 header),
  // which has no flow label.
  const bool v4 = w::gid_is_v4(g.sgid) && w::gid_is_v4(g.dgid);
  FUZZ_CHECK(back.ip_version == (v4 ? 4 : 6) && back.traffic_class == g.traffic_class &&
             back.hop_limit == g.hop_limit && back.flow_label == (v4 ? 0 : g.flow_label) &&
             std::memcmp(back.sgid, g.sgid, 16) == 0 && std::memcmp(back.dgid, g.dgid, 16) == 0);
}

void sidr(const std::byte* d, size_t n) {
  w::Sidr m;
  if (!w::decode_sidr(d, n, m)) return;
  FUZZ_CHECK(n == w::kSidrHdrLen + m.pdata_len);
  FUZZ_CHECK(m.pdata_len <=
             (m.kind == w::SidrKind::req ? w::kSidrReqMaxPrivData : w::kSidrRepMaxPrivData));
  FUZZ_CHECK(!m.pdata_len || (m.pdata == d + w::kSidrHdrLen));
  std::array<std::byte, w::kSidrHdrLen + 255> out;
  const size_t len = w::encode_sidr(m, out.data());
  FUZZ_CHECK(len == n);
  // The QPN's reserved top byte is not carried through.
  std::array<std::byte, w::kSidrHdrLen + 255> in;
  std::memcpy(in.data(), d, n);
  in[12] = std::byte{0};
  FUZZ_CHECK(std::memcmp(out.data(), in.data(), n) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto* d = reinterpret_cast<const std::byte*>(data + 1);
  switch (data[0] % 3) {
    case 0:
      datagram(d, size - 1);
      break;
    case 1:
      grh(d, size - 1);
      break;
    default:
      sidr(d, size - 1);
      break;
  }
  return 0;
}
