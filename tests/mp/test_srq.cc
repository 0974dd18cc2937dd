// Shared receive queues across processes: a receive taken from an SRQ is checked against the
// SRQ's protection domain (the SRQ's WQEs belong to its PD, IB spec 10.2.9; rxe and siw check
// the SRQ's), not the PD of the QP that consumes it.
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "harness.h"
#include "softverbs/verbs_ext.h"
#include "wire/stats_file.h"

namespace mp {
namespace {

// Our QP, on an SRQ of 4 receives, its first receive (1 MiB) half filled by a Send: our own
// fault rule stops our reading at the third frame that comes in (SOFTVERBS_FAULT,
// docs/fault-injection.md; read when this process opens the device, and ctest runs each
// test in a process of its own). The peer runs without it.
class XProcSrq : public XProc {
 protected:
  void HalfInOnAnSrq();
};

void XProcSrq::HalfInOnAnSrq() {
  PeerConfig with_srq;
  with_srq.srq = 1;
  with_srq.max_recv_wr = 4;  // the SRQ's max_wr
  setenv("SOFTVERBS_FAULT", "stall:ms=20000,after=3,count=1,dir=rx", 1);
  g_child_env = {"SOFTVERBS_FAULT=seed=1"};
  Connect(with_srq, PeerConfig{});
  g_child_env.clear();
  unsetenv("SOFTVERBS_FAULT");
  ASSERT_FALSE(HasFatalFailure());
  constexpr uint32_t kLen = 1u << 20;  // 16 FPDUs or more
  ASSERT_EQ(local->post_recv(7, {sge(0, kLen)}), 0);
  for (uint64_t id = 8; id < 11; ++id) ASSERT_EQ(local->post_recv(id, {sge(kLen, 64)}), 0);
  ASSERT_EQ(remote->post_send(make_send(1, {sge(0, kLen)})), 0);
  // Its first segments placed, the rest held back by our stall.
  uint64_t pkts = 0;
  for (int i = 0; i < 2000 && pkts == 0; ++i) {
    std::this_thread::sleep_for(Ms(5));
    pkts = qp_counter(getpid(), local->qp->qp_num, sv::wire::Ctr::rcvd_pkts);
    if (pkts == ~0ull) pkts = 0;  // not published yet
  }
  ASSERT_GT(pkts, 0u) << "nothing of the Send arrived";
  ASSERT_EQ(qp_counter(getpid(), local->qp->qp_num, sv::wire::Ctr::rcvd_sends), 0u)
      << "the whole Send arrived: our stall did not hold it";
}

// Failed, the QP completes the receive it took with a flush error (IB spec 10.2.9.5; rxe
// flushes the WQE in progress), so the buffer comes back to its owner; the SRQ keeps the
// rest. It was lost: no completion ever came for it.
TEST_F(XProcSrq, ASendHalfInWhenTheQpFailsGivesItsSrqReceiveBackFlushed) {
  ASSERT_NO_FATAL_FAILURE(HalfInOnAnSrq());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u) << "the SRQ receive the QP had taken never completed";
  EXPECT_TRUE(wc_is(r[0], 7, IBV_WC_WR_FLUSH_ERR)) << wc_str(r[0]);
  EXPECT_TRUE(local->poll(CqSel::recv, 1, Ms(200)).empty()) << "the SRQ's own receives completed";
}

// Reset before the application polled, the receive the QP had taken is not lost: either its
// flush completion stays in the CQ (the buffer belongs to the SRQ, not to the QP being
// reset; rxe never cleans a CQ) or, if RESET came before the flush, it went back to the SRQ
// (mlx5 hands a cleaned SRQ WQE back). RESET used to drop the flush with the QP's other
// completions: no completion, and the SRQ one short.
TEST_F(XProcSrq, ResetAfterTheFlushLosesNoSrqReceive) {
  ASSERT_NO_FATAL_FAILURE(HalfInOnAnSrq());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  // The flush is made on the progress thread: give it the time to land, the case RESET broke.
  std::this_thread::sleep_for(Ms(200));
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  auto r = local->poll(CqSel::recv, 1, Ms(200));
  if (r.size() == 1) {
    EXPECT_TRUE(wc_is(r[0], 7, IBV_WC_WR_FLUSH_ERR)) << wc_str(r[0]);
    EXPECT_EQ(local->post_recv(11, {sge(1u << 20, 64)}), 0) << "the SRQ is full with 3 of 4";
  } else {
    EXPECT_EQ(local->post_recv(11, {sge(1u << 20, 64)}), ENOMEM)
        << "RESET dropped the SRQ receive: no completion, and it is not back in the SRQ";
  }
  EXPECT_TRUE(local->poll(CqSel::recv, 1, Ms(200)).empty()) << "the SRQ's own receives completed";
}

// Destroyed, the QP completes nothing (IB spec 10.3.1): the receive it took goes back to the
// SRQ, as mlx5 returns it. The SRQ is full again (4 of 4): one more post is ENOMEM. It was
// lost, and the post went in.
TEST_F(XProcSrq, ASendHalfInWhenTheQpIsDestroyedPutsItsSrqReceiveBack) {
  ASSERT_NO_FATAL_FAILURE(HalfInOnAnSrq());
  ASSERT_EQ(ibv_destroy_qp(local->qp), 0);
  local->qp = nullptr;
  EXPECT_EQ(local->post_recv(11, {sge(1u << 20, 64)}), ENOMEM)
      << "the receive the destroyed QP had taken did not go back to the SRQ";
  EXPECT_TRUE(local->poll(CqSel::recv, 1, Ms(200)).empty()) << "a destroyed QP completed";
}

PeerConfig srq_on_own_pd() {
  PeerConfig c;
  c.srq = 2;
  return c;
}

TEST_F(XProc, SrqReceiveIsCheckedAgainstTheSrqsPd) {
  ASSERT_NO_FATAL_FAILURE(Connect(PeerConfig{}, srq_on_own_pd()));
  // The main buffer is registered on the SRQ's PD, not the QP's.
  ASSERT_EQ(remote->post_recv(1, {sge(0, 4096)}), 0);
  local->fill(0, 0, 3000, 77);
  ASSERT_EQ(local->post_send(make_send(2, {sge(0, 3000)})), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)) << wc_str(r[0]);
  EXPECT_EQ(r[0].byte_len, 3000u);
  EXPECT_EQ(r[0].qp_num, ri.qpn);
  EXPECT_EQ(remote->check(0, 0, 3000, 77), -1);
}

TEST_F(XProc, SrqReceiveIntoAnMrOfTheQpsPdIsLocProtErr) {
  ASSERT_NO_FATAL_FAILURE(Connect(PeerConfig{}, srq_on_own_pd()));
  const MrInfo other = remote->add_mr(4096, kAllMrAccess);  // the QP's PD, not the SRQ's
  ASSERT_EQ(other.err, 0);
  ASSERT_EQ(remote->post_recv(1, {sge(0, 64, static_cast<uint32_t>(other.index))}), 0);
  ASSERT_EQ(local->post_send(make_send(2, {sge(0, 64)})), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_LOC_PROT_ERR)) << wc_str(r[0]);
}

// Pages of [off, off + len) of the main buffer that are resident (mincore).
int resident_pages(Peer& p, uint64_t off, uint64_t len) {
  std::vector<unsigned char> v((len + 4095) / 4096);
  if (mincore(p.ptr(0, off), len, v.data()) != 0) return -1;
  int n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// softverbs_srq_trim (verbs_ext.h): an idle receive pool gives its memory back (RDS's pool,
// grown for a burst). The pages wholly inside the buffers still posted go, adjacent buffers'
// shared page too; a page partly outside every buffer, memory not posted, and a buffer whose
// lkey the SRQ's PD does not know keep their bytes. The buffers stay posted and take a
// message intact afterwards.
TEST_F(XProc, SrqTrimGivesBackOnlyThePagesOfPostedBuffers) {
  PeerConfig with_srq;
  with_srq.srq = 1;
  ASSERT_NO_FATAL_FAILURE(Connect(with_srq, PeerConfig{}));
  constexpr uint64_t kPage = 4096;
  ASSERT_EQ(sysconf(_SC_PAGESIZE), static_cast<long>(kPage));
  local->fill(0, 0, 1u << 20, 5);  // every page resident, with a pattern
  // A: [100, 3 pages + 100): alone it holds pages 1-2 (page 0 and 3 are shared).
  ASSERT_EQ(local->post_recv(1, {sge(100, 3 * kPage)}), 0);
  // B, right after A, to 8 pages: the pair holds pages 1-7 (page 3 is now wholly posted).
  ASSERT_EQ(local->post_recv(2, {sge(3 * kPage + 100, 5 * kPage - 100)}), 0);
  // C: pages 16-17 under a key nobody registered: left alone.
  SgeSpec bad = sge(16 * kPage, 2 * kPage);
  bad.lkey_override = 0x7777;
  ASSERT_EQ(local->post_recv(3, &bad, 1), 0);
  // D: page 32 exactly.
  ASSERT_EQ(local->post_recv(4, {sge(32 * kPage, kPage)}), 0);

  EXPECT_EQ(softverbs_srq_trim(local->srq), static_cast<long>(8 * kPage));
  EXPECT_EQ(resident_pages(*local, kPage, 7 * kPage), 0) << "A and B's pages were not given back";
  EXPECT_EQ(resident_pages(*local, 32 * kPage, kPage), 0) << "D's page was not given back";
  EXPECT_EQ(resident_pages(*local, 0, kPage), 1) << "page 0 is only partly A's";
  EXPECT_EQ(local->check(0, 0, 100, 5), -1) << "the bytes before A, on its first page";
  EXPECT_EQ(local->check(0, 8 * kPage, 8 * kPage, 5, 8 * kPage), -1) << "memory not posted";
  EXPECT_EQ(local->check(0, 16 * kPage, 2 * kPage, 5, 16 * kPage), -1) << "C, of an unknown key";
  EXPECT_EQ(local->check(0, 33 * kPage, kPage, 5, 33 * kPage), -1) << "the page after D";
  for (uint64_t i = kPage; i < 8 * kPage; ++i) ASSERT_EQ(*local->ptr(0, i), 0) << "at " << i;

  // A takes a Send of 10,000 bytes (a page comes back under it), intact.
  remote->fill(0, 0, 10000, 9);
  ASSERT_EQ(remote->post_send(make_send(7, {sge(0, 10000)})), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV)) << wc_str(r[0]);
  EXPECT_EQ(r[0].byte_len, 10000u);
  EXPECT_EQ(local->check(0, 100, 10000, 9), -1);
  // A is taken: a second trim gives back only B's and D's own pages (page 3 is A's too).
  EXPECT_EQ(softverbs_srq_trim(local->srq), static_cast<long>(5 * kPage));
}

TEST(SrqTrim, AnInvalidSrqIsEinval) {
  errno = 0;
  EXPECT_EQ(softverbs_srq_trim(nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  ibv_srq fake{};
  errno = 0;
  EXPECT_EQ(softverbs_srq_trim(&fake), -1);
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
}  // namespace mp
