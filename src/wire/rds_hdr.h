// RDS message header (struct rds_header, net/rds/rds.h; Documentation/networking/rds.rst
// "Message header"): 48 bytes, big-endian, with a 16-byte extension area of
// type-implied-length records.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
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
// softverbs' own, no body: the RDMA Write this message reports is vouched for by a fence on
// the sender's RDMA channel (RdsFence); the receiver holds the message until it arrives.
// Outside net/rds's range (__RDS_EXTHDR_MAX), which a Linux receiver stops parsing at.
inline constexpr uint8_t kRdsExtFenced = 0x80;
// softverbs' own, in a header-only message (sequence 0, as an ack) toward a peer whose regions
// are addressed by virtual address (kRdsPrivVaMrs): be32 rkey, "where does this region start?"
inline constexpr uint8_t kRdsExtMrBaseReq = 0x81;
// ... and the answer: be32 rkey, be64 the address its cookie's offset counts from (0: no region
// of ours has that rkey).
inline constexpr uint8_t kRdsExtMrBase = 0x82;

struct RdsMrBase {
  uint32_t rkey = 0;
  uint64_t base = 0;
  bool operator==(const RdsMrBase&) const = default;
};

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
  std::optional<uint64_t> ext_rdma_dest;    // cookie: rkey | offset << 32
  bool ext_fenced = false;                  // kRdsExtFenced
  std::optional<uint32_t> ext_mr_base_req;  // kRdsExtMrBaseReq: rkey
  std::optional<RdsMrBase> ext_mr_base;     // kRdsExtMrBase
};

// h_csum (offset 30): the Internet checksum of the 48-byte header, as net/rds
// rds_message_make_checksum (ip_fast_csum) computes it; 0 means "not checksummed" (RDS/TCP
// sends 0), which rds_message_verify_checksum accepts.
inline constexpr size_t kRdsCsumOffset = 30;

inline uint16_t rds_csum_fold(const std::byte* hdr) {
  uint32_t sum = 0;
  for (size_t i = 0; i < kRdsHeaderLen; i += 2) sum += load_be16(hdr + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

inline bool rds_csum_ok(const std::byte* hdr) {
  return load_be16(hdr + kRdsCsumOffset) == 0 || rds_csum_fold(hdr) == 0xFFFF;
}

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
    e += 5;
  }
  if (h.ext_fenced && e < p + 32 + kRdsExtSpace) {
    e[0] = std::byte{kRdsExtFenced};
    e += 1;
  }
  if (h.ext_mr_base_req && e + 5 <= p + 32 + kRdsExtSpace) {
    e[0] = std::byte{kRdsExtMrBaseReq};
    store_be32(e + 1, *h.ext_mr_base_req);
    e += 5;
  }
  if (h.ext_mr_base && e + 13 <= p + 32 + kRdsExtSpace) {
    e[0] = std::byte{kRdsExtMrBase};
    store_be32(e + 1, h.ext_mr_base->rkey);
    store_be64(e + 5, h.ext_mr_base->base);
  }
  uint16_t csum = static_cast<uint16_t>(~rds_csum_fold(p));
  if (csum == 0) csum = 0xFFFF;  // the same sum in ones' complement; 0 would mean "none"
  store_be16(p + kRdsCsumOffset, csum);
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
    } else if (type == kRdsExtFenced) {
      h.ext_fenced = true;
      e += 1;
    } else if (type == kRdsExtMrBaseReq && e + 5 <= end) {
      h.ext_mr_base_req = load_be32(e + 1);
      e += 5;
    } else if (type == kRdsExtMrBase && e + 13 <= end) {
      h.ext_mr_base = RdsMrBase{load_be32(e + 1), load_be64(e + 5)};
      e += 13;
    } else {
      return false;
    }
  }
  return true;
}

// rdma_cm private data of an RDS connection request and its accept (softverbs' own: Linux
// RDS/IB carries rds_ib_connect_private; ours names the process rather than a host).
inline constexpr uint32_t kRdsConnMagic = 0x53565244;  // "SVRD"
inline constexpr size_t kRdsConnPrivLen = 32;
inline constexpr uint16_t kRdsChanData = 0, kRdsChanRdma = 1;
// Flags (bytes 12-13, zero from peers that predate them, so zero must mean what they did).
// NoAtomics: the sender's device has no atomics (atomic_cap IBV_ATOMIC_NONE: Linux siw, or
// softverbs with SOFTVERBS_RFC7306=0). An atomic sent there would only cost the RDMA
// channel its connection; Linux RDS refuses atomics on a transport without them
// (send.c: EOPNOTSUPP when the transport has no xmit_atomic), and so does our sendmsg.
inline constexpr uint16_t kRdsPrivNoAtomics = 0x1;
// VaMrs: the sender registers its RDS regions by virtual address, because its device ignores
// the iova of ibv_reg_mr_iova2 (Linux siw: siw_reg_user_mr keeps the user address as the
// region's base), so a cookie's offset counts from an address only the sender knows. Before
// each RDMA op on a cookie of its, the peer asks for it (kRdsExtMrBaseReq).
inline constexpr uint16_t kRdsPrivVaMrs = 0x2;

struct RdsConnPriv {
  uint32_t ip = 0;       // the sender's address for this connection (network order)
  uint16_t cm_port = 0;  // the sender's rdma_cm listen port
  uint16_t kind = 0;     // kRdsChanData or kRdsChanRdma
  uint16_t flags = 0;    // kRdsPriv*; unknown bits are ignored
  uint64_t ack_seq = 0;  // last in-order sequence the sender received from us
  uint64_t gen = 0;      // the sender process' generation number
};

inline void rds_conn_priv_encode(const RdsConnPriv& p, std::byte* out) {
  std::array<std::byte, kRdsConnPrivLen> z{};
  std::copy(z.begin(), z.end(), out);
  store_be32(out, kRdsConnMagic);
  std::memcpy(out + 4, &p.ip, 4);
  store_be16(out + 8, p.cm_port);
  store_be16(out + 10, p.kind);
  store_be16(out + 12, p.flags);
  store_be64(out + 16, p.ack_seq);
  store_be64(out + 24, p.gen);
}

// False for anything but one of ours (short, wrong magic, unknown kind).
inline bool rds_conn_priv_decode(const std::byte* in, size_t len, RdsConnPriv& p) {
  if (!in || len < kRdsConnPrivLen || load_be32(in) != kRdsConnMagic) return false;
  std::memcpy(&p.ip, in + 4, 4);
  p.cm_port = load_be16(in + 8);
  p.kind = load_be16(in + 10);
  p.flags = load_be16(in + 12);
  p.ack_seq = load_be64(in + 16);
  p.gen = load_be64(in + 24);
  return p.kind == kRdsChanData || p.kind == kRdsChanRdma;
}

// A fence (softverbs' own): a 16-byte SEND on the RDMA channel right behind the Write it
// vouches for. RC order (RFC 5040 §5.5: a Send is delivered after the messages before it
// were placed) makes its arrival proof that the Write has landed, so the message reporting
// the Write may travel on the data connection at the same time and wait at the receiver,
// instead of the sender waiting for the Write's completion. `ok` false is the verdict on a
// Write that failed (a bad cookie): drop its message. Magic, status (0 ok, 1 failed),
// the reporting message's sequence; big-endian.
inline constexpr uint32_t kRdsFenceMagic = 0x5356464E;  // "SVFN"
inline constexpr size_t kRdsFenceLen = 16;

struct RdsFence {
  uint64_t sequence = 0;
  bool ok = true;
};

inline void rds_fence_encode(const RdsFence& f, std::byte* out) {
  store_be32(out, kRdsFenceMagic);
  store_be32(out + 4, f.ok ? 0 : 1);
  store_be64(out + 8, f.sequence);
}

// False for anything but a fence (wrong length or magic, unknown status, sequence 0).
inline bool rds_fence_decode(const std::byte* in, size_t len, RdsFence& f) {
  if (!in || len != kRdsFenceLen || load_be32(in) != kRdsFenceMagic) return false;
  const uint32_t st = load_be32(in + 4);
  f.ok = st == 0;
  f.sequence = load_be64(in + 8);
  return st <= 1 && f.sequence != 0;
}

// rdma_cm private data of a directory lookup (rds/directory.cc) and of its answer, which
// comes back as a reject's private data: magic, the address and port looked up (request),
// the owner's rdma_cm port and generation (answer; port 0: nobody bound there). 24 bytes,
// big-endian; the address and port stay in network order as they are on the socket.
inline constexpr uint32_t kRdsDirMagic = 0x53564452;  // "SVDR"
inline constexpr size_t kRdsDirPrivLen = 24;

struct RdsDirPriv {
  uint32_t ip = 0;       // request: destination address (network order)
  uint16_t port = 0;     // request: destination port (network order)
  uint16_t cm_port = 0;  // answer: the owner's rdma_cm port, 0 = nobody
  uint64_t gen = 0;      // answer: the owner's generation
};

inline void rds_dir_priv_encode(const RdsDirPriv& p, std::byte* out) {
  std::array<std::byte, kRdsDirPrivLen> z{};
  std::copy(z.begin(), z.end(), out);
  store_be32(out, kRdsDirMagic);
  std::memcpy(out + 4, &p.ip, 4);
  std::memcpy(out + 8, &p.port, 2);
  store_be16(out + 10, p.cm_port);
  store_be64(out + 16, p.gen);
}

// False for anything that is not a directory's (short, or wrong magic). Reads bytes, so
// private data at any alignment is fine.
inline bool rds_dir_priv_decode(const void* data, size_t len, RdsDirPriv& p) {
  const auto* in = static_cast<const std::byte*>(data);
  if (!in || len < kRdsDirPrivLen || load_be32(in) != kRdsDirMagic) return false;
  std::memcpy(&p.ip, in + 4, 4);
  std::memcpy(&p.port, in + 8, 2);
  p.cm_port = load_be16(in + 10);
  p.gen = load_be64(in + 16);
  return true;
}

}  // namespace sv::wire
