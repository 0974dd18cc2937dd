// Every access the engine makes to application memory, in one place. These are the
// software NIC's DMA: the application hands the memory over with post_send/post_recv or
// an MR and may not touch it until the completion (or until its peer says so out of
// band), an ordering no thread sanitizer can see. tests/tsan.supp names this file.
#pragma once
#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "wire/ddp_rdmap.h"

namespace sv::engine {

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
