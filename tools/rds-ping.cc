// rds-ping: like rds-tools' rds-ping. Sends zero-length datagrams to port 0 of the remote
// address; the remote RDS stack answers with a zero-length pong from port 0.
//   rds-ping [-c count] [-i interval] [-I local_addr] [-n sockets] remote_addr
// Written against the plain socket API and <linux/rds.h>; linked with the softverbs
// LD_PRELOAD shim so socket(AF_RDS, ...) is softverbs RDS.
#include <arpa/inet.h>
#include <linux/rds.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  long count = -1, nsock = 8;
  double interval = 1.0;
  std::string local;
  int opt;
  while ((opt = getopt(argc, argv, "c:i:I:n:Q:")) != -1) {
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
      default:
        std::fprintf(stderr,
                     "usage: rds-ping [-c count] [-i interval] [-I local_addr] "
                     "[-n sockets] remote_addr\n");
        return 2;
    }
  }
  if (optind >= argc || nsock < 1 || nsock > 32) {
    std::fprintf(stderr,
                 "usage: rds-ping [-c count] [-i interval] [-I local_addr] "
                 "[-n sockets] remote_addr\n");
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
  long sent = 0, replies = 0;
  using clock = std::chrono::steady_clock;
  for (long seq = 0; count < 0 || seq < count; ++seq) {
    int fd = fds[seq % fds.size()];
    const auto t0 = clock::now();
    if (sendto(fd, nullptr, 0, 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst) < 0) {
      std::printf(" %3ld: ERROR: %s\n", seq, std::strerror(errno));
      continue;
    }
    ++sent;
    const auto deadline = t0 + std::chrono::duration<double>(interval);
    bool got = false;
    while (!got) {
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
      ++replies;
      got = true;
    }
    const auto rest = deadline - clock::now();
    if (rest.count() > 0 && (count < 0 || seq + 1 < count))
      usleep(static_cast<useconds_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(rest).count()));
  }
  for (int fd : fds) close(fd);
  return replies > 0 ? 0 : 1;
}
