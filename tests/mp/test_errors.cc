// Error matrix: completion statuses, QP error state, flushing and async events.
//
// iWARP note: RDMAP has no ACKs, so toward a plain iWARP peer (or with
// SOFTVERBS_IB_COMPLETION=0) a SEND or RDMA WRITE completes successfully once handed to TCP
// (siw does the same). When a remote error is caused by such a WR, its own completion may
// therefore be a success, and the error is reported on the next WR that was still waiting
// for the peer (a READ or ATOMIC). Tests that provoke a remote error put a READ behind the
// culprit and assert: a successful prefix no longer than the WRs that may have completed on
// transmit, then exactly one completion with the expected error, then IBV_WC_WR_FLUSH_ERR
// for everything after it, which holds under either rule. Softverbs peers that ask for it
// (SOFTVERBS_IB_COMPLETION=1 or softverbs_qp_set_ib_completion) follow IB's rule instead (the
// IbCompletion cases below assert it: no such prefix); the Rfc5040Completion cases pin
// RFC 5040's rule, the default.
//
// Async events: softverbs raises IBV_EVENT_QP_FATAL for a QP that a fatal error moved to
// ERR, on the requester and (for errors it detects itself) on the responder, except that an
// access violation the responder detects (a peer's bad R_Key, bounds or rights; its own
// receive buffer failing the check) raises IBV_EVENT_QP_ACCESS_ERR, the IB spec's Local
// Access Violation Work Queue Error (11.6.2), as siw does; that is what these tests assert.
//
// Not covered: IBV_WC_LOC_QP_OP_ERR is only produced toward a peer that is not softverbs
// (RFC 7306 opcodes refused); between two softverbs peers it cannot be reached.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <thread>

#include "harness.h"
#include "softverbs/verbs_ext.h"

namespace mp {
namespace {

constexpr uint32_t kMiB = 1u << 20;
constexpr uint32_t kBadKeyBits = 0x5A0000A5;  // same slot, other random bits: never valid

// After a fatal QP error: the QP reads back as ERR, IBV_EVENT_QP_FATAL for it arrives on the
// async fd, and work posted now completes with IBV_WC_WR_FLUSH_ERR with no peer involved.
// The caller has drained both CQs.
void expect_dead_qp(Peer& p, ibv_event_type event = IBV_EVENT_QP_FATAL) {
  ASSERT_EQ(wait_state(p, IBV_QPS_ERR), IBV_QPS_ERR);
  ibv_async_event ev{};
  EXPECT_EQ(p.wait_async(kWait, &ev), event);
  EXPECT_EQ(ev.element.qp, p.qp);
  ASSERT_EQ(p.post_send(make_send(7001, {sge(0, 8)})), 0);
  auto s = p.poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u) << "WR posted in ERR did not complete";
  EXPECT_TRUE(wc_is(s[0], 7001, IBV_WC_WR_FLUSH_ERR));
  ASSERT_EQ(p.post_recv(7002, {sge(0, 8)}), 0);
  auto r = p.poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u) << "receive posted in ERR did not complete";
  EXPECT_TRUE(wc_is(r[0], 7002, IBV_WC_WR_FLUSH_ERR));
}

void expect_remote_fatal(RemotePeer& r, ibv_event_type event = IBV_EVENT_QP_FATAL) {
  EXPECT_EQ(wait_state(r, IBV_QPS_ERR), IBV_QPS_ERR);
  bool own = false;
  EXPECT_EQ(r.wait_async(kWait, &own), event);
  EXPECT_TRUE(own);
}

std::vector<SendSpec> sends(uint64_t first_id, int n) {
  std::vector<SendSpec> v;
  for (int i = 0; i < n; ++i) v.push_back(make_send(first_id + i, {sge(0, 8)}));
  return v;
}

TEST_F(XProc, RecvTooSmallIsLocLenErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  remote->fill(0, 0, 4096, 0x11);
  ASSERT_EQ(remote->post_recv(5, {sge(0, 100)}), 0);
  local->fill(0, 0, 4096, 1);
  std::vector<SendSpec> chain = {
      make_send(1, {sge(0, 200)}),
      make_rdma(IBV_WR_RDMA_READ, 2, {sge(8192, 8)}, ri.addr + 8192, ri.rkey)};
  for (auto& s : sends(3, 10)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);

  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 5, IBV_WC_LOC_LEN_ERR));
  EXPECT_EQ(remote->check(0, 100, 4096 - 100, 0x11, 100), -1) << "wrote past the receive buffer";

  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  // The SEND itself may have completed on transmit; the READ behind it cannot succeed.
  expect_error_then_flush(s, 1, 1, IBV_WC_REM_INV_REQ_ERR);
  expect_dead_qp(*local);
  expect_remote_fatal(*remote);
}

TEST_F(XProc, BadLkeyOnSendIsLocProtErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  SgeSpec bad = sge(0, 32);
  bad.lkey_override = local->regions[0].mr->lkey ^ kBadKeyBits;
  std::vector<SendSpec> chain = {make_send(1, {bad})};
  for (auto& s : sends(2, 10)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 0, IBV_WC_LOC_PROT_ERR);
  expect_dead_qp(*local);
}

// An Atomic whose local buffer (where the original value lands) has a bad lkey is a local
// protection error: it must never reach the responder, so the target word is unchanged
// (the IB spec checks the local SGE before the request is sent; rxe's requester too).
TEST_F(XProc, AtomicWithBadLkeyNeverRunsAtTheResponder) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  remote->write_u64(0, 64, 1000);
  SgeSpec bad = sge(0, 8);
  bad.lkey_override = local->regions[0].mr->lkey ^ kBadKeyBits;
  std::vector<SendSpec> chain = {
      make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 1, bad, ri.addr + 64, ri.rkey, 5)};
  for (auto& s : sends(2, 3)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 0, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(remote->read_u64(0, 64), 1000u) << "the Atomic ran at the responder";
}

// After a local error no later WR may go out, and a WR completed as flushed must not have
// been delivered. The requester posts a WR with a bad lkey and 8 good ones in RTS while its
// peer has not reached RTR yet (the connection waits for it, as OOB set-up allows), then the
// peer completes its transitions and the connection comes up.
//
// The peer side is a negative check: its receives must not complete successfully. (Whether
// they are flushed at all depends on the peer noticing the connection loss, which an IB
// responder with nothing outstanding does not.) The 200 ms bound is how long a wrongly
// transmitted SEND gets to show up -- on loopback it arrives within microseconds; a correct
// engine passes however long we wait.
//
// (frame_sq() once skipped a WQE that failed locally and framed the ones behind it whenever
// TX ran again before the error was applied; a failed WQE now stops the SQ.)
TEST_F(InProc, WrsBehindLocProtErrAreNotTransmitted) {
  std::string err;
  a = Peer::create(PeerConfig{}, &err);
  ASSERT_TRUE(a) << err;
  b = Peer::create(PeerConfig{}, &err);
  ASSERT_TRUE(b) << err;
  // The side with the smaller QPN connects; make it the requester.
  Peer& req = a->qp->qp_num < b->qp->qp_num ? *a : *b;
  Peer& resp = &req == a.get() ? *b : *a;
  constexpr int kAfter = 8;
  ASSERT_EQ(resp.modify_init(), 0);
  for (int i = 0; i < kAfter; ++i) ASSERT_EQ(resp.post_recv(i, {sge(i * 64, 64)}), 0);
  ASSERT_EQ(req.connect(resp.info()), 0);
  SgeSpec bad = sge(0, 32);
  bad.lkey_override = req.regions[0].mr->lkey ^ kBadKeyBits;
  ASSERT_EQ(req.post_send(make_send(1, {bad})), 0);
  for (int i = 0; i < kAfter; ++i) ASSERT_EQ(req.post_send(make_send(2 + i, {sge(0, 32)})), 0);
  ASSERT_EQ(resp.modify_rtr(req.info()), 0);
  ASSERT_EQ(resp.modify_rts(), 0);

  auto s = req.poll(CqSel::send, 1 + kAfter);
  ASSERT_EQ(s.size(), 1u + kAfter);
  expect_error_then_flush(s, 1, 0, IBV_WC_LOC_PROT_ERR);
  for (const ibv_wc& w : resp.poll(CqSel::recv, kAfter, Ms(200)))
    EXPECT_NE(w.status, IBV_WC_SUCCESS)
        << "a WR completed as flushed was delivered to the peer: " << wc_str(w);
}

// A requester whose peer QP never reaches RTR: as on IB, its work ends in
// IBV_WC_RETRY_EXC_ERR once retry_cnt retransmissions would have timed out (here
// (1 + 1) * 4.096 us * 2^10, about 8 ms), and the rest is flushed.
TEST_F(InProc, PeerNeverInRtrEndsInRetryExcErr) {
  std::string err;
  PeerConfig quick;
  quick.timeout = 10;
  quick.retry_cnt = 1;
  a = Peer::create(quick, &err);
  ASSERT_TRUE(a) << err;
  b = Peer::create(PeerConfig{}, &err);
  ASSERT_TRUE(b) << err;
  ASSERT_EQ(b->modify_init(), 0);  // b stays in INIT
  ASSERT_EQ(a->connect(b->info()), 0);
  ASSERT_EQ(a->post_send(make_send(1, {sge(0, 32)})), 0);
  ASSERT_EQ(a->post_send(make_send(2, {sge(0, 32)})), 0);
  auto s = a->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u) << "no completion for work toward a peer that never reached RTR";
  expect_error_then_flush(s, 1, 0, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(a->state(), IBV_QPS_ERR);
}

// timeout 0 is infinite (IB spec): the work waits for the peer however long it takes, and
// completes once the peer arrives.
TEST_F(InProc, InfiniteTimeoutWaitsForThePeer) {
  std::string err;
  PeerConfig patient;
  patient.timeout = 0;
  a = Peer::create(patient, &err);
  ASSERT_TRUE(a) << err;
  b = Peer::create(PeerConfig{}, &err);
  ASSERT_TRUE(b) << err;
  ASSERT_EQ(b->modify_init(), 0);
  ASSERT_EQ(b->post_recv(9, {sge(0, 64)}), 0);
  ASSERT_EQ(a->connect(b->info()), 0);
  ASSERT_EQ(a->post_send(make_send(1, {sge(0, 32)})), 0);
  // Bounded look for a wrong early completion (a correct engine passes however long we wait).
  EXPECT_TRUE(a->poll(CqSel::send, 1, Ms(300)).empty()) << "completed before the peer was there";
  ASSERT_EQ(b->modify_rtr(a->info()), 0);
  ASSERT_EQ(b->modify_rts(), 0);
  auto s = a->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)) << wc_str(s[0]);
  EXPECT_EQ(b->poll(CqSel::recv, 1).size(), 1u);
}

// The peer's SEND (wr_id 4) arrives at a receive (wr_id 3) whose lkey is no longer valid: the
// receive completes with IBV_WC_LOC_PROT_ERR.
void expect_send_into_bad_receive(Peer& local, RemotePeer& remote) {
  SgeSpec bad = sge(0, 4096);
  bad.lkey_override = local.regions[0].mr->lkey ^ kBadKeyBits;
  ASSERT_EQ(local.post_recv(3, {bad}), 0);
  ASSERT_EQ(remote.post_send(make_send(4, {sge(0, 64)})), 0);
  auto r = local.poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 3, IBV_WC_LOC_PROT_ERR));
  // The error completion is reported after the QP moved to ERR, not before.
  EXPECT_EQ(local.state(), IBV_QPS_ERR) << "error completion seen while the QP was not in ERR";
}

TEST_F(XProc, BadLkeyOnRecvIsLocProtErrWhenSendArrives) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(expect_send_into_bad_receive(*local, *remote));
  expect_dead_qp(*local, IBV_EVENT_QP_ACCESS_ERR);  // a local access violation (siw's event)
}

TEST_F(XProc, ReadWithBadRkeyIsRemAccessErrAndFlushesTheRest) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  std::vector<SendSpec> chain = {
      make_rdma(IBV_WR_RDMA_READ, 1, {sge(0, 64)}, ri.addr, ri.rkey ^ kBadKeyBits)};
  for (auto& s : sends(2, 10)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 0, IBV_WC_REM_ACCESS_ERR);
  expect_dead_qp(*local);
  // The responder's side of an R_Key violation: IB spec 11.6.2's Local Access Violation.
  expect_remote_fatal(*remote, IBV_EVENT_QP_ACCESS_ERR);
}

TEST_F(XProc, ReadFromMrWithoutRemoteReadIsRemAccessErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const MrInfo m = remote->add_mr(65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(m.err, 0);
  std::vector<SendSpec> chain = {make_rdma(IBV_WR_RDMA_READ, 1, {sge(0, 4096)}, m.addr, m.rkey)};
  for (auto& s : sends(2, 3)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 0, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
}

TEST_F(XProc, AtomicOnMrWithoutRemoteAtomicIsRemAccessErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const MrInfo m = remote->add_mr(
      4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(m.err, 0);
  remote->write_u64(m.index, 0, 77);
  std::vector<SendSpec> chain = {
      make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sge(0, 8), m.addr, m.rkey, 1)};
  for (auto& s : sends(2, 3)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 0, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(remote->read_u64(m.index, 0), 77u) << "refused atomic changed memory";
}

TEST_F(XProc, WriteToMrWithoutRemoteWriteIsRemAccessErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const MrInfo m = remote->add_mr(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_EQ(m.err, 0);
  remote->fill(m.index, 0, 4096, 0x22);
  local->fill(0, 0, 64, 1);
  std::vector<SendSpec> chain = {make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 64)}, m.addr, m.rkey),
                                 make_rdma(IBV_WR_RDMA_READ, 2, {sge(4096, 8)}, ri.addr, ri.rkey)};
  for (auto& s : sends(3, 3)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 1, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(remote->check(m.index, 0, 4096, 0x22), -1) << "refused WRITE changed memory";
}

TEST_F(XProc, WriteOutOfBoundsIsRemAccessErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  std::vector<SendSpec> chain = {
      make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 4096)}, ri.addr + ri.len - 100, ri.rkey),
      make_rdma(IBV_WR_RDMA_READ, 2, {sge(8192, 8)}, ri.addr, ri.rkey)};
  for (auto& s : sends(3, 5)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  // The Terminate may land on the WRITE or, if the WRITE completed on transmit, the READ.
  expect_error_then_flush(s, 1, 1, IBV_WC_REM_ACCESS_ERR);
  expect_dead_qp(*local);
  expect_remote_fatal(*remote, IBV_EVENT_QP_ACCESS_ERR);
}

// Atomics are checked where rxe checks them, not at post: a misaligned target is the
// responder's invalid request (IBV_WC_REM_INV_REQ_ERR; the word is not touched), a local
// buffer other than one of 8 bytes is a local length error (nothing is sent).
TEST_F(XProc, MisalignedAtomicCompletesWithRemInvReqErr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  remote->write_u64(0, 8, 40);
  std::vector<SendSpec> chain = {
      make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sge(0, 8), ri.addr + 12, ri.rkey, 1)};
  for (auto& s : sends(2, 3)) chain.push_back(s);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  expect_error_then_flush(s, 1, 0, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(remote->read_u64(0, 8), 40u);
}

TEST_F(XProc, AtomicWithoutOneEightByteBufferIsLocLenErr) {
  for (uint32_t len : {4u, 16u}) {
    SCOPED_TRACE(len);
    ASSERT_NO_FATAL_FAILURE(Connect());  // a fresh pair: the error ends the QP
    remote->write_u64(0, 8, 40);
    std::vector<SendSpec> chain = {
        make_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 1, sge(0, len), ri.addr + 8, ri.rkey, 40, 7)};
    for (auto& s : sends(2, 2)) chain.push_back(s);
    ASSERT_EQ(local->post_send_chain(chain), 0);
    auto s = local->poll(CqSel::send, chain.size());
    ASSERT_EQ(s.size(), chain.size());
    expect_error_then_flush(s, 1, 0, IBV_WC_LOC_LEN_ERR);
    EXPECT_EQ(remote->read_u64(0, 8), 40u) << "the Atomic was sent";
  }
}

// rnr_retry = 7 (infinite): a SEND that arrives before any receive is posted waits for one.
TEST_F(XProc, SendWaitsForLateReceiveWithInfiniteRnrRetry) {
  ASSERT_NO_FATAL_FAILURE(Connect());  // rnr_retry 7 on both sides
  local->fill(0, 0, 4096, 44);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 4096)})), 0);
  // The scenario, not a measurement: the receiver is 300 ms late.
  std::this_thread::sleep_for(Ms(300));
  ASSERT_EQ(remote->post_recv(5, {sge(0, 8192)}), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 5, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 4096u);
  EXPECT_EQ(remote->check(0, 0, 4096, 44), -1);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_EQ(local->state(), IBV_QPS_RTS);
  EXPECT_EQ(remote->state(), IBV_QPS_RTS);
}

// Finite rnr_retry: the receiver has no receive posted and gives up after (rnr_retry + 1)
// RNR timeouts (rnr_retry 1, timer code 1 = 10 us here). iWARP has no RNR NAK, so under
// RFC 5040's rule the SEND itself completed when TCP took it; the requester learns of the
// failure through the Terminate (DDP untagged "no buffer"), reported on its oldest
// outstanding WR, a READ. (IB's rule: IbCompletion.RnrRetryExcErrLandsOnTheSend.)
TEST_F(Rfc5040Completion, FiniteRnrRetryEndsWithRnrRetryExcErr) {
  PeerConfig rc;
  rc.rnr_retry = 1;
  rc.min_rnr_timer = 1;
  ASSERT_NO_FATAL_FAILURE(Connect(PeerConfig{}, rc));
  local->fill(0, 0, 64, 45);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_READ, 2, {sge(4096, 64)}, ri.addr, ri.rkey)), 0);
  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));  // on transmit (iWARP)
  EXPECT_EQ(s[1].wr_id, 2u);
  EXPECT_EQ(s[1].status, IBV_WC_RNR_RETRY_EXC_ERR) << ibv_wc_status_str(s[1].status);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
  EXPECT_EQ(wait_state(*remote, IBV_QPS_ERR), IBV_QPS_ERR) << "the receiver ended the connection";
}

// Moving a QP to RESET drops its completions still in the CQs, as mlx4/mlx5 do, so a QP
// brought back up does not poll the flushes of its previous life (rdma-core's
// test_mr_rereg_addr relies on it).
TEST_F(XProc, ResetDropsTheQpsCompletionsFromItsCqs) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(local->post_recv(10 + i, {sge(i * 64, 64)}), 0);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  ASSERT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  EXPECT_TRUE(local->poll(CqSel::recv, 1, Ms(100)).empty()) << "a flush of the old QP survived";
}

// ---- IB's completion rule between softverbs peers (opt-in) -------------------------------
// Both processes ask for Placement Acks: a SEND completes once a receive took it, a WRITE's
// completion means its bytes are in the target's memory, and a remote error completes the WR
// that caused it, with nothing before it reported as a success. (Fixture: harness.h.)

// IB's rule on local's QP: its SEND (wr_id 1) completes only once the peer posted a
// receive (wr_id 9) and placed it, and the QP says which rule it got.
void expect_send_completes_once_placed(Peer& local, RemotePeer& remote) {
  ASSERT_EQ(local.post_send(make_send(1, {sge(0, 64)})), 0);
  EXPECT_TRUE(local.poll(CqSel::send, 1, Ms(200)).empty()) << "completed with no receive posted";
  ASSERT_EQ(remote.post_recv(9, {sge(0, 64)}), 0);
  auto s = local.poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_EQ(softverbs_qp_ib_completion(local.qp), 1);
}

TEST_F(IbCompletion, SendCompletesOnlyOnceTheResponderPlacedIt) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  local->fill(0, 0, 64, 46);
  ASSERT_NO_FATAL_FAILURE(expect_send_completes_once_placed(*local, *remote));
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV));
}

// A QP's own choice (softverbs_qp_set_ib_completion, made before it connects) overrides
// SOFTVERBS_IB_COMPLETION, which is unset here: this QP asks for IB's rule.
TEST_F(XProc, PerQpChoiceOfIbCompletionOverridesTheEnvironment) {
  ASSERT_NO_FATAL_FAILURE(Create());
  EXPECT_EQ(softverbs_qp_set_ib_completion(local->qp, 2), EINVAL);
  EXPECT_EQ(softverbs_qp_set_ib_completion(nullptr, 1), EINVAL);
  ASSERT_EQ(softverbs_qp_set_ib_completion(local->qp, 1), 0);
  ASSERT_EQ(remote->connect(li), 0);
  ASSERT_EQ(local->connect(ri), 0);
  ASSERT_NO_FATAL_FAILURE(expect_send_completes_once_placed(*local, *remote));
  errno = 0;
  EXPECT_EQ(softverbs_qp_ib_completion(nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  int not_a_qp = 0;
  errno = 0;
  EXPECT_EQ(softverbs_qp_ib_completion(reinterpret_cast<ibv_qp*>(&not_a_qp)), -1);
  EXPECT_EQ(errno, EINVAL);
}

// And the other way: SOFTVERBS_IB_COMPLETION=1, but this QP keeps RFC 5040's rule.
TEST_F(IbCompletion, PerQpChoiceOfRfc5040OverridesTheEnvironment) {
  ASSERT_NO_FATAL_FAILURE(Create());
  ASSERT_EQ(softverbs_qp_set_ib_completion(local->qp, 0), 0);
  ASSERT_EQ(remote->connect(li), 0);
  ASSERT_EQ(local->connect(ri), 0);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64)})), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u) << "waited for a placement it did not ask for";
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_EQ(softverbs_qp_ib_completion(local->qp), 0);
  ASSERT_EQ(remote->post_recv(9, {sge(0, 64)}), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
}

TEST_F(IbCompletion, WriteCompletionMeansTheBytesArePlaced) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  for (uint32_t i = 0; i < 50; ++i) {
    const uint32_t len = 1024 + 4096 * (i % 7);
    local->fill(0, 0, len, 600 + i);
    ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, i, {sge(0, len)}, ri.addr, ri.rkey)),
              0);
    auto s = local->poll(CqSel::send, 1);
    ASSERT_EQ(s.size(), 1u);
    ASSERT_TRUE(wc_is(s[0], i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
    ASSERT_EQ(remote->check(0, 0, len, 600 + i), -1) << "WRITE " << i << " completed unplaced";
  }
}

// A Placement Ack nobody asked for (unsignaled Writes, fewer than the window's end, so none
// asks: qp_requester.cc mark_ack_request) still comes once the stream is quiet: the
// responder's lazy timer sends it (qp.cc arm_lazy_ack_locked), and it is the only FPDU the
// requester receives. Without it an unsignaled WR's slot would wait for a later request.
// On TCP: a shared-memory set-up's messages would arrive too and could pass for the ack.
TEST_F(IbCompletion, AnAckNobodyAskedForComesOnceTheStreamIsQuiet) {
  setenv("SOFTVERBS_SHM", "0", 1);
  g_child_env.push_back("SOFTVERBS_SHM=0");
  ASSERT_NO_FATAL_FAILURE(Connect());
  unsetenv("SOFTVERBS_SHM");
  const uint32_t qpn = local->qp->qp_num;
  constexpr uint32_t kWrites = 3, kLen = 256;
  ASSERT_GT(local->cap.max_send_wr * 3 / 4, kWrites);
  // A signaled Write first: its completion is its ack, so the connection is up and all the
  // peer sends while connecting (its RTR, RFC 6581) has arrived; nothing else comes from it
  // until the ack counted below. It also starts the requester's count towards the window's
  // end from zero (mark_ack_request).
  local->fill(0, 0, 64, 699);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 99, {sge(0, 64)}, ri.addr, ri.rkey)), 0);
  auto first = local->poll(CqSel::send, 1);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(wc_is(first[0], 99, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  uint64_t before = ~0ull;
  for (int t = 0; t < 1000 && before == ~0ull; ++t) {
    before = qp_counter(getpid(), qpn, sv::wire::Ctr::rcvd_pkts);
    if (before == ~0ull) std::this_thread::sleep_for(Ms(5));
  }
  ASSERT_NE(before, ~0ull) << "the QP's counters were never published";
  ASSERT_GT(before, 0u) << "the first Write's ack was not counted";
  for (uint32_t i = 0; i < kWrites; ++i) {
    local->fill(0, i * kLen, kLen, 700 + i);
    ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, i, {sge(i * kLen, kLen)},
                                         ri.addr + i * kLen, ri.rkey, 0)),
              0);
  }
  bool placed = false;
  for (int t = 0; t < 1000 && !placed; ++t) {
    placed = remote->check(0, (kWrites - 1) * kLen, kLen, 700 + kWrites - 1) == -1;
    if (!placed) std::this_thread::sleep_for(Ms(5));
  }
  ASSERT_TRUE(placed) << "the Writes never landed";
  uint64_t pkts = 0;
  for (int t = 0; t < 1000 && (pkts <= before || pkts == ~0ull); ++t) {
    std::this_thread::sleep_for(Ms(5));
    pkts = qp_counter(getpid(), qpn, sv::wire::Ctr::rcvd_pkts);
  }
  EXPECT_NE(pkts, ~0ull);
  EXPECT_GT(pkts, before) << "no ack came for the unsignaled Writes";
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(local->scq, 1, &wc), 0) << "an unsignaled WR completed: " << wc_str(wc);
}

// The SEND that found no receive is the one that fails (IB spec 9.7.5.2.8), not the READ.
TEST_F(IbCompletion, RnrRetryExcErrLandsOnTheSend) {
  PeerConfig rc;
  rc.rnr_retry = 1;
  rc.min_rnr_timer = 1;
  ASSERT_NO_FATAL_FAILURE(Connect(PeerConfig{}, rc));
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_READ, 2, {sge(4096, 64)}, ri.addr, ri.rkey)), 0);
  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  expect_error_then_flush(s, 1, 0, IBV_WC_RNR_RETRY_EXC_ERR);
}

TEST_F(IbCompletion, RemoteAccessErrorLandsOnTheWrite) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  std::vector<SendSpec> chain = {
      make_send(1, {sge(0, 8)}),
      make_rdma(IBV_WR_RDMA_WRITE, 2, {sge(0, 4096)}, ri.addr + ri.len - 100, ri.rkey),
      make_rdma(IBV_WR_RDMA_READ, 3, {sge(8192, 8)}, ri.addr, ri.rkey)};
  ASSERT_EQ(remote->post_recv(9, {sge(0, 64)}), 0);
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)) << "the SEND before it was placed";
  expect_error_then_flush({s.begin() + 1, s.end()}, 2, 0, IBV_WC_REM_ACCESS_ERR);
}

// The responder's own receive buffer fails its check: its receive completes with
// IBV_WC_LOC_PROT_ERR and the SEND with IB's Remote Operational Error (rxe, mlx5).
TEST_F(IbCompletion, BadReceiveBufferIsRemOpErrOnTheSend) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(expect_send_into_bad_receive(*local, *remote));
  auto s = remote->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 4, IBV_WC_REM_OP_ERR));
}

// The peer placed our SEND, but its ack queues on the stream behind the peer's own SEND,
// for which we have no receive yet (IB's ACKs never queue behind requests). Our SEND must
// still complete before we post that receive, or each side would wait for the other.
TEST_F(IbCompletion, AckBehindAnUnplaceableSendDoesNotHoldOurCompletion) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  EXPECT_TRUE(remote->poll(CqSel::send, 1, Ms(100)).empty()) << "completed with no receive";
  ASSERT_EQ(remote->post_recv(9, {sge(4096, 64)}), 0);
  local->fill(0, 0, 64, 48);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64)})), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(remote->check(0, 4096, 64, 48), -1);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u) << "our SEND waits for an ack stuck behind the peer's SEND";
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  // Once we take the peer's SEND, its completion and the stream move on.
  ASSERT_EQ(local->post_recv(8, {sge(8192, 64)}), 0);
  auto lr = local->poll(CqSel::recv, 1);
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_TRUE(wc_is(lr[0], 8, IBV_WC_SUCCESS, IBV_WC_RECV));
  auto rs = remote->poll(CqSel::send, 1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_TRUE(wc_is(rs[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  // And acks work again: a WRITE completes once placed.
  local->fill(0, 0, 4096, 49);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 3, {sge(0, 4096)}, ri.addr, ri.rkey)), 0);
  auto w = local->poll(CqSel::send, 1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(wc_is(w[0], 3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_EQ(remote->check(0, 0, 4096, 49), -1);
}

// Each side asks for acks for its own Sends: here only the peer process does, so its SEND
// waits for a receive while ours completes on transmit (RFC 5040).
TEST_F(XProc, IbCompletionIsAskedForPerDirection) {
  g_child_env = {"SOFTVERBS_IB_COMPLETION=1"};
  Connect();
  g_child_env.clear();
  ASSERT_FALSE(HasFatalFailure());
  // The peer can take our SEND: its ack to us must not queue behind a SEND it cannot place
  // (Placement Acks share the stream; see docs/design.md, "Completion rule").
  ASSERT_EQ(remote->post_recv(8, {sge(0, 64)}), 0);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64)})), 0);
  ASSERT_EQ(remote->post_send(make_send(2, {sge(0, 64)})), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND)) << "we did not ask: on transmit";
  EXPECT_TRUE(remote->poll(CqSel::send, 1, Ms(200)).empty()) << "the peer's completed unreceived";
  ASSERT_EQ(local->post_recv(9, {sge(0, 64)}), 0);
  auto rs = remote->poll(CqSel::send, 1);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_TRUE(wc_is(rs[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
}

// Toward a plain iWARP peer (as siw is) RFC 5040 holds whatever we ask: no ACKs, a SEND
// completes once TCP has it, received or not.
TEST_F(IbCompletion, TowardAPlainIwarpPeerASendCompletesOnTransmit) {
  g_child_env = {"SOFTVERBS_RFC7306=0"};
  Connect();
  g_child_env.clear();
  ASSERT_FALSE(HasFatalFailure());
  local->fill(0, 0, 64, 47);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64)})), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  ASSERT_EQ(remote->post_recv(9, {sge(0, 64)}), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(remote->check(0, 0, 64, 47), -1);
}

// Toward a peer without the RFC 7306 extensions (a plain iWARP peer, as siw is), WRs that
// need them complete with IBV_WC_LOC_QP_OP_ERR and nothing reaches the peer.
TEST_F(XProc, ImmediateToPlainIwarpPeerIsLocQpOpErr) {
  g_child_env = {"SOFTVERBS_RFC7306=0"};  // the child is a plain iWARP peer
  Connect();
  g_child_env.clear();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(remote->post_recv(7, {sge(0, 64)}), 0);
  SendSpec s = make_send(1, {sge(0, 16)});
  s.opcode = IBV_WR_SEND_WITH_IMM;
  s.imm_or_inv = htonl(0x1234);
  ASSERT_EQ(local->post_send(s), 0);
  auto c = local->poll(CqSel::send, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, IBV_WC_LOC_QP_OP_ERR) << ibv_wc_status_str(c[0].status);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
}

// The peer process dies while 100 READs of 1 MiB are outstanding and 100 WRITEs of 1 MiB
// are queued behind them. Requirement: every WR completes within 2 s of the kill; in
// order, the ones not finished by then with an error (RETRY_EXC_ERR first, then flushes).
TEST_F(XProc, PeerKilledMidTransferFailsEveryOutstandingWrWithin2s) {
  PeerConfig lc;
  lc.max_send_wr = 256;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  constexpr uint64_t kReads = 100, kWrites = 100, kAll = kReads + kWrites;
  std::vector<SendSpec> chain;
  for (uint64_t i = 0; i < kReads; ++i)
    chain.push_back(make_rdma(IBV_WR_RDMA_READ, i, {sge(0, kMiB)}, ri.addr, ri.rkey));
  for (uint64_t i = 0; i < kWrites; ++i)
    chain.push_back(
        make_rdma(IBV_WR_RDMA_WRITE, kReads + i, {sge(kMiB, kMiB)}, ri.addr + kMiB, ri.rkey));
  ASSERT_EQ(local->post_send_chain(chain), 0);

  // Mid-transfer: the first READ has come back.
  std::vector<ibv_wc> wcs = local->poll(CqSel::send, 1);
  ASSERT_EQ(wcs.size(), 1u);
  ASSERT_TRUE(wc_is(wcs[0], 0, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
  // Freeze the peer first so the READs still outstanding stay outstanding, then kill it.
  ASSERT_EQ(kill(remote->pid(), SIGSTOP), 0);
  ASSERT_EQ(kill(remote->pid(), SIGKILL), 0);
  const auto t0 = Clock::now();
  remote->mark_dead();

  auto rest = local->poll(CqSel::send, kAll - 1, Ms(2000));
  const auto took = std::chrono::duration_cast<Ms>(Clock::now() - t0);
  wcs.insert(wcs.end(), rest.begin(), rest.end());
  ASSERT_EQ(wcs.size(), kAll) << "only " << wcs.size() << " of " << kAll
                              << " WRs completed within 2 s of the kill";
  EXPECT_LE(took.count(), 2000);
  size_t ok = 0;
  while (ok < wcs.size() && wcs[ok].status == IBV_WC_SUCCESS) ++ok;
  RecordProperty("succeeded_before_error", static_cast<int>(ok));
  RecordProperty("ms_kill_to_last_completion", static_cast<int>(took.count()));
  // At most the READs whose responses were already in the socket buffers succeed.
  EXPECT_LT(ok, kReads) << "every READ succeeded although the peer was frozen and killed";
  expect_error_then_flush(wcs, 0, kReads - 1, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
  ibv_async_event ev{};
  EXPECT_EQ(local->wait_async(kWait, &ev), IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, local->qp);
}

// The peer process dies while nothing is outstanding. Like an IB requester, the QP finds
// out when it next needs the peer: a READ posted afterwards fails with RETRY_EXC_ERR (at
// once if the connection loss was already seen, else when it is), and the QP goes to ERR,
// flushing the receive that was posted all along.
TEST_F(XProc, PeerKilledWhileIdleNextReadFailsWithRetryExc) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  // One exchange so the connection is known to be up.
  ASSERT_EQ(remote->post_recv(1, {sge(0, 64)}), 0);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 8)})), 0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  ASSERT_EQ(local->post_recv(2, {sge(0, 64)}), 0);

  ASSERT_EQ(kill(remote->pid(), SIGKILL), 0);
  remote->mark_dead();
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_READ, 3, {sge(4096, 64)}, ri.addr, ri.rkey)), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u) << "READ to a dead peer did not complete";
  EXPECT_TRUE(wc_is(s[0], 3, IBV_WC_RETRY_EXC_ERR));
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 2, IBV_WC_WR_FLUSH_ERR));
  ibv_async_event ev{};
  EXPECT_EQ(local->wait_async(kWait, &ev), IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, local->qp);
}

// A program that connects, posts and exits at once, polling nothing: ibv_modify_qp(RTS)
// returns before the TCP/MPA connection is set up, so at exit the sends are still ours.
// From a NIC they would be on the wire already; they must arrive here too.
TEST_F(XProc, SendsPostedJustBeforeExitStillArrive) {
  ASSERT_NO_FATAL_FAILURE(Create());
  constexpr uint32_t kN = 16, kLen = 4096;
  ASSERT_EQ(local->connect(ri), 0);
  for (uint32_t i = 0; i < kN; ++i)
    ASSERT_EQ(local->post_recv(100 + i, {sge(uint64_t{i} * kLen, kLen)}), 0);
  remote->fill(0, 0, uint64_t{kN} * kLen, 77);
  std::vector<SendSpec> chain;
  for (uint32_t i = 0; i < kN; ++i)
    chain.push_back(make_send(i, {sge(uint64_t{i} * kLen, kLen)}, 0));
  ASSERT_EQ(remote->connect_post_exit(li, chain), 0);
  auto r = local->poll(CqSel::recv, kN);
  ASSERT_EQ(r.size(), kN) << "sends posted just before exit() were lost";
  for (uint32_t i = 0; i < kN; ++i)
    EXPECT_TRUE(wc_is(r[i], 100 + i, IBV_WC_SUCCESS, IBV_WC_RECV)) << i;
  EXPECT_EQ(local->check(0, 0, uint64_t{kN} * kLen, 77), -1);
}

TEST_F(XProc, AsyncFdNonBlockingGivesEagainThenQpFatal) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const int fd = local->ctx->async_fd;
  const int fl = fcntl(fd, F_GETFL);
  ASSERT_GE(fl, 0);
  ASSERT_EQ(fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);
  ibv_async_event ev{};
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(local->ctx, &ev), -1);
  EXPECT_EQ(errno, EAGAIN);

  ASSERT_EQ(local->post_send(
                make_rdma(IBV_WR_RDMA_READ, 1, {sge(0, 64)}, ri.addr, ri.rkey ^ kBadKeyBits)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_REM_ACCESS_ERR));

  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, static_cast<int>(kWait.count())), 1) << "no async event";
  ASSERT_EQ(ibv_get_async_event(local->ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, local->qp);
  ibv_ack_async_event(&ev);
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(local->ctx, &ev), -1) << "one error, one event";
  EXPECT_EQ(errno, EAGAIN);
}

// As uverbs: a QP's events not yet retrieved die with it (ibv_get_async_event never hands
// out a freed QP), and ibv_destroy_qp waits for the ack of one that was retrieved.
void fatal_event_pending(Peer& local, const PeerInfo& ri) {
  const int fd = local.ctx->async_fd;
  ASSERT_EQ(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK), 0);
  ASSERT_EQ(
      local.post_send(make_rdma(IBV_WR_RDMA_READ, 1, {sge(0, 64)}, ri.addr, ri.rkey ^ kBadKeyBits)),
      0);
  ASSERT_EQ(local.poll(CqSel::send, 1).size(), 1u);
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, static_cast<int>(kWait.count())), 1) << "no async event";
}

TEST_F(XProc, DestroyingAQpDropsItsUnretrievedAsyncEvents) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(fatal_event_pending(*local, ri));
  ASSERT_EQ(ibv_destroy_qp(local->qp), 0);
  local->qp = nullptr;
  ibv_async_event ev{};
  errno = 0;
  EXPECT_EQ(ibv_get_async_event(local->ctx, &ev), -1) << "an event for a destroyed QP";
  EXPECT_EQ(errno, EAGAIN);
}

TEST_F(XProc, DestroyQpWaitsForTheAckOfARetrievedEvent) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(fatal_event_pending(*local, ri));
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(local->ctx, &ev), 0);
  ASSERT_EQ(ev.element.qp, local->qp);
  std::atomic<bool> done{false};
  std::thread t([&] {
    EXPECT_EQ(ibv_destroy_qp(local->qp), 0);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(done.load()) << "destroyed while its event was still held";
  ibv_ack_async_event(&ev);
  t.join();
  EXPECT_TRUE(done.load());
  local->qp = nullptr;
}

}  // namespace
}  // namespace mp
