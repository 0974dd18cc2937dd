// Big-endian load/store over byte spans. Every iWARP header field is network order
// (RFC 5044 §4, RFC 5041 §5, RFC 5040 §4); the MPA CRC trailer is the one exception.
// Little-endian hosts only (x86-64, aarch64); std::byteswap is C++23, so the GCC/Clang builtins.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace sv::wire {

static_assert(std::endian::native == std::endian::little, "be.h assumes a little-endian host");

inline uint16_t load_be16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return __builtin_bswap16(v);
}
inline uint32_t load_be32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return __builtin_bswap32(v);
}
inline uint64_t load_be64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}
inline void store_be16(std::byte* p, uint16_t v) {
  v = __builtin_bswap16(v);
  std::memcpy(p, &v, 2);
}
inline void store_be32(std::byte* p, uint32_t v) {
  v = __builtin_bswap32(v);
  std::memcpy(p, &v, 4);
}
inline void store_be64(std::byte* p, uint64_t v) {
  v = __builtin_bswap64(v);
  std::memcpy(p, &v, 8);
}
inline uint32_t load_le32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store_le32(std::byte* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}

}  // namespace sv::wire
