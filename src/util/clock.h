// Monotonic time in nanoseconds, and the microsecond settings as nanoseconds.
#pragma once
#include <time.h>

#include <cstdint>

#include "util/settings.h"

namespace sv {

inline uint64_t mono_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

// The kernel's tick-granular monotonic time (1-4 ms steps, a third of mono_ns()'s cost): for
// intervals of milliseconds looked at on a busy poller's every pass.
inline uint64_t coarse_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

// A microsecond setting (util/settings.h), as nanoseconds.
inline uint64_t setting_us_as_ns(const settings::Setting& s) {
  return settings::uint_value(s) * 1000;
}

}  // namespace sv
