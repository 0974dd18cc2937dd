// The completion ring of engine/cq.h without verbs: cleaning one QP's completions (a QP moved
// to RESET) keeps everyone else's, in order, with their timestamps; a completion channel's
// event queue.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "engine/cq.h"

using namespace sv::engine;

namespace {

ibv_wc wc(uint32_t qpn, uint64_t id) {
  ibv_wc w{};
  w.qp_num = qpn;
  w.wr_id = id;
  return w;
}

}  // namespace

TEST(CqRing, CleanDropsOneQpsCompletionsAndKeepsTheRestInOrder) {
  Cq cq;
  cq.ring.allocate(8);
  cq.ts.resize(8);
  // Start mid-ring so the kept entries wrap around the end.
  cq.head = 5;
  for (uint64_t i = 0; i < 7; ++i) ASSERT_TRUE(cq.push(wc(i % 2 ? 7 : 9, i), false));
  for (uint32_t i = 0; i < 7; ++i) cq.ts[(5 + i) % 8] = 1000 + i;  // stamp each slot
  cq.clean(7);
  ASSERT_EQ(cq.count.load(), 4u);
  uint64_t want_ts[] = {1000, 1002, 1004, 1006};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cq.ts[(cq.head + i) % 8], want_ts[i]) << i;
  ibv_wc out[8];
  ASSERT_EQ(cq.poll(8, out), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i].qp_num, 9u);
    EXPECT_EQ(out[i].wr_id, static_cast<uint64_t>(2 * i));
  }
  cq.clean(9);  // empty: nothing to do
  EXPECT_EQ(cq.poll(8, out), 0);
}

// A QP on an SRQ keeps its receive completions through RESET: their buffers belong to the
// SRQ, and dropping the completion would lose the buffer (mlx5 hands it back to the SRQ,
// rxe keeps it). Its send completions go as for any QP.
TEST(CqRing, CleanKeepsReceivesWhenAskedAndDropsTheSends) {
  Cq cq;
  cq.ring.allocate(8);
  ibv_wc send = wc(7, 1), recv = wc(7, 2), flushed = wc(7, 3), other = wc(9, 4);
  recv.opcode = IBV_WC_RECV;
  flushed.opcode = IBV_WC_RECV;
  flushed.status = IBV_WC_WR_FLUSH_ERR;
  for (const auto& w : {send, recv, other, flushed}) ASSERT_TRUE(cq.push(w, false));
  cq.clean(7, true);
  ibv_wc out[8];
  ASSERT_EQ(cq.poll(8, out), 3);
  EXPECT_EQ(out[0].wr_id, 2u);
  EXPECT_EQ(out[1].wr_id, 4u);
  EXPECT_EQ(out[2].wr_id, 3u);
  EXPECT_EQ(out[2].status, IBV_WC_WR_FLUSH_ERR);
}

// A completion channel's records raised by its own sleeper for itself (channel_block's
// receive pass, EventQueue::push_for_self) have no count on the eventfd: a reader takes them
// without a read, the counter stays the number of the others (what poll on the descriptor
// sees), and take_if removes them without reading a count that is not there. The descriptor
// is non-blocking here, so a wrong count fails (EAGAIN) rather than hangs.
TEST(EventQueue, RecordsPushedForSelfCarryNoCountAndTheCounterStaysTheOthers) {
  EventQueue<int> q;
  ASSERT_GE(q.open(), 0);
  ASSERT_EQ(fcntl(q.fd(), F_SETFL, fcntl(q.fd(), F_GETFL) | O_NONBLOCK), 0);
  auto readable = [&] {
    pollfd p{q.fd(), POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  };
  EXPECT_FALSE(readable());
  q.push_for_self(1);
  EXPECT_TRUE(q.queued());
  EXPECT_FALSE(readable()) << "a record for its own pusher made the descriptor readable";
  q.push(2);
  EXPECT_TRUE(readable());
  int v = 0;
  ASSERT_EQ(q.pop(v), 0);  // in order; the one without a count is taken without a read
  EXPECT_EQ(v, 1);
  EXPECT_TRUE(readable()) << "the other record's count was read";
  ASSERT_EQ(q.pop(v), 0);
  EXPECT_EQ(v, 2);
  EXPECT_FALSE(readable());
  EXPECT_FALSE(q.queued());
  errno = 0;
  EXPECT_EQ(q.pop(v), -1);
  EXPECT_EQ(errno, EAGAIN);

  // take_if: a removed record without a count reads none.
  q.push_for_self(3);
  q.push(4);
  q.push_for_self(5);
  const auto taken = q.take_if([](int x) { return x != 4; });
  EXPECT_EQ(taken.size(), 2u);
  EXPECT_TRUE(readable()) << "4's count was read for a record that had none";
  ASSERT_EQ(q.pop(v), 0);
  EXPECT_EQ(v, 4);
  EXPECT_FALSE(readable());
  EXPECT_EQ(q.pop(v), -1);
  EXPECT_EQ(errno, EAGAIN);
  q.close_fd();
}

// take_if beside a reader blocked in pop (the CM and async queues: rdma_destroy_id or a
// QP's destroy while the application's event thread waits). A reader that has read a count
// but not yet taken its record must not leave take_if reading an empty counter while it
// holds the queue's lock, which the reader needs: that deadlocked. Swept over the window
// between the reader's wake-up and its lock; each round ends with the queue and the counter
// both empty, so every count is accounted for.
TEST(EventQueue, TakeIfBesideABlockedReaderNeitherBlocksNorLosesACount) {
  EventQueue<int> q;
  ASSERT_GE(q.open(), 0);
  for (int round = 0; round < 3000; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    std::atomic<int> got{0};
    std::atomic<bool> started{false};
    std::thread reader([&] {
      started = true;
      int v = 0;
      got = q.pop(v) == 0 ? v : -1;
    });
    while (!started.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(20));  // in its read, mostly
    q.push(1);
    // A spin of 0 to ~10 us: take_if lands before, during and after the reader's wake-up.
    std::atomic<int> spin{0};
    for (int i = 0, n = (round * 37) % 4000; i < n; ++i)
      spin.fetch_add(1, std::memory_order_relaxed);
    const auto taken = q.take_if([](int x) { return x == 1; });
    if (taken.empty()) {
      reader.join();
      EXPECT_EQ(got.load(), 1);
    } else {
      q.push(2);  // the reader read a count whose record went: it reads again, for this one
      reader.join();
      EXPECT_EQ(got.load(), 2);
    }
    EXPECT_FALSE(q.queued());
    pollfd p{q.fd(), POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 0), 0) << "a count is left on the descriptor with no record";
  }
  q.close_fd();
}
