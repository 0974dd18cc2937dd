// RDS message header (struct rds_header, net/rds/rds.h; Documentation/networking/rds.rst
// "Message header"): 48 bytes, big-endian, with a 16-byte extension area of
// type-implied-length records.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "wire/be.h"

namespace sv::wire {

inline constexpr size_t kRdsHeaderLen = 48;
inline constexpr size_t kRdsExtSpace = 16;
inline constexpr uint8_t kRdsFlagCongBitmap = 0x01;
inline constexpr uint8_t kRdsFlagAckRequired = 0x02;
inline constexpr uint8_t kRdsFlagRetransmitted = 0x04;

// Extension header types (net/rds/rds.h RDS_EXTHDR_*); the body length follows the type.
inline constexpr uint8_t kRdsExtNone = 0;
inline constexpr uint8_t kRdsExtRdma = 2;      // be32 rkey: this message chased an RDMA
inline constexpr uint8_t kRdsExtRdmaDest = 3;  // be32 rkey, be32 offset: cookie for the peer

struct RdsHeader {
  uint64_t sequence = 0;
  uint64_t ack = 0;
  uint32_t len = 0;
  uint16_t sport = 0;
  uint16_t dport = 0;
  uint8_t flags = 0;
  uint8_t credit = 0;
  // Decoded extensions (at most one of each).
  std::optional<uint32_t> ext_rdma_rkey;
  std::optional<uint64_t> ext_rdma_dest;  // cookie: rkey | offset << 32
};

inline void rds_encode(const RdsHeader& h, std::byte* out) {
  std::array<std::byte, kRdsHeaderLen> z{};
  std::byte* p = out;
  std::copy(z.begin(), z.end(), p);
  store_be64(p, h.sequence);
  store_be64(p + 8, h.ack);
  store_be32(p + 16, h.len);
  store_be16(p + 20, h.sport);
  store_be16(p + 22, h.dport);
  p[24] = std::byte{h.flags};
  p[25] = std::byte{h.credit};
  // h_csum (offset 30) = 0: "not checksummed", as RDS/TCP sends.
  std::byte* e = p + 32;
  if (h.ext_rdma_dest) {
    e[0] = std::byte{kRdsExtRdmaDest};
    store_be32(e + 1, static_cast<uint32_t>(*h.ext_rdma_dest));
    store_be32(e + 5, static_cast<uint32_t>(*h.ext_rdma_dest >> 32));
    e += 9;
  }
  if (h.ext_rdma_rkey && e + 5 <= p + 32 + kRdsExtSpace) {
    e[0] = std::byte{kRdsExtRdma};
    store_be32(e + 1, *h.ext_rdma_rkey);
  }
}

// Returns false on an unknown extension type (the rest of the header is still decoded).
inline bool rds_decode(const std::byte* in, RdsHeader& h) {
  h = RdsHeader{};
  h.sequence = load_be64(in);
  h.ack = load_be64(in + 8);
  h.len = load_be32(in + 16);
  h.sport = load_be16(in + 20);
  h.dport = load_be16(in + 22);
  h.flags = static_cast<uint8_t>(in[24]);
  h.credit = static_cast<uint8_t>(in[25]);
  const std::byte* e = in + 32;
  const std::byte* end = e + kRdsExtSpace;
  while (e < end) {
    const auto type = static_cast<uint8_t>(*e);
    if (type == kRdsExtNone) break;
    if (type == kRdsExtRdma && e + 5 <= end) {
      h.ext_rdma_rkey = load_be32(e + 1);
      e += 5;
    } else if (type == kRdsExtRdmaDest && e + 9 <= end) {
      h.ext_rdma_dest = load_be32(e + 1) | (static_cast<uint64_t>(load_be32(e + 5)) << 32);
      e += 9;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace sv::wire
