// Progress timers (engine/progress.h): each runs once, not before its delay, in the order
// they are due whatever the order they were posted in.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

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

TEST(ProgressTimer, RunsOnceAndNotBeforeItsDelay) {
  std::atomic<bool> ran{false};
  std::atomic<int> runs{0};
  const auto posted = std::chrono::steady_clock::now();
  std::atomic<int64_t> after_us{0};
  Progress::get().post_after(20000us, [&] {
    after_us = std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::steady_clock::now() - posted)
                   .count();
    runs.fetch_add(1);
    ran = true;
  });
  ASSERT_TRUE(set_within(ran, 5000ms));
  EXPECT_GE(after_us.load(), 20000) << "ran before its delay";
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(runs.load(), 1);
}

TEST(ProgressTimer, RunInTheOrderTheyAreDue) {
  std::mutex mu;
  std::vector<int> order;
  std::atomic<bool> last{false};
  auto note = [&](int i) {
    std::lock_guard lk(mu);
    order.push_back(i);
  };
  Progress::get().post_after(60000us, [&] {
    note(3);
    last = true;
  });
  Progress::get().post_after(20000us, [&] { note(1); });
  Progress::get().post_after(40000us, [&] { note(2); });
  ASSERT_TRUE(set_within(last, 5000ms));
  std::lock_guard lk(mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

}  // namespace
