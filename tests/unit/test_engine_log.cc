// SOFTVERBS_LOG parsing (engine/log.h): every level by name and number, SOFTVERBS_DEBUG's old
// meaning, and a value that names no level (warned about once, then the default, error).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "engine/log.h"
#include "engine/settings.h"

namespace {

using sv::LogLevel;

TEST(LogLevel, NamesAndNumbersParse) {
  EXPECT_EQ(sv::parse_log_level("none"), LogLevel::none);
  EXPECT_EQ(sv::parse_log_level("error"), LogLevel::error);
  EXPECT_EQ(sv::parse_log_level("warn"), LogLevel::warn);
  EXPECT_EQ(sv::parse_log_level("warning"), LogLevel::warn);
  EXPECT_EQ(sv::parse_log_level("info"), LogLevel::info);
  EXPECT_EQ(sv::parse_log_level("debug"), LogLevel::debug);
  for (int i = 0; i <= 4; ++i)
    EXPECT_EQ(sv::parse_log_level(std::to_string(i).c_str()), static_cast<LogLevel>(i));
}

TEST(LogLevel, NonsenseIsRefused) {
  for (const char* s : {"", "5", "10", "-1", "DEBUG ", "verbose"})
    EXPECT_EQ(sv::parse_log_level(s), std::nullopt) << s;
  EXPECT_EQ(sv::parse_log_level(nullptr), std::nullopt);
}

// The level is read once per process; CTest runs each case in a process of its own.
// The warning is the device-open check's (engine/settings.cc), whatever the level.
TEST(LogLevel, AnUnknownValueFallsBackToErrorWithAWarning) {
  setenv("SOFTVERBS_LOG", "chatty", 1);
  testing::internal::CaptureStderr();
  sv::engine::check_settings();
  EXPECT_EQ(sv::log_level(), LogLevel::error);
  SV_INFO("must not print");
  SV_ERR("printed %d", 42);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("SOFTVERBS_LOG=chatty is not"), std::string::npos) << err;
  EXPECT_EQ(err.find("must not print"), std::string::npos) << err;
  EXPECT_NE(err.find("softverbs: error: printed 42"), std::string::npos) << err;
}

TEST(LogLevel, DebugVariableStillMeansDebug) {
  unsetenv("SOFTVERBS_LOG");
  setenv("SOFTVERBS_DEBUG", "1", 1);
  EXPECT_EQ(sv::log_level(), LogLevel::debug);
  EXPECT_TRUE(sv::debug_enabled());
}

}  // namespace
