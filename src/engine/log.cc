#include "engine/log.h"

#include <cstdlib>
#include <cstring>

#include "util/settings.h"

namespace sv {

std::optional<LogLevel> parse_log_level(const char* s) {
  if (!s) return std::nullopt;
  static const char* const names[] = {"none", "error", "warn", "info", "debug"};
  for (int i = 0; i < 5; ++i)
    if (std::strcmp(s, names[i]) == 0 || (s[0] == '0' + i && s[1] == '\0'))
      return static_cast<LogLevel>(i);
  if (std::strcmp(s, "warning") == 0) return LogLevel::warn;
  return std::nullopt;
}

const char* log_level_name(LogLevel l) {
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

LogLevel log_level() {
  // A SOFTVERBS_LOG that names no level is error, as unset (engine/settings.cc says so).
  static const LogLevel level = [] {
    if (const char* s = settings::text_value(SV_SETTING("SOFTVERBS_LOG")))
      return parse_log_level(s).value_or(LogLevel::error);
    return settings::flag_value(SV_SETTING("SOFTVERBS_DEBUG")) ? LogLevel::debug : LogLevel::error;
  }();
  return level;
}

}  // namespace sv
