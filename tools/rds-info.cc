// rds-info: display RDS state like rds-tools' rds-info, through getsockopt(RDS_INFO_*)
// on an unbound RDS socket. Flags: -c counters, -k sockets, -n connections, -r recv
// queues, -s send queues, -t retransmit queues, -I IB (RC) connections; none = everything.
// Written against <linux/rds.h> and the socket API; linked with the softverbs shim.
#include <arpa/inet.h>
#include <getopt.h>
#include <linux/rds.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

// rds-info's loop: probe, grow, retry until the snapshot fits (it may grow meanwhile).
std::vector<char> fetch(int fd, int id, int* each) {
  std::vector<char> buf(1);
  for (int tries = 0; tries < 20; ++tries) {
    socklen_t len = static_cast<socklen_t>(buf.size());
    const int r = getsockopt(fd, SOL_RDS, id, buf.data(), &len);
    if (r >= 0) {
      *each = r;
      buf.resize(len);
      return buf;
    }
    if (errno != ENOSPC) {
      std::perror("rds-info: getsockopt");
      break;
    }
    buf.resize(len + 4096);
  }
  *each = 0;
  return {};
}

std::string ip(uint32_t a) {
  char b[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, b, sizeof b);
  return b;
}

template <typename T, typename F>
void each_record(const std::vector<char>& buf, int each, F f) {
  for (size_t off = 0; each > 0 && off + each <= buf.size(); off += each) {
    T r{};
    std::memcpy(&r, buf.data() + off, std::min<size_t>(sizeof r, each));
    f(r);
  }
}

void messages(int fd, int id, const char* title) {
  int each;
  auto b = fetch(fd, id, &each);
  std::printf("\n%s:\n%15s %5s %15s %5s %16s %10s\n", title, "LocalAddr", "LPort", "RemoteAddr",
              "RPort", "Seq", "Bytes");
  each_record<rds_info_message>(b, each, [](const rds_info_message& m) {
    std::printf("%15s %5u %15s %5u %16llu %10u\n", ip(m.laddr).c_str(), ntohs(m.lport),
                ip(m.faddr).c_str(), ntohs(m.fport), static_cast<unsigned long long>(m.seq), m.len);
  });
}

constexpr const char kUsage[] =
    "usage: rds-info [-c] [-k] [-n] [-r] [-s] [-t] [-I] [-v]\n"
    "  -c  counters        -k  sockets          -n  connections\n"
    "  -r  receive queues  -s  send queues      -t  retransmit queues\n"
    "  -I  IB/RDMA connections                  -v  (accepted, ignored)\n"
    "With no option: all of them, from this host's softverbs RDS stacks.\n";

}  // namespace

int main(int argc, char** argv) {
  bool c = false, k = false, n = false, r = false, s = false, t = false, ib = false;
  static const option longopts[] = {{"help", no_argument, nullptr, 'h'}, {}};
  for (int o; (o = getopt_long(argc, argv, "cknrstIvh", longopts, nullptr)) != -1;) {
    switch (o) {
      case 'I':
        ib = true;
        break;
      case 'c':
        c = true;
        break;
      case 'k':
        k = true;
        break;
      case 'n':
        n = true;
        break;
      case 'r':
        r = true;
        break;
      case 's':
        s = true;
        break;
      case 't':
        t = true;
        break;
      case 'v':
        break;
      case 'h':
        std::fputs(kUsage, stdout);
        return 0;
      default:
        std::fputs(kUsage, stderr);
        return 2;
    }
  }
  if (!(c || k || n || r || s || t || ib)) c = k = n = r = s = t = ib = true;
  int fd = socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd < 0) {
    std::perror("rds-info: socket(AF_RDS)");
    return 1;
  }
  int each;
  if (c) {
    auto b = fetch(fd, RDS_INFO_COUNTERS, &each);
    std::printf("\nCounters:\n%32s %16s\n", "CounterName", "Value");
    each_record<rds_info_counter>(b, each, [](const rds_info_counter& x) {
      std::printf("%32s %16llu\n", reinterpret_cast<const char*>(x.name),
                  static_cast<unsigned long long>(x.value));
    });
  }
  if (k) {
    auto b = fetch(fd, RDS_INFO_SOCKETS, &each);
    std::printf("\nRDS Sockets:\n%15s %5s %15s %5s %10s %10s %8s\n", "BoundAddr", "BPort",
                "ConnAddr", "CPort", "SndBuf", "RcvBuf", "Inode");
    each_record<rds_info_socket>(b, each, [](const rds_info_socket& x) {
      std::printf("%15s %5u %15s %5u %10u %10u %8llu\n", ip(x.bound_addr).c_str(),
                  ntohs(x.bound_port), ip(x.connected_addr).c_str(), ntohs(x.connected_port),
                  x.sndbuf, x.rcvbuf, static_cast<unsigned long long>(x.inum));
    });
  }
  if (n) {
    auto b = fetch(fd, RDS_INFO_CONNECTIONS, &each);
    std::printf("\nRDS Connections:\n%15s %15s %16s %16s %3s\n", "LocalAddr", "RemoteAddr",
                "NextTX", "NextRX", "Flg");
    each_record<rds_info_connection>(b, each, [](const rds_info_connection& x) {
      std::printf("%15s %15s %16llu %16llu %c%c%c\n", ip(x.laddr).c_str(), ip(x.faddr).c_str(),
                  static_cast<unsigned long long>(x.next_tx_seq),
                  static_cast<unsigned long long>(x.next_rx_seq),
                  x.flags & RDS_INFO_CONNECTION_FLAG_SENDING ? 's' : '-',
                  x.flags & RDS_INFO_CONNECTION_FLAG_CONNECTING ? 'c' : '-',
                  x.flags & RDS_INFO_CONNECTION_FLAG_CONNECTED ? 'C' : '-');
    });
  }
  if (r) messages(fd, RDS_INFO_RECV_MESSAGES, "Receive Message Queue");
  if (s) messages(fd, RDS_INFO_SEND_MESSAGES, "Send Message Queue");
  if (t) messages(fd, RDS_INFO_RETRANS_MESSAGES, "Retransmit Message Queue");
  if (ib) {
    auto b = fetch(fd, RDS_INFO_IB_CONNECTIONS, &each);
    std::printf("\nRDS IB Connections:\n%15s %15s %32s %32s %6s %6s %4s %8s\n", "LocalAddr",
                "RemoteAddr", "LocalDev", "RemoteDev", "SendWR", "RecvWR", "SGE", "MRs");
    auto gid = [](const uint8_t* g) {
      std::string out;
      char b[8];
      for (int i = 0; i < 16; i += 2) {
        std::snprintf(b, sizeof b, "%s%02x%02x", i ? ":" : "", g[i], g[i + 1]);
        out += b;
      }
      return out;
    };
    each_record<rds_info_rdma_connection>(b, each, [&](const rds_info_rdma_connection& x) {
      std::printf("%15s %15s %32s %32s %6u %6u %4u %8u\n", ip(x.src_addr).c_str(),
                  ip(x.dst_addr).c_str(), gid(x.src_gid).c_str(), gid(x.dst_gid).c_str(),
                  x.max_send_wr, x.max_recv_wr, x.max_send_sge, x.rdma_mr_max);
    });
  }
  close(fd);
  return 0;
}
