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

// The socket bound to exactly (the address the sender sent to, port), as rds_find_bound
// looks it up in its hash table: once per message delivered.
Sock* find_bound(const in_addr& local, uint16_t port) {
  const auto& t = g().bound_v4;
  const auto it = t.find(bound_key(local, htons(port)));
  return it == t.end() ? nullptr : it->second;
}

void queue_pong(Conn* c, uint16_t to_port) {
  auto* m = new Message();
  m->queued_to_sock = false;
  m->h.sport = 0;
  m->h.dport = to_port;
  conn_enqueue(c, m);
  count(Ctr::send_pong);
}

// A message to its socket, in sequence order.
void deliver(Conn* c, const wire::RdsHeader& h, std::vector<std::byte>&& data, uint64_t hdr_ns) {
  const uint64_t start_ns = mono_ns();
  Sock* s = find_bound(c->local.sin_addr, h.dport);
  if (!s || s->closing) {
    count(Ctr::recv_drop_no_sock);
    return;
  }
  if (h.ext_rdma_rkey) {
    // This message chased an RDMA on one of our regions: release it if use-once.
    auto it = s->mrs.find(*h.ext_rdma_rkey);
    if (it != s->mrs.end() && (s->mr_flags[it->first] & RDS_RDMA_USE_ONCE)) {
      // At once, not after the unlock (dereg_after_unlock): a receiver in another thread may
      // take this message before then, and its key must be dead by the time it is seen (as
      // net/rds's rds_rdma_unuse, before the message is queued).
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
  if (s->rcvtstamp) clock_gettime(CLOCK_REALTIME, &in.rx_tstamp);
  in.lat[kRxHdr] = hdr_ns;
  in.lat[kRxStart] = start_ns;
  in.lat[kRxEnd] = mono_ns();
  bool cong_changed;
  {
    std::lock_guard lk(s->rs_recv_lock);
    s->rcv_bytes += in.data.size();
    s->rq.push_back(std::move(in));
    cong_changed = cong_rcvbuf_changed(s);
    sock_update_poll_locked(s);
  }
  if (cong_changed) cong_sync_port(s);
  count(Ctr::recv_delivered);
  sock_wake(s);
}

// Delivers what waited for fences that have now arrived, in order; drops what failed.
void release_held(Conn* c) {
  while (!c->held.empty()) {
    Held& f = c->held.front();
    if (f.h.ext_fenced && f.h.sequence > c->fence_seq) break;
    Held x = std::move(f);
    c->held.pop_front();
    c->held_bytes -= x.data.size() + kHeldEntryCost;
    if (x.failed) {
      count(Ctr::recv_drop_rdma_failed);
      continue;
    }
    deliver(c, x.h, std::move(x.data), x.hdr_ns);
  }
}

// A new message (rds_rx_frag said `message`: sequence already adopted). False if the peer
// makes us hold more than kMaxHeldBytes for fences it does not send.
bool arrive(Conn* c, const wire::RdsHeader& h, std::vector<std::byte>&& data, uint64_t hdr_ns) {
  // Acks free the sender's retransmit list and send buffer. Most ride on our next message
  // (xmit piggybacks them); a lone ack goes after kAckDelayUs, or at once when the sender
  // asked (ACK_REQUIRED: its buffer is half full) or kAckEvery messages are unacked. A
  // message held for its fence is acked too: the sender keeps the op, not the message.
  c->ack_needed = true;
  if (++c->unacked >= kAckEvery || (h.flags & wire::kRdsFlagAckRequired)) c->ack_now = true;
  if (h.dport == 0) {
    // Ping to port 0: the "kernel" answers from port 0 (net/rds recv.c, rds_send_pong).
    count(Ctr::recv_ping);
    if (h.sport != 0) queue_pong(c, h.sport);
    ping_claim(c->local.sin_addr);  // the holder is gone: answer here from now on
    return true;
  }
  // Verdicts for messages before this one that never came (dropped unsent) are moot.
  c->fence_failed.erase(c->fence_failed.begin(), c->fence_failed.lower_bound(h.sequence));
  if (h.ext_fenced && h.sequence <= c->fence_seq && c->fence_failed.erase(h.sequence)) {
    count(Ctr::recv_drop_rdma_failed);  // its Write failed: both or neither (rds-rdma(7))
    return true;
  }
  if (c->held.empty() && !(h.ext_fenced && h.sequence > c->fence_seq)) {
    deliver(c, h, std::move(data), hdr_ns);
    return true;
  }
  // Each entry costs its bookkeeping too: empty messages behind a fence that never comes
  // would otherwise be held without limit.
  const size_t cost = data.size() + kHeldEntryCost;
  if (c->held_bytes + cost > kMaxHeldBytes) {
    // Unacked, so the sender still has them all: taken again from the first held one when
    // they are retransmitted on the next connection (the sequence is set back, or they would
    // be dropped as seen), and a liar's costs only what it sent.
    c->rx.next_seq = c->held.front().h.sequence;
    c->held.clear();
    c->held_bytes = 0;
    return false;
  }
  count(Ctr::recv_held_for_fence);
  c->held_bytes += cost;
  c->held.push_back(Held{h, std::move(data), hdr_ns, false});
  return true;
}

}  // namespace

bool on_fence(Conn* c, const wire::RdsFence& f) {
  // Fences come in sequence order; one we have (a channel's last, seen again) changes nothing.
  if (f.sequence <= c->fence_seq) return true;
  if (f.sequence >= c->rx.next_seq + kSeqWindow) return false;
  c->fence_seq = f.sequence;
  if (!f.ok) {
    bool found = false;
    for (Held& x : c->held)
      if (x.h.sequence == f.sequence) found = x.failed = true;
    // Not arrived yet (it is on its way, or was dropped unsent): remembered until it comes.
    if (!found && f.sequence >= c->rx.next_seq) {
      if (c->fence_failed.size() >= static_cast<size_t>(4 * kRdmaDepth)) return false;
      c->fence_failed.insert(f.sequence);
    }
  }
  const size_t before = c->held.size();
  release_held(c);
  if (c->held.size() != before) c->ack_needed = true;  // our ack may move past them now
  return true;
}

uint64_t mono_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

bool on_frag(Conn* c, const std::byte* buf, uint32_t len) {
  using wire::RdsFrag;
  wire::RdsHeader h;
  const bool starts = !c->rx.in_msg;
  const RdsFrag v =
      wire::rds_rx_frag(c->rx, buf, len, {c->next_tx_seq, kMaxMsgSize, kSeqWindow}, h);
  switch (v) {
    case RdsFrag::short_frag:
      return false;
    case RdsFrag::bad_csum:
      count(Ctr::recv_drop_bad_csum);
      return false;
    case RdsFrag::bad_ack:
      count(Ctr::recv_bad_ack);
      return false;
    case RdsFrag::bad_len:
      count(Ctr::recv_drop_bad_len);
      return false;
    case RdsFrag::bad_seq:
      count(Ctr::recv_drop_bad_seq);
      return false;
    case RdsFrag::bad_frag:
      count(Ctr::recv_drop_bad_frag);  // out of order, more than the message has left, or empty
      return false;
    default:
      break;
  }
  on_ack(c, h.ack);
  switch (v) {
    case RdsFrag::cong_map:
      cong_map_received(c, buf + wire::kRdsHeaderLen, len - wire::kRdsHeaderLen);
      return true;
    case RdsFrag::ack_only:
      if (h.ext_mr_base_req && !mr_base_asked(c, *h.ext_mr_base_req))
        return false;  // more questions than an honest peer has out (take_frag counts it)
      if (h.ext_mr_base) mr_base_answered(c, *h.ext_mr_base);
      return true;
    case RdsFrag::more:
      if (starts) c->cur_hdr_ns = mono_ns();
      return true;
    case RdsFrag::duplicate:
      count(Ctr::recv_drop_old_seq);
      c->ack_needed = c->ack_now = true;  // the peer is retransmitting: tell it at once
      c->rx.data = {};
      return true;
    default:
      break;
  }
  if (starts) c->cur_hdr_ns = mono_ns();
  if (!arrive(c, c->rx.cur, std::move(c->rx.data), c->cur_hdr_ns)) {
    count(Ctr::recv_held_too_much);
    return false;
  }
  c->rx.data = {};
  if (!c->send_q.empty()) conn_kick(c);  // pongs
  return true;
}

}  // namespace sv::rds

using namespace sv::rds;

namespace {

// Appends control messages to a recvmsg's buffer; one that does not fit sets MSG_CTRUNC
// (put_cmsg).
struct CmsgOut {
  msghdr* msg;
  size_t used = 0;
  bool put(int level, int type, const void* data, size_t len) {
    if (!msg->msg_control || used + CMSG_SPACE(len) > msg->msg_controllen) {
      msg->msg_flags |= MSG_CTRUNC;
      return false;
    }
    auto* cm = reinterpret_cast<cmsghdr*>(static_cast<char*>(msg->msg_control) + used);
    cm->cmsg_level = level;
    cm->cmsg_type = type;
    cm->cmsg_len = CMSG_LEN(len);
    std::memcpy(CMSG_DATA(cm), data, len);
    used += CMSG_SPACE(len);
    return true;
  }
};

// put_cmsg into a buffer too small for the whole message: as much of it as fits (a header
// with the length copied, then what fits of the data), MSG_CTRUNC, and the caller's item is
// consumed all the same, as Linux's is (net/core/scm.c put_cmsg). Used bytes, 0 if not even
// a header fits.
size_t put_truncated(msghdr* msg, int level, int type, const void* data, size_t len) {
  msg->msg_flags |= MSG_CTRUNC;
  if (!msg->msg_control || msg->msg_controllen < sizeof(cmsghdr)) return 0;
  const size_t used = std::min<size_t>(msg->msg_controllen, CMSG_LEN(len));
  cmsghdr cm{};
  cm.cmsg_level = level;
  cm.cmsg_type = type;
  cm.cmsg_len = used;  // put_cmsg: the length copied, not the whole message's
  std::memcpy(msg->msg_control, &cm, sizeof cm);
  std::memcpy(static_cast<char*>(msg->msg_control) + CMSG_LEN(0), data, used - CMSG_LEN(0));
  return used;
}

// One entry of completed MSG_ZEROCOPY cookies, if the socket has SO_ZEROCOPY and there is
// room (net/rds recv.c rds_recvmsg_zcookie): never truncates, the entry just waits.
bool put_zcookies(Sock* s, msghdr* msg, CmsgOut& out) {
  if (!msg->msg_control || !s->zerocopy || s->zcookies.empty() ||
      out.used + CMSG_SPACE(sizeof(rds_zcopy_cookies)) > msg->msg_controllen)
    return false;
  out.put(SOL_RDS, RDS_CMSG_ZCOPY_COMPLETION, &s->zcookies.front(), sizeof(rds_zcopy_cookies));
  s->zcookies.pop_front();
  return true;
}

// A blocking receive's sleep (rs_recv_lock held; held again on return, the caller looks
// again whatever woke it). Where the stack has a wait descriptor (svrds_block_prepare), as the
// shim's poll() does: in poll() on it and on app_fd's POLLIN byte, kept in step while we are
// counted in `sleepers`. The bytes of the next message then wake this thread, which takes
// them in itself (svrds_busy_poll) rather than the progress thread delivering them and waking
// it: one wake-up per message instead of two. A delivery by another thread sets the byte;
// close() hangs app_fd up. The poll is bounded all the same: app_fd may be closed, and its
// number taken by another file, before the poll starts. One sleeping receiver at a time
// waits on the wait descriptor (Global::rx_taker): it takes in the bytes of every socket,
// and the others wait for their byte alone, rather than all waking for each message and all
// but one finding the stack lock taken. Otherwise, and while completed zero-copy cookies
// or a congestion-update POLLIN are pending (they make the byte readable, but a blocking
// receive waits for data, notifications or congestion updates only, as net/rds's), on
// rs_recv_cv.
void recv_sleep(Sock* s, std::unique_lock<std::mutex>& lk) {
  Global& G = g();
  if (G.cq_wait_fd.load(std::memory_order_acquire) < 0 || !s->zcookies.empty() || s->cong_poll ||
      s->app_fd < 0) {
    s->rs_recv_cv.wait(lk);
    return;
  }
  ++s->sleepers;
  sock_update_poll_locked(s);
  pollfd p[2] = {{s->app_fd, POLLIN, 0}, {-1, POLLIN, 0}};
  lk.unlock();
  bool no_taker = false;
  const bool taker = G.rx_taker.compare_exchange_strong(no_taker, true, std::memory_order_acq_rel);
  if (taker) p[1].fd = svrds_block_prepare();  // -1: poll ignores the entry
  const int r = raw_poll(p, 2, 1000);
  if (taker) {
    if (p[1].fd >= 0) svrds_block_done();
    G.rx_taker.store(false, std::memory_order_release);
  }
  if (r > 0 && p[1].fd >= 0 && p[1].revents) svrds_busy_poll();  // take the stack's bytes in
  lk.lock();
  --s->sleepers;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) ssize_t svrds_recvmsg(int fd, msghdr* msg,
                                                                        int flags) {
  // Under the socket's rs_recv_lock only (net/rds rds_recvmsg): the stack lock is taken
  // just when a receive clears the port's congestion, to send the map.
  std::unique_lock<std::mutex> lk;
  Sock* s = sock_of_recv_locked(fd, lk);
  if (!s) return fail(no_sock(fd));
  if (flags & MSG_OOB) return 0;
  // Nothing is ever queued on an RDS socket's error queue (zero-copy completions come as
  // control messages): sock_recv_errqueue's EAGAIN, and no datagram taken.
  if (flags & MSG_ERRQUEUE) return fail(EAGAIN);
  if (s->cong_poll) {  // the congestion-update POLLIN has been seen
    s->cong_poll = false;
    sock_update_poll_locked(s);
  }
  for (;;) {
    // 1. RDMA notifications, as many as fit.
    if (!s->notify.empty()) {
      const size_t room = msg->msg_controllen / CMSG_SPACE(sizeof(rds_rdma_notify));
      size_t n = std::min(room ? room : 1, s->notify.size());
      if (msg->msg_controllen < CMSG_SPACE(sizeof(rds_rdma_notify))) {
        // Too small for one: as much of it as fits, and it is consumed (rds_notify_queue_get
        // takes one off the queue whatever the buffer; a plain recv() got 0 for ever here
        // and never reached the data behind it).
        msg->msg_flags = 0;
        msg->msg_controllen = put_truncated(msg, SOL_RDS, RDS_CMSG_RDMA_STATUS, &s->notify.front(),
                                            sizeof(rds_rdma_notify));
        msg->msg_namelen = 0;
        s->notify.pop_front();
        sock_update_poll_locked(s);
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
      sock_update_poll_locked(s);
      return 0;
    }
    // 2. congestion updates.
    if (s->cong_notify) {
      if (msg->msg_controllen < CMSG_SPACE(sizeof(uint64_t))) {
        // rds_notify_cong: put_cmsg truncates (MSG_CTRUNC), and the bits are cleared all the
        // same; 0, not an error.
        msg->msg_flags = 0;
        msg->msg_controllen =
            put_truncated(msg, SOL_RDS, RDS_CMSG_CONG_UPDATE, &s->cong_notify, sizeof(uint64_t));
        msg->msg_namelen = 0;
        s->cong_notify = 0;
        sock_update_poll_locked(s);
        return 0;
      }
      auto* cm = reinterpret_cast<cmsghdr*>(msg->msg_control);
      cm->cmsg_level = SOL_RDS;
      cm->cmsg_type = RDS_CMSG_CONG_UPDATE;
      cm->cmsg_len = CMSG_LEN(sizeof(uint64_t));
      std::memcpy(CMSG_DATA(cm), &s->cong_notify, sizeof(uint64_t));
      s->cong_notify = 0;
      msg->msg_controllen = CMSG_SPACE(sizeof(uint64_t));
      msg->msg_namelen = 0;
      sock_update_poll_locked(s);
      return 0;
    }
    if (!s->rq.empty()) break;
    // O_NONBLOCK is the application's to change on its descriptor: asked only when it matters.
    if ((flags & MSG_DONTWAIT) || (fcntl(s->app_fd, F_GETFL) & O_NONBLOCK)) {
      // No datagram: a completed zero-copy send is the answer, if one is queued.
      CmsgOut out{msg};
      msg->msg_flags = 0;
      if (put_zcookies(s, msg, out)) {
        msg->msg_controllen = out.used;
        msg->msg_namelen = 0;
        sock_update_poll_locked(s);
        return 0;
      }
      return fail(EAGAIN);
    }
    recv_sleep(s, lk);
    if (s->closing) return fail(EBADF);
  }
  // 3. one datagram. It is taken off the queue and its payload copied out with the lock let
  // go, as net/rds copies (inc_copy_to_user) holding no lock: a long copy holds up no
  // delivery to the socket. A peek copies in place, under the lock.
  const bool peek = flags & MSG_PEEK;
  Incoming taken;
  bool cong_changed = false;
  if (!peek) {
    taken = std::move(s->rq.front());
    s->rq.pop_front();
    s->rcv_bytes -= taken.data.size();
    count(Ctr::recv_delivered_to_app);
    cong_changed = cong_rcvbuf_changed(s);
  }
  Incoming& in = peek ? s->rq.front() : taken;
  size_t cap = 0;
  for (size_t i = 0; i < msg->msg_iovlen; ++i) cap += msg->msg_iov[i].iov_len;
  msg->msg_flags = in.data.size() > cap ? MSG_TRUNC : 0;
  if (msg->msg_name && msg->msg_namelen >= sizeof(sockaddr_in)) {
    std::memcpy(msg->msg_name, &in.from, sizeof(sockaddr_in));
    msg->msg_namelen = sizeof(sockaddr_in);
  }
  // Control messages in net/rds order: RDMA_DEST, the receive timestamp, the receive path
  // latency trace, one zero-copy completion.
  CmsgOut out{msg};
  if (in.rdma_dest) out.put(SOL_RDS, RDS_CMSG_RDMA_DEST, &*in.rdma_dest, sizeof(uint64_t));
  if (s->rcvtstamp && (in.rx_tstamp.tv_sec || in.rx_tstamp.tv_nsec)) {
    if (s->tstamp_new) {
      const int64_t tv[2] = {in.rx_tstamp.tv_sec, in.rx_tstamp.tv_nsec / 1000};
      out.put(SOL_SOCKET, SO_TIMESTAMP_NEW, tv, sizeof tv);
    } else {
      const timeval tv{in.rx_tstamp.tv_sec, in.rx_tstamp.tv_nsec / 1000};
      out.put(SOL_SOCKET, SO_TIMESTAMP_OLD, &tv, sizeof tv);
    }
  }
  if (s->rx_traces) {
    in.lat[kRxCmsg] = mono_ns();
    rds_cmsg_rx_trace t{};
    t.rx_traces = s->rx_traces;
    for (int i = 0; i < s->rx_traces; ++i) {
      const int j = s->rx_trace_pos[i];
      t.rx_trace_pos[i] = static_cast<uint8_t>(j);
      t.rx_trace[i] = in.lat[j + 1] - in.lat[j];
    }
    out.put(SOL_RDS, RDS_CMSG_RXPATH_LATENCY, &t, sizeof t);
  }
  put_zcookies(s, msg, out);
  msg->msg_controllen = out.used;
  sock_update_poll_locked(s);
  if (!peek) lk.unlock();
  size_t off = 0;
  for (size_t i = 0; i < msg->msg_iovlen && off < in.data.size(); ++i) {
    const size_t take = std::min(msg->msg_iov[i].iov_len, in.data.size() - off);
    if (take) std::memcpy(msg->msg_iov[i].iov_base, in.data.data() + off, take);
    off += take;
  }
  const ssize_t ret = static_cast<ssize_t>((flags & MSG_TRUNC) ? in.data.size() : off);
  if (peek) lk.unlock();
  if (cong_changed) {
    std::lock_guard glk(g().mu);
    QuietPosts quiet;  // the maps it sends
    cong_sync_port(s);
  }
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
