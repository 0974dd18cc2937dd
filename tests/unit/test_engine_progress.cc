// Progress timers (engine/progress.h): a timer with a `drop` check is dropped unrun when the
// check says it has nothing left to do, and runs when it has; timers without one always run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/progress.h"

namespace {

using namespace std::chrono_literals;
using sv::engine::Progress;

// Waits until `flag` is set or `within` passes.
bool set_within(const std::atomic<bool>& flag, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!flag.load() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  return flag.load();
}

TEST(ProgressTimer, RunsWithoutADropCheck) {
  std::atomic<bool> ran{false};
  Progress::get().post_after(1000us, [&ran] { ran = true; });
  EXPECT_TRUE(set_within(ran, 5000ms));
}

TEST(ProgressTimer, ADropCheckThatSaysNoLetsItRun) {
  std::atomic<bool> ran{false};
  std::atomic<int> asked{0};
  Progress::get().post_after(
      1000us, [&ran] { ran = true; },
      [&asked] {
        asked.fetch_add(1);
        return false;
      });
  EXPECT_TRUE(set_within(ran, 5000ms));
  EXPECT_GE(asked.load(), 1) << "the check was never asked";
}

TEST(ProgressTimer, ADropCheckThatSaysYesDropsItUnrun) {
  std::atomic<bool> ran{false}, dropped{false}, later{false};
  Progress::get().post_after(
      20000us, [&ran] { ran = true; },
      [&dropped] {
        dropped = true;
        return true;
      });
  // A later timer without a check: the loop passes the dropped one's time, and runs this.
  Progress::get().post_after(50000us, [&later] { later = true; });
  EXPECT_TRUE(set_within(later, 5000ms));
  EXPECT_TRUE(dropped.load());
  EXPECT_FALSE(ran.load()) << "a dropped timer ran";
}

}  // namespace
