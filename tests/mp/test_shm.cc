// The shared-memory transport (issue 29, engine/shm_link.h): two processes on one host
// move their FPDUs through rings in a sealed memfd, the TCP connection kept for liveness.
// Each test checks where the bytes went (the QP's published transport) and that they
// arrived intact; the fallbacks (a peer that declines) stay on TCP and work all the same.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "harness.h"
#include "softverbs/verbs_ext.h"
#include "wire/stats_file.h"

namespace mp {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// The QP's transport as this process publishes it (softverbs-stat qp).
uint32_t transport_of(uint32_t qpn) {
  const std::string path =
      "/dev/shm/softverbs-stats-" + std::to_string(geteuid()) + "/" + std::to_string(getpid());
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  sv::wire::StatsView v;
  if (sv::wire::decode_stats({reinterpret_cast<const std::byte*>(s.data()), s.size()}, v) !=
      sv::wire::StatsError::ok)
    return ~0u;
  for (const auto& q : v.qps)
    if (q.qpn == qpn) return q.transport;
  return ~0u;
}

// Waits for the set-up messages to have gone both ways (they follow the first FPDUs).
uint32_t wait_transport(uint32_t qpn, uint32_t want) {
  uint32_t t = transport_of(qpn);
  for (int i = 0; i < 200 && t != want; ++i) {
    std::this_thread::sleep_for(Ms(10));
    t = transport_of(qpn);
  }
  return t;
}

// Both processes offer and accept shared memory unless the child is told otherwise.
class Shm : public XProc {
 protected:
  void SetUp() override {
    setenv("SOFTVERBS_SHM", "1", 1);
    g_child_env = {"SOFTVERBS_SHM=1"};
  }
  void TearDown() override {
    g_child_env.clear();
    XProc::TearDown();
  }
  // One Send each way: whichever side initiated, the offer, answer and switch have passed.
  void Exchange() {
    ASSERT_EQ(remote->post_recv(100, {sge(0, 64)}), 0);
    ASSERT_EQ(local->post_recv(100, {sge(0, 64)}), 0);
    ASSERT_EQ(local->post_send(make_send(100, {sge(64, 8)})), 0);
    ASSERT_EQ(remote->post_send(make_send(100, {sge(64, 8)})), 0);
    ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
    ASSERT_EQ(local->poll(CqSel::recv, 1).size(), 1u);
    ASSERT_EQ(remote->poll(CqSel::send, 1).size(), 1u);
    ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  }
};

TEST_F(Shm, SendsWritesReadsAndAtomicsGoThroughSharedMemoryIntact) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  EXPECT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);

  // Sends of every size class, each checked byte for byte at the peer.
  const uint32_t sizes[] = {1, 63, 64, 4095, 4096, 65536, 300000};
  for (uint32_t i = 0; i < std::size(sizes); ++i) {
    local->fill(0, 0, sizes[i], 10 + i);
    ASSERT_EQ(remote->post_recv(i, {sge(kMiB, sizes[i])}), 0);
    ASSERT_EQ(local->post_send(make_send(i, {sge(0, sizes[i])})), 0);
    auto r = remote->poll(CqSel::recv, 1);
    ASSERT_EQ(r.size(), 1u);
    ASSERT_TRUE(wc_is(r[0], i, IBV_WC_SUCCESS));
    EXPECT_EQ(r[0].byte_len, sizes[i]);
    EXPECT_EQ(remote->check(0, kMiB, sizes[i], 10 + i), -1) << sizes[i] << " B Send";
    ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  }
  // A Write and a Read of 1 MiB, four times the ring: the producer waits for room.
  local->fill(0, 0, kMiB, 77);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 20, {sge(0, kMiB)}, ri.addr, ri.rkey)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_TRUE(wc_is(s[0], 20, IBV_WC_SUCCESS));
  EXPECT_EQ(remote->check(0, 0, kMiB, 77), -1);
  remote->fill(0, kMiB, kMiB, 78);
  ASSERT_EQ(
      local->post_send(make_rdma(IBV_WR_RDMA_READ, 21, {sge(kMiB, kMiB)}, ri.addr + kMiB, ri.rkey)),
      0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_TRUE(wc_is(s[0], 21, IBV_WC_SUCCESS));
  EXPECT_EQ(local->check(0, kMiB, kMiB, 78), -1);
  // An atomic: its response comes back through the peer's ring.
  remote->write_u64(0, 2 * kMiB, 5);
  ASSERT_EQ(local->post_send(make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 22, sge(2 * kMiB, 8),
                                         ri.addr + 2 * kMiB, ri.rkey, 3, 0)),
            0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_TRUE(wc_is(s[0], 22, IBV_WC_SUCCESS));
  uint64_t old = 0;
  std::memcpy(&old, local->ptr(0, 2 * kMiB), 8);
  EXPECT_EQ(old, 5u);
  EXPECT_EQ(remote->read_u64(0, 2 * kMiB), 8u);
  EXPECT_EQ(transport_of(local->qp->qp_num), sv::wire::kTransportShm);
}

// A stream of 64 Writes of 256 KiB posted at once, then a Send behind them: the rings fill
// and drain many times over; everything lands in order (the Send's data comes last).
TEST_F(Shm, AStreamLargerThanTheRingArrivesInOrder) {
  PeerConfig lc;
  lc.max_send_wr = 128;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  ASSERT_NO_FATAL_FAILURE(Exchange());
  constexpr uint32_t kLen = 256 * 1024;
  constexpr int kWrites = 64;
  local->fill(0, 0, 2 * kMiB, 91);
  std::vector<SendSpec> chain;
  for (int i = 0; i < kWrites; ++i)
    chain.push_back(make_rdma(IBV_WR_RDMA_WRITE, i, {sge((i % 8) * kLen, kLen)},
                              ri.addr + (i % 8) * kLen, ri.rkey));
  ASSERT_EQ(remote->post_recv(kWrites, {sge(3 * kMiB, 64)}), 0);
  chain.push_back(make_send(kWrites, {sge(0, 64)}));
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, kWrites + 1);
  ASSERT_EQ(s.size(), static_cast<size_t>(kWrites + 1));
  for (const auto& wc : s) ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(remote->check(0, 0, 2 * kMiB, 91), -1);
  EXPECT_EQ(remote->check(0, 3 * kMiB, 64, 91), -1);
  EXPECT_EQ(transport_of(local->qp->qp_num), sv::wire::kTransportShm);
}

// A peer with SOFTVERBS_SHM=0 neither offers nor accepts: the connection stays on TCP.
TEST_F(Shm, APeerWithSharedMemoryOffStaysOnTcp) {
  g_child_env = {"SOFTVERBS_SHM=0"};
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  local->fill(0, 0, 100000, 5);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 100000)}, ri.addr, ri.rkey)),
            0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, 100000, 5), -1);
  EXPECT_EQ(transport_of(local->qp->qp_num), 0u);
}

// The peer is killed with Reads outstanding: the socket's end tells us, as on TCP, and every
// WR completes (the first with RETRY_EXC_ERR), nothing hangs.
TEST_F(Shm, APeerKilledMidTransferFailsEveryOutstandingWr) {
  PeerConfig lc;
  lc.max_send_wr = 64;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  std::vector<SendSpec> chain;
  for (uint64_t i = 0; i < 40; ++i)
    chain.push_back(make_rdma(IBV_WR_RDMA_READ, i, {sge(0, kMiB)}, ri.addr, ri.rkey));
  ASSERT_EQ(local->post_send_chain(chain), 0);
  std::vector<ibv_wc> wcs = local->poll(CqSel::send, 1);
  ASSERT_EQ(wcs.size(), 1u);
  ASSERT_EQ(kill(remote->pid(), SIGSTOP), 0);
  ASSERT_EQ(kill(remote->pid(), SIGKILL), 0);
  remote->mark_dead();
  auto rest = local->poll(CqSel::send, 39, Ms(5000));
  wcs.insert(wcs.end(), rest.begin(), rest.end());
  ASSERT_EQ(wcs.size(), 40u) << "WRs left outstanding after the peer died";
  size_t ok = 0;
  while (ok < wcs.size() && wcs[ok].status == IBV_WC_SUCCESS) ++ok;
  EXPECT_LT(ok, 40u);
  expect_error_then_flush(wcs, 0, 39, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wait_state(*local, IBV_QPS_ERR), IBV_QPS_ERR);
}

// A spinner owns the receive path, and the peer stops ringing (quiet bells). When it turns to
// its completion channel instead, what the peer sent meanwhile still arrives: arming hands the
// receive path back, bells come on again, and what waits in the ring is read.
TEST_F(Shm, ASpinnerThatTurnsToItsChannelStillGetsWhatCameMeanwhile) {
  PeerConfig lc;
  lc.with_channel = true;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(softverbs_cq_busy_poll(local->rcq, 1), 0);  // a spinner, said outright
  ASSERT_NO_FATAL_FAILURE(spin_receive(*local, *remote, 20));
  // The peer sends while nobody polls; then the application arms and waits on the channel.
  ASSERT_EQ(local->post_recv(99, {sge(0, 64)}), 0);
  ASSERT_EQ(remote->post_send(make_send(99, {sge(0, 32)})), 0);
  std::this_thread::sleep_for(Ms(20));
  ASSERT_EQ(ibv_req_notify_cq(local->rcq, 0), 0);
  ibv_wc wc{};
  if (ibv_poll_cq(local->rcq, 1, &wc) == 0) {
    pollfd p{local->channel->fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, static_cast<int>(kWait.count())), 1) << "the Send never arrived";
    ibv_cq* cq;
    void* ctx;
    ASSERT_EQ(ibv_get_cq_event(local->channel, &cq, &ctx), 0);
    ibv_ack_cq_events(cq, 1);
    ASSERT_EQ(ibv_poll_cq(local->rcq, 1, &wc), 1);
  }
  EXPECT_EQ(wc.wr_id, 99u);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace mp
