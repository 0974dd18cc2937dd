// Unreliable Datagram queue pairs between softverbs peers, one UDP datagram per message
// (wire/ud.h has the format).
//
// Addressing: each UD QP owns a UDP socket and its QPN is (UDP port << 8) | 0xFF, so an
// address handle's GID (an IP address, engine/device.h) and a remote QPN name a socket with
// no directory in between, across processes and hosts. RC QPNs never end in 0xFF
// (iw_cm.cc), so the two kinds share one QPN space per process.
//
// Semantics follow IBA chapter 9/10 for UD, as rxe implements them:
//   - a Send completes once its datagram is handed to the kernel; nothing is acknowledged;
//   - a message longer than the port MTU puts nothing on the wire and completes successfully
//     (C10-93.1.1), as on rxe;
//   - a receiver drops, and counts, datagrams that are malformed, not for its QPN, carry
//     another P_Key or a Q_Key that is not the QP's (C9-38..40), or arrive while the QP is
//     not in RTR or later;
//   - the receive buffer starts with the 40-byte GRH; too small a buffer completes with
//     IBV_WC_LOC_LEN_ERR and a buffer failing its key check with IBV_WC_LOC_PROT_ERR, both
//     moving the QP to ERR (mlx5 and rxe do the same).
// One departure, in the user's favour: with no receive posted we stop reading instead of
// dropping, and the socket's buffer holds datagrams until one is (an adapter drops them).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/app_memory.h"
#include "engine/iw_cm.h"
#include "engine/log.h"
#include "engine/qp.h"
#include "wire/ud.h"

namespace sv::engine {
namespace {

constexpr size_t kRxBufLen = wire::kUdMaxHdrLen + kUdMtu + 4;  // + BTH PadCnt
constexpr int kRxBudget = 64;  // datagrams per pass: the progress thread serves others too

int open_socket(uint16_t* port, bool* dual_stack) {
  int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool v6 = fd >= 0;
  if (v6) {
    const int off = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      fd = -1;
      v6 = false;
    }
  }
  if (fd < 0) {  // no IPv6 on this host
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      const int e = errno;
      close(fd);
      return -e;
    }
  }
  // The destination address goes into the GRH.
  const int on = 1;
  setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on);
  if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on);
  // Room for a burst while the application reposts receives (the kernel caps it at rmem_max).
  const int rcvbuf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  *port = transport::local_addr(fd).port();
  *dual_stack = v6;
  return fd;
}

// The datagram's destination address, from IP_PKTINFO / IPV6_PKTINFO.
ibv_gid dest_gid(msghdr& m) {
  ibv_gid g{};
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      in_pktinfo pi;
      std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
      g.raw[10] = g.raw[11] = 0xff;
      std::memcpy(&g.raw[12], &pi.ipi_addr, 4);
      return g;
    }
    if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
      in6_pktinfo pi;
      std::memcpy(&pi, CMSG_DATA(c), sizeof pi);
      std::memcpy(g.raw, &pi.ipi6_addr, 16);
      return g;
    }
  }
  return g;
}

// Where a datagram to (dgid, port) goes. A dual-stack socket takes the GID as it is (an IPv4
// address as ::ffff:a.b.c.d); an IPv4-only one only IPv4 GIDs. False: no such address.
bool dest_addr(const Qp* qp, const ibv_gid& dgid, uint16_t port, transport::SockAddr& to) {
  if (!qp->ud_dual_stack) {
    if (!gid_to_addr(dgid, to)) return false;
    to.set_port(port);
    return true;
  }
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  std::memcpy(&a.sin6_addr, dgid.raw, 16);
  to = transport::SockAddr::from(reinterpret_cast<sockaddr*>(&a));
  return true;
}

// True when a receive WQE is waiting; otherwise marks RX stalled under the same lock, so a
// post_recv either is seen here or sees the stall (and restarts RX).
bool recv_ready(Qp* qp) {
  if (qp->srq) {
    std::lock_guard lk(qp->srq->mu);
    if (qp->srq->count) return true;
    qp->rx_stalled = true;
    return false;
  }
  std::lock_guard lk(qp->rq_mu);
  if (qp->rq_count) return true;
  qp->rx_stalled = true;
  return false;
}

void drop(Qp* qp, const char* why) {
  stats::add(qp->stats, stats::Ctr::ud_dropped);
  SV_DBG("qp %u: datagram dropped: %s", qp->qpn(), why);
}

// One datagram in ud_rxbuf: validate, place, complete. False if the QP went to error.
bool deliver(Qp* qp, size_t n, const transport::SockAddr& from, const ibv_gid& to) {
  wire::UdHeader h;
  size_t hdr_len = 0, len = 0;
  const std::byte* p = qp->ud_rxbuf.data();
  const wire::UdError e = wire::decode_ud_header(p, n, h, &hdr_len, &len);
  if (e != wire::UdError::ok) {
    drop(qp, wire::to_string(e));
    return true;
  }
  const char* refused = nullptr;
  if (h.dest_qp != qp->qpn())
    refused = "another QPN";
  else if (h.pkey != wire::kDefaultPkey)
    refused = "P_Key";
  else if (h.qkey != qp->attr.qkey)
    refused = "Q_Key violation";
  if (refused) {
    drop(qp, refused);
    return true;
  }
  RecvWqe w;
  std::array<ibv_sge, kMaxSge> sge;
  if (!take_recv(qp, w, sge)) {
    drop(qp, "SRQ emptied by another QP");
    return true;
  }
  stats::add(qp->stats, stats::Ctr::rcvd_pkts);
  stats::add(qp->stats, stats::Ctr::rcvd_sends);
  stats::add(qp->stats, stats::Ctr::rcvd_bytes, n);
  const uint32_t total = static_cast<uint32_t>(wire::kGrhLen + len);
  if (total > w.length) {
    SV_INFO("qp %u: %u-byte UD message for a %u-byte receive", qp->qpn(), total, w.length);
    qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, true, IBV_EVENT_QP_FATAL,
                 [&] { complete_recv_ud(qp, w, IBV_WC_LOC_LEN_ERR, 0, 0, false, 0, false); });
    return false;
  }
  wire::Grh g;
  const ibv_gid src = addr_to_gid(from);
  std::memcpy(g.sgid, src.raw, 16);
  std::memcpy(g.dgid, to.raw, 16);
  g.hop_limit = 64;
  std::array<std::byte, wire::kGrhLen> grh;
  wire::encode_grh(g, static_cast<uint32_t>(len), grh.data());
  bool keys_ok;
  {
    // Checked and placed under one read guard: no deregistration in between.
    auto guard = KeyTable::get().read_guard();
    keys_ok = recv_keys_ok_guarded(qp, w);
    if (keys_ok) {
      copy_to_sgl(w.sge, w.num_sge, 0, grh.data(), wire::kGrhLen);
      copy_to_sgl(w.sge, w.num_sge, wire::kGrhLen, p + hdr_len, static_cast<uint32_t>(len));
    }
  }
  if (!keys_ok) {
    qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, true, IBV_EVENT_QP_ACCESS_ERR,
                 [&] { complete_recv_ud(qp, w, IBV_WC_LOC_PROT_ERR, 0, 0, false, 0, false); });
    return false;
  }
  const bool v4 = wire::gid_is_v4(g.sgid) && wire::gid_is_v4(g.dgid);
  complete_recv_ud(qp, w, IBV_WC_SUCCESS, total, h.src_qp, h.has_imm, h.imm_be, h.solicited,
                   v4 ? kUdL3Ipv4 : kUdL3Ipv6);
  return true;
}

}  // namespace

int ud_open(Qp* qp) {
  uint16_t port = 0;
  bool dual = false;
  const int fd = open_socket(&port, &dual);
  if (fd < 0) return -fd;
  const uint32_t qpn = (uint32_t{port} << 8) | kUdQpnLow;
  if (!oob::add_qpn(qpn, qp)) {  // cannot happen: the port is ours alone
    close(fd);
    return EBUSY;
  }
  qp->ud = true;
  qp->ud_fd = fd;
  qp->ud_dual_stack = dual;
  qp->ud_rxbuf.resize(kRxBufLen);
  qp->qpx.qp_base.qp_num = qpn;
  qp->qpx.qp_base.handle = qpn;
  Progress::get().run_sync([qp] {
    Progress::get().add(qp->ud_fd, EPOLLIN, qp->io.get());
    qp->ud_registered = true;
    qp->ud_events = EPOLLIN;
  });
  return 0;
}

void ud_close(Qp* qp) {
  Progress::get().run_sync([qp] {
    if (qp->ud_fd < 0) return;
    if (qp->ud_registered) Progress::get().del(qp->ud_fd);
    qp->ud_registered = false;
    close(qp->ud_fd);
    qp->ud_fd = -1;
  });
}

void ud_update_interest(Qp* qp) {
  auto apply = [qp] {
    if (qp->ud_fd < 0 || !qp->ud_registered) return;
    const uint32_t ev = qp->rx_stalled || qp->rx_yielded ? 0u : static_cast<uint32_t>(EPOLLIN);
    if (ev != qp->ud_events) Progress::get().mod(qp->ud_fd, ev, qp->io.get());
    qp->ud_events = ev;
  };
  if (Progress::get().on_thread()) {
    apply();
  } else {
    Progress::get().post([ref = QpRef(qp), apply] {
      if (ref.live()) apply();
    });
  }
}

void ud_rx_run_locked(Qp* qp) {
  if (qp->ud_fd < 0) return;
  qp->rx_stalled = false;
  for (int budget = kRxBudget; budget; --budget) {
    const ibv_qp_state st = qp->state.load(std::memory_order_acquire);
    // IBA 10.3.1: a QP below RTR, or in ERR, takes nothing; what arrives is dropped.
    const bool accept =
        st == IBV_QPS_RTR || st == IBV_QPS_RTS || st == IBV_QPS_SQD || st == IBV_QPS_SQE;
    if (accept && !recv_ready(qp)) return;
    sockaddr_storage from{};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(in_pktinfo))];
    iovec iov{qp->ud_rxbuf.data(), qp->ud_rxbuf.size()};
    msghdr m{};
    m.msg_name = &from;
    m.msg_namelen = sizeof from;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    const ssize_t n = recvmsg(qp->ud_fd, &m, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: drained
    }
    if (!accept) {
      drop(qp, "QP not ready to receive");
      continue;
    }
    if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
      drop(qp, "longer than the MTU");
      continue;
    }
    transport::SockAddr src = transport::SockAddr::from(reinterpret_cast<sockaddr*>(&from));
    if (!deliver(qp, static_cast<size_t>(n), src, dest_gid(m))) return;
  }
  // Budget spent with more waiting: come back through epoll (still readable).
}

void ud_tx_locked(Qp* qp) {
  if (qp->state.load() != IBV_QPS_RTS || qp->ud_tx_failed) return;
  const uint32_t mask = qp->cap.max_send_wr - 1;
  for (; qp->sq_tx != qp->sq_head + qp->sq_count; ++qp->sq_tx) {
    SendWqe& w = qp->sq[qp->sq_tx & mask];
    w.state = WqeState::done;
    if (w.length > kUdMtu) continue;  // C10-93.1.1: no packet, no error
    std::array<std::byte, wire::kUdMaxHdrLen> hdr;
    wire::UdHeader h;
    h.has_imm = w.opcode == IBV_WR_SEND_WITH_IMM;
    h.imm_be = w.imm_or_inv;
    h.solicited = (w.flags & IBV_SEND_SOLICITED) != 0;
    h.dest_qp = w.remote_qpn;
    h.psn = qp->ud_psn++ & 0xFFFFFF;
    // C10-15: a Q_Key with the high-order bit set means "use the QP's own".
    h.qkey = (w.remote_qkey & 0x80000000u) ? qp->attr.qkey : w.remote_qkey;
    h.src_qp = qp->qpn();
    std::array<iovec, 1 + kMaxSge> iov;
    iov[0] = {hdr.data(), wire::encode_ud_header(h, hdr.data())};
    size_t niov = 1;
    {
      auto& kt = KeyTable::get();
      auto g = kt.read_guard();
      bool ok = true;
      for (uint32_t i = 0; i < w.num_sge; ++i) {
        if (!w.sge[i].length) continue;
        std::byte* p = reinterpret_cast<std::byte*>(w.sge[i].addr);
        if (!(w.flags & IBV_SEND_INLINE) &&
            kt.check(w.sge[i].lkey, qp->pd, w.sge[i].addr, w.sge[i].length, 0, false, &p) !=
                AccessResult::ok) {
          ok = false;
          break;
        }
        iov[niov++] = {p, w.sge[i].length};
      }
      if (!ok) {
        // The QP goes to ERR (qp_set_error takes tx_mu, which we hold: from the progress
        // thread); nothing after this WQE leaves meanwhile.
        w.status = IBV_WC_LOC_PROT_ERR;
        qp->ud_tx_failed = true;
        ++qp->sq_tx;
        Progress::get().post([ref = QpRef(qp)] {
          if (ref.live()) qp_set_error(ref.get(), IBV_WC_WR_FLUSH_ERR, true);
        });
        break;
      }
      transport::SockAddr to;
      if (!dest_addr(qp, w.dgid, static_cast<uint16_t>(w.remote_qpn >> 8), to)) continue;
      msghdr m{};
      m.msg_name = &to.ss;
      m.msg_namelen = to.len;
      m.msg_iov = iov.data();
      m.msg_iovlen = niov;
      const ssize_t n = transport::sys_sendmsg(qp->ud_fd, &m, MSG_DONTWAIT);
      if (n < 0) {
        // Unreliable by definition: a full socket buffer or an unreachable host loses the
        // datagram, and the Send still completes successfully (IBA 9.8.2).
        SV_DBG("qp %u: UD send failed: %s", qp->qpn(), std::strerror(errno));
        continue;
      }
      stats::add(qp->stats, stats::Ctr::sent_pkts);
      stats::add(qp->stats, stats::Ctr::sent_sends);
      stats::add(qp->stats, stats::Ctr::sent_bytes, static_cast<uint64_t>(n));
    }
  }
  complete_sq_locked(qp);
}

void qp_rx_locked(Qp* qp) {
  if (qp->ud)
    ud_rx_run_locked(qp);
  else
    rx_run_locked(qp);
}

}  // namespace sv::engine
