// Minimal diagnostics: off unless SOFTVERBS_DEBUG is set. Never on a hot path unless enabled.
#pragma once
#include <cstdio>

namespace sv {
bool debug_enabled();
}
#define SV_DBG(...)                                    \
  do {                                                 \
    if (::sv::debug_enabled()) {                       \
      std::fprintf(stderr, "softverbs: " __VA_ARGS__); \
      std::fputc('\n', stderr);                        \
    }                                                  \
  } while (0)
