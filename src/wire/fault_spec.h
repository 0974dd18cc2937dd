// SOFTVERBS_FAULT: the fault-injection rules a process runs under (engine/fault.h applies
// them). A pure parser, so it can be unit-tested and fuzzed.
//
//   spec  := item (';' item)*
//   item  := 'seed=' N | ACTION [':' KEY '=' VALUE (',' KEY '=' VALUE)*]
//   ACTION:= reset | stall | corrupt | drop | dup | delay
//   KEY   := p (0..1) | every | after | count | ms | peer (IPv4 or IPv6) | qpn | dir (tx|rx)
//
// reset, stall and corrupt act on connected (RC, UC) QPs' FPDUs; drop, dup and delay on UD
// datagrams. A frame is one FPDU or one datagram, numbered from 1 per QP and direction.
// `after=N`: frame N is the first eligible one. `every=N`: every Nth eligible frame.
// `p=P`: each eligible frame with probability P (from the seed: the same seed and the same
// traffic fire the same faults). `count=N`: at most N firings in the process. Anything the
// grammar does not allow is an error naming the offending token: a "faulty" test run
// without its faults is worse than no run.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sv::wire {

enum class FaultAction : uint8_t { reset, stall, corrupt, drop, dup, delay };
enum class FaultDir : uint8_t { tx, rx };

inline constexpr size_t kFaultActions = 6;
const char* fault_action_name(FaultAction a);

// Bounds: a spec is a handful of rules typed by a person; more is a mistake.
inline constexpr size_t kMaxFaultSpecLen = 4096;
inline constexpr size_t kMaxFaultRules = 32;
inline constexpr uint32_t kMaxFaultMs = 3600000;  // an hour

struct FaultRule {
  FaultAction action = FaultAction::reset;
  FaultDir dir = FaultDir::tx;
  uint32_t ms = 0;           // stall, delay: how long
  uint64_t p_threshold = 0;  // fires when a 64-bit draw is below it; 0 with has_p: never
  bool has_p = false;
  uint64_t every = 0;  // 0: every eligible frame
  uint64_t after = 0;  // 0: from the first frame
  uint64_t count = 0;  // 0: no cap
  bool has_peer = false;
  uint8_t peer_family = 0;         // 4 or 6
  std::array<uint8_t, 16> peer{};  // IPv4: the first 4 bytes
  bool has_qpn = false;
  uint32_t qpn = 0;
};

struct FaultPlan {
  uint64_t seed = 0;
  std::vector<FaultRule> rules;
};

struct FaultSpecError {
  std::string token;  // the offending item or KEY=VALUE
  std::string why;
};

// Parses `spec`. On error returns false and says why in `err`; `out` is then unspecified.
// An empty spec is a valid plan with no rules.
bool parse_fault_spec(std::string_view spec, FaultPlan& out, FaultSpecError& err);

}  // namespace sv::wire
