// CRC-32C as used for the MPA FPDU trailer (RFC 5044 §4), checked against the RFC 3720 B.4
// vectors, the common "123456789" check value and a real FPDU captured from Linux siw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "hex.h"
#include "wire/be.h"
#include "wire/crc32c.h"

namespace sv::wire {
namespace {

using test::Bytes;
using test::hex;

uint32_t crc_sw(const void* p, size_t n) {
  return crc32c_final(crc32c_update_sw(kCrc32cInit, p, n));
}

Bytes iota_bytes(size_t n, uint8_t start, int step) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = std::byte(static_cast<uint8_t>(start + step * int(i)));
  return b;
}

struct Vector {
  const char* name;
  Bytes data;
  uint32_t crc;
};

std::vector<Vector> rfc3720_b4_vectors() {
  return {
      {"32 bytes of zeros", Bytes(32, std::byte{0x00}), 0x8A9136AAu},
      {"32 bytes of 0xFF", Bytes(32, std::byte{0xFF}), 0x62A8AB43u},
      {"32 incrementing bytes 00..1f", iota_bytes(32, 0x00, +1), 0x46DD794Eu},
      {"32 decrementing bytes 1f..00", iota_bytes(32, 0x1F, -1), 0x113FDB5Cu},
  };
}

TEST(Crc32c, Rfc3720B4VectorsDispatchPath) {
  for (const auto& v : rfc3720_b4_vectors()) {
    EXPECT_EQ(crc32c(v.data.data(), v.data.size()), v.crc) << v.name;
  }
}

TEST(Crc32c, Rfc3720B4VectorsSoftwarePath) {
  for (const auto& v : rfc3720_b4_vectors()) {
    EXPECT_EQ(crc_sw(v.data.data(), v.data.size()), v.crc) << v.name;
  }
}

TEST(Crc32c, CheckValue123456789) {
  static constexpr char kCheck[] = "123456789";
  EXPECT_EQ(crc32c(kCheck, 9), 0xE3069283u);
  EXPECT_EQ(crc_sw(kCheck, 9), 0xE3069283u);
}

TEST(Crc32c, EmptyInputIsZero) {
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  EXPECT_EQ(crc_sw(nullptr, 0), 0u);
}

TEST(Crc32c, IncrementalUpdateEqualsOneShotAtEverySplit) {
  // "123456789" split at every point, both paths, and hw/sw mixed across the split.
  static constexpr char kCheck[] = "123456789";
  for (size_t k = 0; k <= 9; ++k) {
    uint32_t s = crc32c_update(kCrc32cInit, kCheck, k);
    EXPECT_EQ(crc32c_final(crc32c_update(s, kCheck + k, 9 - k)), 0xE3069283u) << "split " << k;
    s = crc32c_update_sw(kCrc32cInit, kCheck, k);
    EXPECT_EQ(crc32c_final(crc32c_update_sw(s, kCheck + k, 9 - k)), 0xE3069283u) << "split " << k;
    EXPECT_EQ(crc32c_final(crc32c_update(s, kCheck + k, 9 - k)), 0xE3069283u) << "split " << k;
  }
}

// RFC 5044 §4: a real FPDU from siw with CRC negotiated (iwarp-wire.md §1.2). The CRC covers
// ULPDU_Length, the ULPDU and the pad, and goes on the wire least-significant byte first.
TEST(Crc32c, Rfc5044Sec4RealSiwFpduCrc) {
  const Bytes fpdu =
      hex("00 22 41 43 00000000 00000000 00000001 00000000"
          "0000 5575 9b21 4370 7f92 7800 0000 0040");
  ASSERT_EQ(fpdu.size(), 36u);
  EXPECT_EQ(crc32c(fpdu.data(), fpdu.size()), 0x045278C2u);
  EXPECT_EQ(crc_sw(fpdu.data(), fpdu.size()), 0x045278C2u);

  std::byte trailer[4];
  store_le32(trailer, crc32c(fpdu.data(), fpdu.size()));
  EXPECT_EQ(test::to_hex(trailer), "c2 78 52 04");
  EXPECT_EQ(load_le32(trailer), 0x045278C2u);
}

TEST(Crc32c, HardwarePathMatchesSoftwareForEveryLength0To300) {
  if (!crc32c_hw_available()) GTEST_SKIP() << "no SSE4.2: dispatch path is the software path";
  std::mt19937_64 rng(0x5eed'c3c2u);
  // One extra 8 bytes so every length can also be tried at every 8-byte misalignment.
  std::vector<unsigned char> buf(300 + 8);
  for (size_t len = 0; len <= 300; ++len) {
    for (auto& c : buf) c = static_cast<unsigned char>(rng());
    for (size_t off = 0; off < 8; ++off) {
      const unsigned char* p = buf.data() + off;
      const uint32_t sw = crc32c_update_sw(kCrc32cInit, p, len);
      const uint32_t hw = crc32c_update(kCrc32cInit, p, len);
      ASSERT_EQ(hw, sw) << "len " << len << " offset " << off;
      // A non-trivial starting state too (the middle of a stream).
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(crc32c_update(seed, p, len), crc32c_update_sw(seed, p, len))
          << "len " << len << " offset " << off << " seed " << seed;
    }
  }
}

TEST(Crc32c, RandomSplitsIncrementalEqualsOneShot) {
  std::mt19937_64 rng(0xfeedbeefu);
  std::vector<unsigned char> buf(300);
  for (size_t len = 0; len <= 300; ++len) {
    for (auto& c : buf) c = static_cast<unsigned char>(rng());
    const uint32_t one_shot = crc_sw(buf.data(), len);
    if (crc32c_hw_available()) {
      ASSERT_EQ(crc32c(buf.data(), len), one_shot) << "len " << len;
    }
    for (int trial = 0; trial < 4; ++trial) {
      // Up to three split points, pieces alternate between the two implementations.
      size_t cuts[4] = {0, 0, 0, len};
      for (int i = 0; i < 3; ++i) cuts[i] = len ? rng() % (len + 1) : 0;
      std::sort(cuts, cuts + 4);
      uint32_t s_hw = kCrc32cInit, s_sw = kCrc32cInit, s_mix = kCrc32cInit;
      size_t pos = 0;
      for (int i = 0; i < 4; ++i) {
        const size_t n = cuts[i] - pos;
        s_hw = crc32c_update(s_hw, buf.data() + pos, n);
        s_sw = crc32c_update_sw(s_sw, buf.data() + pos, n);
        s_mix = (i & 1) ? crc32c_update_sw(s_mix, buf.data() + pos, n)
                        : crc32c_update(s_mix, buf.data() + pos, n);
        pos = cuts[i];
      }
      ASSERT_EQ(pos, len);
      ASSERT_EQ(crc32c_final(s_hw), one_shot) << "len " << len;
      ASSERT_EQ(crc32c_final(s_sw), one_shot) << "len " << len;
      ASSERT_EQ(crc32c_final(s_mix), one_shot) << "len " << len;
    }
  }
}

TEST(Crc32c, SingleBitFlipChangesCrc) {
  // Guards against an implementation that ignores part of its input (e.g. the tail bytes).
  std::vector<unsigned char> buf(37, 0x5A);
  const uint32_t base = crc32c(buf.data(), buf.size());
  for (size_t i = 0; i < buf.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= static_cast<unsigned char>(1u << bit);
      EXPECT_NE(crc32c(buf.data(), buf.size()), base) << "byte " << i << " bit " << bit;
      EXPECT_NE(crc_sw(buf.data(), buf.size()), base) << "byte " << i << " bit " << bit;
      buf[i] ^= static_cast<unsigned char>(1u << bit);
    }
  }
}

}  // namespace
}  // namespace sv::wire
