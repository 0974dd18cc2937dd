// Busy-poll ownership over the shared-memory transport (issue 29): a spinner tells the peer
// not to ring, and whoever stops spinning must still get what came meanwhile. Run by ctest as
// busy_poll_shm, with SOFTVERBS_SHM=1 and SOFTVERBS_BUSY_POLL_US=30000000 for the process.
#include <poll.h>

#include "harness.h"
#include "softverbs/verbs_ext.h"

namespace mp {
namespace {

class ShmBusyPoll : public XProc {
 protected:
  void SetUp() override { g_child_env = {"SOFTVERBS_SHM=1"}; }
  void TearDown() override {
    g_child_env.clear();
    XProc::TearDown();
  }
  void Exchange() {
    ASSERT_EQ(remote->post_recv(100, {sge(0, 64)}), 0);
    ASSERT_EQ(local->post_send(make_send(100, {sge(64, 8)})), 0);
    ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
    ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  }
};

// A spinner tells the peer not to ring: 480 Sends into a CQ this thread spins on cost the
// peer a handful of bells (those before the progress thread stepped back), not one each.
// (The step-back that finds the spinner inside its pass leaves the quieting to it,
// Qp::rx_quiet_due; this test's spinner is rarely caught there, so it does not tell.)
TEST_F(ShmBusyPoll, ASpinnerIsNotRungForEachMessage) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  // In rounds of 40, the peer's send queue emptied between them.
  auto rounds = [&](int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_NO_FATAL_FAILURE(spin_receive(*local, *remote, 40));
      ASSERT_EQ(remote->poll(CqSel::send, 40).size(), 40u);
    }
  };
  ASSERT_NO_FATAL_FAILURE(rounds(1));  // the step-back happens here
  const uint64_t before = qp_counter(remote->pid(), ri.qpn, sv::wire::Ctr::shm_bells);
  ASSERT_NE(before, ~0ull);
  ASSERT_NO_FATAL_FAILURE(rounds(12));
  const uint64_t bells = qp_counter(remote->pid(), ri.qpn, sv::wire::Ctr::shm_bells) - before;
  EXPECT_LE(bells, 10u) << "the peer rang for the spinner's messages";
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

// A thread that sleeps on the CQ's wait set (softverbs_cq_block, as the RDS shim's poll,
// which does not poll the CQ first) after spinning: bytes that came while the peer was told
// not to ring still wake it (cq_block_begin turns bells back on and kicks the wait set for
// what is already in the ring). A stale bell byte can wake it too: this checks that the
// sleeper is not left asleep, not which of the two woke it. Run with a 30 s hold (ctest
// busy_poll_shm), which keeps the receive path the spinner's all along: the progress thread
// never takes it back and reads the ring itself.
TEST_F(ShmBusyPoll, ASleeperOnTheWaitSetWakesForWhatCameWhileItSpun) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  const int wfd = softverbs_cq_wait_fd(local->rcq);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  ASSERT_NO_FATAL_FAILURE(spin_receive(*local, *remote, 10));
  ASSERT_EQ(local->post_recv(77, {sge(0, 64)}), 0);
  ASSERT_EQ(remote->post_send(make_send(77, {sge(0, 32)})), 0);
  std::this_thread::sleep_for(Ms(20));  // it is in the ring now, no bell rung
  ibv_wc wc{};
  bool got = false;
  for (auto end = Clock::now() + kWait; !got && Clock::now() < end;) {
    ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
    pollfd p{wfd, POLLIN, 0};
    const auto t0 = Clock::now();
    const int r = ::poll(&p, 1, 2000);
    ASSERT_EQ(softverbs_cq_block(local->rcq, 0), 0);
    ASSERT_EQ(r, 1) << "slept 2 s with the Send in the ring";
    RecordProperty(
        "woke_after_us",
        static_cast<int>(
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count()));
    got = ibv_poll_cq(local->rcq, 1, &wc) == 1;
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(wc.wr_id, 77u);
}

}  // namespace
}  // namespace mp
