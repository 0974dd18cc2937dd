// A thread cancelled in a blocking call (pthread_cancel: rping cancels its CQ thread in
// ibv_get_cq_event) is unwound by glibc through our frames. ASan unpoisons the stack for a
// C++ throw (__cxa_throw calls __asan_handle_no_return), not for a cancel's forced unwinding:
// the frames' poison outlives them, and the thread's exit trips on it (a false
// stack-buffer-underflow in sigaltstack). Wrap a cancellation point whose callers have
// instrumented frames in cancellation_point(), which does what the throw would.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SV_ASAN 1
#endif
#endif
#ifdef SV_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace sv::util {

template <class Fn>
auto cancellation_point(Fn fn) {
  try {
    return fn();
  } catch (...) {  // only a cancel (abi::__forced_unwind; not bound: UBSan sees no object)
#ifdef SV_ASAN
    __asan_handle_no_return();
#endif
    throw;  // a cancel must go on unwinding
  }
}

}  // namespace sv::util
