// Shared receive queues across processes: a receive taken from an SRQ is checked against the
// SRQ's protection domain (the SRQ's WQEs belong to its PD, IB spec 10.2.9; rxe and siw check
// the SRQ's), not the PD of the QP that consumes it.
#include "harness.h"

namespace mp {
namespace {

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

}  // namespace
}  // namespace mp
