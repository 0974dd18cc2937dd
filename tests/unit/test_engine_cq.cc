// The completion ring of engine/cq.h without verbs: cleaning one QP's completions (a QP moved
// to RESET) keeps everyone else's, in order, with their timestamps.
#include <gtest/gtest.h>

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
