// Helpers for RDS tests: sockets on loopback, a private registry directory per run.
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <softverbs/rds.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace rdstest {

inline sockaddr_in addr(uint16_t port, const char* ip = "127.0.0.1") {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// A port block unique to this test process (registry is host-wide).
// 64 ports per process: parallel ctest processes must not overlap.
inline uint16_t port(int i) {
  return static_cast<uint16_t>(20000 + (getpid() % 700) * 64 + i);
}

inline int bound_socket(uint16_t p) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a = addr(p);
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  return fd;
}

// Waits (bounded) until fd reports `ev`; returns revents or 0 on timeout.
inline short wait_for(int fd, short ev, int ms = 5000) {
  pollfd p{fd, ev, 0};
  if (poll(&p, 1, ms) <= 0) return 0;
  return p.revents;
}

inline ssize_t send_to(int fd, uint16_t dport, const void* buf, size_t len, int flags = 0) {
  sockaddr_in d = addr(dport);
  return svrds_sendto(fd, buf, len, flags, reinterpret_cast<sockaddr*>(&d), sizeof d);
}

// Receives one datagram (blocking up to 5 s through poll).
inline ssize_t recv_one(int fd, std::vector<char>& buf, sockaddr_in* from = nullptr,
                        int flags = 0) {
  if (!wait_for(fd, POLLIN)) return -2;
  socklen_t fl = sizeof(sockaddr_in);
  return svrds_recvfrom(fd, buf.data(), buf.size(), flags | MSG_DONTWAIT,
                        reinterpret_cast<sockaddr*>(from), from ? &fl : nullptr);
}

}  // namespace rdstest
