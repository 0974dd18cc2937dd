// Receive path (net/rds recv.c): reassembly of fragments, de-duplication by sequence,
// pings, delivery to the bound socket, and recvmsg's priority order
// (RDMA notifications, then congestion updates, then one datagram).
#include <arpa/inet.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "rds/rds_impl.h"
#include "softverbs/rds.h"

namespace sv::rds {
namespace {

// The socket bound to exactly (the address the sender sent to, port), as rds_find_bound.
Sock* find_bound(const in_addr& local, uint16_t port) {
  for (auto& [fd, s] : g().socks)
    if (s->bound && !s->v6 && ntohs(s->bound_addr.sin_port) == port &&
        s->bound_addr.sin_addr.s_addr == local.s_addr)
      return s;
  return nullptr;
}

void queue_pong(Conn* c, uint16_t to_port) {
  auto* m = new Message();
  m->queued_to_sock = false;
  m->h.sport = 0;
  m->h.dport = to_port;
  conn_enqueue(c, m);
  count("send_pong");
}

void deliver(Conn* c, const wire::RdsHeader& h, std::vector<std::byte>&& data) {
  // Dedupe purely by sequence (rds-api.md §7.2): anything already seen is a duplicate,
  // whether or not the sender flagged it as retransmitted.
  if (h.sequence < c->next_rx_seq) {
    count("recv_drop_old_seq");
    c->ack_needed = c->ack_now = true;  // the peer is retransmitting: tell it at once
    return;
  }
  c->next_rx_seq = h.sequence + 1;
  // Acks free the sender's retransmit list and send buffer. Most ride on our next message
  // (xmit piggybacks them); a lone ack goes after kAckDelayUs, or at once when the sender
  // asked (ACK_REQUIRED: its buffer is half full) or kAckEvery messages are unacked.
  c->ack_needed = true;
  if (++c->unacked >= kAckEvery || (h.flags & wire::kRdsFlagAckRequired)) c->ack_now = true;
  if (h.dport == 0) {
    // Ping to port 0: the "kernel" answers from port 0 (net/rds recv.c, rds_send_pong).
    count("recv_ping");
    if (h.sport != 0) queue_pong(c, h.sport);
    ping_claim(c->local.sin_addr);  // the holder is gone: answer here from now on
    return;
  }
  Sock* s = find_bound(c->local.sin_addr, h.dport);
  if (!s || s->closing) {
    count("recv_drop_no_sock");
    return;
  }
  if (h.ext_rdma_rkey) {
    // This message chased an RDMA on one of our regions: release it if use-once.
    auto it = s->mrs.find(*h.ext_rdma_rkey);
    if (it != s->mrs.end() && (s->mr_flags[it->first] & RDS_RDMA_USE_ONCE)) {
      ibv_dereg_mr(it->second);
      s->mr_flags.erase(it->first);
      s->mrs.erase(it);
    }
  }
  Incoming in;
  in.from.sin_family = AF_INET;
  in.from.sin_addr = c->peer.sin_addr;
  in.from.sin_port = htons(h.sport);
  in.data = std::move(data);
  in.rdma_dest = h.ext_rdma_dest;
  s->rcv_bytes += in.data.size();
  s->rq.push_back(std::move(in));
  cong_rcvbuf_delta(s);
  count("recv_delivered");
  sock_update_poll(s);
  sock_wake(s);
}

}  // namespace

void on_frag(Conn* c, const std::byte* buf, uint32_t len) {
  if (len < wire::kRdsHeaderLen) return;
  wire::RdsHeader h;
  wire::rds_decode(buf, h);
  on_ack(c, h.ack);
  if (h.flags == wire::kRdsFlagCongBitmap) {  // receivers compare for equality (cong.c)
    cong_map_received(c, buf + wire::kRdsHeaderLen, len - wire::kRdsHeaderLen);
    return;
  }
  if (h.sequence == 0) return;  // ack-only frame
  const uint32_t chunk = len - static_cast<uint32_t>(wire::kRdsHeaderLen);
  if (!c->in_msg || c->cur.sequence != h.sequence) {
    c->in_msg = true;
    c->cur = h;
    c->cur_data.assign(h.len, std::byte{0});
    c->cur_have = 0;
  }
  const size_t take = std::min<size_t>(chunk, c->cur_data.size() - c->cur_have);
  if (take) std::memcpy(c->cur_data.data() + c->cur_have, buf + wire::kRdsHeaderLen, take);
  c->cur_have += take;
  if (c->cur_have >= c->cur.len) {
    c->in_msg = false;
    deliver(c, c->cur, std::move(c->cur_data));
    c->cur_data = {};
    if (!c->send_q.empty()) conn_kick(c);  // pongs
  }
}

}  // namespace sv::rds

using namespace sv::rds;

extern "C" __attribute__((visibility("default"))) ssize_t svrds_recvmsg(int fd, msghdr* msg,
                                                                        int flags) {
  Global& G = g();
  std::unique_lock lk(G.mu);
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));
  if (flags & MSG_OOB) return 0;
  const bool nb = (flags & MSG_DONTWAIT) || (fcntl(s->app_fd, F_GETFL) & O_NONBLOCK);
  if (s->cong_poll) {  // the congestion-update POLLIN has been seen
    s->cong_poll = false;
    sock_update_poll(s);
  }
  for (;;) {
    // 1. RDMA notifications, as many as fit.
    if (!s->notify.empty()) {
      const size_t room = msg->msg_controllen / CMSG_SPACE(sizeof(rds_rdma_notify));
      size_t n = std::min(room ? room : 1, s->notify.size());
      if (msg->msg_controllen < CMSG_SPACE(sizeof(rds_rdma_notify))) {
        msg->msg_flags = MSG_CTRUNC;
        msg->msg_controllen = 0;
        return 0;
      }
      auto* cm = reinterpret_cast<cmsghdr*>(msg->msg_control);
      for (size_t i = 0; i < n; ++i) {
        cm->cmsg_level = SOL_RDS;
        cm->cmsg_type = RDS_CMSG_RDMA_STATUS;
        cm->cmsg_len = CMSG_LEN(sizeof(rds_rdma_notify));
        std::memcpy(CMSG_DATA(cm), &s->notify.front(), sizeof(rds_rdma_notify));
        s->notify.pop_front();
        cm = reinterpret_cast<cmsghdr*>(reinterpret_cast<char*>(cm) +
                                        CMSG_SPACE(sizeof(rds_rdma_notify)));
      }
      msg->msg_controllen = n * CMSG_SPACE(sizeof(rds_rdma_notify));
      msg->msg_flags = 0;
      msg->msg_namelen = 0;
      sock_update_poll(s);
      return 0;
    }
    // 2. congestion updates.
    if (s->cong_notify) {
      if (msg->msg_controllen < CMSG_SPACE(sizeof(uint64_t))) return fail(EINVAL);
      auto* cm = reinterpret_cast<cmsghdr*>(msg->msg_control);
      cm->cmsg_level = SOL_RDS;
      cm->cmsg_type = RDS_CMSG_CONG_UPDATE;
      cm->cmsg_len = CMSG_LEN(sizeof(uint64_t));
      std::memcpy(CMSG_DATA(cm), &s->cong_notify, sizeof(uint64_t));
      s->cong_notify = 0;
      msg->msg_controllen = CMSG_SPACE(sizeof(uint64_t));
      msg->msg_namelen = 0;
      sock_update_poll(s);
      return 0;
    }
    if (!s->rq.empty()) break;
    if (nb) return fail(EAGAIN);
    s->cv.wait(lk);
    if (s->closing) return fail(EBADF);
  }
  // 3. one datagram.
  Incoming& in = s->rq.front();
  size_t cap = 0;
  for (size_t i = 0; i < msg->msg_iovlen; ++i) cap += msg->msg_iov[i].iov_len;
  size_t off = 0;
  for (size_t i = 0; i < msg->msg_iovlen && off < in.data.size(); ++i) {
    const size_t take = std::min(msg->msg_iov[i].iov_len, in.data.size() - off);
    if (take) std::memcpy(msg->msg_iov[i].iov_base, in.data.data() + off, take);
    off += take;
  }
  msg->msg_flags = in.data.size() > cap ? MSG_TRUNC : 0;
  if (msg->msg_name && msg->msg_namelen >= sizeof(sockaddr_in)) {
    std::memcpy(msg->msg_name, &in.from, sizeof(sockaddr_in));
    msg->msg_namelen = sizeof(sockaddr_in);
  }
  size_t ctl = 0;
  if (in.rdma_dest && msg->msg_control && msg->msg_controllen >= CMSG_SPACE(sizeof(uint64_t))) {
    auto* cm = reinterpret_cast<cmsghdr*>(msg->msg_control);
    cm->cmsg_level = SOL_RDS;
    cm->cmsg_type = RDS_CMSG_RDMA_DEST;
    cm->cmsg_len = CMSG_LEN(sizeof(uint64_t));
    std::memcpy(CMSG_DATA(cm), &*in.rdma_dest, sizeof(uint64_t));
    ctl = CMSG_SPACE(sizeof(uint64_t));
  } else if (in.rdma_dest) {
    msg->msg_flags |= MSG_CTRUNC;
  }
  msg->msg_controllen = ctl;
  const ssize_t ret = static_cast<ssize_t>((flags & MSG_TRUNC) ? in.data.size() : off);
  if (!(flags & MSG_PEEK)) {
    s->rcv_bytes -= in.data.size();
    s->rq.pop_front();
    count("recv_delivered_to_app");
    cong_rcvbuf_delta(s);
  }
  sock_update_poll(s);
  return ret;
}

extern "C" __attribute__((visibility("default"))) ssize_t svrds_recvfrom(int fd, void* buf,
                                                                         size_t len, int flags,
                                                                         sockaddr* from,
                                                                         socklen_t* fromlen) {
  iovec v{buf, len};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_name = from;
  m.msg_namelen = fromlen ? *fromlen : 0;
  ssize_t r = svrds_recvmsg(fd, &m, flags);
  if (r >= 0 && fromlen) *fromlen = m.msg_namelen;
  return r;
}
