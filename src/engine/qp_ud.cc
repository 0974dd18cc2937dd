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
#include <net/if.h>
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

// ---- multicast ----------------------------------------------------------------------------
// A group is an IP multicast group: a multicast GID is an IPv4-mapped 224.0.0.0/4 address
// (RoCEv2's form, as rdma_cm makes it) or an IPv6 one (ff00::/8), as the kernel's
// rdma_is_multicast_addr says. Its datagrams go to one UDP port every host derives from the
// GID, where each attached QP has a socket joined to the group.
constexpr size_t kMaxMcastPerQp = 56;  // max_mcast_qp_attach, as rxe

bool mcast_group(const ibv_gid& g, transport::SockAddr& out) {
  static constexpr uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(g.raw, kV4Mapped, 12) == 0) {
    if ((g.raw[12] & 0xF0) != 0xE0) return false;
    uint32_t a;
    std::memcpy(&a, &g.raw[12], 4);
    out = transport::SockAddr::ipv4(a, 0);
    return true;
  }
  if (g.raw[0] != 0xff) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  std::memcpy(&a.sin6_addr, g.raw, 16);
  out = transport::SockAddr::from(reinterpret_cast<sockaddr*>(&a));
  return true;
}

// 28672..32767: below Linux's ephemeral ports, where the QPs' own sockets are.
uint16_t mcast_port(const ibv_gid& g) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (uint8_t b : g.raw) h = (h ^ b) * 16777619u;
  return static_cast<uint16_t>(0x7000 | (h & 0x0FFF));
}

bool same_ip(const transport::SockAddr& a, const transport::SockAddr& b) {
  return std::memcmp(addr_to_gid(a).raw, addr_to_gid(b).raw, 16) == 0;
}

// The interface that carries a local address; 0 if none does.
int ifindex_of(const transport::SockAddr& a) {
  for (const auto& h : transport::host_addresses())
    if (same_ip(h.addr, a)) return static_cast<int>(if_nametoindex(h.ifname.c_str()));
  return 0;
}

// The interfaces our GIDs are on: a group is joined on each.
std::vector<int> gid_interfaces() {
  std::vector<int> v;
  const Device* d = the_device();
  for (const auto& h : transport::host_addresses()) {
    bool ours = false;
    for (const auto& g : d->gid_addrs) ours |= same_ip(h.addr, g);
    const int i = ours ? static_cast<int>(if_nametoindex(h.ifname.c_str())) : 0;
    if (i > 0 && std::find(v.begin(), v.end(), i) == v.end()) v.push_back(i);
  }
  return v;
}

// A socket on the group's port, joined to the group on each of our interfaces, taking only
// that group's datagrams. -1 with *err set on failure.
int open_mcast(const Qp* qp, const transport::SockAddr& group, uint16_t port, int* err) {
  const bool v6 = qp->ud_dual_stack;
  if (!v6 && group.family() == AF_INET6) {
    *err = EINVAL;
    return -1;
  }
  const int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  const int on = 1, off = 0;
  // Every QP of every process attached to the group binds the same port.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int r;
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    r = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    r = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (r != 0) {
    *err = errno;
    close(fd);
    return -1;
  }
  setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on);
  // Without this, the port's socket gets the datagrams of every group some socket of the
  // host joined on that port (Linux's default), so groups sharing a port would mix.
  setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &off, sizeof off);
  if (v6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on);
    setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &off, sizeof off);
  }
  const int rcvbuf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  bool joined = false;
  int last = ENODEV;
  for (const int ifi : gid_interfaces()) {
    if (group.family() == AF_INET) {
      ip_mreqn m{};
      m.imr_multiaddr = reinterpret_cast<const sockaddr_in*>(&group.ss)->sin_addr;
      m.imr_ifindex = ifi;
      r = setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m);
    } else {
      ipv6_mreq m{};
      m.ipv6mr_multiaddr = reinterpret_cast<const sockaddr_in6*>(&group.ss)->sin6_addr;
      m.ipv6mr_interface = static_cast<unsigned>(ifi);
      r = setsockopt(fd, IPPROTO_IPV6, IPV6_ADD_MEMBERSHIP, &m, sizeof m);
    }
    if (r == 0)
      joined = true;
    else
      last = errno;
  }
  if (!joined) {
    *err = last;
    close(fd);
    return -1;
  }
  return fd;
}

// A group's datagrams for one attached QP.
struct McastIo : Progress::Handler {
  Qp* qp;
  int fd;
  McastIo(Qp* q, int f) : qp(q), fd(f) {}
  void on_event(uint32_t ev) override {
    if (ev & (EPOLLIN | EPOLLERR)) {
      std::lock_guard lk(qp->rx_mu);
      ud_rx_fd_locked(qp, fd, true);
    }
    qp_update_interest(qp);
  }
};

// A datagram for QPN 0xFFFFFF goes to the group its GID names, out of the interface of the
// AH's source GID. A GID that names no group sends nothing (a fabric drops a multicast QPN
// without a multicast address) and the Send still completes, as any UD Send. Caller holds
// tx_mu.
bool mcast_dest(Qp* qp, const SendWqe& w, transport::SockAddr& to) {
  transport::SockAddr group;
  if (!mcast_group(w.dgid, group) || !dest_addr(qp, w.dgid, mcast_port(w.dgid), to)) return false;
  if (qp->mcast_tx_sgid != w.sgid_index) {
    const Device* d = the_device();
    if (w.sgid_index >= d->gid_addrs.size()) return false;
    const transport::SockAddr& src = d->gid_addrs[w.sgid_index];
    const int ifi = ifindex_of(src);
    if (group.family() == AF_INET) {
      ip_mreqn m{};
      const ibv_gid sg = addr_to_gid(src);
      std::memcpy(&m.imr_address, &sg.raw[12], 4);  // our source address, if it is IPv4
      m.imr_ifindex = ifi;
      setsockopt(qp->ud_fd, IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m);
    } else {
      setsockopt(qp->ud_fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifi, sizeof ifi);
    }
    qp->mcast_tx_sgid = w.sgid_index;
  }
  return true;
}

// True when a receive WQE is waiting; otherwise marks RX stalled under the same lock, so a
// post_recv either is seen here or sees the stall (and restarts RX).
bool recv_ready(Qp* qp) {
  if (qp->srq) {
    std::lock_guard lk(qp->srq->mu);
    if (qp->srq->count) return true;
    qp->rx_stalled = true;
    // Its next post restarts us (srq_post_recv looks for the mark after its own mu).
    qp->srq->maybe_stalled.store(true, std::memory_order_seq_cst);
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
bool deliver(Qp* qp, size_t n, const transport::SockAddr& from, const ibv_gid& to, bool mcast) {
  wire::UdHeader h;
  size_t hdr_len = 0, len = 0;
  const std::byte* p = qp->ud_rxbuf.data();
  const wire::UdError e = wire::decode_ud_header(p, n, h, &hdr_len, &len);
  if (e != wire::UdError::ok) {
    drop(qp, wire::to_string(e));
    return true;
  }
  const char* refused = nullptr;
  if (h.dest_qp != (mcast ? kMcastQpn : qp->qpn()))
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
    for (auto& m : qp->mcast) {
      Progress::get().del(m->fd);
      close(m->fd);
    }
    qp->mcast.clear();
    qp->mcast_groups.store(0);
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
    // A group's datagrams wait in its socket too while no receive is posted.
    for (auto& m : qp->mcast) {
      if (ev != m->events) Progress::get().mod(m->fd, ev, m->io.get());
      m->events = ev;
    }
  };
  if (Progress::get().on_thread()) {
    apply();
  } else {
    Progress::get().post([ref = QpRef(qp), apply] {
      if (ref.live()) apply();
    });
  }
}

// Receives from fd (the QP's own socket, or one of its multicast groups'). Caller holds rx_mu.
void ud_rx_fd_locked(Qp* qp, int fd, bool mcast) {
  if (fd < 0) return;
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
    const ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT);
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
    if (qp->faults) [[unlikely]] {
      fault::Fired fx;  // on the way in, only drop applies (wire/fault_spec.h)
      if (qp->faults->on_frame(fault::FaultDir::rx, true, fx, &src)) {
        qp_fault_count(qp, fx.action);
        continue;
      }
    }
    if (!deliver(qp, static_cast<size_t>(n), src, dest_gid(m), mcast)) return;
  }
  // Budget spent with more waiting: come back through epoll (still readable).
}

void ud_rx_run_locked(Qp* qp) {
  ud_rx_fd_locked(qp, qp->ud_fd, false);
}

// WQE w (at sq_tx) failed with st: the QP goes to ERR (qp_set_error takes tx_mu, which the
// caller holds: from the progress thread), and nothing after w leaves meanwhile.
static void ud_fail_locked(Qp* qp, SendWqe& w, ibv_wc_status st) {
  w.status = st;
  qp->ud_tx_failed = true;
  ++qp->sq_tx;
  Progress::get().post([ref = QpRef(qp)] {
    if (ref.live()) qp_set_error(ref.get(), IBV_WC_WR_FLUSH_ERR, true);
  });
}

// A delay fault: the datagram, copied now (its buffers are the application's, reusable once
// the Send completes), leaves `ms` later from the progress thread.
static void ud_send_later(Qp* qp, const transport::SockAddr& to, const iovec* iov, size_t niov,
                          uint32_t ms) {
  std::vector<std::byte> bytes;
  for (size_t i = 0; i < niov; ++i) {
    const auto* b = static_cast<const std::byte*>(iov[i].iov_base);
    bytes.insert(bytes.end(), b, b + iov[i].iov_len);
  }
  Progress::get().post_after(
      std::chrono::milliseconds(ms), [ref = QpRef(qp), to, bytes = std::move(bytes)] {
        // ud_close runs here too, after `destroyed` is set.
        if (!ref.live() || ref.get()->ud_fd < 0) return;
        (void)!sendto(ref.get()->ud_fd, bytes.data(), bytes.size(), MSG_DONTWAIT,
                      reinterpret_cast<const sockaddr*>(&to.ss), to.len);
      });
}

void ud_tx_locked(Qp* qp) {
  if (qp->state.load() != IBV_QPS_RTS || qp->ud_tx_failed) return;
  const uint32_t mask = qp->cap.max_send_wr - 1;
  for (; qp->sq_tx != qp->sq_head + qp->sq_count; ++qp->sq_tx) {
    SendWqe& w = qp->sq[qp->sq_tx & mask];
    w.state = WqeState::done;
    if (w.opcode != IBV_WR_SEND && w.opcode != IBV_WR_SEND_WITH_IMM) {
      // An RC opcode: a local QP operation error, and the QP goes to ERR (rxe's provider;
      // mlx5's takes the WR without a check). Nothing behind it leaves.
      ud_fail_locked(qp, w, IBV_WC_LOC_QP_OP_ERR);
      break;
    }
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
        ud_fail_locked(qp, w, IBV_WC_LOC_PROT_ERR);
        break;
      }
      transport::SockAddr to;
      if (w.remote_qpn == kMcastQpn
              ? !mcast_dest(qp, w, to)
              : !dest_addr(qp, w.dgid, static_cast<uint16_t>(w.remote_qpn >> 8), to))
        continue;
      int copies = 1;
      if (qp->faults) [[unlikely]] {
        fault::Fired fx;
        if (qp->faults->on_frame(fault::FaultDir::tx, true, fx, &to)) {
          qp_fault_count(qp, fx.action);
          // Lost, duplicated or late on the way, as a fabric may do to a datagram: the
          // Send completes successfully whatever becomes of it (IBA 9.8.2).
          if (fx.action == fault::FaultAction::drop) continue;
          if (fx.action == fault::FaultAction::delay) {
            ud_send_later(qp, to, iov.data(), niov, fx.ms);
            continue;
          }
          if (fx.action == fault::FaultAction::dup) copies = 2;
        }
      }
      msghdr m{};
      m.msg_name = &to.ss;
      m.msg_namelen = to.len;
      m.msg_iov = iov.data();
      m.msg_iovlen = niov;
      ssize_t n = transport::sys_sendmsg(qp->ud_fd, &m, MSG_DONTWAIT);
      if (copies == 2 && n >= 0) n = transport::sys_sendmsg(qp->ud_fd, &m, MSG_DONTWAIT);
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

// ibv_attach_mcast (ib_attach_mcast and uverbs' rules): the GID must be a multicast address
// (EINVAL); attaching a group again is a success that changes nothing; more than
// max_mcast_qp_attach groups is ENOMEM.
bool gid_is_multicast(const ibv_gid& gid) {
  transport::SockAddr group;
  return mcast_group(gid, group);
}

int ud_attach_mcast(Qp* qp, const ibv_gid& gid) {
  transport::SockAddr group;
  if (!mcast_group(gid, group)) return EINVAL;
  int err = 0;
  Progress::get().run_sync([&] {
    for (const auto& m : qp->mcast)
      if (std::memcmp(m->gid.raw, gid.raw, 16) == 0) return;
    if (qp->mcast.size() >= kMaxMcastPerQp) {
      err = ENOMEM;
      return;
    }
    const int fd = open_mcast(qp, group, mcast_port(gid), &err);
    if (fd < 0) return;
    auto m = std::make_unique<McastMember>();
    m->gid = gid;
    m->fd = fd;
    m->events = EPOLLIN;
    m->io = std::make_unique<McastIo>(qp, fd);
    Progress::get().add(fd, EPOLLIN, m->io.get());
    qp->mcast.push_back(std::move(m));
    qp->mcast_groups.fetch_add(1);
  });
  if (!err) ud_update_interest(qp);  // a QP waiting for receives waits on the group too
  return err;
}

// ibv_detach_mcast: a group the QP is not attached to is EINVAL (uverbs).
int ud_detach_mcast(Qp* qp, const ibv_gid& gid) {
  int err = EINVAL;
  Progress::get().run_sync([&] {
    for (auto it = qp->mcast.begin(); it != qp->mcast.end(); ++it) {
      if (std::memcmp((*it)->gid.raw, gid.raw, 16) != 0) continue;
      Progress::get().del((*it)->fd);
      close((*it)->fd);
      qp->mcast.erase(it);
      qp->mcast_groups.fetch_sub(1);
      err = 0;
      return;
    }
  });
  return err;
}

void qp_rx_locked(Qp* qp) {
  if (qp->ud)
    ud_rx_run_locked(qp);
  else
    rx_run_locked(qp);
}

}  // namespace sv::engine
