// Socket layer (net/rds af_rds.c, bind.c): AF_RDS socket calls on a pollable descriptor.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "rds/rds_impl.h"
#include "softverbs/rds.h"
#include "util/settings.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

namespace sv::rds {}  // namespace sv::rds

using namespace sv::rds;

namespace {

// Never freed (a thread may still be waking on a closed socket's cv), never destroyed.
std::vector<Sock*>& g_closed = *new std::vector<Sock*>();

}  // namespace

namespace {

// Whether this host (network namespace) has the address: a UDP socket can bind it.
bool bindable(sockaddr_storage a, socklen_t len) {
  if (a.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&a)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(&a)->sin6_port = 0;
  int fd = socket(a.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  close(fd);
  return ok;
}

bool is_local6(const sockaddr_in6& a) {
  sockaddr_storage ss{};
  std::memcpy(&ss, &a, sizeof a);
  return bindable(ss, sizeof a);
}

}  // namespace

bool sv::rds::is_local_ip(in_addr ip) {
  sockaddr_storage ss{};
  auto* a = reinterpret_cast<sockaddr_in*>(&ss);
  a->sin_family = AF_INET;
  a->sin_addr = ip;
  return bindable(ss, sizeof *a);
}

namespace {
// is_local_ip's answers, and when each was had (is_local_ip_cached). Under the stack lock.
struct SeenIp {
  uint64_t at;
  bool local;
};
std::unordered_map<uint32_t, SeenIp>& seen_ips() {
  static auto& seen = *new std::unordered_map<uint32_t, SeenIp>();
  return seen;
}
void remember_ip(in_addr ip, bool local) {
  auto& seen = seen_ips();
  if (seen.size() >= 4096) seen.clear();  // destinations enough to fill it: look again
  seen[ip.s_addr] = SeenIp{mono_ns(), local};
}
}  // namespace

bool sv::rds::is_local_ip_cached(in_addr ip) {
  const auto& seen = seen_ips();
  if (auto it = seen.find(ip.s_addr);
      it != seen.end() && mono_ns() - it->second.at < kLocalIpRecheckNs)
    return it->second.local;
  const bool local = is_local_ip(ip);
  remember_ip(ip, local);
  return local;
}

namespace {

void free_mr(Sock* s, uint32_t rkey) {
  auto it = s->mrs.find(rkey);
  if (it == s->mrs.end()) return;
  // Gone from the socket now, so no later op of ours finds it; the device lets go of it as
  // the stack lock is let go, before the call returns (net/rds's rds_mr_put outside the lock).
  dereg_after_unlock(it->second);
  s->mrs.erase(it);
  s->mr_flags.erase(rkey);
  count(Ctr::rdma_mr_free);
}

// Drops this socket's messages to dest (all if dest is null): queued ones vanish, sent
// but unacked ones are cancelled; RDMA notifiers report CANCELED (net/rds send.c).
void drop_to(Sock* s, const sockaddr_in* dest, bool notify) {
  std::vector<std::pair<Conn*, std::deque<Message*>*>> queues;
  for (auto& [k, c] : g().conns) {
    queues.emplace_back(c, &c->send_q);
    queues.emplace_back(c, &c->retrans);
  }
  for (auto* q : directory_queues()) queues.emplace_back(nullptr, q);
  for (auto [c, q] : queues) {
    {
      for (auto it = q->begin(); it != q->end();) {
        Message* m = *it;
        const bool match =
            m->sock == s && (!dest || (m->dest.sin_addr.s_addr == dest->sin_addr.s_addr &&
                                       m->dest.sin_port == dest->sin_port));
        // Not what the transport already holds: a message partly posted, or one whose
        // RDMA is in flight (its buffers are the NIC's until the op completes).
        const bool in_flight =
            (c && q == &c->send_q && m->frags_posted && it == q->begin()) || op_in_flight(m);
        if (!match || in_flight) {
          ++it;
          continue;
        }
        it = q->erase(it);
        if (notify) ops_report(m, RDS_RDMA_CANCELED);
        // A zero-copy SEND the device has not finished with keeps its buffers until it has
        // (freed now, the device would read an unregistered region: LOC_PROT_ERR, and the
        // connection reset); its cookie completes then.
        if (c && q == &c->retrans && retire_later(c, m)) continue;
        release_message(m);
      }
    }
  }
}

}  // namespace

SV_EXPORT int svrds_socket(int domain, int type, int protocol) {
  if (domain != AF_RDS) return fail(EAFNOSUPPORT);
  if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_SEQPACKET || protocol != 0)
    return fail(ESOCKTNOSUPPORT);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return -1;
  if (!(type & SOCK_CLOEXEC)) fcntl(sv[0], F_SETFD, 0);
  if (type & SOCK_NONBLOCK) fcntl(sv[0], F_SETFL, O_NONBLOCK);
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  int small = 4096;  // keeps "no send space" cheap to signal
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  auto* s = new Sock();
  s->app_fd = sv[0];
  s->lib_fd = sv[1];
  struct stat st {};
  if (fstat(sv[0], &st) == 0) s->inum = st.st_ino;  // as sock_i_ino: ls -l /proc/PID/fd shows it
  std::lock_guard lk(g().mu);
  sock_table_add(s);
  return s->app_fd;
}

SV_EXPORT int svrds_is_rds(int fd) {
  return fd >= 0 && fd < kMaxFd && g_is_rds[fd].load();
}

// What poll() would say of these descriptors, from the stack's state (what sock_update_poll
// tells the kernel: readable, and app_fd's send direction filled iff `blocked`): a spinning
// poller's every pass then costs no syscall.
SV_EXPORT int svrds_poll_ready(struct pollfd* fds, nfds_t n) {
  // Each socket's rs_recv_lock, never the stack lock: a spinning poller holds up neither
  // the send path nor the completions.
  int ready = 0;
  for (nfds_t i = 0; i < n; ++i) {
    fds[i].revents = 0;
    if (fds[i].fd < 0) continue;
    std::unique_lock<std::mutex> lk;
    Sock* s = sock_of_recv_locked(fds[i].fd, lk);
    // Not ours to answer for: the caller asks the kernel, which rewrites every revents.
    if (!s || s->lib_fd < 0) return -1;
    // As unix_poll reports a stream socket's end.
    short r = 0;
    if (sock_readable(s)) r |= POLLIN | POLLRDNORM;
    if (!s->blocked) r |= POLLOUT | POLLWRNORM | POLLWRBAND;
    fds[i].revents = static_cast<short>(r & fds[i].events);
    ready += fds[i].revents != 0;
  }
  return ready;
}

SV_EXPORT void svrds_shim_attach(void) {
  if (sv::settings::flag_value(SV_SETTING("SOFTVERBS_RDS_LAZY_TOKEN"))) g_lazy_tokens.store(true);
}

SV_EXPORT int svrds_lazy_tokens(void) {
  return g_lazy_tokens.load() ? 1 : 0;
}

SV_EXPORT void svrds_expose(int fd) {
  std::unique_lock<std::mutex> lk;
  if (Sock* s = sock_of_recv_locked(fd, lk)) {
    if (!s->exposed) {
      s->exposed = true;
      sock_update_poll_locked(s);
    }
  }
}

SV_EXPORT void svrds_kernel_wait_begin(const struct pollfd* fds, nfds_t n, void** socks) {
  for (nfds_t i = 0; i < n; ++i) {
    std::unique_lock<std::mutex> lk;
    Sock* s = fds[i].fd >= 0 ? sock_of_recv_locked(fds[i].fd, lk) : nullptr;
    socks[i] = s;
    if (!s) continue;
    ++s->sleepers;
    sock_update_poll_locked(s);  // the byte now says what the stack knows
  }
}

SV_EXPORT void svrds_kernel_wait_end(void** socks, nfds_t n) {
  // Sockets are never freed (g_closed): one closed meanwhile is still there to count down.
  for (nfds_t i = 0; i < n; ++i)
    if (auto* s = static_cast<Sock*>(socks[i])) {
      std::lock_guard lk(s->rs_recv_lock);
      --s->sleepers;
    }
}

namespace {
// A real IPv6 address (::1 or one of this host's). It is bound and reported as IPv6, unique
// per address like IPv4 ports; softverbs' transport carries IPv4 only, so sends from such a
// socket fail with ENETUNREACH (send.cc).
int bind6(Sock* s, const sockaddr_in6& a6) {
  if (s->bound) return fail(EINVAL);
  if (ntohs(a6.sin6_port) == 1) return fail(EINVAL);  // RDS_FLAG_PROBE_PORT
  if (!is_local6(a6)) return fail(EADDRNOTAVAIL);
  if (int r = transport_start()) return fail(-r);
  sockaddr_in6 b = a6;
  int lock = -1;
  for (int tries = 0; tries < 4096; ++tries) {
    if (!a6.sin6_port) {
      uint16_t p;
      if (getrandom(&p, sizeof p, 0) != sizeof p) p = static_cast<uint16_t>(tries + 1024);
      if (p < 2) continue;
      b.sin6_port = htons(p);
    }
    lock = registry_claim6(b, g().cm_port, g().gen);
    if (a6.sin6_port || lock != -EADDRINUSE) break;
  }
  if (lock < 0) return fail(-lock);
  s->lock_fd = lock;
  s->bound = true;
  s->v6 = true;
  s->bound6 = b;
  s->bound_addr = sockaddr_in{};
  s->bound_addr.sin_family = AF_INET;
  s->bound_addr.sin_port = b.sin6_port;
  return 0;
}
}  // namespace

SV_EXPORT int svrds_bind(int fd, const sockaddr* addr, socklen_t len) {
  std::lock_guard lk(g().mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  if (!addr || len < sizeof(sockaddr_in)) return fail(EINVAL);
  sockaddr_in a;
  if (addr->sa_family == AF_INET6) {
    if (len < sizeof(sockaddr_in6)) return fail(EINVAL);
    sockaddr_in6 a6;
    std::memcpy(&a6, addr, sizeof a6);
    const int kind = classify_v6(a6, &a);
    if (kind < 0) return fail(-kind);
    if (kind == 6) return bind6(s, a6);
  } else if (addr->sa_family == AF_INET) {
    std::memcpy(&a, addr, sizeof a);
  } else {
    return fail(EINVAL);
  }
  if (s->bound || bad_unicast(a)) return fail(EINVAL);
  if (ntohs(a.sin_port) == 1) return fail(EINVAL);  // RDS_FLAG_PROBE_PORT
  // What bind learns, sends know at once: an address just added to the host, and bound
  // here, is not another host's for the rest of a cached second.
  const bool local = is_local_ip(a.sin_addr);
  remember_ip(a.sin_addr, local);
  if (!local) return fail(EADDRNOTAVAIL);
  if (int r = transport_start()) return fail(-r);
  int lock = -1;
  if (a.sin_port) {
    lock = registry_claim(a, g().cm_port, g().gen);
  } else {
    // Port 0: a random free port >= 2 (net/rds bind.c).
    for (int tries = 0; tries < 4096; ++tries) {
      uint16_t p;
      if (getrandom(&p, sizeof p, 0) != sizeof p) p = static_cast<uint16_t>(tries + 1024);
      if (p < 2) continue;
      a.sin_port = htons(p);
      lock = registry_claim(a, g().cm_port, g().gen);
      if (lock != -EADDRINUSE) break;
    }
  }
  if (lock < 0) return fail(-lock);
  s->lock_fd = lock;
  s->bound = true;
  s->bound_addr = a;
  g().bound_v4[bound_key(a.sin_addr, a.sin_port)] = s;
  ping_claim(a.sin_addr);
  return 0;
}

void sv::rds::ping_claim(in_addr ip) {
  Global& G = g();
  if (G.ping_locks.count(ip.s_addr)) return;
  sockaddr_in ping{};
  ping.sin_family = AF_INET;
  ping.sin_addr = ip;
  // Held for the life of the process; EADDRINUSE: another process answers there.
  if (int fd = registry_claim(ping, G.cm_port, G.gen); fd >= 0) G.ping_locks[ip.s_addr] = fd;
}

SV_EXPORT int svrds_connect(int fd, const sockaddr* addr, socklen_t len) {
  std::lock_guard lk(g().mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  if (!addr || len < sizeof(sockaddr_in)) return fail(EINVAL);
  if (addr->sa_family != AF_INET) return fail(EAFNOSUPPORT);
  sockaddr_in a;
  std::memcpy(&a, addr, sizeof a);
  if (ntohl(a.sin_addr.s_addr) == INADDR_ANY) return fail(EDESTADDRREQ);
  if (bad_unicast(a)) return fail(EINVAL);
  s->connected = true;
  s->conn_addr = a;
  return 0;
}

SV_EXPORT ssize_t svrds_sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* to,
                               socklen_t tolen) {
  iovec v{const_cast<void*>(buf), len};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_name = const_cast<sockaddr*>(to);
  m.msg_namelen = to ? tolen : 0;
  return svrds_sendmsg(fd, &m, flags);
}

SV_EXPORT int svrds_setsockopt(int fd, int level, int optname, const void* optval,
                               socklen_t optlen) {
  std::lock_guard lk(g().mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  auto as_int = [&](int* out) {
    if (!optval || optlen < sizeof(int)) return false;
    std::memcpy(out, optval, sizeof(int));
    return true;
  };
  // Receive timestamps (net/rds af_rds.c rds_enable_recvtstamp: also at SOL_RDS, where a
  // length other than an int is EFAULT; the generic SOL_SOCKET path says EINVAL).
  auto set_tstamp = [&](bool at_rds) {
    int v;
    if (at_rds ? optlen != sizeof(int) || !optval : !as_int(&v))
      return fail(at_rds ? EFAULT : EINVAL);
    std::memcpy(&v, optval, sizeof v);
    std::lock_guard rlk(s->rs_recv_lock);  // recvmsg reads them
    if (optname == SO_TIMESTAMP_NEW || optname == SO_TIMESTAMPNS_NEW) s->tstamp_new = true;
    if (optname == SO_TIMESTAMP_OLD || optname == SO_TIMESTAMPNS_OLD) s->tstamp_new = false;
    s->rcvtstamp = v != 0;
    return 0;
  };
  if (level == SOL_SOCKET) {
    int v;
    if (optname == SO_TIMESTAMP_OLD || optname == SO_TIMESTAMP_NEW ||
        optname == SO_TIMESTAMPNS_OLD || optname == SO_TIMESTAMPNS_NEW)
      return set_tstamp(false);
    if (optname == SO_ZEROCOPY) {
      // sock_setsockopt: RDS is one of the families that may set it; 0 or 1 only.
      if (!as_int(&v)) return fail(EINVAL);
      if (v < 0 || v > 1) return fail(EINVAL);
      std::lock_guard rlk(s->rs_recv_lock);
      s->zerocopy = v == 1;
      return 0;
    }
    if (optname == SO_SNDBUF || optname == SO_RCVBUF) {
      if (!as_int(&v)) return fail(EINVAL);
      // sock_setsockopt stores max(2 * val, SOCK_MIN_SNDBUF or SOCK_MIN_RCVBUF) and RDS uses
      // half of it (rds_sk_sndbuf): the value as given, but never below the kernel's floor.
      // A tiny buffer would flag every message ACK_REQUIRED and cost each one an ack of its
      // own (rds-stress sets tasks * depth * (req + ack) * 2 bytes). The cap at
      // net.core.wmem_max/rmem_max is not applied: these buffers are not kernel memory.
      const bool snd = optname == SO_SNDBUF;
      const uint32_t floor = snd ? kMinSndBuf : kMinRcvBuf;
      const uint32_t val = v < 0 ? INT32_MAX / 2 : std::max(static_cast<uint32_t>(v), floor);
      (snd ? s->sndbuf : s->rcvbuf) = val;
      sock_update_poll(s);
      sock_wake(s);  // a sender waiting for space may have it now
      return 0;
    }
    return 0;  // other generic options have no effect on RDS here
  }
  if (level != SOL_RDS) return fail(ENOPROTOOPT);
  switch (optname) {
    case RDS_CANCEL_SENT_TO: {
      if (!optval || optlen < sizeof(sockaddr_in)) return fail(EINVAL);
      if (!s->bound) return fail(ENOTCONN);
      sockaddr_in d;
      std::memcpy(&d, optval, sizeof d);
      QuietPosts quiet;  // the ack that retires a cancelled zero-copy send (retire_later)
      drop_to(s, &d, true);
      return 0;
    }
    case RDS_GET_MR:
    case RDS_GET_MR_FOR_DEST: {
      const bool dest = optname == RDS_GET_MR_FOR_DEST;
      if (!optval || optlen != (dest ? sizeof(rds_get_mr_for_dest_args) : sizeof(rds_get_mr_args)))
        return fail(EINVAL);
      if (!s->bound) return fail(ENOTCONN);
      rds_get_mr_args a;
      if (dest) {
        // The destination is ignored, as upstream does.
        const auto* d = static_cast<const rds_get_mr_for_dest_args*>(optval);
        a.vec = d->vec;
        a.cookie_addr = d->cookie_addr;
        a.flags = d->flags;
      } else {
        std::memcpy(&a, optval, sizeof a);
      }
      uint64_t cookie = 0;
      if (int r = map_region_locked(s, a.vec, a.flags, &cookie)) return fail(-r);
      if (a.cookie_addr) *reinterpret_cast<uint64_t*>(a.cookie_addr) = cookie;
      return 0;
    }
    case RDS_FREE_MR: {
      if (optlen != sizeof(rds_free_mr_args)) return fail(EINVAL);
      rds_free_mr_args a;
      std::memcpy(&a, optval, sizeof a);
      if (a.cookie == 0) {
        // Cookie 0 flushes every region this socket holds (RDS_FREE_MR, rds-rdma(7)).
        std::vector<uint32_t> keys;
        for (auto& [k, mr] : s->mrs) keys.push_back(k);
        for (uint32_t k : keys) free_mr(s, k);
        return 0;
      }
      const auto key = static_cast<uint32_t>(a.cookie);
      if (!s->mrs.count(key)) return fail(EINVAL);
      free_mr(s, key);
      return 0;
    }
    case RDS_RECVERR: {
      int v;
      if (!as_int(&v)) return fail(EINVAL);
      s->recverr = v != 0;
      return 0;
    }
    case RDS_CONG_MONITOR: {
      int v;
      if (!as_int(&v)) return fail(EINVAL);
      s->cong_monitor = v != 0;
      if (!s->cong_monitor) {
        std::lock_guard rlk(s->rs_recv_lock);
        s->cong_mask = s->cong_notify = 0;
        sock_update_poll_locked(s);
      }
      return 0;
    }
    case SO_TIMESTAMP_OLD:
    case SO_TIMESTAMP_NEW:
      return set_tstamp(true);
    case SO_RDS_MSG_RXPATH_LATENCY: {
      // net/rds recv.c rds_recv_track_latency: every misuse is EFAULT.
      rds_rx_trace_so t;
      if (!optval || optlen != sizeof t) return fail(EFAULT);
      std::memcpy(&t, optval, sizeof t);
      if (t.rx_traces > RDS_MSG_RX_DGRAM_TRACE_MAX) return fail(EFAULT);
      std::lock_guard rlk(s->rs_recv_lock);
      for (int i = 0; i < t.rx_traces; ++i)
        if (t.rx_trace_pos[i] >= RDS_MSG_RX_DGRAM_TRACE_MAX) {
          s->rx_traces = 0;
          return fail(EFAULT);
        }
      s->rx_traces = t.rx_traces;
      std::memcpy(s->rx_trace_pos, t.rx_trace_pos, sizeof s->rx_trace_pos);
      return 0;
    }
    case SO_RDS_TRANSPORT: {
      int v;
      if (!optval || optlen != sizeof(int)) return fail(EINVAL);
      std::memcpy(&v, optval, sizeof v);
      if (s->bound) return fail(EOPNOTSUPP);  // a transport is attached at bind
      if (v == RDS_TRANS_IB) return 0;        // ours is a verbs transport
      if (v == RDS_TRANS_TCP) return fail(ENOPROTOOPT);
      return fail(EINVAL);
    }
    default:
      return fail(ENOPROTOOPT);
  }
}

SV_EXPORT int svrds_getsockopt(int fd, int level, int optname, void* optval, socklen_t* optlen) {
  std::lock_guard lk(g().mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  if (!optlen) return fail(EFAULT);
  if (level == SOL_RDS && optname >= RDS_INFO_FIRST && optname <= RDS_INFO_LAST) {
    // net/rds info.c: a zero length probes the size (ENOSPC + the bytes needed), whatever
    // optval is; lengths that could wrap are EINVAL.
    if (*optlen > static_cast<socklen_t>(INT_MAX) - 4095) return fail(EINVAL);
    if (!optval && *optlen) return fail(EFAULT);
    const int r = info_get(optname, optval, optlen);
    return r < 0 ? fail(-r) : r;
  }
  auto put_int = [&](int v) {
    if (*optlen < sizeof(int)) return fail(EINVAL);
    if (!optval) return fail(EFAULT);
    std::memcpy(optval, &v, sizeof v);
    *optlen = sizeof(int);
    return 0;
  };
  if (level == SOL_SOCKET) {
    if (optname == SO_SNDBUF) return put_int(static_cast<int>(s->sndbuf * 2));
    if (optname == SO_RCVBUF) return put_int(static_cast<int>(s->rcvbuf * 2));
    if (optname == SO_TYPE) return put_int(SOCK_SEQPACKET);
    if (optname == SO_DOMAIN) return put_int(AF_RDS);
    if (optname == SO_ERROR) return put_int(0);
    if (optname == SO_ZEROCOPY) return put_int(s->zerocopy);
    if (optname == SO_TIMESTAMP_OLD) return put_int(s->rcvtstamp && !s->tstamp_new);
    if (optname == SO_TIMESTAMP_NEW) return put_int(s->rcvtstamp && s->tstamp_new);
    return fail(ENOPROTOOPT);
  }
  if (level != SOL_RDS) return fail(ENOPROTOOPT);
  if (optname == RDS_RECVERR) return put_int(s->recverr);
  if (optname == SO_RDS_TRANSPORT) return put_int(s->bound ? RDS_TRANS_IB : RDS_TRANS_NONE);
  return fail(ENOPROTOOPT);
}

SV_EXPORT int svrds_getsockname(int fd, sockaddr* addr, socklen_t* len) {
  std::lock_guard lk(g().mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  if (s->v6) {
    std::memcpy(addr, &s->bound6, std::min<size_t>(*len, sizeof s->bound6));
    *len = sizeof s->bound6;
    return 0;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (s->bound) a = s->bound_addr;
  std::memcpy(addr, &a, std::min<size_t>(*len, sizeof a));
  *len = sizeof a;
  return 0;
}

SV_EXPORT int svrds_getpeername(int fd, sockaddr* addr, socklen_t* len) {
  std::lock_guard lk(g().mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  if (!s->connected) return fail(ENOTCONN);
  std::memcpy(addr, &s->conn_addr, std::min<size_t>(*len, sizeof s->conn_addr));
  *len = sizeof s->conn_addr;
  return 0;
}

SV_EXPORT int svrds_close(int fd) {
  if (fd >= 0 && fd < kMaxFd && g_is_rds[fd].load() == kInherited) {
    g_is_rds[fd] = 0;
    return raw_close(fd);
  }
  std::lock_guard lk(g().mu);
  QuietPosts quiet;  // the acks it flushes, the maps it sends
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  // Closing cancels what this socket still has queued (rds(7) "Reliability").
  drop_to(s, nullptr, false);
  // What it received counts as delivered (rds-api.md §5): tell the senders now rather than
  // after the ack delay, in case the process is about to exit.
  flush_acks_locked();
  for (auto& [k, c] : g().conns)
    for (auto* q : {&c->send_q, &c->retrans, &c->op_wait, &c->zc_retiring})
      for (Message* m : *q)
        if (m->sock == s) m->sock = nullptr;
  for (auto* q : directory_queues())
    for (Message* m : *q)
      if (m->sock == s) m->sock = nullptr;
  std::vector<uint32_t> keys;
  for (auto& [k, mr] : s->mrs) keys.push_back(k);
  for (uint32_t k : keys) free_mr(s, k);
  if (s->bound) registry_release(s->lock_fd, s->bound_addr);
  if (s->bound && !s->v6)
    g().bound_v4.erase(bound_key(s->bound_addr.sin_addr, s->bound_addr.sin_port));
  int lib_fd, app_fd;
  {
    // A receive or a poll in another thread sees it closed (and its descriptors gone) or
    // not at all.
    std::lock_guard rlk(s->rs_recv_lock);
    s->closing = true;
    s->rq.clear();
    s->rcv_bytes = 0;
    s->congested = false;  // a closed socket frees its port's congestion bit
    lib_fd = s->lib_fd;
    app_fd = s->app_fd;
    s->lib_fd = s->app_fd = -1;
  }
  cong_sync_port(s);
  sock_table_remove(fd);
  raw_close(lib_fd);
  raw_close(app_fd);
  sock_wake(s);
  g_closed.push_back(s);
  return 0;
}
