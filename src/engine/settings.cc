#include "engine/settings.h"

#include <net/if.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "engine/log.h"
#include "util/settings.h"

extern char** environ;

namespace sv::engine {
namespace {

using settings::Kind;
using settings::Setting;

// Not through SV_LOG: a bad SOFTVERBS_LOG must still be reported, and the user who set a
// value wants to hear that it was not taken whatever the level.
void warn(const std::string& msg) {
  std::fprintf(stderr, "softverbs: warning: %s\n", msg.c_str());
}

// The interfaces of a SOFTVERBS_NETDEV list that exist; the others are warned about.
void check_netdevs(const char* value) {
  std::string found, missing;
  const std::string list = value;
  size_t at = 0;
  while (at <= list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    const std::string name = list.substr(at, comma - at);
    at = comma + 1;
    if (name.empty()) continue;
    std::string& to = if_nametoindex(name.c_str()) != 0 ? found : missing;
    to += (to.empty() ? "" : ",") + name;
  }
  if (missing.empty()) return;
  // engine/device.cc refresh_gids: no selected address means loopback alone.
  warn(std::string("SOFTVERBS_NETDEV=") + value + ": no interface named " + missing +
       " on this host; using " + (found.empty() ? "127.0.0.1 alone" : found));
}

void check_one(const Setting& s, const char* v) {
  const std::string named = std::string(s.name) + "=" + v;
  switch (s.kind) {
    case Kind::uint:
      if (!settings::parse_uint(v, s.lo, s.hi))
        warn(named + " is not an integer in " + std::to_string(s.lo) + ".." + std::to_string(s.hi) +
             "; using " + std::to_string(s.dflt));
      break;
    case Kind::flag:
      if (!settings::parse_flag(v)) warn(named + " is not 0 or 1; using " + std::to_string(s.dflt));
      break;
    case Kind::real:
      if (!settings::parse_real(v)) {
        char d[32];
        std::snprintf(d, sizeof d, "%g", s.real_dflt);
        warn(named + " is not a positive number; using " + d);
      }
      break;
    case Kind::log_level:
      if (!parse_log_level(v))
        warn(named + " is not none|error|warn|info|debug (or 0-4); using " +
             log_level_name(log_level()));
      break;
    case Kind::netdevs:
      check_netdevs(v);
      break;
    case Kind::text:
      break;
  }
}

void check_all() {
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "SOFTVERBS_", 10) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    const std::string name(*e, static_cast<size_t>(eq - *e));
    const char* value = eq + 1;
    const Setting* s = settings::find(name);
    if (!s) {
      warn(name + " is not a softverbs setting (docs/configuration.md); ignored");
      continue;
    }
    if (*value) check_one(*s, value);  // empty reads as unset, everywhere
  }
}

}  // namespace

void check_settings() {
  static std::once_flag once;
  std::call_once(once, check_all);
}

}  // namespace sv::engine
