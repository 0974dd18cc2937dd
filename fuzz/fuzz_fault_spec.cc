// libFuzzer target for SOFTVERBS_FAULT's parser (src/wire/fault_spec.h): a spec comes from
// the environment of whoever starts the program, so it is input like any other.
//
// Traps if a parsed plan breaks the grammar's bounds (rule count, ms range, a timed action
// without ms, dup or delay on the receive side, a zero every/after/count), if parsing the
// same input twice gives a different plan, or if an error's token is not text of the input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "wire/fault_spec.h"

namespace w = sv::wire;

namespace {

bool same(const w::FaultPlan& a, const w::FaultPlan& b) {
  if (a.seed != b.seed || a.rules.size() != b.rules.size()) return false;
  for (size_t i = 0; i < a.rules.size(); ++i) {
    const auto &x = a.rules[i], &y = b.rules[i];
    if (x.action != y.action || x.dir != y.dir || x.ms != y.ms || x.has_p != y.has_p ||
        x.p_threshold != y.p_threshold || x.every != y.every || x.after != y.after ||
        x.count != y.count || x.has_peer != y.has_peer || x.peer != y.peer ||
        x.peer_family != y.peer_family || x.has_qpn != y.has_qpn || x.qpn != y.qpn)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  w::FaultPlan p, q;
  w::FaultSpecError e, f;
  const bool ok = w::parse_fault_spec(in, p, e);
  FUZZ_CHECK(ok == w::parse_fault_spec(in, q, f));
  if (!ok) {
    FUZZ_CHECK(!e.why.empty());
    FUZZ_CHECK(in.find(e.token) != std::string_view::npos);
    FUZZ_CHECK(e.token == f.token);
    return 0;
  }
  FUZZ_CHECK(same(p, q));
  FUZZ_CHECK(size <= w::kMaxFaultSpecLen);
  FUZZ_CHECK(p.rules.size() <= w::kMaxFaultRules);
  for (const auto& r : p.rules) {
    const bool timed = r.action == w::FaultAction::stall || r.action == w::FaultAction::delay;
    FUZZ_CHECK(timed == (r.ms != 0));
    FUZZ_CHECK(r.ms <= w::kMaxFaultMs);
    FUZZ_CHECK(!(r.dir == w::FaultDir::rx &&
                 (r.action == w::FaultAction::dup || r.action == w::FaultAction::delay)));
    FUZZ_CHECK(r.qpn <= 0xFFFFFF);
    FUZZ_CHECK(!r.has_peer || r.peer_family == 4 || r.peer_family == 6);
  }
  return 0;
}
