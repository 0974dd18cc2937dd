// Verbs from many threads at once, as multi-threaded applications (MPI progress threads, UCX
// workers) use them: the device opened from many threads, and an SRQ fed by several threads
// while several others drain the CQ. Nothing may hang, and every message arrives once.
#include <infiniband/verbs.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "harness.h"

namespace mp {
namespace {

TEST(Threads, OpenDeviceFromManyThreadsAtOnce) {
  constexpr int kThreads = 16;
  std::atomic<int> go{0}, ok{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      for (int round = 0; round < 5; ++round) {
        int n = 0;
        ibv_device** list = ibv_get_device_list(&n);
        if (!list || n < 1) return;
        ibv_context* ctx = ibv_open_device(list[0]);
        ibv_free_device_list(list);
        if (!ctx) return;
        ibv_pd* pd = ibv_alloc_pd(ctx);
        ibv_cq* cq = ibv_create_cq(ctx, 8, nullptr, nullptr, 0);
        ibv_device_attr da{};
        const bool good = pd && cq && ibv_query_device(ctx, &da) == 0 && da.max_qp > 0;
        if (cq) ibv_destroy_cq(cq);
        if (pd) ibv_dealloc_pd(pd);
        if (ibv_close_device(ctx) != 0 || !good) return;
      }
      ok.fetch_add(1);
    });
  go.store(1);
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), kThreads);
}

// An SRQ fed by kFeeders threads while kPollers threads drain the receive CQ, and the sender's
// CQ is drained by its own thread: every Send lands in exactly one receive, intact.
TEST_F(InProc, SrqFedAndDrainedByManyThreads) {
  constexpr int kFeeders = 4, kPollers = 3, kPerFeeder = 500;
  constexpr int kTotal = kFeeders * kPerFeeder;
  constexpr uint32_t kLen = 64;
  PeerConfig bc;
  bc.srq = 1;
  bc.max_recv_wr = 64;  // small: the feeders keep refilling it while the Sends arrive
  bc.recv_cqe = 4096;
  PeerConfig ac;
  ac.send_cqe = 4096;
  ASSERT_NO_FATAL_FAILURE(Connect(ac, bc));
  // Send i: its number, then the pattern.
  for (int i = 0; i < kTotal; ++i) {
    const uint64_t off = static_cast<uint64_t>(i) * kLen;
    a->fill(0, off, kLen, 7, off);
    std::memcpy(a->ptr(0, off), &i, sizeof i);
  }

  std::atomic<int> posted{0}, received{0}, bad{0};
  std::mutex seen_mu;
  std::multiset<uint64_t> seen;
  std::vector<std::thread> ts;
  // Feeders: receive slot k goes to wr_id k; each waits for room (ENOMEM: the SRQ is full).
  for (int f = 0; f < kFeeders; ++f)
    ts.emplace_back([&, f] {
      for (int i = 0; i < kPerFeeder;) {
        const uint64_t k = static_cast<uint64_t>(f) * kPerFeeder + i;
        const int r = b->post_recv(k, {sge((1u << 20) + k * kLen, kLen)});
        if (r == 0) {
          ++i;
          posted.fetch_add(1);
        } else if (r == ENOMEM) {
          std::this_thread::yield();
        } else {
          bad.fetch_add(1);
          return;
        }
      }
    });
  const auto deadline = Clock::now() + Ms(30000);
  for (int p = 0; p < kPollers; ++p)
    ts.emplace_back([&] {
      while (received.load() < kTotal && Clock::now() < deadline) {
        ibv_wc wc[16];
        const int n = ibv_poll_cq(b->rcq, 16, wc);
        if (n < 0) {
          bad.fetch_add(1);
          return;
        }
        for (int i = 0; i < n; ++i) {
          if (wc[i].status != IBV_WC_SUCCESS || wc[i].byte_len != kLen) bad.fetch_add(1);
          std::lock_guard lk(seen_mu);
          seen.insert(wc[i].wr_id);
        }
        received.fetch_add(n);
        if (!n) std::this_thread::yield();
      }
    });
  // The sender: kTotal Sends, a window of 32 signaled ones in flight.
  int sent = 0, done = 0;
  while (done < kTotal && Clock::now() < deadline) {
    while (sent < kTotal && sent - done < 32) {
      ASSERT_EQ(a->post_send(make_send(static_cast<uint64_t>(sent),
                                       {sge(static_cast<uint64_t>(sent) * kLen, kLen)})),
                0);
      ++sent;
    }
    ibv_wc wc[16];
    const int n = ibv_poll_cq(a->scq, 16, wc);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) ASSERT_EQ(wc[i].status, IBV_WC_SUCCESS) << wc_str(wc[i]);
    done += n;
    if (!n) std::this_thread::yield();
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(done, kTotal) << "the sender's completions stopped";
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(posted.load(), kTotal);
  ASSERT_EQ(received.load(), kTotal) << "receives stopped";
  // Each receive slot completed once, and the slots hold every Send once, intact.
  std::set<uint64_t> once(seen.begin(), seen.end());
  EXPECT_EQ(once.size(), seen.size()) << "a receive completed twice";
  EXPECT_EQ(once.size(), static_cast<size_t>(kTotal));
  std::set<int> sends;
  for (uint64_t k : once) {
    const uint64_t slot = (1u << 20) + k * kLen;
    int i = -1;
    std::memcpy(&i, b->ptr(0, slot), sizeof i);
    ASSERT_TRUE(i >= 0 && i < kTotal) << "slot " << k;
    EXPECT_EQ(b->check(0, slot + sizeof i, kLen - sizeof i, 7,
                       static_cast<uint64_t>(i) * kLen + sizeof i),
              -1)
        << "send " << i << " in slot " << k;
    sends.insert(i);
  }
  EXPECT_EQ(sends.size(), static_cast<size_t>(kTotal)) << "a Send landed twice";
}

}  // namespace
}  // namespace mp
