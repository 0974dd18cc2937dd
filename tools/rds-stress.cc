// rds-stress: the rds-tools load generator, for softverbs RDS, and wire-compatible with
// rds-tools' own rds-stress (2.0.x and 2.3.x) in both roles: see rds_stress_wire.h.
//   passive: rds-stress [-r addr] [-p port]          active: rds-stress -s addr [-r addr] ...
// Options: -q req-bytes (1024), -a ack-bytes (63), -d depth (1), -t tasks (1), -T seconds,
// -D rdma-bytes, -I rdma-buffers (each -D bytes), -M 0|1|2 (alternate|read|write), -v (verify
// data), -o (only the active side sends requests), -z (summary only), --rdma-use-once 0|1,
// --rdma-use-get-mr 0|1, --rdma-use-fence 0|1, --rdma-cache-mrs 0|1, --rdma-alignment n,
// --use-cong-monitor 0|1, --connect-retries n, --show-params; --control
// v1|v2[:VERSION]|json[:VERSION] picks the active side's option exchange (default v1, which every
// rds-tools passive understands).
//
// Each side forks -t tasks; task i binds RDS port (port+1+i) and talks to every remote task,
// keeping -d requests outstanding per peer. A request is answered by an ack; with -D the ack
// performs the RDMA (RDS_CMSG_RDMA_ARGS, NOTIFY_ME, FENCE for reads) on the MR the request
// carried (RDS_CMSG_RDMA_MAP, or RDS_GET_MR + RDS_CMSG_RDMA_DEST). Every message to a peer
// carries the next sequence number and its slot index; the receiver checks both, the
// addresses, the sizes and (-v) the payload and RDMA data. After 2 s of start-up and 2 s of
// burn-in the parent prints, each second and scaled by the measured interval,
//   tsks   tx/s   rx/s  tx+rx K/s    mbi K/s    mbo K/s tx us/c   rtt us cpu %
// and at the end the average over the measured interval. The active side runs -T seconds,
// then closes the control connection, which ends the passive side.
// Written against <linux/rds.h> and the socket API; linked with the softverbs shim.
#include <arpa/inet.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/rds.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "rds_stress_wire.h"

namespace {

using namespace rds_stress;

// The version string of a V2 options block. An rds-tools passive side reads V2 only if the
// string equals its own RDS_VERSION (else it takes the bytes for V1), and both the master
// tree and the 2.3.x tags build as "2.0.7" from their shipped configure, so that is the
// default; --control v2:VERSION or json:VERSION picks another.
constexpr const char* kDefaultPeerVersion = "2.0.7";
constexpr uint32_t kMaxIov = 512;

[[noreturn]] void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fputs("rds-stress: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stdout);
  std::exit(1);
}
#define DIE_ERRNO(what, ...) die(what ": %s" __VA_OPT__(, ) __VA_ARGS__, std::strerror(errno))

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// ---- per-task counters, shared with the parent (one writer each) ----------------------

enum Stat {
  S_REQ_TX,
  S_REQ_RX,
  S_BYTES,  // requests and acks, sent and received
  S_MBI,
  S_MBO,
  S_TX_NS,
  S_TX_CALLS,
  S_RTT_NS,
  S_RTT_N,
  S_ERRORS,
  S_COUNT
};

struct alignas(128) TaskCtl {
  std::atomic<uint64_t> stat[S_COUNT];
  std::atomic<uint64_t> start_ns;  // parent -> task: when to start
  std::atomic<int> ready;          // task -> parent: bound and waiting
  std::atomic<int> stopping;       // parent -> task: send no more requests
};

inline void bump(TaskCtl* c, Stat s, uint64_t v) {
  c->stat[s].store(c->stat[s].load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}

volatile sig_atomic_t g_term = 0;
void on_term(int) {
  g_term = 1;
}

// ---- one task ----------------------------------------------------------------------------

struct Slot {
  uint64_t sent_ns = 0;
  uint8_t* rdma_buf = nullptr;   // our memory the peer's ack RDMAs (request side)
  uint8_t* local_buf = nullptr;  // local side of the RDMA we do when acking
  uint64_t req_cookie = 0;       // RDS_GET_MR cookie not yet consumed (or cached)
  uint64_t map_cookie = 0;       // where RDS_CMSG_RDMA_MAP writes the cookie
  bool inflight = false;         // our RDMA on local_buf not notified yet
  bool verify_read = false;      // check local_buf against read_pattern when notified
  uint64_t read_pattern = 0;
  Header ack;  // the ack to send for the request received in this slot
};

struct Peer {
  sockaddr_in addr{};
  uint32_t send_seq = 0, recv_seq = 0;
  uint32_t send_index = 0, pending = 0, recv_index = 0, unacked = 0;
  bool congested = false, draining = false;
  uint8_t next_rdma_op = RDMA_OP_WRITE;
  std::vector<Slot> slots;
};

class Task {
 public:
  Task(const Options& o, uint32_t id, TaskCtl* ctl, bool active)
      : o_(o), id_(id), ctl_(ctl), do_work_(o.simplex ? active : true) {}

  [[noreturn]] void run(pid_t parent);

 private:
  void setup();
  void recv_all();
  bool recv_one();  // false: nothing more to read
  int send_anything(Peer& p);
  int send_request(Peer& p);
  int send_ack(Peer& p, uint32_t qindex);
  void on_notify(const rds_rdma_notify& n);
  ssize_t send(Peer& p, const Header& h, uint32_t size, msghdr& m);
  [[noreturn]] void header_mismatch(const Header& want, const Header& got, const sockaddr_in&);

  const Options o_;
  const uint32_t id_;
  TaskCtl* const ctl_;
  const bool do_work_;
  int fd_ = -1;
  sockaddr_in me_{};
  std::vector<Peer> peers_;
  std::vector<uint8_t> out_, in_, pattern_;
  std::vector<rds_iovec> iov_;
  uint32_t req_len_ = 0, ack_len_ = 0;
  uint64_t rdma_bytes_ = 0;  // rdma_size * rdma_vector
  bool want_pollout_ = false;
};

void Task::setup() {
  me_.sin_family = AF_INET;
  me_.sin_addr.s_addr = htonl(o_.receive_addr);
  me_.sin_port = htons(static_cast<uint16_t>(o_.starting_port + 1 + id_));
  req_len_ = o_.req_size;
  ack_len_ = o_.ack_size;
  rdma_bytes_ = static_cast<uint64_t>(o_.rdma_size) * o_.rdma_vector;
  const size_t msg = std::max(req_len_, ack_len_);
  out_.assign(msg, 0);
  in_.assign(msg + 1, 0);  // one spare byte: a longer message shows as MSG_TRUNC
  pattern_.assign(msg, 0);
  payload_pattern(pattern_.data(), msg);
  std::memcpy(out_.data() + kHeaderSize, pattern_.data(), msg - kHeaderSize);
  iov_.resize(std::max<uint32_t>(o_.rdma_vector, 1));

  peers_.resize(o_.nr_tasks);
  for (uint32_t i = 0; i < o_.nr_tasks; ++i) {
    Peer& p = peers_[i];
    p.addr.sin_family = AF_INET;
    p.addr.sin_addr.s_addr = htonl(o_.send_addr);
    p.addr.sin_port = htons(static_cast<uint16_t>(o_.starting_port + 1 + i));
    p.next_rdma_op = (i & 1) ? RDMA_OP_READ : RDMA_OP_WRITE;
    p.slots.resize(o_.req_depth);
  }
  if (o_.rdma_size) {
    // Two page-aligned buffers per peer and slot: the one we lend, the one we RDMA from/to.
    const size_t len = 2 * static_cast<size_t>(o_.nr_tasks) * o_.req_depth * rdma_bytes_ + 2 * 4096;
    void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) DIE_ERRNO("mmap of %zu bytes of RDMA buffers", len);
    std::memset(base, 0x2f, len);
    uint8_t* b = static_cast<uint8_t*>(base) + o_.rdma_alignment;
    for (Peer& p : peers_)
      for (Slot& s : p.slots) {
        s.rdma_buf = b;
        b += rdma_bytes_;
        s.local_buf = b;
        b += rdma_bytes_;
      }
  }

  fd_ = socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd_ < 0) DIE_ERRNO("socket(AF_RDS)");
  if (bind(fd_, reinterpret_cast<sockaddr*>(&me_), sizeof me_) < 0)
    DIE_ERRNO("bind %s:%u", inet_ntoa(me_.sin_addr), ntohs(me_.sin_port));
  int bytes = static_cast<int>(std::min<uint64_t>(
      static_cast<uint64_t>(o_.nr_tasks) * o_.req_depth * (o_.req_size + o_.ack_size) * 2,
      INT32_MAX / 2));
  if (setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) < 0)
    DIE_ERRNO("setsockopt(SO_SNDBUF, %d)", bytes);
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes) < 0)
    DIE_ERRNO("setsockopt(SO_RCVBUF, %d)", bytes);
  int one = 1;
  if (o_.use_cong_monitor && setsockopt(fd_, SOL_RDS, RDS_CONG_MONITOR, &one, sizeof one) < 0)
    DIE_ERRNO("setsockopt(RDS_CONG_MONITOR)");
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

void Task::run(pid_t parent) {
  signal(SIGTERM, on_term);
  setup();
  ctl_->ready.store(1);
  // Wait for the parent's start time (both sides' tasks are bound by then).
  for (;;) {
    if (getppid() != parent || g_term) std::exit(0);
    const uint64_t start = ctl_->start_ns.load();
    const uint64_t t = now_ns();
    if (start && t >= start) break;
    usleep(start ? static_cast<useconds_t>(std::min<uint64_t>((start - t) / 1000, 100000))
                 : 100000);
  }
  pollfd pfd{fd_, POLLIN | POLLOUT, 0};
  uint32_t idle = 0;
  uint32_t idle_polls = 0;  // every one, not only a streak's (a ping-pong's alternate rounds)
  while (!g_term) {
    // Block only when the last round did nothing: a busy task goes straight back to
    // recvmsg/sendmsg instead of paying a poll() per message.
    if (idle) {
      pfd.events = static_cast<short>(POLLIN | (want_pollout_ ? POLLOUT : 0));
      const int r = poll(&pfd, 1, 1000);
      if (r < 0 && errno != EINTR) DIE_ERRNO("poll");
      // Not at every idle round: under a busy-polling shim poll() is no system call and
      // returns at once, and getppid() is one, a few hundred thousand a second, each on the
      // round trip this tool measures (0.2-0.3 us of a 3 us busy-polled RTT over shm). A
      // poll that timed out, or every 1024th poll, still notices an orphaned task.
      if ((r == 0 || (++idle_polls & 1023) == 0) && getppid() != parent)
        die("task %u: parent %d exited", id_, parent);
    }
    const uint64_t before = ctl_->stat[S_REQ_RX].load(std::memory_order_relaxed) +
                            ctl_->stat[S_BYTES].load(std::memory_order_relaxed);
    recv_all();
    bool sent = false;
    want_pollout_ = false;
    if (!ctl_->stopping.load(std::memory_order_relaxed)) {
      const uint64_t tx0 = ctl_->stat[S_BYTES].load(std::memory_order_relaxed);
      for (Peer& p : peers_) {
        if ((o_.use_cong_monitor && p.congested) || p.draining) continue;
        if (send_anything(p) < 0) {
          if (errno == ENOBUFS) {
            p.congested = true;  // this destination is congested; try the others
          } else if (errno == EBADSLT) {
            p.draining = true;  // an ack's RDMA buffer is still in flight
          } else {
            want_pollout_ = true;  // EAGAIN: our send buffer is full
            break;
          }
        }
      }
      sent = ctl_->stat[S_BYTES].load(std::memory_order_relaxed) != tx0;
    }
    const uint64_t after = ctl_->stat[S_REQ_RX].load(std::memory_order_relaxed) +
                           ctl_->stat[S_BYTES].load(std::memory_order_relaxed);
    idle = (after == before && !sent) ? idle + 1 : 0;
  }
  close(fd_);
  std::exit(0);
}

void Task::recv_all() {
  while (recv_one()) {
  }
}

void Task::on_notify(const rds_rdma_notify& n) {
  const uint32_t pi = static_cast<uint32_t>(n.user_token >> 32);
  const uint32_t si = static_cast<uint32_t>(n.user_token & 0xffffffffu);
  if (pi >= peers_.size() || si >= o_.req_depth) die("RDMA notification with bad token");
  Peer& p = peers_[pi];
  Slot& s = p.slots[si];
  if (n.status != RDS_RDMA_SUCCESS) {
    if (!ctl_->stopping.load() && !g_term) {
      std::fprintf(stderr, "rds-stress: task %u: RDMA to %s:%u failed, status %d\n", id_,
                   inet_ntoa(p.addr.sin_addr), ntohs(p.addr.sin_port), n.status);
      bump(ctl_, S_ERRORS, 1);
    }
  } else if (s.verify_read && !check_rdma(s.local_buf, o_.rdma_size, s.read_pattern)) {
    die("task %u: RDMA READ from %s:%u brought wrong data (pattern %016llx)", id_,
        inet_ntoa(p.addr.sin_addr), ntohs(p.addr.sin_port),
        static_cast<unsigned long long>(s.read_pattern));
  }
  s.inflight = false;
  s.verify_read = false;
  p.draining = false;
}

void Task::header_mismatch(const Header& want, const Header& got, const sockaddr_in& from) {
  auto ip = [](uint32_t a) {
    in_addr x{a};
    return std::string(inet_ntoa(x));
  };
  std::printf(
      "task %u: message from %s:%u does not have the expected header\n"
      "  field         expected             got\n"
      "  seq     %15u %15u\n  from    %15s %15s\n  fport   %15u %15u\n"
      "  to      %15s %15s\n  tport   %15u %15u\n  index   %15u %15u\n  op      %15u %15u\n",
      id_, inet_ntoa(from.sin_addr), ntohs(from.sin_port), want.seq, got.seq,
      ip(want.from_addr).c_str(), ip(got.from_addr).c_str(), ntohs(want.from_port),
      ntohs(got.from_port), ip(want.to_addr).c_str(), ip(got.to_addr).c_str(), ntohs(want.to_port),
      ntohs(got.to_port), want.index, got.index, want.op, got.op);
  die("task %u: bad header", id_);
}

bool Task::recv_one() {
  alignas(cmsghdr) char cbuf[256];
  sockaddr_in from{};
  iovec v{in_.data(), in_.size()};
  msghdr m{};
  m.msg_name = &from;
  m.msg_namelen = sizeof from;
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  const ssize_t n = recvmsg(fd_, &m, MSG_DONTWAIT);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return false;
    DIE_ERRNO("recvmsg");
  }
  uint64_t dest_cookie = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_RDS) continue;
    if (c->cmsg_type == RDS_CMSG_CONG_UPDATE) {
      uint64_t mask;
      std::memcpy(&mask, CMSG_DATA(c), sizeof mask);
      for (Peer& p : peers_)
        if (mask & RDS_CONG_MONITOR_MASK(ntohs(p.addr.sin_port))) p.congested = false;
    } else if (c->cmsg_type == RDS_CMSG_RDMA_DEST) {
      std::memcpy(&dest_cookie, CMSG_DATA(c), sizeof dest_cookie);
    } else if (c->cmsg_type == RDS_CMSG_RDMA_STATUS) {
      rds_rdma_notify note;
      std::memcpy(&note, CMSG_DATA(c), sizeof note);
      on_notify(note);
    }
  }
  if (n == 0) return true;  // notifications or congestion updates only

  const uint32_t pi = static_cast<uint32_t>(ntohs(from.sin_port) - o_.starting_port - 1);
  if (pi >= peers_.size() || from.sin_addr.s_addr != htonl(o_.send_addr))
    die("task %u: message from unexpected %s:%u", id_, inet_ntoa(from.sin_addr),
        ntohs(from.sin_port));
  Peer& p = peers_[pi];
  if (static_cast<size_t>(n) < kHeaderSize)
    die("task %u: %zd-byte message from %s:%u", id_, n, inet_ntoa(from.sin_addr),
        ntohs(from.sin_port));
  const Header h = decode_header(in_.data());
  Header want;
  uint32_t expect_len;
  if (h.op == OP_REQ) {
    expect_len = req_len_;
    want.index = static_cast<uint16_t>(p.recv_index);
  } else if (h.op == OP_ACK) {
    expect_len = ack_len_;
    want.index = static_cast<uint16_t>((p.send_index + o_.req_depth - p.pending) % o_.req_depth);
  } else {
    die("task %u: unknown op %u from %s:%u", id_, h.op, inet_ntoa(from.sin_addr),
        ntohs(from.sin_port));
  }
  if (static_cast<size_t>(n) != expect_len || (m.msg_flags & MSG_TRUNC))
    die("task %u: %s of %zd bytes from %s:%u, expected %u", id_, h.op == OP_REQ ? "request" : "ack",
        n, inet_ntoa(from.sin_addr), ntohs(from.sin_port), expect_len);
  want.seq = p.recv_seq;
  want.from_addr = from.sin_addr.s_addr;
  want.from_port = from.sin_port;
  want.to_addr = me_.sin_addr.s_addr;
  want.to_port = me_.sin_port;
  want.op = h.op;
  if (h.seq != want.seq || h.from_addr != want.from_addr || h.from_port != want.from_port ||
      h.to_addr != want.to_addr || h.to_port != want.to_port || h.index != want.index)
    header_mismatch(want, h, from);
  if (o_.verify && std::memcmp(in_.data() + kHeaderSize, pattern_.data(), n - kHeaderSize) != 0)
    die("task %u: corrupted payload in seq %u from %s:%u", id_, h.seq, inet_ntoa(from.sin_addr),
        ntohs(from.sin_port));
  bump(ctl_, S_BYTES, static_cast<uint64_t>(n));

  if (h.op == OP_ACK) {
    Slot& s = p.slots[want.index];
    bump(ctl_, S_RTT_NS, now_ns() - s.sent_ns);
    bump(ctl_, S_RTT_N, 1);
    if (p.pending) --p.pending;
    if (h.rdma_key) {
      // The peer has done the RDMA on the MR this request lent it.
      if (!o_.rdma_use_once && !o_.rdma_cache_mrs) {
        rds_free_mr_args f{h.rdma_key, 0};
        setsockopt(fd_, SOL_RDS, RDS_FREE_MR, &f, sizeof f);
      }
      if (h.rdma_op == RDMA_OP_WRITE) {
        bump(ctl_, S_MBI, h.rdma_size);
        if (o_.verify && !check_rdma(s.rdma_buf, o_.rdma_size, h.rdma_pattern))
          die("task %u: RDMA WRITE by %s:%u left wrong data (seq %u, pattern %016llx)", id_,
              inet_ntoa(from.sin_addr), ntohs(from.sin_port), h.seq,
              static_cast<unsigned long long>(h.rdma_pattern));
      } else {
        bump(ctl_, S_MBO, h.rdma_size);
      }
    }
  } else {
    bump(ctl_, S_REQ_RX, 1);
    Slot& s = p.slots[p.recv_index];
    Header& a = s.ack;
    a = Header{};
    a.op = OP_ACK;
    a.index = static_cast<uint16_t>(p.recv_index);
    const uint64_t cookie = dest_cookie ? dest_cookie : h.rdma_key;
    if (cookie) {
      if (h.rdma_size != o_.rdma_size || h.rdma_vector != o_.rdma_vector ||
          (h.rdma_op != RDMA_OP_READ && h.rdma_op != RDMA_OP_WRITE))
        die("task %u: request for RDMA op %u of %u x %u bytes, expected %u x %u", id_, h.rdma_op,
            h.rdma_vector, h.rdma_size, o_.rdma_vector, o_.rdma_size);
      // Echo the RDMA fields: the requester frees and checks its MR from them.
      a.rdma_op = h.rdma_op;
      a.rdma_size = h.rdma_size;
      a.rdma_key = cookie;
      a.rdma_phyaddr = h.rdma_phyaddr;
      a.rdma_addr = h.rdma_addr;
      a.rdma_pattern = h.rdma_pattern;
      a.rdma_vector = h.rdma_vector;
    }
    ++p.unacked;
    p.recv_index = (p.recv_index + 1) % o_.req_depth;
  }
  ++p.recv_seq;
  return true;
}

ssize_t Task::send(Peer& p, const Header& h, uint32_t size, msghdr& m) {
  encode_header(h, out_.data());
  iovec v{out_.data(), size};
  m.msg_name = &p.addr;
  m.msg_namelen = sizeof p.addr;
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  const ssize_t r = sendmsg(fd_, &m, 0);
  if (r < 0) {
    if (errno != EAGAIN && errno != ENOBUFS && errno != EINTR)
      DIE_ERRNO("task %u: sendmsg to %s:%u", id_, inet_ntoa(p.addr.sin_addr),
                ntohs(p.addr.sin_port));
    if (errno == EINTR) errno = EAGAIN;
    return -1;
  }
  if (static_cast<size_t>(r) != size) die("task %u: sendmsg sent %zd of %u bytes", id_, r, size);
  return r;
}

int Task::send_ack(Peer& p, uint32_t qindex) {
  Slot& s = p.slots[qindex];
  Header h = s.ack;
  h.seq = p.send_seq;
  h.from_addr = me_.sin_addr.s_addr;
  h.from_port = me_.sin_port;
  h.to_addr = p.addr.sin_addr.s_addr;
  h.to_port = p.addr.sin_port;
  msghdr m{};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(rds_rdma_args))];
  if (h.rdma_op) {
    // The local side of the previous RDMA through this slot must be ours again.
    if (s.inflight) {
      errno = EBADSLT;
      return -1;
    }
    for (uint32_t i = 0; i < o_.rdma_vector; ++i)
      iov_[i] = {reinterpret_cast<uint64_t>(s.local_buf) + static_cast<uint64_t>(i) * h.rdma_size,
                 h.rdma_size};
    rds_rdma_args ra{};
    ra.cookie = h.rdma_key;
    ra.remote_vec = {h.rdma_phyaddr, rdma_bytes_};
    ra.local_vec_addr = reinterpret_cast<uint64_t>(iov_.data());
    ra.nr_local = o_.rdma_vector;
    ra.user_token = static_cast<uint64_t>(&p - peers_.data()) << 32 | qindex;
    if (h.rdma_op == RDMA_OP_WRITE) {
      ra.flags = RDS_RDMA_READWRITE;
      if (o_.verify) fill_rdma(s.local_buf, h.rdma_size, h.rdma_pattern);
    } else {
      ra.flags = o_.rdma_use_fence ? RDS_RDMA_FENCE : 0;
      s.verify_read = o_.verify;
      s.read_pattern = h.rdma_pattern;
    }
    ra.flags |= RDS_RDMA_NOTIFY_ME;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_RDS;
    c->cmsg_type = RDS_CMSG_RDMA_ARGS;
    c->cmsg_len = CMSG_LEN(sizeof ra);
    std::memcpy(CMSG_DATA(c), &ra, sizeof ra);
  }
  if (send(p, h, ack_len_, m) < 0) {
    s.verify_read = false;
    return -1;
  }
  if (h.rdma_op) s.inflight = true;
  ++p.send_seq;
  bump(ctl_, S_BYTES, ack_len_);
  if (h.rdma_op == RDMA_OP_WRITE) bump(ctl_, S_MBO, h.rdma_size);
  if (h.rdma_op == RDMA_OP_READ) bump(ctl_, S_MBI, h.rdma_size);
  return 0;
}

int Task::send_request(Peer& p) {
  const uint32_t slot = p.send_index;
  Slot& s = p.slots[slot];
  Header h;
  h.op = OP_REQ;
  h.seq = p.send_seq;
  h.from_addr = me_.sin_addr.s_addr;
  h.from_port = me_.sin_port;
  h.to_addr = p.addr.sin_addr.s_addr;
  h.to_port = p.addr.sin_port;
  h.index = static_cast<uint16_t>(slot);
  msghdr m{};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(rds_get_mr_args))];
  // Like rds-tools, the first few messages go without RDMA (connection set-up).
  if (o_.rdma_size && p.send_seq > 10) {
    if (o_.rw_mode == MODE_READWRITE)
      p.next_rdma_op = p.next_rdma_op == RDMA_OP_READ ? RDMA_OP_WRITE : RDMA_OP_READ;
    else
      p.next_rdma_op = o_.rw_mode == MODE_READ ? RDMA_OP_READ : RDMA_OP_WRITE;
    h.rdma_op = p.next_rdma_op;
    h.rdma_pattern = static_cast<uint64_t>(p.send_seq) << 32 | static_cast<uint32_t>(getpid());
    h.rdma_addr = reinterpret_cast<uint64_t>(s.rdma_buf);
    h.rdma_size = o_.rdma_size;
    h.rdma_vector = o_.rdma_vector;
    if (o_.verify)
      fill_rdma(s.rdma_buf, o_.rdma_size, h.rdma_op == RDMA_OP_READ ? h.rdma_pattern : 0);
    rds_get_mr_args g{{h.rdma_addr, rdma_bytes_},
                      0,
                      RDS_RDMA_READWRITE | (o_.rdma_use_once ? RDS_RDMA_USE_ONCE : 0u)};
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;  // CMSG_FIRSTHDR needs room for a header
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_RDS;
    if (o_.rdma_use_get_mr) {
      if (!s.req_cookie) {
        g.cookie_addr = reinterpret_cast<uint64_t>(&s.req_cookie);
        if (setsockopt(fd_, SOL_RDS, RDS_GET_MR, &g, sizeof g) < 0) DIE_ERRNO("RDS_GET_MR");
      }
      h.rdma_key = s.req_cookie;
      m.msg_controllen = CMSG_SPACE(sizeof(uint64_t));
      c->cmsg_type = RDS_CMSG_RDMA_DEST;
      c->cmsg_len = CMSG_LEN(sizeof(uint64_t));
      std::memcpy(CMSG_DATA(c), &s.req_cookie, sizeof(uint64_t));
    } else {
      g.cookie_addr = reinterpret_cast<uint64_t>(&s.map_cookie);
      m.msg_controllen = CMSG_SPACE(sizeof g);
      c->cmsg_type = RDS_CMSG_RDMA_MAP;
      c->cmsg_len = CMSG_LEN(sizeof g);
      std::memcpy(CMSG_DATA(c), &g, sizeof g);
    }
  }
  const uint64_t t0 = now_ns();
  if (send(p, h, req_len_, m) < 0) return -1;
  const uint64_t t1 = now_ns();
  s.sent_ns = t0;
  if (!o_.rdma_cache_mrs) s.req_cookie = 0;  // consumed by this request
  ++p.send_seq;
  p.send_index = (p.send_index + 1) % o_.req_depth;
  ++p.pending;
  bump(ctl_, S_REQ_TX, 1);
  bump(ctl_, S_BYTES, req_len_);
  bump(ctl_, S_TX_NS, t1 - t0);
  bump(ctl_, S_TX_CALLS, 1);
  return 0;
}

// Acks first (oldest first), then new requests up to the depth.
int Task::send_anything(Peer& p) {
  while (p.unacked) {
    const uint32_t q = (p.recv_index + o_.req_depth - p.unacked) % o_.req_depth;
    if (send_ack(p, q) < 0) return -1;
    --p.unacked;
  }
  while (do_work_ && p.pending < o_.req_depth)
    if (send_request(p) < 0) return -1;
  return 0;
}

// ---- control connection ------------------------------------------------------------------

void write_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  while (n) {
    const ssize_t r = write(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) DIE_ERRNO("control connection: write");
    b += r;
    n -= static_cast<size_t>(r);
  }
}

void read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 60000) == 0) die("control connection: peer silent for 60 s");
    const ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) DIE_ERRNO("control connection: read");
    if (r == 0) die("control connection: peer closed it");
    b += r;
    n -= static_cast<size_t>(r);
  }
}

// JSON options (rds-tools 2.3.x): a flat object of names and integer or string values.
struct JsonValue {
  bool is_string = false;
  std::string s;
  long long n = 0;
};

std::map<std::string, JsonValue> parse_json_object(const std::string& t) {
  std::map<std::string, JsonValue> out;
  size_t i = 0;
  auto ws = [&] {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\t' || t[i] == '\r')) ++i;
  };
  auto str = [&] {
    std::string s;
    if (i >= t.size() || t[i] != '"') die("JSON options: expected a string at %zu", i);
    for (++i; i < t.size() && t[i] != '"'; ++i) {
      if (t[i] == '\\' && i + 1 < t.size()) ++i;
      s += t[i];
    }
    ++i;
    return s;
  };
  ws();
  if (i >= t.size() || t[i++] != '{') die("JSON options: not an object");
  for (;;) {
    ws();
    if (i < t.size() && t[i] == '}') break;
    std::string key = str();
    ws();
    if (i >= t.size() || t[i++] != ':') die("JSON options: expected ':' after \"%s\"", key.c_str());
    ws();
    JsonValue v;
    if (i < t.size() && t[i] == '"') {
      v.is_string = true;
      v.s = str();
    } else {
      size_t end = i;
      while (end < t.size() && t[end] != ',' && t[end] != '}' && t[end] != ' ' && t[end] != '\n')
        ++end;
      const std::string tok = t.substr(i, end - i);
      v.n = tok == "true" ? 1 : std::strtoll(tok.c_str(), nullptr, 10);
      i = end;
    }
    out[key] = v;
    ws();
    if (i < t.size() && t[i] == ',') {
      ++i;
      continue;
    }
    if (i < t.size() && t[i] == '}') break;
    die("JSON options: expected ',' or '}' at %zu", i);
  }
  return out;
}

// The option names of the JSON exchange, bound to our fields.
struct JsonField {
  const char* name;
  uint32_t* u32;
  uint16_t* u16;
  uint8_t* u8;
};

std::vector<JsonField> json_fields(Options& o) {
  return {{"req_depth", &o.req_depth, nullptr, nullptr},
          {"req_size", &o.req_size, nullptr, nullptr},
          {"ack_size", &o.ack_size, nullptr, nullptr},
          {"rdma_size", &o.rdma_size, nullptr, nullptr},
          {"send_addr", &o.send_addr, nullptr, nullptr},
          {"receive_addr", &o.receive_addr, nullptr, nullptr},
          {"starting_port", nullptr, &o.starting_port, nullptr},
          {"nr_tasks", nullptr, &o.nr_tasks, nullptr},
          {"run_time", &o.run_time, nullptr, nullptr},
          {"summary_only", nullptr, nullptr, &o.summary_only},
          {"rtprio", nullptr, nullptr, &o.rtprio},
          {"tracing", nullptr, nullptr, &o.tracing},
          {"verify", nullptr, nullptr, &o.verify},
          {"show_params", nullptr, nullptr, &o.show_params},
          {"show_perfdata", nullptr, nullptr, &o.show_perfdata},
          {"use_cong_monitor", nullptr, nullptr, &o.use_cong_monitor},
          {"rdma_use_once", nullptr, nullptr, &o.rdma_use_once},
          {"rdma_use_get_mr", nullptr, nullptr, &o.rdma_use_get_mr},
          {"rdma_use_fence", nullptr, nullptr, &o.rdma_use_fence},
          {"rdma_cache_mrs", nullptr, nullptr, &o.rdma_cache_mrs},
          {"rdma_key_o_meter", nullptr, nullptr, &o.rdma_key_o_meter},
          {"suppress_warnings", nullptr, nullptr, &o.suppress_warnings},
          {"simplex", nullptr, nullptr, &o.simplex},
          {"rw_mode", nullptr, nullptr, &o.rw_mode},
          {"rdma_vector", &o.rdma_vector, nullptr, nullptr},
          {"rdma_alignment", &o.rdma_alignment, nullptr, nullptr},
          {"connect_retries", &o.connect_retries, nullptr, nullptr},
          {"tos", nullptr, nullptr, &o.tos},
          {"async", nullptr, nullptr, &o.async}};
}

std::string to_json(Options o) {
  std::string s =
      "{\n  \"version\": \"" + std::string(o.version, strnlen(o.version, kVersionLen)) + "\"";
  for (const JsonField& f : json_fields(o)) {
    const unsigned long v = f.u32 ? *f.u32 : f.u16 ? *f.u16 : *f.u8;
    s += ",\n  \"" + std::string(f.name) + "\": " + std::to_string(v);
  }
  // IPv4 only; the 2.3.x names we do not use, so that its check finds them all.
  s += ",\n  \"send_addr6\": \"::\",\n  \"receive_addr6\": \"::\",\n  \"addr_scope_id \": 0";
  s += ",\n  \"disable_inq\": 0,\n  \"always_bursty\": 0,\n  \"sync_always_bursty\": 0\n}";
  return s;
}

void json_send(int fd, const std::string& j) {
  const int32_t len = static_cast<int32_t>(j.size());  // native order, as rds-tools sends it
  write_all(fd, &len, sizeof len);
  write_all(fd, j.data(), j.size());
}

std::string json_recv(int fd) {
  int32_t len;
  read_all(fd, &len, sizeof len);
  if (len < 0 || len > (1 << 20)) die("control connection: JSON options of %d bytes", len);
  std::string j(static_cast<size_t>(len), '\0');
  read_all(fd, j.data(), j.size());
  return j;
}

void apply_json(const std::string& text, Options& o) {
  auto kv = parse_json_object(text);
  for (const JsonField& f : json_fields(o)) {
    auto it = kv.find(f.name);
    if (it == kv.end() || it->second.is_string) continue;
    if (f.u32) *f.u32 = static_cast<uint32_t>(it->second.n);
    if (f.u16) *f.u16 = static_cast<uint16_t>(it->second.n);
    if (f.u8) *f.u8 = static_cast<uint8_t>(it->second.n);
  }
  for (const char* k : {"always_bursty", "sync_always_bursty"})
    if (kv.count(k) && kv[k].n) std::printf("note: peer's %s does not change our tasks\n", k);
}

void check_supported(const Options& o) {
  if (o.async) die("--async (UEK asynchronous sends) is not supported");
  if (o.tos) die("-Q (type of service) is not supported");
  if (o.req_depth < 1 || o.nr_tasks < 1) die("depth and tasks must be at least 1");
  if (o.req_size < kHeaderSize || o.ack_size < kHeaderSize)
    die("request and ack sizes must be at least %zu bytes", kHeaderSize);
  if (o.rdma_vector < 1 || o.rdma_vector > kMaxIov) die("-I must be 1..%u", kMaxIov);
  if (o.rdma_alignment > 4096) die("--rdma-alignment must be at most 4096");
  if (o.rdma_cache_mrs && (o.rdma_use_once || !o.rdma_use_get_mr))
    die("--rdma-cache-mrs needs --rdma-use-get-mr 1 and --rdma-use-once 0");
}

// ---- parent ------------------------------------------------------------------------------

struct Children {
  TaskCtl* ctl = nullptr;
  std::vector<pid_t> pids;
};

Children start_children(const Options& o, bool active, int control_fd) {
  Children c;
  const size_t len = sizeof(TaskCtl) * o.nr_tasks;
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) DIE_ERRNO("mmap");
  c.ctl = new (m) TaskCtl[o.nr_tasks]();
  std::fflush(stdout);
  const pid_t parent = getpid();
  for (uint32_t i = 0; i < o.nr_tasks; ++i) {
    const pid_t pid = fork();
    if (pid < 0) DIE_ERRNO("fork");
    if (pid == 0) {
      close(control_fd);
      Task t(o, i, c.ctl + i, active);
      t.run(parent);
    }
    c.pids.push_back(pid);
  }
  const uint64_t deadline = now_ns() + 30000000000ull;
  for (uint32_t i = 0; i < o.nr_tasks; ++i)
    while (!c.ctl[i].ready.load()) {
      int st;
      const pid_t p = waitpid(-1, &st, WNOHANG);
      if (p > 0) die("task process %d exited before it was ready", p);
      if (now_ns() > deadline) die("task %u not ready after 30 s", i);
      usleep(10000);
    }
  return c;
}

void print_line(uint32_t tasks, const uint64_t* d, double secs, bool average) {
  auto avg = [](uint64_t sum, uint64_t n) { return n ? sum / 1000.0 / n : 0.0; };
  std::printf("%4u %6llu %6llu %10.2f %10.2f %10.2f %7.2f %8.2f %5.2f%s\n", tasks,
              static_cast<unsigned long long>(d[S_REQ_TX] / secs + 0.5),
              static_cast<unsigned long long>(d[S_REQ_RX] / secs + 0.5), d[S_BYTES] / secs / 1024.0,
              d[S_MBI] / secs / 1024.0, d[S_MBO] / secs / 1024.0, avg(d[S_TX_NS], d[S_TX_CALLS]),
              avg(d[S_RTT_NS], d[S_RTT_N]), -1.0, average ? "  (average)" : "");
  std::fflush(stdout);
}

int finish(const Options& o, bool active, int control_fd, Children& c) {
  std::printf("negotiated options, tasks will start in 2 seconds\n");
  const uint64_t start = now_ns() + 2000000000ull;
  for (uint32_t i = 0; i < o.nr_tasks; ++i) c.ctl[i].start_ns.store(start);
  auto snapshot = [&](uint64_t* d) {
    for (int s = 0; s < S_COUNT; ++s) d[s] = 0;
    for (uint32_t i = 0; i < o.nr_tasks; ++i)
      for (int s = 0; s < S_COUNT; ++s) d[s] += c.ctl[i].stat[s].load();
  };
  // 2 s for the tasks to start, 2 s of burn-in (connection set-up, first MRs) unmeasured.
  std::printf("Starting up");
  std::fflush(stdout);
  for (int i = 0; i < 4; ++i) {
    usleep(1000000);
    std::printf(".");
    std::fflush(stdout);
  }
  std::printf("\n");
  if (!o.summary_only)
    std::printf("%4s %6s %6s %10s %10s %10s %7s %8s %5s\n", "tsks", "tx/s", "rx/s", "tx+rx K/s",
                "mbi K/s", "mbo K/s", "tx us/c", "rtt us", "cpu %");
  uint64_t first[S_COUNT], last[S_COUNT], cur[S_COUNT], d[S_COUNT];
  snapshot(first);
  std::copy(first, first + S_COUNT, last);
  const uint64_t t_first = now_ns();
  uint64_t t_last = t_first;
  size_t running = c.pids.size();
  bool child_failed = false;
  auto reap = [&](int flags) {
    int st;
    pid_t p;
    while (running && (p = waitpid(-1, &st, flags)) > 0) {
      for (pid_t& k : c.pids)
        if (k == p) {
          k = -1;
          --running;
          const bool ok = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
                          (WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
          if (!ok) {
            child_failed = true;
            std::fprintf(stderr, "rds-stress: task process %d failed (status 0x%x)\n", p, st);
          }
        }
    }
  };
  uint64_t next_tick = t_first + 1000000000ull;
  bool peer_closed = false;
  for (;;) {
    // Sleep to the next tick; the passive side also stops when the active closes.
    for (;;) {
      const uint64_t t = now_ns();
      if (t >= next_tick) break;
      pollfd pf{control_fd, POLLIN, 0};
      const int ms = static_cast<int>((next_tick - t) / 1000000 + 1);
      if (!active && poll(&pf, 1, ms) > 0) {
        peer_closed = true;
        break;
      }
      if (active) usleep(static_cast<useconds_t>(ms) * 1000);
    }
    if (peer_closed) break;
    next_tick += 1000000000ull;
    snapshot(cur);
    const uint64_t t = now_ns();
    for (int s = 0; s < S_COUNT; ++s) d[s] = cur[s] - last[s];
    if (!o.summary_only) print_line(static_cast<uint32_t>(running), d, (t - t_last) / 1e9, false);
    std::copy(cur, cur + S_COUNT, last);
    t_last = t;
    reap(WNOHANG);
    if (running < c.pids.size() || child_failed) break;
    if (active && o.run_time && t - t_first >= static_cast<uint64_t>(o.run_time) * 1000000000ull)
      break;
  }
  close(control_fd);
  // Let the tasks answer what is in flight, then end them.
  for (uint32_t i = 0; i < o.nr_tasks; ++i) c.ctl[i].stopping.store(1);
  usleep(1000000);
  for (pid_t k : c.pids)
    if (k > 0) kill(k, SIGTERM);
  const uint64_t kill_at = now_ns() + 5000000000ull;
  while (running && now_ns() < kill_at) {
    reap(WNOHANG);
    usleep(10000);
  }
  for (pid_t k : c.pids)
    if (k > 0) kill(k, SIGKILL);
  reap(0);
  if (!o.summary_only) std::printf("---------------------------------------------\n");
  for (int s = 0; s < S_COUNT; ++s) d[s] = last[s] - first[s];
  const double secs = t_last > t_first ? (t_last - t_first) / 1e9 : 1.0;
  print_line(o.nr_tasks, d, secs, true);
  int rc = 0;
  if (child_failed) rc = 1;
  // Failures are counted over the whole run: the rates above are between samples, but an
  // RDMA that failed before the first or after the last failed all the same.
  snapshot(cur);
  if (cur[S_ERRORS]) {
    std::fprintf(stderr, "rds-stress: %llu RDMA operations failed\n",
                 static_cast<unsigned long long>(cur[S_ERRORS]));
    rc = 1;
  }
  if (d[S_REQ_TX] + d[S_REQ_RX] == 0) {
    std::fprintf(stderr, "rds-stress: no requests were exchanged\n");
    rc = 1;
  }
  return rc;
}

int active_parent(Options o, std::string control) {
  int fd = -1;
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(o.starting_port);
  peer.sin_addr.s_addr = htonl(o.send_addr);
  std::printf("connecting to %s:%u\n", inet_ntoa(peer.sin_addr), o.starting_port);
  std::fflush(stdout);
  // Retry a refused connect for up to 10 s (or --connect-retries seconds).
  const uint32_t tries = std::max<uint32_t>(o.connect_retries, 10) * 10;
  for (uint32_t i = 0;; ++i) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in me{};
    me.sin_family = AF_INET;
    me.sin_addr.s_addr = htonl(o.receive_addr);
    if (o.receive_addr && bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me) < 0)
      DIE_ERRNO("bind control socket to %s", inet_ntoa(me.sin_addr));
    if (connect(fd, reinterpret_cast<sockaddr*>(&peer), sizeof peer) == 0) break;
    if ((errno != ECONNREFUSED && errno != EHOSTUNREACH && errno != ENETUNREACH) || i >= tries)
      DIE_ERRNO("connect to %s:%u", inet_ntoa(peer.sin_addr), o.starting_port);
    close(fd);
    usleep(100000);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!o.receive_addr) {
    sockaddr_in me{};
    socklen_t l = sizeof me;
    getsockname(fd, reinterpret_cast<sockaddr*>(&me), &l);
    o.receive_addr = ntohl(me.sin_addr.s_addr);
  }
  if (o.show_params) {
    std::printf("Options:\n  Tasks      %u\n  Req size   %u\n  ACK size   %u\n  RDMA size  %u\n",
                o.nr_tasks, o.req_size, o.ack_size, o.rdma_size);
    std::printf("  RDMA opts %s%s%s%s\n\n", o.rdma_use_once ? " use_once" : "",
                o.rdma_use_get_mr ? " use_get_mr" : "", o.rdma_use_fence ? " use_fence" : "",
                o.rdma_cache_mrs ? " cache_mrs" : "");
  }
  const size_t colon = control.find(':');
  const std::string version =
      colon == std::string::npos ? kDefaultPeerVersion : control.substr(colon + 1);
  control = control.substr(0, colon);
  if (version.size() > 8) die("--control: version string too long");
  std::strncpy(o.version, version.c_str(), kVersionLen - 1);
  const bool json = control == "json";
  if (json) set_json_flag(o.version);
  uint8_t block[kOptionsV2Size];
  if (control == "v1") {
    encode_v1(o, block);
    write_all(fd, block, kOptionsV1Size);
  } else {
    encode_v2(o, block);
    write_all(fd, block, kOptionsV2Size);
  }
  Children c;
  if (!json) c = start_children(o, true, fd);
  uint8_t ok = 0;
  write_all(fd, &ok, 1);
  read_all(fd, &ok, 1);
  if (json) {
    if (ok != kJsonIdentifier) die("the passive side does not exchange JSON options");
    json_send(fd, to_json(o));
    (void)json_recv(fd);  // the passive's view; nothing in it changes ours
    c = start_children(o, true, fd);
    write_all(fd, &ok, 1);
    read_all(fd, &ok, 1);
  }
  return finish(o, true, fd, c);
}

int passive_parent(uint32_t addr, uint16_t port) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(addr);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 || listen(lfd, 1) < 0)
    DIE_ERRNO("listen on %s:%u", inet_ntoa(a.sin_addr), port);
  std::printf("waiting for incoming connection on %s:%u\n", inet_ntoa(a.sin_addr), port);
  std::fflush(stdout);
  sockaddr_in from{};
  socklen_t fl = sizeof from;
  const int fd = accept(lfd, reinterpret_cast<sockaddr*>(&from), &fl);
  if (fd < 0) DIE_ERRNO("accept");
  close(lfd);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in me{};
  socklen_t ml = sizeof me;
  getsockname(fd, reinterpret_cast<sockaddr*>(&me), &ml);
  std::printf("accepted connection from %s:%u", inet_ntoa(from.sin_addr), ntohs(from.sin_port));
  std::printf(" on %s:%u\n", inet_ntoa(me.sin_addr), ntohs(me.sin_port));

  uint8_t block[kOptionsV2Size];
  read_all(fd, block, kVersionLen);
  Options o;
  bool json = false;
  if (looks_like_version(block)) {
    read_all(fd, block + kVersionLen, kOptionsV2Size - kVersionLen);
    std::memcpy(o.version, block, kVersionLen);
    decode_v1(block + kVersionLen, o);
    o.tos = block[kVersionLen + kOptionsV1Size];
    o.async = block[kVersionLen + kOptionsV1Size + 1];
    json = version_has_json_flag(o.version);
  } else {
    read_all(fd, block + kVersionLen, kOptionsV1Size - kVersionLen);
    decode_v1(block, o);
  }
  // Their receive address is our send address; ours is where they reached us.
  auto swap_addrs = [&](Options& x) {
    x.send_addr = x.receive_addr;
    x.receive_addr = ntohl(me.sin_addr.s_addr);
  };
  swap_addrs(o);
  o.starting_port = port;
  check_supported(o);
  Children c;
  uint8_t ok;
  if (!json) {
    c = start_children(o, false, fd);
    read_all(fd, &ok, 1);
    write_all(fd, &ok, 1);
  } else {
    read_all(fd, &ok, 1);
    ok = kJsonIdentifier;
    write_all(fd, &ok, 1);
    apply_json(json_recv(fd), o);
    swap_addrs(o);
    o.starting_port = port;
    check_supported(o);
    json_send(fd, to_json(o));
    c = start_children(o, false, fd);
    read_all(fd, &ok, 1);
    write_all(fd, &ok, 1);
  }
  return finish(o, false, fd, c);
}

uint64_t parse_size(const char* s, uint64_t max) {
  char* end;
  uint64_t v = std::strtoull(s, &end, 0);
  switch (*end) {
    case 'k':
    case 'K':
      v <<= 10;
      ++end;
      break;
    case 'm':
    case 'M':
      v <<= 20;
      ++end;
      break;
    case 'g':
    case 'G':
      v <<= 30;
      ++end;
      break;
  }
  if (!*s || *end || v > max) die("invalid number '%s'", s);
  return v;
}

uint32_t parse_addr(const char* s) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* ai = nullptr;
  if (getaddrinfo(s, nullptr, &hints, &ai) != 0 || !ai) die("invalid IPv4 address '%s'", s);
  const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr.s_addr);
  freeaddrinfo(ai);
  return a;
}

[[noreturn]] void usage(FILE* to = stderr, int rc = 2) {
  std::fprintf(
      to,
      "usage: rds-stress [-r addr] [-p port]                      (passive)\n"
      "       rds-stress -s addr [-r addr] [-p port] [-q bytes] [-a bytes] [-d depth]\n"
      "                  [-t tasks] [-T secs] [-D bytes] [-I bufs] [-M 0|1|2] [-o] [-v]\n"
      "                  [-z] [--rdma-use-once 0|1] [--rdma-use-get-mr 0|1]\n"
      "                  [--rdma-use-fence 0|1] [--rdma-cache-mrs 0|1]\n"
      "                  [--rdma-alignment n] [--use-cong-monitor 0|1]\n"
      "                  [--connect-retries n] [--show-params] [--control v1|v2|json[:VER]]\n"
      "       rds-stress -h|--help\n");
  std::exit(rc);
}

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  Options o;
  bool have_send = false;
  std::string control = "v1";
  enum {
    OPT_USE_ONCE = 256,
    OPT_GET_MR,
    OPT_FENCE,
    OPT_CACHE,
    OPT_ALIGN,
    OPT_CONG,
    OPT_RETRIES,
    OPT_PARAMS,
    OPT_CONTROL
  };
  static const option longopts[] = {{"recv-addr", required_argument, nullptr, 'r'},
                                    {"port", required_argument, nullptr, 'p'},
                                    {"send-addr", required_argument, nullptr, 's'},
                                    {"ack-bytes", required_argument, nullptr, 'a'},
                                    {"req-bytes", required_argument, nullptr, 'q'},
                                    {"one-way", no_argument, nullptr, 'o'},
                                    {"depth", required_argument, nullptr, 'd'},
                                    {"tasks", required_argument, nullptr, 't'},
                                    {"time", required_argument, nullptr, 'T'},
                                    {"rdma-bytes", required_argument, nullptr, 'D'},
                                    {"rdma-buffers", required_argument, nullptr, 'I'},
                                    {"rdma-mode", required_argument, nullptr, 'M'},
                                    {"verify", no_argument, nullptr, 'v'},
                                    {"trace", no_argument, nullptr, 'V'},
                                    {"report-summary", no_argument, nullptr, 'z'},
                                    {"rdma-use-once", required_argument, nullptr, OPT_USE_ONCE},
                                    {"rdma-use-get-mr", required_argument, nullptr, OPT_GET_MR},
                                    {"rdma-use-fence", required_argument, nullptr, OPT_FENCE},
                                    {"rdma-cache-mrs", required_argument, nullptr, OPT_CACHE},
                                    {"rdma-alignment", required_argument, nullptr, OPT_ALIGN},
                                    {"use-cong-monitor", required_argument, nullptr, OPT_CONG},
                                    {"connect-retries", required_argument, nullptr, OPT_RETRIES},
                                    {"show-params", no_argument, nullptr, OPT_PARAMS},
                                    {"control", required_argument, nullptr, OPT_CONTROL},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "+r:p:s:a:q:od:t:T:D:I:M:vVzh", longopts, nullptr)) != -1) {
    switch (c) {
      case 'r':
        o.receive_addr = parse_addr(optarg);
        break;
      case 's':
        o.send_addr = parse_addr(optarg);
        have_send = true;
        break;
      case 'p':
        o.starting_port = static_cast<uint16_t>(parse_size(optarg, 65535));
        break;
      case 'a':
        o.ack_size = static_cast<uint32_t>(parse_size(optarg, UINT32_MAX));
        break;
      case 'q':
        o.req_size = static_cast<uint32_t>(parse_size(optarg, UINT32_MAX));
        break;
      case 'o':
        o.simplex = 1;
        break;
      case 'd':
        o.req_depth = static_cast<uint32_t>(parse_size(optarg, 65535));
        break;
      case 't':
        o.nr_tasks = static_cast<uint16_t>(parse_size(optarg, 256));
        break;
      case 'T':
        o.run_time = static_cast<uint32_t>(parse_size(optarg, UINT32_MAX));
        break;
      case 'D':
        o.rdma_size = static_cast<uint32_t>(parse_size(optarg, UINT32_MAX));
        break;
      case 'I':
        o.rdma_vector = static_cast<uint32_t>(parse_size(optarg, kMaxIov));
        break;
      case 'M':
        o.rw_mode = static_cast<uint8_t>(parse_size(optarg, 2));
        break;
      case 'v':
        o.verify = 1;
        break;
      case 'V':
        o.tracing = 1;
        break;
      case 'z':
        o.summary_only = 1;
        break;
      case OPT_USE_ONCE:
        o.rdma_use_once = static_cast<uint8_t>(parse_size(optarg, 1));
        break;
      case OPT_GET_MR:
        o.rdma_use_get_mr = static_cast<uint8_t>(parse_size(optarg, 1));
        break;
      case OPT_FENCE:
        o.rdma_use_fence = static_cast<uint8_t>(parse_size(optarg, 1));
        break;
      case OPT_CACHE:
        o.rdma_cache_mrs = static_cast<uint8_t>(parse_size(optarg, 1));
        break;
      case OPT_ALIGN:
        o.rdma_alignment = static_cast<uint32_t>(parse_size(optarg, 4096));
        break;
      case OPT_CONG:
        o.use_cong_monitor = static_cast<uint8_t>(parse_size(optarg, 1));
        break;
      case OPT_RETRIES:
        o.connect_retries = static_cast<uint32_t>(parse_size(optarg, UINT32_MAX));
        break;
      case OPT_PARAMS:
        o.show_params = 1;
        break;
      case 'h':
        usage(stdout, 0);
      case OPT_CONTROL:
        control = optarg;
        if (control != "v1" && control.rfind("v2", 0) != 0 && control.rfind("json", 0) != 0)
          usage();
        break;
      default:
        usage();
    }
  }
  if (optind != argc) usage();
  signal(SIGPIPE, SIG_IGN);
  if (!have_send) return passive_parent(o.receive_addr, o.starting_port);
  if (!o.ack_size) o.ack_size = kHeaderSize;
  check_supported(o);
  return active_parent(o, control);
}
