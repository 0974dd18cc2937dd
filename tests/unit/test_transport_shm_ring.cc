// The shared-memory byte ring (transport/shm_ring.h): bytes in order across the wrap, the
// full and empty edges, the doorbell protocol, and a peer that corrupts the control words.
#include "transport/shm_ring.h"

#include <gtest/gtest.h>

#include <numeric>
#include <thread>
#include <vector>

namespace sv::transport {
namespace {

struct Ring {
  explicit Ring(size_t cap) : data(cap), tx(&ctrl, data.data(), cap), rx(&ctrl, data.data(), cap) {}
  ShmRingCtrl ctrl{};
  std::vector<std::byte> data;
  ShmProducer tx;
  ShmConsumer rx;
};

std::vector<std::byte> pattern(size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xFF);
  return v;
}

long write(ShmProducer& p, const std::vector<std::byte>& b) {
  iovec v{const_cast<std::byte*>(b.data()), b.size()};
  return p.writev(&v, 1);
}

long read(ShmConsumer& c, std::vector<std::byte>& b) {
  iovec v{b.data(), b.size()};
  return c.readv(&v, 1);
}

TEST(ShmLayout, SegmentSizesArePageAlignedAndBounded) {
  EXPECT_EQ(ShmLayout::segment_bytes(0), 0u);
  EXPECT_EQ(ShmLayout::segment_bytes(4095), 0u);
  EXPECT_EQ(ShmLayout::segment_bytes(6000), 0u);  // not a power of two
  EXPECT_EQ(ShmLayout::segment_bytes(ShmLayout::kMaxRing * 2), 0u);
  const size_t rb = 64 * 1024;
  EXPECT_EQ(ShmLayout::segment_bytes(rb), 4096 + 2 * (4096 + rb));
  EXPECT_EQ(ShmLayout::ctrl_offset(0, rb) % 4096, 0u);
  EXPECT_EQ(ShmLayout::ctrl_offset(1, rb) % 4096, 0u);
  EXPECT_EQ(ShmLayout::data_offset(1, rb) + rb, ShmLayout::segment_bytes(rb));
}

TEST(ShmRing, BytesComeOutInOrderAcrossTheWrap) {
  Ring r(4096);
  std::vector<std::byte> all_in, all_out;
  unsigned seed = 0;
  for (int round = 0; round < 50; ++round) {
    const auto b = pattern(1000 + round * 7, seed++);
    ASSERT_EQ(write(r.tx, b), static_cast<long>(b.size()));
    all_in.insert(all_in.end(), b.begin(), b.end());
    // Read in odd pieces, through two iovecs, so reads straddle the wrap too.
    while (r.rx.available() > 0) {
      std::vector<std::byte> a(333), c(100);
      iovec v[2] = {{a.data(), a.size()}, {c.data(), c.size()}};
      const long n = r.rx.readv(v, 2);
      ASSERT_GT(n, 0);
      all_out.insert(all_out.end(), a.begin(), a.begin() + std::min<long>(n, 333));
      if (n > 333) all_out.insert(all_out.end(), c.begin(), c.begin() + (n - 333));
    }
  }
  EXPECT_EQ(all_in, all_out);
  EXPECT_EQ(r.tx.tail(), r.rx.head());
}

TEST(ShmRing, AFullRingTakesWhatFitsAndAnEmptyOneGivesNothing) {
  Ring r(4096);
  std::vector<std::byte> out(10);
  EXPECT_EQ(read(r.rx, out), 0);
  const auto b = pattern(5000, 1);
  EXPECT_EQ(write(r.tx, b), 4096);
  EXPECT_EQ(write(r.tx, b), 0);
  EXPECT_FALSE(r.tx.wait_for_space());  // still full: the consumer will ring
  std::vector<std::byte> got(100);
  EXPECT_EQ(read(r.rx, got), 100);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), b.begin()));
  EXPECT_TRUE(r.rx.space_bell_due());   // the producer asked
  EXPECT_FALSE(r.rx.space_bell_due());  // once
  EXPECT_EQ(write(r.tx, b), 100);
}

TEST(ShmRing, BellsAreCoalescedUntilTheConsumerTakesThem) {
  Ring r(4096);
  const auto b = pattern(10, 2);
  ASSERT_EQ(write(r.tx, b), 10);
  EXPECT_FALSE(r.tx.bell_due());  // the consumer did not ask
  r.rx.set_want_bell(true);
  ASSERT_EQ(write(r.tx, b), 10);
  EXPECT_TRUE(r.tx.bell_due());
  ASSERT_EQ(write(r.tx, b), 10);
  EXPECT_FALSE(r.tx.bell_due());  // one is on its way
  EXPECT_TRUE(r.rx.bell_pending());
  r.rx.bell_taken();
  ASSERT_EQ(write(r.tx, b), 10);
  EXPECT_TRUE(r.tx.bell_due());
}

TEST(ShmRing, ACorruptTailIsReportedNotFollowed) {
  Ring r(4096);
  r.ctrl.tail = 4097;  // more than a ring ahead of head 0
  std::vector<std::byte> out(64);
  EXPECT_EQ(r.rx.available(), -1);
  EXPECT_EQ(read(r.rx, out), -1);
  r.ctrl.tail = ~0ull;  // "behind" head
  EXPECT_EQ(read(r.rx, out), -1);
}

TEST(ShmRing, ACorruptHeadIsReportedNotFollowed) {
  Ring r(4096);
  const auto b = pattern(100, 3);
  ASSERT_EQ(write(r.tx, b), 100);
  r.ctrl.head = 300;  // ahead of what was ever written
  // The producer reads the head again only when the room it last saw runs out (its line is
  // the consumer's): what fits there is written, as it would have been before the corruption.
  EXPECT_EQ(write(r.tx, b), 100);
  EXPECT_EQ(write(r.tx, pattern(4096 - 200 + 1, 4)), -1);  // needs more: reads it, refuses
  r.ctrl.head = 0;
  EXPECT_EQ(write(r.tx, pattern(4096 - 200, 4)), 4096 - 200);  // exactly full, never past
  EXPECT_EQ(write(r.tx, b), 0);
}

TEST(ShmRing, TwoThreadsStreamAMegabyteIntact) {
  Ring r(4096);
  const auto src = pattern(1 << 20, 5);
  std::vector<std::byte> dst(src.size());
  std::thread prod([&] {
    size_t off = 0;
    while (off < src.size()) {
      iovec v{const_cast<std::byte*>(src.data()) + off, std::min<size_t>(777, src.size() - off)};
      const long n = r.tx.writev(&v, 1);
      ASSERT_GE(n, 0);
      off += static_cast<size_t>(n);
      if (n == 0) std::this_thread::yield();
    }
  });
  size_t off = 0;
  while (off < dst.size()) {
    iovec v{dst.data() + off, dst.size() - off};
    const long n = r.rx.readv(&v, 1);
    ASSERT_GE(n, 0);
    off += static_cast<size_t>(n);
    if (n == 0) std::this_thread::yield();
  }
  prod.join();
  EXPECT_EQ(src, dst);
}

}  // namespace
}  // namespace sv::transport
