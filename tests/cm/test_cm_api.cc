// rdma_cm API semantics that real programs rely on, checked against librdmacm's behaviour:
// rdma_migrate_id (libfabric moves its ids to its own channel), rdma_getaddrinfo with only
// hint addresses (libfabric's verbs provider), and the rdma_verbs.h helpers
// (rdma_create_ep's QP type, passive eps whose requests get a QP, the device's default PD).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "cm_util.h"
#include "wire/stats_file.h"

namespace {

using cmtest::loopback;
using cmtest::readable;

uint16_t test_port(int i) {
  return cmtest::test_port(20000, i);
}

// A loopback port no socket holds now, from the kernel's ephemeral range: for a test that
// must find a port free even beside other tests (test_port's pid-derived ports collide
// when two concurrent tests' pids agree modulo 250). 0 on failure.
uint16_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);  // never connected: no TIME_WAIT keeps it
  return port;
}

// Next event on ch, which must be `want` for id; acked.
void expect_event(rdma_event_channel* ch, rdma_cm_id* id, rdma_cm_event_type want) {
  ASSERT_TRUE(readable(ch->fd, 5000)) << "no " << rdma_event_str(want);
  rdma_cm_event* ev = nullptr;
  ASSERT_EQ(rdma_get_cm_event(ch, &ev), 0);
  EXPECT_EQ(ev->event, want) << rdma_event_str(ev->event);
  EXPECT_EQ(ev->id, id);
  rdma_ack_cm_event(ev);
}

// The next event on ch (acked), which must be for id (any, for nullptr); TIMEWAIT_EXIT if
// none comes in 5 s.
rdma_cm_event_type next_event(rdma_event_channel* ch, rdma_cm_id* id) {
  rdma_cm_event_type t = RDMA_CM_EVENT_TIMEWAIT_EXIT;
  if (!readable(ch->fd, 5000)) return t;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev)) return t;
  if (id) {
    EXPECT_EQ(ev->id, id);
  }
  t = ev->event;
  rdma_ack_cm_event(ev);
  return t;
}

// A synchronous passive endpoint listening on 127.0.0.1:port whose requests each get a QP;
// nullptr on failure.
rdma_cm_id* listening_ep(uint16_t port, int backlog) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  if (rdma_getaddrinfo("127.0.0.1", std::to_string(port).c_str(), &hints, &res)) return nullptr;
  ibv_qp_init_attr attr{};
  attr.cap = {4, 4, 1, 1, 16};
  rdma_cm_id* listen = nullptr;
  const int r = rdma_create_ep(&listen, res, nullptr, &attr);
  rdma_freeaddrinfo(res);
  if (r) return nullptr;
  if (rdma_listen(listen, backlog) == 0) return listen;
  rdma_destroy_ep(listen);
  return nullptr;
}

// An id on ch with its route to 127.0.0.1:port resolved and an RC QP: ready for
// rdma_connect. nullptr (nothing left behind) on failure.
rdma_cm_id* ready_to_connect(rdma_event_channel* ch, uint16_t port) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return nullptr;
  sockaddr_in dst = loopback(port);
  ibv_qp_init_attr a{};
  a.cap = {4, 4, 1, 1, 16};
  a.qp_type = IBV_QPT_RC;
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 1000) == 0 &&
      next_event(ch, id) == RDMA_CM_EVENT_ADDR_RESOLVED && rdma_resolve_route(id, 1000) == 0 &&
      next_event(ch, id) == RDMA_CM_EVENT_ROUTE_RESOLVED && rdma_create_qp(id, nullptr, &a) == 0)
    return id;
  rdma_destroy_id(id);
  return nullptr;
}

}  // namespace

TEST(CmMigrate, ASynchronousIdMovedToAChannelBecomesAsynchronous) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP), 0);  // synchronous
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  ASSERT_EQ(rdma_migrate_id(id, ch), 0);
  EXPECT_EQ(id->channel, ch);
  // The calls return at once and their events arrive on the new channel.
  sockaddr_in dst = loopback(test_port(0));
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_NO_FATAL_FAILURE(expect_event(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED));
  ASSERT_EQ(rdma_resolve_route(id, 2000), 0);
  ASSERT_NO_FATAL_FAILURE(expect_event(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED));
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
}

TEST(CmMigrate, MovedToNoChannelAnIdBecomesSynchronous) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_migrate_id(id, nullptr), 0);
  EXPECT_NE(id->channel, ch);
  EXPECT_NE(id->channel, nullptr);
  // Synchronous: resolve waits for its event and consumes it; nothing reaches `ch`.
  sockaddr_in dst = loopback(test_port(1));
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  EXPECT_FALSE(readable(ch->fd, 200));
  EXPECT_FALSE(readable(id->channel->fd, 0)) << "the event was left queued";
  // Already synchronous: a second move to no channel is refused, as librdmacm does.
  errno = 0;
  EXPECT_EQ(rdma_migrate_id(id, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(ch);
}

TEST(CmMigrate, PendingEventsMoveWithTheId) {
  rdma_event_channel* a = rdma_create_event_channel();
  rdma_event_channel* b = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(a, &id, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in dst = loopback(test_port(2));
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000), 0);
  ASSERT_TRUE(readable(a->fd, 5000));  // queued on a, not retrieved
  ASSERT_EQ(rdma_migrate_id(id, b), 0);
  EXPECT_FALSE(readable(a->fd, 0));
  ASSERT_NO_FATAL_FAILURE(expect_event(b, id, RDMA_CM_EVENT_ADDR_RESOLVED));
  EXPECT_EQ(rdma_destroy_id(id), 0);
  rdma_destroy_event_channel(a);
  rdma_destroy_event_channel(b);
}

TEST(CmAddrinfo, OnlyHintAddressesAreCopiedIntoTheResult) {
  sockaddr_in src = loopback(0), dst = loopback(7471);
  rdma_addrinfo hints{};
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_src_addr = reinterpret_cast<sockaddr*>(&src);
  hints.ai_src_len = sizeof src;
  hints.ai_dst_addr = reinterpret_cast<sockaddr*>(&dst);
  hints.ai_dst_len = sizeof dst;
  rdma_addrinfo* res = nullptr;
  ASSERT_EQ(rdma_getaddrinfo(nullptr, nullptr, &hints, &res), 0);
  ASSERT_NE(res, nullptr);
  EXPECT_EQ(res->ai_family, AF_INET);
  EXPECT_EQ(res->ai_port_space, RDMA_PS_TCP);
  EXPECT_EQ(res->ai_qp_type, IBV_QPT_RC);
  ASSERT_EQ(res->ai_dst_len, sizeof dst);
  EXPECT_EQ(std::memcmp(res->ai_dst_addr, &dst, sizeof dst), 0);
  ASSERT_EQ(res->ai_src_len, sizeof src);
  EXPECT_EQ(std::memcmp(res->ai_src_addr, &src, sizeof src), 0);
  rdma_freeaddrinfo(res);
  // Nothing to go on at all: an error with errno set.
  rdma_addrinfo empty{};
  errno = 0;
  EXPECT_NE(rdma_getaddrinfo(nullptr, nullptr, &empty, &res), 0);
  EXPECT_NE(errno, 0);
}

TEST(CmVerbsHelpers, CreateQpWithNoPdUsesTheDevicesDefaultPd) {
  rdma_cm_id* a = nullptr;
  rdma_cm_id* b = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &a, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_create_id(nullptr, &b, nullptr, RDMA_PS_TCP), 0);
  for (rdma_cm_id* id : {a, b}) {
    sockaddr_in any = loopback(0);
    ASSERT_EQ(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&any)), 0);
    ibv_qp_init_attr attr{};
    attr.cap = {4, 4, 1, 1, 0};
    attr.qp_type = IBV_QPT_RC;
    ASSERT_EQ(rdma_create_qp(id, nullptr, &attr), 0) << strerror(errno);
    ASSERT_NE(id->pd, nullptr);
    EXPECT_EQ(id->qp->pd, id->pd);
  }
  EXPECT_EQ(a->pd, b->pd) << "one default PD per device";
  rdma_destroy_qp(a);
  rdma_destroy_qp(b);
  rdma_destroy_id(a);
  rdma_destroy_id(b);
}

// rdma_server/rdma_client style: qp_type left 0 (the address's is used), and the passive
// endpoint's QP attributes give each request a QP in rdma_get_request.
TEST(CmVerbsHelpers, EndpointsGetTheAddressQpTypeAndEachRequestAQp) {
  const std::string port = std::to_string(test_port(3));
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* sres = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", port.c_str(), &hints, &sres), 0);
  EXPECT_EQ(sres->ai_qp_type, IBV_QPT_RC);
  ibv_qp_init_attr attr{};
  attr.cap = {4, 4, 1, 1, 16};
  attr.sq_sig_all = 1;
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, sres, nullptr, &attr), 0) << strerror(errno);
  EXPECT_EQ(listen->qp, nullptr) << "a listening endpoint has no QP";
  ASSERT_EQ(rdma_listen(listen, 4), 0);

  int client_rc = -1;
  ibv_qp_type client_type = IBV_QPT_UD;
  std::thread client([&] {
    rdma_addrinfo h{};
    h.ai_port_space = RDMA_PS_TCP;
    rdma_addrinfo* res = nullptr;
    if (rdma_getaddrinfo("127.0.0.1", port.c_str(), &h, &res)) return;
    ibv_qp_init_attr a{};
    a.cap = {4, 4, 1, 1, 16};
    rdma_cm_id* id = nullptr;
    if (rdma_create_ep(&id, res, nullptr, &a) == 0) {
      if (id->qp) client_type = id->qp->qp_type;
      client_rc = rdma_connect(id, nullptr);
      rdma_disconnect(id);
      rdma_destroy_ep(id);
    }
    rdma_freeaddrinfo(res);
  });
  rdma_cm_id* child = nullptr;
  ASSERT_EQ(rdma_get_request(listen, &child), 0);
  ASSERT_NE(child->qp, nullptr) << "rdma_get_request made no QP";
  EXPECT_EQ(child->qp->qp_type, IBV_QPT_RC);
  EXPECT_EQ(rdma_accept(child, nullptr), 0);
  client.join();
  EXPECT_EQ(client_rc, 0);
  EXPECT_EQ(client_type, IBV_QPT_RC);
  rdma_disconnect(child);
  rdma_destroy_ep(child);
  rdma_destroy_ep(listen);
  rdma_freeaddrinfo(sres);
}

// A QP that rdma_cm connects goes through RTR to RTS in one step: every copy of its state
// says RTS, ibv_query_qp's and the one softverbs-stat reads (it stayed RESET there).
TEST(CmVerbsHelpers, AConnectedQpIsRtsEverywhere) {
  const std::string port = std::to_string(test_port(4));
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* sres = nullptr;
  ASSERT_EQ(rdma_getaddrinfo("127.0.0.1", port.c_str(), &hints, &sres), 0);
  ibv_qp_init_attr attr{};
  attr.cap = {4, 4, 1, 1, 16};
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_ep(&listen, sres, nullptr, &attr), 0) << strerror(errno);
  ASSERT_EQ(rdma_listen(listen, 4), 0);
  std::promise<void> checked;
  std::thread client([&, done = checked.get_future()]() mutable {
    rdma_addrinfo h{};
    h.ai_port_space = RDMA_PS_TCP;
    rdma_addrinfo* res = nullptr;
    if (rdma_getaddrinfo("127.0.0.1", port.c_str(), &h, &res)) return;
    ibv_qp_init_attr a{};
    a.cap = {4, 4, 1, 1, 16};
    rdma_cm_id* id = nullptr;
    if (rdma_create_ep(&id, res, nullptr, &a) == 0) {
      if (rdma_connect(id, nullptr) == 0) done.wait();
      rdma_disconnect(id);
      rdma_destroy_ep(id);
    }
    rdma_freeaddrinfo(res);
  });
  rdma_cm_id* child = nullptr;
  ASSERT_EQ(rdma_get_request(listen, &child), 0);
  ASSERT_EQ(rdma_accept(child, nullptr), 0);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(child->qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(child->qp->state, IBV_QPS_RTS);
  std::ifstream in(
      "/dev/shm/softverbs-stats-" + std::to_string(geteuid()) + "/" + std::to_string(getpid()),
      std::ios::binary);
  std::string f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  sv::wire::StatsView v;
  ASSERT_EQ(sv::wire::decode_stats({reinterpret_cast<const std::byte*>(f.data()), f.size()}, v),
            sv::wire::StatsError::ok);
  bool found = false;
  for (const auto& q : v.qps) {
    if (q.qpn != child->qp->qp_num) continue;
    found = true;
    EXPECT_EQ(q.state, static_cast<uint32_t>(IBV_QPS_RTS)) << "published state";
  }
  EXPECT_TRUE(found);
  checked.set_value();
  client.join();
  rdma_disconnect(child);
  rdma_destroy_ep(child);
  rdma_destroy_ep(listen);
  rdma_freeaddrinfo(sres);
}

// An id that reaches the device (bound to an address, or its destination resolved) has the
// device's default PD in id->pd, as librdmacm's ucma_get_device gives it: pyverbs creates a
// CMID's QPs, MRs and AHs on it. A QP created on another PD makes that the id's PD
// (rdma_create_qp_ex: id->pd = qp->pd).
TEST(CmVerbsHelpers, AnIdOnTheDeviceHasItsDefaultPdUntilItsQpNamesAnother) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* bound = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &bound, nullptr, RDMA_PS_TCP), 0);
  EXPECT_EQ(bound->pd, nullptr) << "no device yet";
  sockaddr_in a = loopback(test_port(8));
  ASSERT_EQ(rdma_bind_addr(bound, reinterpret_cast<sockaddr*>(&a)), 0) << strerror(errno);
  ASSERT_NE(bound->pd, nullptr);
  EXPECT_EQ(bound->pd->context, bound->verbs);
  rdma_cm_id* active = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &active, nullptr, RDMA_PS_UDP), 0);
  sockaddr_in dst = loopback(test_port(9));
  ASSERT_EQ(rdma_resolve_addr(active, nullptr, reinterpret_cast<sockaddr*>(&dst), 1000), 0);
  expect_event(ch, active, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(active->pd, bound->pd) << "one default PD per device";
  // The PD works: an MR registers on it.
  char buf[64];
  ibv_mr* mr = ibv_reg_mr(active->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  ibv_pd* mine = ibv_alloc_pd(active->verbs);
  ASSERT_NE(mine, nullptr);
  ibv_qp_init_attr qa{};
  qa.cap = {4, 4, 1, 1, 0};
  qa.qp_type = IBV_QPT_UD;
  ASSERT_EQ(rdma_create_qp(active, mine, &qa), 0) << strerror(errno);
  EXPECT_EQ(active->pd, mine);
  rdma_destroy_qp(active);
  rdma_destroy_id(active);
  rdma_destroy_id(bound);
  EXPECT_EQ(ibv_dealloc_pd(mine), 0);
  rdma_destroy_event_channel(ch);
}

// External QPs (rdma-core's test_rdmacm_async_traffic_external_qp): each side creates its QP
// with ibv_create_qp, not rdma_create_qp, names it in conn_param.qp_num and moves it through
// INIT, RTR and RTS itself with rdma_init_qp_attr's attributes. The active side gets
// CONNECT_RESPONSE (its id has no QP) and finishes with rdma_establish; the passive side's
// QP is in RTS before rdma_accept. Then the two QPs carry a Send each way.
namespace {
struct ExtSide {
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  char buf[64] = {};
  bool make(rdma_cm_id* id) {
    cq = ibv_create_cq(id->verbs, 8, nullptr, nullptr, 0);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.cap = {4, 4, 1, 1, 0};
    a.qp_type = IBV_QPT_RC;
    qp = cq ? ibv_create_qp(id->pd, &a) : nullptr;
    mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    return qp && mr;
  }
  // INIT, RTR, RTS with the id's attributes, as the test's modify_ext_qp_to_rts.
  bool to_rts(rdma_cm_id* id) {
    for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
      ibv_qp_attr a{};
      int mask = 0;
      a.qp_state = s;
      if (rdma_init_qp_attr(id, &a, &mask) || ibv_modify_qp(qp, &a, mask)) return false;
    }
    return true;
  }
  bool recv() {
    ibv_sge g{reinterpret_cast<uint64_t>(buf), sizeof buf, mr->lkey};
    ibv_recv_wr w{};
    w.sg_list = &g;
    w.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(qp, &w, &bad) == 0;
  }
  bool send(const char* text) {
    std::snprintf(buf, sizeof buf, "%s", text);
    ibv_sge g{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(std::strlen(text) + 1),
              mr->lkey};
    ibv_send_wr w{};
    w.sg_list = &g;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &w, &bad) == 0;
  }
  // The next completion's status and opcode, polled for up to 5 s.
  bool next(ibv_wc& wc) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until)
      if (ibv_poll_cq(cq, 1, &wc) == 1) return true;
    return false;
  }
  ~ExtSide() {
    if (qp) ibv_destroy_qp(qp);
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
  }
};
}  // namespace

TEST(CmExternalQp, EachSidesOwnQpIsConnectedAndCarriesTraffic) {
  const uint16_t port = test_port(10);
  rdma_event_channel* sch = rdma_create_event_channel();
  rdma_event_channel* cch = rdma_create_event_channel();
  ASSERT_TRUE(sch && cch);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_id(sch, &listen, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(listen, 4), 0);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(cch, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 1000), 0);
  expect_event(cch, id, RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(id, 1000), 0);
  expect_event(cch, id, RDMA_CM_EVENT_ROUTE_RESOLVED);
  ExtSide client;
  ASSERT_TRUE(client.make(id)) << strerror(errno);
  rdma_conn_param cp{};
  cp.qp_num = 0xFFFFFF;  // names no QP of ours
  EXPECT_EQ(rdma_connect(id, &cp), -1);
  EXPECT_EQ(errno, EINVAL);
  cp.qp_num = client.qp->qp_num;
  ASSERT_EQ(rdma_connect(id, &cp), 0) << strerror(errno);
  // The passive side: its QP in RTS before the accept.
  ASSERT_TRUE(readable(sch->fd, 5000));
  rdma_cm_event* ev = nullptr;
  ASSERT_EQ(rdma_get_cm_event(sch, &ev), 0);
  ASSERT_EQ(ev->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  ExtSide server;
  ASSERT_TRUE(server.make(child));
  ASSERT_TRUE(server.to_rts(child)) << strerror(errno);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(server.qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS) << "moved by the program before the accept";
  // A QP another id connects cannot be this one's too.
  rdma_cm_id* other = nullptr;
  ASSERT_EQ(rdma_create_id(cch, &other, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_resolve_addr(other, nullptr, reinterpret_cast<sockaddr*>(&a), 1000), 0);
  expect_event(cch, other, RDMA_CM_EVENT_ADDR_RESOLVED);
  EXPECT_EQ(rdma_connect(other, &cp), -1) << "the client's QP is its id's";
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_id(other);
  ASSERT_TRUE(server.recv());
  rdma_conn_param sp{};
  sp.qp_num = server.qp->qp_num;
  ASSERT_EQ(rdma_accept(child, &sp), 0) << strerror(errno);
  // The active side: its id has no QP, so the connection waits for rdma_establish.
  expect_event(cch, id, RDMA_CM_EVENT_CONNECT_RESPONSE);
  ASSERT_TRUE(client.to_rts(id)) << strerror(errno);
  ASSERT_TRUE(client.recv());
  ASSERT_EQ(rdma_establish(id), 0) << strerror(errno);
  expect_event(sch, child, RDMA_CM_EVENT_ESTABLISHED);
  EXPECT_EQ(id->qp, nullptr) << "the id still has no QP of its own, as in librdmacm";
  ASSERT_EQ(ibv_query_qp(client.qp, &qa, IBV_QP_STATE | IBV_QP_TIMEOUT, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(qa.timeout, 14) << "rdma_cm's RTS attribute";
  ASSERT_TRUE(client.send("from the client"));
  ibv_wc wc{};
  ASSERT_TRUE(server.next(wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_STREQ(server.buf, "from the client");
  ASSERT_TRUE(client.next(wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(server.send("from the server"));
  ASSERT_TRUE(client.next(wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_STREQ(client.buf, "from the server");
  // rdma_disconnect flushes the external QP, and the peer hears of it.
  ASSERT_EQ(rdma_disconnect(id), 0);
  expect_event(cch, id, RDMA_CM_EVENT_DISCONNECTED);
  expect_event(sch, child, RDMA_CM_EVENT_DISCONNECTED);
  ASSERT_EQ(ibv_query_qp(client.qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_ERR);
  rdma_destroy_id(child);
  rdma_destroy_id(id);
  rdma_destroy_id(listen);
  rdma_destroy_event_channel(sch);
  rdma_destroy_event_channel(cch);
}

// RDMA_OPTION_ID_ACK_TIMEOUT (rdma-core's test_rdmacm sets 21 on both sides and reads it back
// with ibv_query_qp): the connected QP's RTS attribute `timeout` is the one set, on the
// active id before rdma_connect and on the passive child before rdma_accept. librdmacm takes
// one byte, the kernel only for RC ids; past the 5-bit field is refused too.
TEST(CmOptions, AckTimeoutIsTheConnectedQpsTimeout) {
  const uint16_t port = test_port(7);
  rdma_cm_id* listen = listening_ep(port, 4);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = ready_to_connect(ch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  uint8_t t = 21;
  int big = 21;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &big, sizeof big), -1);
  EXPECT_EQ(errno, EINVAL) << "optlen is one byte";
  uint8_t too_big = 32;
  EXPECT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &too_big, 1), -1);
  EXPECT_EQ(errno, EINVAL) << "the IB field has 5 bits";
  ASSERT_EQ(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof t), 0);
  // rdma_init_qp_attr's RTS step gives it to a program that moves its own QP.
  ibv_qp_attr now{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(id->qp, &now, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(now.qp_state, IBV_QPS_INIT);
  std::promise<void> checked;
  std::thread server([&, done = checked.get_future()]() mutable {
    rdma_cm_id* child = nullptr;
    ASSERT_EQ(rdma_get_request(listen, &child), 0);
    uint8_t ct = 19;
    ASSERT_EQ(rdma_set_option(child, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ct, 1), 0);
    ASSERT_EQ(rdma_accept(child, nullptr), 0);
    ibv_qp_attr qa{};
    ibv_qp_init_attr ci{};
    ASSERT_EQ(ibv_query_qp(child->qp, &qa, IBV_QP_TIMEOUT | IBV_QP_STATE, &ci), 0);
    EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(qa.timeout, 19) << "the passive side's own setting";
    done.wait();  // the client's QP is checked before the disconnect moves it to ERR
    rdma_disconnect(child);
    rdma_destroy_ep(child);
  });
  ASSERT_EQ(rdma_connect(id, nullptr), 0);
  expect_event(ch, id, RDMA_CM_EVENT_ESTABLISHED);
  ibv_qp_attr qa{};
  ASSERT_EQ(ibv_query_qp(id->qp, &qa, IBV_QP_TIMEOUT | IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(qa.timeout, 21);
  checked.set_value();
  server.join();
  // rdma_init_qp_attr's RTS step, for a program that moves its own QP: on a fresh id, whose
  // QP rdma_init_qp_attr's own RTR step brought to RTR.
  rdma_disconnect(id);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_cm_id* id2 = ready_to_connect(ch, port);
  ASSERT_NE(id2, nullptr);
  uint8_t t2 = 9;
  ASSERT_EQ(rdma_set_option(id2, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t2, 1), 0);
  // The caller names the state it wants (librdmacm passes it to the kernel); only INIT, RTR
  // and RTS have attributes.
  ibv_qp_attr ia{};
  int mask = 0;
  ia.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(rdma_init_qp_attr(id2, &ia, &mask), -1);
  EXPECT_EQ(errno, EINVAL);
  ia.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(rdma_init_qp_attr(id2, &ia, &mask), 0);
  ASSERT_EQ(ia.qp_state, IBV_QPS_RTR);
  ASSERT_EQ(ibv_modify_qp(id2->qp, &ia, mask), 0) << strerror(errno);
  ia.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(rdma_init_qp_attr(id2, &ia, &mask), 0);
  EXPECT_EQ(ia.qp_state, IBV_QPS_RTS);
  EXPECT_TRUE(mask & IBV_QP_TIMEOUT);
  EXPECT_EQ(ia.timeout, 9);
  ASSERT_EQ(ibv_modify_qp(id2->qp, &ia, mask), 0) << strerror(errno);
  rdma_destroy_qp(id2);
  rdma_destroy_id(id2);
  // UD ids have no ACK timeout (the kernel's rdma_set_ack_timeout: RC only).
  rdma_cm_id* ud = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &ud, nullptr, RDMA_PS_UDP), 0);
  EXPECT_EQ(rdma_set_option(ud, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, 1), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_id(ud);
  rdma_destroy_event_channel(ch);
  rdma_destroy_ep(listen);
}

// rdma_destroy_qp while the connection completes on the progress thread (RDS tears a QP
// down whenever a reset interrupts its connect). The completion either finds the QP gone
// (the socket stays with the id: CONNECT_RESPONSE) or connects it first; it must never hand
// a QP that is being destroyed its socket. Before the fix the race gave the dying QP a
// registered socket, and the progress thread called its freed handler (TSan, ASan).
TEST(CmRace, AQpDestroyedAsItsConnectionCompletesNeverGetsTheSocket) {
  constexpr int kCalibration = 5;
  constexpr int kRounds = 150;
  const uint16_t port = test_port(5);
  rdma_cm_id* listen = listening_ep(port, 64);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  std::vector<rdma_cm_id*> children;
  std::thread server([&] {
    for (int r = 0; r < kCalibration + kRounds; ++r) {
      rdma_cm_id* child = nullptr;
      if (rdma_get_request(listen, &child)) return;
      rdma_accept(child, nullptr);  // the client may be gone already: its error is fine
      children.push_back(child);
    }
  });
  // One round: connect, wait `delay`, destroy the QP (at once, or after its event), and
  // return the event the connect ended with.
  auto round = [&](std::chrono::nanoseconds delay, bool destroy_first,
                   std::chrono::nanoseconds* took) {
    rdma_cm_event_type t = RDMA_CM_EVENT_TIMEWAIT_EXIT;
    rdma_cm_id* id = ready_to_connect(ch, port);
    if (!id) return t;
    rdma_conn_param cp{};
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    const auto start = std::chrono::steady_clock::now();
    if (rdma_connect(id, &cp) == 0) {
      while (std::chrono::steady_clock::now() < start + delay) {
      }
      if (destroy_first) {
        rdma_destroy_qp(id);
        EXPECT_EQ(id->qp, nullptr);
      }
      t = next_event(ch, id);
      if (took) *took = std::chrono::steady_clock::now() - start;
    }
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    return t;
  };
  // How long a handshake takes here (sanitizers make it 10x slower), so the destroys below
  // land before, during and after the completion in every build.
  std::vector<std::chrono::nanoseconds> took(kCalibration);
  for (auto& d : took) EXPECT_EQ(round({}, false, &d), RDMA_CM_EVENT_ESTABLISHED);
  std::sort(took.begin(), took.end());
  const auto handshake = took[kCalibration / 2];
  int established = 0, qp_less = 0;
  for (int r = 0; r < kRounds; ++r) {
    const rdma_cm_event_type t = round(handshake * (r % 30) / 15, true, nullptr);
    if (t == RDMA_CM_EVENT_ESTABLISHED)
      ++established;
    else if (t == RDMA_CM_EVENT_CONNECT_RESPONSE)
      ++qp_less;
    else
      ADD_FAILURE() << "round " << r << ": " << rdma_event_str(t);
  }
  server.join();
  EXPECT_EQ(established + qp_less, kRounds);
  std::printf(
      "%d rounds, handshake %lld us: %d connected before the destroy, %d found the QP gone\n",
      kRounds, static_cast<long long>(handshake.count() / 1000), established, qp_less);
  for (rdma_cm_id* c : children) {
    rdma_disconnect(c);
    rdma_destroy_ep(c);
  }
  rdma_destroy_event_channel(ch);
  rdma_destroy_ep(listen);
}

// The application moves its QP to ERR while the connection is being set up. siw refuses
// the QP's move to RTS then and the connection fails; the QP must not come back to life
// with the socket (it did: the completion forced RTS over ERR).
TEST(CmConnect, AQpMovedToErrWhileConnectingStaysThereAndTheConnectFails) {
  const uint16_t port = test_port(6);
  rdma_cm_id* listen = listening_ep(port, 4);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  std::promise<void> requested, go;
  rdma_cm_event_type server_saw = RDMA_CM_EVENT_TIMEWAIT_EXIT;
  int accept_rc = -2;
  std::thread server([&, asked = go.get_future()]() mutable {
    rdma_cm_id* child = nullptr;
    const int r = rdma_get_request(listen, &child);
    requested.set_value();
    if (r) return;
    asked.wait();
    accept_rc = rdma_accept(child, nullptr);
    // The client's side refused the connection: its socket closes under our established QP.
    if (accept_rc == 0 && readable(child->channel->fd, 5000)) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(child->channel, &ev) == 0) {
        server_saw = ev->event;
        rdma_ack_cm_event(ev);
      }
    }
    rdma_destroy_ep(child);
  });
  rdma_cm_id* id = ready_to_connect(ch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  rdma_conn_param cp{};
  cp.responder_resources = 1;
  cp.initiator_depth = 1;
  ASSERT_EQ(rdma_connect(id, &cp), 0);
  requested.get_future().wait();  // the handshake now waits for the server's accept
  ibv_qp_attr qa{};
  qa.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(id->qp, &qa, IBV_QP_STATE), 0);
  go.set_value();
  expect_event(ch, id, RDMA_CM_EVENT_CONNECT_ERROR);
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(qa.qp_state, IBV_QPS_ERR) << "the connection revived a QP in ERR";
  server.join();
  EXPECT_EQ(accept_rc, 0);
  EXPECT_EQ(server_saw, RDMA_CM_EVENT_DISCONNECTED) << rdma_event_str(server_saw);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  rdma_destroy_ep(listen);
}

namespace {
uint64_t env_or(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}
// One completion from cq within 5 s (busy-polled).
bool poll_one(ibv_cq* cq, ibv_wc& wc) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end)
    if (ibv_poll_cq(cq, 1, &wc) == 1) return true;
  return false;
}
}  // namespace

// A TCP connect refused shortly after this process sent a Placement Ack it had held for an
// answer, and without one, is tried again for SOFTVERBS_REFUSED_RETRY_US (engine/iw_cm.cc
// Endpoint::connect): perftest -R's server listens only once its last Send completes on
// that ack. Here the server side of an in-process pair gets one signaled Send and never
// answers, so its ack is held and then flushed; the client at once connects to a port where
// a listener appears 1.5 s later. The outcome depends on the process's settings, so each
// ctest run asserts one case exactly:
//  - the default window (3 ms) ends long before the listener: REJECTED;
//  - a 5 s window (ctest cm_refused_retry): the connect waits it out and is ESTABLISHED;
//  - a 5 s window but a 1 s handshake timeout (cm_refused_retry_timeout): the timeout ends
//    the retries, and the connect reports REJECTED (it was refused), not UNREACHABLE, no
//    sooner than the timeout (a connect refused once, not retried, reports at once).
TEST(CmConnect, ARefusedConnectJustAfterAHeldAckIsRetriedWithinTheWindow) {
  const uint64_t window_ms = env_or("SOFTVERBS_REFUSED_RETRY_US", 3000) / 1000;
  const uint64_t mpa_ms = env_or("SOFTVERBS_MPA_TIMEOUT_MS", 10000);
  constexpr uint64_t kListenAfterMs = 1500, kMarginMs = 500;
  // Retries last from the ack's flush for the window (twice it at most), or to the timeout.
  const uint64_t retries_ms = std::min(window_ms, mpa_ms);
  const bool waits_it_out = retries_ms > kListenAfterMs + kMarginMs;
  ASSERT_TRUE(waits_it_out || std::min(2 * window_ms, mpa_ms) + kMarginMs <= kListenAfterMs)
      << "settings too close to the late listener to tell the outcome";
  const bool times_out = !waits_it_out && mpa_ms < window_ms;
  // 1. A pair, and one signaled Send the server never answers: its ack is held, then flushed.
  const uint16_t port = free_port();
  ASSERT_NE(port, 0) << strerror(errno);
  rdma_cm_id* listen = listening_ep(port, 4);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  std::promise<rdma_cm_id*> accepted;
  std::thread server([&] {
    rdma_cm_id* child = nullptr;
    // Bounded: a connect that never came (a failed step below) must fail the test, not
    // leave it waiting here, and the main thread in get() below, for ever.
    if (!readable(listen->channel->fd, 10000) || rdma_get_request(listen, &child))
      return accepted.set_value(nullptr);
    static char rbuf[64];
    ibv_mr* mr = ibv_reg_mr(child->pd, rbuf, sizeof rbuf, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || rdma_post_recv(child, nullptr, rbuf, sizeof rbuf, mr) ||
        rdma_accept(child, nullptr)) {
      rdma_destroy_ep(child);
      return accepted.set_value(nullptr);
    }
    child->context = mr;
    accepted.set_value(child);
  });
  rdma_cm_id* id = ready_to_connect(ch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(id, nullptr), 0);
  expect_event(ch, id, RDMA_CM_EVENT_ESTABLISHED);
  rdma_cm_id* child = accepted.get_future().get();
  server.join();
  ASSERT_NE(child, nullptr);
  char sbuf[16] = "held ack";
  ASSERT_EQ(
      rdma_post_send(id, nullptr, sbuf, sizeof sbuf, nullptr, IBV_SEND_INLINE | IBV_SEND_SIGNALED),
      0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(id->send_cq, wc));  // IB's rule: on the server's ack
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(poll_one(child->recv_cq, wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  // 2. A connect to a port with no listener yet; the listener comes kListenAfterMs later.
  const uint16_t late = free_port();
  ASSERT_NE(late, 0) << strerror(errno);
  rdma_event_channel* ch2 = rdma_create_event_channel();
  ASSERT_NE(ch2, nullptr);
  rdma_cm_id* late_id = ready_to_connect(ch2, late);
  ASSERT_NE(late_id, nullptr) << strerror(errno);
  std::thread late_server([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(kListenAfterMs));
    rdma_cm_id* l = listening_ep(late, 4);
    if (!l) return;
    rdma_cm_id* c = nullptr;
    // Only a connect that waited gets here; take it in and end it when the client does.
    if (waits_it_out && readable(l->channel->fd, 10000) && rdma_get_request(l, &c) == 0) {
      if (rdma_accept(c, nullptr) == 0 && readable(c->channel->fd, 5000)) {
        rdma_cm_event* ev = nullptr;
        if (rdma_get_cm_event(c->channel, &ev) == 0) rdma_ack_cm_event(ev);
      }
      rdma_destroy_ep(c);
    }
    rdma_destroy_ep(l);
  });
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(rdma_connect(late_id, nullptr), 0);
  const rdma_cm_event_type got = next_event(ch2, late_id);
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (waits_it_out) {
    EXPECT_EQ(got, RDMA_CM_EVENT_ESTABLISHED) << rdma_event_str(got);
    rdma_disconnect(late_id);
  } else {
    EXPECT_EQ(got, RDMA_CM_EVENT_REJECTED) << rdma_event_str(got);
  }
  // The handshake timeout runs from rdma_connect; the retries kept it connecting until then.
  if (times_out) {
    EXPECT_GE(static_cast<uint64_t>(took), mpa_ms * 9 / 10);
  }
  late_server.join();
  rdma_destroy_qp(late_id);
  rdma_destroy_id(late_id);
  rdma_destroy_event_channel(ch2);
  rdma_disconnect(id);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  ibv_dereg_mr(static_cast<ibv_mr*>(child->context));
  rdma_destroy_ep(child);
  rdma_destroy_ep(listen);
}

namespace {
// An id on ch whose route to 127.0.0.1:port is resolved (no QP): ready for rdma_connect.
rdma_cm_id* resolved_id(rdma_event_channel* ch, uint16_t port) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return nullptr;
  sockaddr_in a = loopback(port);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 1000) ||
      next_event(ch, id) != RDMA_CM_EVENT_ADDR_RESOLVED || rdma_resolve_route(id, 1000) ||
      next_event(ch, id) != RDMA_CM_EVENT_ROUTE_RESOLVED) {
    rdma_destroy_id(id);
    return nullptr;
  }
  return id;
}

// A listener at 127.0.0.1:port on ch (nullptr: synchronous, on a channel of its own, as
// librdmacm makes it); nullptr on failure.
rdma_cm_id* listener_on(rdma_event_channel* ch, uint16_t port) {
  rdma_cm_id* l = nullptr;
  if (rdma_create_id(ch, &l, nullptr, RDMA_PS_TCP)) return nullptr;
  sockaddr_in a = loopback(port);
  if (rdma_bind_addr(l, reinterpret_cast<sockaddr*>(&a)) || rdma_listen(l, 4)) {
    rdma_destroy_id(l);
    return nullptr;
  }
  return l;
}
// A listener at a free port on its own channel, and a channel for clients: what every
// CmEvents test starts from. Whatever the test left is destroyed at its end.
struct ListenSide {
  uint16_t port = free_port();
  rdma_event_channel* sch = rdma_create_event_channel();
  rdma_event_channel* cch = rdma_create_event_channel();
  rdma_cm_id* listen = port && sch ? listener_on(sch, port) : nullptr;
  bool ok() const { return port && sch && cch && listen; }
  ~ListenSide() {
    if (listen) rdma_destroy_id(listen);
    if (sch) rdma_destroy_event_channel(sch);
    if (cch) rdma_destroy_event_channel(cch);
  }
};
}  // namespace

// A connect request is counted against the listener until acked, as librdmacm acks it on the
// listen id: a program may reject and destroy the new id first and ack after (cmtime's
// CONNECT_REQUEST handler does), which waited for itself for ever. The listener's destroy
// then waits for that ack; one destroyed with a request still queued takes the request's
// new id with it, refused, so the peer hears REJECTED instead of waiting.
TEST(CmEvents, AConnectRequestIsTheListenersToAckAndGoesWithIt) {
  ListenSide L;
  ASSERT_TRUE(L.ok()) << strerror(errno);
  const uint16_t port = L.port;
  rdma_event_channel *sch = L.sch, *cch = L.cch;
  rdma_cm_id*& listen = L.listen;
  rdma_cm_id* id = resolved_id(cch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(id, nullptr), 0);
  ASSERT_TRUE(readable(sch->fd, 5000));
  rdma_cm_event* req = nullptr;
  ASSERT_EQ(rdma_get_cm_event(sch, &req), 0);
  ASSERT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req->listen_id, listen);
  rdma_cm_id* child = req->id;
  ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
  std::atomic<bool> destroyed{false};
  std::thread t([&] {
    rdma_destroy_id(child);  // before the request is acked
    destroyed = true;
  });
  for (int i = 0; i < 500 && !destroyed.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_TRUE(destroyed.load()) << "the new id's destroy waited for its listener's event";
  if (!destroyed.load()) rdma_ack_cm_event(req);  // let it end, and fail
  t.join();
  if (destroyed.load()) rdma_ack_cm_event(req);
  EXPECT_EQ(next_event(cch, id), RDMA_CM_EVENT_REJECTED);
  rdma_destroy_id(id);

  // A request left queued when the listener goes: the peer is refused.
  rdma_cm_id* id2 = resolved_id(cch, port);
  ASSERT_NE(id2, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(id2, nullptr), 0);
  ASSERT_TRUE(readable(sch->fd, 5000)) << "no request queued";
  ASSERT_EQ(rdma_destroy_id(listen), 0);
  listen = nullptr;
  EXPECT_FALSE(readable(sch->fd, 0)) << "the request outlived its listener";
  EXPECT_EQ(next_event(cch, id2), RDMA_CM_EVENT_REJECTED);
  rdma_destroy_id(id2);
}

// Private data a Request, a Reply or a SIDR REQ cannot carry whole is EINVAL (what a provider
// and ib_send_cm_sidr_req return), not data cut short; what fits goes whole.
TEST(CmEvents, PrivateDataTooLongIsEinvalAndWhatFitsArrivesWhole) {
  ListenSide L;
  ASSERT_TRUE(L.ok()) << strerror(errno);
  const uint16_t port = L.port;
  rdma_event_channel *sch = L.sch, *cch = L.cch;

  rdma_cm_id* id = resolved_id(cch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  std::vector<uint8_t> pd(255);
  for (size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<uint8_t>(i);
  rdma_conn_param cp{};
  cp.private_data = pd.data();
  cp.private_data_len = 253;
  errno = 0;
  EXPECT_EQ(rdma_connect(id, &cp), -1);
  EXPECT_EQ(errno, EINVAL);
  cp.private_data_len = 252;
  ASSERT_EQ(rdma_connect(id, &cp), 0) << strerror(errno);
  ASSERT_TRUE(readable(sch->fd, 5000));
  rdma_cm_event* req = nullptr;
  ASSERT_EQ(rdma_get_cm_event(sch, &req), 0);
  ASSERT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  ASSERT_GE(req->param.conn.private_data_len, 252);
  EXPECT_EQ(std::memcmp(req->param.conn.private_data, pd.data(), 252), 0);
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);
  rdma_conn_param ap{};
  ap.private_data = pd.data();
  ap.private_data_len = 255;
  EXPECT_EQ(rdma_accept(child, &ap), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_reject(child, nullptr, 0);
  rdma_destroy_id(child);
  EXPECT_EQ(next_event(cch, id), RDMA_CM_EVENT_REJECTED);
  rdma_destroy_id(id);

  // UD: a SIDR REQ carries 180 bytes beside rdma_cm's header.
  rdma_cm_id* ud = nullptr;
  ASSERT_EQ(rdma_create_id(cch, &ud, nullptr, RDMA_PS_UDP), 0);
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rdma_resolve_addr(ud, nullptr, reinterpret_cast<sockaddr*>(&a), 1000), 0);
  ASSERT_EQ(next_event(cch, ud), RDMA_CM_EVENT_ADDR_RESOLVED);
  ASSERT_EQ(rdma_resolve_route(ud, 1000), 0);
  ASSERT_EQ(next_event(cch, ud), RDMA_CM_EVENT_ROUTE_RESOLVED);
  rdma_conn_param up{};
  up.private_data = pd.data();
  up.private_data_len = 181;
  EXPECT_EQ(rdma_connect(ud, &up), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_id(ud);
}

// An id destroyed while its connect is in flight, and a new id made at once (the allocator
// hands it the old one's memory, as a program that retries does): the old handshake's outcome
// is not the new id's. It was, when the completion checked the address alone.
TEST(CmEvents, AHandshakeOfADestroyedIdNeverReachesTheIdMadeInItsPlace) {
  ListenSide L;
  ASSERT_TRUE(L.ok()) << strerror(errno);
  const uint16_t port = L.port;
  rdma_event_channel *sch = L.sch, *cch = L.cch;

  rdma_cm_id* old_id = resolved_id(cch, port);
  ASSERT_NE(old_id, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(old_id, nullptr), 0);
  ASSERT_TRUE(readable(sch->fd, 5000));
  rdma_cm_event* req = nullptr;
  ASSERT_EQ(rdma_get_cm_event(sch, &req), 0);
  ASSERT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);
  ASSERT_EQ(rdma_destroy_id(old_id), 0);  // its handshake waits for our answer
  rdma_cm_id* fresh = nullptr;
  ASSERT_EQ(rdma_create_id(cch, &fresh, nullptr, RDMA_PS_TCP), 0);
  // The answer comes to an endpoint whose id is gone: it must find it gone.
  ASSERT_EQ(rdma_reject(child, nullptr, 0), 0);
  EXPECT_FALSE(readable(cch->fd, 300))
      << "the destroyed id's outcome reached "
      << (fresh == old_id ? "the id made at its address" : "the channel");
  rdma_destroy_id(fresh);
  rdma_destroy_id(child);
}

// The listen backlog bounds the connect requests queued and not yet retrieved, as ucma's
// does: past it a request is refused (the peer hears REJECTED), so a peer flooding requests
// the application is not taking costs a bounded number of ids and sockets; retrieving one
// frees its place.
TEST(CmEvents, TheListenBacklogBoundsRequestsNotYetRetrieved) {
  const uint16_t port = free_port();
  ASSERT_NE(port, 0);
  rdma_event_channel* sch = rdma_create_event_channel();
  rdma_event_channel* cch = rdma_create_event_channel();
  ASSERT_TRUE(sch && cch);
  rdma_cm_id* listen = nullptr;
  ASSERT_EQ(rdma_create_id(sch, &listen, nullptr, RDMA_PS_TCP), 0);
  sockaddr_in a = loopback(port);
  ASSERT_EQ(rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&a)), 0);
  ASSERT_EQ(rdma_listen(listen, 2), 0);
  // Each client on its own channel, so its outcome is its own.
  std::vector<rdma_event_channel*> chs;
  std::vector<rdma_cm_id*> ids;
  auto connect_one = [&]() -> rdma_cm_id* {
    rdma_event_channel* ch = rdma_create_event_channel();
    chs.push_back(ch);
    rdma_cm_id* id = resolved_id(ch, port);
    if (id && rdma_connect(id, nullptr) == 0) {
      ids.push_back(id);
      return id;
    }
    return nullptr;
  };
  ASSERT_NE(connect_one(), nullptr);
  ASSERT_TRUE(readable(sch->fd, 5000));
  ASSERT_NE(connect_one(), nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the second one queued
  rdma_cm_id* third = connect_one();
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(next_event(chs[2], third), RDMA_CM_EVENT_REJECTED) << "past the backlog of 2";
  EXPECT_FALSE(readable(chs[0]->fd, 0)) << "a request within the backlog was answered";
  EXPECT_FALSE(readable(chs[1]->fd, 0)) << "a request within the backlog was answered";
  // Retrieving one frees a place: the next request is queued, not refused.
  rdma_cm_event* req = nullptr;
  ASSERT_EQ(rdma_get_cm_event(sch, &req), 0);
  ASSERT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);
  rdma_cm_id* fourth = connect_one();
  ASSERT_NE(fourth, nullptr);
  EXPECT_FALSE(readable(chs[3]->fd, 300)) << "refused though a place was free";
  rdma_reject(child, nullptr, 0);
  rdma_destroy_id(child);
  rdma_destroy_id(listen);  // refuses what is still queued
  for (size_t i = 0; i < ids.size(); ++i) rdma_destroy_id(ids[i]);
  for (auto* ch : chs) rdma_destroy_event_channel(ch);
  rdma_destroy_event_channel(sch);
  rdma_destroy_event_channel(cch);
}

// librdmacm gives each new id of a synchronous listener (one made without a channel) a
// channel of its own when its request is read (ucma_process_conn_req), however it is read.
// Sharing the listener's private channel, it lost that channel to the listener's
// rdma_migrate_id, and its events went to a freed channel.
TEST(CmEvents, ASynchronousListenersNewIdsHaveChannelsOfTheirOwn) {
  const uint16_t port = free_port();
  ASSERT_NE(port, 0);
  rdma_event_channel* cch = rdma_create_event_channel();
  rdma_event_channel* sch2 = rdma_create_event_channel();
  ASSERT_TRUE(cch && sch2);
  rdma_cm_id* listen = listener_on(nullptr, port);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_cm_id* id = resolved_id(cch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(id, nullptr), 0);
  rdma_cm_event* req = nullptr;
  ASSERT_EQ(rdma_get_cm_event(listen->channel, &req), 0);
  ASSERT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  rdma_cm_id* child = req->id;
  ASSERT_NE(child->channel, nullptr);
  EXPECT_NE(child->channel, listen->channel) << "the new id shares its listener's channel";
  rdma_ack_cm_event(req);
  ASSERT_EQ(rdma_migrate_id(listen, sch2), 0);  // the listener's private channel goes
  // Synchronous: rdma_accept returns once the connection is up.
  ASSERT_EQ(rdma_accept(child, nullptr), 0) << strerror(errno);
  // No QP at the client: it hears the reply as CONNECT_RESPONSE (rdma_establish is its own).
  EXPECT_EQ(next_event(cch, id), RDMA_CM_EVENT_CONNECT_RESPONSE);
  rdma_destroy_id(child);
  rdma_destroy_id(id);
  rdma_destroy_id(listen);
  rdma_destroy_event_channel(sch2);
  rdma_destroy_event_channel(cch);
}

// ... and a request whose new id can get no channel (no descriptor left) is refused and
// never returned: rdma_get_cm_event reads on, as librdmacm's retry does.
TEST(CmEvents, ARequestWhoseNewIdGetsNoChannelIsRefused) {
  const uint16_t port = free_port();
  ASSERT_NE(port, 0);
  rdma_event_channel* cch = rdma_create_event_channel();
  ASSERT_NE(cch, nullptr);
  rdma_cm_id* listen = listener_on(nullptr, port);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_cm_id* id = resolved_id(cch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(id, nullptr), 0);
  ASSERT_TRUE(readable(listen->channel->fd, 5000));
  const int fl = fcntl(listen->channel->fd, F_GETFL);
  ASSERT_EQ(fcntl(listen->channel->fd, F_SETFL, fl | O_NONBLOCK), 0);
  // Every descriptor below the lowest free one is taken: a limit there leaves none.
  const int lowest = dup(0);
  ASSERT_GE(lowest, 0);
  close(lowest);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(lowest);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  rdma_cm_event* req = nullptr;
  const int r = rdma_get_cm_event(listen->channel, &req);
  const int e = errno;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(r, -1) << "a request was returned: " << (req ? rdma_event_str(req->event) : "");
  EXPECT_EQ(e, EAGAIN);
  EXPECT_EQ(next_event(cch, id), RDMA_CM_EVENT_REJECTED);
  rdma_destroy_id(id);
  rdma_destroy_id(listen);
  rdma_destroy_event_channel(cch);
}

// A listener migrated to another channel takes its queued connect requests along, with their
// new ids (ucma_move_events): they are the new channel's to deliver, and go with the listener
// when it is destroyed there (left behind, they named a freed listener).
TEST(CmEvents, AMigratedListenerTakesItsConnectRequestsAlong) {
  const uint16_t port = free_port();
  ASSERT_NE(port, 0);
  rdma_event_channel* sch = rdma_create_event_channel();
  rdma_event_channel* sch2 = rdma_create_event_channel();
  rdma_event_channel* cch = rdma_create_event_channel();
  ASSERT_TRUE(sch && sch2 && cch);
  rdma_cm_id* listen = listener_on(sch, port);
  ASSERT_NE(listen, nullptr) << strerror(errno);
  rdma_cm_id* id = resolved_id(cch, port);
  ASSERT_NE(id, nullptr) << strerror(errno);
  ASSERT_EQ(rdma_connect(id, nullptr), 0);
  ASSERT_TRUE(readable(sch->fd, 5000));
  ASSERT_EQ(rdma_migrate_id(listen, sch2), 0);
  EXPECT_FALSE(readable(sch->fd, 0)) << "the request stayed on the old channel";
  ASSERT_TRUE(readable(sch2->fd, 0)) << "the request did not move with its listener";
  rdma_cm_event* req = nullptr;
  ASSERT_EQ(rdma_get_cm_event(sch2, &req), 0);
  ASSERT_EQ(req->event, RDMA_CM_EVENT_CONNECT_REQUEST);
  EXPECT_EQ(req->listen_id, listen);
  EXPECT_EQ(req->id->channel, sch2) << "its new id is on the listener's channel";
  rdma_cm_id* child = req->id;
  rdma_ack_cm_event(req);
  // A second request, left queued when the migrated listener is destroyed: refused.
  rdma_cm_id* id2 = resolved_id(cch, port);
  ASSERT_NE(id2, nullptr);
  ASSERT_EQ(rdma_connect(id2, nullptr), 0);
  ASSERT_TRUE(readable(sch2->fd, 5000));
  rdma_reject(child, nullptr, 0);
  rdma_destroy_id(child);
  ASSERT_EQ(rdma_destroy_id(listen), 0);
  listen = nullptr;
  EXPECT_FALSE(readable(sch2->fd, 0));
  rdma_cm_event_type t1 = next_event(cch, nullptr), t2 = next_event(cch, nullptr);
  EXPECT_EQ(t1, RDMA_CM_EVENT_REJECTED);
  EXPECT_EQ(t2, RDMA_CM_EVENT_REJECTED);
  rdma_destroy_id(id);
  rdma_destroy_id(id2);
  rdma_destroy_event_channel(sch);
  rdma_destroy_event_channel(sch2);
  rdma_destroy_event_channel(cch);
}
