// CRC-32C (Castagnoli), the MPA FPDU CRC of RFC 5044 §4 (same as iSCSI, RFC 3720 B.4).
// The running state starts at kCrc32cInit; the final value is ~state and goes on the wire
// least-significant byte first (store_le32), as Linux siw does.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sv::wire {

inline constexpr uint32_t kCrc32cInit = 0xFFFFFFFFu;

// Folds len bytes into the running state. Uses the SSE4.2 crc32 instruction when the CPU
// has it, else a slicing table.
uint32_t crc32c_update(uint32_t state, const void* data, size_t len) noexcept;
inline uint32_t crc32c_final(uint32_t state) noexcept {
  return ~state;
}
inline uint32_t crc32c(const void* data, size_t len) noexcept {
  return crc32c_final(crc32c_update(kCrc32cInit, data, len));
}
// Portable implementation, exposed so tests can compare it with the hardware path.
uint32_t crc32c_update_sw(uint32_t state, const void* data, size_t len) noexcept;
bool crc32c_hw_available() noexcept;

}  // namespace sv::wire
