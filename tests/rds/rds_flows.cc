// rds_flows: exactly-once, in-order delivery check for RDS under loss and connection
// resets (the kernel selftest tools/testing/selftests/net/rds/test.py, reworked).
//   rds_flows --local IP --peer IP[,IP...] --port P --sockets N --messages M --seed S
//             [--timeout s] [--spread s]
// Each side binds N sockets (P..P+N-1 on its address) and sends M messages to each peer
// (in turn), each from a pseudo-random socket to a pseudo-random socket of that peer, with
// a pseudo-random size. Every message carries its flow's sequence number and a hash chain
// over the flow so far; the receiver recomputes both, so a lost, duplicated, reordered or
// corrupted message fails the run. Every side sends M to every other, so each knows when
// it has everything; it then listens two more seconds for anything extra. Exit 0 and
// "flows: ... OK" when all checks hold. --spread s paces the sends over s seconds, so a
// run that must see a fault schedule (tests/tools/rds_cluster.sh) cannot end before it on a
// fast machine, whatever M is.
#include <arpa/inet.h>
#include <getopt.h>
#include <poll.h>
#include <softverbs/rds.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

struct Hdr {
  uint32_t magic;
  uint16_t src_port, dst_port;
  uint64_t flow_seq;
  uint64_t chain;
  uint32_t len;
} __attribute__((packed));
constexpr uint32_t kMagic = 0x464c4f57;  // "FLOW"

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

uint8_t filler(uint64_t chain, size_t i) {
  return static_cast<uint8_t>(chain >> ((i % 8) * 8)) ^ static_cast<uint8_t>(i);
}

struct FlowState {
  uint64_t seq = 0;
  uint64_t chain = 0x1234;
};

}  // namespace

// Whether the stack still holds a message from one of our sockets (laddr, ports [port,
// port + nsock)), queued or not yet acked: RDS_INFO_SEND_MESSAGES and
// RDS_INFO_RETRANS_MESSAGES, as rds-info -s and -t list them. A list that cannot be read
// counts as holding one.
bool holds_own(int fd, in_addr_t laddr, int port, int nsock) {
  for (int opt : {RDS_INFO_SEND_MESSAGES, RDS_INFO_RETRANS_MESSAGES}) {
    socklen_t len = 0;
    char probe[1];
    svrds_getsockopt(fd, SOL_RDS, opt, probe, &len);
    if (len == 0) continue;
    std::vector<char> b(len);
    const int each = svrds_getsockopt(fd, SOL_RDS, opt, b.data(), &len);
    if (each <= 0) return true;  // it grew meanwhile (or failed): look again
    for (size_t off = 0; off + sizeof(rds_info_message) <= len; off += each) {
      rds_info_message m;
      std::memcpy(&m, b.data() + off, sizeof m);
      const int lport = ntohs(m.lport);
      if (m.laddr == laddr && lport >= port && lport < port + nsock) return true;
    }
  }
  return false;
}

int main(int argc, char** argv) {
  std::string local, peer;
  int port = 6000, nsock = 4, timeout_s = 120, spread_s = 0;
  long messages = 1000;
  uint64_t seed = 1;
  static option opts[] = {
      {"local", 1, nullptr, 'l'},   {"peer", 1, nullptr, 'p'},     {"port", 1, nullptr, 'P'},
      {"sockets", 1, nullptr, 'n'}, {"messages", 1, nullptr, 'm'}, {"seed", 1, nullptr, 's'},
      {"timeout", 1, nullptr, 't'}, {"spread", 1, nullptr, 'S'},   {nullptr, 0, nullptr, 0}};
  for (int o; (o = getopt_long(argc, argv, "", opts, nullptr)) != -1;) {
    switch (o) {
      case 'l':
        local = optarg;
        break;
      case 'p':
        peer = optarg;
        break;
      case 'P':
        port = std::atoi(optarg);
        break;
      case 'n':
        nsock = std::atoi(optarg);
        break;
      case 'm':
        messages = std::atol(optarg);
        break;
      case 's':
        seed = std::strtoull(optarg, nullptr, 0);
        break;
      case 't':
        timeout_s = std::atoi(optarg);
        break;
      case 'S':
        spread_s = std::atoi(optarg);
        break;
      default:
        return 2;
    }
  }
  in_addr_t local_addr = 0;
  inet_pton(AF_INET, local.c_str(), &local_addr);
  std::vector<int> fds;
  for (int k = 0; k < nsock; ++k) {
    int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port + k));
    inet_pton(AF_INET, local.c_str(), &a.sin_addr);
    if (fd < 0 || svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) < 0) {
      std::perror("bind");
      return 1;
    }
    int big = 1 << 20;
    svrds_setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    svrds_setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    fds.push_back(fd);
  }
  std::vector<sockaddr_in> peers;
  for (size_t at = 0; at <= peer.size();) {
    const size_t end = std::min(peer.find(',', at), peer.size());
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (inet_pton(AF_INET, peer.substr(at, end - at).c_str(), &a.sin_addr) != 1) {
      std::fprintf(stderr, "flows: bad --peer %s\n", peer.c_str());
      return 2;
    }
    peers.push_back(a);
    at = end + 1;
  }
  const long npeers = static_cast<long>(peers.size());
  messages *= npeers;  // M to each peer, M from each
  sleep(1);            // let the peers bind their sockets
  Rng rng{seed | 1};
  // (peer, my socket, peer socket) -> sent state
  std::map<std::tuple<long, int, int>, FlowState> out;
  // (peer address, peer port, my port) -> expected state
  std::map<std::tuple<uint32_t, int, int>, FlowState> in;
  long sent = 0, received = 0, eagain = 0;
  std::vector<char> buf(70000), rbuf(70000);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                            start)
        .count();
  };
  // Next message to send (kept until it is accepted).
  int cur_src = -1, cur_dst = 0;
  uint32_t cur_len = 0;
  bool done_at_set = false;
  int empty_looks = 0;
  std::chrono::steady_clock::time_point done_at;
  for (;;) {
    if (elapsed() > timeout_s) {
      std::fprintf(stderr, "flows: timeout: sent %ld/%ld received %ld/%ld\n", sent, messages,
                   received, messages);
      return 1;
    }
    // Send as much as the sockets take, and (with --spread) the pace allows.
    long allowed = messages;
    if (spread_s > 0) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      allowed = std::min(messages, messages * ms / (spread_s * 1000L) + 1);
    }
    while (sent < allowed) {
      if (cur_src < 0) {
        cur_src = static_cast<int>(rng.next() % nsock);
        cur_dst = static_cast<int>(rng.next() % nsock);
        const uint64_t r = rng.next() % 100;
        cur_len = r < 5    ? 0
                  : r < 90 ? static_cast<uint32_t>(rng.next() % 2048)
                           : static_cast<uint32_t>(rng.next() % 65536);
        cur_len = std::max<uint32_t>(cur_len, sizeof(Hdr));
      }
      const long to = sent % npeers;
      FlowState& f = out[{to, cur_src, cur_dst}];
      Hdr h{kMagic, static_cast<uint16_t>(port + cur_src), static_cast<uint16_t>(port + cur_dst),
            f.seq,  mix(mix(f.chain, f.seq), cur_len),     cur_len};
      std::memcpy(buf.data(), &h, sizeof h);
      for (size_t i = sizeof h; i < cur_len; ++i) buf[i] = static_cast<char>(filler(h.chain, i));
      sockaddr_in d = peers[static_cast<size_t>(to)];
      d.sin_port = htons(static_cast<uint16_t>(port + cur_dst));
      if (svrds_sendto(fds[cur_src], buf.data(), cur_len, 0, reinterpret_cast<sockaddr*>(&d),
                       sizeof d) < 0) {
        if (errno == EAGAIN || errno == ENOBUFS) {
          ++eagain;
          break;
        }
        std::perror("flows: send");
        return 1;
      }
      f.chain = h.chain;
      ++f.seq;
      ++sent;
      cur_src = -1;
    }
    std::vector<pollfd> pf;
    for (int fd : fds)
      pf.push_back({fd, static_cast<short>(POLLIN | (sent < allowed ? POLLOUT : 0)), 0});
    poll(pf.data(), pf.size(), 50);
    for (int k = 0; k < nsock; ++k) {
      for (int burst = 0; burst < 64; ++burst) {
        sockaddr_in from{};
        socklen_t fl = sizeof from;
        ssize_t n = svrds_recvfrom(fds[k], rbuf.data(), rbuf.size(), MSG_DONTWAIT,
                                   reinterpret_cast<sockaddr*>(&from), &fl);
        if (n < 0) break;
        Hdr h;
        if (n < static_cast<ssize_t>(sizeof h)) {
          std::fprintf(stderr, "flows: short message %zd\n", n);
          return 1;
        }
        std::memcpy(&h, rbuf.data(), sizeof h);
        FlowState& f = in[{from.sin_addr.s_addr, ntohs(from.sin_port), port + k}];
        const uint64_t want = mix(mix(f.chain, f.seq), h.len);
        if (h.magic != kMagic || h.flow_seq != f.seq || h.chain != want ||
            h.len != static_cast<uint32_t>(n) || h.dst_port != port + k ||
            h.src_port != ntohs(from.sin_port)) {
          std::fprintf(stderr,
                       "flows: flow %u->%d: got seq %llu (expected %llu), chain %s, len %u/%zd "
                       "after %ld messages\n",
                       ntohs(from.sin_port), port + k, static_cast<unsigned long long>(h.flow_seq),
                       static_cast<unsigned long long>(f.seq), h.chain == want ? "ok" : "BAD",
                       h.len, n, received);
          return 1;
        }
        for (size_t i = sizeof h; i < static_cast<size_t>(n); ++i)
          if (static_cast<uint8_t>(rbuf[i]) != filler(h.chain, i)) {
            std::fprintf(stderr, "flows: payload corrupted in flow %u->%d seq %llu\n",
                         ntohs(from.sin_port), port + k,
                         static_cast<unsigned long long>(h.flow_seq));
            return 1;
          }
        f.chain = h.chain;
        ++f.seq;
        ++received;
      }
    }
    if (received > messages) {
      std::fprintf(stderr, "flows: received %ld > %ld: duplicates\n", received, messages);
      return 1;
    }
    if (sent == messages && received == messages) {
      if (!done_at_set) {
        done_at_set = true;
        done_at = std::chrono::steady_clock::now();
      }
      // Linger: anything more now is a duplicate. Then close once the peers have acked all
      // we sent: closing cancels what a socket has not handed to the transport, or not seen
      // acked, which after a reset would never be sent again (rds(7), net/rds's
      // rds_send_drop_to), and the peer would wait for it until its timeout. At most 10 s
      // more: a peer that exited after taking our last message may owe us its ack for good.
      // Three empty looks in a row (50 ms apart, the poll above): the two lists are read one
      // after the other, and a reset moves a message from the second back to the first.
      const auto lingered = std::chrono::steady_clock::now() - done_at;
      if (lingered > std::chrono::seconds(2)) {
        empty_looks = holds_own(fds[0], local_addr, port, nsock) ? 0 : empty_looks + 1;
        if (empty_looks >= 3 || lingered > std::chrono::seconds(12)) break;
      }
    }
  }
  // What the stack went through (RDS_INFO_COUNTERS): resets survived, duplicates dropped.
  uint64_t resets = 0, dups = 0, lookups = 0;
  socklen_t len = 0;
  char probe[1];
  svrds_getsockopt(fds[0], SOL_RDS, RDS_INFO_COUNTERS, probe, &len);
  std::vector<char> cb(len);
  const int each = svrds_getsockopt(fds[0], SOL_RDS, RDS_INFO_COUNTERS, cb.data(), &len);
  for (size_t off = 0; each > 0 && off + each <= len; off += each) {
    rds_info_counter c;
    std::memcpy(&c, cb.data() + off, sizeof c);
    if (!std::strcmp(reinterpret_cast<char*>(c.name), "conn_reset")) resets = c.value;
    if (!std::strcmp(reinterpret_cast<char*>(c.name), "recv_drop_old_seq")) dups = c.value;
    if (!std::strcmp(reinterpret_cast<char*>(c.name), "dir_lookup")) lookups = c.value;
  }
  std::printf(
      "flows: sent %ld received %ld in %lld s over %zu flows (%ld EAGAIN/ENOBUFS, "
      "%llu connection resets, %llu duplicates dropped, %llu directory lookups): OK\n",
      sent, received, static_cast<long long>(elapsed()), in.size(), eagain,
      static_cast<unsigned long long>(resets), static_cast<unsigned long long>(dups),
      static_cast<unsigned long long>(lookups));
  for (int fd : fds) svrds_close(fd);
  return 0;
}
