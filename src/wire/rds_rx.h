// The receive side of one RDS connection as pure state: header checks, reassembly of
// fragments into a message, and which sequences are new (net/rds ib_recv.c
// rds_ib_process_recv, recv.c rds_recv_incoming). No sockets, clocks or globals: rds/recv.cc
// applies the verdicts (counters, acks, delivery), fuzz/fuzz_rds drives it with arbitrary
// fragments.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/rds_hdr.h"

namespace sv::wire {

struct RdsRx {
  uint64_t next_seq = 1;  // next sequence never delivered (kept across reconnects)
  bool in_msg = false;    // a message is half received
  RdsHeader cur{};        // ... its first fragment's header
  std::vector<std::byte> data;
  size_t have = 0;
  void reset_message() {
    in_msg = false;
    data.clear();
    have = 0;
  }
};

// Limits a receiver imposes on what a peer claims.
struct RdsRxLimits {
  uint64_t next_tx_seq;  // an ack at or beyond this acks what we never sent
  uint32_t max_len;      // RDS_MAX_MSG_SIZE: h_len beyond it is never allocated
  uint64_t window;       // sequences this far ahead of next_seq are not believed
};

enum class RdsFrag : uint8_t {
  // The connection must drop: nothing was adopted from the fragment.
  short_frag,  // shorter than a header
  bad_csum,    // h_csum does not verify
  bad_ack,     // acks a sequence we never sent
  bad_len,     // h_len beyond the maximum message size
  bad_seq,     // sequence outside the receive window
  bad_frag,    // not the next fragment of the message in progress, too long, or empty
  // Accepted (apply h.ack first):
  cong_map,   // a congestion map update (payload = the map)
  ack_only,   // sequence 0: only an ack
  more,       // a fragment of a message with more to come
  message,    // the last fragment: data holds cur.len bytes of message cur; next_seq moved
  duplicate,  // a whole message already delivered (retransmitted): ack at once
};

inline bool rds_frag_fatal(RdsFrag v) {
  return v <= RdsFrag::bad_frag;
}

// One fragment (header + payload chunk) as received in one buffer. h is its decoded header
// from bad_ack on. Unknown extension types end the list, as net/rds parses them.
inline RdsFrag rds_rx_frag(RdsRx& rx, const std::byte* buf, size_t len, const RdsRxLimits& lim,
                           RdsHeader& h) {
  if (len < kRdsHeaderLen) return RdsFrag::short_frag;
  if (!rds_csum_ok(buf)) return RdsFrag::bad_csum;
  rds_decode(buf, h);
  if (h.ack >= lim.next_tx_seq) return RdsFrag::bad_ack;
  const size_t chunk = len - kRdsHeaderLen;
  if (h.flags == kRdsFlagCongBitmap) return RdsFrag::cong_map;  // equality, as cong.c
  if (h.sequence == 0) return RdsFrag::ack_only;
  if (h.len > lim.max_len) return RdsFrag::bad_len;
  if (h.sequence >= rx.next_seq && h.sequence - rx.next_seq >= lim.window) return RdsFrag::bad_seq;
  if (rx.in_msg && rx.cur.sequence != h.sequence) return RdsFrag::bad_frag;
  if (!rx.in_msg) {
    rx.in_msg = true;
    rx.cur = h;
    rx.data.assign(h.len, std::byte{0});
    rx.have = 0;
  }
  if (chunk > rx.cur.len - rx.have || (chunk == 0 && rx.cur.len != 0)) return RdsFrag::bad_frag;
  if (chunk) std::memcpy(rx.data.data() + rx.have, buf + kRdsHeaderLen, chunk);
  rx.have += chunk;
  if (rx.have < rx.cur.len) return RdsFrag::more;
  rx.in_msg = false;
  // Dedupe purely by sequence (rds-api.md §7.2): anything already seen is a duplicate,
  // whether or not the sender flagged it as retransmitted.
  if (rx.cur.sequence < rx.next_seq) return RdsFrag::duplicate;
  rx.next_seq = rx.cur.sequence + 1;
  return RdsFrag::message;
}

// A peer's congestion map update (RDS_CONG_MAP_BYTES, one bit per port, little-endian bit
// order, cong.c): adopts `map` into `have` and returns the ports that went from congested
// to free, folded into the 64-bit port-group mask of RDS_CONG_MONITOR_MASK. A map of any
// other length is ignored (nothing adopted, 0).
inline constexpr size_t kRdsCongMapBytes = 8192;
inline uint64_t rds_cong_update(std::vector<uint8_t>& have, const std::byte* map, size_t len) {
  if (len != kRdsCongMapBytes) return 0;
  if (have.size() != kRdsCongMapBytes) have.assign(kRdsCongMapBytes, 0);
  uint64_t freed_mask = 0;
  for (size_t i = 0; i < kRdsCongMapBytes; ++i) {
    const auto now = static_cast<uint8_t>(map[i]);
    const uint8_t freed = have[i] & static_cast<uint8_t>(~now);
    have[i] = now;
    if (!freed) continue;
    for (unsigned b = 0; b < 8; ++b)
      if (freed & (1u << b)) freed_mask |= 1ull << ((i * 8 + b) % 64);  // RDS_CONG_MONITOR_MASK
  }
  return freed_mask;
}

}  // namespace sv::wire
