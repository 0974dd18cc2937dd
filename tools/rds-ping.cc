// rds-ping: like rds-tools' rds-ping. Sends zero-length datagrams to port 0 of the remote
// address; the remote RDS stack answers with a zero-length pong from port 0.
//   rds-ping [-c count] [-i interval] [-I local_addr] [-n sockets] remote_addr
// Ends, as iputils ping, with a summary ("3 sent, 0 received, 100% loss") when the count is
// reached or on SIGINT, and exits 0 only if some ping was answered.
// Written against the plain socket API and <linux/rds.h>; linked with the softverbs
// LD_PRELOAD shim so socket(AF_RDS, ...) is softverbs RDS.
#include <arpa/inet.h>
#include <getopt.h>
#include <linux/rds.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr const char kUsage[] =
    "usage: rds-ping [-c count] [-i interval] [-I local_addr] [-n sockets] remote_addr\n"
    "  -c count     stop after count pings (default: until interrupted)\n"
    "  -i interval  seconds between pings, and how long each waits for its pong (default 1)\n"
    "  -I addr      local address to send from (default: the route's source)\n"
    "  -n sockets   spread the pings over this many sockets, 1..32 (default 8)\n"
    "Exits 0 if any ping was answered, 1 if none was, 2 on a usage error.\n";

volatile sig_atomic_t g_stop = 0;
void on_sigint(int) {
  g_stop = 1;
}

}  // namespace

int main(int argc, char** argv) {
  long count = -1, nsock = 8;
  double interval = 1.0;
  std::string local;
  int opt;
  static const option longopts[] = {{"help", no_argument, nullptr, 'h'}, {}};
  while ((opt = getopt_long(argc, argv, "c:i:I:n:Q:h", longopts, nullptr)) != -1) {
    switch (opt) {
      case 'c':
        count = std::strtol(optarg, nullptr, 10);
        break;
      case 'i':
        interval = std::strtod(optarg, nullptr);
        break;
      case 'I':
        local = optarg;
        break;
      case 'n':
        nsock = std::strtol(optarg, nullptr, 10);
        break;
      case 'Q':
        break;  // TOS: no meaning for this transport
      case 'h':
        std::fputs(kUsage, stdout);
        return 0;
      default:
        std::fputs(kUsage, stderr);
        return 2;
    }
  }
  if (optind >= argc || nsock < 1 || nsock > 32) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  if (inet_pton(AF_INET, argv[optind], &dst.sin_addr) != 1) {
    std::fprintf(stderr, "rds-ping: bad address %s\n", argv[optind]);
    return 2;
  }
  sockaddr_in src{};
  src.sin_family = AF_INET;
  if (!local.empty()) {
    inet_pton(AF_INET, local.c_str(), &src.sin_addr);
  } else {
    // The source the kernel would route from (a connected UDP socket sends nothing).
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in probe = dst;
    probe.sin_port = htons(9);
    connect(u, reinterpret_cast<sockaddr*>(&probe), sizeof probe);
    socklen_t l = sizeof src;
    getsockname(u, reinterpret_cast<sockaddr*>(&src), &l);
    close(u);
  }
  src.sin_port = 0;
  if (count > 0 && nsock > count) nsock = count;
  std::vector<int> fds;
  for (long i = 0; i < nsock; ++i) {
    int fd = socket(AF_RDS, SOCK_SEQPACKET, 0);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) < 0) {
      std::perror("rds-ping: socket/bind");
      return 1;
    }
    fds.push_back(fd);
  }
  // SIGINT ends the run with the summary, as iputils ping; no SA_RESTART, so a waiting
  // poll() returns at once.
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, nullptr);
  long sent = 0, replies = 0, errors = 0;
  double rtt_min = 0, rtt_max = 0, rtt_sum = 0;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (long seq = 0; (count < 0 || seq < count) && !g_stop; ++seq) {
    int fd = fds[seq % fds.size()];
    const auto t0 = clock::now();
    // Counted as iputils counts: a ping that sendto refused is sent, and an error.
    ++sent;
    if (sendto(fd, nullptr, 0, 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst) < 0) {
      std::printf(" %3ld: ERROR: %s\n", seq, std::strerror(errno));
      ++errors;
      continue;
    }
    const auto deadline = t0 + std::chrono::duration<double>(interval);
    bool got = false;
    while (!got && !g_stop) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, left > 0 ? static_cast<int>(left) : 0) <= 0) break;
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      char c;
      if (recvfrom(fd, &c, 1, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &fl) < 0) continue;
      const auto us =
          std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
      if (from.sin_addr.s_addr != dst.sin_addr.s_addr) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
        std::printf(" %3ld: %ld usec (%s)\n", seq, static_cast<long>(us), ip);
      } else {
        std::printf(" %3ld: %ld usec\n", seq, static_cast<long>(us));
      }
      std::fflush(stdout);
      rtt_min = replies ? std::min(rtt_min, double(us)) : double(us);
      rtt_max = std::max(rtt_max, double(us));
      rtt_sum += double(us);
      ++replies;
      got = true;
    }
    const auto rest = deadline - clock::now();
    if (rest.count() > 0 && (count < 0 || seq + 1 < count) && !g_stop)
      usleep(static_cast<useconds_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(rest).count()));
  }
  for (int fd : fds) close(fd);
  const long ms = static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start).count());
  std::printf("--- %s rds-ping statistics ---\n", argv[optind]);
  std::printf("%ld sent, %ld received", sent, replies);
  if (errors) std::printf(", +%ld errors", errors);
  std::printf(", %ld%% loss, time %ldms\n", sent ? (sent - replies) * 100 / sent : 0, ms);
  if (replies)
    std::printf("rtt min/avg/max = %.0f/%.0f/%.0f usec\n", rtt_min, rtt_sum / double(replies),
                rtt_max);
  return replies > 0 ? 0 : 1;
}
