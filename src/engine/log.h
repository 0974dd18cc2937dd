// Diagnostics on stderr, by level, chosen with SOFTVERBS_LOG=none|error|warn|info|debug (or
// 0-4; default error). SOFTVERBS_DEBUG=1 still means debug. Never on a hot path unless the
// level is enabled: the check is one load of a cached int.
#pragma once
#include <cstdio>
#include <optional>

namespace sv {

enum class LogLevel : int { none = 0, error = 1, warn = 2, info = 3, debug = 4 };

// Parses a SOFTVERBS_LOG value; nullopt if it names no level.
std::optional<LogLevel> parse_log_level(const char* s);
// The process's level (from the environment, read once).
LogLevel log_level();
const char* log_level_name(LogLevel l);
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
