// Diagnostics on stderr, by level, chosen with SOFTVERBS_LOG=none|error|warn|info|debug (or
// 0-4; default error). SOFTVERBS_DEBUG=1 still means debug. Never on a hot path unless the
// level is enabled: the check is one load of a cached int.
//
// Header-only, so that libsvrds (RDS) logs the same way without the engine's symbols (it
// can run on rdma-core's libibverbs); each library caches the level once. A value that
// names no level is reported by the device-open check (engine/settings.cc), not here.
#pragma once
#include <cstdio>
#include <cstring>
#include <optional>

#include "util/settings.h"

namespace sv {

enum class LogLevel : int { none = 0, error = 1, warn = 2, info = 3, debug = 4 };

// Parses a SOFTVERBS_LOG value; nullopt if it names no level.
inline std::optional<LogLevel> parse_log_level(const char* s) {
  if (!s) return std::nullopt;
  static const char* const names[] = {"none", "error", "warn", "info", "debug"};
  for (int i = 0; i < 5; ++i)
    if (std::strcmp(s, names[i]) == 0 || (s[0] == '0' + i && s[1] == '\0'))
      return static_cast<LogLevel>(i);
  if (std::strcmp(s, "warning") == 0) return LogLevel::warn;
  return std::nullopt;
}

inline const char* log_level_name(LogLevel l) {
  switch (l) {
    case LogLevel::none:
      return "none";
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warning";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "?";
}

// The process's level (from the environment, read once). A SOFTVERBS_LOG that names no
// level is error, as unset.
inline LogLevel log_level() {
  static const LogLevel level = [] {
    if (const char* s = settings::text_value(SV_SETTING("SOFTVERBS_LOG")))
      return parse_log_level(s).value_or(LogLevel::error);
    return settings::flag_value(SV_SETTING("SOFTVERBS_DEBUG")) ? LogLevel::debug : LogLevel::error;
  }();
  return level;
}

inline bool debug_enabled() {
  return log_level() >= LogLevel::debug;
}

}  // namespace sv

#define SV_LOG(level, ...)                                                  \
  do {                                                                      \
    if (::sv::log_level() >= (level)) {                                     \
      std::fprintf(stderr, "softverbs: %s: ", ::sv::log_level_name(level)); \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fputc('\n', stderr);                                             \
    }                                                                       \
  } while (0)
#define SV_ERR(...) SV_LOG(::sv::LogLevel::error, __VA_ARGS__)
#define SV_WARN(...) SV_LOG(::sv::LogLevel::warn, __VA_ARGS__)
#define SV_INFO(...) SV_LOG(::sv::LogLevel::info, __VA_ARGS__)
#define SV_DBG(...) SV_LOG(::sv::LogLevel::debug, __VA_ARGS__)
