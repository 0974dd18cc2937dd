#include "engine/app_memory.h"

#include <algorithm>
#include <cstring>

namespace sv::engine {

void copy_from_app(std::byte* dst, const std::byte* app, size_t n) noexcept {
  if (!n) return;
  DmaScope dma;
  std::memcpy(dst, app, n);
}

// The last byte is stored last, with release order. Applications poll the last byte of an RDMA
// WRITE's target to learn it has landed (perftest's write_lat, rdma-core's riostream), which
// is safe on a NIC because PCIe writes land in ascending order. glibc's memcpy may store the
// tail of a block before its head: such a poller saw the last byte, wrote its own next value
// there, and had it overwritten by the rest of the copy (riostream hung within 200 iterations).
void copy_to_app(std::byte* app, const std::byte* src, size_t n) noexcept {
  if (!n) return;
  DmaScope dma;
  std::memcpy(app, src, n - 1);
  __atomic_store_n(reinterpret_cast<unsigned char*>(app + n - 1),
                   static_cast<unsigned char>(src[n - 1]), __ATOMIC_RELEASE);
}

uint32_t copy_to_sgl(const ibv_sge* sge, uint32_t num_sge, uint32_t offset, const std::byte* src,
                     uint32_t n) noexcept {
  uint32_t copied = 0;
  for (uint32_t i = 0; i < num_sge && n; ++i) {
    const ibv_sge& s = sge[i];
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    const uint32_t take = std::min(n, s.length - offset);
    copy_to_app(reinterpret_cast<std::byte*>(s.addr) + offset, src, take);
    src += take;
    n -= take;
    copied += take;
    offset = 0;
  }
  return copied;
}

uint64_t app_atomic(uint64_t* v, const wire::AtomicRequest& r) noexcept {
  // Atomic with respect to every other QP of this process; remote peers reach this
  // memory only through us. DMA to TSan too: the application's own plain access to the word
  // is ordered by the network, as for the copies.
  DmaScope dma;
  switch (r.op) {
    case wire::AtomicOp::fetch_add:
      return __atomic_fetch_add(v, r.add_swap, __ATOMIC_SEQ_CST);
    case wire::AtomicOp::swap:
      return __atomic_exchange_n(v, r.add_swap, __ATOMIC_SEQ_CST);
    case wire::AtomicOp::compare_swap:
      break;
  }
  uint64_t orig = r.compare;
  __atomic_compare_exchange_n(v, &orig, r.add_swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return orig;
}

}  // namespace sv::engine
