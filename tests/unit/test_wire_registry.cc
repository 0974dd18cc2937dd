// The registry hello (wire/rds_files.h): what a port's owner sends each querier with its live
// table. Another process, maybe another user's, writes it: every field is checked, and the
// table's words say "held" only for the hello's thread, alive, and its token.
#include <gtest/gtest.h>

#include <cstring>

#include "wire/rds_files.h"

using namespace sv::wire;

namespace {
RegistryHello decoded(const std::byte* b, size_t n, bool* ok) {
  RegistryHello h;
  *ok = registry_hello_decode(b, n, h);
  return h;
}
}  // namespace

TEST(RegistryHello, RoundTripsAndRefusesEveryBadField) {
  const RegistryHello h{kLiveSlots - 1, kFutexTidMask, ~0ull};
  std::byte b[kRegistryHelloLen + 1] = {};
  registry_hello_encode(h, b);
  bool ok = false;
  const RegistryHello d = decoded(b, kRegistryHelloLen, &ok);
  ASSERT_TRUE(ok);
  EXPECT_EQ(d.slot, h.slot);
  EXPECT_EQ(d.tid, h.tid);
  EXPECT_EQ(d.token, h.token);
  decoded(b, kRegistryHelloLen - 1, &ok);
  EXPECT_FALSE(ok) << "short";
  decoded(b, kRegistryHelloLen + 1, &ok);
  EXPECT_FALSE(ok) << "long";
  auto refused = [&](RegistryHello bad, size_t at = 0, uint8_t x = 0) {
    std::byte c[kRegistryHelloLen];
    registry_hello_encode(bad, c);
    c[at] ^= std::byte{x};
    bool k = true;
    decoded(c, sizeof c, &k);
    return !k;
  };
  EXPECT_TRUE(refused(h, 0, 1)) << "magic";
  EXPECT_TRUE(refused(h, 4, 1)) << "version";
  EXPECT_TRUE(refused(h, 6, 1)) << "reserved";
  EXPECT_TRUE(refused({kLiveSlots, 1, 1})) << "slot past the table";
  EXPECT_TRUE(refused({0, 0, 1})) << "no thread";
  EXPECT_TRUE(refused({0, kFutexTidMask + 1, 1})) << "a thread id the kernel never writes";
  EXPECT_TRUE(refused({0, 1, 0})) << "token 0 is a port let go";
  EXPECT_FALSE(refused({0, 1, 1}));
}

TEST(RegistryHello, OnlyTheLockersThreadAliveAndTheTokenSayHeld) {
  const RegistryHello h{5, 1234, 99};
  EXPECT_TRUE(registry_live(1234, 99, h));
  EXPECT_FALSE(registry_live(1234, 0, h)) << "the port was let go";
  EXPECT_FALSE(registry_live(1234, 100, h)) << "the slot is another port's now";
  EXPECT_FALSE(registry_live(1235, 99, h)) << "another thread holds the lock";
  EXPECT_FALSE(registry_live(0, 99, h)) << "nobody holds it";
  EXPECT_FALSE(registry_live(kFutexOwnerDied | 1234, 99, h)) << "the locker died";
  EXPECT_FALSE(registry_live(kFutexOwnerDied, 99, h)) << "as the kernel leaves it";
}
