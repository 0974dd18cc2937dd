// Completion queues, completion channels and CQ events: the local process receives (its
// receive CQ is on a completion channel) and the peer process sends.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "softverbs/verbs_ext.h"

#include "harness.h"

namespace mp {
namespace {

// Whether the fd is readable right now (poll with a zero timeout).
bool readable_now(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

// For negative checks, made only after the completion that could have raised the event has
// been polled: the engine queues a CQ event in the same call that queues the completion,
// just after it, so a short bounded look is enough. Staying unreadable is the expected
// outcome, so this wait never decides a pass by timing out early; it only bounds how long
// we give a wrong event to show up.
bool readable_soon(int fd) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do r = ::poll(&p, 1, 100);
  while (r < 0 && errno == EINTR);
  return r == 1 && (p.revents & POLLIN);
}

// Waits up to kWait for the fd to become readable.
bool readable_within_deadline(int fd) {
  pollfd p{fd, POLLIN, 0};
  int r;
  do r = ::poll(&p, 1, static_cast<int>(kWait.count()));
  while (r < 0 && errno == EINTR);
  return r == 1 && (p.revents & POLLIN);
}

// Waits (bounded) for the channel's next event, takes it and acks it: the CQ it names, or
// null if none came or it could not be read.
ibv_cq* take_cq_event(ibv_comp_channel* ch) {
  if (!readable_within_deadline(ch->fd)) return nullptr;
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  if (ibv_get_cq_event(ch, &cq, &cq_ctx) != 0) return nullptr;
  ibv_ack_cq_events(cq, 1);
  return cq;
}

PeerConfig with_channel() {
  PeerConfig c;
  c.with_channel = true;
  return c;
}

TEST_F(XProc, CompChannelDeliversEventForArmedCqOnly) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  ASSERT_NE(local->channel, nullptr);
  ASSERT_EQ(local->rcq->channel, local->channel);
  const int fd = local->channel->fd;
  for (uint64_t round = 0; round < 2; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    ASSERT_EQ(local->post_recv(round, {sge(0, 4096)}), 0);
    ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
    ASSERT_EQ(remote->post_send(make_send(round, {sge(0, 64)})), 0);
    ASSERT_TRUE(readable_within_deadline(fd)) << "no completion event within the deadline";
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(local->channel, &cq, &cq_ctx), 0);
    EXPECT_EQ(cq, local->rcq);
    EXPECT_EQ(cq_ctx, local.get());  // the cq_context given to ibv_create_cq
    ibv_ack_cq_events(cq, 1);
    auto r = local->poll(CqSel::recv, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_TRUE(wc_is(r[0], round, IBV_WC_SUCCESS, IBV_WC_RECV));
    EXPECT_EQ(r[0].byte_len, 64u);
    EXPECT_FALSE(readable_now(fd)) << "one arm, one event";
  }
  EXPECT_EQ(local->rcq->comp_events_completed, 2u);

  // Not armed: the completion arrives, no event does.
  ASSERT_EQ(local->post_recv(9, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(9, {sge(0, 64)})), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_FALSE(readable_soon(fd)) << "event without ibv_req_notify_cq";
  EXPECT_EQ(remote->poll(CqSel::send, 3).size(), 3u);
}

// ibv_destroy_cq with events of that CQ still on its channel: they go with it (uverbs'
// ib_uverbs_release_ucq), so ibv_get_cq_event never returns the freed CQ; an event already
// returned must be acked first: the destroy waits for the ack, as libibverbs'
// ibv_cmd_destroy_cq waits for comp_events_completed to reach comp_events_reported.
TEST_F(XProc, DestroyCqDropsItsQueuedEventsAndWaitsForTheAckOfReturnedOnes) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  // An event for cq: a receive flushed as its QP goes to ERR, on the armed CQ.
  auto raise_event = [&](ibv_cq* cq) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(local->pd, &ia);
    EXPECT_NE(qp, nullptr);
    if (!qp) return;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    EXPECT_EQ(
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 7;
    EXPECT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
    EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
    a.qp_state = IBV_QPS_ERR;
    EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE), 0);
    EXPECT_TRUE(readable_within_deadline(local->channel->fd));
    ibv_wc wc{};
    EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 1);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
  };
  const int fd = local->channel->fd;
  const int fl = fcntl(fd, F_GETFL);
  ASSERT_EQ(fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);

  ibv_cq* doomed = ibv_create_cq(local->ctx, 4, nullptr, local->channel, 0);
  ASSERT_NE(doomed, nullptr);
  ASSERT_NO_FATAL_FAILURE(raise_event(doomed));
  ASSERT_EQ(ibv_destroy_cq(doomed), 0);  // its event still queued
  EXPECT_FALSE(readable_now(fd)) << "the destroyed CQ's event is still counted on the channel";
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(local->channel, &cq, &cq_ctx), -1) << "returned a destroyed CQ";
  EXPECT_EQ(errno, EAGAIN);

  // Returned but not acked: the destroy waits for the ack.
  ibv_cq* held = ibv_create_cq(local->ctx, 4, nullptr, local->channel, 0);
  ASSERT_NE(held, nullptr);
  ASSERT_NO_FATAL_FAILURE(raise_event(held));
  ASSERT_EQ(ibv_get_cq_event(local->channel, &cq, &cq_ctx), 0);
  EXPECT_EQ(cq, held);
  std::atomic<int> destroyed{-1};
  std::thread destroyer([&] { destroyed = ibv_destroy_cq(held); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(destroyed.load(), -1) << "the CQ was destroyed with an event not acked";
  ibv_ack_cq_events(cq, 1);
  destroyer.join();
  EXPECT_EQ(destroyed.load(), 0);
  ASSERT_EQ(fcntl(fd, F_SETFL, fl), 0);
}

TEST_F(XProc, CompChannelNonBlockingGivesEagain) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  const int fd = local->channel->fd;
  const int fl = fcntl(fd, F_GETFL);
  ASSERT_GE(fl, 0);
  ASSERT_EQ(fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);
  ibv_cq* cq = nullptr;
  void* cq_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(local->channel, &cq, &cq_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);

  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 100)})), 0);
  ASSERT_TRUE(readable_within_deadline(fd));
  ASSERT_EQ(ibv_get_cq_event(local->channel, &cq, &cq_ctx), 0);
  EXPECT_EQ(cq, local->rcq);
  ibv_ack_cq_events(cq, 1);

  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(local->channel, &cq, &cq_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
}

TEST_F(XProc, SolicitedOnlyArmWakesOnlyForSolicitedSends) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  const int fd = local->channel->fd;
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(local->post_recv(i, {sge(i * 4096, 4096)}), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 1), 0);

  // Unsolicited SEND: its successful completion must not fire a solicited-only arm. We wait
  // for the completion itself (not for time to pass), then look at the fd.
  ASSERT_EQ(remote->post_send(make_send(0, {sge(0, 32)})), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 0, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_FALSE(readable_soon(fd)) << "solicited-only CQ fired for an unsolicited SEND";

  // Solicited SEND: fires the arm still in place.
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 32)}, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED)),
            0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "no event for a solicited SEND";
  r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));

  // Solicited SEND_WITH_IMM: the solicited bit travels with the immediate data too.
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 1), 0);
  SendSpec s = make_send(2, {sge(0, 32)}, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
  s.opcode = IBV_WR_SEND_WITH_IMM;
  s.imm_or_inv = 0x01020304;
  ASSERT_EQ(remote->post_send(s), 0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "no event for a solicited SEND_WITH_IMM";
  r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(remote->poll(CqSel::send, 3).size(), 3u);
}

// The receiver never polls its 4-entry receive CQ while more completions arrive than fit.
// Arming twice: "next completion" wins over "solicited only", whatever the order (the
// kernel's rule, rxe_req_notify_cq: a CQ armed for any completion is not narrowed by a later
// solicited-only request; a solicited-only arm is widened by a later request for any).
TEST_F(XProc, ArmForAnyCompletionIsNotNarrowedByASolicitedArm) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  for (uint64_t i = 0; i < 2; ++i) ASSERT_EQ(local->post_recv(i, {sge(i * 4096, 4096)}), 0);

  // Any, then solicited-only: an unsolicited SEND still fires.
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 1), 0);
  ASSERT_EQ(remote->post_send(make_send(0, {sge(0, 32)})), 0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "arm for any completion was narrowed";
  ASSERT_EQ(local->poll(CqSel::recv, 1).size(), 1u);

  // Solicited-only, then any: an unsolicited SEND fires too.
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 1), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 32)})), 0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "solicited-only arm was not widened";
  ASSERT_EQ(local->poll(CqSel::recv, 1).size(), 1u);
  EXPECT_EQ(remote->poll(CqSel::send, 2).size(), 2u);
}

// softverbs_cq_set_comp_handler: what a handler saw, written on the progress thread.
struct HandlerLog {
  std::atomic<int> calls{0};
  std::atomic<bool> decline{false};
  std::atomic<bool> other_thread{true};
  std::atomic<uint64_t> wr_id{~0ull};
  std::atomic<int> polled{0};
  std::thread::id test_thread = std::this_thread::get_id();
};

bool log_handler(ibv_cq* cq, void* arg) {
  auto* l = static_cast<HandlerLog*>(arg);
  if (std::this_thread::get_id() == l->test_thread) l->other_thread = false;
  if (l->decline) {
    l->calls.fetch_add(1);
    return false;
  }
  // A handler polls and re-arms from the device's own thread: that must not deadlock.
  ibv_wc wc{};
  int n = ibv_poll_cq(cq, 1, &wc);
  if (n == 1) {
    l->wr_id = wc.wr_id;
    l->polled.fetch_add(1);
  }
  ibv_req_notify_cq(cq, 0);
  l->calls.fetch_add(1);  // last: the test reads the rest once it sees the call
  return true;
}

bool wait_calls(const HandlerLog& l, int n) {
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (l.calls.load() < n && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return l.calls.load() >= n;
}

TEST_F(XProc, CompHandlerRunsOnTheDeviceThreadInsteadOfAChannelEvent) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  HandlerLog log;
  ASSERT_EQ(softverbs_cq_set_comp_handler(local->rcq, log_handler, &log), 0);
  const int fd = local->channel->fd;
  for (uint64_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(testing::Message() << "round " << round);
    ASSERT_EQ(local->post_recv(round, {sge(0, 4096)}), 0);
    if (round == 0) {
      ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);  // from then on the handler arms
    }
    ASSERT_EQ(remote->post_send(make_send(round, {sge(0, 64)})), 0);
    ASSERT_TRUE(wait_calls(log, static_cast<int>(round) + 1)) << "handler not called";
    EXPECT_EQ(log.polled.load(), static_cast<int>(round) + 1) << "the handler polls its completion";
    EXPECT_EQ(log.wr_id.load(), round);
  }
  EXPECT_TRUE(log.other_thread.load()) << "the handler ran on the application's thread";
  EXPECT_FALSE(readable_soon(fd)) << "a handled notification also queued a channel event";
  EXPECT_EQ(log.calls.load(), 3) << "one notification per arm";

  // Declined: the notification goes to the channel after all.
  log.decline = true;
  ASSERT_EQ(local->post_recv(7, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(7, {sge(0, 64)})), 0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "a declined notification was lost";
  EXPECT_EQ(log.calls.load(), 4);

  // Removed: channel events as before, and the handler is not called again.
  ASSERT_EQ(softverbs_cq_set_comp_handler(local->rcq, nullptr, nullptr), 0);
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(8, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(8, {sge(0, 64)})), 0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "no event once the handler is gone";
  EXPECT_EQ(log.calls.load(), 4);
  auto r = local->poll(CqSel::recv, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(wc_is(r[0], 7, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_TRUE(wc_is(r[1], 8, IBV_WC_SUCCESS, IBV_WC_RECV));
}

TEST_F(XProc, CompHandlerNeedsAChannelAndAValidCq) {
  ASSERT_NO_FATAL_FAILURE(Connect());  // CQs without a completion channel
  HandlerLog log;
  EXPECT_EQ(softverbs_cq_set_comp_handler(local->rcq, log_handler, &log), EINVAL);
  EXPECT_EQ(softverbs_cq_set_comp_handler(nullptr, log_handler, &log), EINVAL);
  ibv_cq* stale = reinterpret_cast<ibv_cq*>(&log);  // not a CQ of ours
  EXPECT_EQ(softverbs_cq_set_comp_handler(stale, log_handler, &log), EINVAL);
}

TEST_F(InProc, CqOverflowRaisesCqErrAsyncEvent) {
  PeerConfig bc;
  bc.recv_cqe = 4;
  ASSERT_NO_FATAL_FAILURE(Connect(PeerConfig{}, bc));
  const int cqe = b->rcq->cqe;
  ASSERT_GE(cqe, 4);
  ASSERT_LE(cqe, 64);
  const int n = cqe + 8;
  for (int i = 0; i < n; ++i) ASSERT_EQ(b->post_recv(i, {sge(i * 64, 64)}), 0);
  for (int i = 0; i < n; ++i) ASSERT_EQ(a->post_send(make_send(i, {sge(0, 8)})), 0);
  auto s = a->poll(CqSel::send, n);
  ASSERT_EQ(s.size(), static_cast<size_t>(n));
  ibv_async_event ev{};
  const int type = b->wait_async(kWait, &ev);
  ASSERT_EQ(type, IBV_EVENT_CQ_ERR) << "no CQ error event within the deadline";
  EXPECT_EQ(ev.element.cq, b->rcq);
}

// ---- extended CQs (ibv_create_cq_ex) ---------------------------------------------------------

uint64_t now_ns(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}

// start_poll until a completion is there (bounded); its return value.
int start_poll_within_deadline(ibv_cq_ex* cq) {
  const auto end = std::chrono::steady_clock::now() + kWait;
  ibv_poll_cq_attr attr{};
  int r;
  while ((r = ibv_start_poll(cq, &attr)) == ENOENT && std::chrono::steady_clock::now() < end)
    std::this_thread::yield();
  return r;
}

TEST_F(XProc, ExtendedCqReadsEachCompletionWithItsFlagsAndTimes) {
  PeerConfig lc;
  lc.recv_cq_ex_flags = uint64_t{IBV_WC_STANDARD_FLAGS} |
                        uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP} |
                        uint64_t{IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK};
  ASSERT_NO_FATAL_FAILURE(Connect(lc, PeerConfig{}));
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(local->ctx, nullptr, &dx), 0);
  EXPECT_EQ(dx.hca_core_clock, 1000000u);  // kHz: timestamps count nanoseconds
  EXPECT_NE(dx.completion_timestamp_mask, 0u);
  ibv_values_ex before{};
  before.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  ASSERT_EQ(ibv_query_rt_values_ex(local->ctx, &before), 0);
  const uint64_t wall0 = now_ns(CLOCK_REALTIME);

  // ibv_cq_ex_to_cq is a cast: the extended CQ is the same object.
  auto* cq = reinterpret_cast<ibv_cq_ex*>(local->rcq);
  ibv_poll_cq_attr attr{};
  EXPECT_EQ(ibv_start_poll(cq, &attr), ENOENT);  // empty: no lock held, no end_poll
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(local->post_recv(10 + i, {sge(i * 4096, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 10)})), 0);
  SendSpec imm = make_send(2, {sge(0, 20)});
  imm.opcode = IBV_WR_SEND_WITH_IMM;
  imm.imm_or_inv = htonl(0x12345678);
  ASSERT_EQ(remote->post_send(imm), 0);
  ASSERT_EQ(remote->poll(CqSel::send, 2).size(), 2u);

  ASSERT_EQ(start_poll_within_deadline(cq), 0);
  EXPECT_EQ(cq->wr_id, 10u);
  EXPECT_EQ(cq->status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_wc_read_opcode(cq), IBV_WC_RECV);
  EXPECT_EQ(ibv_wc_read_byte_len(cq), 10u);
  EXPECT_EQ(ibv_wc_read_qp_num(cq), local->qp->qp_num);
  EXPECT_FALSE(ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_IMM);
  const uint64_t ts1 = ibv_wc_read_completion_ts(cq);
  EXPECT_GE(ts1, uint64_t(before.raw_clock.tv_nsec));
  const uint64_t wall1 = ibv_wc_read_completion_wallclock_ns(cq);
  EXPECT_GE(wall1, wall0);
  EXPECT_LE(wall1, now_ns(CLOCK_REALTIME));
  int r = ibv_next_poll(cq);
  if (r == ENOENT) {  // the second may still be on its way: a new poll window
    ibv_end_poll(cq);
    r = start_poll_within_deadline(cq);
  }
  ASSERT_EQ(r, 0);
  EXPECT_EQ(cq->wr_id, 11u);
  EXPECT_EQ(ibv_wc_read_opcode(cq), IBV_WC_RECV);
  EXPECT_EQ(ibv_wc_read_byte_len(cq), 20u);
  EXPECT_TRUE(ibv_wc_read_wc_flags(cq) & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(ibv_wc_read_imm_data(cq)), 0x12345678u);
  const uint64_t ts2 = ibv_wc_read_completion_ts(cq);
  EXPECT_GE(ts2, ts1);  // in completion order
  ibv_values_ex after{};
  after.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  ASSERT_EQ(ibv_query_rt_values_ex(local->ctx, &after), 0);
  EXPECT_LE(ts2, uint64_t(after.raw_clock.tv_nsec));
  EXPECT_EQ(ibv_next_poll(cq), ENOENT);
  ibv_end_poll(cq);

  // The same CQ still answers ibv_poll_cq.
  ASSERT_EQ(remote->post_send(make_send(3, {sge(0, 30)})), 0);
  auto w = local->poll(CqSel::recv, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].wr_id, 12u);
  EXPECT_EQ(w[0].byte_len, 30u);
}

// ibv_rc_pingpong posts from inside its poll window; a receive posted there may complete at
// once on this thread (a SEND was waiting for it), into the CQ being polled.
TEST_F(XProc, ExtendedCqLetsThePollerPostInsideItsPollWindow) {
  PeerConfig lc;
  lc.recv_cq_ex_flags = IBV_WC_STANDARD_FLAGS;
  ASSERT_NO_FATAL_FAILURE(Connect(lc, PeerConfig{}));
  auto* cq = reinterpret_cast<ibv_cq_ex*>(local->rcq);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, 8)})), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 8)})), 0);  // waits for a receive
  ASSERT_EQ(start_poll_within_deadline(cq), 0);
  EXPECT_EQ(cq->wr_id, 1u);
  ASSERT_EQ(local->post_recv(2, {sge(4096, 4096)}), 0);
  int r = ibv_next_poll(cq);
  ibv_end_poll(cq);
  if (r == ENOENT) {
    ASSERT_EQ(start_poll_within_deadline(cq), 0);
    r = 0;
    ibv_end_poll(cq);
  }
  EXPECT_EQ(r, 0);
  EXPECT_EQ(cq->wr_id, 2u);
}

TEST(ExtendedCq, RefusesWhatItCannotDoWithTheErrnoRdmaCoreGives) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_GE(n, 1);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  auto make = [&](uint64_t wc_flags, uint32_t comp_mask, uint32_t flags, uint32_t cqe) {
    ibv_cq_init_attr_ex a{};
    a.cqe = cqe;
    a.wc_flags = wc_flags;
    a.comp_mask = comp_mask;
    a.flags = flags;
    errno = 0;
    return ibv_create_cq_ex(ctx, &a);
  };
  EXPECT_EQ(make(IBV_WC_EX_WITH_CVLAN, 0, 0, 16), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(make(IBV_WC_EX_WITH_FLOW_TAG, 0, 0, 16), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(make(0, IBV_CQ_INIT_ATTR_MASK_PD, 0, 16), nullptr);  // parent domains
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(make(0, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, 16), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(make(0, 0, 0, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_cq_ex* cq = make(IBV_WC_STANDARD_FLAGS, IBV_CQ_INIT_ATTR_MASK_FLAGS,
                       IBV_CREATE_CQ_ATTR_SINGLE_THREADED, 16);
  ASSERT_NE(cq, nullptr) << strerror(errno);
  ibv_poll_cq_attr bad{};
  bad.comp_mask = 1;
  EXPECT_EQ(ibv_start_poll(cq, &bad), EINVAL);
  ibv_values_ex v{};
  v.comp_mask = 1u << 5;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx, &v), EOPNOTSUPP);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cq)), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

// softverbs_cq_quiet (verbs_ext.h): completions the calling thread makes at once while it
// holds the CQ quiet raise no event, the CQ stays armed, and the count it gets back says how
// many to poll for. A receive posted to a QP in error is flushed at once, on this thread.
TEST_F(XProc, QuietCqHoldsBackTheEventsOfWhatThisThreadCompletes) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  const int fd = local->channel->fd;

  // Not quiet: the flush raises the event.
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(local->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(take_cq_event(local->channel), local->rcq) << "the flush raised no event";
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV)) << wc_str(r[0]);

  // Quiet: no event; the count says there is one to poll for, and the CQ is still armed.
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ASSERT_EQ(softverbs_cq_quiet(local->rcq, 1), 0);
  ASSERT_EQ(local->post_recv(2, {sge(0, 4096)}), 0);
  ASSERT_EQ(local->post_recv(3, {sge(0, 4096)}), 0);
  EXPECT_EQ(softverbs_cq_quiet(local->rcq, 0), 2);
  EXPECT_FALSE(readable_soon(fd)) << "a quiet thread's completions raised an event";
  r = local->poll(CqSel::recv, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(wc_is(r[0], 2, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV)) << wc_str(r[0]);
  EXPECT_TRUE(wc_is(r[1], 3, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV)) << wc_str(r[1]);
  // Polled during the spell: nothing left to poll for.
  ASSERT_EQ(softverbs_cq_quiet(local->rcq, 1), 0);
  ASSERT_EQ(local->post_recv(5, {sge(0, 4096)}), 0);
  r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(softverbs_cq_quiet(local->rcq, 0), 0) << "counted what was already polled";
  EXPECT_FALSE(readable_soon(fd)) << "a quiet thread's completions raised an event";
  ASSERT_EQ(local->post_recv(4, {sge(0, 4096)}), 0);
  EXPECT_EQ(take_cq_event(local->channel), local->rcq) << "the quiet spell disarmed the CQ";
  EXPECT_EQ(local->poll(CqSel::recv, 1).size(), 1u);
}

TEST_F(XProc, QuietCqRejectsBadArgumentsAndASecondCq) {
  ASSERT_NO_FATAL_FAILURE(Connect(with_channel()));
  int not_a_cq = 0;
  errno = 0;
  EXPECT_EQ(softverbs_cq_quiet(nullptr, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(softverbs_cq_quiet(reinterpret_cast<ibv_cq*>(&not_a_cq), 1), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(softverbs_cq_quiet(local->rcq, 2), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(softverbs_cq_quiet(local->rcq, 0), -1) << "ended a quiet spell never begun";
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(softverbs_cq_quiet(local->rcq, 1), 0);
  errno = 0;
  EXPECT_EQ(softverbs_cq_quiet(local->scq, 1), -1);
  EXPECT_EQ(errno, EBUSY);
  errno = 0;
  EXPECT_EQ(softverbs_cq_quiet(local->scq, 0), -1) << "ended another CQ's quiet spell";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(softverbs_cq_quiet(local->rcq, 0), 0);
}

}  // namespace
}  // namespace mp
