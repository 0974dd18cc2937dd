// RDS RDMA as rds-rdma(7) describes it: the client registers memory and gets a cookie; the
// server's message with RDS_CMSG_RDMA_ARGS performs the RDMA and is delivered only after the
// data landed; notifications report success and failures.
#include <linux/rds.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "rds_test_util.h"

using namespace rdstest;

class RdsRdma : public ::testing::TestWithParam<size_t> {};

TEST_P(RdsRdma, WriteLandsBeforeItsMessageAndNotifies) {
  const size_t n = GetParam();
  Pair p(20);
  std::vector<char> target(n + 64, 'T'), src(n + 1);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<char>('a' + i % 23);
  // Client maps its buffer at an odd offset: the cookie carries the in-page offset.
  const uint64_t cookie = get_mr(p.client, target.data() + 5, n ? n : 1);
  // Local side split over 3 iovecs.
  std::vector<rds_iovec> local;
  size_t off = 0;
  for (size_t part : {n / 3, n / 3, n - 2 * (n / 3)}) {
    if (part) local.push_back({reinterpret_cast<uint64_t>(src.data() + off), part});
    off += part;
  }
  if (local.empty()) local.push_back({reinterpret_cast<uint64_t>(src.data()), 0});
  if (n == 0) {
    // A zero-byte local iovec spans no pages: EINVAL (net/rds rdma.c rds_pages_in_vec).
    EXPECT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, n, 42, "written"), -1);
    EXPECT_EQ(errno, EINVAL);
    return;
  }
  ASSERT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, n, 42, "written"), 7);
  std::vector<char> buf(64);
  ASSERT_EQ(recv_one(p.client, buf), 7);
  // The immediate message never precedes its data (rds-rdma(7): RDMA op before its message).
  EXPECT_EQ(std::memcmp(target.data() + 5, src.data(), n), 0);
  EXPECT_EQ(target[4], 'T');
  EXPECT_EQ(target[5 + n], 'T');
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 42u);
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
}

TEST_P(RdsRdma, ReadBringsClientDataBeforeTheMessage) {
  const size_t n = GetParam();
  Pair p(22);
  std::vector<char> client_buf(n + 1), sink(n + 16, 'S');
  for (size_t i = 0; i < n; ++i) client_buf[i] = static_cast<char>(i * 13 + 1);
  const uint64_t cookie = get_mr(p.client, client_buf.data(), n ? n : 1);
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(sink.data()), n}};
  if (n == 0) {
    EXPECT_EQ(send_rdma(p.server, p.cport, cookie, false, local, 0, n, 7, "read"), -1);
    EXPECT_EQ(errno, EINVAL);
    return;
  }
  ASSERT_EQ(send_rdma(p.server, p.cport, cookie, false, local, 0, n, 7, "read"), 4);
  std::vector<char> buf(64);
  ASSERT_EQ(recv_one(p.client, buf), 4) << "the client learns the server pulled its data";
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  EXPECT_EQ(std::memcmp(sink.data(), client_buf.data(), n), 0);
  EXPECT_EQ(sink[n], 'S');
}

// Writes answered at once: the receiver's reply acks the message before the sender has seen
// its fenced Write settle (the fence's completion comes with a Placement Ack the peer may
// hold a little), so the message waits in op_wait and is released when the op settles. Every
// op reports once, every message lands after its data; under ASan, nothing is used after
// it is released (rds-stress -M 2 -d 8 found such a use; this test finds it too).
TEST(RdsRdmaFence, WritesAnsweredAtOnceSettleAndReportOnce) {
  Pair p(24);
  const uint64_t fenced_before = counter(p.server, "send_rdma_fenced");
  std::vector<char> target(4096, 0), src(4096);
  const uint64_t cookie = get_mr(p.client, target.data(), target.size());
  std::vector<char> buf(64);
  int notes = 0;
  for (int i = 0; i < 200; ++i) {
    std::fill(src.begin(), src.end(), static_cast<char>('A' + i % 26));
    std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
    ASSERT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, src.size(),
                        static_cast<uint64_t>(i), "w"),
              1);
    // Busy polled, as rds-stress -M 2: the receive pass runs here, and the Placement Ack
    // the fence asked for is held for our answer, which acks the message first.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (svrds_recvfrom(p.client, buf.data(), buf.size(), MSG_DONTWAIT, nullptr, nullptr) != 1)
      ASSERT_TRUE(svrds_busy_poll() >= 0 && std::chrono::steady_clock::now() < give_up);
    ASSERT_EQ(target[4095], src[4095]) << "op " << i << ": its message came before its data";
    ASSERT_EQ(send_to(p.client, p.sport, "r", 1), 1);
    // The reply and this op's status, in either order (recvmsg returns notifications first).
    bool reply = false;
    while (!reply || notes <= i) {
      svrds_busy_poll();
      rds_rdma_notify note{};
      const int got = recv_byte_or_notify(p.server, note);
      if (got == 1) {
        reply = true;
        continue;
      }
      ASSERT_EQ(got, 0) << "neither the reply nor a notification";
      EXPECT_EQ(note.user_token, static_cast<uint64_t>(notes)) << "each op reports once, in order";
      EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
      ++notes;
    }
  }
  const char* confirm = std::getenv("SOFTVERBS_RDS_CONFIRM_READ");
  if (!(confirm && confirm[0] == '1')) {
    EXPECT_GE(counter(p.server, "send_rdma_fenced"), fenced_before + 200u)
        << "the Writes were fenced";
  }
}

// The same with the receiver in another process and 8 ops in flight, as rds-stress -M 2 -d 8
// runs it: there an answer often acks a message before the sender has seen the Placement Ack
// of its fence, which settles the op. The sender then keeps the acked message until the op
// settles (op_wait); under ASan this found a use of it after its release.
TEST(RdsRdmaFence, PipelinedWritesAnsweredByAnotherProcessSettleAndReportOnce) {
  const uint16_t cport = port(26), sport = port(27);
  constexpr int kOps = 2000, kDepth = 8;
  constexpr size_t kSlot = 4096;
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  const pid_t pid = fork();
  if (pid == 0) {  // the answering client: a stack of its own, busy polling
    close(pfd[0]);
    const int c = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
    sockaddr_in a = addr(cport);
    if (c < 0 || svrds_bind(c, reinterpret_cast<sockaddr*>(&a), sizeof a)) _exit(10);
    alignas(4096) static char target[kDepth * kSlot];
    uint64_t cookie = 0;
    rds_get_mr_args mr{{reinterpret_cast<uint64_t>(target), sizeof target},
                       reinterpret_cast<uint64_t>(&cookie),
                       0};
    if (svrds_setsockopt(c, SOL_RDS, RDS_GET_MR, &mr, sizeof mr)) _exit(11);
    if (write(pfd[1], &cookie, sizeof cookie) != sizeof cookie) _exit(12);
    char b[64];
    for (int i = 0; i < kOps; ++i) {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (svrds_recvfrom(c, b, sizeof b, MSG_DONTWAIT, nullptr, nullptr) != 1) {
        svrds_busy_poll();
        if (std::chrono::steady_clock::now() > give_up) _exit(13);
      }
      // Its data landed before it (slot i % kDepth is not written again before our answer).
      if (target[(i % kDepth) * kSlot + kSlot - 1] != static_cast<char>('A' + i % 26)) _exit(14);
      sockaddr_in d = addr(sport);
      if (svrds_sendto(c, "r", 1, 0, reinterpret_cast<sockaddr*>(&d), sizeof d) != 1) _exit(15);
    }
    // Closing cancels what the socket has not yet handed to the transport (rds(7), as
    // net/rds's rds_send_drop_to): under load the last answer may still be queued behind the
    // progress thread's transmit. So it closes only once the server has everything.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (svrds_recvfrom(c, b, sizeof b, MSG_DONTWAIT, nullptr, nullptr) != 3) {
      svrds_busy_poll();
      if (std::chrono::steady_clock::now() > give_up) _exit(16);
    }
    svrds_close(c);
    _exit(0);
  }
  close(pfd[1]);
  uint64_t cookie = 0;
  ASSERT_TRUE(wait_for(pfd[0], POLLIN, 10000) & POLLIN);
  ASSERT_EQ(read(pfd[0], &cookie, sizeof cookie), static_cast<ssize_t>(sizeof cookie));
  close(pfd[0]);
  const int srv = bound_socket(sport);
  // An early return (a failed ASSERT) closes the port and ends the child, so the tests after
  // this one do not meet them.
  struct Cleanup {
    int srv;
    pid_t pid;
    bool reaped = false;
    ~Cleanup() {
      svrds_close(srv);
      if (!reaped) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } cleanup{srv, pid};
  const uint64_t unsettled_before = counter(srv, "send_rdma_acked_unsettled");
  std::vector<char> src(kDepth * kSlot);
  int sent = 0, replies = 0, notes = 0;
  while (replies < kOps || notes < kOps) {
    // A slot is free once its op reported and its message was answered.
    while (sent < kOps && sent - notes < kDepth && sent - replies < kDepth) {
      char* s = &src[(sent % kDepth) * kSlot];
      std::fill(s, s + kSlot, static_cast<char>('A' + sent % 26));
      std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(s), kSlot}};
      ASSERT_EQ(send_rdma(srv, cport, cookie, true, local, (sent % kDepth) * kSlot, kSlot,
                          static_cast<uint64_t>(sent), "w"),
                1);
      ++sent;
    }
    rds_rdma_notify note{};
    const int got = recv_byte_or_notify(srv, note, 10000);
    if (got == 1) {
      ++replies;
      continue;
    }
    ASSERT_EQ(got, 0) << "neither a reply nor a notification, " << sent << " sent";
    EXPECT_EQ(note.user_token, static_cast<uint64_t>(notes)) << "each op reports once, in order";
    EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
    ++notes;
  }
  sockaddr_in d = addr(cport);
  ASSERT_EQ(svrds_sendto(srv, "bye", 3, 0, reinterpret_cast<sockaddr*>(&d), sizeof d), 3);
  int status = -1;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  cleanup.reaped = true;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "client status " << status << " (13: a message never came; 14: it came before its "
      << "data; 15: an answer failed; 16: no bye)";
  std::printf(
      "acked before settled: %lu of %d\n",
      static_cast<unsigned long>(counter(srv, "send_rdma_acked_unsettled") - unsettled_before),
      kOps);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RdsRdma,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{4096}, size_t{100000},
                                           size_t{1} << 20));

TEST(RdsRdmaCookie, TravelsInBandWithRdmaMapAndDest) {
  Pair p(24);
  std::vector<char> region(4096);
  // RDMA_MAP on the request: the kernel registers, writes the cookie back, and the
  // server gets it as RDS_CMSG_RDMA_DEST.
  uint64_t cookie = 0;
  rds_get_mr_args map{{reinterpret_cast<uint64_t>(region.data() + 100), 1000},
                      reinterpret_cast<uint64_t>(&cookie),
                      0};
  char ctl[CMSG_SPACE(sizeof map)] = {};
  iovec v{const_cast<char*>("req"), 3};
  sockaddr_in d = addr(p.sport);
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  cmsghdr* cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_RDMA_MAP;
  cm->cmsg_len = CMSG_LEN(sizeof map);
  std::memcpy(CMSG_DATA(cm), &map, sizeof map);
  ASSERT_EQ(svrds_sendmsg(p.client, &m, 0), 3);
  ASSERT_NE(cookie, 0u);
  EXPECT_EQ(cookie >> 32, reinterpret_cast<uintptr_t>(region.data() + 100) & 4095)
      << "offset within the page travels in the high half";
  ASSERT_TRUE(wait_for(p.server, POLLIN) & POLLIN);
  char data[8];
  char rctl[CMSG_SPACE(8)];
  iovec rv{data, sizeof data};
  msghdr rm{};
  rm.msg_iov = &rv;
  rm.msg_iovlen = 1;
  rm.msg_control = rctl;
  rm.msg_controllen = sizeof rctl;
  ASSERT_EQ(svrds_recvmsg(p.server, &rm, 0), 3);
  cmsghdr* rc = CMSG_FIRSTHDR(&rm);
  ASSERT_NE(rc, nullptr);
  EXPECT_EQ(rc->cmsg_type, RDS_CMSG_RDMA_DEST);
  uint64_t got;
  std::memcpy(&got, CMSG_DATA(rc), 8);
  EXPECT_EQ(got, cookie);
  // The server writes with it.
  std::vector<char> src(1000, 'w');
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  ASSERT_EQ(send_rdma(p.server, p.cport, got, true, local, 0, 1000, 1, "ok"), 2);
  std::vector<char> buf(8);
  ASSERT_EQ(recv_one(p.client, buf), 2);
  EXPECT_EQ(region[100], 'w');
  EXPECT_EQ(region[1099], 'w');
  EXPECT_EQ(region[99], 0);
  EXPECT_EQ(region[1100], 0);
  // An unknown cookie in RDMA_DEST is refused.
  uint64_t bogus = 0xdeadbeef;
  char ctl2[CMSG_SPACE(8)] = {};
  m.msg_control = ctl2;
  m.msg_controllen = sizeof ctl2;
  cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_RDMA_DEST;
  cm->cmsg_len = CMSG_LEN(8);
  std::memcpy(CMSG_DATA(cm), &bogus, 8);
  EXPECT_EQ(svrds_sendmsg(p.client, &m, 0), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST(RdsRdmaCookie, RdmaArgsValidation) {
  Pair p(26);
  std::vector<char> b(64);
  std::vector<rds_iovec> none;
  EXPECT_EQ(send_rdma(p.server, p.cport, 1, true, none, 0, 8, 0, "x"), -1);
  EXPECT_EQ(errno, EINVAL) << "nr_local 0";
  std::vector<rds_iovec> too_much{{reinterpret_cast<uint64_t>(b.data()), 64}};
  EXPECT_EQ(send_rdma(p.server, p.cport, 1, true, too_much, 0, 32, 0, "x"), -1);
  EXPECT_EQ(errno, EINVAL) << "local bytes exceed remote_vec.bytes";
  EXPECT_EQ(send_rdma(p.server, p.cport, 1, true, too_much, 0, (1 << 20) + 1, 0, "x"), -1);
  EXPECT_EQ(errno, EMSGSIZE);
}

TEST(RdsRdmaCookie, BadCookieFailsTheOpWithRemoteError) {
  Pair p(28);
  std::vector<char> src(512, 'z');
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  const uint64_t bogus = 0x0badc0deull;
  ASSERT_EQ(send_rdma(p.server, p.cport, bogus, true, local, 0, 512, 99, "bad"), 3);
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 99u);
  EXPECT_EQ(note.status, RDS_RDMA_REMOTE_ERROR);
  // Plain messages between the same sockets keep flowing afterwards.
  ASSERT_EQ(send_to(p.server, p.cport, "after", 5), 5);
  std::vector<char> buf(16);
  EXPECT_EQ(recv_one(p.client, buf), 5);
}

// A bad cookie fails that operation, not the connection other sockets share. Another socket's
// RDMA op queued right behind it completes (SUCCESS, not DROPPED), no connection is reset,
// and the failed op's message is never delivered (both or neither).
TEST(RdsRdmaCookie, BadCookieCostsOnlyItsOpNotTheSharedConnection) {
  PrivateRegistry own;  // conn_reset sums the host: a neighbour's reset made it one more
  Pair p(32);
  const int other = bound_socket(port(34));
  ASSERT_GE(other, 0);
  std::vector<char> region(8192, 0);
  const uint64_t cookie = get_mr(p.client, region.data(), region.size());
  // Warm the connection so its reset counter is meaningful.
  ASSERT_EQ(send_to(p.server, p.cport, "warm", 4), 4);
  std::vector<char> buf(64);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  const uint64_t resets = counter(p.server, "conn_reset");
  const uint64_t rdma_resets = counter(p.server, "rdma_chan_reset");
  const uint64_t no_region = counter(p.server, "send_rdma_no_region");

  std::vector<char> bad_src(512, 'z');
  std::vector<rds_iovec> bad_local{{reinterpret_cast<uint64_t>(bad_src.data()), bad_src.size()}};
  ASSERT_EQ(send_rdma(p.server, p.cport, 0x0badc0deull, true, bad_local, 0, 512, 1, "bad"), 3);
  std::vector<char> good_src(8192);
  std::iota(good_src.begin(), good_src.end(), 7);
  std::vector<rds_iovec> good_local{{reinterpret_cast<uint64_t>(good_src.data()), 4096},
                                    {reinterpret_cast<uint64_t>(good_src.data() + 4096), 4096}};
  ASSERT_EQ(send_rdma(other, p.cport, cookie, true, good_local, 0, 8192, 2, "good"), 4);
  ASSERT_EQ(send_to(p.server, p.cport, "after", 5), 5);

  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 1u);
  EXPECT_EQ(note.status, RDS_RDMA_REMOTE_ERROR);
  ASSERT_TRUE(get_notify(other, note));
  EXPECT_EQ(note.user_token, 2u);
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS) << "the op behind the bad one is not dropped";

  std::vector<std::string> got;
  for (int i = 0; i < 2; ++i) {
    const ssize_t n = recv_one(p.client, buf);
    ASSERT_GT(n, 0);
    got.emplace_back(buf.data(), static_cast<size_t>(n));
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"after", "good"})) << "\"bad\" is never delivered";
  EXPECT_EQ(std::memcmp(region.data(), good_src.data(), region.size()), 0);
  EXPECT_EQ(counter(p.server, "conn_reset"), resets) << "the shared connection did not bounce";
  const char* va = std::getenv("SOFTVERBS_RDS_MR_VA");
  if (va && std::strcmp(va, "1") == 0)  // asked where the region starts: the peer has none
    EXPECT_EQ(counter(p.server, "send_rdma_no_region"), no_region + 1) << "refused before the wire";
  else
    EXPECT_GT(counter(p.server, "rdma_chan_reset"), rdma_resets) << "the RDMA channel took it";
  svrds_close(other);
}

// sendmsg posts a large RDMA Write with the stack lock let go (rdma.cc post_recorded_op), and
// the RDMA channel stays its own until it has the lock back: the teardown that the Write's own
// failure brings meanwhile (a bad cookie: the peer Terminates the channel's stream) is put off
// to the poster (rdma_chan_down_deferred), which tears the channel down once its post is
// accounted for. The test hook holds each such post open 1 s. The op reports REMOTE_ERROR
// once, its message is never delivered, and the next Write goes on a new channel and lands.
TEST(RdsXmit, AChannelFailureWhileAWritePostsOffTheLockWaitsForThePoster) {
  const int rc = in_private_child([] {
    setenv("SOFTVERBS_RDS_TEST_POST_WINDOW_MS", "1000", 1);
    setenv("SOFTVERBS_RDS_MR_VA", "0", 1);  // the bad cookie goes on the wire (no base lookup)
    int a, b;
    if (!bound_pair(port(40), port(41), &a, &b)) return 10;
    constexpr size_t kLen = 32768;  // posted with the lock let go (kOffLockBytes)
    std::vector<char> region(kLen, 0), src(kLen), buf(16);
    for (size_t i = 0; i < kLen; ++i) src[i] = static_cast<char>(i * 7 + 1);
    const uint64_t cookie = get_mr(b, region.data(), kLen);
    std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), kLen}};
    // The RDMA channel up first (an op queued while it connects is posted by the engine
    // thread, with the lock held): a small Write, posted with it held.
    std::vector<rds_iovec> small{{reinterpret_cast<uint64_t>(src.data()), 512}};
    rds_rdma_notify note{};
    if (send_rdma(a, port(41), cookie, true, small, 0, 512, 0, "up") != 2 ||
        !get_notify(a, note, 10000) || note.status != RDS_RDMA_SUCCESS || recv_one(b, buf) != 2)
      return 10;
    const uint64_t deferred = counter(a, "rdma_chan_down_deferred");
    const uint64_t unlocked = counter(a, "rdma_post_unlocked");
    const uint64_t by_poster = counter(a, "rdma_chan_down_by_poster");
    if (send_rdma(a, port(41), 0x0badc0deull, true, local, 0, kLen, 1, "bad") != 3) return 11;
    if (!get_notify(a, note, 10000) || note.user_token != 1 || note.status != RDS_RDMA_REMOTE_ERROR)
      return 12;
    if (counter(a, "rdma_post_unlocked") <= unlocked) return 13;
    if (counter(a, "rdma_chan_down_deferred") <= deferred) return 14;
    if (counter(a, "rdma_chan_down_by_poster") != by_poster + 1) return 15;  // and it ran it
    if (send_rdma(a, port(41), cookie, true, local, 0, kLen, 2, "good") != 4) return 16;
    if (!get_notify(a, note, 10000) || note.user_token != 2 || note.status != RDS_RDMA_SUCCESS)
      return 17;
    if (recv_one(b, buf) != 4 || std::memcmp(buf.data(), "good", 4) != 0) return 18;
    if (std::memcmp(region.data(), src.data(), kLen) != 0) return 19;
    if (recv_one(b, buf, nullptr, 0, 300) != -2) return 20;  // "bad" never comes
    return 0;
  });
  EXPECT_EQ(rc, 0)
      << "10: set-up; 11: the send failed; 12: the bad op did not report "
         "REMOTE_ERROR; 13: it was not posted off the lock; 14: no teardown was put "
         "off; 15: the poster did not tear the channel down; 16/17: the next Write failed; "
         "18: its message did not come first; 19: its data did not land; 20: the "
         "failed op's message arrived";
}

// An RDMA op's local regions are deregistered once the stack lock is let go
// (dereg_after_unlock), after its completion, and none is kept: with the device capped at 64
// regions, 300 Writes and Reads, each registering its local buffer, all succeed and land.
TEST(RdsRdmaRegions, ManyMoreOpsThanRegionsEachLetGoOfItsLocalRegistration) {
  const int rc = in_private_child([] {
    setenv("SOFTVERBS_MAX_MR", "64", 1);  // before this process' stack opens the device
    int a, b;
    if (!bound_pair(port(60), port(61), &a, &b)) return 10;
    constexpr size_t kLen = 4096;
    std::vector<char> region(kLen, 0), src(kLen), buf(16);
    const uint64_t cookie = get_mr(b, region.data(), kLen);
    if (!cookie) return 10;
    const uint64_t before = counter(a, "rdma_dereg_unlocked");
    constexpr int kOps = 300;
    for (int i = 0; i < kOps; ++i) {
      const bool write = i % 2 == 0;
      if (write) {
        for (size_t k = 0; k < kLen; ++k) src[k] = static_cast<char>(i + k);
      } else {
        std::fill(src.begin(), src.end(), 0);
      }
      std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), kLen}};
      if (send_rdma(a, port(61), cookie, write, local, 0, kLen, static_cast<uint64_t>(i), "x") != 1)
        return 11;
      rds_rdma_notify note{};
      if (!get_notify(a, note) || note.user_token != static_cast<uint64_t>(i) ||
          note.status != RDS_RDMA_SUCCESS)
        return 12;
      if (recv_one(b, buf) != 1) return 13;
      // A Read brings back what the Write before it put there.
      if (std::memcmp(region.data(), src.data(), kLen) != 0) return 14;
    }
    // The last ones go with their messages, once the peer's RDS ack retires them.
    for (int i = 0; i < 500 && counter(a, "rdma_dereg_unlocked") < before + kOps; ++i)
      usleep(10000);
    if (counter(a, "rdma_dereg_unlocked") < before + kOps) return 15;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: set-up; 11: a send failed (its registration?); 12: an op did not "
                      "report success; 13: its message did not come; 14: the data did not "
                      "land; 15: the regions were not deregistered off the lock";
}

// A device that ignores ibv_reg_mr_iova2's iova (Linux siw) registers RDS regions at their
// virtual address, so a zero-based cookie names nothing there. SOFTVERBS_RDS_MR_VA=1 makes
// softverbs' RDS register that way too (the default, 2, does it only on such a device): the
// peer asks where the region starts before each op, and its Write and Read land where the
// cookie says. The same on a device that honours the iova would fail (REMOTE_ERROR) without
// the lookup: the offset alone names no address of a region registered at its VA.
TEST(RdsRdmaCookie, RegionsByVirtualAddressAreFoundThroughTheBaseLookup) {
  const int rc = in_private_child([] {
    setenv("SOFTVERBS_RDS_MR_VA", "1", 1);
    int client = -1, server = -1;
    if (!bound_pair(port(36), port(37), &client, &server)) return 10;
    std::vector<char> region(3 * 4096 + 100, 0);
    // Not page-aligned: the cookie's in-page offset counts from the region's first page.
    char* at = region.data() + 100;
    const uint64_t cookie = get_mr(client, at, 3 * 4096);
    if (!cookie) return 11;
    std::vector<char> src(4096);
    std::iota(src.begin(), src.end(), 1);
    std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
    if (send_rdma(server, port(36), cookie, true, local, 4096, 4096, 1, "w") != 1) return 12;
    rds_rdma_notify note{};
    if (!get_notify(server, note) || note.status != RDS_RDMA_SUCCESS) return 13;
    if (std::memcmp(at + 4096, src.data(), src.size()) != 0) return 14;
    // A Read back from another offset of the same cookie.
    std::memcpy(at + 8192, "from the owner", 14);
    std::vector<char> dst(64, 0);
    std::vector<rds_iovec> back{{reinterpret_cast<uint64_t>(dst.data()), 14}};
    if (send_rdma(server, port(36), cookie, false, back, 8192, 14, 2, "r") != 1) return 15;
    if (!get_notify(server, note) || note.status != RDS_RDMA_SUCCESS) return 16;
    if (std::memcmp(dst.data(), "from the owner", 14) != 0) return 17;
    std::vector<char> buf(64);
    for (int i = 0; i < 2; ++i)
      if (recv_one(client, buf) != 1) return 18;
    // A freed cookie: the lookup finds no region, and the op fails as a bad rkey would.
    rds_free_mr_args f{cookie, 0};
    if (svrds_setsockopt(client, SOL_RDS, RDS_FREE_MR, &f, sizeof f) != 0) return 19;
    std::vector<rds_iovec> small{{reinterpret_cast<uint64_t>(src.data()), 16}};
    if (send_rdma(server, port(36), cookie, true, small, 0, 16, 3, "x") != 1) return 20;
    if (!get_notify(server, note) || note.status != RDS_RDMA_REMOTE_ERROR) return 21;
    std::printf("lookups asked %llu, answered %llu, no region %llu\n",
                static_cast<unsigned long long>(counter(server, "rdma_base_asked")),
                static_cast<unsigned long long>(counter(server, "rdma_base_answered")),
                static_cast<unsigned long long>(counter(server, "send_rdma_no_region")));
    std::fflush(stdout);  // the child leaves with _exit
    // One question per op here (each asks after the previous answer was used).
    if (counter(server, "rdma_base_asked") != 3 || counter(server, "rdma_base_answered") != 3)
      return 22;
    return counter(server, "send_rdma_no_region") == 1 ? 0 : 23;
  });
  EXPECT_EQ(rc, 0) << "10: bind, 11: get_mr, 12-14: the Write, 15-17: the Read, 18: the "
                      "messages, 19-21: the freed cookie, 22: lookup counts, 23: no-region "
                      "count, >= 100: killed";
}

// The region is deregistered with the stack lock let go, but before RDS_FREE_MR returns
// (dereg_after_unlock): by then the peer's key is dead.
TEST(RdsRdmaCookie, FreeMrInvalidatesTheCookie) {
  Pair p(30);
  std::vector<char> region(4096);
  const uint64_t cookie = get_mr(p.client, region.data(), region.size());
  rds_free_mr_args f{cookie, 0};
  const uint64_t unlocked = counter(p.client, "rdma_dereg_unlocked");
  ASSERT_EQ(svrds_setsockopt(p.client, SOL_RDS, RDS_FREE_MR, &f, sizeof f), 0);
  EXPECT_GE(counter(p.client, "rdma_dereg_unlocked"), unlocked + 1) << "off the stack lock";
  EXPECT_EQ(svrds_setsockopt(p.client, SOL_RDS, RDS_FREE_MR, &f, sizeof f), -1);
  EXPECT_EQ(errno, EINVAL) << "already freed";
  std::vector<char> src(16, 'q');
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  ASSERT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, 16, 5, "x"), 1);
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_REMOTE_ERROR);
  EXPECT_EQ(region[0], 0) << "nothing written through a freed cookie";
}

// A region registered RDS_RDMA_USE_ONCE dies with the first message that chased an RDMA into
// it (net/rds's rds_rdma_unuse, called as the message arrives): the data is there when the
// message is, the cookie is no longer the socket's, and a second op through it fails.
TEST(RdsRdmaCookie, AUseOnceRegionDiesWithTheFirstMessageThatUsedIt) {
  Pair p(42);
  std::vector<char> region(64, 0), src(64, 'u');
  const uint64_t cookie = get_mr(p.client, region.data(), region.size(), RDS_RDMA_USE_ONCE);
  ASSERT_NE(cookie, 0u);
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  ASSERT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, src.size(), 1, "once"), 4);
  std::vector<char> buf(64);
  ASSERT_EQ(recv_one(p.client, buf), 4);
  EXPECT_EQ(region[0], 'u');
  EXPECT_EQ(region[63], 'u');
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_SUCCESS);
  rds_free_mr_args f{cookie, 0};
  EXPECT_EQ(svrds_setsockopt(p.client, SOL_RDS, RDS_FREE_MR, &f, sizeof f), -1);
  EXPECT_EQ(errno, EINVAL) << "used once, the cookie is gone";
  std::fill(src.begin(), src.end(), 'v');
  ASSERT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, src.size(), 2, "twice"), 5);
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.user_token, 2u);
  EXPECT_EQ(note.status, RDS_RDMA_REMOTE_ERROR);
  EXPECT_EQ(region[0], 'u') << "nothing written through a spent cookie";
}

// Closing a socket lets go of every region it holds, off the stack lock up to the deferred
// list's 64 and at once beyond: all of them, and the cookies are dead for the peer.
TEST(RdsRdmaCookie, CloseLetsGoOfEveryRegion) {
  PrivateRegistry own;  // rdma_mr_free sums the host: a neighbour's frees would count here
  Pair p(44);
  const int holder = bound_socket(port(46));
  constexpr int kRegions = 100;
  std::vector<std::vector<char>> regions(kRegions, std::vector<char>(4096, 0));
  std::vector<uint64_t> cookies;
  for (auto& r : regions) cookies.push_back(get_mr(holder, r.data(), r.size()));
  const uint64_t freed = counter(p.client, "rdma_mr_free");
  const uint64_t unlocked = counter(p.client, "rdma_dereg_unlocked");
  ASSERT_EQ(svrds_close(holder), 0);
  EXPECT_EQ(counter(p.client, "rdma_mr_free"), freed + kRegions);
  EXPECT_GE(counter(p.client, "rdma_dereg_unlocked"), unlocked + 64);
  // A socket bound again to the port gets none of them.
  const int again = bound_socket(port(46));
  std::vector<char> src(16, 'c');
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  ASSERT_EQ(send_rdma(p.server, port(46), cookies[kRegions - 1], true, local, 0, 16, 9, "x"), 1);
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(p.server, note));
  EXPECT_EQ(note.status, RDS_RDMA_REMOTE_ERROR);
  EXPECT_EQ(regions[kRegions - 1][0], 0);
  svrds_close(again);
}

// A notification meets a recvmsg whose control buffer cannot hold it (a plain recv() has
// none): as Linux's put_cmsg, it is consumed all the same, with MSG_CTRUNC and a return of 0,
// and the datagram behind it comes with the next call (it waited for ever here before). The
// error queue is empty: MSG_ERRQUEUE is EAGAIN and takes no datagram.
TEST(RdsRecv, ANotificationTooBigForTheControlBufferIsConsumedTruncated) {
  Pair p(48);
  std::vector<char> target(64, 'T'), src(64, 's');
  const uint64_t cookie = get_mr(p.client, target.data(), target.size());
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  ASSERT_EQ(send_rdma(p.server, p.cport, cookie, true, local, 0, src.size(), 7, "written"), 7);
  std::vector<char> buf(64);
  ASSERT_EQ(recv_one(p.client, buf), 7);
  ASSERT_TRUE(wait_for(p.server, POLLIN) & POLLIN) << "no notification";
  ASSERT_EQ(send_to(p.client, p.sport, "data", 4), 4);
  char b[16];
  iovec v{b, sizeof b};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_flags = 0;
  errno = 0;
  EXPECT_EQ(svrds_recvmsg(p.server, &m, MSG_ERRQUEUE), -1);
  EXPECT_EQ(errno, EAGAIN);
  // A buffer with room for the header and 8 bytes of the notification.
  alignas(cmsghdr) char ctl[CMSG_LEN(8)];
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  ASSERT_EQ(svrds_recvmsg(p.server, &m, 0), 0);
  EXPECT_TRUE(m.msg_flags & MSG_CTRUNC);
  EXPECT_EQ(m.msg_controllen, sizeof ctl);
  const cmsghdr* cm = CMSG_FIRSTHDR(&m);
  ASSERT_NE(cm, nullptr);
  EXPECT_EQ(cm->cmsg_type, RDS_CMSG_RDMA_STATUS);
  EXPECT_EQ(cm->cmsg_len, sizeof ctl) << "the length copied, as put_cmsg";
  uint64_t token = 0;
  std::memcpy(&token, CMSG_DATA(cm), sizeof token);
  EXPECT_EQ(token, 7u) << "the part that fits: user_token comes first";
  // No control buffer at all now: the datagram behind it.
  m.msg_control = nullptr;
  m.msg_controllen = 0;
  ASSERT_TRUE(wait_for(p.server, POLLIN) & POLLIN);
  EXPECT_EQ(svrds_recvmsg(p.server, &m, 0), 4);
  EXPECT_EQ(std::string(b, 4), "data");
}

// An RDMA send to a port nobody is bound to: sendmsg takes it, as Linux's does (the peer
// drops the message), and its op, which has no process to run against, still reports:
// RDS_RDMA_DROPPED to a sender that asked (it reported nothing, and a NOTIFY_ME caller waited).
TEST(RdsRdmaNotify, AnOpToAPortNobodyHoldsReportsDropped) {
  int fd = bound_socket(port(52));
  std::vector<char> src(64, 's');
  std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), src.size()}};
  ASSERT_EQ(send_rdma(fd, port(53), 0x1234, true, local, 0, src.size(), 99, "lost"), 4);
  rds_rdma_notify note{};
  ASSERT_TRUE(get_notify(fd, note)) << "no status for the op";
  EXPECT_EQ(note.user_token, 99u);
  EXPECT_EQ(note.status, RDS_RDMA_DROPPED);
  svrds_close(fd);
}
