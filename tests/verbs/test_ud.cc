// UD queue pairs through the public verbs API: two UD QPs of this process exchange real
// UDP datagrams over loopback, and an echo peer in another process (this binary re-run with
// --ud-echo) answers through the AH it makes from each receive. ibv_ud_pingpong and udaddy
// run in tests/tools/unmodified_binaries.sh. A raw UDP socket plays the hostile sender.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "wire/ud.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kQkey = 0x11111111;
constexpr size_t kGrh = 40;
constexpr size_t kBuf = 1 << 20;
#ifdef SV_TEST_SLOW
constexpr auto kWait = std::chrono::seconds(30);
#else
constexpr auto kWait = std::chrono::seconds(5);
#endif
// Long enough for a datagram sent over loopback to have arrived had it been delivered.
constexpr auto kSettle = std::chrono::milliseconds(100);

struct UdQp {
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
};

class Ud : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_TRUE(list && n > 0);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx, nullptr);
    pd = ibv_alloc_pd(ctx);
    ASSERT_NE(pd, nullptr);
    buf.assign(kBuf, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
    ASSERT_NO_FATAL_FAILURE(make(a));
    ASSERT_NO_FATAL_FAILURE(make(b));
    ibv_ah_attr at{};
    at.is_global = 1;
    at.grh.dgid = gid;
    at.grh.hop_limit = 1;
    at.port_num = 1;
    ah = ibv_create_ah(pd, &at);
    ASSERT_NE(ah, nullptr);
  }
  void TearDown() override {
    if (ah) ibv_destroy_ah(ah);
    for (UdQp* q : {&a, &b}) {
      if (q->qp) {
        EXPECT_EQ(ibv_destroy_qp(q->qp), 0);
      }
      if (q->scq) ibv_destroy_cq(q->scq);
      if (q->rcq) ibv_destroy_cq(q->rcq);
    }
    if (srq) ibv_destroy_srq(srq);
    if (mr) ibv_dereg_mr(mr);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }

  void make(UdQp& q, ibv_srq* with_srq = nullptr, bool to_rts = true) {
    q.scq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    q.rcq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    ASSERT_TRUE(q.scq && q.rcq);
    ibv_qp_init_attr ia{};
    ia.send_cq = q.scq;
    ia.recv_cq = q.rcq;
    ia.srq = with_srq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = 2;
    ia.cap.max_recv_sge = 2;
    ia.cap.max_inline_data = 64;
    q.qp = ibv_create_qp(pd, &ia);
    ASSERT_NE(q.qp, nullptr) << strerror(errno);
    EXPECT_EQ(q.qp->qp_type, IBV_QPT_UD);
    EXPECT_EQ(q.qp->qp_num & 0xFF, 0xFFu);
    ASSERT_EQ(to_init(q.qp), 0);
    if (to_rts) {
      ASSERT_NO_FATAL_FAILURE(rtr_rts(q.qp));
    }
  }
  static int to_init(ibv_qp* qp, uint32_t qkey = kQkey) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.pkey_index = 0;
    at.port_num = 1;
    at.qkey = qkey;
    return ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  }
  static void rtr_rts(ibv_qp* qp) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(qp, &at, IBV_QP_STATE), 0);
    at.qp_state = IBV_QPS_RTS;
    at.sq_psn = 7;
    ASSERT_EQ(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }

  uint8_t* at(size_t off) { return buf.data() + off; }
  // One receive of [off, off+len) of the buffer, to a QP or (qp null) to the SRQ.
  int post_recv(ibv_qp* qp, uint64_t id, size_t off, uint32_t len) {
    ibv_sge s{reinterpret_cast<uint64_t>(at(off)), len, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return qp ? ibv_post_recv(qp, &wr, &bad) : ibv_post_srq_recv(srq, &wr, &bad);
  }
  struct Send {
    uint64_t id = 0;
    size_t off = 0;
    uint32_t len = 0;
    uint32_t qkey = kQkey;
    ibv_wr_opcode op = IBV_WR_SEND;
    uint32_t imm_be = 0;
    unsigned flags = IBV_SEND_SIGNALED;
    uint32_t lkey = 0;  // 0: the MR's
  };
  int post_send(ibv_qp* from, uint32_t to_qpn, const Send& s, ibv_ah* via = nullptr) {
    ibv_sge sg{reinterpret_cast<uint64_t>(at(s.off)), s.len, s.lkey ? s.lkey : mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = s.id;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.opcode = s.op;
    wr.send_flags = s.flags;
    wr.imm_data = s.imm_be;
    wr.wr.ud.ah = via ? via : ah;
    wr.wr.ud.remote_qpn = to_qpn;
    wr.wr.ud.remote_qkey = s.qkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(from, &wr, &bad);
  }
  // Polls until n completions or the deadline (a hang guard, not a pass criterion).
  std::vector<ibv_wc> poll(ibv_cq* cq, size_t n, Clock::duration wait = kWait) {
    std::vector<ibv_wc> out;
    const auto end = Clock::now() + wait;
    while (out.size() < n && Clock::now() < end) {
      ibv_wc wc;
      const int r = ibv_poll_cq(cq, 1, &wc);
      if (r < 0) break;
      if (r == 1)
        out.push_back(wc);
      else
        std::this_thread::yield();
    }
    return out;
  }
  // Nothing arrives within kSettle.
  bool quiet(ibv_cq* cq) { return poll(cq, 1, kSettle).empty(); }
  ibv_qp_state state(ibv_qp* qp) {
    ibv_qp_attr at{};
    ibv_qp_init_attr ia{};
    ibv_query_qp(qp, &at, IBV_QP_STATE, &ia);
    return at.qp_state;
  }
  void fill(size_t off, size_t len, uint8_t seed) {
    for (size_t i = 0; i < len; ++i) buf[off + i] = static_cast<uint8_t>(seed + i * 7);
  }
  bool same(size_t off, size_t len, uint8_t seed) {
    for (size_t i = 0; i < len; ++i)
      if (buf[off + i] != static_cast<uint8_t>(seed + i * 7)) return false;
    return true;
  }

  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_mr* mr = nullptr;
  ibv_srq* srq = nullptr;
  ibv_gid gid{};
  ibv_ah* ah = nullptr;
  std::vector<uint8_t> buf;
  UdQp a, b;
};

TEST_F(Ud, SendLandsAfterAGrhWithTheSendersQpn) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 4096 + kGrh), 0);
  fill(0, 1000, 3);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 9, .off = 0, .len = 1000}), 0);
  auto s = poll(a.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(s[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(s[0].wr_id, 9u);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(r[0].status);
  EXPECT_EQ(r[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(r[0].wr_id, 1u);
  EXPECT_EQ(r[0].byte_len, 1000 + kGrh);
  EXPECT_EQ(r[0].qp_num, b.qp->qp_num);
  EXPECT_EQ(r[0].src_qp, a.qp->qp_num);
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_GRH);
  EXPECT_FALSE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(r[0].sl, 2);  // mlx5's "IPv4 header in the GRH", which UCX reads
  EXPECT_TRUE(same(0x10000 + kGrh, 1000, 3));
  // RoCEv2 over IPv4, as rxe writes it: 20 zero bytes, then an IPv4 header 127.0.0.1 ->
  // 127.0.0.1 (SOFTVERBS_NETDEV=lo).
  const uint8_t* g = at(0x10000);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(g[i], 0) << i;
  EXPECT_EQ(g[20], 0x45);
  const uint8_t lo[4] = {127, 0, 0, 1};
  EXPECT_EQ(0, memcmp(g + 32, lo, 4));
  EXPECT_EQ(0, memcmp(g + 36, lo, 4));
}

TEST_F(Ud, ImmediateSolicitedAndInlineSends) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 256), 0);
  ASSERT_EQ(post_recv(b.qp, 2, 0x20000, 256), 0);
  fill(0, 48, 11);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num,
                      {.id = 1, .off = 0, .len = 48, .flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE}),
            0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num,
                      {.id = 2,
                       .off = 0,
                       .len = 0,
                       .op = IBV_WR_SEND_WITH_IMM,
                       .imm_be = htonl(0xC0FFEE),
                       .flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED}),
            0);
  auto r = poll(b.rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].byte_len, 48 + kGrh);
  EXPECT_TRUE(same(0x10000 + kGrh, 48, 11));
  EXPECT_EQ(r[1].byte_len, kGrh);
  EXPECT_TRUE(r[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r[1].imm_data), 0xC0FFEEu);
  EXPECT_EQ(poll(a.scq, 2).size(), 2u);
}

TEST_F(Ud, AnswerThroughTheAhMadeFromTheReceive) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 256), 0);
  ASSERT_EQ(post_recv(a.qp, 2, 0x20000, 256), 0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 16}), 0);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  ibv_ah_attr attr{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx, 1, &r[0], reinterpret_cast<ibv_grh*>(at(0x10000)), &attr), 0);
  EXPECT_EQ(attr.is_global, 1);
  EXPECT_EQ(0, memcmp(attr.grh.dgid.raw, gid.raw, 16));
  EXPECT_EQ(attr.grh.sgid_index, 0);
  ibv_ah* back = ibv_create_ah_from_wc(pd, &r[0], reinterpret_cast<ibv_grh*>(at(0x10000)), 1);
  ASSERT_NE(back, nullptr);
  fill(0x30000, 77, 5);
  ASSERT_EQ(post_send(b.qp, r[0].src_qp, {.id = 3, .off = 0x30000, .len = 77}, back), 0);
  auto r2 = poll(a.rcq, 1);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r2[0].src_qp, b.qp->qp_num);
  EXPECT_TRUE(same(0x20000 + kGrh, 77, 5));
  EXPECT_EQ(poll(b.scq, 1).size(), 1u);
  EXPECT_EQ(ibv_destroy_ah(back), 0);
  // No GRH flag: an Ethernet port cannot make an AH from it.
  r[0].wc_flags &= ~IBV_WC_GRH;
  EXPECT_NE(ibv_init_ah_from_wc(ctx, 1, &r[0], reinterpret_cast<ibv_grh*>(at(0x10000)), &attr), 0);
}

TEST_F(Ud, WrongQkeyIsDroppedAndTheHighBitMeansTheQpsOwn) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 256), 0);
  ASSERT_EQ(post_recv(b.qp, 2, 0x20000, 256), 0);
  fill(0, 32, 1);
  fill(0x100, 32, 2);
  fill(0x200, 32, 3);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 32, .qkey = 0x22222222}), 0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 2, .off = 0x100, .len = 32}), 0);
  // C10-15: high-order bit set -> the sending QP's Q_Key (also kQkey) is used.
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 3, .off = 0x200, .len = 32, .qkey = 0x80000000}),
            0);
  auto s = poll(a.scq, 3);
  ASSERT_EQ(s.size(), 3u);
  for (auto& w : s) EXPECT_EQ(w.status, IBV_WC_SUCCESS);  // UD: the sender never knows
  auto r = poll(b.rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(same(0x10000 + kGrh, 32, 2));  // the first receive got the second send
  EXPECT_TRUE(same(0x20000 + kGrh, 32, 3));
  EXPECT_EQ(state(b.qp), IBV_QPS_RTS);
}

TEST_F(Ud, LargerThanTheMtuCompletesAndSendsNothing) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 8192 + kGrh), 0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 4097}), 0);
  auto s = poll(a.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);  // C10-93.1.1: no packet, no error
  EXPECT_TRUE(quiet(b.rcq));
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 2, .off = 0, .len = 4096}), 0);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].byte_len, 4096 + kGrh);
}

TEST_F(Ud, TooSmallAReceiveIsLocLenErrAndErrorsTheQp) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, kGrh + 10), 0);
  ASSERT_EQ(post_recv(b.qp, 2, 0x20000, 256), 0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 11}), 0);
  auto r = poll(b.rcq, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].wr_id, 1u);
  EXPECT_EQ(r[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(r[1].wr_id, 2u);
  EXPECT_EQ(r[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(state(b.qp), IBV_QPS_ERR);
}

TEST_F(Ud, BadLkeyOnASendIsLocProtErrAndErrorsTheQp) {
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 64, .lkey = mr->lkey ^ 0x100}),
            0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 2, .off = 0, .len = 64}), 0);
  auto s = poll(a.scq, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].wr_id, 1u);
  EXPECT_EQ(s[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(s[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(state(a.qp), IBV_QPS_ERR);
  ibv_async_event ev;
  ASSERT_EQ(ibv_get_async_event(ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a.qp);
  ibv_ack_async_event(&ev);
}

TEST_F(Ud, BadReceiveBufferIsLocProtErr) {
  ibv_sge sg{reinterpret_cast<uint64_t>(at(0x10000)), 256, mr->lkey ^ 0x100};
  ibv_recv_wr wr{};
  wr.wr_id = 5;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(b.qp, &wr, &bad), 0);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 8}), 0);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(state(b.qp), IBV_QPS_ERR);
}

TEST_F(Ud, PostSendRefusesWhatUdCannotCarry) {
  ibv_sge sg{reinterpret_cast<uint64_t>(at(0)), 8, mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = b.qp->qp_num;
  wr.wr.ud.remote_qkey = kQkey;
  ibv_send_wr* bad = nullptr;
  wr.opcode = IBV_WR_TSO;  // a raw packet QP's: no QP of ours carries it
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  wr.opcode = IBV_WR_SEND;
  wr.wr.ud.ah = nullptr;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = 0x1000000;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  wr.wr.ud.remote_qpn = b.qp->qp_num;
  wr.send_flags = IBV_SEND_INLINE;
  ibv_qp_attr qa{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(a.qp, &qa, IBV_QP_CAP, &ia), 0);
  sg.length = qa.cap.max_inline_data + 1;
  EXPECT_EQ(ibv_post_send(a.qp, &wr, &bad), EINVAL);
  EXPECT_TRUE(poll(a.scq, 1, kSettle).empty());  // nothing was queued
}

// RC's opcodes on a UD QP: taken at post, as mlx5's provider takes them (it has no opcode
// check for UD), then IBV_WC_LOC_QP_OP_ERR and the QP in ERR, as rxe's provider does; what
// was posted before them leaves, what was posted after is flushed. Their WR's union holds no
// AH, and is never read as one.
TEST_F(Ud, RcOpcodesCompleteWithLocQpOpErr) {
  for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD,
                           IBV_WR_SEND_WITH_INV, IBV_WR_RDMA_WRITE_WITH_IMM}) {
    SCOPED_TRACE(op);
    UdQp q;
    ASSERT_NO_FATAL_FAILURE(make(q));
    ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 4096), 0);
    ibv_sge sg{reinterpret_cast<uint64_t>(at(0)), 8, mr->lkey};
    ibv_send_wr w[3]{};
    for (int i = 0; i < 3; ++i) {
      w[i].wr_id = static_cast<uint64_t>(i + 1);
      w[i].sg_list = &sg;
      w[i].num_sge = 1;
      w[i].opcode = IBV_WR_SEND;
      w[i].send_flags = IBV_SEND_SIGNALED;
      w[i].wr.ud.ah = ah;
      w[i].wr.ud.remote_qpn = b.qp->qp_num;
      w[i].wr.ud.remote_qkey = kQkey;
      if (i < 2) w[i].next = &w[i + 1];
    }
    w[1].opcode = op;
    w[1].wr.rdma.remote_addr = 0x1000;  // the union: not a pointer to an AH
    w[1].wr.rdma.rkey = 0x77;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(q.qp, w, &bad), 0);
    auto s = poll(q.scq, 3);
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(s[1].wr_id, 2u);
    EXPECT_EQ(s[1].status, IBV_WC_LOC_QP_OP_ERR) << ibv_wc_status_str(s[1].status);
    EXPECT_EQ(s[2].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(state(q.qp), IBV_QPS_ERR);
    EXPECT_EQ(poll(b.rcq, 2, kSettle).size(), 1u) << "only the Send before it arrives";
    EXPECT_EQ(ibv_destroy_qp(q.qp), 0);
    ibv_destroy_cq(q.scq);
    ibv_destroy_cq(q.rcq);
  }
}

TEST_F(Ud, StatesAndAttributes) {
  UdQp c;
  ASSERT_NO_FATAL_FAILURE(make(c, nullptr, false));  // in INIT
  ibv_qp_attr at{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(c.qp, &at, IBV_QP_QKEY, &ia), 0);
  EXPECT_EQ(at.qkey, kQkey);
  EXPECT_EQ(ia.qp_type, IBV_QPT_UD);
  // Sends before RTS are refused at post.
  EXPECT_EQ(post_send(c.qp, b.qp->qp_num, {.len = 8}), EINVAL);
  // RC attributes do not belong in a UD transition; UD's required ones must be there.
  at.qp_state = IBV_QPS_RTR;
  at.dest_qp_num = 5;
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_DEST_QPN), EINVAL);
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE), 0);
  EXPECT_EQ(post_send(c.qp, b.qp->qp_num, {.len = 8}), EINVAL);
  at.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE), EINVAL);  // no SQ_PSN
  at.sq_psn = 1;
  at.qkey = 0x33;
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_QKEY), 0);
  ASSERT_EQ(ibv_query_qp(c.qp, &at, IBV_QP_QKEY, &ia), 0);
  EXPECT_EQ(at.qkey, 0x33u);
  // RESET -> INIT without a Q_Key is refused.
  at.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE), 0);
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  EXPECT_EQ(ibv_modify_qp(c.qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(c.qp), 0);
  ibv_destroy_cq(c.scq);
  ibv_destroy_cq(c.rcq);
}

TEST_F(Ud, ANonReadyQpDropsWhatArrives) {
  UdQp c;
  ASSERT_NO_FATAL_FAILURE(make(c, nullptr, false));  // INIT: receives posted, not yet RTR
  ASSERT_EQ(post_recv(c.qp, 1, 0x10000, 256), 0);
  fill(0, 16, 1);
  ASSERT_EQ(post_send(a.qp, c.qp->qp_num, {.id = 1, .off = 0, .len = 16}), 0);
  EXPECT_TRUE(quiet(c.rcq));
  ASSERT_NO_FATAL_FAILURE(rtr_rts(c.qp));
  fill(0x100, 16, 2);
  ASSERT_EQ(post_send(a.qp, c.qp->qp_num, {.id = 2, .off = 0x100, .len = 16}), 0);
  auto r = poll(c.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(same(0x10000 + kGrh, 16, 2));
  EXPECT_TRUE(quiet(c.rcq));
  EXPECT_EQ(ibv_destroy_qp(c.qp), 0);
  ibv_destroy_cq(c.scq);
  ibv_destroy_cq(c.rcq);
}

// Our choice (documented in qp_ud.cc): with no receive posted, the socket buffer holds the
// datagram until one is, instead of dropping it as an adapter would.
TEST_F(Ud, ADatagramWaitsForAReceive) {
  fill(0, 64, 9);
  ASSERT_EQ(post_send(a.qp, b.qp->qp_num, {.id = 1, .off = 0, .len = 64}), 0);
  EXPECT_TRUE(quiet(b.rcq));
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 256), 0);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(same(0x10000 + kGrh, 64, 9));
}

TEST_F(Ud, ReceivesThroughAnSrq) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  srq = ibv_create_srq(pd, &sa);
  ASSERT_NE(srq, nullptr);
  UdQp c;
  ASSERT_NO_FATAL_FAILURE(make(c, srq));
  ASSERT_EQ(post_recv(nullptr, 4, 0x10000, 256), 0);
  fill(0, 100, 4);
  ASSERT_EQ(post_send(a.qp, c.qp->qp_num, {.id = 1, .off = 0, .len = 100}), 0);
  auto r = poll(c.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].wr_id, 4u);
  EXPECT_EQ(r[0].qp_num, c.qp->qp_num);
  EXPECT_TRUE(same(0x10000 + kGrh, 100, 4));
  EXPECT_EQ(ibv_destroy_qp(c.qp), 0);
  ibv_destroy_cq(c.scq);
  ibv_destroy_cq(c.rcq);
}

TEST_F(Ud, AddressHandleChecks) {
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx, &da), 0);
  EXPECT_GT(da.max_ah, 0);
  ibv_ah_attr at{};
  at.port_num = 1;
  at.dlid = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd, &at), nullptr);  // no GRH on an Ethernet port
  EXPECT_EQ(errno, EINVAL);
  at.is_global = 1;  // a zero GID names no address
  EXPECT_EQ(ibv_create_ah(pd, &at), nullptr);
  EXPECT_EQ(errno, EINVAL);
  at.grh.dgid = gid;
  at.grh.sgid_index = 200;
  EXPECT_EQ(ibv_create_ah(pd, &at), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

// Whatever a hostile host sends to a UD QP's port: dropped without a completion or state
// change, while a well-formed datagram among them is delivered intact.
TEST_F(Ud, HostileDatagramsAreDropped) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 8192), 0);
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(b.qp->qp_num >> 8));
  auto send_raw = [&](const std::vector<std::byte>& d) {
    ASSERT_EQ(sendto(fd, d.data(), d.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
              static_cast<ssize_t>(d.size()));
  };
  using namespace sv::wire;
  auto datagram = [&](UdHeader h, size_t payload, uint8_t seed) {
    std::vector<std::byte> d(kUdMaxHdrLen + payload);
    const size_t hl = encode_ud_header(h, d.data());
    d.resize(hl + payload);
    for (size_t i = 0; i < payload; ++i) d[hl + i] = std::byte(static_cast<uint8_t>(seed + i * 7));
    return d;
  };
  UdHeader good;
  good.dest_qp = b.qp->qp_num;
  good.src_qp = 0x4242FF;
  good.qkey = kQkey;
  send_raw({});                                          // empty
  send_raw(std::vector<std::byte>(7, std::byte{0x64}));  // short
  auto bad = datagram(good, 10, 1);
  bad[1] = std::byte{0x0F};  // TVer
  send_raw(bad);
  bad = datagram(good, 10, 1);
  bad[0] = std::byte{0x04};  // RC SEND Only
  send_raw(bad);
  UdHeader h = good;
  h.dest_qp = b.qp->qp_num ^ 0x100;
  send_raw(datagram(h, 10, 1));  // another QPN
  h = good;
  h.pkey = 0x7FFF;
  send_raw(datagram(h, 10, 1));  // another partition
  h = good;
  h.qkey = kQkey + 1;
  send_raw(datagram(h, 10, 1));       // Q_Key violation
  send_raw(datagram(good, 6000, 1));  // longer than the MTU (a receive could hold it)
  send_raw(datagram(good, 300, 8));   // the one to deliver
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].byte_len, 300 + kGrh);
  EXPECT_EQ(r[0].src_qp, 0x4242FFu);
  EXPECT_TRUE(same(0x10000 + kGrh, 300, 8));
  EXPECT_EQ(state(b.qp), IBV_QPS_RTS);
  close(fd);
}

// The ibv_wr_* API on a UD QP: Sends addressed with ibv_wr_set_ud_addr; RC opcodes are
// refused at creation, a WR without an address at ibv_wr_complete.
TEST_F(Ud, WrApiSendsWithUdAddresses) {
  ibv_qp_init_attr_ex ia{};
  ia.qp_type = IBV_QPT_UD;
  ia.send_cq = a.scq;
  ia.recv_cq = a.rcq;
  ia.cap.max_send_wr = 8;
  ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ia.pd = pd;
  ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx, &ia), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ibv_qp* qp = ibv_create_qp_ex(ctx, &ia);
  ASSERT_NE(qp, nullptr) << strerror(errno);
  ASSERT_EQ(to_init(qp), 0);
  ASSERT_NO_FATAL_FAILURE(rtr_rts(qp));
  ibv_qp_ex* x = ibv_qp_to_qp_ex(qp);
  ASSERT_NE(x, nullptr);
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 256), 0);
  fill(0, 50, 6);
  ibv_wr_start(x);
  x->wr_id = 77;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htonl(5));
  ibv_wr_set_ud_addr(x, ah, b.qp->qp_num, kQkey);
  ibv_wr_set_sge(x, mr->lkey, reinterpret_cast<uint64_t>(at(0)), 50);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].src_qp, qp->qp_num);
  EXPECT_EQ(ntohl(r[0].imm_data), 5u);
  EXPECT_TRUE(same(0x10000 + kGrh, 50, 6));
  auto s = poll(a.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wr_id, 77u);
  // No destination: the batch is refused whole.
  ibv_wr_start(x);
  ibv_wr_send(x);
  ibv_wr_set_sge(x, mr->lkey, reinterpret_cast<uint64_t>(at(0)), 8);
  EXPECT_EQ(ibv_wr_complete(x), EINVAL);
  EXPECT_TRUE(quiet(b.rcq));
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(Ud, ErrorFlushesPostedReceivesAndLaterSends) {
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 256), 0);
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(b.qp, &at, IBV_QP_STATE), 0);
  auto r = poll(b.rcq, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_WR_FLUSH_ERR);
  ASSERT_EQ(post_send(b.qp, a.qp->qp_num, {.id = 7, .len = 8}), 0);
  auto s = poll(b.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(s[0].wr_id, 7u);
}

// The other process: a UD QP that answers each of `n` messages with its bytes plus one,
// through an AH made from the receive (ibv_create_ah_from_wc), and then exits 0.
int ud_echo_main(int n) {
  int nd = 0;
  ibv_device** l = ibv_get_device_list(&nd);
  if (!l || nd < 1) return 10;
  ibv_context* ctx = ibv_open_device(l[0]);
  ibv_free_device_list(l);
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 64, nullptr, nullptr, 0) : nullptr;
  std::vector<uint8_t> buf(64 * 8192);
  ibv_mr* mr = cq ? ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (!mr) return 11;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 32;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!qp) return 12;
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qkey = kQkey;
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
    return 13;
  at.qp_state = IBV_QPS_RTR;
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE)) return 14;
  at.qp_state = IBV_QPS_RTS;
  if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN)) return 15;
  for (int i = 0; i < 32; ++i) {
    ibv_sge s{reinterpret_cast<uint64_t>(&buf[static_cast<size_t>(i) * 8192]), 8192, mr->lkey};
    ibv_recv_wr w{};
    w.wr_id = static_cast<uint64_t>(i);
    w.sg_list = &s;
    w.num_sge = 1;
    ibv_recv_wr* bad;
    if (ibv_post_recv(qp, &w, &bad)) return 16;
  }
  std::printf("%u\n", qp->qp_num);
  std::fflush(stdout);
  const auto end = Clock::now() + kWait;
  // A receive can complete before the Send that answered the one before it: the Send's
  // completion is written after its datagram went out, and the test's next message may
  // come back in between (IBA orders completions within a queue, not between the send and
  // receive queues of one CQ). Such a receive waits here for its turn.
  std::vector<ibv_wc> early;
  for (int done = 0; done < n;) {
    if (Clock::now() > end) return 17;
    ibv_wc wc;
    if (!early.empty()) {
      wc = early.front();
      early.erase(early.begin());
    } else {
      const int r = ibv_poll_cq(cq, 1, &wc);
      if (r < 0) return 18;
      if (r == 0 || wc.opcode == IBV_WC_SEND) continue;
    }
    if (wc.status != IBV_WC_SUCCESS) return 19;
    uint8_t* m = &buf[wc.wr_id * 8192];
    ibv_ah* ah = ibv_create_ah_from_wc(pd, &wc, reinterpret_cast<ibv_grh*>(m), 1);
    if (!ah) return 20;
    const uint32_t len = wc.byte_len - kGrh;
    for (uint32_t i = 0; i < len; ++i) ++m[kGrh + i];
    ibv_sge s{reinterpret_cast<uint64_t>(m + kGrh), len, mr->lkey};
    ibv_send_wr w{};
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = wc.src_qp;
    w.wr.ud.remote_qkey = kQkey;
    ibv_send_wr* bad;
    if (ibv_post_send(qp, &w, &bad)) return 21;
    // The send completes before the AH may go (and before the buffer is reposted).
    for (;;) {
      if (Clock::now() > end) return 22;
      ibv_wc sc;
      const int k = ibv_poll_cq(cq, 1, &sc);
      if (k < 0) return 23;
      if (k == 1 && sc.opcode == IBV_WC_SEND) break;
      if (k == 1 && early.size() == 1) return 24;  // the test sends one message at a time
      if (k == 1) early.push_back(sc);
    }
    ibv_destroy_ah(ah);
    ++done;
  }
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return 0;
}

// Messages of several sizes to a UD QP in another process, each answered with its bytes plus
// one: the peer found our address in the GRH and our QPN in the completion.
TEST_F(Ud, EchoThroughAnotherProcess) {
  const std::vector<uint32_t> sizes = {1, 64, 1000, 4096, 0, 333};
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    const std::string n = std::to_string(sizes.size());
    execl("/proc/self/exe", "ud_verbs", "--ud-echo", n.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  unsigned peer = 0;
  ASSERT_EQ(std::fscanf(f, "%u", &peer), 1);
  std::fclose(f);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(post_recv(a.qp, i, 0x10000, 8192), 0);
    fill(0, sizes[i], static_cast<uint8_t>(i * 11));
    ASSERT_EQ(post_send(a.qp, peer, {.id = i, .off = 0, .len = sizes[i]}), 0);
    auto r = poll(a.rcq, 1);
    if (r.size() != 1u) {  // say why: the peer's exit status, if it has gone
      int st = 0;
      const pid_t w = waitpid(pid, &st, WNOHANG);
      if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
      }
      FAIL() << "no answer to message " << i << "; the peer "
             << (w == 0 ? std::string("was still running")
                        : "had exited, status " + std::to_string(st) + " (exit code " +
                              std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) + ")");
    }
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[0].src_qp, peer);
    EXPECT_EQ(r[0].byte_len, sizes[i] + kGrh);
    bool ok = true;
    for (uint32_t k = 0; k < sizes[i]; ++k)
      ok &= at(0x10000 + kGrh)[k] == static_cast<uint8_t>(buf[k] + 1);
    EXPECT_TRUE(ok) << "message " << i;
    ASSERT_EQ(poll(a.scq, 1).size(), 1u);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "peer status " << status;
}

// ---- multicast: ibv_attach_mcast over IP multicast -----------------------------------------

// A group of this process alone: 239.9.x.y from the pid.
ibv_gid group_gid(uint8_t salt = 0) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  const pid_t p = getpid();
  g.raw[12] = 239;
  g.raw[13] = static_cast<uint8_t>(9 + salt);
  g.raw[14] = static_cast<uint8_t>(p >> 8);
  g.raw[15] = static_cast<uint8_t>(p);
  return g;
}

constexpr uint32_t kMcastQpn = 0xFFFFFF;

// Every QP attached to the group gets a copy, with the group as the GRH's destination; the
// sender, not attached, gets none; a detached QP no longer gets them.
TEST_F(Ud, MulticastReachesEveryAttachedQp) {
  UdQp c;
  ASSERT_NO_FATAL_FAILURE(make(c));
  const ibv_gid g = group_gid();
  ASSERT_EQ(ibv_attach_mcast(a.qp, &g, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(b.qp, &g, 0), 0);
  ibv_ah_attr ga{};
  ga.is_global = 1;
  ga.grh.dgid = g;
  ga.port_num = 1;
  ibv_ah* mah = ibv_create_ah(pd, &ga);
  ASSERT_NE(mah, nullptr) << strerror(errno);
  ASSERT_EQ(post_recv(a.qp, 1, 0x10000, 4096), 0);
  ASSERT_EQ(post_recv(b.qp, 2, 0x20000, 4096), 0);
  ASSERT_EQ(post_recv(c.qp, 3, 0x30000, 4096), 0);
  fill(0, 300, 5);
  ASSERT_EQ(post_send(c.qp, kMcastQpn, {.id = 7, .off = 0, .len = 300}, mah), 0);
  auto s = poll(c.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
  for (auto [q, off] : {std::pair{&a, size_t{0x10000}}, std::pair{&b, size_t{0x20000}}}) {
    auto r = poll(q->rcq, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[0].byte_len, 300 + kGrh);
    EXPECT_EQ(r[0].qp_num, q->qp->qp_num);
    EXPECT_EQ(r[0].src_qp, c.qp->qp_num);
    EXPECT_TRUE(same(off + kGrh, 300, 5));
    EXPECT_EQ(memcmp(at(off) + 36, &g.raw[12], 4), 0) << "the GRH's destination is the group";
  }
  EXPECT_TRUE(quiet(c.rcq)) << "the sender is not attached";
  // Detached: b gets nothing more, a still does.
  ASSERT_EQ(ibv_detach_mcast(b.qp, &g, 0), 0);
  ASSERT_EQ(post_recv(a.qp, 4, 0x10000, 4096), 0);
  ASSERT_EQ(post_recv(b.qp, 5, 0x20000, 4096), 0);
  ASSERT_EQ(post_send(c.qp, kMcastQpn, {.id = 8, .off = 0, .len = 64}, mah), 0);
  ASSERT_EQ(poll(a.rcq, 1).size(), 1u);
  EXPECT_TRUE(quiet(b.rcq));
  // With no receive posted, a datagram waits in the group's socket, as a unicast one does.
  ASSERT_EQ(post_send(c.qp, kMcastQpn, {.id = 10, .off = 0, .len = 64}, mah), 0);
  EXPECT_TRUE(quiet(a.rcq));
  ASSERT_EQ(post_recv(a.qp, 6, 0x10000, 4096), 0);
  EXPECT_EQ(poll(a.rcq, 1).size(), 1u);
  // A Q_Key other than the QPs' is dropped, as for unicast (C9-38..40).
  ASSERT_EQ(post_recv(a.qp, 7, 0x10000, 4096), 0);
  ASSERT_EQ(post_send(c.qp, kMcastQpn, {.id = 9, .off = 0, .len = 64, .qkey = kQkey + 1}, mah), 0);
  EXPECT_TRUE(quiet(a.rcq));
  // Attached, a QP is in use (the kernel's usecnt): EBUSY, and it is left intact.
  EXPECT_EQ(ibv_destroy_qp(a.qp), EBUSY);
  EXPECT_EQ(ibv_detach_mcast(a.qp, &g, 0), 0);
  ibv_destroy_ah(mah);
  EXPECT_EQ(ibv_destroy_qp(c.qp), 0);
  ibv_destroy_cq(c.scq);
  ibv_destroy_cq(c.rcq);
}

TEST_F(Ud, MulticastAttachFollowsTheKernelsRules) {
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx, &da), 0);
  EXPECT_GT(da.max_mcast_grp, 0);
  ASSERT_GT(da.max_mcast_qp_attach, 0);
  // Not a multicast GID: EINVAL (rdma_is_multicast_addr).
  EXPECT_EQ(ibv_attach_mcast(a.qp, &gid, 0), EINVAL);
  // Not a UD QP: EINVAL.
  ibv_qp_init_attr ia{};
  ia.send_cq = a.scq;
  ia.recv_cq = a.rcq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* rc = ibv_create_qp(pd, &ia);
  ASSERT_NE(rc, nullptr);
  const ibv_gid g = group_gid(1);
  EXPECT_EQ(ibv_attach_mcast(rc, &g, 0), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(rc), 0);
  // Not attached: EINVAL. Attached twice: one attachment (uverbs), so one detach ends it.
  EXPECT_EQ(ibv_detach_mcast(a.qp, &g, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(a.qp, &g, 0), 0);
  EXPECT_EQ(ibv_attach_mcast(a.qp, &g, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(a.qp, &g, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(a.qp, &g, 0), EINVAL);
  // max_mcast_qp_attach groups per QP; one more is ENOMEM.
  std::vector<ibv_gid> gs;
  for (int i = 0; i < da.max_mcast_qp_attach; ++i) {
    ibv_gid x = group_gid(2);
    x.raw[13] = static_cast<uint8_t>(20 + i);
    gs.push_back(x);
    ASSERT_EQ(ibv_attach_mcast(a.qp, &x, 0), 0) << i;
  }
  ibv_gid over = group_gid(2);
  over.raw[13] = 250;
  EXPECT_EQ(ibv_attach_mcast(a.qp, &over, 0), ENOMEM);
  for (auto& x : gs) EXPECT_EQ(ibv_detach_mcast(a.qp, &x, 0), 0);
  // QPN 0xFFFFFF toward a unicast GID names no group: nothing arrives, the Send completes.
  ASSERT_EQ(post_recv(b.qp, 1, 0x10000, 4096), 0);
  ASSERT_EQ(post_send(a.qp, kMcastQpn, {.id = 1, .off = 0, .len = 16}), 0);
  auto s = poll(a.scq, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(quiet(b.rcq));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--ud-echo") == 0) return ud_echo_main(std::atoi(argv[i + 1]));
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
