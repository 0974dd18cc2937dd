// libFuzzer target for the shared-memory ring consumer and producer (transport/shm_ring.h):
// a same-host peer can write any byte of the segment, control words included, at any time.
//
// Input: a script of operations, each a byte then its arguments: the peer writes a control
// word (tail, head, flags) or data bytes, or our side reads or writes through iovecs of the
// lengths given. The ring lives in a buffer with guard bytes on both sides.
//
// Beyond "no crash, no sanitizer report" it traps when:
//  - a read or write reports more bytes than its iovecs hold, or writes outside them;
//  - anything is written to the guard bytes around the ring's data;
//  - a read returns bytes while the published tail says fewer are there than it returned;
//  - our own head or tail moves other than by what a call returned.
#include <sys/uio.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "transport/shm_ring.h"

using sv::transport::ShmConsumer;
using sv::transport::ShmProducer;
using sv::transport::ShmRingCtrl;

namespace {
constexpr size_t kCap = 4096;
constexpr size_t kGuard = 64;
constexpr std::byte kGuardByte{0xA5};

struct Reader {
  const uint8_t* p;
  size_t n;
  bool more() const { return n > 0; }
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | u8();
    return v;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() << 8 | u8()); }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::vector<std::byte> mem(kCap + 2 * kGuard);
  std::memset(mem.data(), static_cast<int>(kGuardByte), mem.size());
  std::byte* ring = mem.data() + kGuard;
  std::memset(ring, 0, kCap);
  ShmRingCtrl rx_ctrl{}, tx_ctrl{};
  ShmConsumer rx(&rx_ctrl, ring, kCap);
  ShmProducer tx(&tx_ctrl, ring, kCap);
  std::vector<std::byte> out(3 * kCap + 2 * kGuard);
  Reader in{data, size};
  for (int step = 0; step < 256 && in.more(); ++step) {
    switch (in.u8() % 8) {
      case 0:
        rx_ctrl.tail = in.u64();
        break;
      case 1:
        tx_ctrl.head = in.u64();
        break;
      case 2: {  // peer writes data bytes into the ring
        const size_t at = in.u16() % kCap;
        const size_t len = in.u8();
        for (size_t i = 0; i < len && at + i < kCap; ++i) ring[at + i] = std::byte{in.u8()};
        break;
      }
      case 3: {  // we read through two iovecs with guards around them
        std::memset(out.data(), static_cast<int>(kGuardByte), out.size());
        const size_t a = in.u16() % (kCap + 1), b = in.u16() % (kCap + 1);
        iovec v[2] = {{out.data() + kGuard, a}, {out.data() + kGuard + a + kGuard, b}};
        const uint64_t head = rx.head();
        const uint64_t published = rx_ctrl.tail;
        const long n = rx.readv(v, 2);
        FUZZ_CHECK(n >= -1 && n <= static_cast<long>(a + b));
        if (n > 0) {
          FUZZ_CHECK(published - head >= static_cast<uint64_t>(n));
          FUZZ_CHECK(rx.head() == head + static_cast<uint64_t>(n));
          FUZZ_CHECK(rx_ctrl.head == rx.head());
        } else {
          FUZZ_CHECK(rx.head() == head);
        }
        for (size_t i = 0; i < kGuard; ++i) {
          FUZZ_CHECK(out[i] == kGuardByte);
          FUZZ_CHECK(out[kGuard + a + i] == kGuardByte);
        }
        for (size_t i = kGuard + a + kGuard + b; i < out.size(); ++i)
          FUZZ_CHECK(out[i] == kGuardByte);
        break;
      }
      case 4: {  // we write
        std::vector<std::byte> src(in.u16() % (2 * kCap), std::byte{0x11});
        iovec v{src.data(), src.size()};
        const uint64_t tail = tx.tail();
        const long n = tx.writev(&v, 1);
        FUZZ_CHECK(n >= -1 && n <= static_cast<long>(src.size()));
        FUZZ_CHECK(tx.tail() == tail + (n > 0 ? static_cast<uint64_t>(n) : 0));
        break;
      }
      case 5:
        (void)tx.bell_due();
        (void)rx.space_bell_due();
        break;
      case 6:
        rx_ctrl.want_space = in.u8();
        tx_ctrl.want_bell = in.u8();
        tx_ctrl.bell_pending = in.u8();
        break;
      case 7:
        (void)tx.wait_for_space();
        rx.bell_taken();
        break;
    }
  }
  for (size_t i = 0; i < kGuard; ++i) {
    FUZZ_CHECK(mem[i] == kGuardByte);
    FUZZ_CHECK(mem[kGuard + kCap + i] == kGuardByte);
  }
  return 0;
}
