// Busy-poll ownership (engine/busy_poll.h): while an application thread spins on a CQ, the
// device's progress thread leaves the QP's socket to it, and takes it back when the poller
// arms the CQ, says it stops (softverbs_cq_busy_poll(cq, 0)), or goes quiet for the hold
// time. The local process receives; the peer process sends.
//
// The binary runs twice (tests/CMakeLists.txt): BusyPoll.* with a 30 s hold (and ack hold), so that
// within a test's deadline only an arm or an explicit stop can hand the socket back, and
// BusyPollShortHold.* with a 1 s hold, for the timer that does it for a poller that left.
// Both run under RFC 5040's completion rule (SOFTVERBS_IB_COMPLETION=0): the peer's Sends
// complete on transmit, so a test can wait for them before the poller has received them.
// The Placement Ack cases ask for IB's rule in the peer's environment.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "softverbs/verbs_ext.h"

#include "../unit/thread_state.h"
#include "harness.h"

namespace mp {
namespace {

PeerConfig with_channel() {
  PeerConfig c;
  c.with_channel = true;
  return c;
}

// A completion handler (softverbs_cq_set_comp_handler) that counts its calls: it runs on the
// progress thread only when that thread received the message, so it tells us who did.
struct Calls {
  std::atomic<int> n{0};
  std::atomic<uint64_t> wr_id{~0ull};
};

bool counting_handler(ibv_cq* cq, void* arg) {
  auto* c = static_cast<Calls*>(arg);
  ibv_wc wc{};
  if (ibv_poll_cq(cq, 1, &wc) == 1) c->wr_id = wc.wr_id;
  ibv_req_notify_cq(cq, 0);
  c->n.fetch_add(1);
  return true;
}

// Takes cq's notifications with counting_handler from now on (it re-arms after each).
::testing::AssertionResult count_notifications(ibv_cq* cq, Calls& calls) {
  if (softverbs_cq_set_comp_handler(cq, counting_handler, &calls) != 0)
    return ::testing::AssertionFailure() << "softverbs_cq_set_comp_handler failed";
  if (ibv_req_notify_cq(cq, 0) != 0) return ::testing::AssertionFailure() << "arm failed";
  return ::testing::AssertionSuccess();
}

bool calls_reach(const Calls& c, int n, Ms within) {
  const auto until = Clock::now() + within;
  while (c.n.load() < n && Clock::now() < until) std::this_thread::sleep_for(Ms(1));
  return c.n.load() >= n;
}

bool readable_within(int fd, Ms within) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do r = ::poll(&p, 1, static_cast<int>(within.count()));
  while (r < 0 && errno == EINTR);
  return r == 1 && (p.revents & POLLIN);
}

// How long a negative check looks: the progress thread, had it not stepped back, would have
// run the handler within microseconds of the frame's arrival.
constexpr Ms kQuiet{300};

TEST_F(XProc, BusyPollOwnerReceivesAndTheProgressThreadStepsBackUntilItStops) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  Calls calls;
  ASSERT_TRUE(count_notifications(local->rcq, calls));

  // Nobody polls: the progress thread receives, and the handler runs.
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_TRUE(calls_reach(calls, 1, kWait)) << "the progress thread did not receive";
  EXPECT_EQ(calls.wr_id.load(), 1u);

  // A thread says it busy-polls: the message waits in the socket for it.
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  ASSERT_EQ(remote->poll(CqSel::send, 2).size(), 2u);
  EXPECT_FALSE(calls_reach(calls, 2, kQuiet)) << "the progress thread received for a poller";
  auto r = local->poll(CqSel::recv, 1);  // the poller's own ibv_poll_cq receives it
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 64u);
  EXPECT_EQ(calls.n.load(), 1) << "a completion the poller took raised a notification";

  // It stops: the progress thread receives again, at once (the hold is 30 s).
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(3, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(3, {sge(0, 64)})), 0);
  ASSERT_TRUE(calls_reach(calls, 2, kWait)) << "the socket was not handed back";
  EXPECT_EQ(calls.wr_id.load(), 3u);
  EXPECT_EQ(remote->poll(CqSel::send, 1).size(), 1u);
  ASSERT_EQ(softverbs_cq_set_comp_handler(local->rcq, nullptr, nullptr), 0);
}

TEST_F(XProc, BusyPollEndsWhenThePollerArmsItsCq) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  // Empty polls of an unarmed CQ, in a row: a spinning thread, it owns the receive path.
  // Said outright too: under TSan, polls can come more than kSpinGapNs apart and never make
  // a spin; then the progress thread takes the message before the arm, and an arm waits for
  // the next completion (as the kernel's), so no event would come for this one.
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  for (int i = 0; i < 16; ++i) {
    ibv_wc wc{};
    ASSERT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0);
  }
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_EQ(remote->poll(CqSel::send, 1).size(), 1u);
  std::this_thread::sleep_for(kQuiet);  // the progress thread sees the frame and steps back
  // Arming says "I will block": the progress thread must receive and raise the event now,
  // not when the 30 s hold runs out.
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_TRUE(readable_within(local->channel->fd, kWait)) << "armed, and no event came";
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(local->channel, &cq, &ctx), 0);
  ibv_ack_cq_events(cq, 1);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
}

TEST_F(XProc, BusyPollRejectsAnInvalidCq) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  int not_a_cq = 0;
  EXPECT_EQ(softverbs_cq_busy_poll(nullptr, 1), EINVAL);
  EXPECT_EQ(softverbs_cq_busy_poll(reinterpret_cast<ibv_cq*>(&not_a_cq), 0), EINVAL);
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

// The peer asks for IB's completion rule: its Sends and Writes complete on our Placement
// Acks, so when they complete says when our acks left.
class XProcIbPeer : public XProc {
 protected:
  void ConnectIbPeer() {
    g_child_env = {"SOFTVERBS_IB_COMPLETION=1"};
    Connect();
    g_child_env.clear();
  }
  // The peer Writes 64 bytes; we poll (1 ms apart: no spin) until our own poll placed them.
  void PlaceWriteBySlowPolls(uint64_t wr_id, uint32_t seed) {
    remote->fill(0, 0, 64, seed);
    ASSERT_EQ(
        remote->post_send(make_rdma(IBV_WR_RDMA_WRITE, wr_id, {sge(0, 64)}, li.addr, li.rkey)), 0);
    ibv_wc wc{};
    const auto until = Clock::now() + kWait;
    while (local->check(0, 0, 64, seed) != -1 && Clock::now() < until) {
      ASSERT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0);
      std::this_thread::sleep_for(Ms(1));
    }
    ASSERT_EQ(local->check(0, 0, 64, seed), -1) << "the Write was not placed";
    EXPECT_TRUE(remote->poll(CqSel::send, 1, kQuiet).empty())
        << "the ack left before the poller could answer";
  }
};

// A poller's pass that placed one RDMA Write: the Placement Ack the requester asked for
// (IB's completion rule) waits for the poller's answer to carry it, as a Send's does (an
// RDMA Write ping-pong, ib_write_lat or riostream, answers the Write it sees in memory).
// The poll that placed it, and one empty poll after it (an answer is often posted right
// after one, as rsockets' riowrite does), keep it; the next empty poll is a spin, not an
// answer, and sends it -- not the ack hold (SOFTVERBS_ACK_HOLD_US, 30 s in this run).
TEST_F(XProcIbPeer, BusyPollAWriteThePollerPlacedIsAckedOnceItSpins) {
  ASSERT_NO_FATAL_FAILURE(ConnectIbPeer());
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  remote->fill(0, 0, 4096, 71);
  ASSERT_EQ(remote->post_send(make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 4096)}, li.addr, li.rkey)),
            0);
  EXPECT_TRUE(remote->poll(CqSel::send, 1, kQuiet).empty())
      << "the Write completed before the poller placed it";
  EXPECT_NE(local->check(0, 0, 4096, 71), -1) << "placed by the progress thread";
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0);  // runs the receive pass that places it
  EXPECT_EQ(local->check(0, 0, 4096, 71), -1);
  EXPECT_TRUE(remote->poll(CqSel::send, 1, kQuiet).empty())
      << "the ack left before the poller could answer";
  // Empty polls back to back, microseconds apart: a spin (as many as it takes, since under a
  // sanitizer two polls in a row may be further apart than kSpinGapNs). This thread owns
  // the CQ, so the peer's completion is awaited on another.
  std::vector<ibv_wc> s;
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    s = remote->poll(CqSel::send, 1, Ms(5000));
    done = true;
  });
  while (!done.load()) EXPECT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0);
  waiter.join();
  ASSERT_EQ(s.size(), 1u) << "the Placement Ack waited for the hold";
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

// The poller's answer carries the held ack: the Write completes with the answer's arrival.
TEST_F(XProcIbPeer, BusyPollAHeldAckRidesWithTheAnswer) {
  ASSERT_NO_FATAL_FAILURE(ConnectIbPeer());
  ASSERT_EQ(remote->post_recv(1, {sge(8192, 64)}), 0);
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  ASSERT_NO_FATAL_FAILURE(PlaceWriteBySlowPolls(2, 75));
  ASSERT_EQ(local->post_send(make_send(3, {sge(0, 16)})), 0);  // the answer
  auto s = remote->poll(CqSel::send, 1, Ms(5000));
  ASSERT_EQ(s.size(), 1u) << "the answer did not carry the Placement Ack";
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

// A poller about to sleep on its CQ's wait set answers nothing: the held ack leaves.
TEST_F(XProcIbPeer, BusyPollAHeldAckLeavesWhenThePollerBlocks) {
  ASSERT_NO_FATAL_FAILURE(ConnectIbPeer());
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  ASSERT_NO_FATAL_FAILURE(PlaceWriteBySlowPolls(4, 77));
  ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  auto s = remote->poll(CqSel::send, 1, Ms(5000));
  EXPECT_EQ(softverbs_cq_block(local->rcq, 0), 0);
  ASSERT_EQ(s.size(), 1u) << "a blocking poller kept the Placement Ack";
  EXPECT_TRUE(wc_is(s[0], 4, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

// A poller that places a Write and then stops polling, without arming or saying so: its
// held ack leaves at the ack hold's end (200 ms in this run), not when the busy-poll hold
// (30 s) hands the socket back. The hold's timer is the poller's too: a hold without one
// waited for the recheck, up to 2 ms with the default hold, and 30 s here.
TEST_F(XProcIbPeer, BusyPollAHeldAckLeavesWhenThePollerStopsWithoutArming) {
  ASSERT_NO_FATAL_FAILURE(ConnectIbPeer());
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  remote->fill(0, 0, 64, 79);
  ASSERT_EQ(remote->post_send(make_rdma(IBV_WR_RDMA_WRITE, 5, {sge(0, 64)}, li.addr, li.rkey)), 0);
  // The progress thread sees the bytes while we own the CQ, and steps back.
  std::this_thread::sleep_for(kQuiet);
  EXPECT_NE(local->check(0, 0, 64, 79), -1) << "placed by the progress thread";
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0);  // our pass places it, and holds the ack
  ASSERT_EQ(local->check(0, 0, 64, 79), -1) << "the Write was not placed";
  auto s = remote->poll(CqSel::send, 1, Ms(5000));  // this thread polls its own CQ no more
  ASSERT_EQ(s.size(), 1u) << "the poller that stopped kept the Placement Ack";
  EXPECT_TRUE(wc_is(s[0], 5, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
}

// A ping-pong's answers carried its held acks (ib_send_lat's pattern), so its hold's timer
// is a wider net (qp.cc tx_ack_locked: 1 ms, or the hold if longer: 200 ms in the
// busy_poll_ack_without_timer run, 1 ms in busy_poll_ping_pong_ack's, where the timer also
// re-arms itself between turns); the turn that gets no answer, the poller having stopped
// without arming, is still acked by it, and the requester's Write completes. Over TCP and
// through shared memory alike: a ring's turns count too, and while this thread polls the
// net is as wide there (qp.cc wide_net_ok).
class XProcIbPeerPingPong : public XProcIbPeer, public testing::WithParamInterface<bool> {};

TEST_P(XProcIbPeerPingPong, BusyPollAPingPongsLastHeldAckLeavesWhenThePollerStopsWithoutArming) {
  // One side refusing keeps the QP on TCP. Only the child's setting: ours is read once per
  // process (shm_wanted), so a setenv here would hold for every test after this one.
  g_child_env = {"SOFTVERBS_IB_COMPLETION=1", GetParam() ? "SOFTVERBS_SHM=1" : "SOFTVERBS_SHM=0"};
  Connect();
  g_child_env.clear();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  constexpr uint64_t kTurns = 12;  // more than the streak that widens the net (8)
  for (uint64_t i = 0; i <= kTurns; ++i) {
    const uint32_t seed = 300 + static_cast<uint32_t>(i);
    remote->fill(0, 0, 64, seed);
    if (i < kTurns) {
      ASSERT_EQ(remote->post_recv(i, {sge(8192, 64)}), 0);
    }
    ASSERT_EQ(remote->post_send(make_rdma(IBV_WR_RDMA_WRITE, i, {sge(0, 64)}, li.addr, li.rkey)),
              0);
    ibv_wc wc{};
    const auto until = Clock::now() + kWait;
    while (local->check(0, 0, 64, seed) != -1 && Clock::now() < until)
      ASSERT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0);
    ASSERT_EQ(local->check(0, 0, 64, seed), -1) << "turn " << i << ": the Write was not placed";
    // The answer, but not to the last turn: this thread polls its CQ no more.
    if (i < kTurns) {
      ASSERT_EQ(local->post_send(make_send(100 + i, {sge(0, 16)})), 0);
    }
    auto s = remote->poll(CqSel::send, 1, Ms(5000));
    ASSERT_EQ(s.size(), 1u) << "turn " << i << ": the Write never completed";
    EXPECT_TRUE(wc_is(s[0], i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
    if (i < kTurns) {
      ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u) << "turn " << i;
    }
  }
  // Where the bytes went: the ring, when asked for; TCP, the child having refused it.
  if (GetParam())
    EXPECT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  else
    EXPECT_NE(transport_of(local->qp->qp_num), sv::wire::kTransportShm);
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, XProcIbPeerPingPong, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& p) {
                           return std::string(p.param ? "shm" : "tcp");
                         });

// RDS's fenced Write: a Write and a Send behind it, placed by one pass of the poller (a
// stream: nobody answers both), whose requester asked for the Placement Ack. It leaves at
// once, not after the hold (30 s in this run), whether or not the poller polls again.
TEST_F(XProcIbPeer, BusyPollAWriteAndSendThePollerPlacedAreAckedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(ConnectIbPeer());
  ASSERT_EQ(local->post_recv(1, {sge(4096, 64)}), 0);
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  remote->fill(0, 0, 4096, 73);
  SendSpec w = make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 4096)}, li.addr, li.rkey);
  w.flags = 0;  // unsignaled, as RDS posts it: the Send's completion reports both
  ASSERT_EQ(remote->post_send(w), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 16)})), 0);
  EXPECT_TRUE(remote->poll(CqSel::send, 1, kQuiet).empty())
      << "the Send completed before the poller placed it";
  auto r = local->poll(CqSel::recv, 1);  // the receive pass runs in this thread's polls
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(local->check(0, 0, 4096, 73), -1) << "the Write landed before the Send completed";
  auto s = remote->poll(CqSel::send, 1, Ms(5000));
  ASSERT_EQ(s.size(), 1u) << "the Placement Ack waited for the hold";
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

TEST_F(XProc, BusyPollShortHoldAPollerThatLeftHandsTheSocketBackAfterTheHold) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  Calls calls;
  ASSERT_TRUE(count_notifications(local->rcq, calls));
  // It says it polls, then never polls, arms or stops again.
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_TRUE(calls_reach(calls, 1, kWait)) << "the message stayed with a poller that left";
  EXPECT_EQ(calls.wr_id.load(), 1u);
  EXPECT_EQ(remote->poll(CqSel::send, 1).size(), 1u);
  ASSERT_EQ(softverbs_cq_set_comp_handler(local->rcq, nullptr, nullptr), 0);
}

// Blocking ownership (softverbs_cq_wait_fd, busy_poll.h): a thread about to block says so
// with softverbs_cq_block(cq, 1) and sleeps on the CQ's wait set; the message's bytes wake it,
// the progress thread stays out of it, and its own poll takes the message in.
TEST_F(XProc, WaitFdWakesTheBlockerWhoseOwnPollReceives) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  Calls calls;
  ASSERT_TRUE(count_notifications(local->rcq, calls));
  const int wfd = softverbs_cq_wait_fd(local->rcq);
  ASSERT_GE(wfd, 0) << strerror(errno);
  EXPECT_EQ(softverbs_cq_wait_fd(local->rcq), wfd) << "one wait set per CQ";
  // Bytes of the connection's set-up may still be on their way to the progress thread; once
  // they are in, nothing is left to wake a blocker.
  std::this_thread::sleep_for(Ms(50));
  EXPECT_FALSE(readable_within(wfd, Ms(0))) << "readable with nothing sent";

  ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_TRUE(readable_within(wfd, kWait)) << "the message did not wake the blocker";
  EXPECT_FALSE(calls_reach(calls, 1, kQuiet)) << "the progress thread received for a blocker";
  ASSERT_EQ(softverbs_cq_block(local->rcq, 0), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 64u);
  // Through shared memory the doorbell follows the bytes it announces (qp_shm.cc ring_bell:
  // bell_pending, then the send), and the poll may take the bytes before their bell lands.
  // The set is then readable once more, and the next poll, finding nothing, takes the bell:
  // one empty poll, never a set that stays readable (a sleeper would spin on it).
  if (readable_within(wfd, Ms(100))) {
    ibv_wc wc;
    EXPECT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 0) << "a completion beside the one sent";
  }
  EXPECT_FALSE(readable_within(wfd, Ms(0))) << "still readable once its poll took the bytes";
  EXPECT_EQ(calls.n.load(), 0) << "a completion the blocker took raised a notification";

  // It stops: the progress thread receives again, and the handler runs.
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  ASSERT_TRUE(calls_reach(calls, 1, kWait)) << "the socket was not handed back";
  EXPECT_EQ(calls.wr_id.load(), 2u);
  EXPECT_EQ(remote->poll(CqSel::send, 2).size(), 2u);
  ASSERT_EQ(softverbs_cq_set_comp_handler(local->rcq, nullptr, nullptr), 0);
}

// A socket whose bytes the receive path cannot take in (a Send with no receive posted: the
// QP waits for one) must leave the wait set, or its blocker would wake and spin; it comes
// back once a receive is posted.
TEST_F(XProc, WaitFdLeavesOutAQpWaitingForAReceive) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  const int wfd = softverbs_cq_wait_fd(local->rcq);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_TRUE(readable_within(wfd, kWait));
  ASSERT_EQ(softverbs_cq_block(local->rcq, 0), 0);
  EXPECT_TRUE(local->poll(CqSel::recv, 1, Ms(50)).empty()) << "received with no receive posted";
  const auto until = Clock::now() + kWait;
  bool readable = true;
  while (Clock::now() < until && (readable = readable_within(wfd, Ms(0))))
    std::this_thread::sleep_for(Ms(1));
  EXPECT_FALSE(readable) << "a QP that cannot receive stayed in the wait set";
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  EXPECT_TRUE(readable_within(wfd, kWait)) << "the QP did not come back to the wait set";
  ASSERT_EQ(softverbs_cq_block(local->rcq, 0), 0);
  r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(remote->poll(CqSel::send, 2).size(), 2u);
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);  // the 30 s hold would outlive the test
}

// The peer dies: its socket reads EOF for ever, so once the blocker's poll has seen the
// connection end, the socket must be out of the wait set (no wake-up storm).
TEST_F(XProc, WaitFdDropsAConnectionThatEnded) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  const int wfd = softverbs_cq_wait_fd(local->rcq);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  ASSERT_EQ(kill(remote->pid(), SIGKILL), 0);
  remote->mark_dead();
  // Whoever sees the end (the blocker's poll, or the progress thread, whose error handling
  // does not wait for an owner) closes the socket; the receive stays posted, as on an IB RC
  // QP with nothing outstanding (qp_conn_lost).
  const auto until = Clock::now() + kWait;
  bool readable = true;
  while (Clock::now() < until && (readable = readable_within(wfd, Ms(0)))) {
    ibv_wc wc{};
    ibv_poll_cq(local->rcq, 1, &wc);
    std::this_thread::sleep_for(Ms(1));
  }
  EXPECT_FALSE(readable) << "an ended connection stayed in the wait set";
  ASSERT_EQ(softverbs_cq_block(local->rcq, 0), 0);
}

TEST_F(XProc, WaitFdRejectsAnInvalidCqAndBusyPollAnInvalidMode) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  int not_a_cq = 0;
  errno = 0;
  EXPECT_EQ(softverbs_cq_wait_fd(nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(softverbs_cq_wait_fd(reinterpret_cast<ibv_cq*>(&not_a_cq)), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(softverbs_cq_block(nullptr, 1), EINVAL);
  EXPECT_EQ(softverbs_cq_block(reinterpret_cast<ibv_cq*>(&not_a_cq), 0), EINVAL);
  EXPECT_EQ(softverbs_cq_block(local->rcq, 2), EINVAL);
  EXPECT_EQ(softverbs_cq_block(local->rcq, -1), EINVAL);
  EXPECT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  EXPECT_EQ(softverbs_cq_block(local->rcq, 0), 0);
}

// With a 1 s hold: a blocker that sleeps longer than the hold keeps the receive path, and
// when it wakes and leaves, the progress thread takes the socket back, although nobody polls.
TEST_F(XProc, BusyPollShortHoldABlockerKeepsItsSocketsPastTheHoldAndGivesThemBackOnWaking) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  Calls calls;
  ASSERT_TRUE(count_notifications(local->rcq, calls));
  const int wfd = softverbs_cq_wait_fd(local->rcq);
  ASSERT_GE(wfd, 0);
  ASSERT_EQ(softverbs_cq_block(local->rcq, 1), 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_TRUE(readable_within(wfd, kWait));
  std::this_thread::sleep_for(Ms(1500));  // past the hold and a recheck: still its
  EXPECT_EQ(calls.n.load(), 0) << "the progress thread received for a blocker";
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  EXPECT_FALSE(calls_reach(calls, 1, kQuiet)) << "the progress thread received for a blocker";
  // It wakes and goes away without polling: the socket goes back as a spinner's does, within
  // the hold and the rechecks' back-off (up to 4 holds), although nobody polls.
  ASSERT_EQ(softverbs_cq_block(local->rcq, 0), 0);
  ASSERT_TRUE(calls_reach(calls, 1, Ms(7000))) << "the socket stayed with a blocker that left";
  EXPECT_EQ(calls.wr_id.load(), 1u);
  std::vector<ibv_wc> more;
  if (calls.n.load() < 2) more = local->poll(CqSel::recv, 1);  // the handler polls one a call
  EXPECT_TRUE(calls.n.load() >= 2 || more.size() == 1u) << "the second message was lost";
  EXPECT_EQ(remote->poll(CqSel::send, 2).size(), 2u);
  ASSERT_EQ(softverbs_cq_set_comp_handler(local->rcq, nullptr, nullptr), 0);
}

// ibv_get_cq_event on ch (acked): 1 if the event is want's, -1 otherwise or on failure.
int channel_event(ibv_comp_channel* ch, ibv_cq* want) {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  const int r = ibv_get_cq_event(ch, &cq, &ctx);
  if (r == 0) ibv_ack_cq_events(cq, 1);
  return r == 0 && cq == want ? 1 : -1;
}

// ibv_get_cq_event with nothing queued, on a blocking channel: it sleeps on the channel and
// on its CQs' wait sets, so the peer's bytes wake it and it receives itself (busy_poll.h
// channel_block; issue 31: one wake-up per message for event-driven programs). With the 30 s
// hold, what the progress thread stepped back from stays the waiter's: a message that comes
// after the waiter left raises no event until a thread waits again, and then only that
// thread's own receive can raise it.
TEST_F(XProc, BusyPollAThreadInGetCqEventReceivesItself) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  std::atomic<int> got{0};
  std::atomic<pid_t> waiter_tid{0};
  std::thread waiter([&] {
    waiter_tid = svtest::this_tid();
    got = channel_event(local->channel, local->rcq);
  });
  svtest::thread_asleep(waiter_tid);  // asleep in ibv_get_cq_event
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  const auto until = Clock::now() + kWait;
  while (!got.load() && Clock::now() < until) std::this_thread::sleep_for(Ms(1));
  if (!got.load()) {
    ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);  // unblock it
  }
  waiter.join();
  ASSERT_EQ(got.load(), 1) << "no event for the first message";
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));

  // The waiter left, and another thread arms: the socket stays the waiter's (30 s hold).
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  ASSERT_EQ(remote->poll(CqSel::send, 2).size(), 2u);
  EXPECT_FALSE(readable_within(local->channel->fd, kQuiet))
      << "the progress thread received for a thread that waited in ibv_get_cq_event";
  // A thread waits again: only its own receive pass can take the message in and raise it.
  got = 0;
  std::thread again([&] { got = channel_event(local->channel, local->rcq); });
  const auto until2 = Clock::now() + kWait;
  while (!got.load() && Clock::now() < until2) std::this_thread::sleep_for(Ms(1));
  if (!got.load()) {
    ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);  // hand back, so it can end
    ASSERT_EQ(local->post_recv(3, {sge(0, 4096)}), 0);
    ASSERT_EQ(remote->post_send(make_send(3, {sge(0, 64)})), 0);
  }
  again.join();
  ASSERT_EQ(got.load(), 1) << "the waiter did not receive the message itself";
  r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

// A CQ of the channel destroyed while a thread sleeps in ibv_get_cq_event holding it: the
// destroy wakes the sleeper, which lets go of it and sleeps on; a thread cancelled in its
// sleep (rping cancels its CQ thread) lets go too; a channel destroyed under a waiter; a
// signal ends the wait only if its handler lacks SA_RESTART; a non-blocking channel still says
// EAGAIN.
TEST_F(XProc, BusyPollGetCqEventLetsGoOfADestroyedCqAndOfACancelledSleep) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ibv_cq* extra = ibv_create_cq(local->ctx, 4, nullptr, local->channel, 0);
  ASSERT_NE(extra, nullptr);
  std::atomic<int> got{0};
  std::thread waiter([&] { got = channel_event(local->channel, local->rcq); });
  std::this_thread::sleep_for(Ms(50));
  EXPECT_EQ(ibv_destroy_cq(extra), 0);
  std::this_thread::sleep_for(Ms(50));
  EXPECT_EQ(got.load(), 0) << "the sleep ended with the other CQ's destruction";
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 64)})), 0);
  waiter.join();
  EXPECT_EQ(got.load(), 1);
  EXPECT_EQ(local->poll(CqSel::recv, 1).size(), 1u);

  ibv_cq* extra2 = ibv_create_cq(local->ctx, 4, nullptr, local->channel, 0);
  ASSERT_NE(extra2, nullptr);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  std::atomic<bool> entered{false};
  pthread_t t;
  struct Arg {
    ibv_comp_channel* ch;
    std::atomic<bool>* entered;
  } arg{local->channel, &entered};
  ASSERT_EQ(pthread_create(
                &t, nullptr,
                [](void* p) -> void* {
                  auto* a = static_cast<Arg*>(p);
                  a->entered->store(true);
                  ibv_cq* cq = nullptr;
                  void* ctx = nullptr;
                  ibv_get_cq_event(a->ch, &cq, &ctx);
                  return nullptr;
                },
                &arg),
            0);
  while (!entered.load()) std::this_thread::sleep_for(Ms(1));
  std::this_thread::sleep_for(Ms(50));
  ASSERT_EQ(pthread_cancel(t), 0);
  void* ret = nullptr;
  ASSERT_EQ(pthread_join(t, &ret), 0);
  EXPECT_EQ(ret, PTHREAD_CANCELED);
  EXPECT_EQ(ibv_destroy_cq(extra2), 0) << "a cancelled sleep kept its hold on the CQ";

  // A channel destroyed right after its last CQ, while a thread waits on it: the thread,
  // woken by the CQ's destruction, reads nothing freed (ASan); it then fails its read on the
  // closed channel, or stays in it as in the kernel's file, whence a cancel takes it.
  {
    ibv_comp_channel* ch2 = ibv_create_comp_channel(local->ctx);
    ASSERT_NE(ch2, nullptr);
    ibv_cq* lone = ibv_create_cq(local->ctx, 4, nullptr, ch2, 0);
    ASSERT_NE(lone, nullptr);
    std::atomic<bool> done{false};
    struct Arg2 {
      ibv_comp_channel* ch;
      std::atomic<bool>* done;
    } arg2{ch2, &done};
    pthread_t t2;
    ASSERT_EQ(pthread_create(
                  &t2, nullptr,
                  [](void* p) -> void* {
                    auto* a = static_cast<Arg2*>(p);
                    ibv_cq* cq = nullptr;
                    void* ctx = nullptr;
                    ibv_get_cq_event(a->ch, &cq, &ctx);
                    a->done->store(true);
                    return nullptr;
                  },
                  &arg2),
              0);
    std::this_thread::sleep_for(Ms(50));
    EXPECT_EQ(ibv_destroy_cq(lone), 0);
    EXPECT_EQ(ibv_destroy_comp_channel(ch2), 0);
    std::this_thread::sleep_for(Ms(100));
    if (!done.load()) pthread_cancel(t2);
    ASSERT_EQ(pthread_join(t2, nullptr), 0);
  }

  // A signal whose handler says SA_RESTART does not end the wait (poll() is never restarted,
  // the read it fell back to is): the event still comes.
  struct sigaction sa {
  }, old_sa{};
  sa.sa_handler = [](int) {};
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &sa, &old_sa), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  got = 0;
  std::thread sig_waiter([&] { got = channel_event(local->channel, local->rcq); });
  std::this_thread::sleep_for(Ms(50));
  ASSERT_EQ(pthread_kill(sig_waiter.native_handle(), SIGUSR2), 0);
  std::this_thread::sleep_for(Ms(50));
  EXPECT_EQ(got.load(), 0) << "a restartable signal ended ibv_get_cq_event";
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  sig_waiter.join();
  EXPECT_EQ(got.load(), 1);
  EXPECT_EQ(local->poll(CqSel::recv, 1).size(), 1u);
  // Without SA_RESTART the wait fails with EINTR, as a read of the kernel's event file does.
  sa.sa_flags = 0;
  ASSERT_EQ(sigaction(SIGUSR2, &sa, nullptr), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  std::atomic<int> intr_errno{0};
  std::atomic<pid_t> intr_tid{0};
  got = 0;
  std::thread intr_waiter([&] {
    intr_tid = svtest::this_tid();
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    const int r = ibv_get_cq_event(local->channel, &cq, &ctx);
    intr_errno = errno;
    got = r == 0 ? 1 : -1;
  });
  // In the wait's poll itself: a signal before it, or during a brief sleep on a lock on the
  // way, would find no wait to interrupt.
  while (intr_tid.load() == 0) std::this_thread::sleep_for(Ms(1));
  svtest::thread_asleep_in(intr_tid.load(), {SYS_poll, SYS_ppoll});
  ASSERT_EQ(pthread_kill(intr_waiter.native_handle(), SIGUSR2), 0);
  const auto until = Clock::now() + kWait;
  while (!got.load() && Clock::now() < until) std::this_thread::sleep_for(Ms(1));
  if (!got.load()) {  // it slept on: wake it with a message, and fail
    ASSERT_EQ(local->post_recv(3, {sge(0, 4096)}), 0);
    ASSERT_EQ(remote->post_send(make_send(3, {sge(0, 64)})), 0);
  }
  intr_waiter.join();
  EXPECT_EQ(got.load(), -1) << "a signal without SA_RESTART did not end ibv_get_cq_event";
  EXPECT_EQ(intr_errno.load(), EINTR);
  sigaction(SIGUSR2, &old_sa, nullptr);

  const int fl = fcntl(local->channel->fd, F_GETFL);
  ASSERT_EQ(fcntl(local->channel->fd, F_SETFL, fl | O_NONBLOCK), 0);
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(local->channel, &cq, &ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(fcntl(local->channel->fd, F_SETFL, fl), 0);
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 0), 0);
}

}  // namespace
}  // namespace mp
