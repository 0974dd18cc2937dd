// /proc facts about a process, shared by the statistics writer (engine/stats.cc) and its
// reader (tools/softverbs-stat.cc).
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace sv {

// Field 22 of /proc/<pid>/stat (starttime, clock ticks after boot): with the pid, it names
// one process even after the pid is reused. 0 if the process does not exist.
inline uint64_t proc_start_time(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // comm (field 2) may hold spaces and ')'
  if (!p) return 0;
  unsigned long long v = 0;
  // After ") ": state (field 3), fields 4..21 skipped, then starttime (22).
  if (std::sscanf(p + 1,
                  " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d "
                  "%llu",
                  &v) != 1)
    return 0;
  return v;
}

}  // namespace sv
