// The rsocket wire protocol as rdma-core's librdmacm speaks it (docs/rsockets-protocol.md):
// the 40-byte connection private data, the 32-bit message word that follows each RDMA WRITE
// (iWARP "MSG_SEND" mode: a 4-byte SEND, since iWARP has no WRITE-with-immediate), the
// 16-byte SGL records a receiver writes into its peer's target-SGL array, and the 24-byte
// iomap records. Pure functions and one pure state machine (RecvLedger) over bytes: no
// sockets, no verbs, so the rules that protect us from a hostile peer are unit-tested and
// fuzzed (fuzz/fuzz_rsocket.cc).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

#include "wire/be.h"

namespace sv::wire::rs {

inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kConnDataLen = 40;
inline constexpr uint8_t kFlagNet = 0x01;    // RS_CONN_FLAG_NET: sender's host is big-endian
inline constexpr uint8_t kFlagIomap = 0x02;  // RS_CONN_FLAG_IOMAP: always set by rdma-core
inline constexpr uint32_t kSglEntries = 2;   // RS_SGL_SIZE: the target SGL is two halves
inline constexpr size_t kSgeLen = 16;        // struct rs_sge: addr u64, key u32, length u32
inline constexpr size_t kIomapLen = 24;      // struct rs_iomap: offset u64 + rs_sge

// Message word: the op in the top 3 bits, its argument in the low 29 (rsocket.c rs_msg_set).
enum class Op : uint32_t { data = 0, write = 2, sgl = 4, iomap_sgl = 6, ctrl = 7 };
enum class Ctrl : uint32_t { disconnect = 0, keepalive = 1, shutdown = 2 };
inline constexpr uint32_t kMsgDataMask = (1u << 29) - 1;

inline constexpr uint32_t msg(Op op, uint32_t data) {
  return static_cast<uint32_t>(op) << 29 | (data & kMsgDataMask);
}
inline constexpr Op msg_op(uint32_t m) {
  return static_cast<Op>(m >> 29);
}
inline constexpr uint32_t msg_data(uint32_t m) {
  return m & kMsgDataMask;
}

// An SGL entry, host order on the wire when both ends share endianness (x86 here): rdma-core
// RDMA-writes its struct rs_sge as it lies in memory.
struct Sge {
  uint64_t addr = 0;
  uint32_t key = 0;
  uint32_t length = 0;
};
static_assert(sizeof(Sge) == kSgeLen);

struct ConnData {
  uint8_t version = kVersion;
  uint8_t flags = kFlagIomap;
  uint16_t credits = 0;           // the sender's rq_size: DATA messages we may send it
  uint8_t target_iomap_size = 0;  // scaled (iomap_scale_to_value)
  Sge target_sgl;                 // the sender's target-SGL array; length = entries
  Sge data_buf;                   // first half of the sender's receive buffer
};

// rs_value_to_scale / rs_scale_to_value (8 bits): up to 128 as is, larger as 0x80 | v >> 8;
// 0x80 itself decodes as 128.
inline uint8_t iomap_value_to_scale(uint32_t v) {
  return v <= 0x80 ? static_cast<uint8_t>(v) : static_cast<uint8_t>(0x80 | ((v >> 8) & 0x7f));
}
inline uint32_t iomap_scale_to_value(uint8_t s) {
  return s <= 0x80 ? s : static_cast<uint32_t>(s & 0x7f) << 8;
}

inline void encode_conn_data(const ConnData& c, std::byte out[kConnDataLen]) {
  std::memset(out, 0, kConnDataLen);
  out[0] = std::byte(c.version);
  out[1] = std::byte(c.flags);
  store_be16(out + 2, c.credits);
  out[7] = std::byte(c.target_iomap_size);
  store_be64(out + 8, c.target_sgl.addr);
  store_be32(out + 16, c.target_sgl.key);
  store_be32(out + 20, c.target_sgl.length);
  store_be64(out + 24, c.data_buf.addr);
  store_be32(out + 32, c.data_buf.key);
  store_be32(out + 36, c.data_buf.length);
}

// nullopt unless it is version 1 private data of at least 40 bytes (rs_accept/rs_do_connect
// refuse other versions; the length check is ours: rdma-core's listener reads past short data).
// The SGL array must have exactly two entries and the granted half must be non-empty: the
// protocol has no other shape, and we index the peer's array by those entries.
inline std::optional<ConnData> decode_conn_data(const std::byte* p, size_t n) {
  if (!p || n < kConnDataLen) return std::nullopt;
  ConnData c;
  c.version = static_cast<uint8_t>(p[0]);
  c.flags = static_cast<uint8_t>(p[1]);
  c.credits = load_be16(p + 2);
  c.target_iomap_size = static_cast<uint8_t>(p[7]);
  c.target_sgl = {load_be64(p + 8), load_be32(p + 16), load_be32(p + 20)};
  c.data_buf = {load_be64(p + 24), load_be32(p + 32), load_be32(p + 36)};
  if (c.version != kVersion) return std::nullopt;
  if (c.flags & kFlagNet) return std::nullopt;  // a big-endian peer: SGL updates would need swaps
  if (c.target_sgl.length != kSglEntries || c.data_buf.length == 0 || c.credits == 0)
    return std::nullopt;
  return c;
}

inline Sge load_sge(const std::byte* p) {
  Sge s;
  std::memcpy(&s, p, sizeof s);
  return s;
}

// The receiver's account of what the peer may write into our receive buffer (rbuf): a ring of
// two halves, granted one half at a time (the connection data grants the first). The peer
// writes sequentially through granted space and announces each WRITE with a DATA word; we
// read sequentially from rbuf. A DATA word is accepted only if it stays inside granted,
// unfilled space and does not cross the ring's end, and only `max_msgs` may be queued: so a
// hostile peer can at worst corrupt its own stream's bytes, never make us read outside rbuf or
// queue without bound.
class RecvLedger {
 public:
  void reset(uint32_t rbuf_size, uint32_t max_msgs) {
    size_ = rbuf_size & ~1u;
    half_ = size_ / 2;
    max_msgs_ = max_msgs;
    fill_ = 0;
    granted_ = half_;  // the connection data's data_buf
    grant_off_ = half_;
    regrant_ = half_;  // the second half is free, not yet granted
    read_ = 0;
    queued_bytes_ = 0;
    queued_msgs_ = 0;
  }
  uint32_t size() const { return size_; }
  uint32_t half() const { return half_; }

  // A DATA word of `len` bytes arrived. False: a protocol violation (the caller fails the
  // connection).
  bool on_data(uint32_t len) {
    if (len == 0) return true;  // nothing was written; rdma-core never sends one
    if (queued_msgs_ >= max_msgs_) return false;
    if (len > granted_ || len > size_ - fill_) return false;
    granted_ -= len;
    fill_ = (fill_ + len) % size_;
    queued_bytes_ += len;
    ++queued_msgs_;
    return true;
  }
  // Where the next unread byte is, and how many follow contiguously in the current message
  // (the caller knows message boundaries; the ledger only bounds bytes).
  uint32_t read_offset() const { return read_; }
  uint32_t queued_bytes() const { return queued_bytes_; }
  uint32_t queued_msgs() const { return queued_msgs_; }
  // The application consumed `n` bytes (n <= queued_bytes()), finishing `msgs` messages.
  void consume(uint32_t n, uint32_t msgs) {
    read_ = (read_ + n) % size_;
    queued_bytes_ -= n;
    queued_msgs_ -= msgs;
    regrant_ += n;
  }
  // rs_give_credits case (a): a whole half is free again. Returns its offset and moves it
  // into granted space (the caller writes the SGL update).
  bool can_grant() const { return regrant_ >= half_ && half_ > 0; }
  uint32_t grant() {
    const uint32_t off = grant_off_;
    grant_off_ = (grant_off_ + half_) % size_;
    regrant_ -= half_;
    granted_ += half_;
    return off;
  }

 private:
  uint32_t size_ = 0, half_ = 0, max_msgs_ = 0;
  uint32_t fill_ = 0;          // where the peer's next WRITE lands
  uint32_t granted_ = 0;       // granted bytes not yet announced by a DATA word
  uint32_t grant_off_ = 0;     // offset of the next half to grant
  uint32_t regrant_ = 0;       // consumed bytes not yet granted again
  uint32_t read_ = 0;          // next byte the application reads
  uint32_t queued_bytes_ = 0;  // announced, not yet consumed
  uint32_t queued_msgs_ = 0;
};

}  // namespace sv::wire::rs
