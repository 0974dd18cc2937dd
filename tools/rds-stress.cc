// rds-stress: the rds-tools load generator, for softverbs RDS.
//   passive: rds-stress [-r addr] [-p port]          active: rds-stress -s addr [-r addr] ...
// Options: -q req-bytes (1024), -a ack-bytes, -d depth (1), -t tasks (1), -T seconds,
// -D rdma-bytes, -M 0|1|2 (alternate|read|write), -I rdma-buffers, -v (verify data),
// -o (one-way), --rdma-use-get-mr, --rdma-use-once.
// As in rds-tools: the active side sends its options over TCP; each side forks -t task
// processes; task i binds RDS port (port+1+i) and sends requests to every remote task,
// keeping -d outstanding per peer; a request is answered by an ack which, with -D,
// performs the RDMA (RDS_CMSG_RDMA_ARGS, NOTIFY_ME, FENCE for reads) on the cookie the
// request carried. Each second the parent prints
//   tsks   tx/s   rx/s  tx+rx K/s    mbi K/s    mbo K/s tx us/c   rtt us cpu %
// Written against <linux/rds.h> and the socket API; linked with the softverbs shim.
#include <arpa/inet.h>
#include <getopt.h>
#include <linux/rds.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

struct Options {
  uint32_t req_size = 1024, ack_size = 0, depth = 1, tasks = 1, seconds = 0;
  uint32_t rdma_size = 0, rdma_mode = 0, rdma_bufs = 1;
  uint8_t verify = 0, one_way = 0, use_get_mr = 0, use_once = 0;
  uint32_t send_addr = 0, recv_addr = 0;  // network order
  uint16_t port = 4000;
} __attribute__((packed));

enum : uint8_t { OP_REQ = 1, OP_ACK = 2 };
enum : uint8_t { RDMA_READ = 1, RDMA_WRITE = 2 };

// rds-stress message header (rds-tools), packed.
struct Header {
  uint32_t seq;
  uint32_t from_addr, to_addr;
  uint16_t from_port, to_port;
  uint16_t index;
  uint8_t op;
  uint8_t rdma_op;
  uint64_t rdma_addr, rdma_phyaddr, rdma_pattern, rdma_key;
  uint32_t rdma_size, rdma_vector;
  uint8_t retry, rdma_remote_err, pending;
} __attribute__((packed));

struct Stats {  // per second, sent from a task to the parent
  uint64_t tx = 0, rx = 0, tx_bytes = 0, rx_bytes = 0, mbi = 0, mbo = 0;
  uint64_t tx_ns = 0, tx_calls = 0, rtt_ns = 0, rtt_n = 0;
  uint32_t errors = 0;
};

volatile sig_atomic_t g_stop = 0;
void on_alarm(int) {
  g_stop = 1;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

uint8_t pattern(uint64_t seed, size_t i) {
  return static_cast<uint8_t>(seed * 131 + i * 7);
}

struct Peer {
  sockaddr_in addr{};
  uint32_t next_seq = 0, expect_seq = 0, outstanding = 0;
  std::map<uint32_t, uint64_t> sent_at;  // seq -> send time
  std::map<uint32_t, std::vector<char>> rdma_bufs;
  std::map<uint32_t, uint64_t> cookies;
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "rds-stress: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

// One task: an RDS socket talking to every remote task.
void run_task(const Options& o, uint32_t index, uint32_t local_addr, uint32_t remote_addr,
              int stats_fd) {
  int fd = socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd < 0) die("socket");
  sockaddr_in me{};
  me.sin_family = AF_INET;
  me.sin_addr.s_addr = local_addr;
  me.sin_port = htons(static_cast<uint16_t>(o.port + 1 + index));
  if (bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me) < 0) die("bind");
  int buf = static_cast<int>(o.tasks * o.depth * (o.req_size + o.ack_size + 256) * 2 + (1 << 20));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  int one = 1;
  setsockopt(fd, SOL_RDS, RDS_CONG_MONITOR, &one, sizeof one);
  std::vector<Peer> peers(o.tasks);
  for (uint32_t i = 0; i < o.tasks; ++i) {
    peers[i].addr.sin_family = AF_INET;
    peers[i].addr.sin_addr.s_addr = remote_addr;
    peers[i].addr.sin_port = htons(static_cast<uint16_t>(o.port + 1 + i));
  }
  const size_t req_len = std::max<size_t>(o.req_size, sizeof(Header));
  const size_t ack_len = std::max<size_t>(o.ack_size, sizeof(Header));
  std::vector<char> msg(std::max(req_len, ack_len)), in(std::max(req_len, ack_len) + 64);
  // READ sinks stay ours until the op's notification says the data is there.
  struct PendingRead {
    std::vector<char> buf;
    uint64_t pattern;
    bool is_read;
  };
  std::map<uint64_t, PendingRead> reads;
  // RDMA buffers are recycled: a fresh 1 MiB per op would cost page faults, not RDS work.
  std::vector<std::vector<char>> pool;
  auto take = [&pool](size_t n) {
    std::vector<char> b;
    if (!pool.empty()) {
      b = std::move(pool.back());
      pool.pop_back();
    }
    b.resize(n);
    return b;
  };
  auto give = [&pool](std::vector<char>&& b) {
    if (pool.size() < 64) pool.push_back(std::move(b));
  };
  Stats st;
  uint64_t last_report = now_ns();
  sleep(2);  // give every task on both sides time to bind (rds-tools: "Starting up")
  // At the deadline a task stops issuing requests but keeps answering for up to a second,
  // so neither side leaves while the other's RDMA into its memory is in flight.
  bool stopping = false;
  uint64_t stop_at = 0;
  for (;;) {
    if (g_stop && !stopping) {
      stopping = true;
      stop_at = now_ns();
    }
    if (stopping) {
      uint32_t out = 0;
      for (const Peer& p : peers) out += p.outstanding;
      if ((out == 0 && reads.empty()) || now_ns() - stop_at > 1000000000ull) break;
    }
    // Send requests, keeping `depth` outstanding per peer.
    for (uint32_t pi = 0; pi < o.tasks && !stopping; ++pi) {
      Peer& p = peers[pi];
      while (p.outstanding < o.depth && !g_stop) {
        Header h{};
        h.seq = p.next_seq;
        h.from_addr = local_addr;
        h.to_addr = remote_addr;
        h.from_port = me.sin_port;
        h.to_port = p.addr.sin_port;
        h.index = static_cast<uint16_t>(index);
        h.op = OP_REQ;
        char ctl[CMSG_SPACE(sizeof(rds_get_mr_args))] = {};
        msghdr m{};
        iovec v{msg.data(), req_len};
        m.msg_name = &p.addr;
        m.msg_namelen = sizeof p.addr;
        m.msg_iov = &v;
        m.msg_iovlen = 1;
        uint64_t cookie = 0;
        auto& rbuf = p.rdma_bufs[h.seq];
        if (o.rdma_size && h.seq >= 10) {
          h.rdma_op = o.rdma_mode == 1   ? RDMA_READ
                      : o.rdma_mode == 2 ? RDMA_WRITE
                                         : (h.seq % 2 ? RDMA_WRITE : RDMA_READ);
          h.rdma_size = o.rdma_size;
          h.rdma_pattern = (static_cast<uint64_t>(index) << 32) | h.seq;
          rbuf = take(o.rdma_size);
          // With -v the peer's WRITE must replace zeros, and its READ must find our pattern.
          if (o.verify && h.rdma_op == RDMA_WRITE) std::fill(rbuf.begin(), rbuf.end(), 0);
          if (o.verify && h.rdma_op == RDMA_READ)
            for (size_t i = 0; i < rbuf.size(); ++i)
              rbuf[i] = static_cast<char>(pattern(h.rdma_pattern, i));
          rds_get_mr_args g{{reinterpret_cast<uint64_t>(rbuf.data()), rbuf.size()},
                            reinterpret_cast<uint64_t>(&cookie),
                            o.use_once ? static_cast<uint64_t>(RDS_RDMA_USE_ONCE) : 0};
          if (o.use_get_mr) {
            // RDS_GET_MR, then the cookie travels with RDS_CMSG_RDMA_DEST.
            if (setsockopt(fd, SOL_RDS, RDS_GET_MR, &g, sizeof g) < 0) die("RDS_GET_MR");
            m.msg_control = ctl;
            m.msg_controllen = CMSG_SPACE(sizeof cookie);
            cmsghdr* cm = CMSG_FIRSTHDR(&m);
            cm->cmsg_level = SOL_RDS;
            cm->cmsg_type = RDS_CMSG_RDMA_DEST;
            cm->cmsg_len = CMSG_LEN(sizeof cookie);
            std::memcpy(CMSG_DATA(cm), &cookie, sizeof cookie);
          } else {
            m.msg_control = ctl;
            m.msg_controllen = sizeof ctl;
            cmsghdr* cm = CMSG_FIRSTHDR(&m);
            cm->cmsg_level = SOL_RDS;
            cm->cmsg_type = RDS_CMSG_RDMA_MAP;
            cm->cmsg_len = CMSG_LEN(sizeof g);
            std::memcpy(CMSG_DATA(cm), &g, sizeof g);
          }
        }
        std::memcpy(msg.data(), &h, sizeof h);
        if (o.verify)
          for (size_t i = sizeof h; i < req_len; ++i) msg[i] = static_cast<char>(pattern(h.seq, i));
        const uint64_t t0 = now_ns();
        ssize_t r = sendmsg(fd, &m, MSG_DONTWAIT);
        st.tx_ns += now_ns() - t0;
        ++st.tx_calls;
        if (r < 0) {
          if (errno == EAGAIN || errno == ENOBUFS) {
            if (o.use_get_mr && cookie) {
              rds_free_mr_args f{cookie, 0};
              setsockopt(fd, SOL_RDS, RDS_FREE_MR, &f, sizeof f);
            }
            break;
          }
          die("sendmsg");
        }
        if (!o.use_get_mr && o.rdma_size && h.seq >= 10) p.cookies[h.seq] = cookie;
        if (o.use_get_mr && cookie) p.cookies[h.seq] = cookie;
        p.sent_at[h.seq] = now_ns();
        ++p.next_seq;
        ++p.outstanding;
        ++st.tx;
        st.tx_bytes += req_len;
        if (o.one_way) --p.outstanding;
      }
    }
    pollfd pf{fd, POLLIN, 0};
    poll(&pf, 1, 10);
    // Receive requests (answer them) and acks (retire the request).
    for (int burst = 0; burst < 256; ++burst) {
      char ctl[256];
      sockaddr_in from{};
      iovec v{in.data(), in.size()};
      msghdr m{};
      m.msg_name = &from;
      m.msg_namelen = sizeof from;
      m.msg_iov = &v;
      m.msg_iovlen = 1;
      m.msg_control = ctl;
      m.msg_controllen = sizeof ctl;
      ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT);
      if (n < 0) break;
      if (n == 0 && m.msg_controllen) {  // notifications / congestion updates
        for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
          if (cm->cmsg_type == RDS_CMSG_RDMA_STATUS) {
            rds_rdma_notify note;
            std::memcpy(&note, CMSG_DATA(cm), sizeof note);
            if (note.status != RDS_RDMA_SUCCESS) ++st.errors;
            // The op is over: its local buffer is ours again. A READ sink is checked here.
            auto r = reads.find(note.user_token);
            if (r == reads.end()) continue;
            if (o.verify && r->second.is_read && note.status == RDS_RDMA_SUCCESS)
              for (size_t i = 0; i < r->second.buf.size(); ++i)
                if (static_cast<uint8_t>(r->second.buf[i]) != pattern(r->second.pattern, i)) {
                  std::fprintf(stderr, "rds-stress: RDMA READ data mismatch at byte %zu\n", i);
                  std::exit(3);
                }
            give(std::move(r->second.buf));
            reads.erase(r);
          }
        }
        continue;
      }
      if (static_cast<size_t>(n) < sizeof(Header)) continue;
      Header h;
      std::memcpy(&h, in.data(), sizeof h);
      const uint32_t peer_idx = ntohs(from.sin_port) - o.port - 1;
      if (peer_idx >= o.tasks) continue;
      Peer& p = peers[peer_idx];
      st.rx_bytes += static_cast<uint64_t>(n);
      if (h.op == OP_REQ) {
        ++st.rx;
        if (h.seq != p.expect_seq) {
          std::fprintf(stderr, "rds-stress: task %u: request seq %u from task %u, expected %u\n",
                       index, h.seq, peer_idx, p.expect_seq);
          std::exit(3);
        }
        ++p.expect_seq;
        if (o.verify)
          for (size_t i = sizeof h; i < static_cast<size_t>(n); ++i)
            if (static_cast<uint8_t>(in[i]) != pattern(h.seq, i)) {
              std::fprintf(stderr, "rds-stress: payload mismatch seq %u byte %zu\n", h.seq, i);
              std::exit(3);
            }
        if (o.one_way) continue;
        Header a = h;
        a.op = OP_ACK;
        a.from_addr = h.to_addr;
        a.to_addr = h.from_addr;
        a.from_port = h.to_port;
        a.to_port = h.from_port;
        std::memcpy(msg.data(), &a, sizeof a);
        iovec av{msg.data(), ack_len};
        msghdr am{};
        am.msg_name = &from;
        am.msg_namelen = sizeof from;
        am.msg_iov = &av;
        am.msg_iovlen = 1;
        char actl[CMSG_SPACE(sizeof(rds_rdma_args))] = {};
        std::vector<rds_iovec> lv;
        uint64_t cookie = 0;
        if (h.rdma_op) {
          // The cookie came in-band (RDS_CMSG_RDMA_DEST) unless -get-mr put it... here
          // both ways deliver it as RDMA_DEST on the request.
          for (cmsghdr* cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
            if (cm->cmsg_level == SOL_RDS && cm->cmsg_type == RDS_CMSG_RDMA_DEST)
              std::memcpy(&cookie, CMSG_DATA(cm), sizeof cookie);
          // The local side of the op (WRITE source or READ sink) stays untouched until
          // the op's notification: RDS owns it while the RDMA is in flight (seed 000).
          const uint64_t token = (static_cast<uint64_t>(peer_idx) << 32) | h.seq;
          PendingRead& pr = reads[token];
          pr.buf = take(h.rdma_size);
          pr.pattern = h.rdma_op == RDMA_READ ? h.rdma_pattern : 0;
          pr.is_read = h.rdma_op == RDMA_READ;
          if (!pr.is_read && o.verify)
            for (size_t i = 0; i < h.rdma_size; ++i)
              pr.buf[i] = static_cast<char>(pattern(h.rdma_pattern, i));
          char* base = pr.buf.data();
          const uint32_t nb = std::max<uint32_t>(1, o.rdma_bufs);
          const size_t chunk = (h.rdma_size + nb - 1) / nb;
          for (size_t off = 0; off < h.rdma_size; off += chunk)
            lv.push_back({reinterpret_cast<uint64_t>(base + off),
                          std::min<uint64_t>(chunk, h.rdma_size - off)});
          rds_rdma_args ra{};
          ra.cookie = cookie;
          ra.remote_vec = {0, h.rdma_size};
          ra.local_vec_addr = reinterpret_cast<uint64_t>(lv.data());
          ra.nr_local = lv.size();
          ra.flags =
              RDS_RDMA_NOTIFY_ME | (h.rdma_op == RDMA_WRITE ? RDS_RDMA_READWRITE : RDS_RDMA_FENCE);
          ra.user_token = token;
          am.msg_control = actl;
          am.msg_controllen = sizeof actl;
          cmsghdr* cm = CMSG_FIRSTHDR(&am);
          cm->cmsg_level = SOL_RDS;
          cm->cmsg_type = RDS_CMSG_RDMA_ARGS;
          cm->cmsg_len = CMSG_LEN(sizeof ra);
          std::memcpy(CMSG_DATA(cm), &ra, sizeof ra);
        }
        while (sendmsg(fd, &am, 0) < 0) {
          if (errno != EAGAIN && errno != ENOBUFS) die("sendmsg ack");
          pollfd wp{fd, POLLOUT, 0};
          poll(&wp, 1, 10);
        }
        if (h.rdma_op == RDMA_WRITE) st.mbo += h.rdma_size;
        if (h.rdma_op == RDMA_READ) st.mbi += h.rdma_size;
        st.tx_bytes += ack_len;
      } else if (h.op == OP_ACK) {
        auto it = p.sent_at.find(h.seq);
        if (it != p.sent_at.end()) {
          st.rtt_ns += now_ns() - it->second;
          ++st.rtt_n;
          p.sent_at.erase(it);
        }
        if (p.outstanding) --p.outstanding;
        auto rb = p.rdma_bufs.find(h.seq);
        if (h.rdma_op == RDMA_WRITE) {
          st.mbi += h.rdma_size;
          if (o.verify && rb != p.rdma_bufs.end())
            for (size_t i = 0; i < h.rdma_size; ++i)
              if (static_cast<uint8_t>(rb->second[i]) != pattern(h.rdma_pattern, i)) {
                std::fprintf(stderr, "rds-stress: RDMA WRITE data mismatch seq %u\n", h.seq);
                std::exit(3);
              }
        } else if (h.rdma_op == RDMA_READ) {
          st.mbo += h.rdma_size;
        }
        auto ck = p.cookies.find(h.seq);
        if (ck != p.cookies.end()) {
          if (!o.use_once) {
            rds_free_mr_args f{ck->second, 0};
            setsockopt(fd, SOL_RDS, RDS_FREE_MR, &f, sizeof f);
          }
          p.cookies.erase(ck);
        }
        if (rb != p.rdma_bufs.end()) {
          give(std::move(rb->second));
          p.rdma_bufs.erase(rb);
        }
      }
    }
    if (now_ns() - last_report >= 1000000000ull) {
      if (write(stats_fd, &st, sizeof st) != sizeof st) break;
      st = Stats{};
      last_report = now_ns();
    }
  }
  if (write(stats_fd, &st, sizeof st) < 0) { /* parent gone */
  }
  close(fd);
  std::exit(0);
}

int tcp_control(const Options& o, bool active, Options& got) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(o.port);
  if (active) {
    a.sin_addr.s_addr = o.send_addr;
    for (int i = 0; connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0; ++i) {
      if (i > 50) die("connect to passive rds-stress");
      usleep(100000);
      close(s);
      s = socket(AF_INET, SOCK_STREAM, 0);
    }
    if (write(s, &o, sizeof o) != sizeof o) die("send options");
    got = o;
    return s;
  }
  a.sin_addr.s_addr = o.recv_addr;
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0 || listen(s, 1) < 0) die("listen");
  int c = accept(s, nullptr, nullptr);
  close(s);
  if (c < 0 || read(c, &got, sizeof got) != sizeof got) die("receive options");
  got.port = o.port;
  // Our view: we are their send address, they are their receive address.
  const uint32_t their_send = got.send_addr;
  got.send_addr = got.recv_addr;
  got.recv_addr = their_send;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.recv_addr = htonl(INADDR_LOOPBACK);
  static option longopts[] = {{"rdma-use-get-mr", required_argument, nullptr, 1},
                              {"rdma-use-once", required_argument, nullptr, 2},
                              {nullptr, 0, nullptr, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "r:p:s:a:q:d:t:T:D:M:I:vo", longopts, nullptr)) != -1) {
    switch (opt) {
      case 'r':
        inet_pton(AF_INET, optarg, &o.recv_addr);
        break;
      case 's':
        inet_pton(AF_INET, optarg, &o.send_addr);
        break;
      case 'p':
        o.port = static_cast<uint16_t>(std::atoi(optarg));
        break;
      case 'a':
        o.ack_size = static_cast<uint32_t>(std::strtoul(optarg, nullptr, 0));
        break;
      case 'q':
        o.req_size = static_cast<uint32_t>(std::strtoul(optarg, nullptr, 0));
        break;
      case 'd':
        o.depth = static_cast<uint32_t>(std::atoi(optarg));
        break;
      case 't':
        o.tasks = static_cast<uint32_t>(std::atoi(optarg));
        break;
      case 'T':
        o.seconds = static_cast<uint32_t>(std::atoi(optarg));
        break;
      case 'D': {
        char* end;
        unsigned long v = std::strtoul(optarg, &end, 0);
        if (*end == 'K' || *end == 'k') v <<= 10;
        if (*end == 'M' || *end == 'm') v <<= 20;
        o.rdma_size = static_cast<uint32_t>(v);
        break;
      }
      case 'M':
        o.rdma_mode = static_cast<uint32_t>(std::atoi(optarg));
        break;
      case 'I':
        o.rdma_bufs = static_cast<uint32_t>(std::atoi(optarg));
        break;
      case 'v':
        o.verify = 1;
        break;
      case 'o':
        o.one_way = 1;
        break;
      case 1:
        o.use_get_mr = static_cast<uint8_t>(std::atoi(optarg));
        break;
      case 2:
        o.use_once = static_cast<uint8_t>(std::atoi(optarg));
        break;
      default:
        std::fprintf(stderr,
                     "usage: rds-stress [-r addr] [-s addr] [-p port] [-q bytes] "
                     "[-a bytes] [-d depth] [-t tasks] [-T secs] [-D bytes] [-M mode] "
                     "[-I bufs] [-v] [-o]\n");
        return 2;
    }
  }
  if (o.tasks < 1 || o.tasks > 64 || o.depth < 1 || o.rdma_size > (1u << 20) || o.rdma_bufs < 1 ||
      o.rdma_bufs > 16) {
    std::fprintf(stderr, "rds-stress: invalid option value\n");
    return 2;
  }
  const bool active = o.send_addr != 0;
  Options run;
  int ctl = tcp_control(o, active, run);
  const uint32_t local = active ? run.recv_addr : run.recv_addr;
  const uint32_t remote = active ? run.send_addr : run.send_addr;
  std::printf("%4s %6s %6s %10s %10s %10s %7s %8s %5s\n", "tsks", "tx/s", "rx/s", "tx+rx K/s",
              "mbi K/s", "mbo K/s", "tx us/c", "rtt us", "cpu %");
  std::fflush(stdout);
  std::vector<pid_t> kids;
  std::vector<int> pipes;
  for (uint32_t i = 0; i < run.tasks; ++i) {
    int p[2];
    if (pipe(p) < 0) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      close(p[0]);
      close(ctl);
      signal(SIGALRM, on_alarm);
      signal(SIGTERM, on_alarm);
      if (run.seconds) alarm(run.seconds + 2);
      run_task(run, i, local, remote, p[1]);
    }
    close(p[1]);
    kids.push_back(pid);
    pipes.push_back(p[0]);
  }
  Stats total;
  uint64_t secs = 0;
  int exit_code = 0;
  size_t alive = kids.size();
  while (alive) {
    Stats sum;
    alive = 0;
    for (int pfd : pipes) {
      if (pfd < 0) continue;
      pollfd pf{pfd, POLLIN, 0};
      if (poll(&pf, 1, 1500) <= 0) {
        ++alive;
        continue;
      }
      Stats s;
      if (read(pfd, &s, sizeof s) != sizeof s) continue;
      ++alive;
      sum.tx += s.tx;
      sum.rx += s.rx;
      sum.tx_bytes += s.tx_bytes;
      sum.rx_bytes += s.rx_bytes;
      sum.mbi += s.mbi;
      sum.mbo += s.mbo;
      sum.tx_ns += s.tx_ns;
      sum.tx_calls += s.tx_calls;
      sum.rtt_ns += s.rtt_ns;
      sum.rtt_n += s.rtt_n;
      sum.errors += s.errors;
    }
    int status;
    for (size_t i = 0; i < kids.size(); ++i)
      if (kids[i] > 0 && waitpid(kids[i], &status, WNOHANG) == kids[i]) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) exit_code = 1;
        kids[i] = -1;
        close(pipes[i]);
        pipes[i] = -1;
      }
    alive = 0;
    for (pid_t k : kids) alive += k > 0;
    if (!sum.tx && !sum.rx && !sum.tx_calls) continue;
    ++secs;
    total.tx += sum.tx;
    total.rx += sum.rx;
    total.tx_bytes += sum.tx_bytes;
    total.rx_bytes += sum.rx_bytes;
    total.mbi += sum.mbi;
    total.mbo += sum.mbo;
    total.tx_ns += sum.tx_ns;
    total.tx_calls += sum.tx_calls;
    total.rtt_ns += sum.rtt_ns;
    total.rtt_n += sum.rtt_n;
    total.errors += sum.errors;
    std::printf("%4zu %6lu %6lu %10.2f %10.2f %10.2f %7.2f %8.2f %5.2f\n", alive,
                static_cast<unsigned long>(sum.tx), static_cast<unsigned long>(sum.rx),
                (sum.tx_bytes + sum.rx_bytes) / 1024.0, sum.mbi / 1024.0, sum.mbo / 1024.0,
                sum.tx_calls ? sum.tx_ns / 1000.0 / sum.tx_calls : 0.0,
                sum.rtt_n ? sum.rtt_ns / 1000.0 / sum.rtt_n : 0.0, -1.0);
    std::fflush(stdout);
  }
  if (secs)
    std::printf(
        "%4u %6lu %6lu %10.2f %10.2f %10.2f %7.2f %8.2f %5.2f (average)\n", run.tasks,
        static_cast<unsigned long>(total.tx / secs), static_cast<unsigned long>(total.rx / secs),
        (total.tx_bytes + total.rx_bytes) / 1024.0 / secs, total.mbi / 1024.0 / secs,
        total.mbo / 1024.0 / secs, total.tx_calls ? total.tx_ns / 1000.0 / total.tx_calls : 0.0,
        total.rtt_n ? total.rtt_ns / 1000.0 / total.rtt_n : 0.0, -1.0);
  if (total.errors) {
    std::fprintf(stderr, "rds-stress: %u RDMA operations failed\n", total.errors);
    exit_code = 1;
  }
  if (!total.rx && !run.one_way) exit_code = 1;
  close(ctl);
  return exit_code;
}
