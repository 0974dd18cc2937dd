// Giving the pages of a buffer back to the system while keeping its mapping.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

namespace sv {

// MADV_DONTNEED on the pages wholly inside [from, to): a page shared with memory outside the
// range (a neighbouring buffer's) is kept. Private anonymous pages come back zero-filled when
// next touched. Returns the bytes advised away: 0 if no whole page is inside, or if the kernel
// refused (hugetlb or locked pages, EINVAL).
inline size_t give_back_pages(uintptr_t from, uintptr_t to) {
  static const auto kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (from + kPage - 1) & ~(kPage - 1), hi = to & ~(kPage - 1);
  if (hi <= lo || madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0) return 0;
  return hi - lo;
}

}  // namespace sv
