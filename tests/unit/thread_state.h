// Test helper: wait until another thread of this process is asleep. A test that means "the
// waiter is blocked by now" after a fixed sleep fails on a loaded machine, where the waiter
// may not have got there yet; /proc says when it has (state S: sleeping, interruptibly).
#pragma once
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

namespace svtest {

inline pid_t this_tid() {
  return static_cast<pid_t>(syscall(SYS_gettid));
}

// Waits until thread `tid` of this process sleeps, at most `limit` (then returns anyway: the
// test's own check says what went wrong).
inline void thread_asleep(pid_t tid, std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/stat";
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return;
    char line[512] = {};
    const bool got = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    // "tid (comm) S ...": the state follows the last ')'.
    const char* close = got ? std::strrchr(line, ')') : nullptr;
    if (close && close[1] == ' ' && close[2] == 'S') return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Waits until thread `tid` sleeps inside one of the system calls `nrs` (/proc/self/task/TID/
// syscall: the number first, while it is in one), at most `limit`: not a brief sleep on a
// mutex on its way there, which a signal meant for the call would find instead.
inline void thread_asleep_in(pid_t tid, std::initializer_list<long> nrs,
                             std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  const std::string path = "/proc/self/task/" + std::to_string(tid) + "/syscall";
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    thread_asleep(tid, limit);
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return;
    long nr = -1;
    const bool got = std::fscanf(f, "%ld", &nr) == 1;
    std::fclose(f);
    for (long want : nrs)
      if (got && nr == want) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The same for a thread that publishes its tid in `tid` (0 until it does) as it starts.
inline void thread_asleep(const std::atomic<pid_t>& tid,
                          std::chrono::milliseconds limit = std::chrono::seconds(2)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (tid.load() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (tid.load() != 0) thread_asleep(tid.load(), limit);
}

}  // namespace svtest
