// The shared-memory transport (issue 29, engine/shm_link.h): two processes on one host
// move their FPDUs through rings in a sealed memfd, the TCP connection kept for liveness.
// Each test checks where the bytes went (the QP's published transport) and that they
// arrived intact; the fallbacks (a peer that declines) stay on TCP and work all the same.
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cctype>
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

// How many segments a QP read straight from its peer's memory (one copy, kDdpSvRef).
uint64_t pulls_of(pid_t pid, uint32_t qpn) {
  return qp_counter(pid, qpn, sv::wire::Ctr::shm_pulls);
}

// Both processes offer and accept shared memory unless the child is told otherwise.
class Shm : public XProc {
 protected:
  void SetUp() override {
    setenv("SOFTVERBS_SHM", "1", 1);
    g_child_env = {"SOFTVERBS_SHM=1"};
    // Under Yama's ptrace_scope 1 a child may read its parent's memory (one copy) only if
    // the parent allows it, as a program would that wants one copy both ways; without Yama
    // this fails with EINVAL and changes nothing.
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  }
  void TearDown() override {
    g_child_env.clear();
    XProc::TearDown();
  }
  // One Send each way, which sets the offer, answer and switch going whichever side
  // initiated; then, once both sides send through shared memory, one more each way. A side's
  // answer or switch precedes its later frames, so each side has then read the other's, and
  // with it whether the other reads its memory (one copy): the responder's transport says
  // shared memory from its accept on, before the initiator's switch has reached it.
  void Exchange() {
    for (int round = 0; round < 2; ++round) {
      if (round == 1) {
        for (int i = 0; i < 200 && transport_of(ri.qpn, remote->pid()) != sv::wire::kTransportShm;
             ++i)
          std::this_thread::sleep_for(Ms(10));
        for (int i = 0; i < 200 && transport_of(local->qp->qp_num) != sv::wire::kTransportShm; ++i)
          std::this_thread::sleep_for(Ms(10));
      }
      ASSERT_EQ(remote->post_recv(100, {sge(0, 64)}), 0);
      ASSERT_EQ(local->post_recv(100, {sge(0, 64)}), 0);
      ASSERT_EQ(local->post_send(make_send(100, {sge(64, 8)})), 0);
      ASSERT_EQ(remote->post_send(make_send(100, {sge(64, 8)})), 0);
      ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
      ASSERT_EQ(local->poll(CqSel::recv, 1).size(), 1u);
      ASSERT_EQ(remote->poll(CqSel::send, 1).size(), 1u);
      ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
    }
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

// Writes and Reads from SOFTVERBS_SHM_PULL_MIN (4 KiB) up move with one copy: the side whose
// memory they land in reads them from the other's (process_vm_readv). Gather and scatter lists
// of several pieces, a Write with immediate (its byte_len is the whole Write), and one byte
// less than the threshold (through the ring): all land intact, and the counters say which way.
TEST_F(Shm, LargeWritesAndReadsAreReadFromThePeersMemoryIntact) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  const uint32_t rqpn = ri.qpn;
  const uint64_t pulls0 = pulls_of(remote->pid(), rqpn);
  ASSERT_NE(pulls0, ~0ull);

  // A Write gathered from three pieces (the middle one under the threshold on its own).
  local->fill(0, 0, 300000, 41);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 1,
                                       {sge(0, 70000), sge(70000, 1000), sge(71000, 229000)},
                                       ri.addr + 5, ri.rkey)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS));
  EXPECT_EQ(remote->check(0, 5, 300000, 41), -1);
  EXPECT_EQ(pulls_of(remote->pid(), rqpn), pulls0 + 3) << "one read per gather piece";

  // A Write with immediate: the receive's byte_len is the Write's length.
  local->fill(0, 0, 65536, 42);
  ASSERT_EQ(remote->post_recv(2, {sge(3 * kMiB, 8)}), 0);
  SendSpec wi = make_rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 2, {sge(0, 65536)}, ri.addr, ri.rkey);
  wi.imm_or_inv = htonl(0x1234);
  ASSERT_EQ(local->post_send(wi), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(wc_is(r[0], 2, IBV_WC_SUCCESS));
  EXPECT_EQ(r[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(r[0].byte_len, 65536u);
  EXPECT_EQ(ntohl(r[0].imm_data), 0x1234u);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, 65536, 42), -1);
  EXPECT_EQ(pulls_of(remote->pid(), rqpn), pulls0 + 4);

  // A Read scattered into three pieces: the reader reads the responder's region.
  const uint64_t lpulls0 = pulls_of(getpid(), local->qp->qp_num);
  remote->fill(0, kMiB, 200000, 43);
  ASSERT_EQ(
      local->post_send(make_rdma(IBV_WR_RDMA_READ, 3,
                                 {sge(kMiB, 100), sge(kMiB + 4096, 150000), sge(2 * kMiB, 49900)},
                                 ri.addr + kMiB, ri.rkey)),
      0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_TRUE(wc_is(s[0], 3, IBV_WC_SUCCESS));
  EXPECT_EQ(s[0].byte_len, 200000u);
  EXPECT_EQ(local->check(0, kMiB, 100, 43), -1);
  EXPECT_EQ(local->check(0, kMiB + 4096, 150000, 43, 100), -1);
  EXPECT_EQ(local->check(0, 2 * kMiB, 49900, 43, 150100), -1);
  EXPECT_EQ(pulls_of(getpid(), local->qp->qp_num), lpulls0 + 1);

  // Under the threshold: through the ring, no read of the peer.
  local->fill(0, 0, 4095, 44);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 4, {sge(0, 4095)}, ri.addr, ri.rkey)), 0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, 4095, 44), -1);
  EXPECT_EQ(pulls_of(remote->pid(), rqpn), pulls0 + 4);
}

// The checks are those of data on the wire: a Write by reference to a bad rkey, or past the
// end of the region, fails with a remote access error and reads nothing.
TEST_F(Shm, AWriteByReferenceIsCheckedAsAnyWrite) {
  for (int past_end : {0, 1}) {
    SCOPED_TRACE(past_end ? "past the region's end" : "a bad rkey");
    ASSERT_NO_FATAL_FAILURE(Connect());
    ASSERT_NO_FATAL_FAILURE(Exchange());
    ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
    // A good one first: references are in use on this connection.
    ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 8, {sge(0, 65536)}, ri.addr, ri.rkey)),
              0);
    ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
    ASSERT_EQ(pulls_of(remote->pid(), ri.qpn), 1u);
    const uint64_t addr = past_end ? ri.addr + ri.len - 8192 : ri.addr;
    const uint32_t rkey = past_end ? ri.rkey : ri.rkey ^ 0x100;
    ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 9, {sge(0, 65536)}, addr, rkey)), 0);
    auto s = local->poll(CqSel::send, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(wc_is(s[0], 9, IBV_WC_REM_ACCESS_ERR)) << wc_str(s[0]);
    EXPECT_EQ(pulls_of(remote->pid(), ri.qpn), 1u);
    TearDown();
    SetUp();
  }
}

// A peer with one copy off (SOFTVERBS_SHM_PULL_MIN=0) neither takes references nor sends
// them: large Writes and Reads both ways go through the rings, intact.
TEST_F(Shm, APeerThatDoesNotPullGetsTheDataThroughTheRing) {
  g_child_env = {"SOFTVERBS_SHM=1", "SOFTVERBS_SHM_PULL_MIN=0"};
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  local->fill(0, 0, kMiB, 51);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, kMiB)}, ri.addr, ri.rkey)), 0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, kMiB, 51), -1);
  EXPECT_EQ(pulls_of(remote->pid(), ri.qpn), 0u);
  // Nor does it send its Read Responses by reference.
  remote->fill(0, kMiB, kMiB, 52);
  ASSERT_EQ(
      local->post_send(make_rdma(IBV_WR_RDMA_READ, 2, {sge(kMiB, kMiB)}, ri.addr + kMiB, ri.rkey)),
      0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  EXPECT_EQ(local->check(0, kMiB, kMiB, 52), -1);
  EXPECT_EQ(pulls_of(getpid(), local->qp->qp_num), 0u);
}

// An RNR stall hides the peer's acks behind the Send our RX waits on (Conn::acks_unseen). A
// Write the peer reads from our memory still completes, on the peer's count of placed
// messages in the shared segment, before the application posts that receive (IB's ACKs do
// not queue behind the responder's own requests).
TEST_F(Shm, AWriteByReferenceCompletesWhileAnRnrStallHidesTheAcks) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  ASSERT_EQ(remote->post_send(make_send(7, {sge(0, 16)})), 0);  // we have no receive posted
  std::this_thread::sleep_for(Ms(100));
  local->fill(0, 0, 65536, 61);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 8, {sge(0, 65536)}, ri.addr, ri.rkey)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u) << "the Write waited for our receive";
  EXPECT_TRUE(wc_is(s[0], 8, IBV_WC_SUCCESS));
  EXPECT_EQ(remote->check(0, 0, 65536, 61), -1);
  EXPECT_EQ(pulls_of(remote->pid(), ri.qpn), 1u);
  ASSERT_EQ(local->post_recv(1, {sge(kMiB, 64)}), 0);
  ASSERT_EQ(local->poll(CqSel::recv, 1).size(), 1u);
  ASSERT_EQ(remote->poll(CqSel::send, 1).size(), 1u);
}

// Our QP fails with a Write with immediate the peer has not read yet (its RX waits on our Send
// for a receive). The WR comes back flushed, and what it named is revoked before that: the
// peer, reading it later, drops the connection rather than complete the Write with whatever
// the buffer holds by then. (It has read it: the target's bytes are undefined after a failed
// Write, as on IB.)
TEST_F(Shm, AFlushedWriteByReferenceIsNeverCompletedByThePeer) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  remote->fill(0, kMiB, 65536, 70);
  ASSERT_EQ(local->post_send(make_send(1, {sge(0, 16)})), 0);  // the peer has no receive
  std::this_thread::sleep_for(Ms(100));
  local->fill(0, 0, 65536, 71);
  SendSpec wi = make_rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 2, {sge(0, 65536)}, ri.addr + kMiB, ri.rkey);
  wi.imm_or_inv = htonl(5);
  ASSERT_EQ(local->post_send(wi), 0);
  std::this_thread::sleep_for(Ms(50));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(local->qp, &a, IBV_QP_STATE), 0);
  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[1], 2, IBV_WC_WR_FLUSH_ERR)) << wc_str(s[1]);
  local->fill(0, 0, 65536, 72);  // the application reuses the buffer
  ASSERT_EQ(remote->post_recv(10, {sge(0, 64)}), 0);
  ASSERT_EQ(remote->post_recv(11, {sge(64, 64)}), 0);
  auto r = remote->poll(CqSel::recv, 2, Ms(1000));
  ASSERT_GE(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 10, IBV_WC_SUCCESS)) << "the ring was not read: " << wc_str(r[0]);
  for (const auto& wc : r)
    EXPECT_FALSE(wc.wr_id == 11 && wc.status == IBV_WC_SUCCESS)
        << "the peer completed a flushed Write: " << wc_str(wc);
  EXPECT_NE(remote->check(0, kMiB, 65536, 70), -1) << "the reference was never read";
}

// Resident KiB of this process's mappings of shared-memory segments (both rings of each).
uint64_t shm_rss_kib() {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool ours = false;
  uint64_t kib = 0;
  while (std::getline(in, line)) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') != std::string::npos) {
      ours = line.find("softverbs-shm") != std::string::npos;  // memfd:softverbs-shm (deleted)
      continue;
    }
    if (ours && line.rfind("Rss:", 0) == 0) kib += std::stoull(line.substr(4));
  }
  return kib;
}

// A connection idle for a trim period gives back its ring's pages (MADV_REMOVE, once the peer
// has read everything), as it does its stream buffers: an idle QP costs what it did before
// its traffic. Sends go through the ring at any size, so 1 MiB of them touches all of it.
TEST_F(Shm, AnIdleConnectionGivesItsRingsPagesBack) {
  setenv("SOFTVERBS_IDLE_TRIM_MS", "50", 1);
  g_child_env.push_back("SOFTVERBS_IDLE_TRIM_MS=50");
  ASSERT_NO_FATAL_FAILURE(Connect());
  ASSERT_NO_FATAL_FAILURE(Exchange());
  ASSERT_EQ(wait_transport(local->qp->qp_num, sv::wire::kTransportShm), sv::wire::kTransportShm);
  constexpr uint32_t kLen = 128 * 1024;
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(remote->post_recv(i, {sge(i * kLen, kLen)}), 0);
    ASSERT_EQ(local->post_send(make_send(i, {sge(0, kLen)})), 0);
  }
  ASSERT_EQ(remote->poll(CqSel::recv, 8).size(), 8u);
  ASSERT_EQ(local->poll(CqSel::send, 8).size(), 8u);
  const uint64_t busy = shm_rss_kib();
  EXPECT_GE(busy, 256u) << "the ring's pages were never resident";
  uint64_t idle = busy;
  for (int i = 0; i < 100 && idle > busy / 4; ++i) {
    std::this_thread::sleep_for(Ms(20));
    idle = shm_rss_kib();
  }
  EXPECT_LE(idle, busy / 4) << "an idle connection kept its ring's pages";
  // Traffic after the trim refaults fresh pages and arrives intact.
  local->fill(0, 0, kLen, 81);
  ASSERT_EQ(remote->post_recv(20, {sge(0, kLen)}), 0);
  ASSERT_EQ(local->post_send(make_send(20, {sge(0, kLen)})), 0);
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, kLen, 81), -1);
  unsetenv("SOFTVERBS_IDLE_TRIM_MS");
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
// WR completes (the first with RETRY_EXC_ERR), nothing hangs. The peer sends its Read
// Responses through the ring (one copy off there): read from its memory, 40 MiB of them
// complete within the moment the kill takes to land, stopped peer or not.
TEST_F(Shm, APeerKilledMidTransferFailsEveryOutstandingWr) {
  g_child_env = {"SOFTVERBS_SHM=1", "SOFTVERBS_SHM_PULL_MIN=0"};
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
