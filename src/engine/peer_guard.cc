#include "engine/peer_guard.h"

#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "engine/log.h"
#include "util/fork_local.h"
#include "util/settings.h"

namespace sv::engine::peer_guard {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxPeers = 4096;  // the table's bound: recovered peers are dropped first

struct Limits {
  double burst = settings::real_value(SV_SETTING("SOFTVERBS_PROT_ERR_BURST"));
  double per_sec = settings::real_value(SV_SETTING("SOFTVERBS_PROT_ERR_PER_SEC"));
};
const Limits& limits() {
  static const Limits l;
  return l;
}

struct Bucket {
  double tokens;
  Clock::time_point at;
};

struct Table {
  std::mutex mu;
  std::map<AddrKey, Bucket> peers;
};
ForkLocal<Table> g_table;

// Refills b up to now; true if it is full again (nothing remembered about this peer).
bool refill(Bucket& b, Clock::time_point now) {
  const double dt = std::chrono::duration<double>(now - b.at).count();
  b.tokens = std::min(limits().burst, b.tokens + dt * limits().per_sec);
  b.at = now;
  return b.tokens >= limits().burst;
}

}  // namespace

AddrKey addr_key(const transport::SockAddr& a) {
  AddrKey k{};
  if (a.family() == AF_INET) {
    k[10] = k[11] = 0xFF;
    std::memcpy(&k[12], &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4);
  } else if (a.family() == AF_INET6) {
    std::memcpy(k.data(), &reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr, 16);
  }
  return k;
}

void protection_error(const transport::SockAddr& peer) {
  auto& t = g_table.get();
  const auto now = Clock::now();
  std::lock_guard lk(t.mu);
  if (t.peers.size() >= kMaxPeers) {
    for (auto it = t.peers.begin(); it != t.peers.end();)
      it = refill(it->second, now) ? t.peers.erase(it) : std::next(it);
    if (t.peers.size() >= kMaxPeers) t.peers.erase(t.peers.begin());
  }
  auto [it, fresh] = t.peers.try_emplace(addr_key(peer), Bucket{limits().burst, now});
  if (!fresh) refill(it->second, now);
  it->second.tokens = std::max(0.0, it->second.tokens - 1);
  SV_WARN("protection error from %s: %.1f tries left", peer.str().c_str(), it->second.tokens);
}

bool admit(const transport::SockAddr& peer) {
  auto& t = g_table.get();
  std::lock_guard lk(t.mu);
  if (t.peers.empty()) return true;
  auto it = t.peers.find(addr_key(peer));
  if (it == t.peers.end()) return true;
  if (refill(it->second, Clock::now())) {
    t.peers.erase(it);
    return true;
  }
  return it->second.tokens >= 1;
}

}  // namespace sv::engine::peer_guard
