// The fuzz targets' property check: a violated property traps, which libFuzzer reports as a
// crash with the input that caused it.
#pragma once

#define FUZZ_CHECK(cond)           \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)
