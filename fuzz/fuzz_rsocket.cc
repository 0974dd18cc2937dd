// libFuzzer target for what an rsocket peer controls (src/wire/rsocket_wire.h): its
// connection private data and the DATA words that announce bytes in our receive ring.
//
// Input: byte 0 bit 0 picks the parser.
//  0: private data. Traps if data decodes that is not 40+ bytes of version 1 with two SGL
//     entries, a grant and credits, or if it does not re-encode to the same 40 bytes.
//  1: a ring of 64..4159 bytes (bytes 1-2) and a queue bound (byte 3), then commands of 3
//     bytes: op (DATA word / application reads / grant) and a 16-bit argument. A shadow model
//     traps if the ledger accepts bytes that were never granted, a message that crosses the
//     ring's end or overlaps unread data, more queued messages than the bound, or reports a
//     read offset or queue beyond the ring.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fuzz_check.h"
#include "wire/rsocket_wire.h"

namespace rs = sv::wire::rs;

namespace {

void conn_data(const std::byte* d, size_t n) {
  auto c = rs::decode_conn_data(d, n);
  if (!c) return;
  FUZZ_CHECK(n >= rs::kConnDataLen && uint8_t(d[0]) == rs::kVersion);
  FUZZ_CHECK(c->target_sgl.length == rs::kSglEntries && c->data_buf.length && c->credits);
  std::byte out[rs::kConnDataLen];
  rs::encode_conn_data(*c, out);
  // Reserved bytes 4-6 are not kept; everything else is.
  FUZZ_CHECK(std::memcmp(out, d, 4) == 0 && std::memcmp(out + 7, d + 7, 33) == 0);
}

void ledger(const uint8_t* d, size_t n) {
  if (n < 3) return;
  const uint32_t size = 64 + (uint32_t(d[0]) | uint32_t(d[1]) << 8) % 4096;
  const uint32_t max_msgs = 1 + d[2] % 16;
  rs::RecvLedger l;
  l.reset(size, max_msgs);
  const uint32_t ring = size & ~1u, half = ring / 2;
  uint64_t granted = half, announced = 0, consumed = 0;
  uint32_t fill = 0;
  for (size_t i = 3; i + 3 <= n; i += 3) {
    const uint32_t arg = uint32_t(d[i + 1]) | uint32_t(d[i + 2]) << 8;
    switch (d[i] % 3) {
      case 0:
        if (l.on_data(arg) && arg) {
          FUZZ_CHECK(announced + arg <= granted);
          FUZZ_CHECK(fill + arg <= ring);
          FUZZ_CHECK(announced + arg - consumed <= ring);
          FUZZ_CHECK(l.queued_msgs() <= max_msgs);
          announced += arg;
          fill = (fill + arg) % ring;
        }
        break;
      case 1: {  // the application reads (within what is queued, as rrecv does)
        const uint32_t take = l.queued_bytes() ? arg % (l.queued_bytes() + 1) : 0;
        const uint32_t msgs = take == l.queued_bytes() ? l.queued_msgs() : 0;
        l.consume(take, msgs);
        consumed += take;
        break;
      }
      case 2:
        if (l.can_grant()) {
          const uint32_t off = l.grant();
          FUZZ_CHECK(off == 0 || off == half);
          granted += half;
          FUZZ_CHECK(granted - consumed <= ring);  // never grants unread space
        }
        break;
    }
    FUZZ_CHECK(l.read_offset() < ring && l.queued_bytes() <= ring);
    FUZZ_CHECK(l.queued_bytes() == announced - consumed);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1)
    ledger(data + 1, size - 1);
  else
    conn_data(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  return 0;
}
