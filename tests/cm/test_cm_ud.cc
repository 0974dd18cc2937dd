// rdma_cm over UD (RDMA_PS_UDP) as udaddy and UCX-style users drive it: SIDR resolution
// through rdma_connect/rdma_accept, the rdma_ud_param of ESTABLISHED, rejection and an
// absent listener, and a hostile datagram on the listener's port.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cm_util.h"

namespace {

using cmtest::loopback;

constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY
constexpr int kGrh = 40;

uint16_t test_port(int i) {
  return cmtest::test_port(28000, i);
}

// Next event on ch (acked by the caller).
rdma_cm_event* next_event(rdma_event_channel* ch, int ms = 5000) {
  if (!cmtest::readable(ch->fd, ms)) return nullptr;
  rdma_cm_event* ev = nullptr;
  return rdma_get_cm_event(ch, &ev) == 0 ? ev : nullptr;
}

struct Side {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(8192);
  void make_qp(rdma_cm_id* on) {
    pd = ibv_alloc_pd(on->verbs);
    ASSERT_NE(pd, nullptr);
    cq = ibv_create_cq(on->verbs, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    ibv_qp_init_attr a{};
    a.qp_type = IBV_QPT_UD;
    a.send_cq = cq;
    a.recv_cq = cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    ASSERT_EQ(rdma_create_qp(on, pd, &a), 0) << strerror(errno);
  }
};

class CmUd : public ::testing::Test {
 protected:
  void SetUp() override {
    srv.ch = rdma_create_event_channel();
    cli.ch = rdma_create_event_channel();
    ASSERT_TRUE(srv.ch && cli.ch);
    ASSERT_EQ(rdma_create_id(srv.ch, &srv.id, nullptr, RDMA_PS_UDP), 0);
    ASSERT_EQ(rdma_create_id(cli.ch, &cli.id, nullptr, RDMA_PS_UDP), 0);
    EXPECT_EQ(srv.id->qp_type, IBV_QPT_UD);
    port = test_port(0);
  }
  void TearDown() override {
    if (child) {
      if (child->qp) rdma_destroy_qp(child);
      rdma_destroy_id(child);
    }
    if (child_pd) ibv_dealloc_pd(child_pd);
    if (child_cq) ibv_destroy_cq(child_cq);
    for (Side* s : {&cli, &srv}) {
      if (s->id && s->id->qp) rdma_destroy_qp(s->id);
      if (s->mr) ibv_dereg_mr(s->mr), s->mr = nullptr;
      if (s->cq) ibv_destroy_cq(s->cq), s->cq = nullptr;
      if (s->pd) ibv_dealloc_pd(s->pd), s->pd = nullptr;
      if (s->id) rdma_destroy_id(s->id), s->id = nullptr;
      if (s->ch) rdma_destroy_event_channel(s->ch), s->ch = nullptr;
    }
  }
  void listen() {
    sockaddr_in a = loopback(port);
    ASSERT_EQ(rdma_bind_addr(srv.id, reinterpret_cast<sockaddr*>(&a)), 0);
    ASSERT_EQ(rdma_listen(srv.id, 4), 0);
  }
  // Client: resolve, make its QP, send the SIDR request with `pdata`.
  void connect(const std::string& pdata) {
    sockaddr_in a = loopback(port);
    ASSERT_EQ(rdma_resolve_addr(cli.id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000), 0);
    rdma_cm_event* ev = next_event(cli.ch);
    ASSERT_NE(ev, nullptr);
    EXPECT_EQ(ev->event, RDMA_CM_EVENT_ADDR_RESOLVED);
    rdma_ack_cm_event(ev);
    ASSERT_EQ(rdma_resolve_route(cli.id, 2000), 0);
    ev = next_event(cli.ch);
    ASSERT_NE(ev, nullptr);
    EXPECT_EQ(ev->event, RDMA_CM_EVENT_ROUTE_RESOLVED);
    rdma_ack_cm_event(ev);
    ASSERT_NO_FATAL_FAILURE(cli.make_qp(cli.id));
    rdma_conn_param p{};
    p.private_data = pdata.data();
    p.private_data_len = static_cast<uint8_t>(pdata.size());
    ASSERT_EQ(rdma_connect(cli.id, &p), 0);
  }
  // Server: the request (its private data checked), a QP on the child.
  void take_request(const std::string& want_pdata) {
    rdma_cm_event* ev = next_event(srv.ch);
    ASSERT_NE(ev, nullptr);
    EXPECT_EQ(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST) << rdma_event_str(ev->event);
    EXPECT_EQ(ev->listen_id, srv.id);
    ASSERT_GE(ev->param.ud.private_data_len, want_pdata.size());
    EXPECT_EQ(0, memcmp(ev->param.ud.private_data, want_pdata.data(), want_pdata.size()));
    child = ev->id;
    rdma_ack_cm_event(ev);
    EXPECT_EQ(child->qp_type, IBV_QPT_UD);
    EXPECT_EQ(child->ps, RDMA_PS_UDP);
  }
  void child_qp() {
    child_pd = ibv_alloc_pd(child->verbs);
    child_cq = ibv_create_cq(child->verbs, 16, nullptr, nullptr, 0);
    ASSERT_TRUE(child_pd && child_cq);
    ibv_qp_init_attr a{};
    a.qp_type = IBV_QPT_UD;
    a.send_cq = a.recv_cq = child_cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    ASSERT_EQ(rdma_create_qp(child, child_pd, &a), 0);
  }

  Side srv, cli;
  rdma_cm_id* child = nullptr;
  ibv_pd* child_pd = nullptr;
  ibv_cq* child_cq = nullptr;
  uint16_t port = 0;
};

TEST_F(CmUd, AcceptedRequestGivesTheClientAnAddressQpnAndQkey) {
  ASSERT_NO_FATAL_FAILURE(listen());
  ASSERT_NO_FATAL_FAILURE(connect("hello"));
  ASSERT_NO_FATAL_FAILURE(take_request("hello"));
  ASSERT_NO_FATAL_FAILURE(child_qp());
  // The QP rdma_create_qp made is ready (librdmacm moves UD QPs to RTS) with RDMA_UDP_QKEY.
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(child->qp, &qa, IBV_QP_STATE | IBV_QP_QKEY, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(qa.qkey, kUdpQkey);
  std::vector<uint8_t> rbuf(4096);
  ibv_mr* rmr = ibv_reg_mr(child_pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(rmr, nullptr);
  ibv_sge rs{reinterpret_cast<uint64_t>(rbuf.data()), 4096, rmr->lkey};
  ibv_recv_wr rw{};
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  ASSERT_EQ(ibv_post_recv(child->qp, &rw, &rbad), 0);
  rdma_conn_param p{};
  const char reply[] = "welcome";
  p.private_data = reply;
  p.private_data_len = sizeof reply;
  ASSERT_EQ(rdma_accept(child, &p), 0);
  rdma_cm_event* ev = next_event(cli.ch);
  ASSERT_NE(ev, nullptr);
  ASSERT_EQ(ev->event, RDMA_CM_EVENT_ESTABLISHED) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->param.ud.qp_num, child->qp->qp_num);
  EXPECT_EQ(ev->param.ud.qkey, kUdpQkey);
  ASSERT_EQ(ev->param.ud.private_data_len, sizeof reply);
  EXPECT_STREQ(static_cast<const char*>(ev->param.ud.private_data), reply);
  EXPECT_EQ(ev->param.ud.ah_attr.is_global, 1);
  ibv_ah* ah = ibv_create_ah(cli.pd, &ev->param.ud.ah_attr);
  ASSERT_NE(ah, nullptr);
  const uint32_t qpn = ev->param.ud.qp_num, qkey = ev->param.ud.qkey;
  rdma_ack_cm_event(ev);
  // A datagram through what ESTABLISHED gave.
  std::memcpy(cli.buf.data(), "datagram", 9);
  ibv_sge ss{reinterpret_cast<uint64_t>(cli.buf.data()), 9, cli.mr->lkey};
  ibv_send_wr sw{};
  sw.sg_list = &ss;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_SIGNALED;
  sw.wr.ud.ah = ah;
  sw.wr.ud.remote_qpn = qpn;
  sw.wr.ud.remote_qkey = qkey;
  ibv_send_wr* sbad = nullptr;
  ASSERT_EQ(ibv_post_send(cli.id->qp, &sw, &sbad), 0);
  ibv_wc wc{};
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int n = 0;
  while (n == 0 && std::chrono::steady_clock::now() < end) n = ibv_poll_cq(child_cq, 1, &wc);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 9u + kGrh);
  EXPECT_EQ(wc.src_qp, cli.id->qp->qp_num);
  EXPECT_STREQ(reinterpret_cast<char*>(rbuf.data() + kGrh), "datagram");
  ibv_destroy_ah(ah);
  ibv_dereg_mr(rmr);
  // The passive side gets no event for a UD accept.
  EXPECT_EQ(next_event(srv.ch, 100), nullptr);
}

TEST_F(CmUd, RejectedRequestIsUnreachableWithTheSidrStatus) {
  ASSERT_NO_FATAL_FAILURE(listen());
  ASSERT_NO_FATAL_FAILURE(connect("x"));
  ASSERT_NO_FATAL_FAILURE(take_request("x"));
  ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
  rdma_cm_event* ev = next_event(cli.ch);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_UNREACHABLE) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->status, 2);  // IB_SIDR_REJECT, as the kernel's cma reports it
  rdma_ack_cm_event(ev);
}

TEST_F(CmUd, NoListenerIsUnreachable) {
  ASSERT_NO_FATAL_FAILURE(connect(""));
  rdma_cm_event* ev = next_event(cli.ch);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_UNREACHABLE) << rdma_event_str(ev->event);
  EXPECT_NE(ev->status, 0);
  rdma_ack_cm_event(ev);
}

// Garbage on the listener's port raises no event; a real request after it is served.
TEST_F(CmUd, HostileDatagramsOnTheListenerPortAreIgnored) {
  ASSERT_NO_FATAL_FAILURE(listen());
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in to = loopback(port);
  std::vector<std::vector<uint8_t>> junk = {
      {},
      {'S', 'V', 'S', 'I'},
      {'S', 'V', 'S', 'I', 1, 1, 0, 200, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},  // pdata overrun
      {'S', 'V', 'S', 'I', 9, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},    // version 9
      {'S', 'V', 'S', 'I', 1, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},    // a REP
      std::vector<uint8_t>(1500, 0xAB)};
  for (auto& j : junk)
    sendto(fd, j.data(), j.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  close(fd);
  EXPECT_EQ(next_event(srv.ch, 200), nullptr);
  ASSERT_NO_FATAL_FAILURE(connect("real"));
  ASSERT_NO_FATAL_FAILURE(take_request("real"));
  ASSERT_NO_FATAL_FAILURE(child_qp());
  ASSERT_EQ(rdma_accept(child, nullptr), 0);
  rdma_cm_event* ev = next_event(cli.ch);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_ESTABLISHED) << rdma_event_str(ev->event);
  rdma_ack_cm_event(ev);
}

// A flood of distinct requests: at most the backlog waits for the application; the rest is
// dropped. Destroying undecided requests rejects them and frees the backlog.
TEST_F(CmUd, RequestsBeyondTheBacklogAreDropped) {
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rdma_bind_addr(srv.id, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(srv.id, 4), 0);
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  for (uint32_t i = 0; i < 50; ++i) {
    uint8_t req[20] = {'S', 'V', 'S', 'I', 1, 1, 0, 0};
    req[8] = static_cast<uint8_t>(i >> 24);
    req[11] = static_cast<uint8_t>(i);
    sendto(fd, req, sizeof req, 0, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  std::vector<rdma_cm_id*> kids;
  while (rdma_cm_event* ev = next_event(srv.ch, 300)) {
    EXPECT_EQ(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST);
    kids.push_back(ev->id);
    rdma_ack_cm_event(ev);
  }
  EXPECT_EQ(kids.size(), 4u);
  // The rejections reach the requester's socket.
  for (rdma_cm_id* k : kids) EXPECT_EQ(rdma_destroy_id(k), 0);
  int rejects = 0;
  uint8_t rep[64];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, 300) == 1 && recv(fd, rep, sizeof rep, 0) >= 20)
    rejects += rep[5] == 2 && rep[6] == 2;  // a REP with status IB_SIDR_REJECT
  EXPECT_EQ(rejects, 4);
  close(fd);
  // Room again: a real request is served.
  ASSERT_NO_FATAL_FAILURE(connect("after"));
  ASSERT_NO_FATAL_FAILURE(take_request("after"));
  ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
  rdma_cm_event* ev = next_event(cli.ch);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->event, RDMA_CM_EVENT_UNREACHABLE);
  rdma_ack_cm_event(ev);
}

// Multicast through rdma_cm, as mckey drives it: join before the id is bound is EINVAL, and a
// unicast address too; a join attaches the id's QP and reports the group's AH, QPN 0xFFFFFF,
// the port space's Q_Key and the join's context; a datagram to the group comes back to the
// joined QP; leave detaches (a second leave is EADDRNOTAVAIL).
TEST_F(CmUd, MulticastJoinAndLeave) {
  sockaddr_in grp{};
  grp.sin_family = AF_INET;
  grp.sin_addr.s_addr = htonl(0xEF0A0000u | (static_cast<uint32_t>(getpid()) & 0xFFFF));
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(srv.id, reinterpret_cast<sockaddr*>(&grp), nullptr), -1);
  EXPECT_EQ(errno, EINVAL) << "an id bound to no device";
  sockaddr_in a = loopback(0);
  ASSERT_EQ(rdma_bind_addr(srv.id, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_NO_FATAL_FAILURE(srv.make_qp(srv.id));
  sockaddr_in uni = loopback(0);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast(srv.id, reinterpret_cast<sockaddr*>(&uni), nullptr), -1);
  EXPECT_EQ(errno, EINVAL) << "not a multicast address";
  rdma_cm_join_mc_attr_ex x{};
  x.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;  // no join flags
  x.addr = reinterpret_cast<sockaddr*>(&grp);
  errno = 0;
  EXPECT_EQ(rdma_join_multicast_ex(srv.id, &x, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  x.comp_mask |= RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  x.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  int ctx_tag = 0;
  ASSERT_EQ(rdma_join_multicast_ex(srv.id, &x, &ctx_tag), 0) << strerror(errno);
  rdma_cm_event* ev = next_event(srv.ch);
  ASSERT_NE(ev, nullptr);
  ASSERT_EQ(ev->event, RDMA_CM_EVENT_MULTICAST_JOIN) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->status, 0);
  EXPECT_EQ(ev->param.ud.private_data, &ctx_tag);
  EXPECT_EQ(ev->param.ud.qp_num, 0xFFFFFFu);
  EXPECT_EQ(ev->param.ud.qkey, kUdpQkey);
  const ibv_ah_attr ah_attr = ev->param.ud.ah_attr;
  rdma_ack_cm_event(ev);
  EXPECT_TRUE(ah_attr.is_global);
  EXPECT_EQ(ah_attr.grh.dgid.raw[10], 0xff);
  EXPECT_EQ(memcmp(&ah_attr.grh.dgid.raw[12], &grp.sin_addr, 4), 0) << "MGID ::ffff:<group>";
  // The QP hears its own group (multicast loopback, as on a NIC with it enabled).
  ibv_ah* ah = ibv_create_ah(srv.pd, const_cast<ibv_ah_attr*>(&ah_attr));
  ASSERT_NE(ah, nullptr);
  ibv_sge rs{reinterpret_cast<uint64_t>(srv.buf.data()), 4096, srv.mr->lkey};
  ibv_recv_wr rw{};
  rw.wr_id = 1;
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* rbad;
  ASSERT_EQ(ibv_post_recv(srv.id->qp, &rw, &rbad), 0);
  std::memcpy(srv.buf.data() + 4096, "group", 5);
  ibv_sge ss{reinterpret_cast<uint64_t>(srv.buf.data() + 4096), 5, srv.mr->lkey};
  ibv_send_wr sw{};
  sw.wr_id = 2;
  sw.sg_list = &ss;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_SIGNALED;
  sw.wr.ud.ah = ah;
  sw.wr.ud.remote_qpn = 0xFFFFFF;
  sw.wr.ud.remote_qkey = kUdpQkey;
  ibv_send_wr* sbad;
  ASSERT_EQ(ibv_post_send(srv.id->qp, &sw, &sbad), 0);
  int got_recv = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!got_recv && std::chrono::steady_clock::now() < end) {
    ibv_wc wc;
    if (ibv_poll_cq(srv.cq, 1, &wc) == 1 && wc.opcode == IBV_WC_RECV) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
      EXPECT_EQ(wc.byte_len, 5u + kGrh);
      got_recv = 1;
    }
  }
  EXPECT_TRUE(got_recv);
  EXPECT_EQ(memcmp(srv.buf.data() + kGrh, "group", 5), 0);
  ibv_destroy_ah(ah);
  EXPECT_EQ(rdma_leave_multicast(srv.id, reinterpret_cast<sockaddr*>(&grp)), 0);
  errno = 0;
  EXPECT_EQ(rdma_leave_multicast(srv.id, reinterpret_cast<sockaddr*>(&grp)), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  // Detached: the QP is free to go (TearDown destroys it).
  EXPECT_EQ(ibv_detach_mcast(srv.id->qp, &ah_attr.grh.dgid, 0), EINVAL);
}

TEST(CmUdAddrinfo, UdpPortSpaceMeansUdQps) {
  rdma_addrinfo hints{};
  hints.ai_port_space = RDMA_PS_UDP;
  hints.ai_flags = RAI_NUMERICHOST;
  rdma_addrinfo* res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", "7000", &hints, &res), 0);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_UD);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_UDP);
  rdma_freeaddrinfo(res);
}

}  // namespace
