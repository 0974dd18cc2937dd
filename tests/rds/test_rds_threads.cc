// Threads on shared RDS sockets. A receive, a poll and the receive options take the socket's
// rs_recv_lock and not the stack lock, which the send path and the completions hold
// (rds_impl.h, "Locking"): these tests run them side by side with sends, deliveries and
// congestion, and assert that no message is lost, forged or delivered twice and that nobody
// is left asleep. The suite runs them under TSan too, which reports any access the locks miss.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "../unit/thread_state.h"
#include "rds_test_util.h"

using namespace rdstest;

namespace {

struct Msg {
  uint32_t sender;
  uint32_t seq;
  char pad[1016];  // two of them congest a port with the smallest SO_RCVBUF
};

// Receives into `seen` until `want` distinct messages are in or a receive fails (it returns
// the errno then, else 0). A message seen twice or with a body it was not sent with is 1.
int receive_all(int fd, std::mutex& mu, std::set<std::pair<uint32_t, uint32_t>>& seen, size_t want,
                std::atomic<bool>& stop) {
  Msg m;
  while (!stop.load()) {
    const ssize_t n = svrds_recvfrom(fd, &m, sizeof m, 0, nullptr, nullptr);
    if (n < 0) return errno == EBADF && stop.load() ? 0 : errno;
    if (n != sizeof m || m.pad[0] != static_cast<char>(m.seq)) return 1;
    std::lock_guard lk(mu);
    if (!seen.insert({m.sender, m.seq}).second) return 1;
    if (seen.size() == want) stop = true;
  }
  return 0;
}

}  // namespace

// Two receivers block in recvmsg on one socket, a third thread polls it and a fourth changes
// its receive options, while two senders fill it past a small SO_RCVBUF: its port congests and
// clears over and over, each clear made by a receive (which sends the map under the stack
// lock). Every message arrives once; the blocking senders are never left waiting for a map
// that did not go.
TEST(RdsThreads, ReceivesPollsAndOptionsBesideSendsAndCongestion) {
  const int rc = in_private_child([] {
    int a, b;
    if (!bound_pair(port(0), port(1), &a, &b)) return 10;
    const int small = 1;  // the floor (1152 B here, as in Linux): two messages congest the port
    if (svrds_setsockopt(b, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) != 0) return 11;
    constexpr uint32_t kPerSender = 3000;
    std::mutex mu;
    std::set<std::pair<uint32_t, uint32_t>> seen;
    std::atomic<bool> stop{false};
    std::atomic<int> recv_err{0}, send_err{0};
    std::vector<std::thread> t;
    for (int r = 0; r < 2; ++r)
      t.emplace_back([&] {
        if (int e = receive_all(b, mu, seen, 2 * kPerSender, stop)) recv_err = e;
      });
    for (uint32_t id = 0; id < 2; ++id)
      t.emplace_back([&, id] {
        Msg m{};
        m.sender = id;
        for (uint32_t i = 0; i < kPerSender && !stop.load(); ++i) {
          m.seq = i;
          m.pad[0] = static_cast<char>(i);
          if (send_to(a, port(1), &m, sizeof m) != sizeof m) {
            send_err = errno;
            return;
          }
        }
      });
    std::thread poller([&] {
      while (!stop.load()) {
        pollfd p{b, POLLIN, 0};
        if (svrds_poll_ready(&p, 1) < 0) recv_err = 2;
        std::this_thread::yield();
      }
    });
    std::thread options([&] {
      for (int v = 0; !stop.load(); v ^= 1) {
        svrds_setsockopt(b, SOL_SOCKET, SO_TIMESTAMP_OLD, &v, sizeof v);
        int z = 1;
        svrds_setsockopt(b, SOL_SOCKET, SO_ZEROCOPY, &z, sizeof z);
        std::this_thread::yield();
      }
    });
    // Bounded: a lost wake-up or a lost map leaves everyone waiting.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!stop.load() && std::chrono::steady_clock::now() < deadline && !send_err && !recv_err)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const bool done = stop.load();
    stop = true;
    poller.join();
    options.join();
    // A failed run may leave threads asleep for good: no join then.
    if (send_err) _exit(20);
    if (recv_err) _exit(21);
    if (!done) _exit(22);
    // Wake the receiver still blocked (the last message went to its twin).
    svrds_close(b);
    for (auto& x : t) x.join();
    if (recv_err) return 21;
    if (seen.size() != 2 * kPerSender) return 23;
    if (counter(a, "cong_send_blocked") == 0) return 24;  // the premise: it did congest
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10/11: set-up; 20: a send failed; 21: a receive failed, or returned a "
                      "message twice or not as sent; 22: not every message came within 60 s; "
                      "24: the port never congested";
}

// close() while threads sleep in recvmsg on the socket: each returns EBADF (they wait on the
// socket's own condition variable now, which close must wake), and a message sent after that
// is dropped, not queued to the closed socket.
TEST(RdsThreads, CloseWakesEveryReceiverAsleepOnTheSocket) {
  const int rc = in_private_child([] {
    int a, b;
    if (!bound_pair(port(2), port(3), &a, &b)) return 10;
    std::atomic<int> woke{0}, ebadf{0};
    std::vector<std::thread> t;
    for (int r = 0; r < 3; ++r)
      t.emplace_back([&] {
        char buf[16];
        const ssize_t n = svrds_recvfrom(b, buf, sizeof buf, 0, nullptr, nullptr);
        if (n < 0 && errno == EBADF) ++ebadf;
        ++woke;
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all three asleep
    if (woke.load() != 0) return 11;
    if (svrds_close(b) != 0) return 12;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (woke.load() < 3 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (woke.load() < 3) _exit(13);  // a receiver sleeps on: do not join it
    for (auto& x : t) x.join();
    return ebadf.load() == 3 ? 0 : 14;
  });
  EXPECT_EQ(rc, 0) << "10: set-up; 11: a receive returned with nothing sent; 12: close; 13: "
                      "a receiver was not woken by close; 14: a receiver woke without EBADF";
}

// A thread blocked in recvmsg waits on the stack's wait descriptor too (as a blocked poll()
// does through the shim), so the bytes of its next message wake it and it takes them in
// itself: the message's completions are counted as taken on a caller's thread
// (busy_poll_completions), not by the device's progress thread. With SOFTVERBS_RDS_WAIT_RX=0
// it sleeps on the socket's condition variable and takes nothing in.
TEST(RdsThreads, ABlockedReceiverTakesInItsOwnMessage) {
  const char* e = std::getenv("SOFTVERBS_RDS_WAIT_RX");
  const bool on = !(e && std::strcmp(e, "0") == 0);
  const int rc = in_private_child([on] {
    int a, b;
    if (!bound_pair(port(4), port(5), &a, &b)) return 10;
    std::vector<char> buf(64);
    uint32_t v = 7;
    // The connection up, its first message taken.
    if (send_to(a, port(5), &v, 4) != 4 || recv_one(b, buf) != 4) return 11;
    int taken_here = 0;
    const pid_t receiver = svtest::this_tid();
    for (uint32_t i = 0; i < 20; ++i) {
      const uint64_t before = counter(a, "busy_poll_completions");
      std::thread sender([&] {
        // The receiver is asleep: on a loaded machine 20 ms may pass before it gets there.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        svtest::thread_asleep(receiver);
        if (send_to(a, port(5), &i, 4) != 4) _exit(12);
      });
      const ssize_t n = svrds_recvfrom(b, buf.data(), buf.size(), 0, nullptr, nullptr);
      sender.join();
      if (n != 4 || std::memcmp(buf.data(), &i, 4) != 0) return 13;
      taken_here += counter(a, "busy_poll_completions") != before;
    }
    // On: most messages. A sender that still holds the stack lock as the bytes come in may
    // take them itself (its quiet posts drain the CQ), and under load the receiver may not
    // be asleep yet when the message is sent. Off: none, ever.
    constexpr int kMost = 10;
    std::fprintf(stderr, "taken on the receiver's thread: %d of 20\n", taken_here);
    if (on ? taken_here < kMost : taken_here != 0) return on ? 14 : 15;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10/11: set-up; 12/13: send, receive; 14: the receiver was woken by "
                      "another thread's delivery; 15: it took completions with "
                      "SOFTVERBS_RDS_WAIT_RX=0";
}

// A large payload is copied in with the stack lock let go (send.cc), as net/rds copies it
// before it queues. Here the copy stops on a page that userfaultfd serves only when the test
// says: meanwhile another socket of the stack sends and receives, and the sending socket is
// closed. The stalled send then fails with EBADF, and none of it arrives. On code that copied
// under the stack lock the other socket's send waits for the stalled copy (20).
TEST(RdsThreads, ALargeSendCopiesItsPayloadOffTheStackLock) {
  const int rc = in_private_child([] {
    int a, b;
    if (!bound_pair(port(6), port(7), &a, &b)) return 10;
    const int c = bound_socket(port(8));
    if (c < 0) return 10;
    std::vector<char> buf(64 << 10);
    // The stack and both connections up, so the stalled send needs nothing but its copy.
    if (send_to(a, port(7), "x", 1) != 1 || recv_one(b, buf) != 1) return 11;
    if (send_to(c, port(7), "y", 1) != 1 || recv_one(b, buf) != 1) return 11;
    // User-mode faults only (the copy is a memcpy in user space): what an unprivileged user
    // may ask for since Linux 5.11; a kernel without the flag says EINVAL.
    int uffd =
        static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    if (uffd < 0 && errno == EINVAL)
      uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (uffd < 0) return 77;  // not permitted here (vm.unprivileged_userfaultfd=0, old kernel)
    uffdio_api api{};
    api.api = UFFD_API;
    if (ioctl(uffd, UFFDIO_API, &api) != 0) return 12;
    constexpr size_t kLen = 32 << 10;  // past the copy-off-the-lock threshold (16 KiB)
    void* region = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 12;
    uffdio_register reg{};
    reg.range = {reinterpret_cast<uint64_t>(region), kLen};
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0) return 12;
    std::atomic<int> send_errno{-1};
    std::thread sender([&] {
      const ssize_t n = send_to(a, port(7), region, kLen);
      send_errno = n < 0 ? errno : 0;
    });
    // From here every step sets result and nothing returns until the pages are served and
    // both threads joined.
    int result = 0;
    uffd_msg fault{};
    if (!wait_for(uffd, POLLIN) || read(uffd, &fault, sizeof fault) != sizeof fault ||
        fault.event != UFFD_EVENT_PAGEFAULT)
      result = 13;
    // The sender is stopped inside its copy. Another socket's send goes through meanwhile.
    std::atomic<bool> other_sent{false};
    std::thread other;
    if (!result) {
      other = std::thread([&] { other_sent = send_to(c, port(7), "z", 1) == 1; });
      for (int i = 0; i < 200 && !other_sent.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (!other_sent.load()) result = 20;
    }
    if (!result) {
      sockaddr_in from{};
      if (recv_one(b, buf, &from) != 1 || buf[0] != 'z' || ntohs(from.sin_port) != port(8))
        result = 21;
    }
    if (!result && svrds_close(a) != 0) result = 22;
    // Serve every page of the region (zeros): the copy finishes.
    uffdio_zeropage zp{};
    zp.range = {reinterpret_cast<uint64_t>(region), kLen};
    if (ioctl(uffd, UFFDIO_ZEROPAGE, &zp) != 0) {
      sender.detach();  // still stopped on its page: _exit ends it
      if (other.joinable()) other.detach();
      return 14;
    }
    sender.join();
    if (other.joinable()) other.join();
    if (result) return result;
    if (send_errno.load() != EBADF) return 23;
    // Nothing of the closed socket's message arrives.
    if (recv_one(b, buf, nullptr, 0, 300) != -2) return 24;
    return 0;
  });
  if (rc == 77) GTEST_SKIP() << "userfaultfd is not permitted here";
  EXPECT_EQ(rc, 0) << "10/11: set-up; 12/13: userfaultfd; 14: serving the pages; 20: another "
                      "socket's send waited for the stalled copy; 21: its message did not "
                      "arrive; 22: close failed; 23: the stalled send did not fail with EBADF; "
                      "24: the closed socket's message arrived";
}

// Four threads send on four sockets to one destination, so over one connection: 64 B messages
// and 100 KB ones (copied with the lock let go, two fragments each) at once. Each sendmsg
// posts with the stack lock let go, so they race for the connection (in_xmit): a sender that
// finds it taken leaves its message to the one posting. The test hook holds each such post
// open 1 ms, so they do race. Every message arrives once, intact, and in its sender's order.
TEST(RdsThreads, SendersRacingForOneConnectionLoseAndReorderNothing) {
  const int rc = in_private_child([] {
    setenv("SOFTVERBS_RDS_TEST_POST_WINDOW_MS", "1", 1);
    constexpr int kSenders = 4, kPer = 300;
    constexpr size_t kSmall = 64, kLarge = 100000;
    const int rx = bound_socket(port(16));
    const int big = 64 << 20;
    if (rx < 0 || svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &big, sizeof big) != 0) return 10;
    int tx[kSenders];
    for (int i = 0; i < kSenders; ++i) {
      tx[i] = bound_socket(port(12 + i));
      if (tx[i] < 0 || svrds_setsockopt(tx[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof big) != 0)
        return 10;
    }
    // The connection up first: messages sent while it connects all go out at once when it
    // comes up, posted by the engine thread with the lock held.
    {
      std::vector<char> b(16);
      for (int i = 0; i < kSenders; ++i)
        if (send_to(tx[i], port(16), "up", 2) != 2) return 10;
      for (int i = 0; i < kSenders; ++i)
        if (recv_one(rx, b) != 2) return 10;
    }
    auto size_of = [](int seq) { return seq % 5 == 4 ? kLarge : kSmall; };
    auto fill = [](int sender, int seq, size_t i) {
      return static_cast<char>(sender * 31 + seq * 7 + static_cast<int>(i % 251));
    };
    const uint64_t unlocked = counter(rx, "send_post_unlocked");
    const uint64_t raced = counter(rx, "send_xmit_raced");
    std::atomic<int> send_err{0};
    std::vector<std::thread> t;
    for (int i = 0; i < kSenders; ++i)
      t.emplace_back([&, i] {
        std::vector<char> b(kLarge);
        for (int seq = 0; seq < kPer; ++seq) {
          const size_t n = size_of(seq);
          for (size_t k = 8; k < n; ++k) b[k] = fill(i, seq, k);
          std::memcpy(b.data(), &i, 4);
          std::memcpy(b.data() + 4, &seq, 4);
          if (send_to(tx[i], port(16), b.data(), n) != static_cast<ssize_t>(n)) {
            send_err = errno ? errno : -1;
            return;
          }
        }
      });
    int next[kSenders] = {};
    int result = 0;
    std::vector<char> buf(kLarge + 1);
    for (int got = 0; got < kSenders * kPer && !result;) {
      const ssize_t n = recv_one(rx, buf, nullptr, 0, 10000);
      if (n < 8) {
        result = 20;
        break;
      }
      int sender, seq;
      std::memcpy(&sender, buf.data(), 4);
      std::memcpy(&seq, buf.data() + 4, 4);
      if (sender < 0 || sender >= kSenders || seq != next[sender]) {
        result = 21;  // lost, duplicated or out of its sender's order
        break;
      }
      if (static_cast<size_t>(n) != size_of(seq)) result = 22;
      for (size_t k = 8; k < static_cast<size_t>(n) && !result; ++k)
        if (buf[k] != fill(sender, seq, k)) result = 22;
      ++next[sender];
      ++got;
    }
    for (auto& th : t) th.join();
    if (send_err.load()) return 11;
    if (result) return result;
    if (recv_one(rx, buf, nullptr, 0, 200) != -2) return 23;  // nothing more: no duplicate
    std::fprintf(stderr, "unlocked posts %llu, raced %llu\n",
                 static_cast<unsigned long long>(counter(rx, "send_post_unlocked") - unlocked),
                 static_cast<unsigned long long>(counter(rx, "send_xmit_raced") - raced));
    if (counter(rx, "send_post_unlocked") <= unlocked) return 24;
    if (counter(rx, "send_xmit_raced") <= raced) return 25;
    return 0;
  });
  EXPECT_EQ(rc, 0)
      << "10/11: set-up, a send failed; 20: a message did not arrive; 21: one was "
         "lost, duplicated or reordered; 22: its length or bytes were wrong; 23: "
         "an extra one arrived; 24: no post was made with the lock let go; 25: no sender "
         "found the connection taken";
}

// Four threads issue RDMA Writes over one connection, each to a region of the receiver's own,
// 32 KiB each: large enough that sendmsg posts them on the RDMA channel with the stack lock let
// go (rdma.cc, chan_in_xmit). The test hook holds each such post open 1 ms, so the senders race
// for the channel: one that finds it taken leaves its op to the one posting. Every op reports
// SUCCESS once, with its own token; every message arrives once, in its sender's order, after
// its Write has landed (the fence); and the data is each Write's own.
TEST(RdsThreads, RdmaWritersRacingForOneChannelLoseAndReorderNothing) {
  const int rc = in_private_child([] {
    setenv("SOFTVERBS_RDS_TEST_POST_WINDOW_MS", "1", 1);
    constexpr int kSenders = 4, kPer = 24;
    constexpr size_t kLen = 32768;
    const int rx = bound_socket(port(30));
    if (rx < 0) return 10;
    int tx[kSenders];
    std::vector<std::vector<char>> region(kSenders, std::vector<char>(kPer * kLen, 0));
    uint64_t cookie[kSenders];
    for (int i = 0; i < kSenders; ++i) {
      tx[i] = bound_socket(port(31 + i));
      cookie[i] = get_mr(rx, region[i].data(), region[i].size());
      if (tx[i] < 0 || cookie[i] == 0) return 10;
    }
    {  // the connection and its RDMA channel up first
      std::vector<char> b(16);
      if (send_to(tx[0], port(30), "up", 2) != 2 || recv_one(rx, b) != 2) return 10;
    }
    auto fill = [](int sender, int seq, size_t i) {
      return static_cast<char>(sender * 37 + seq * 11 + static_cast<int>(i % 253));
    };
    const uint64_t unlocked = counter(rx, "rdma_post_unlocked");
    const uint64_t raced = counter(rx, "rdma_post_raced");
    std::atomic<int> failed{0};
    std::vector<std::thread> t;
    for (int i = 0; i < kSenders; ++i)
      t.emplace_back([&, i] {
        std::vector<char> src(kLen);
        std::set<uint64_t> tokens;
        for (int seq = 0; seq < kPer; ++seq) {
          for (size_t k = 0; k < kLen; ++k) src[k] = fill(i, seq, k);
          std::vector<rds_iovec> local{{reinterpret_cast<uint64_t>(src.data()), kLen}};
          const std::string msg = std::to_string(i) + " " + std::to_string(seq);
          if (send_rdma(tx[i], port(30), cookie[i], true, local, seq * kLen, kLen,
                        static_cast<uint64_t>(i) << 32 | static_cast<unsigned>(seq),
                        msg.c_str()) != static_cast<ssize_t>(msg.size())) {
            failed = 1;
            return;
          }
          // Its op is done with src once it reports: the next Write may refill it.
          rds_rdma_notify note{};
          if (!get_notify(tx[i], note, 10000) || note.status != RDS_RDMA_SUCCESS ||
              note.user_token != (static_cast<uint64_t>(i) << 32 | static_cast<unsigned>(seq)) ||
              !tokens.insert(note.user_token).second) {
            failed = 2;
            return;
          }
        }
      });
    int next[kSenders] = {};
    int result = 0;
    std::vector<char> buf(64);
    for (int got = 0; got < kSenders * kPer && !result; ++got) {
      const ssize_t n = recv_one(rx, buf, nullptr, 0, 10000);
      int sender = -1, seq = -1;
      if (n <= 0 || std::sscanf(std::string(buf.data(), static_cast<size_t>(n)).c_str(), "%d %d",
                                &sender, &seq) != 2) {
        result = 20;
        break;
      }
      if (sender < 0 || sender >= kSenders || seq != next[sender]) {
        result = 21;  // lost, duplicated or out of its sender's order
        break;
      }
      for (size_t k = 0; k < kLen && !result; ++k)
        if (region[sender][seq * kLen + k] != fill(sender, seq, k)) result = 22;
      ++next[sender];
    }
    for (auto& th : t) th.join();
    if (failed.load()) return 10 + failed.load();
    if (result) return result;
    if (recv_one(rx, buf, nullptr, 0, 200) != -2) return 23;  // nothing more: no duplicate
    std::fprintf(stderr, "unlocked RDMA posts %llu, raced %llu\n",
                 static_cast<unsigned long long>(counter(rx, "rdma_post_unlocked") - unlocked),
                 static_cast<unsigned long long>(counter(rx, "rdma_post_raced") - raced));
    if (counter(rx, "rdma_post_unlocked") <= unlocked) return 24;
    if (counter(rx, "rdma_post_raced") <= raced) return 25;
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: set-up; 11: a send failed; 12: an op did not report SUCCESS once "
                      "with its token; 20: a message did not arrive; 21: one was lost, "
                      "duplicated or reordered; 22: its Write's data was not there; 23: an extra "
                      "one arrived; 24: no op was posted with the lock let go; 25: no sender "
                      "found the channel taken";
}
