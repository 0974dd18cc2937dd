// /proc facts about a process, shared by the statistics writer (engine/stats.cc), its
// reader (tools/softverbs-stat.cc), and the tests that measure memory.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// A "Key: N kB" line of /proc/self/<file> ("status": VmRSS; "smaps_rollup": Private_Dirty,
// ...), in KiB; 0 if absent. For the tests and benchmarks that report memory.
inline long proc_self_kib(const char* file, const char* key) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/%s", file);
  FILE* f = std::fopen(path, "re");
  if (!f) return 0;
  char line[256];
  long v = 0;
  const size_t klen = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, klen) == 0 && line[klen] == ':') {
      v = std::strtol(line + klen + 1, nullptr, 10);
      break;
    }
  std::fclose(f);
  return v;
}

}  // namespace sv
