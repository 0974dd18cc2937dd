// Per-QP counters as softverbs-stat reads them: this process's statistics file
// (/dev/shm/softverbs-stats-<uid>/<pid>, wire/stats_file.h), read back after traffic and after
// an error, and the destroyed QP's counts kept in the process totals.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "harness.h"
#include "wire/stats_file.h"

namespace mp {
namespace {

using sv::wire::Ctr;

std::string stats_path() {
  return "/dev/shm/softverbs-stats-" + std::to_string(geteuid()) + "/" + std::to_string(getpid());
}

bool read_stats(sv::wire::StatsView& v) {
  std::ifstream in(stats_path(), std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return sv::wire::decode_stats({p, s.size()}, v) == sv::wire::StatsError::ok;
}

const sv::wire::QpStatsView* find_qp(const sv::wire::StatsView& v, uint32_t qpn) {
  for (const auto& q : v.qps)
    if (q.qpn == qpn) return &q;
  return nullptr;
}

uint64_t ctr(const sv::wire::QpStatsView& q, Ctr c) {
  return q.ctr[static_cast<size_t>(c)];
}

TEST_F(XProc, CountersFollowTrafficErrorsAndDestroy) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  struct stat st;
  ASSERT_EQ(stat(stats_path().c_str(), &st), 0) << "no statistics file at " << stats_path();
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // 4 WRITEs of 4 KiB and one READ, all signaled.
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, i, {sge(0, 4096)}, ri.addr, ri.rkey)),
              0);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_READ, 4, {sge(8192, 64)}, ri.addr, ri.rkey)), 0);
  ASSERT_EQ(local->poll(CqSel::send, 5).size(), 5u);

  sv::wire::StatsView v;
  ASSERT_TRUE(read_stats(v));
  EXPECT_EQ(v.pid, static_cast<uint32_t>(getpid()));
  const auto* q = find_qp(v, local->qp->qp_num);
  ASSERT_NE(q, nullptr) << "QP " << local->qp->qp_num << " not published";
  EXPECT_EQ(q->state, static_cast<uint32_t>(IBV_QPS_RTS));
  EXPECT_EQ(q->dest_qpn, ri.qpn);
  EXPECT_TRUE(q->family == AF_INET || q->family == AF_INET6);
  EXPECT_EQ(ctr(*q, Ctr::sent_writes), 4u);
  EXPECT_EQ(ctr(*q, Ctr::sent_read_reqs), 1u);
  EXPECT_GE(ctr(*q, Ctr::sent_pkts), 5u);
  EXPECT_GE(ctr(*q, Ctr::sent_bytes), 4u * 4096);
  EXPECT_GE(ctr(*q, Ctr::rcvd_pkts), 1u);  // the Read Response
  EXPECT_GE(ctr(*q, Ctr::rcvd_bytes), 64u);
  EXPECT_EQ(q->wc[IBV_WC_SUCCESS], 5u);

  // A READ with a bad rkey: the peer's Terminate, REM_ACCESS_ERR, the QP in ERR.
  ASSERT_EQ(local->post_send(
                make_rdma(IBV_WR_RDMA_READ, 5, {sge(8192, 64)}, ri.addr, ri.rkey ^ 0x5A5A0000)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  ASSERT_EQ(s[0].status, IBV_WC_REM_ACCESS_ERR);
  ASSERT_TRUE(read_stats(v));
  q = find_qp(v, local->qp->qp_num);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->wc[IBV_WC_REM_ACCESS_ERR], 1u);
  EXPECT_EQ(ctr(*q, Ctr::rcvd_terminates), 1u);
  EXPECT_EQ(q->state, static_cast<uint32_t>(IBV_QPS_ERR));

  // Destroyed: the slot is free, its counts are in the process totals.
  const uint32_t qpn = local->qp->qp_num;
  ASSERT_EQ(ibv_destroy_qp(local->qp), 0);
  local->qp = nullptr;
  ASSERT_TRUE(read_stats(v));
  EXPECT_EQ(find_qp(v, qpn), nullptr);
  EXPECT_GE(ctr(v.retired, Ctr::sent_writes), 4u);
  EXPECT_GE(v.retired.wc[IBV_WC_REM_ACCESS_ERR], 1u);
}

// An idle connection gives its stream buffers back (engine/qp_trim.cc: the receive buffer
// and the TX header arena, once a whole SOFTVERBS_IDLE_TRIM_MS period, 1 s by default, went
// by without traffic), and carries data as before once traffic resumes: the pages come back
// zeroed, and nothing that was in them is lost.
TEST_F(XProc, AnIdleConnectionGivesItsBuffersBackAndStillCarriesData) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  // 64 Sends of 2000 B each way: below the size read straight into receive buffers, so
  // each passes through the connection's own receive buffer.
  constexpr uint32_t kMsgs = 64, kLen = 2000, kSlot = 2048, kRecvAt = 1u << 20;
  auto exchange = [&](uint32_t seed) {
    for (uint32_t i = 0; i < kMsgs; ++i) {
      ASSERT_EQ(local->post_recv(100 + i, {sge(kRecvAt + i * kSlot, kSlot)}), 0);
      ASSERT_EQ(remote->post_recv(100 + i, {sge(kRecvAt + i * kSlot, kSlot)}), 0);
    }
    local->fill(0, 0, kMsgs * kSlot, seed);
    remote->fill(0, 0, kMsgs * kSlot, seed + 1);
    for (uint32_t i = 0; i < kMsgs; ++i) {
      ASSERT_EQ(local->post_send(make_send(i, {sge(i * kSlot, kLen)})), 0);
      ASSERT_EQ(remote->post_send(make_send(i, {sge(i * kSlot, kLen)})), 0);
    }
    ASSERT_EQ(local->poll(CqSel::send, kMsgs).size(), kMsgs);
    ASSERT_EQ(remote->poll(CqSel::send, kMsgs).size(), kMsgs);
    auto lr = local->poll(CqSel::recv, kMsgs);
    auto rr = remote->poll(CqSel::recv, kMsgs);
    ASSERT_EQ(lr.size(), kMsgs);
    ASSERT_EQ(rr.size(), kMsgs);
    for (uint32_t i = 0; i < kMsgs; ++i) {
      EXPECT_TRUE(wc_is(lr[i], 100 + i, IBV_WC_SUCCESS, IBV_WC_RECV));
      EXPECT_TRUE(wc_is(rr[i], 100 + i, IBV_WC_SUCCESS, IBV_WC_RECV));
      // Message i is bytes [i * kSlot, i * kSlot + kLen) of the sender's pattern.
      EXPECT_EQ(local->check(0, kRecvAt + i * kSlot, kLen, seed + 1, i * kSlot), -1) << i;
      EXPECT_EQ(remote->check(0, kRecvAt + i * kSlot, kLen, seed, i * kSlot), -1) << i;
    }
  };
  ASSERT_NO_FATAL_FAILURE(exchange(7));

  // Both buffers of our QP are given back within a few periods (bounded only against a hang).
  sv::wire::StatsView v;
  uint64_t trims = 0;
  for (int i = 0; i < 150 && trims < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(read_stats(v));
    const auto* q = find_qp(v, local->qp->qp_num);
    ASSERT_NE(q, nullptr);
    trims = ctr(*q, Ctr::idle_trims);
  }
  EXPECT_GE(trims, 2u) << "the idle connection kept its receive buffer or its TX arena";

  ASSERT_NO_FATAL_FAILURE(exchange(70));
  ASSERT_NO_FATAL_FAILURE(exchange(700));
}

// SOFTVERBS_STATS=0: nothing published (counters still kept in memory).
// A pid that was ours and is gone (a child, reaped).
pid_t dead_pid() {
  const pid_t c = fork();
  if (c == 0) _exit(0);
  int st = 0;
  waitpid(c, &st, 0);
  return c;
}

// A process that starts removes the statistics files of processes that are gone, but only a
// file nobody holds locked: each live process holds its own's flock. pid_max is 32768, so a
// new process may create the file of a dead one's pid between another's look at /proc and its
// unlink; without the lock that removed a live process's file (a test found none).
TEST_F(XProc, StaleStatsFilesGoButALockedOneStays) {
  const std::string dir = "/dev/shm/softverbs-stats-" + std::to_string(geteuid());
  const std::string stale = dir + "/" + std::to_string(dead_pid());
  const std::string held = dir + "/" + std::to_string(dead_pid());
  mkdir(dir.c_str(), 0700);
  const int a = open(stale.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  const int b = open(held.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  close(a);
  ASSERT_EQ(flock(b, LOCK_EX), 0);
  ASSERT_NO_FATAL_FAILURE(Connect());  // the peer process starts, and looks
  struct stat st;
  EXPECT_NE(stat(stale.c_str(), &st), 0) << "a stale file stayed";
  EXPECT_EQ(stat(held.c_str(), &st), 0) << "a locked file was removed";
  unlink(held.c_str());
  close(b);
}

TEST_F(XProc, StatsCanBeTurnedOff) {
  setenv("SOFTVERBS_STATS", "0", 1);
  ASSERT_NO_FATAL_FAILURE(Connect());
  struct stat st;
  EXPECT_NE(stat(stats_path().c_str(), &st), 0);
  ASSERT_EQ(local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 1, {sge(0, 64)}, ri.addr, ri.rkey)), 0);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  unsetenv("SOFTVERBS_STATS");
}

}  // namespace
}  // namespace mp
