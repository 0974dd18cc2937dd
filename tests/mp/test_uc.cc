// UC QPs (IB's Unreliable Connected service) between two processes: Sends, Writes and their
// immediate forms arrive as on RC; Reads and Atomics are refused at post (EINVAL); a message
// the responder cannot place is dropped, as rxe's responder drops it (class D), and neither
// QP leaves RTS. A UC Send completes once it has left: UC has no acks.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "harness.h"

namespace mp {
namespace {

PeerConfig uc(uint8_t srq = 0) {
  PeerConfig c;
  c.qp_type = IBV_QPT_UC;
  c.srq = srq;
  return c;
}

constexpr uint64_t kMarkOff = 3u << 20;  // the word a marker Write lands in

class Uc : public XProc {
 protected:
  // Everything the local side sent before this has been taken in by the remote side: a UC
  // drop leaves no completion to wait for, but a Write behind it lands only after it.
  void Fence() {
    const uint64_t v = ++marks_;
    *reinterpret_cast<uint64_t*>(local->ptr(0, kMarkOff + 64)) = v;
    ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 900 + v, {sge(kMarkOff + 64, 8)},
                                         ri.addr + kMarkOff, ri.rkey)),
              0);
    ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
    const auto end = Clock::now() + kWait;
    while (remote->read_u64(0, kMarkOff) != v && Clock::now() < end)
      std::this_thread::sleep_for(Ms(1));
    ASSERT_EQ(remote->read_u64(0, kMarkOff), v) << "the marker Write never landed";
  }
  void ExpectBothInRts() {
    EXPECT_EQ(local->state(), IBV_QPS_RTS);
    EXPECT_EQ(remote->state(), IBV_QPS_RTS);
  }
  uint64_t marks_ = 0;
};

TEST_F(Uc, SendsWritesAndImmediatesArrive) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc()));
  local->fill(0, 0, 256 * 1024, 5);
  ASSERT_EQ(remote->post_recv(10, {sge(0, 128 * 1024)}), 0);
  ASSERT_EQ(remote->post_recv(11, {sge(128 * 1024, 4096)}), 0);
  ASSERT_EQ(remote->post_recv(12, {sge(132 * 1024, 4096)}), 0);
  SendSpec si = make_send(2, {sge(0, 100)});
  si.opcode = IBV_WR_SEND_WITH_IMM;
  si.imm_or_inv = htonl(0x1234);
  SendSpec wi =
      make_rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 4, {sge(0, 4096)}, ri.addr + (1u << 20), ri.rkey);
  wi.imm_or_inv = htonl(0x5678);
  ASSERT_EQ(local->post_send_chain({make_send(1, {sge(0, 100 * 1024)}), si,
                                    make_rdma(IBV_WR_RDMA_WRITE, 3, {sge(0, 200 * 1024)},
                                              ri.addr + (2u << 20), ri.rkey),
                                    wi}),
            0);
  auto s = local->poll(CqSel::send, 4);
  ASSERT_EQ(s.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(wc_is(s[i], i + 1, IBV_WC_SUCCESS));
  auto r = remote->poll(CqSel::recv, 3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_TRUE(wc_is(r[0], 10, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 100u * 1024);
  EXPECT_TRUE(wc_is(r[1], 11, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[1].byte_len, 100u);
  EXPECT_TRUE(r[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(r[1].imm_data, htonl(0x1234));
  EXPECT_TRUE(wc_is(r[2], 12, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM));
  EXPECT_EQ(r[2].imm_data, htonl(0x5678));
  EXPECT_EQ(remote->check(0, 0, 100 * 1024, 5), -1);
  EXPECT_EQ(remote->check(0, 128 * 1024, 100, 5), -1);
  EXPECT_EQ(remote->check(0, 2u << 20, 200 * 1024, 5), -1);
  EXPECT_EQ(remote->check(0, 1u << 20, 4096, 5), -1);
  ExpectBothInRts();
}

TEST_F(Uc, ReadsAndAtomicsAreRefusedAtPost) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc()));
  EXPECT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_READ, 1, {sge(0, 8)}, ri.addr, ri.rkey)),
            EINVAL);
  EXPECT_EQ(
      local->post_send(make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 2, sge(0, 8), ri.addr, ri.rkey, 1)),
      EINVAL);
  EXPECT_EQ(local->post_send(
                make_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 3, sge(0, 8), ri.addr, ri.rkey, 0, 1)),
            EINVAL);
  // Nothing was queued: the next Send is the only completion.
  ASSERT_EQ(remote->post_recv(1, {sge(0, 64)}), 0);
  ASSERT_EQ(local->post_send(make_send(4, {sge(0, 8)})), 0);
  auto s = local->poll(CqSel::send, 2, Ms(300));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 4, IBV_WC_SUCCESS));
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  ExpectBothInRts();
}

// No receive posted: the Send (several FPDUs long) is dropped, not waited for (RC's RNR);
// the next Send fills the next receive.
TEST_F(Uc, SendWithNoReceiveIsDropped) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc()));
  local->fill(0, 0, 64 * 1024, 1);
  local->fill(0, 64 * 1024, 64, 2);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 64 * 1024)})), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS)) << "a UC Send completes once it has left";
  ASSERT_NO_FATAL_FAILURE(Fence());
  ASSERT_EQ(remote->post_recv(7, {sge(0, 128 * 1024)}), 0);
  ASSERT_EQ(local->post_send(make_send(2, {sge(64 * 1024, 64)})), 0);
  auto r = remote->poll(CqSel::recv, 2, Ms(500));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 7, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 64u) << "the dropped Send filled the receive";
  EXPECT_EQ(remote->check(0, 0, 64, 2), -1);
  ExpectBothInRts();
}

// Longer than the receive: dropped, and the receive stays for the next Send (rxe class D1),
// on a QP's own receive queue and on an SRQ.
void too_long_keeps_the_receive(XProc& t, std::unique_ptr<Peer>& local,
                                std::unique_ptr<RemotePeer>& remote) {
  (void)t;
  local->fill(0, 0, 8192, 3);
  local->fill(0, 8192, 50, 4);
  ASSERT_EQ(remote->post_recv(5, {sge(0, 1000)}), 0);
  ASSERT_EQ(local->post_send_chain({make_send(1, {sge(0, 8192)}), make_send(2, {sge(8192, 50)})}),
            0);
  ASSERT_EQ(local->poll(CqSel::send, 2).size(), 2u);
  auto r = remote->poll(CqSel::recv, 2, Ms(500));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 5, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 50u);
  EXPECT_EQ(remote->check(0, 0, 50, 4), -1);
  EXPECT_EQ(local->state(), IBV_QPS_RTS);
  EXPECT_EQ(remote->state(), IBV_QPS_RTS);
}

TEST_F(Uc, SendLongerThanTheReceiveIsDroppedAndTheReceiveKept) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc()));
  too_long_keeps_the_receive(*this, local, remote);
}

TEST_F(Uc, SendLongerThanAnSrqReceiveIsDroppedAndTheReceiveKept) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc(1)));
  too_long_keeps_the_receive(*this, local, remote);
}

// A Write its target does not allow is dropped; memory is untouched and nobody errs. With
// immediate data, the immediate goes too: the receive it would have taken stays posted.
TEST_F(Uc, WriteTheTargetRefusesIsDroppedWithItsImmediate) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc()));
  const MrInfo ro = remote->add_mr(4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_EQ(ro.err, 0);
  remote->fill(ro.index, 0, 4096, 0x22);
  local->fill(0, 0, 4096, 9);
  ASSERT_EQ(remote->post_recv(8, {sge(0, 4096)}), 0);
  SendSpec wi = make_rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 2, {sge(0, 64)}, ri.addr + ri.len - 10,
                          ri.rkey);  // past the region's end
  wi.imm_or_inv = htonl(7);
  ASSERT_EQ(
      local->post_send_chain({make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 4096)}, ro.addr, ro.rkey), wi,
                              make_send(3, {sge(0, 32)})}),
      0);
  auto s = local->poll(CqSel::send, 3);
  ASSERT_EQ(s.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(wc_is(s[i], i + 1, IBV_WC_SUCCESS));
  auto r = remote->poll(CqSel::recv, 2, Ms(500));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 8, IBV_WC_SUCCESS, IBV_WC_RECV)) << "the dropped immediate was taken";
  EXPECT_EQ(r[0].byte_len, 32u);
  EXPECT_EQ(remote->check(ro.index, 0, 4096, 0x22), -1) << "a refused Write changed memory";
  ExpectBothInRts();
}

// Write with Immediate and no receive for the immediate: dropped whole; the next Send
// finds the receive posted after it.
TEST_F(Uc, WriteWithImmediateAndNoReceiveIsDropped) {
  ASSERT_NO_FATAL_FAILURE(Connect(uc(), uc()));
  local->fill(0, 0, 4096, 6);
  SendSpec wi =
      make_rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 1, {sge(0, 4096)}, ri.addr + (1u << 20), ri.rkey);
  wi.imm_or_inv = htonl(9);
  ASSERT_EQ(local->post_send(wi), 0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  ASSERT_NO_FATAL_FAILURE(Fence());
  ASSERT_EQ(remote->post_recv(4, {sge(0, 4096)}), 0);
  ASSERT_EQ(local->post_send(make_send(2, {sge(0, 16)})), 0);
  auto r = remote->poll(CqSel::recv, 2, Ms(500));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 4, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_FALSE(r[0].wc_flags & IBV_WC_WITH_IMM);
  ExpectBothInRts();
}

// The verbs' own checks: the ibv_wr_* API refuses Read and Atomic operations on UC at
// create time (EOPNOTSUPP), and RTR/RTS refuse RC's attributes (EINVAL, as
// ib_modify_qp_is_ok).
TEST(UcVerbs, CreateAndModifyFollowUcsColumns) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_TRUE(list && n > 0);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_TRUE(ctx);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && cq);
  ibv_qp_init_attr_ex ix{};
  ix.qp_type = IBV_QPT_UC;
  ix.send_cq = ix.recv_cq = cq;
  ix.cap.max_send_wr = ix.cap.max_recv_wr = 4;
  ix.cap.max_send_sge = ix.cap.max_recv_sge = 1;
  ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ix.pd = pd;
  ix.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx, &ix), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ix.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  ibv_qp* qp = ibv_create_qp_ex(ctx, &ix);
  ASSERT_TRUE(qp) << strerror(errno);
  EXPECT_EQ(qp->qp_type, IBV_QPT_UC);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(
      ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qp->qp_num;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid);
  const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  EXPECT_EQ(ibv_modify_qp(qp, &a, rtr | IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
  EXPECT_EQ(ibv_modify_qp(qp, &a, rtr | IBV_QP_MIN_RNR_TIMER), EINVAL);
  EXPECT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU), EINVAL);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT) << "a refused modify changed the state";
  EXPECT_EQ(qi.qp_type, IBV_QPT_UC);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

}  // namespace
}  // namespace mp
