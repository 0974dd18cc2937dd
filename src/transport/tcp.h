// TCP socket helpers for the iWARP LLP (RFC 5044 runs MPA over TCP). Thin wrappers that
// return -errno instead of throwing; every fd is O_CLOEXEC so exec'd children hold no QP.
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sv::transport {

// A socket address of either family.
struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family() const { return ss.ss_family; }
  uint16_t port() const;
  void set_port(uint16_t p);
  std::string str() const;
  static SockAddr from(const sockaddr* sa);
  static SockAddr ipv4(uint32_t addr_be, uint16_t port);
};

// Listening socket on addr (port 0 = ephemeral). Returns fd or -errno.
int tcp_listen(const SockAddr& addr, int backlog, bool nonblock);
// Starts a non-blocking connect; returns fd (connect may still be in progress) or -errno.
int tcp_connect_nb(const SockAddr& to, const SockAddr* from);
// Result of a finished non-blocking connect: 0 or -errno.
int tcp_connect_result(int fd);
int set_nonblock(int fd, bool on);
void set_nodelay(int fd);
SockAddr local_addr(int fd);
SockAddr peer_addr(int fd);
// MSS of a connected socket (TCP_MAXSEG), or 1460 if unknown.
int tcp_mss(int fd);

// Socket I/O that moves application payload (RDMA data) straight between the socket and
// application memory: the kernel touches that memory like a NIC's DMA, ordered by
// completions the application waits for. Direct system calls, so user-space tools such as
// ThreadSanitizer do not mistake the kernel's access for a racing thread's.
ssize_t sys_sendmsg(int fd, const msghdr* m, int flags);
ssize_t sys_recvmsg(int fd, msghdr* m, int flags);
ssize_t sys_recv(int fd, void* buf, size_t len, int flags);

// Host interface addresses, for the GID table. Non-loopback IPv4 first, then loopback
// IPv4, then global IPv6.
struct HostAddr {
  SockAddr addr;
  std::string ifname;
  bool loopback = false;
};
std::vector<HostAddr> host_addresses();

}  // namespace sv::transport
