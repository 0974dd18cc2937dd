// Monotonic time in nanoseconds, and the microsecond tunables read from the environment once.
#pragma once
#include <time.h>

#include <cstdint>
#include <cstdlib>

namespace sv {

inline uint64_t mono_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

// The value of `name` in microseconds (default_us if unset or empty), as nanoseconds.
inline uint64_t env_us_as_ns(const char* name, uint64_t default_us) {
  const char* e = std::getenv(name);
  return (e && *e ? std::strtoull(e, nullptr, 10) : default_us) * 1000;
}

}  // namespace sv
