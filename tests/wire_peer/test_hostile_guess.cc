// Guessing STags: each wrong guess costs the guesser its connection (Terminate, QP error),
// and after a burst its address must wait before it may connect again
// (engine/peer_guard.h); another address is not held back. Its own binary: the guard's
// limits are read once per process, and here they are small.
#include "fake_peer.h"

using namespace wire_peer;

namespace {
// 3 protection errors from one address, then one every 2 s.
const bool g_guard_env = setenv("SOFTVERBS_PROT_ERR_BURST", "3", 1) == 0 &&
                         setenv("SOFTVERBS_PROT_ERR_PER_SEC", "0.5", 1) == 0;
}  // namespace

TEST(HostileGuess, RepeatedProtectionErrorsFromOneAddressAreRateLimited) {
  ASSERT_TRUE(g_guard_env);
  for (int i = 0; i < 3; ++i) {
    Local l;
    FakePeer p(l.qp->qp_num);
    ASSERT_TRUE(p.accepted) << "guess " << i;
    std::vector<std::byte> w(kDdpTaggedHdrLen + 8, std::byte{0x5a});
    encode_tagged(w.data(), RdmapOpcode::rdma_write, true, l.mr->rkey ^ 0x5500, 0);
    p.send_fpdu(w);
    Terminate t;
    ASSERT_TRUE(p.read_terminate(t));
    EXPECT_EQ(t.layer, TermLayer::ddp);
    ASSERT_TRUE(l.wait_state(IBV_QPS_ERR));
  }
  {
    Local l;
    FakePeer p(l.qp->qp_num, "127.0.0.1", false);
    EXPECT_FALSE(p.accepted) << "a fourth guess at once was let in";
    FakePeer other(l.qp->qp_num, "127.0.0.2", false);
    EXPECT_TRUE(other.accepted) << "another address was held back";
  }
  // One more try is earned every 2 s.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  Local l;
  FakePeer p(l.qp->qp_num, "127.0.0.1", false);
  EXPECT_TRUE(p.accepted) << "still refused after the refill";
}
