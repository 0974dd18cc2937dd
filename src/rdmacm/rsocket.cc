// rsocket descriptors, connection set-up, options, shutdown and close (rsocket_impl.h).
//
// Decisions where rdma-core's behaviour is a thread we do not have:
// - rdma-core runs a listen thread that completes each connection before raccept; here raccept
//   itself takes the CONNECT_REQUEST, answers it and waits for ESTABLISHED, and a listener is
//   readable (rpoll) while its rdma_cm channel holds an event. The connecting side's
//   rconnect therefore completes when the server accepts, as it does in rdma-core once the
//   listen thread has run.
// - The descriptor is an eventfd made inside the call, so it is numbered above the placeholder
//   librspreload opened first (the v44 select() mapping bug, docs/rsockets-protocol.md §6.4).
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <memory>

#include "rdmacm/rsocket_impl.h"
#include "transport/tcp.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

namespace sv::rsock {

namespace {

void free_socket(Rs* s);

// A socket, torn down by free_socket when its last reference goes (rsocket_impl.h).
RsRef make_socket(int domain) {
  const int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return nullptr;
  if (fd >= kMaxFds) {
    close(fd);
    errno = EMFILE;
    return nullptr;
  }
  RsRef s(new Rs(), free_socket);
  s->fd = fd;
  s->domain = domain;
  return s;
}

bool open_cm(Rs* s) {
  if (s->cm) return true;
  s->cm_ch = rdma_create_event_channel();
  if (!s->cm_ch) return false;
  sv::transport::set_nonblock(s->cm_ch->fd, true);
  if (rdma_create_id(s->cm_ch, &s->cm, s, RDMA_PS_TCP)) {
    rdma_destroy_event_channel(s->cm_ch);
    s->cm_ch = nullptr;
    return false;
  }
  return true;
}

void close_cm(Rs* s) {
  if (s->cm) {
    // Events still queued for the id are acked (rdma_destroy_id waits for that).
    // Requests a listener never accepted are refused, and their ids freed.
    rdma_cm_event* ev = nullptr;
    while (rdma_get_cm_event(s->cm_ch, &ev) == 0) {
      rdma_cm_id* req = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
      rdma_ack_cm_event(ev);
      if (req) {
        rdma_reject(req, nullptr, 0);
        rdma_destroy_id(req);
      }
    }
    rdma_destroy_id(s->cm);
    s->cm = nullptr;
  }
  if (s->cm_ch) rdma_destroy_event_channel(s->cm_ch);
  s->cm_ch = nullptr;
}

// Drives a connect as far as the queued events take it; blocking: until it ends.
int connect_progress_locked(Rs* s, std::unique_lock<std::mutex>& lk, bool block) {
  while (s->state == State::connecting) {
    connect_poll_locked(s);  // what is queued
    if (s->state != State::connecting) break;
    if (!block) return fail(EINPROGRESS);
    if (sleep_once(s, lk, -1) < 0) return -1;
  }
  if (s->state == State::connected) return 0;
  const int e = s->err ? s->err : ECONNREFUSED;
  return fail(e);
}

void inherit(Rs* child, const Rs* l) {
  child->sbuf_size = l->sbuf_size;
  child->rbuf_size = l->rbuf_size;
  child->sq_size = l->sq_size;
  child->rq_size = l->rq_size;
  child->inline_size = l->inline_size;
  child->iomap_size = l->iomap_size;
  child->nodelay = l->nodelay;
  child->keepalive = l->keepalive;
}

// Runs where the last reference goes, often as a call returns: its errno is the call's. The
// descriptor closes last: while it is open, no new rsocket can take its number, and with it
// this socket's table slot.
void free_socket(Rs* s) {
  const int e = errno;
  destroy_ep(s);
  close_cm(s);
  close(s->fd);
  delete s;
  errno = e;
}

// One CONNECT_REQUEST: a new rsocket, answered and established, or nullptr (rejected).
RsRef accept_one(Rs* l, rdma_cm_event* ev) {
  rdma_cm_id* cid = ev->id;
  const auto peer = rs::decode_conn_data(static_cast<const std::byte*>(ev->param.conn.private_data),
                                         ev->param.conn.private_data_len);
  rdma_conn_param req = ev->param.conn;
  rdma_ack_cm_event(ev);
  if (!peer) {  // rs_accept: only version 1 rsockets
    rdma_reject(cid, nullptr, 0);
    rdma_destroy_id(cid);
    return nullptr;
  }
  RsRef c = make_socket(l->domain);
  if (!c) {
    rdma_reject(cid, nullptr, 0);
    rdma_destroy_id(cid);
    return nullptr;
  }
  inherit(c.get(), l);
  c->cm_ch = rdma_create_event_channel();
  if (!c->cm_ch || rdma_migrate_id(cid, c->cm_ch)) {
    rdma_reject(cid, nullptr, 0);
    rdma_destroy_id(cid);
    return nullptr;
  }
  sv::transport::set_nonblock(c->cm_ch->fd, true);
  c->cm = cid;
  cid->context = c.get();
  if (!create_ep(c.get())) {
    rdma_reject(cid, nullptr, 0);
    return nullptr;
  }
  save_conn_data(c.get(), *peer);
  std::byte pd[rs::kConnDataLen];
  rs::encode_conn_data(local_conn_data(c.get()), pd);
  rdma_conn_param p = conn_param(pd);
  // The request's resources, swapped (rs_accept reuses the event's parameters).
  p.responder_resources = req.initiator_depth;
  p.initiator_depth = req.responder_resources;
  if (rdma_accept(cid, &p)) return nullptr;  // c goes with its reference (free_socket)
  // Wait for ESTABLISHED on the child's own channel.
  for (;;) {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(c->cm_ch, &e) == 0) {
      const auto type = e->event;
      rdma_ack_cm_event(e);
      if (type == RDMA_CM_EVENT_ESTABLISHED) break;
      return nullptr;
    }
    // Bounded: a peer that never completes the handshake cannot hold raccept for longer.
    pollfd pf{c->cm_ch->fd, POLLIN, 0};
    const int r = poll(&pf, 1, 10000);
    if (r == 0 || (r < 0 && errno != EINTR)) return nullptr;
  }
  c->state = State::connected;
  c->readable = c->writable = true;
  return c;
}

void copy_addr(const sockaddr* a, sockaddr* out, socklen_t* len) {
  const socklen_t n = a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  std::memcpy(out, a, std::min(n, *len));
  *len = n;
}

bool opening(const Rs* s) {
  return s->state != State::init && s->state != State::bound && s->state != State::listening;
}

}  // namespace

}  // namespace sv::rsock

using namespace sv::rsock;

SV_EXPORT int rsocket(int domain, int type, int protocol) {
  const int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (domain != AF_INET && domain != AF_INET6) return fail(EAFNOSUPPORT);
  // Datagram rsockets (UD) are not provided: librspreload falls back to a real socket.
  if (base != SOCK_STREAM || (protocol && protocol != IPPROTO_TCP)) return fail(ENOTSUP);
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l) ibv_free_device_list(l);
  if (n <= 0) return fail(ENODEV);
  RsRef s = make_socket(domain);
  if (!s) return -1;
  s->nonblock = type & SOCK_NONBLOCK;
  s->fd_flags = type & SOCK_CLOEXEC ? FD_CLOEXEC : 0;
  publish(s);
  return s->fd;
}

SV_EXPORT int rbind(int fd, const sockaddr* addr, socklen_t addrlen) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (!addr || addrlen < sizeof(sockaddr_in)) return fail(EINVAL);
  std::lock_guard lk(s->mu);
  if (s->state != State::init) return fail(EINVAL);
  if (!open_cm(s)) return -1;
  if (rdma_bind_addr(s->cm, const_cast<sockaddr*>(addr))) return -1;
  s->state = State::bound;
  return 0;
}

SV_EXPORT int rlisten(int fd, int backlog) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  std::lock_guard lk(s->mu);
  if (s->state == State::listening) return 0;
  if (s->state != State::init && s->state != State::bound) return fail(EINVAL);
  if (!open_cm(s)) return -1;
  if (s->state == State::init) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(s->domain);
    if (rdma_bind_addr(s->cm, reinterpret_cast<sockaddr*>(&any))) return -1;
  }
  if (rdma_listen(s->cm, backlog)) return -1;
  s->state = State::listening;
  return 0;
}

SV_EXPORT int raccept(int fd, sockaddr* addr, socklen_t* addrlen) {
  const RsRef ref = get(fd);
  Rs* l = ref.get();
  if (!l) return fail(EBADF);
  std::unique_lock lk(l->mu);
  if (l->state != State::listening) return fail(EINVAL);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(l->cm_ch, &ev) == 0) {
      if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(ev);
        continue;
      }
      const RsRef c = accept_one(l, ev);
      if (!c) continue;
      publish(c);
      if (addr && addrlen) copy_addr(rdma_get_peer_addr(c->cm), addr, addrlen);
      return c->fd;
    }
    if (l->nonblock) return fail(EAGAIN);
    if (sleep_once(l, lk, -1) < 0) return -1;
  }
}

SV_EXPORT int rconnect(int fd, const sockaddr* addr, socklen_t addrlen) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (!addr || addrlen < sizeof(sockaddr_in)) return fail(EINVAL);
  std::unique_lock lk(s->mu);
  switch (s->state) {
    case State::init:
    case State::bound:
      break;
    case State::connecting:
      return connect_progress_locked(s, lk, !s->nonblock) == 0 ? 0
             : errno == EINPROGRESS                            ? fail(EALREADY)
                                                               : -1;
    case State::connected:
      return fail(EISCONN);
    case State::listening:
      return fail(EINVAL);
    default:
      return fail(ENOTCONN);  // rs_connect_error / disconnected: not reusable
  }
  if (!open_cm(s)) return -1;
  sockaddr_storage dst{};
  std::memcpy(&dst, addr, std::min<size_t>(addrlen, sizeof dst));
  sockaddr* src = s->state == State::bound ? rdma_get_local_addr(s->cm) : nullptr;
  if (rdma_resolve_addr(s->cm, src, reinterpret_cast<sockaddr*>(&dst), 2000)) return -1;
  s->state = State::connecting;
  return connect_progress_locked(s, lk, !s->nonblock);
}

SV_EXPORT int rshutdown(int fd, int how) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(EINVAL);
  std::unique_lock lk(s->mu);
  if (s->state != State::connected && s->state != State::disconnected) return fail(ENOTCONN);
  pump_locked(s);
  rs::Ctrl msg;
  bool send = true;
  if (how == SHUT_RD) {
    s->readable = false;
    send = !s->writable && s->state == State::connected;
    msg = rs::Ctrl::disconnect;
  } else if (how == SHUT_WR) {
    msg = s->readable ? rs::Ctrl::shutdown : rs::Ctrl::disconnect;
    send = s->writable;
    s->writable = false;
  } else {
    msg = rs::Ctrl::disconnect;
    send = s->state == State::connected;
    s->readable = s->writable = false;
  }
  if (send && s->state == State::connected) {
    // Wait for a control slot, send, then for every send to complete (rs_conn_all_sends_done),
    // so what the application wrote is delivered before it closes.
    auto slot = [s] { return s->ctrl_wrs >= 1 || s->state != State::connected; };
    if (wait_locked(s, lk, slot, false) == 0 && s->state == State::connected)
      post_ctrl_locked(s, msg);
    auto idle = [s] { return sends_idle_locked(s) || s->state == State::error; };
    wait_locked(s, lk, idle, false);
    if (msg == rs::Ctrl::disconnect && s->state == State::connected) s->state = State::disconnected;
  }
  if (s->waiters) signal_waiters(s);
  return 0;
}

SV_EXPORT int rclose(int fd) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  {
    std::unique_lock lk(s->mu);
    const bool shut = s->state == State::connected;
    lk.unlock();
    if (shut) rshutdown(fd, SHUT_RDWR);
  }
  // Out of the table first: a call that starts now gets EBADF, as after close(2). A thread
  // asleep on the socket is woken and leaves with EBADF (sleep_once); the socket goes with
  // the last reference, ours or that thread's.
  if (!unpublish(s)) return fail(EBADF);  // another thread's rclose took it first
  {
    std::lock_guard lk(s->mu);
    s->closed = true;
  }
  signal_waiters(s);
  return 0;
}

SV_EXPORT int rgetpeername(int fd, sockaddr* addr, socklen_t* addrlen) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (!addr || !addrlen) return fail(EFAULT);
  std::lock_guard lk(s->mu);
  if (!s->cm || (s->state != State::connected && s->state != State::disconnected))
    return fail(ENOTCONN);
  copy_addr(rdma_get_peer_addr(s->cm), addr, addrlen);
  return 0;
}

// rrecv (rsocket_data.cc) with the peer's address, which a stream socket's is.
SV_EXPORT ssize_t rrecvfrom(int fd, void* buf, size_t len, int flags, sockaddr* src,
                            socklen_t* addrlen) {
  const ssize_t n = rrecv(fd, buf, len, flags);
  if (n >= 0 && src && addrlen) rgetpeername(fd, src, addrlen);
  return n;
}

SV_EXPORT int rgetsockname(int fd, sockaddr* addr, socklen_t* addrlen) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (!addr || !addrlen) return fail(EFAULT);
  std::lock_guard lk(s->mu);
  if (!s->cm) {
    sockaddr_storage any{};
    any.ss_family = static_cast<sa_family_t>(s->domain);
    copy_addr(reinterpret_cast<sockaddr*>(&any), addr, addrlen);
    return 0;
  }
  copy_addr(rdma_get_local_addr(s->cm), addr, addrlen);
  return 0;
}

SV_EXPORT int rsetsockopt(int fd, int level, int optname, const void* optval, socklen_t optlen) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (!optval && optlen) return fail(EFAULT);
  if (optlen < sizeof(int)) return fail(EINVAL);
  int v;
  std::memcpy(&v, optval, sizeof v);
  std::lock_guard lk(s->mu);
  const bool buffers_made = !s->sbuf.empty();
  auto qp_size = [](int x) {
    return static_cast<uint32_t>(std::clamp<int64_t>(x, kMinQpSize, kMaxQpSize));
  };
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
          s->reuseaddr = v != 0;  // rdma_cm listeners always reuse (cma.cc)
          return 0;
        case SO_KEEPALIVE:
          s->keepalive = v != 0;
          return 0;
        case SO_RCVBUF:
        case SO_SNDBUF: {
          // Like TCP, the kernel-visible size is twice the request (rsocket.c does the same);
          // only before the buffers exist.
          if (buffers_made || v <= 0) return 0;
          const uint32_t b =
              static_cast<uint32_t>(std::clamp<int64_t>(int64_t{v} * 2, 4096, kMaxBuf)) & ~1u;
          (optname == SO_RCVBUF ? s->rbuf_size : s->sbuf_size) = b;
          return 0;
        }
        case SO_LINGER:
        case SO_OOBINLINE:
        case SO_RCVTIMEO:
        case SO_SNDTIMEO:
        case SO_PRIORITY:
          return 0;
        default:
          return fail(ENOPROTOOPT);
      }
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:
          s->nodelay = v != 0;  // every rsend goes out at once anyway
          return 0;
        case TCP_MAXSEG:
        case TCP_KEEPIDLE:
        case TCP_KEEPINTVL:
        case TCP_KEEPCNT:
          return 0;
        default:
          return fail(ENOPROTOOPT);
      }
    case IPPROTO_IPV6:
      if (optname == IPV6_V6ONLY) {
        s->v6only = v != 0;
        return 0;
      }
      return fail(ENOPROTOOPT);
    case SOL_RDMA:
      if (opening(s)) return fail(EINVAL);  // rs_opening: too late to resize
      switch (optname) {
        case RDMA_SQSIZE:
          s->sq_size = qp_size(v);
          return 0;
        case RDMA_RQSIZE:
          s->rq_size = qp_size(v);
          return 0;
        case RDMA_INLINE:
          s->inline_size = static_cast<uint32_t>(std::clamp(v, 0, 256));
          return 0;
        case RDMA_IOMAPSIZE:
          s->iomap_size = rs::iomap_scale_to_value(
              rs::iomap_value_to_scale(static_cast<uint32_t>(std::clamp(v, 0, 0x7f00))));
          return 0;
        default:
          return fail(ENOPROTOOPT);  // RDMA_ROUTE: IB path records, none on iWARP
      }
    default:
      return fail(ENOPROTOOPT);
  }
}

SV_EXPORT int rgetsockopt(int fd, int level, int optname, void* optval, socklen_t* optlen) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  if (!optval || !optlen) return fail(EFAULT);
  std::lock_guard lk(s->mu);
  auto put_int = [&](int v) {
    if (*optlen < sizeof(int)) return fail(EINVAL);
    std::memcpy(optval, &v, sizeof v);
    *optlen = sizeof(int);
    return 0;
  };
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
          return put_int(s->reuseaddr);
        case SO_KEEPALIVE:
          return put_int(s->keepalive);
        case SO_RCVBUF:
          return put_int(static_cast<int>(s->rbuf_size));
        case SO_SNDBUF:
          return put_int(static_cast<int>(s->sbuf_size));
        case SO_TYPE:
          return put_int(SOCK_STREAM);
        case SO_DOMAIN:
          return put_int(s->domain);
        case SO_ACCEPTCONN:
          return put_int(s->state == State::listening);
        case SO_ERROR: {
          // Returned once, then cleared (SO_ERROR semantics).
          const int e = s->err;
          s->err = 0;
          return put_int(e);
        }
        default:
          return fail(ENOPROTOOPT);
      }
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_NODELAY:
          return put_int(s->nodelay);
        case TCP_MAXSEG:
          return put_int(static_cast<int>(kMaxXfer));
        case TCP_INFO: {
          // As rdma-core's HEAD: zeroed but for the state (iperf3 reads it every interval).
          tcp_info ti{};
          ti.tcpi_state = s->state == State::connected   ? TCP_ESTABLISHED
                          : s->state == State::listening ? TCP_LISTEN
                                                         : TCP_CLOSE;
          const socklen_t n = std::min<socklen_t>(*optlen, sizeof ti);
          std::memcpy(optval, &ti, n);
          *optlen = n;
          return 0;
        }
        default:
          return fail(ENOPROTOOPT);
      }
    case IPPROTO_IPV6:
      if (optname == IPV6_V6ONLY) return put_int(s->v6only);
      return fail(ENOPROTOOPT);
    case SOL_RDMA:
      switch (optname) {
        case RDMA_SQSIZE:
          return put_int(static_cast<int>(s->sq_size));
        case RDMA_RQSIZE:
          return put_int(static_cast<int>(s->rq_size));
        case RDMA_INLINE:
          return put_int(static_cast<int>(s->inline_size));
        case RDMA_IOMAPSIZE:
          return put_int(static_cast<int>(s->iomap_size));
        default:
          return fail(ENOPROTOOPT);
      }
    default:
      return fail(ENOPROTOOPT);
  }
}

SV_EXPORT int rfcntl(int fd, int cmd, ...) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return fail(EBADF);
  va_list ap;
  va_start(ap, cmd);
  const long arg = cmd == F_SETFL || cmd == F_SETFD ? va_arg(ap, long) : 0;
  va_end(ap);
  std::lock_guard lk(s->mu);
  switch (cmd) {
    case F_GETFL:
      return O_RDWR | (s->nonblock ? O_NONBLOCK : 0);
    case F_SETFL:
      s->nonblock = arg & O_NONBLOCK;
      return 0;
    case F_GETFD:
      return s->fd_flags;
    case F_SETFD:
      s->fd_flags = static_cast<int>(arg & FD_CLOEXEC);
      return 0;
    default:
      return fail(ENOSYS);
  }
}
