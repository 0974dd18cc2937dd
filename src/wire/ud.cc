#include "wire/ud.h"

#include <algorithm>
#include <cstring>

#include "wire/be.h"

namespace sv::wire {

const char* to_string(UdError e) {
  switch (e) {
    case UdError::ok:
      return "ok";
    case UdError::short_datagram:
      return "datagram shorter than its headers";
    case UdError::bad_version:
      return "BTH transport header version not 0";
    case UdError::bad_opcode:
      return "not a UD SEND Only opcode";
  }
  return "?";
}

size_t encode_ud_header(const UdHeader& h, std::byte* out) {
  // BTH: OpCode | SE M PadCnt(2) TVer(4) | P_Key | resv8 | DestQP | A resv7 | PSN
  out[0] = std::byte{h.has_imm ? kUdSendOnlyImm : kUdSendOnly};
  out[1] = std::byte(static_cast<uint8_t>((h.solicited ? 0x80 : 0) | ((h.pad & 3) << 4)));
  store_be16(out + 2, h.pkey);
  store_be32(out + 4, h.dest_qp & 0xFFFFFF);  // byte 4 (reserved) stays 0
  store_be32(out + 8, h.psn & 0xFFFFFF);      // A bit 0: UD has no ACKs
  // DETH: Q_Key | resv8 | SrcQP
  store_be32(out + 12, h.qkey);
  store_be32(out + 16, h.src_qp & 0xFFFFFF);
  if (!h.has_imm) return kBthLen + kDethLen;
  std::memcpy(out + 20, &h.imm_be, kImmDtLen);
  return kUdMaxHdrLen;
}

UdError decode_ud_header(const std::byte* p, size_t n, UdHeader& h, size_t* hdr_len,
                         size_t* payload_len) {
  if (n < kBthLen + kDethLen) return UdError::short_datagram;
  const auto op = static_cast<uint8_t>(p[0]);
  const auto flags = static_cast<uint8_t>(p[1]);
  if ((flags & 0x0F) != 0) return UdError::bad_version;
  if (op != kUdSendOnly && op != kUdSendOnlyImm) return UdError::bad_opcode;
  h = UdHeader{};
  h.has_imm = op == kUdSendOnlyImm;
  h.solicited = (flags & 0x80) != 0;
  h.pad = static_cast<uint8_t>((flags >> 4) & 3);
  h.pkey = load_be16(p + 2);
  h.dest_qp = load_be32(p + 4) & 0xFFFFFF;
  h.psn = load_be32(p + 8) & 0xFFFFFF;
  h.qkey = load_be32(p + 12);
  h.src_qp = load_be32(p + 16) & 0xFFFFFF;
  size_t len = kBthLen + kDethLen;
  if (h.has_imm) {
    if (n < kUdMaxHdrLen) return UdError::short_datagram;
    std::memcpy(&h.imm_be, p + len, kImmDtLen);
    len += kImmDtLen;
  }
  if (n - len < h.pad) return UdError::short_datagram;
  *hdr_len = len;
  *payload_len = n - len - h.pad;
  return UdError::ok;
}

bool gid_is_v4(const uint8_t gid[16]) {
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid, kMapped, 12) == 0;
}

namespace {

// RFC 1071 one's-complement sum over the 20-byte IPv4 header.
uint16_t ipv4_checksum(const std::byte* h) {
  uint32_t sum = 0;
  for (size_t i = 0; i < 20; i += 2) sum += load_be16(h + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

constexpr uint8_t kIpProtoUdp = 17;
constexpr size_t kUdpHdrLen = 8;

}  // namespace

void encode_grh(const Grh& g, uint32_t payload_len, std::byte out[kGrhLen]) {
  std::memset(out, 0, kGrhLen);
  const uint32_t transport = kUdpHdrLen + kBthLen + kDethLen + payload_len;
  if (gid_is_v4(g.sgid) && gid_is_v4(g.dgid)) {
    std::byte* ip = out + 20;
    ip[0] = std::byte{0x45};  // version 4, IHL 5
    ip[1] = std::byte{g.traffic_class};
    store_be16(ip + 2, static_cast<uint16_t>(std::min<uint32_t>(20 + transport, 0xFFFF)));
    store_be16(ip + 6, 0x4000);  // DF
    ip[8] = std::byte{g.hop_limit};
    ip[9] = std::byte{kIpProtoUdp};
    std::memcpy(ip + 12, g.sgid + 12, 4);
    std::memcpy(ip + 16, g.dgid + 12, 4);
    store_be16(ip + 10, ipv4_checksum(ip));
    return;
  }
  store_be32(out, (6u << 28) | (uint32_t{g.traffic_class} << 20) | (g.flow_label & 0xFFFFF));
  store_be16(out + 4, static_cast<uint16_t>(std::min<uint32_t>(transport, 0xFFFF)));
  out[6] = std::byte{kIpProtoUdp};
  out[7] = std::byte{g.hop_limit};
  std::memcpy(out + 8, g.sgid, 16);
  std::memcpy(out + 24, g.dgid, 16);
}

bool decode_grh(const std::byte in[kGrhLen], Grh& g) {
  g = Grh{};
  const uint32_t w0 = load_be32(in);
  const std::byte* ip = in + 20;
  const auto v4_first = static_cast<uint8_t>(ip[0]);
  // rdma-core's rule: not version 6 means IPv4 at offset 20; version 6 is still IPv4 when
  // offset 20 holds a 5-word IPv4 header whose checksum is right.
  const bool v4_shape = v4_first == 0x45 && ipv4_checksum(ip) == 0;
  if ((w0 >> 28) != 6 || v4_shape) {
    if (!v4_shape) return false;
    g.ip_version = 4;
    g.traffic_class = static_cast<uint8_t>(ip[1]);
    g.hop_limit = static_cast<uint8_t>(ip[8]);
    g.sgid[10] = g.sgid[11] = g.dgid[10] = g.dgid[11] = 0xff;
    std::memcpy(g.sgid + 12, ip + 12, 4);
    std::memcpy(g.dgid + 12, ip + 16, 4);
    return true;
  }
  g.ip_version = 6;
  g.traffic_class = static_cast<uint8_t>((w0 >> 20) & 0xFF);
  g.flow_label = w0 & 0xFFFFF;
  g.hop_limit = static_cast<uint8_t>(in[7]);
  std::memcpy(g.sgid, in + 8, 16);
  std::memcpy(g.dgid, in + 24, 16);
  return true;
}

namespace {
constexpr char kSidrMagic[4] = {'S', 'V', 'S', 'I'};
size_t sidr_limit(SidrKind k) {
  return k == SidrKind::req ? kSidrReqMaxPrivData : kSidrRepMaxPrivData;
}
}  // namespace

size_t encode_sidr(const Sidr& m, std::byte* out) {
  const uint8_t len = static_cast<uint8_t>(std::min<size_t>(m.pdata_len, sidr_limit(m.kind)));
  std::memcpy(out, kSidrMagic, 4);
  out[4] = std::byte{kSidrVersion};
  out[5] = std::byte{static_cast<uint8_t>(m.kind)};
  out[6] = std::byte{m.status};
  out[7] = std::byte{len};
  store_be32(out + 8, m.req_id);
  store_be32(out + 12, m.qpn & 0xFFFFFF);
  store_be32(out + 16, m.qkey);
  if (len) std::memcpy(out + kSidrHdrLen, m.pdata, len);
  return kSidrHdrLen + len;
}

bool decode_sidr(const std::byte* p, size_t n, Sidr& m) {
  if (n < kSidrHdrLen || std::memcmp(p, kSidrMagic, 4) != 0) return false;
  if (static_cast<uint8_t>(p[4]) != kSidrVersion) return false;
  const auto kind = static_cast<uint8_t>(p[5]);
  if (kind != static_cast<uint8_t>(SidrKind::req) && kind != static_cast<uint8_t>(SidrKind::rep))
    return false;
  m = Sidr{};
  m.kind = static_cast<SidrKind>(kind);
  m.status = static_cast<uint8_t>(p[6]);
  m.pdata_len = static_cast<uint8_t>(p[7]);
  if (m.pdata_len > sidr_limit(m.kind) || n != kSidrHdrLen + m.pdata_len) return false;
  m.req_id = load_be32(p + 8);
  m.qpn = load_be32(p + 12) & 0xFFFFFF;
  m.qkey = load_be32(p + 16);
  m.pdata = m.pdata_len ? p + kSidrHdrLen : nullptr;
  return true;
}

}  // namespace sv::wire
