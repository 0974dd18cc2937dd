#include "engine/app_memory.h"

#include <cstring>

namespace sv::engine {

void copy_from_app(std::byte* dst, const std::byte* app, size_t n) noexcept {
  if (n) std::memcpy(dst, app, n);
}

void copy_to_app(std::byte* app, const std::byte* src, size_t n) noexcept {
  if (n) std::memcpy(app, src, n);
}

uint64_t app_atomic(uint64_t* v, const wire::AtomicRequest& r) noexcept {
  // Atomic with respect to every other QP of this process; remote peers reach this
  // memory only through us.
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
