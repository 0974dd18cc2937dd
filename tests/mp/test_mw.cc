// Memory windows (IB spec 10.6.7), end to end: the window's owner is `local` (this process),
// the peer process uses its rkey as any remote application would. Type 1 windows are bound
// by ibv_bind_mw and unbound by a zero-length bind; type 2 windows are bound by a Bind WR
// (ibv_post_send or ibv_wr_bind_mw) and end with LOCAL_INV, the peer's Send with
// Invalidate, or deallocation. What a window refuses is the peer's IBV_WC_REM_ACCESS_ERR,
// as for a bad region rkey, on the WR that caused it (test_errors.cc's conventions).
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "harness.h"

namespace mp {
namespace {

constexpr int kBindable = kAllMrAccess | IBV_ACCESS_MW_BIND;
constexpr int kRemoteRw = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
constexpr uint64_t kLen = 64 * 1024;

// Deallocates the window at scope end unless a test did (and cleared it).
struct MwGuard {
  ibv_mw* mw = nullptr;
  ~MwGuard() {
    if (mw) ibv_dealloc_mw(mw);
  }
};

ibv_send_wr bind_wr(uint64_t wr_id, ibv_mw* mw, uint32_t rkey, ibv_mr* mr, uint64_t addr,
                    uint64_t len, unsigned access) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = rkey;
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.addr = addr;
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags = access;
  return wr;
}

ibv_send_wr local_inv_wr(uint64_t wr_id, uint32_t rkey) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = rkey;
  return wr;
}

int post(Peer& p, ibv_send_wr wr) {
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(p.qp, &wr, &bad);
}

// Expects one successful local completion of `opcode` for wr_id.
void expect_local_op(Peer& p, uint64_t wr_id, ibv_wc_opcode opcode) {
  auto s = p.poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], wr_id, IBV_WC_SUCCESS, opcode));
}

// Both processes ask for IB's completion rule (SOFTVERBS_IB_COMPLETION=1), as rdma-core's
// memory window tests assume: a WRITE's completion means it was placed, and a refused one
// fails itself.
class Mw : public IbCompletion {
 protected:
  // Connects, then registers a bindable region of kLen in the local peer, filled with `seed`.
  void SetUpWindowed(const PeerConfig& local_cfg = PeerConfig{}) {
    ASSERT_NO_FATAL_FAILURE(Connect(local_cfg));
    m = local->add_mr(kLen, kBindable);
    ASSERT_EQ(m.err, 0);
    mr = local->regions[m.index].mr;
    local->fill(m.index, 0, kLen, 501);
  }
  // Binds a type 2 window over [off, off+len) with a Bind WR; returns its new rkey.
  uint32_t bind_type2(MwGuard& g, uint64_t off, uint64_t len, unsigned access, uint64_t wr_id) {
    g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_2);
    EXPECT_NE(g.mw, nullptr) << strerror(errno);
    if (!g.mw) return 0;
    const uint32_t key = ibv_inc_rkey(g.mw->rkey);
    EXPECT_EQ(post(*local, bind_wr(wr_id, g.mw, key, mr, m.addr + off, len, access)), 0);
    expect_local_op(*local, wr_id, IBV_WC_BIND_MW);
    return key;
  }
  // The peer WRITEs 64 bytes at `addr` through `rkey`, with a READ behind it: the WRITE fails,
  // the READ is flushed and the region's bytes (refilled with 501 first) are unchanged.
  void expect_peer_write_refused(uint64_t addr, uint32_t rkey) {
    local->fill(m.index, 0, kLen, 501);
    remote->fill(0, 0, 64, 77);
    std::vector<SendSpec> chain = {
        make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 64)}, addr, rkey),
        make_rdma(IBV_WR_RDMA_READ, 2, {sge(4096, 8)}, m.addr, mr->rkey)};
    ASSERT_EQ(remote->post_send_chain(chain), 0);
    auto s = remote->poll(CqSel::send, chain.size());
    ASSERT_EQ(s.size(), chain.size());
    expect_error_then_flush(s, 1, 0, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
    ibv_async_event ev{};
    EXPECT_EQ(local->wait_async(kWait, &ev), IBV_EVENT_QP_ACCESS_ERR);
    EXPECT_EQ(local->check(m.index, 0, kLen, 501), -1) << "a refused write changed memory";
  }
  // The peer WRITEs `len` bytes of pattern `seed` at `addr` through `rkey`: it succeeds.
  void expect_peer_write_lands(uint64_t addr, uint32_t rkey, uint32_t len, uint32_t seed) {
    remote->fill(0, 0, len, seed);
    ASSERT_EQ(remote->post_send(make_rdma(IBV_WR_RDMA_WRITE, 50, {sge(0, len)}, addr, rkey)), 0);
    auto s = remote->poll(CqSel::send, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(wc_is(s[0], 50, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
    // With IB's completion rule the WRITE's completion means it is placed.
    EXPECT_EQ(local->check(m.index, addr - m.addr, len, seed), -1);
  }

  MrInfo m;
  ibv_mr* mr = nullptr;
};

TEST_F(Mw, DeviceAdvertisesWindowsAndAllocRefusesUnknownTypes) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ibv_device_attr a{};
  ASSERT_EQ(ibv_query_device(local->ctx, &a), 0);
  EXPECT_GT(a.max_mw, 0);
  EXPECT_TRUE(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW);
  EXPECT_TRUE(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B);
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(local->pd, static_cast<ibv_mw_type>(3)), nullptr);
  EXPECT_EQ(errno, EINVAL);
  MwGuard one, two;
  one.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_1);
  two.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_2);
  ASSERT_TRUE(one.mw && two.mw);
  EXPECT_EQ(one.mw->type, IBV_MW_TYPE_1);
  EXPECT_EQ(two.mw->pd, local->pd);
  EXPECT_NE(one.mw->rkey, two.mw->rkey);
  // A PD with windows is busy.
  ibv_pd* pd = ibv_alloc_pd(local->ctx);
  ASSERT_NE(pd, nullptr);
  ibv_mw* w = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  EXPECT_EQ(ibv_dealloc_mw(w), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

TEST_F(Mw, Type1WindowBoundWithIbvBindMwServesItsRange) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_1);
  ASSERT_NE(g.mw, nullptr);
  const uint32_t before = g.mw->rkey;
  ibv_mw_bind b{};
  b.wr_id = 1;
  b.send_flags = IBV_SEND_SIGNALED;
  b.bind_info = {mr, m.addr + 4096, 8192, kRemoteRw};
  ASSERT_EQ(ibv_bind_mw(local->qp, g.mw, &b), 0);
  EXPECT_EQ(g.mw->rkey, ibv_inc_rkey(before)) << "ibv_bind_mw gives the window its next key";
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 1, IBV_WC_BIND_MW));
  // The peer reads the window's bytes, then writes into it.
  ASSERT_EQ(
      remote->post_send(make_rdma(IBV_WR_RDMA_READ, 2, {sge(0, 8192)}, m.addr + 4096, g.mw->rkey)),
      0);
  auto s = remote->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
  EXPECT_EQ(remote->check(0, 0, 8192, 501, 4096), -1);
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_lands(m.addr + 8192, g.mw->rkey, 4096, 502));
  EXPECT_EQ(local->check(m.index, 4096, 4096, 501, 4096), -1) << "bytes before the write moved";
}

TEST_F(Mw, AccessOutsideAType1WindowIsRemAccessErr) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_1);
  ASSERT_NE(g.mw, nullptr);
  ibv_mw_bind b{};
  b.wr_id = 1;
  b.send_flags = IBV_SEND_SIGNALED;
  b.bind_info = {mr, m.addr + 4096, 8192, kRemoteRw};
  ASSERT_EQ(ibv_bind_mw(local->qp, g.mw, &b), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 1, IBV_WC_BIND_MW));
  // 8 bytes before the window: inside the region, outside the window.
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_refused(m.addr + 4096 - 8, g.mw->rkey));
}

// rdma-core's test_invalidate_mw_type1: a zero-length bind ends a type 1 window.
TEST_F(Mw, Type1WindowUnboundByAZeroLengthBindRefusesItsOldKey) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_1);
  ASSERT_NE(g.mw, nullptr);
  ibv_mw_bind b{};
  b.wr_id = 1;
  b.send_flags = IBV_SEND_SIGNALED;
  b.bind_info = {mr, m.addr, kLen, kRemoteRw};
  ASSERT_EQ(ibv_bind_mw(local->qp, g.mw, &b), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 1, IBV_WC_BIND_MW));
  const uint32_t bound = g.mw->rkey;
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_lands(m.addr, bound, 64, 503));
  b.wr_id = 2;
  b.bind_info = {mr, m.addr, 0, 0};
  ASSERT_EQ(ibv_bind_mw(local->qp, g.mw, &b), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 2, IBV_WC_BIND_MW));
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_refused(m.addr, bound));
}

// The former SendWithInv case: the invalidated key names a type 2 window the receiver bound,
// and after the Send the window is gone (rdma-core's test_mw_type2_invalidate_remote).
TEST_F(Mw, PeersSendWithInvalidateEndsAType2Window) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  const uint32_t key = bind_type2(g, 0, 32768, kRemoteRw, 1);
  ASSERT_NE(key, 0u);
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_lands(m.addr + 100, key, 1000, 504));

  const uint32_t len = 4095;
  ASSERT_EQ(local->post_recv(21, {sge(0, 8192)}), 0);
  remote->fill(0, 0, len, 301);
  SendSpec s = make_send(22, {sge(0, len)});
  s.opcode = IBV_WR_SEND_WITH_INV;
  s.imm_or_inv = key;
  ASSERT_EQ(remote->post_send(s), 0);
  auto sw = remote->poll(CqSel::send, 1);
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_TRUE(wc_is(sw[0], 22, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 21, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_FALSE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(r[0].invalidated_rkey, key);
  EXPECT_EQ(r[0].byte_len, len);
  EXPECT_EQ(local->check(0, 0, len, 301), -1);

  ASSERT_NO_FATAL_FAILURE(expect_peer_write_refused(m.addr + 100, key));
}

// A Send with Invalidate naming a region (not a window): the receiver cannot invalidate it
// (RFC 5040 §7.2 "STag cannot be invalidated"); its receive completes with
// IBV_WC_REM_INV_REQ_ERR, as on rxe and siw, and so does the sender's Send.
TEST_F(Mw, SendWithInvalidateOfARegionIsAnInvalidRequest) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  ASSERT_EQ(local->post_recv(21, {sge(0, 8192)}), 0);
  SendSpec s = make_send(1, {sge(0, 64)});
  s.opcode = IBV_WR_SEND_WITH_INV;
  s.imm_or_inv = mr->rkey;
  std::vector<SendSpec> chain = {s,
                                 make_rdma(IBV_WR_RDMA_READ, 2, {sge(4096, 8)}, m.addr, mr->rkey),
                                 make_send(3, {sge(0, 8)})};
  ASSERT_EQ(remote->post_send_chain(chain), 0);
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 21, IBV_WC_REM_INV_REQ_ERR));
  auto sw = remote->poll(CqSel::send, chain.size());
  ASSERT_EQ(sw.size(), chain.size());
  expect_error_then_flush(sw, 1, 0, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
  EXPECT_EQ(wait_state(*remote, IBV_QPS_ERR), IBV_QPS_ERR);
}

// rdma-core's test_mw_type2_invalidate_local, then a second bind of the same window.
TEST_F(Mw, LocalInvalidateEndsAType2WindowWhichCanBeBoundAgain) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  const uint32_t first = bind_type2(g, 0, 4096, kRemoteRw, 1);
  ASSERT_NE(first, 0u);
  ASSERT_EQ(post(*local, local_inv_wr(2, first)), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 2, IBV_WC_LOCAL_INV));
  // Free again: bound anew with the next key (ibv_mw.rkey still holds the first key's
  // index, which is all a bind needs).
  const uint32_t second = ibv_inc_rkey(first);
  ASSERT_EQ(post(*local, bind_wr(3, g.mw, second, mr, m.addr + 4096, 4096, kRemoteRw)), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 3, IBV_WC_BIND_MW));
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_lands(m.addr + 4096, second, 4096, 505));
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_refused(m.addr, first));
}

// rdma-core's test_mw_type2_invalidate_dealloc.
TEST_F(Mw, DeallocatingABoundWindowEndsIt) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  const uint32_t key = bind_type2(g, 0, 4096, kRemoteRw, 1);
  ASSERT_NE(key, 0u);
  EXPECT_EQ(ibv_dealloc_mw(g.mw), 0);
  g.mw = nullptr;
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_refused(m.addr, key));
}

// What a bind may not do completes it with IBV_WC_MW_BIND_ERR (rxe's checks, IB spec
// C10-72..75) and moves the QP to ERR: the WRs behind it are flushed, nothing is sent.
TEST_F(Mw, RefusedBindCompletesWithMwBindErrAndFlushesTheRest) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  const MrInfo plain = local->add_mr(4096, kAllMrAccess);  // no IBV_ACCESS_MW_BIND
  ASSERT_EQ(plain.err, 0);
  MwGuard g;
  g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_2);
  ASSERT_NE(g.mw, nullptr);
  ASSERT_EQ(remote->post_recv(9, {sge(0, 64)}), 0);
  ibv_send_wr wrs[3];
  wrs[0] = bind_wr(1, g.mw, ibv_inc_rkey(g.mw->rkey), local->regions[plain.index].mr, plain.addr,
                   4096, kRemoteRw);
  ibv_sge sg = local->to_sge(sge(0, 8));
  for (int i = 1; i < 3; ++i) {
    wrs[i] = ibv_send_wr{};
    wrs[i].wr_id = 1 + i;
    wrs[i].opcode = IBV_WR_SEND;
    wrs[i].send_flags = IBV_SEND_SIGNALED;
    wrs[i].sg_list = &sg;
    wrs[i].num_sge = 1;
  }
  wrs[0].next = &wrs[1];
  wrs[1].next = &wrs[2];
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(local->qp, wrs, &bad), 0);
  auto s = local->poll(CqSel::send, 3);
  ASSERT_EQ(s.size(), 3u);
  expect_error_then_flush(s, 1, 0, IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
  EXPECT_TRUE(remote->poll(CqSel::recv, 1, Ms(100)).empty()) << "a Send behind a failed bind left";
}

// C10-75: a window lies inside its region.
TEST_F(Mw, BindOutsideTheRegionIsMwBindErr) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_2);
  ASSERT_NE(g.mw, nullptr);
  ASSERT_EQ(post(*local,
                 bind_wr(1, g.mw, ibv_inc_rkey(g.mw->rkey), mr, m.addr + kLen - 8, 16, kRemoteRw)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_MW_BIND_ERR));
}

TEST_F(Mw, ArgumentsThatCannotBeCarriedAreRefusedAtPost) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g1, g2;
  g1.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_1);
  g2.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_2);
  ASSERT_TRUE(g1.mw && g2.mw);
  // No window, or a length with no region.
  EXPECT_EQ(post(*local, bind_wr(1, nullptr, 0, mr, m.addr, 64, kRemoteRw)), EINVAL);
  EXPECT_EQ(
      post(*local, bind_wr(1, g2.mw, ibv_inc_rkey(g2.mw->rkey), nullptr, m.addr, 64, kRemoteRw)),
      EINVAL);
  // ibv_bind_mw: a type 2 window (the inline verb), a zero based type 1 bind (ours).
  ibv_mw_bind b{};
  b.bind_info = {mr, m.addr, 64, kRemoteRw};
  EXPECT_EQ(ibv_bind_mw(local->qp, g2.mw, &b), EINVAL);
  const uint32_t before = g1.mw->rkey;
  b.bind_info.mw_access_flags = kRemoteRw | IBV_ACCESS_ZERO_BASED;
  EXPECT_EQ(ibv_bind_mw(local->qp, g1.mw, &b), EINVAL);
  EXPECT_EQ(g1.mw->rkey, before) << "a refused bind changed the key";
  // Nothing was posted: the QP is still usable.
  EXPECT_TRUE(local->poll(CqSel::send, 1, Ms(50)).empty());
  EXPECT_EQ(local->state(), IBV_QPS_RTS);
}

// IBA 10.6.7.2.6: a region with windows bound to it stays registered (rxe: EINVAL), and its
// memory or PD cannot be changed under them.
TEST_F(Mw, RegionWithABoundWindowCannotBeDeregistered) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  MwGuard g;
  const uint32_t key = bind_type2(g, 0, 4096, kRemoteRw, 1);
  ASSERT_NE(key, 0u);
  EXPECT_EQ(ibv_dereg_mr(mr), EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, local->ptr(0, 0), 4096, 0),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EINVAL);
  // Still registered and still serving the window.
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_lands(m.addr, key, 256, 506));
  ASSERT_EQ(post(*local, local_inv_wr(2, key)), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 2, IBV_WC_LOCAL_INV));
  EXPECT_EQ(ibv_dereg_mr(mr), 0) << "unbound: the region may go";
  local->regions[m.index].mr = nullptr;
}

// The ibv_wr_* API binds and invalidates as ibv_post_send does.
TEST_F(Mw, WrApiBindsAndInvalidatesWindows) {
  PeerConfig c;
  c.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed(c));
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(local->qp);
  ASSERT_NE(qx, nullptr);
  MwGuard g;
  g.mw = ibv_alloc_mw(local->pd, IBV_MW_TYPE_2);
  ASSERT_NE(g.mw, nullptr);
  const uint32_t key = ibv_inc_rkey(g.mw->rkey);
  const ibv_mw_bind_info info{mr, m.addr, 8192, kRemoteRw};
  ibv_wr_start(qx);
  qx->wr_id = 1;
  qx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_bind_mw(qx, g.mw, key, &info);
  ASSERT_EQ(ibv_wr_complete(qx), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 1, IBV_WC_BIND_MW));
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_lands(m.addr + 8, key, 512, 507));
  ibv_wr_start(qx);
  qx->wr_id = 2;
  ibv_wr_local_inv(qx, key);
  ASSERT_EQ(ibv_wr_complete(qx), 0);
  ASSERT_NO_FATAL_FAILURE(expect_local_op(*local, 2, IBV_WC_LOCAL_INV));
  ASSERT_NO_FATAL_FAILURE(expect_peer_write_refused(m.addr, key));
}

// LOCAL_INV of what it cannot invalidate (a region, a type 1 window): IBV_WC_LOC_QP_OP_ERR,
// as rxe completes a failed local invalidation.
TEST_F(Mw, LocalInvalidateOfARegionIsLocQpOpErr) {
  ASSERT_NO_FATAL_FAILURE(SetUpWindowed());
  ASSERT_EQ(post(*local, local_inv_wr(1, mr->rkey)), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_LOC_QP_OP_ERR));
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
}

}  // namespace
}  // namespace mp
