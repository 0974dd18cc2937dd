#include "engine/fault.h"

#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "engine/log.h"
#include "util/settings.h"

namespace sv::engine::fault {

namespace {

struct Plan {
  bool ok = true;
  wire::FaultPlan plan;
  // Firings so far, per rule: count=N caps the process, not each QP.
  std::unique_ptr<std::atomic<uint64_t>[]> fired;
  bool crc = false;
};

const Plan& plan() {
  static const Plan* p = [] {
    auto* pl = new Plan();
    const char* spec = settings::text_value(SV_SETTING("SOFTVERBS_FAULT"));
    if (!spec) return pl;
    wire::FaultSpecError err;
    if (!wire::parse_fault_spec(spec, pl->plan, err)) {
      // On stderr whatever SOFTVERBS_LOG says, as check_settings does: the device will not
      // open, and the user must learn why.
      std::fprintf(stderr, "softverbs: SOFTVERBS_FAULT: bad token '%s': %s\n", err.token.c_str(),
                   err.why.c_str());
      pl->ok = false;
      pl->plan.rules.clear();
      return pl;
    }
    pl->fired = std::make_unique<std::atomic<uint64_t>[]>(pl->plan.rules.size());
    for (const auto& r : pl->plan.rules) pl->crc |= r.action == FaultAction::corrupt;
    return pl;
  }();
  return *p;
}

// splitmix64 (Steele, Lea, Flood 2014): a tiny generator whose streams from different seeds
// do not overlap in practice; one per QP and rule.
uint64_t next(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool datagram_action(FaultAction a) {
  return a == FaultAction::drop || a == FaultAction::dup || a == FaultAction::delay;
}

void addr_of(const transport::SockAddr& a, uint8_t& family, uint8_t* addr) {
  family = 0;
  if (a.ss.ss_family == AF_INET) {
    family = 4;
    std::memcpy(addr, &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4);
  } else if (a.ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      family = 4;
      std::memcpy(addr, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      family = 6;
      std::memcpy(addr, in6->sin6_addr.s6_addr, 16);
    }
  }
}

std::atomic<uint64_t> g_ordinal{0};

}  // namespace

bool plan_ok() {
  return plan().ok;
}

bool active() {
  return !plan().plan.rules.empty();
}

bool wants_crc() {
  return plan().crc;
}

QpFaults::QpFaults(uint32_t qpn, uint64_t ordinal) : qpn_(qpn) {
  const auto& rules = plan().plan.rules;
  eligible_.assign(rules.size(), 0);
  rng_.resize(rules.size());
  for (size_t i = 0; i < rules.size(); ++i) {
    uint64_t s = plan().plan.seed ^ (ordinal * 0xD1B54A32D192ED03ull) ^ (i << 48);
    rng_[i] = next(s);
  }
}

void QpFaults::set_peer(const transport::SockAddr& peer) {
  addr_of(peer, family_, addr_);
}

bool QpFaults::on_frame(FaultDir dir, bool datagram, Fired& out, const transport::SockAddr* peer) {
  const uint64_t n = ++frames_[static_cast<size_t>(dir)];
  const Plan& pl = plan();
  const auto& rules = pl.plan.rules;
  uint8_t family = family_;
  uint8_t addr[16];
  if (peer)
    addr_of(*peer, family, addr);
  else
    std::memcpy(addr, addr_, sizeof addr);
  for (size_t i = 0; i < rules.size(); ++i) {
    const wire::FaultRule& r = rules[i];
    if (r.dir != dir || datagram_action(r.action) != datagram) continue;
    if (r.has_qpn && r.qpn != qpn_) continue;
    if (r.has_peer &&
        (r.peer_family != family || std::memcmp(r.peer.data(), addr, family == 4 ? 4 : 16) != 0))
      continue;
    if (n < r.after) continue;
    const uint64_t e = ++eligible_[i];
    if (r.every && e % r.every != 0) continue;
    const uint64_t draw = next(rng_[i]);
    if (r.has_p && draw >= r.p_threshold) continue;
    if (r.count) {
      uint64_t f = pl.fired[i].load(std::memory_order_relaxed);
      do {
        if (f >= r.count) break;
      } while (!pl.fired[i].compare_exchange_weak(f, f + 1, std::memory_order_relaxed));
      if (f >= r.count) continue;
    }
    out = Fired{r.action, r.ms, n, static_cast<uint32_t>(draw >> 59)};
    SV_WARN("fault: qp %u %s %s frame %llu (rule %zu)", qpn_, wire::fault_action_name(r.action),
            dir == FaultDir::tx ? "tx" : "rx", static_cast<unsigned long long>(n), i + 1);
    return true;
  }
  return false;
}

std::unique_ptr<QpFaults> attach(uint32_t qpn) {
  const uint64_t ordinal = g_ordinal.fetch_add(1, std::memory_order_relaxed);
  if (plan().plan.rules.empty()) return nullptr;
  return std::make_unique<QpFaults>(qpn, ordinal);
}

bool parse_inject(const char* what, FaultAction& action, uint32_t& ms) {
  if (!what) return false;
  const std::string_view w(what);
  if (w == "reset" || w == "corrupt") {
    action = w == "reset" ? FaultAction::reset : FaultAction::corrupt;
    ms = 0;
    return true;
  }
  wire::FaultPlan p;
  wire::FaultSpecError err;
  if (w.substr(0, 6) != "stall:" || !wire::parse_fault_spec(w, p, err) || p.rules.size() != 1)
    return false;
  const wire::FaultRule& r = p.rules[0];
  // Only ms: selectors choose frames, and an injection has no frames to choose from.
  if (r.has_p || r.every || r.after || r.count || r.has_peer || r.has_qpn || r.dir != FaultDir::tx)
    return false;
  action = FaultAction::stall;
  ms = r.ms;
  return true;
}

}  // namespace sv::engine::fault
