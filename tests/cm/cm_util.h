// Helpers shared by the rdma_cm and rsocket API tests.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <cstdint>

namespace cmtest {

inline sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A port of this process's own (test cases run in parallel processes; each file its `base`,
// 4000 ports apart): 16 per process, all below Linux's ephemeral range (32768-60999), where
// any connection of a parallel test may hold the port and make a listen fail.
inline uint16_t test_port(int base, int i) {
  return static_cast<uint16_t>(base + (getpid() % 250) * 16 + (i % 16));
}

inline bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, ms) == 1;
}

}  // namespace cmtest
