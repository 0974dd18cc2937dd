// libFuzzer target: a softverbs statistics file as softverbs-stat reads it (written by
// another process; wire/stats_file.h). Checks that decoding never reads outside the input,
// allocates no more QP views than the input can hold, and reports only live slots.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "wire/stats_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > sv::wire::kStatsMaxFile) return 0;  // the reader refuses larger files unread
  sv::wire::StatsView v;
  auto in = std::span(reinterpret_cast<const std::byte*>(data), size);
  if (sv::wire::decode_stats(in, v) != sv::wire::StatsError::ok) {
    if (!v.qps.empty()) std::abort();  // a refused file yields nothing
    return 0;
  }
  if (v.qps.size() * sv::wire::kSlotCounters > size) std::abort();  // bounded by the input
  for (const auto& q : v.qps)
    if (q.qpn == 0) std::abort();  // free slots are not reported
  return 0;
}
