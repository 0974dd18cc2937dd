// Test helpers: bytes from hex text, and hex text from bytes for readable failure messages.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sv::test {

using Bytes = std::vector<std::byte>;

// "00 22 41 43 00000000" -> bytes. Whitespace anywhere is ignored; anything else that is not
// a hex digit, or an odd digit count, throws (a typo in a vector must not pass silently).
inline Bytes hex(std::string_view text) {
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  Bytes out;
  int hi = -1;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\t') continue;
    const int v = nibble(c);
    if (v < 0) throw std::invalid_argument("hex(): bad character in test vector");
    if (hi < 0) {
      hi = v;
    } else {
      out.push_back(static_cast<std::byte>((hi << 4) | v));
      hi = -1;
    }
  }
  if (hi >= 0) throw std::invalid_argument("hex(): odd number of digits in test vector");
  return out;
}

inline std::string to_hex(std::span<const std::byte> b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 3);
  for (size_t i = 0; i < b.size(); ++i) {
    if (i) s.push_back(' ');
    const auto v = static_cast<uint8_t>(b[i]);
    s.push_back(kDigits[v >> 4]);
    s.push_back(kDigits[v & 0xF]);
  }
  return s;
}

// Concatenation, for building vectors out of named pieces.
inline Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace sv::test
