// rds-stress wire formats: the TCP control exchange and the RDS message header that
// rds-tools' rds-stress (2.0.x, 2.3.x) speaks, encoded field by field (no packed structs).
//
// Control connection (TCP, the passive side listens on -p, default 4000):
//   active -> passive  options block, all integers big-endian, one of
//       V1 (59 bytes): the fields below from req_depth on, no version string, no tos/async
//       V2 (77 bytes): 16-byte NUL-padded version string, V1, tos (u8), async (u8)
//     rds-tools sends V1 unless -Q/--async (or 2.3.x's JSON options) need V2, and a passive
//     tells the two apart by the first 16 bytes: a version string, or V1's first fields.
//   active -> passive  one "go" byte (after its tasks are ready)
//   passive -> active  one byte back: 97 if the V2 version string carries the JSON flag
//     ("json" 3 bytes after the version's NUL, 2.3.x), else anything
//   with JSON (2.3.x): each side then sends a native-order int32 length and a flat JSON
//     object of option names and values (active first), and the go/reply bytes repeat.
//   Then both sides run until the active closes the connection.
//
// Every request and ack starts with a 63-byte header: seq, index, the 64-bit RDMA fields
// and sizes big-endian; addresses and ports as in sockaddr_in (network order already).
#pragma once

#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace rds_stress {

constexpr size_t kVersionLen = 16;
constexpr size_t kOptionsV1Size = 59;
constexpr size_t kOptionsV2Size = kVersionLen + kOptionsV1Size + 2;
constexpr size_t kHeaderSize = 63;
constexpr uint8_t kJsonIdentifier = 97;
constexpr size_t kJsonFlagGap = 2;  // bytes between the version's NUL and "json"

enum : uint8_t { OP_REQ = 1, OP_ACK = 2 };
enum : uint8_t { RDMA_OP_READ = 1, RDMA_OP_WRITE = 2 };
enum : uint8_t { MODE_READWRITE = 0, MODE_READ = 1, MODE_WRITE = 2 };

// The negotiated run parameters, host order (addresses too, as rds-tools keeps them).
struct Options {
  char version[kVersionLen] = {};
  uint32_t req_depth = 1, req_size = 1024, ack_size = 0, rdma_size = 0;
  uint32_t send_addr = 0, receive_addr = 0;
  uint16_t starting_port = 4000, nr_tasks = 1;
  uint32_t run_time = 0;
  uint8_t summary_only = 0, rtprio = 0, tracing = 0, verify = 0, show_params = 0, show_perfdata = 0,
          use_cong_monitor = 1, rdma_use_once = 0, rdma_use_get_mr = 0, rdma_use_fence = 1,
          rdma_cache_mrs = 0, rdma_key_o_meter = 0, suppress_warnings = 0, simplex = 0, rw_mode = 0;
  uint32_t rdma_vector = 1, rdma_alignment = 0, connect_retries = 0;
  uint8_t tos = 0, async = 0;
};

inline void put16(uint8_t* p, uint16_t v) {
  v = htons(v);
  std::memcpy(p, &v, 2);
}
inline void put32(uint8_t* p, uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}
inline void put64(uint8_t* p, uint64_t v) {
  put32(p, static_cast<uint32_t>(v >> 32));
  put32(p + 4, static_cast<uint32_t>(v));
}
inline uint16_t get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return ntohs(v);
}
inline uint32_t get32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}
inline uint64_t get64(const uint8_t* p) {
  return static_cast<uint64_t>(get32(p)) << 32 | get32(p + 4);
}

// The byte-sized flags, in wire order (offsets 32..46 of V1).
inline uint8_t* flag_fields(Options& o, size_t i) {
  uint8_t* f[] = {&o.summary_only,      &o.rtprio,         &o.tracing,          &o.verify,
                  &o.show_params,       &o.show_perfdata,  &o.use_cong_monitor, &o.rdma_use_once,
                  &o.rdma_use_get_mr,   &o.rdma_use_fence, &o.rdma_cache_mrs,   &o.rdma_key_o_meter,
                  &o.suppress_warnings, &o.simplex,        &o.rw_mode};
  return f[i];
}
constexpr size_t kFlagCount = 15;

inline void encode_v1(const Options& in, uint8_t* p) {
  Options o = in;
  put32(p + 0, o.req_depth);
  put32(p + 4, o.req_size);
  put32(p + 8, o.ack_size);
  put32(p + 12, o.rdma_size);
  put32(p + 16, o.send_addr);
  put32(p + 20, o.receive_addr);
  put16(p + 24, o.starting_port);
  put16(p + 26, o.nr_tasks);
  put32(p + 28, o.run_time);
  for (size_t i = 0; i < kFlagCount; ++i) p[32 + i] = *flag_fields(o, i);
  put32(p + 47, o.rdma_vector);
  put32(p + 51, o.rdma_alignment);
  put32(p + 55, o.connect_retries);
}

inline void decode_v1(const uint8_t* p, Options& o) {
  o.req_depth = get32(p + 0);
  o.req_size = get32(p + 4);
  o.ack_size = get32(p + 8);
  o.rdma_size = get32(p + 12);
  o.send_addr = get32(p + 16);
  o.receive_addr = get32(p + 20);
  o.starting_port = get16(p + 24);
  o.nr_tasks = get16(p + 26);
  o.run_time = get32(p + 28);
  for (size_t i = 0; i < kFlagCount; ++i) *flag_fields(o, i) = p[32 + i];
  o.rdma_vector = get32(p + 47);
  o.rdma_alignment = get32(p + 51);
  o.connect_retries = get32(p + 55);
}

inline void encode_v2(const Options& o, uint8_t* p) {
  std::memcpy(p, o.version, kVersionLen);
  encode_v1(o, p + kVersionLen);
  p[kVersionLen + kOptionsV1Size] = o.tos;
  p[kVersionLen + kOptionsV1Size + 1] = o.async;
}

// Whether the first 16 bytes of an options block are a version string ("2.3.0"): digits
// and dots, then NUL. V1 starts with req_depth big-endian, whose first byte is 0 for any
// depth below 2^24, so it never looks like one.
inline bool looks_like_version(const uint8_t* p) {
  size_t n = 0;
  while (n < kVersionLen && p[n] && ((p[n] >= '0' && p[n] <= '9') || p[n] == '.')) ++n;
  return n > 0 && n < kVersionLen && p[n] == 0 && p[0] >= '0' && p[0] <= '9';
}

// 2.3.x marks "I want to exchange JSON options" inside the version field.
inline bool version_has_json_flag(const char* v) {
  const size_t at = strnlen(v, kVersionLen) + 1 + kJsonFlagGap;
  return at + 4 <= kVersionLen && std::memcmp(v + at, "json", 4) == 0;
}
inline void set_json_flag(char* v) {
  const size_t at = strnlen(v, kVersionLen) + 1 + kJsonFlagGap;
  if (at + 4 <= kVersionLen) std::memcpy(v + at, "json", 4);
}

struct Header {
  uint32_t seq = 0;
  uint32_t from_addr = 0, to_addr = 0;  // network order
  uint16_t from_port = 0, to_port = 0;  // network order
  uint16_t index = 0;
  uint8_t op = 0, rdma_op = 0;
  uint64_t rdma_addr = 0, rdma_phyaddr = 0, rdma_pattern = 0, rdma_key = 0;
  uint32_t rdma_size = 0, rdma_vector = 0;
  uint8_t retry = 0;
};

inline void encode_header(const Header& h, uint8_t* p) {
  put32(p + 0, h.seq);
  std::memcpy(p + 4, &h.from_addr, 4);
  std::memcpy(p + 8, &h.to_addr, 4);
  std::memcpy(p + 12, &h.from_port, 2);
  std::memcpy(p + 14, &h.to_port, 2);
  put16(p + 16, h.index);
  p[18] = h.op;
  p[19] = h.rdma_op;
  put64(p + 20, h.rdma_addr);
  put64(p + 28, h.rdma_phyaddr);
  put64(p + 36, h.rdma_pattern);
  put64(p + 44, h.rdma_key);
  put32(p + 52, h.rdma_size);
  put32(p + 56, h.rdma_vector);
  p[60] = h.retry;
  p[61] = 0;  // rdma_remote_err, pending: local bookkeeping of --async senders
  p[62] = 0;
}

inline Header decode_header(const uint8_t* p) {
  Header h;
  h.seq = get32(p + 0);
  std::memcpy(&h.from_addr, p + 4, 4);
  std::memcpy(&h.to_addr, p + 8, 4);
  std::memcpy(&h.from_port, p + 12, 2);
  std::memcpy(&h.to_port, p + 14, 2);
  h.index = get16(p + 16);
  h.op = p[18];
  h.rdma_op = p[19];
  h.rdma_addr = get64(p + 20);
  h.rdma_phyaddr = get64(p + 28);
  h.rdma_pattern = get64(p + 36);
  h.rdma_key = get64(p + 44);
  h.rdma_size = get32(p + 52);
  h.rdma_vector = get32(p + 56);
  h.retry = p[60];
  return h;
}

// The payload after the header under -v: a byte sequence from the generator
// k -> 41 (k + 3) + (i >> 8) over Z(256), starting at 11 and shifted by one every 256 bytes
// so that swapped blocks show.
inline void payload_pattern(uint8_t* out, size_t n) {
  uint8_t k = 11;
  for (size_t i = 0; i < n; ++i) {
    out[i] = k;
    k = static_cast<uint8_t>(41u * (k + 3u) + static_cast<uint32_t>((i + 1) >> 8));
  }
}

// RDMA data under -v: the request's 64-bit pattern repeated (host order) over the first
// rdma_size bytes.
inline void fill_rdma(void* buf, size_t bytes, uint64_t pattern) {
  auto* w = static_cast<uint64_t*>(buf);
  for (size_t i = 0; i < bytes / 8; ++i) w[i] = pattern;
}
inline bool check_rdma(const void* buf, size_t bytes, uint64_t pattern) {
  auto* w = static_cast<const uint64_t*>(buf);
  for (size_t i = 0; i < bytes / 8; ++i)
    if (w[i] != pattern) return false;
  return true;
}

}  // namespace rds_stress
