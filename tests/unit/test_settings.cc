// The settings table and its strict parsers (util/settings.h): what each reader takes from
// the environment, so a value the device-open check warns about is never half-taken.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "util/settings.h"

namespace sv::settings {
namespace {

TEST(Settings, IntegersAreWholeDecimalNumbersInRange) {
  EXPECT_EQ(parse_uint("12", 1, 100), 12u);
  EXPECT_EQ(parse_uint("0", 0, 1), 0u);
  EXPECT_EQ(parse_uint("100", 1, 100), 100u);
  EXPECT_FALSE(parse_uint("12abc", 1, 100));  // strtol took this as 12
  EXPECT_FALSE(parse_uint("abc", 1, 100));
  EXPECT_FALSE(parse_uint("-5", 0, 100));
  EXPECT_FALSE(parse_uint("+5", 0, 100));
  EXPECT_FALSE(parse_uint(" 5", 0, 100));
  EXPECT_FALSE(parse_uint("0", 1, 100));
  EXPECT_FALSE(parse_uint("101", 1, 100));
  EXPECT_FALSE(parse_uint("", 0, 100));
  EXPECT_FALSE(parse_uint(nullptr, 0, 100));
  EXPECT_FALSE(parse_uint("99999999999999999999999", 0, UINT64_MAX));  // overflow
  EXPECT_EQ(parse_uint("18446744073709551615", 0, UINT64_MAX), UINT64_MAX);
}

TEST(Settings, FlagsAreZeroOrOne) {
  EXPECT_EQ(parse_flag("0"), false);
  EXPECT_EQ(parse_flag("1"), true);
  EXPECT_FALSE(parse_flag("yes"));
  EXPECT_FALSE(parse_flag("10"));
  EXPECT_FALSE(parse_flag(""));
}

TEST(Settings, RealsArePositiveNumbers) {
  EXPECT_EQ(parse_real("2.5"), 2.5);
  EXPECT_FALSE(parse_real("0"));
  EXPECT_FALSE(parse_real("-1"));
  EXPECT_FALSE(parse_real("3x"));
  EXPECT_FALSE(parse_real("nan"));
}

TEST(Settings, AReaderTakesTheDefaultForABadValue) {
  const Setting& s = SV_SETTING("SOFTVERBS_STATS_QPS");
  ::setenv(s.name, "12abc", 1);
  EXPECT_EQ(uint_value(s), 1024u);
  ::setenv(s.name, "7", 1);
  EXPECT_EQ(uint_value(s), 7u);
  ::unsetenv(s.name);
  EXPECT_EQ(uint_value(s), 1024u);
  const Setting& f = SV_SETTING("SOFTVERBS_RDS_FENCE");
  ::setenv(f.name, "off", 1);
  EXPECT_TRUE(flag_value(f));
  ::setenv(f.name, "0", 1);
  EXPECT_FALSE(flag_value(f));
  ::unsetenv(f.name);
}

TEST(Settings, TheTableIsWellFormed) {
  std::set<std::string> names;
  for (const auto& s : kAll) {
    EXPECT_EQ(std::string(s.name).rfind("SOFTVERBS_", 0), 0u) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << "twice: " << s.name;
    if (s.kind == Kind::uint || s.kind == Kind::flag) {
      EXPECT_LE(s.lo, s.dflt) << s.name;  // the default is itself a valid value
      EXPECT_LE(s.dflt, s.hi) << s.name;
    }
    if (s.kind == Kind::real) {
      EXPECT_GT(s.real_dflt, 0) << s.name;
    }
  }
  EXPECT_EQ(find("SOFTVERBS_NO_SUCH"), nullptr);
}

}  // namespace
}  // namespace sv::settings
