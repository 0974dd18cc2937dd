#include "transport/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/raw_socket.h"

namespace sv::transport {

uint16_t SockAddr::port() const {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void SockAddr::set_port(uint16_t p) {
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(p);
  if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(p);
}

std::string SockAddr::str() const {
  char buf[INET6_ADDRSTRLEN + 8] = "?";
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  else if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(port());
}

SockAddr SockAddr::from(const sockaddr* sa) {
  SockAddr a;
  if (!sa) return a;
  if (sa->sa_family == AF_INET)
    a.len = sizeof(sockaddr_in);
  else if (sa->sa_family == AF_INET6)
    a.len = sizeof(sockaddr_in6);
  else if (sa->sa_family == AF_IB)
    a.len = 0;
  std::memcpy(&a.ss, sa, a.len);
  return a;
}

SockAddr SockAddr::ipv4(uint32_t addr_be, uint16_t port) {
  SockAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = addr_be;
  in->sin_port = htons(port);
  a.len = sizeof(sockaddr_in);
  return a;
}

int set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int tcp_listen(const SockAddr& addr, int backlog, bool nonblock) {
  int fd =
      sv::raw_socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (addr.family() == AF_INET6) {
    int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) < 0 ||
      listen(fd, backlog) < 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

int tcp_connect_nb(const SockAddr& to, const SockAddr* from) {
  int fd = sv::raw_socket(to.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  set_nodelay(fd);
  if (from && from->len) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // Only the address is bound; the port is picked by connect(), which searches for a
    // free 4-tuple. A bind to port 0 searches for a port no socket holds, a scan that grows
    // with the sockets open (1.2 ms a bind with 3,000 connections: cmtime -c 10000 timed out).
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    SockAddr f = *from;
    f.set_port(0);
    if (bind(fd, reinterpret_cast<const sockaddr*>(&f.ss), f.len) < 0) {
      int e = -errno;
      close(fd);
      return e;
    }
  }
  if (connect(fd, reinterpret_cast<const sockaddr*>(&to.ss), to.len) < 0 && errno != EINPROGRESS) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

int tcp_connect_result(int fd) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return -errno;
  return -err;
}

SockAddr local_addr(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) < 0) a.len = 0;
  return a;
}

SockAddr peer_addr(int fd) {
  SockAddr a;
  a.len = sizeof a.ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) < 0) a.len = 0;
  return a;
}

int tcp_mss(int fd) {
  int mss = 0;
  socklen_t len = sizeof mss;
  if (getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) < 0 || mss <= 0) return 1460;
  return mss;
}

ssize_t sys_sendmsg(int fd, const msghdr* m, int flags) {
  return syscall(SYS_sendmsg, fd, m, flags);
}
ssize_t sys_recvmsg(int fd, msghdr* m, int flags) {
  return syscall(SYS_recvmsg, fd, m, flags);
}
ssize_t sys_recv(int fd, void* buf, size_t len, int flags) {
  return syscall(SYS_recvfrom, fd, buf, len, flags, nullptr, nullptr);
}

std::vector<HostAddr> host_addresses() {
  std::vector<HostAddr> v4, lo4, v6;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) == 0) {
    for (auto* p = ifa; p; p = p->ifa_next) {
      if (!p->ifa_addr || !(p->ifa_flags & IFF_UP)) continue;
      HostAddr h{SockAddr::from(p->ifa_addr), p->ifa_name, (p->ifa_flags & IFF_LOOPBACK) != 0};
      if (p->ifa_addr->sa_family == AF_INET) {
        (h.loopback ? lo4 : v4).push_back(h);
      } else if (p->ifa_addr->sa_family == AF_INET6) {
        auto* in6 = reinterpret_cast<const sockaddr_in6*>(p->ifa_addr);
        if (!IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr) && !IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr))
          v6.push_back(h);
      }
    }
    freeifaddrs(ifa);
  }
  if (lo4.empty()) lo4.push_back({SockAddr::ipv4(htonl(INADDR_LOOPBACK), 0), "lo", true});
  v4.insert(v4.end(), lo4.begin(), lo4.end());
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

}  // namespace sv::transport
