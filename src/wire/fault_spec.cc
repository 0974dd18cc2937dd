#include "wire/fault_spec.h"

#include <arpa/inet.h>

#include <cstring>
#include <limits>

namespace sv::wire {

const char* fault_action_name(FaultAction a) {
  switch (a) {
    case FaultAction::reset:
      return "reset";
    case FaultAction::stall:
      return "stall";
    case FaultAction::corrupt:
      return "corrupt";
    case FaultAction::drop:
      return "drop";
    case FaultAction::dup:
      return "dup";
    case FaultAction::delay:
      return "delay";
  }
  return "?";
}

namespace {

bool parse_u64(std::string_view s, uint64_t& v) {
  if (s.empty() || s.size() > 20) return false;
  v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    const uint64_t d = static_cast<uint64_t>(ch - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  return true;
}

// A probability in [0, 1] as a decimal ("0.002", "1", ".5"), mapped exactly onto a 64-bit
// threshold: P * 2^64, with 1 meaning "always".
bool parse_p(std::string_view s, uint64_t& threshold, bool& always) {
  const size_t dot = s.find('.');
  std::string_view whole = s.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? std::string_view{} : s.substr(dot + 1);
  if (dot != std::string_view::npos && frac.empty()) return false;
  if (whole.empty() && frac.empty()) return false;
  if (frac.size() > 18) return false;
  uint64_t w = 0, f = 0;
  if (!whole.empty() && !parse_u64(whole, w)) return false;
  if (!frac.empty() && !parse_u64(frac, f)) return false;
  uint64_t scale = 1;
  for (size_t i = 0; i < frac.size(); ++i) scale *= 10;
  if (w > 1 || (w == 1 && f != 0)) return false;
  always = w == 1;
  threshold = always ? std::numeric_limits<uint64_t>::max()
                     : static_cast<uint64_t>((static_cast<unsigned __int128>(f) << 64) / scale);
  return true;
}

bool parse_action(std::string_view s, FaultAction& a) {
  for (size_t i = 0; i < kFaultActions; ++i) {
    const auto c = static_cast<FaultAction>(i);
    if (s == fault_action_name(c)) {
      a = c;
      return true;
    }
  }
  return false;
}

bool fail(FaultSpecError& err, std::string_view token, const char* why) {
  err.token.assign(token);
  err.why = why;
  return false;
}

bool parse_rule(std::string_view item, FaultRule& r, FaultSpecError& err) {
  const size_t colon = item.find(':');
  const std::string_view name = item.substr(0, colon);
  if (!parse_action(name, r.action))
    return fail(err, item, "unknown action (reset, stall, corrupt, drop, dup, delay or seed=N)");
  std::string_view rest =
      colon == std::string_view::npos ? std::string_view{} : item.substr(colon + 1);
  if (colon != std::string_view::npos && rest.empty())
    return fail(err, item, "':' with no KEY=VALUE");
  unsigned seen = 0;
  bool have_ms = false, have_dir = false;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view kv = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) return fail(err, item, "trailing ','");
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == kv.size())
      return fail(err, kv, "expected KEY=VALUE");
    const std::string_view key = kv.substr(0, eq), val = kv.substr(eq + 1);
    static constexpr std::string_view kKeys[] = {"p",  "every", "after", "count",
                                                 "ms", "peer",  "qpn",   "dir"};
    unsigned bit = 0;
    for (; bit < std::size(kKeys); ++bit)
      if (key == kKeys[bit]) break;
    if (bit == std::size(kKeys))
      return fail(err, kv, "unknown key (p, every, after, count, ms, peer, qpn, dir)");
    if (seen & (1u << bit)) return fail(err, kv, "key given twice");
    seen |= 1u << bit;
    uint64_t v = 0;
    switch (bit) {
      case 0: {
        bool always = false;
        if (!parse_p(val, r.p_threshold, always))
          return fail(err, kv, "p must be a decimal from 0 to 1");
        r.has_p = !always;
        break;
      }
      case 1:
      case 2:
      case 3:
        if (!parse_u64(val, v) || v == 0) return fail(err, kv, "must be a whole number >= 1");
        (bit == 1 ? r.every : bit == 2 ? r.after : r.count) = v;
        break;
      case 4:
        if (!parse_u64(val, v) || v == 0 || v > kMaxFaultMs)
          return fail(err, kv, "ms must be a whole number from 1 to 3600000");
        r.ms = static_cast<uint32_t>(v);
        have_ms = true;
        break;
      case 5: {
        const std::string ip(val);
        if (inet_pton(AF_INET, ip.c_str(), r.peer.data()) == 1) {
          r.peer_family = 4;
        } else if (inet_pton(AF_INET6, ip.c_str(), r.peer.data()) == 1) {
          r.peer_family = 6;
          // ::ffff:a.b.c.d is the IPv4 peer a dual-stack socket reports (engine/fault.cc
          // compares IPv4 peers as such).
          static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
          if (std::memcmp(r.peer.data(), kMapped, 12) == 0) {
            std::memmove(r.peer.data(), r.peer.data() + 12, 4);
            std::memset(r.peer.data() + 4, 0, 12);
            r.peer_family = 4;
          }
        } else {
          return fail(err, kv, "peer must be an IPv4 or IPv6 address");
        }
        r.has_peer = true;
        break;
      }
      case 6:
        if (!parse_u64(val, v) || v > 0xFFFFFF) return fail(err, kv, "qpn must be 0 to 16777215");
        r.qpn = static_cast<uint32_t>(v);
        r.has_qpn = true;
        break;
      case 7:
        if (val == "tx") {
          r.dir = FaultDir::tx;
        } else if (val == "rx") {
          r.dir = FaultDir::rx;
        } else {
          return fail(err, kv, "dir must be tx or rx");
        }
        have_dir = true;
        break;
    }
  }
  const bool timed = r.action == FaultAction::stall || r.action == FaultAction::delay;
  if (timed && !have_ms) return fail(err, item, "stall and delay need ms=N");
  if (!timed && have_ms) return fail(err, item, "ms=N applies to stall and delay only");
  // A datagram is received whole or not at all: duplicating or delaying one on its way in
  // is the sender's rule, not ours.
  if (have_dir && r.dir == FaultDir::rx &&
      (r.action == FaultAction::dup || r.action == FaultAction::delay))
    return fail(err, item, "dup and delay act on outgoing datagrams only (dir=tx)");
  return true;
}

}  // namespace

bool parse_fault_spec(std::string_view spec, FaultPlan& out, FaultSpecError& err) {
  out = FaultPlan{};
  if (spec.size() > kMaxFaultSpecLen)
    return fail(err, spec.substr(0, 32), "longer than 4096 bytes");
  bool have_seed = false;
  while (!spec.empty()) {
    const size_t semi = spec.find(';');
    const std::string_view item = spec.substr(0, semi);
    spec = semi == std::string_view::npos ? std::string_view{} : spec.substr(semi + 1);
    if (item.empty()) continue;  // "a;;b" and a trailing ';' are harmless
    if (item.substr(0, 5) == "seed=") {
      if (have_seed) return fail(err, item, "seed given twice");
      if (!parse_u64(item.substr(5), out.seed))
        return fail(err, item, "seed must be a whole number");
      have_seed = true;
      continue;
    }
    if (out.rules.size() == kMaxFaultRules) return fail(err, item, "more than 32 rules");
    FaultRule r;
    if (!parse_rule(item, r, err)) return false;
    out.rules.push_back(r);
  }
  return true;
}

}  // namespace sv::wire
