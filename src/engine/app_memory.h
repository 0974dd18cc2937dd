// Every access the engine makes to application memory, in one place. These are the
// software NIC's DMA: the application hands the memory over with post_send/post_recv or
// an MR and may not touch it until the completion (or until its peer says so out of
// band), an ordering no thread sanitizer can see. tests/tsan.supp names this file.
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "wire/ddp_rdmap.h"

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace sv::engine {

// The engine's copies to and from application memory are DMA: ThreadSanitizer looks away
// from them, as it never sees the kernel's (recvmsg and sendmsg placing payloads straight
// into application memory). The ordering that makes them safe runs through the network.
// Over TCP TSan happened to see it (it orders every send before every later recv on any
// socket of the process); over a shared-memory ring (qp_shm.cc) there is no system call,
// and TSan reported the application reading a buffer the engine had filled for an earlier
// message. Synchronisation (atomics, locks) inside a scope is still tracked.
struct DmaScope {
  // User-provided, so a scope is never an "unused variable" where TSan is not in use.
  DmaScope() {
#if defined(__SANITIZE_THREAD__)
    __tsan_ignore_thread_begin();
#endif
  }
  ~DmaScope() {
#if defined(__SANITIZE_THREAD__)
    __tsan_ignore_thread_end();
#endif
  }
  DmaScope(const DmaScope&) = delete;
  DmaScope& operator=(const DmaScope&) = delete;
};

void copy_from_app(std::byte* dst, const std::byte* app, size_t n) noexcept;
void copy_to_app(std::byte* app, const std::byte* src, size_t n) noexcept;
// Copies n bytes of src into a receive's gather list, starting `offset` bytes into it;
// stops at the list's end. Returns the bytes copied.
uint32_t copy_to_sgl(const ibv_sge* sge, uint32_t num_sge, uint32_t offset, const std::byte* src,
                     uint32_t n) noexcept;
// Executes an RFC 7306 atomic on an 8-byte aligned application word; returns the
// original value.
uint64_t app_atomic(uint64_t* word, const wire::AtomicRequest& r) noexcept;

}  // namespace sv::engine
