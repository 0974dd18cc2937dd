// The ibv_wr_* work-request API (ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS):
// every RC opcode built in one batch and executed by the peer process, the batch's
// all-or-nothing rule, and what creation refuses.
#include <arpa/inet.h>

#include <cstring>

#include "harness.h"

namespace mp {
namespace {

constexpr uint64_t kAllRcOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                               IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                               IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                               IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

PeerConfig wr_api(uint32_t max_send_wr = 256) {
  PeerConfig c;
  c.send_ops_flags = kAllRcOps;
  c.max_inline_data = 64;
  c.max_send_wr = max_send_wr;
  return c;
}

uint64_t local_u64(Peer& p, uint64_t off) {
  uint64_t v;
  std::memcpy(&v, p.ptr(0, off), sizeof v);
  return v;
}

TEST_F(XProc, WrApiPostsEveryRcOpcodeAsOneBatch) {
  ASSERT_NO_FATAL_FAILURE(Connect(wr_api(), PeerConfig{}));
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(local->qp);
  ASSERT_NE(qx, nullptr);
  constexpr uint64_t kWrite = 512 * 1024, kRead = 768 * 1024, kImmWrite = 900 * 1024,
                     kAtomic = 2 * 1024 * 1024;
  local->fill(0, 0, 4096, 71);
  remote->fill(0, kRead, 256, 72);
  remote->write_u64(0, kAtomic, 10);
  for (uint64_t i = 0; i < 3; ++i) ASSERT_EQ(remote->post_recv(20 + i, {sge(i * 4096, 4096)}), 0);
  const uint32_t lkey = local->to_sge(sge(0, 1)).lkey;
  auto at = [&](uint64_t off) { return reinterpret_cast<uint64_t>(local->ptr(0, off)); };

  ibv_wr_start(qx);
  qx->wr_flags = IBV_SEND_SIGNALED;
  qx->wr_id = 1;
  ibv_wr_send(qx);
  ibv_wr_set_sge(qx, lkey, at(0), 100);
  qx->wr_id = 2;
  ibv_wr_send_imm(qx, htonl(7));
  char hello[] = "hello";
  ibv_wr_set_inline_data(qx, hello, 5);
  std::memcpy(hello, "XXXXX", 5);  // copied by the setter: the buffer is free again
  qx->wr_id = 3;
  ibv_wr_rdma_write(qx, ri.rkey, ri.addr + kWrite);
  const ibv_sge two[2] = {{at(0), 100, lkey}, {at(200), 100, lkey}};
  ibv_wr_set_sge_list(qx, 2, two);
  qx->wr_id = 4;
  ibv_wr_rdma_read(qx, ri.rkey, ri.addr + kRead);
  ibv_wr_set_sge(qx, lkey, at(64 * 1024), 256);
  qx->wr_id = 5;
  ibv_wr_atomic_fetch_add(qx, ri.rkey, ri.addr + kAtomic, 5);
  ibv_wr_set_sge(qx, lkey, at(128 * 1024), 8);
  qx->wr_id = 6;
  ibv_wr_atomic_cmp_swp(qx, ri.rkey, ri.addr + kAtomic, 15, 99);
  ibv_wr_set_sge(qx, lkey, at(128 * 1024 + 8), 8);
  qx->wr_id = 7;
  ibv_wr_rdma_write_imm(qx, ri.rkey, ri.addr + kImmWrite, htonl(9));
  ibv_wr_set_sge(qx, lkey, at(0), 64);
  ASSERT_EQ(ibv_wr_complete(qx), 0);

  auto s = local->poll(CqSel::send, 7);
  ASSERT_EQ(s.size(), 7u);
  const ibv_wc_opcode want[7] = {IBV_WC_SEND,      IBV_WC_SEND,      IBV_WC_RDMA_WRITE,
                                 IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD, IBV_WC_COMP_SWAP,
                                 IBV_WC_RDMA_WRITE};
  for (size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(s[i].wr_id, i + 1) << wc_str(s[i]);
    EXPECT_EQ(s[i].status, IBV_WC_SUCCESS) << wc_str(s[i]);
    EXPECT_EQ(s[i].opcode, want[i]) << wc_str(s[i]);
  }
  auto r = remote->poll(CqSel::recv, 3);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].byte_len, 100u);
  EXPECT_FALSE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(r[1].byte_len, 5u);
  EXPECT_EQ(ntohl(r[1].imm_data), 7u);
  EXPECT_EQ(r[2].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(r[2].imm_data), 9u);
  EXPECT_EQ(remote->check(0, 0, 100, 71), -1);  // the SEND
  auto inl = remote->read(0, 4096, 5);
  EXPECT_EQ(std::string(inl.begin(), inl.end()), "hello");
  EXPECT_EQ(remote->check(0, kWrite, 100, 71, 0), -1);  // the two SGEs, concatenated
  EXPECT_EQ(remote->check(0, kWrite + 100, 100, 71, 200), -1);
  EXPECT_EQ(remote->check(0, kImmWrite, 64, 71), -1);
  EXPECT_EQ(local->check(0, 64 * 1024, 256, 72), -1);  // the READ
  EXPECT_EQ(local_u64(*local, 128 * 1024), 10u);       // fetch_add saw 10 and left 15
  EXPECT_EQ(local_u64(*local, 128 * 1024 + 8), 15u);   // cmp_swp saw 15 and swapped
  EXPECT_EQ(remote->read_u64(0, kAtomic), 99u);
}

TEST_F(XProc, WrApiBatchIsAllOrNothing) {
  ASSERT_NO_FATAL_FAILURE(Connect(wr_api(4), PeerConfig{}));
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(local->qp);
  ASSERT_NE(qx, nullptr);
  const ibv_sge one = local->to_sge(sge(0, 8));
  auto send_one = [&](uint64_t id) {
    qx->wr_id = id;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(qx);
    ibv_wr_set_sge(qx, one.lkey, one.addr, one.length);
  };
  // A bad second WR: the first is not posted either.
  ibv_wr_start(qx);
  send_one(1);
  qx->wr_id = 2;
  ibv_wr_send(qx);
  std::vector<ibv_sge> many(local->cap.max_send_sge + 1, one);
  ibv_wr_set_sge_list(qx, many.size(), many.data());
  EXPECT_EQ(ibv_wr_complete(qx), EINVAL);
  // Inline data beyond max_inline_data; a setter with no WR; data set twice.
  std::vector<char> big(local->cap.max_inline_data + 1, 'b');
  ibv_wr_start(qx);
  ibv_wr_send(qx);
  ibv_wr_set_inline_data(qx, big.data(), big.size());
  EXPECT_EQ(ibv_wr_complete(qx), EINVAL);
  ibv_wr_start(qx);
  ibv_wr_set_sge(qx, one.lkey, one.addr, one.length);
  EXPECT_EQ(ibv_wr_complete(qx), EINVAL);
  ibv_wr_start(qx);
  send_one(3);
  ibv_wr_set_sge(qx, one.lkey, one.addr, one.length);
  EXPECT_EQ(ibv_wr_complete(qx), EINVAL);
  // More WRs than the send queue holds: ENOMEM, none queued.
  ibv_wr_start(qx);
  for (uint64_t i = 0; i <= local->cap.max_send_wr; ++i) send_one(100 + i);
  EXPECT_EQ(ibv_wr_complete(qx), ENOMEM);
  // Aborted: discarded.
  ibv_wr_start(qx);
  send_one(4);
  ibv_wr_abort(qx);
  EXPECT_TRUE(local->poll(CqSel::send, 1, Ms(200)).empty()) << "a failed batch posted work";
  // The QP is fine: a good batch goes through, and only it completes.
  ASSERT_EQ(remote->post_recv(30, {sge(0, 64)}), 0);
  ibv_wr_start(qx);
  send_one(5);
  ASSERT_EQ(ibv_wr_complete(qx), 0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wr_id, 5u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
}

TEST(QpEx, CreationRefusesWhatItCannotDoAndPlainQpsHaveNoWrApi) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_GE(n, 1);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && cq);
  auto make = [&](uint32_t comp_mask, uint64_t ops, ibv_pd* p = nullptr, uint32_t flags = 0) {
    ibv_qp_init_attr_ex a{};
    a.create_flags = flags;
    a.send_cq = a.recv_cq = cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.qp_type = IBV_QPT_RC;
    a.comp_mask = comp_mask;
    a.pd = p ? p : pd;
    a.send_ops_flags = ops;
    errno = 0;
    return ibv_create_qp_ex(ctx, &a);
  };
  const uint32_t ex = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  EXPECT_EQ(make(ex, IBV_QP_EX_WITH_TSO), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(make(ex, IBV_QP_EX_WITH_ATOMIC_WRITE), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  // Create flags: none is no request (taken); any flag is refused, as rxe refuses them.
  EXPECT_EQ(make(ex | IBV_QP_INIT_ATTR_CREATE_FLAGS, IBV_QP_EX_WITH_SEND, nullptr,
                 IBV_QP_CREATE_BLOCK_SELF_MCAST_LB),
            nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ibv_qp* no_flags = make(ex | IBV_QP_INIT_ATTR_CREATE_FLAGS, IBV_QP_EX_WITH_SEND);
  ASSERT_NE(no_flags, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_destroy_qp(no_flags), 0);
  EXPECT_EQ(make(IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, IBV_QP_EX_WITH_SEND), nullptr);  // no PD
  EXPECT_EQ(errno, EINVAL);
  ibv_qp* plain = make(IBV_QP_INIT_ATTR_PD, 0);
  ASSERT_NE(plain, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_qp_to_qp_ex(plain), nullptr);
  ibv_qp* wr = make(ex, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
  ASSERT_NE(wr, nullptr) << strerror(errno);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(wr);
  ASSERT_NE(qx, nullptr);
  EXPECT_EQ(ibv_qp_to_qp_ex(&qx->qp_base), qx);
  // Posting on a QP still in RESET fails the batch, as ibv_post_send does.
  ibv_wr_start(qx);
  ibv_wr_send(qx);
  ibv_wr_set_sge(qx, 0, 0, 0);
  EXPECT_EQ(ibv_wr_complete(qx), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(wr), 0);
  EXPECT_EQ(ibv_destroy_qp(plain), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
}  // namespace mp
