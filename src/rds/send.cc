// Send path (net/rds send.c): sendmsg validation in Linux RDS's error order, the send
// queue -> transport -> retransmit list pipeline, RDS acks, and notifications.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>
#include <vector>

#include "rds/rds_impl.h"
#include "softverbs/rds.h"

namespace sv::rds {

void queue_notify(Sock* s, uint64_t token, int status) {
  rds_rdma_notify n{};
  n.user_token = token;
  n.status = status;
  {
    std::lock_guard lk(s->rs_recv_lock);
    s->notify.push_back(n);
    sock_update_poll_locked(s);
  }
  sock_wake(s);
}

void queue_zcookie(Sock* s, uint32_t cookie) {
  // Coalesced RDS_MAX_ZCOOKIES to an entry, one entry per recvmsg (net/rds message.c).
  {
    std::lock_guard lk(s->rs_recv_lock);
    if (s->zcookies.empty() || s->zcookies.back().num >= RDS_MAX_ZCOOKIES)
      s->zcookies.push_back({});
    rds_zcopy_cookies& c = s->zcookies.back();
    c.cookies[c.num++] = cookie;
    sock_update_poll_locked(s);
  }
  sock_wake(s);
}

namespace {
// The message no longer counts against its socket's send buffer.
void unqueue_from_sock(Message* m) {
  if (!m->sock || !m->queued_to_sock) return;
  m->queued_to_sock = false;
  m->sock->snd_bytes -= m->h.len;
  sock_update_poll(m->sock);
  sock_wake(m->sock);
}

bool still_posted(const Conn* c, const Message* m) {
  return m->last_post > c->posts - c->posted.size();
}

// Releases the cancelled zero-copy messages whose last SEND has retired (every send
// posted before a retired one has retired too: RC completes in order).
void release_retired(Conn* c) {
  for (auto it = c->zc_retiring.begin(); it != c->zc_retiring.end();) {
    if (still_posted(c, *it)) {
      ++it;
      continue;
    }
    release_message(*it);
    it = c->zc_retiring.erase(it);
  }
}
}  // namespace

bool retire_later(Conn* c, Message* m) {
  if (!m->zcopy || !m->frags_posted || !still_posted(c, m)) return false;
  unqueue_from_sock(m);
  c->zc_retiring.push_back(m);
  // Its last SEND may have gone unsignaled: a signaled ack behind it retires it (RC
  // completes in order) rather than the next signaled send, which may never come.
  if (c->state == ConnState::up) {
    c->signal_next = true;
    conn_send_ack(c);
  }
  return true;
}

void release_message(Message* m) {
  if (m->op || m->atomic_op)
    for (auto& [k, c] : g().conns) std::erase(c->rdma_q, m);
  unqueue_from_sock(m);
  for (ibv_mr* mr : m->zmrs) dereg_after_unlock(mr);
  if (m->zcopy && m->sock && !m->sock->closing) queue_zcookie(m->sock, m->zcookie);
  ops_release(m);
  delete m;
}

void conn_enqueue(Conn* c, Message* m) {
  // Sequence numbers are per connection, taken when the message joins it (net/rds
  // rds_send_queue_rm); gaps are normal.
  m->h.sequence = c->next_tx_seq++;
  if (pending_op(m)) c->rdma_q.push_back(m);
  c->send_q.push_back(m);
}

namespace {

// Posts a recorded SEND on the data QP; off_lock: with the stack lock let go around the call
// (in_xmit set). 0, or -1 if it was not posted.
int post_recorded(Conn* c, ibv_send_wr* wr, bool off_lock) {
  ibv_qp* qp = c->id->qp;
  ibv_send_wr* bad = nullptr;
  if (!off_lock) return ibv_post_send(qp, wr, &bad) ? -1 : 0;
  const int rc = post_off_lock(qp, wr, &c->in_xmit);
  count(Ctr::send_post_unlocked);
  return rc ? -1 : 0;
}

// What a message's last fragment carried of our ack (piggybacked): cleared before its post,
// since an arrival while the lock is let go raises it again, and put back if it failed.
struct AckState {
  bool needed, now;
  std::chrono::steady_clock::time_point due;
  int unacked;
};
AckState take_ack(Conn* c) {
  const AckState a{c->ack_needed, c->ack_now, c->ack_due, c->unacked};
  c->ack_needed = c->ack_now = false;
  c->ack_due = {};
  c->unacked = 0;
  return a;
}
void restore_ack(Conn* c, const AckState& a) {
  c->ack_needed = c->ack_needed || a.needed;
  c->ack_now = c->ack_now || a.now;
  if (a.needed && (c->ack_due == std::chrono::steady_clock::time_point{} || a.due < c->ack_due))
    c->ack_due = a.due;
  c->unacked += a.unacked;
}

// m, off the queues, is one the peer has: it goes, unless its fenced Write has not settled
// (it reports then), or it is zero copy and this copy's SENDs may still read its buffers.
void drop_acked(Conn* c, Message* m) {
  count(Ctr::send_drop_acked);
  if (park_unsettled(c, m)) return;
  ops_report(m, RDS_RDMA_SUCCESS);
  if (!retire_later(c, m)) release_message(m);
}

// Every fragment of m went: off the send queue, onto the retransmit queue (or gone, if the
// peer acked it while its poster had the lock let go, or it is a congestion map).
void message_sent(Conn* c, Message* m) {
  if (!c->send_q.empty() && c->send_q.front() == m)
    c->send_q.pop_front();
  else
    std::erase(c->send_q, m);
  if (m->h.flags & wire::kRdsFlagCongBitmap) {
    release_message(m);  // not sequenced, not retransmitted
    return;
  }
  count(Ctr::send_queued);
  if (m->h.sequence <= c->acked_seq)
    drop_acked(c, m);  // the ack may cover an earlier copy (a retransmit's)
  else
    c->retrans.push_back(m);
}

// The loop of xmit. Returns once the queue is empty, no slot is free, a post failed, or
// the connection went down (a teardown put off while the lock was let go).
void xmit_queue(Conn* c, XmitMode mode, int& unlocked_left) {
  while (c->state == ConnState::up && !c->send_q.empty() && c->id && c->id->qp) {
    Message* m = c->send_q.front();
    // The peer has it already (its ack came with a reconnect's accept, or while it was being
    // posted): it is not sent again. Not a congestion map, which acks do not cover.
    if (m->frags_posted == 0 && m->h.sequence <= c->acked_seq &&
        !(m->h.flags & wire::kRdsFlagCongBitmap)) {
      c->send_q.pop_front();
      drop_acked(c, m);
      continue;
    }
    if (m->op || m->atomic_op) {
      // The message reports its RDMA, so it goes only after the op completed (and everything
      // behind it waits: per-destination order), or, fenced, once the op is posted: the
      // receiver holds it until the fence behind the Write arrives. A failed op takes its
      // message with it: both or neither (rds-rdma(7)). Once the op has landed, the message
      // alone may be resent across connection bounces; the op is never redone.
      if (const RdmaOp* op = pending_op(m); op && !op->fenced) return;
      // A failed op drops its message, unless some of its fragments have gone (a fenced
      // Write's message, posted as slots allowed): the rest follows, since the peer
      // reassembles a message's fragments in a row, and the failure verdict makes it drop it.
      if (ops_failed(m) && m->frags_posted == 0) {
        c->send_q.pop_front();
        count(Ctr::send_rdma_failed);
        if (!park_unsettled(c, m)) release_message(m);  // its verdict is still owed
        continue;
      }
    }
    const size_t len = m->h.len;
    const uint32_t nfrags = len ? static_cast<uint32_t>((len + kFragSize - 1) / kFragSize) : 1;
    while (m->frags_posted < nfrags) {
      if (c->free_slots.empty()) return;
      const int slot = c->free_slots.back();
      c->free_slots.pop_back();
      std::byte* b = &c->sbuf[static_cast<size_t>(slot) * kBufSize];
      wire::RdsHeader h = m->h;
      h.ack = rx_ack_seq(c);  // piggybacked ack
      wire::rds_encode(h, b);
      const size_t off = static_cast<size_t>(m->frags_posted) * kFragSize;
      const size_t chunk = std::min(kFragSize, len - std::min(len, off));
      ibv_sge sge[kMaxZcopySge + 1];
      int nsge = 1;
      if (m->zsge.empty()) {
        if (chunk) std::memcpy(b + wire::kRdsHeaderLen, m->payload.data() + off, chunk);
        sge[0] = {reinterpret_cast<uint64_t>(b), static_cast<uint32_t>(wire::kRdsHeaderLen + chunk),
                  c->smr->lkey};
      } else {
        // Zero copy: the header from our slot, the payload gathered from the user's regions.
        sge[0] = {reinterpret_cast<uint64_t>(b), static_cast<uint32_t>(wire::kRdsHeaderLen),
                  c->smr->lkey};
        size_t skip = off, want = chunk;
        for (const ibv_sge& z : m->zsge) {
          if (!want) break;
          if (skip >= z.length) {
            skip -= z.length;
            continue;
          }
          const size_t take = std::min<size_t>(z.length - skip, want);
          sge[nsge++] = {z.addr + skip, static_cast<uint32_t>(take), z.lkey};
          skip = 0;
          want -= take;
        }
      }
      ibv_send_wr wr{};
      wr.wr_id = make_wr_id(conn_id_of(c), c->inc, kSend, static_cast<uint32_t>(slot));
      wr.sg_list = sge;
      wr.num_sge = nsge;
      wr.opcode = IBV_WR_SEND;
      // Recorded before the post (with the lock let go, another thread may take its
      // completion in first), and undone if it failed.
      const PostRec rec = prep_data_send(c, &wr);
      const uint64_t last_post = m->last_post;
      ++m->frags_posted;
      m->last_post = c->posts;
      const bool whole = m->frags_posted == nfrags;
      const AckState ack = whole ? take_ack(c) : AckState{};
      const bool off_lock =
          mode == XmitMode::may_unlock && chunk >= kOffLockBytes && unlocked_left-- > 0;
      const bool failed = post_recorded(c, &wr, off_lock) != 0;
      if (failed) {
        if (unprep_data_send(c, rec)) c->free_slots.push_back(slot);
        --m->frags_posted;
        m->last_post = last_post;
        if (whole) restore_ack(c, ack);
      } else if (whole) {
        message_sent(c, m);
      }
      if (const char* why = std::exchange(c->down_owed, nullptr)) {
        count(Ctr::conn_down_by_poster);
        conn_down(c, why);  // put off while we posted: after the bookkeeping above
        return;
      }
      if (failed) return;
      if (whole) break;  // m may be gone (message_sent)
    }
  }
}

}  // namespace

int post_off_lock(ibv_qp* qp, ibv_send_wr* wr, bool* busy) {
  StackMutex& mu = g().mu;
  const uint32_t window_ms = g().test_post_window_ms;
  ibv_send_wr* bad = nullptr;
  // Cleared once the lock is back and its backlog run, even if that throws (bad_alloc): the
  // QP would be no one's for good.
  const ScopedFlag in_window(*busy);
  mu.release_for_post();
  const int rc = ibv_post_send(qp, wr, &bad);
  if (window_ms) usleep(window_ms * 1000);
  mu.reacquire_after_post();
  return rc;
}

void xmit(Conn* c, XmitMode mode) {
  rdma_post_pending(c, mode);
  if (c->in_xmit) {  // a sendmsg feeds this connection: it looks again (net/rds backs off too)
    c->xmit_again = true;
    count(Ctr::send_xmit_raced);
    return;
  }
  int unlocked_left = kUnlockedPosts;
  do {
    c->xmit_again = false;
    xmit_queue(c, mode, unlocked_left);
  } while (c->xmit_again);
  // Header-only sends (acks, base lookups) found the QP ours meanwhile: what is due goes now.
  if (std::exchange(c->hdr_owed, false) && c->state == ConnState::up) {
    mr_base_flush(c);
    if (c->ack_needed || (c->signal_next && !c->posted.empty())) conn_send_ack(c);
  }
}

bool on_ack(Conn* c, uint64_t ack) {
  if (ack >= c->next_tx_seq) return false;
  c->acked_seq = std::max(c->acked_seq, ack);
  while (!c->retrans.empty() && c->retrans.front()->h.sequence <= ack) {
    Message* m = c->retrans.front();
    c->retrans.pop_front();
    count(Ctr::send_drop_acked);
    if (park_unsettled(c, m)) continue;  // its fenced Write reports when settled
    ops_report(m, RDS_RDMA_SUCCESS);
    release_message(m);
  }
  return true;
}

void on_send_complete(Conn* c, uint64_t wr_id, ibv_wc_status st) {
  (void)st;
  // Everything posted up to wr_id is complete (unsignaled ones included), or flushed.
  if (std::find(c->posted.begin(), c->posted.end(), wr_id) == c->posted.end()) return;
  for (;;) {
    const uint64_t w = c->posted.front();
    c->posted.pop_front();
    c->free_slots.push_back(static_cast<int>(wr_idx(w)));
    if (w == wr_id) break;
  }
  if (!c->zc_retiring.empty()) release_retired(c);
}

// A port belongs to a process here, to the host on Linux. When the process a connection was
// to did not answer its connect (and its registry entries were just forgotten), it may
// have exited holding the port: each socket message to this host's addresses goes where
// its destination is now, as on Linux the bytes would reach whoever holds the port. To
// the process that holds it now (a new sequence number on that connection), or, if nobody
// does, nowhere: dropped, as the receiving kernel drops a message to an unbound port (a
// zero-copy cookie completes). Messages the same process still owns wait for the
// reconnect; remote hosts' (directory) and RDMA messages too, as before.
void conn_reroute_orphans(Conn* c) {
  std::deque<Message*> keep;
  std::vector<Conn*> to_kick;
  for (Message* m : c->send_q) {
    if (!m->sock || m->op || m->atomic_op || (m->h.flags & wire::kRdsFlagCongBitmap) ||
        !is_local_ip(m->dest.sin_addr)) {
      keep.push_back(m);
      continue;
    }
    uint64_t gen = 0;
    const uint16_t cm_port = registry_lookup(m->dest, &gen);
    if (cm_port && gen == c->peer_gen) {
      keep.push_back(m);
      continue;
    }
    if (!cm_port) {
      count(Ctr::send_drop_no_sock);
      release_message(m);
      continue;
    }
    count(Ctr::send_rerouted);
    Conn* to = conn_get(gen, m->src, m->dest, cm_port);
    m->h.flags &= static_cast<uint8_t>(~wire::kRdsFlagRetransmitted);
    m->frags_posted = 0;
    conn_enqueue(to, m);
    if (std::find(to_kick.begin(), to_kick.end(), to) == to_kick.end()) to_kick.push_back(to);
  }
  c->send_q.swap(keep);
  for (Conn* k : to_kick) conn_kick(k);
}

void conn_reset_queues(Conn* c) {
  // Unacked messages go back on the send queue, flagged (net/rds rds_send_path_reset).
  for (auto it = c->retrans.rbegin(); it != c->retrans.rend(); ++it) {
    Message* m = *it;
    m->h.flags |= wire::kRdsFlagRetransmitted | wire::kRdsFlagAckRequired;
    m->frags_posted = 0;
    c->send_q.push_front(m);
  }
  c->retrans.clear();
  for (auto it = c->send_q.begin(); it != c->send_q.end();) {
    if ((*it)->h.flags & wire::kRdsFlagCongBitmap) {
      release_message(*it);
      it = c->send_q.erase(it);
    } else {
      ++it;
    }
  }
  for (Message* m : c->send_q) {
    if (m->frags_posted) m->h.flags |= wire::kRdsFlagRetransmitted;
    m->frags_posted = 0;
  }
  c->rx.reset_message();
  c->ack_needed = c->ack_now = false;
  c->ack_due = {};
  c->posted.clear();
  // The QP is gone (conn_down destroyed it first): nothing reads their buffers any more.
  release_retired(c);
}

}  // namespace sv::rds

using namespace sv::rds;

namespace {

// The iovecs' bytes, len of them in all (their checked sum).
void copy_iovecs(const msghdr* msg, size_t len, std::vector<std::byte>* out) {
  out->resize(len);
  size_t off = 0;
  for (size_t i = 0; i < msg->msg_iovlen && off < len; ++i) {
    // At most what was summed: another thread of the caller may change the lengths.
    const size_t l = std::min(msg->msg_iov[i].iov_len, len - off);
    if (l)  // a zero-length iovec may have a null base
      std::memcpy(out->data() + off, msg->msg_iov[i].iov_base, l);
    off += l;
  }
}

// Zero copy while the iovecs fit one SEND's gather list (with the header's entry); beyond
// that the payload is copied (the cookie still completes when the message is released).
bool zcopy_fits(const msghdr* msg) {
  return msg->msg_iovlen <= kMaxZcopySge &&
         msg->msg_iovlen < static_cast<size_t>(max_local_sge(false));
}

// A zero-copy send's regions, one per non-empty iovec, in order; deregistered unless the
// message took them.
struct ZcopyRegs {
  std::vector<ibv_mr*> mrs;
  int err = 0;
  void reg(ibv_pd* pd, const msghdr* msg) {
    for (size_t i = 0; i < msg->msg_iovlen && !err; ++i) {
      if (!msg->msg_iov[i].iov_len) continue;
      if (ibv_mr* mr = ibv_reg_mr(pd, msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len, 0))
        mrs.push_back(mr);
      else
        err = errno ? errno : ENOMEM;
    }
    if (err) release();
  }
  void release() {
    for (ibv_mr* mr : mrs) ibv_dereg_mr(mr);
    mrs.clear();
  }
  ~ZcopyRegs() { release(); }
};

bool nonblocking(Sock* s, int flags) {
  return (flags & MSG_DONTWAIT) || (fcntl(s->app_fd, F_GETFL) & O_NONBLOCK);
}

}  // namespace

namespace {
// A blocking sender waits with the stack lock let go, asleep on the socket's rs_recv_cv, so
// nobody ever sleeps holding the stack lock's place and a completion handler that finds it
// taken can always leave its work to the holder (StackMutex). The stack lock goes without
// its backlog, which the engine thread takes: this thread's posts are still quiet
// (QuietPosts), and what the backlog posted would complete unannounced. Callers re-check
// everything once the lock is theirs again.
// Waiting for send space: snd_bytes is an atomic that unqueue_from_sock lowers before it
// takes rs_recv_lock (the poll state) and wakes the socket, so a sender that saw it full
// under that lock is woken.
template <typename Fn>
void off_stack_lock(std::unique_lock<StackMutex>& lk, Fn fn) {
  StackMutex& mu = *lk.release();
  mu.unlock_to_engine();
  fn();
  mu.lock();
  lk = std::unique_lock(mu, std::adopt_lock);
}

template <typename Pred>
void wait_off_stack_lock(Sock* s, std::unique_lock<StackMutex>& lk, Pred ready) {
  off_stack_lock(lk, [&] {
    std::unique_lock rl(s->rs_recv_lock);
    while (!ready() && !s->closing) s->rs_recv_cv.wait(rl);
  });
}

void wait_for_space(Sock* s, std::unique_lock<StackMutex>& lk) {
  wait_off_stack_lock(s, lk, [s] { return s->snd_bytes < s->sndbuf; });
}

// A sender blocked by its destination's congestion waits the same way for the next change
// of any peer's map that frees a port or forgets the map (Global::cong_gen, raised under the
// stack lock, which we hold here; the changer takes each socket's rs_recv_lock before waking
// it).
void wait_for_cong_update(Sock* s, std::unique_lock<StackMutex>& lk) {
  const uint64_t seen = g().cong_gen.load(std::memory_order_relaxed);
  wait_off_stack_lock(s, lk,
                      [seen] { return g().cong_gen.load(std::memory_order_relaxed) != seen; });
}
}  // namespace

extern "C" __attribute__((visibility("default"))) ssize_t svrds_sendmsg(int fd, const msghdr* msg,
                                                                        int flags) {
  Global& G = g();
  if (!sock_of(fd)) return fail(no_sock(fd));  // lock-free; looked up again under the lock
  // 0. The iovecs, as sendmsg(2) checks them before any protocol sees the call: more than
  // UIO_MAXIOV is EMSGSIZE (copy_msghdr_from_user), a length past SSIZE_MAX is EINVAL
  // (import_iovec). Their sum saturates: past RDS_MAX_MSG_SIZE it is EMSGSIZE below, and it
  // must never wrap to a small size that a copy of the real lengths would overrun.
  if (msg->msg_iovlen > UIO_MAXIOV) return fail(EMSGSIZE);
  size_t len = 0;
  // Every length first (iovec_from_user), then every range (access_ok, even of an empty
  // one): past every user address space (2^57: x86-64's 5-level paging) is EFAULT.
  for (size_t i = 0; i < msg->msg_iovlen; ++i)
    if (msg->msg_iov[i].iov_len > static_cast<size_t>(SSIZE_MAX)) return fail(EINVAL);
  for (size_t i = 0; i < msg->msg_iovlen; ++i) {
    const size_t l = msg->msg_iov[i].iov_len;
    const auto base = reinterpret_cast<uintptr_t>(msg->msg_iov[i].iov_base);
    if (base + l < base || base + l > (uintptr_t{1} << 57)) return fail(EFAULT);
    len = std::min(len + l, kMaxMsgSize + 1);  // l < 2^63 and len <= 2^20 + 1: no wrap
  }
  // 1. flags: Linux RDS takes MSG_DONTWAIT and MSG_ZEROCOPY only (MSG_CMSG_COMPAT is the
  // kernel's own); MSG_NOSIGNAL, MSG_MORE and the rest are EOPNOTSUPP (net/rds send.c).
  if (flags & ~(MSG_DONTWAIT | MSG_ZEROCOPY)) return fail(EOPNOTSUPP);
  // Before lk: a refused send's regions and payload go after the lock is let go.
  ZcopyRegs zreg;
  std::vector<std::byte> payload;
  std::unique_lock lk(G.mu);
  QuietPosts quiet;  // before lk is let go: its destructor takes in what our posts completed
  Sock* s = sock_of(fd);
  if (!s) return fail(no_sock(fd));  // closed meanwhile
  {
    std::lock_guard rlk(s->rs_recv_lock);
    if (s->cong_poll) {  // the congestion-update POLLIN has been seen: this is the retry
      s->cong_poll = false;
      sock_update_poll_locked(s);
    }
  }
  // 2. destination
  sockaddr_in dest{};
  if (msg->msg_name && msg->msg_namelen) {
    if (msg->msg_namelen < sizeof(sockaddr_in)) return fail(EINVAL);
    const auto family = static_cast<const sockaddr*>(msg->msg_name)->sa_family;
    if (family == AF_INET6) {
      if (msg->msg_namelen < sizeof(sockaddr_in6)) return fail(EINVAL);
      sockaddr_in6 d6;
      std::memcpy(&d6, msg->msg_name, sizeof d6);
      const int kind = classify_v6(d6, &dest);  // v4-mapped: the IPv4 address
      if (kind < 0) return fail(-kind);
      // A v4 socket cannot reach a v6 address (EOPNOTSUPP, send.c); our transport carries
      // IPv4 only, so a v6 socket cannot either.
      if (kind == 6) return fail(s->v6 ? ENETUNREACH : EOPNOTSUPP);
    } else if (family == AF_INET) {
      std::memcpy(&dest, msg->msg_name, sizeof dest);
    } else {
      return fail(EINVAL);
    }
    if (bad_unicast(dest)) return fail(EINVAL);
    if (s->v6) return fail(EOPNOTSUPP);  // v6 socket, IPv4 destination
  } else if (s->connected) {
    dest = s->conn_addr;
  } else {
    return fail(ENOTCONN);
  }
  if (!s->bound) return fail(ENOTCONN);
  // 5. control messages, each inside the control buffer and at least a header long
  // (CMSG_OK, net/rds send.c rds_rm_size: EINVAL, whatever its level).
  const rds_rdma_args* rdma = nullptr;
  const rds_atomic_args* atomic = nullptr;
  int atomic_kind = 0;
  const uint64_t* dest_cookie = nullptr;
  const rds_get_mr_args* map = nullptr;
  const uint32_t* zcookie = nullptr;
  for (cmsghdr* cm = CMSG_FIRSTHDR(const_cast<msghdr*>(msg)); cm;
       cm = CMSG_NXTHDR(const_cast<msghdr*>(msg), cm)) {
    const size_t room = static_cast<size_t>(static_cast<const char*>(msg->msg_control) +
                                            msg->msg_controllen - reinterpret_cast<char*>(cm));
    if (cm->cmsg_len < sizeof(cmsghdr) || cm->cmsg_len > room) return fail(EINVAL);
    if (cm->cmsg_level != SOL_RDS) continue;
    const size_t dlen = cm->cmsg_len - CMSG_LEN(0);
    switch (cm->cmsg_type) {
      case RDS_CMSG_RDMA_ARGS:
        if (rdma || dlen < sizeof(rds_rdma_args)) return fail(EINVAL);
        rdma = reinterpret_cast<const rds_rdma_args*>(CMSG_DATA(cm));
        break;
      case RDS_CMSG_RDMA_DEST:
        if (dest_cookie || dlen < sizeof(uint64_t)) return fail(EINVAL);
        dest_cookie = reinterpret_cast<const uint64_t*>(CMSG_DATA(cm));
        break;
      case RDS_CMSG_RDMA_MAP:
        if (map || dlen < sizeof(rds_get_mr_args)) return fail(EINVAL);
        map = reinterpret_cast<const rds_get_mr_args*>(CMSG_DATA(cm));
        break;
      case RDS_CMSG_ZCOPY_COOKIE:
        if (dlen < sizeof(uint32_t)) return fail(EINVAL);
        zcookie = reinterpret_cast<const uint32_t*>(CMSG_DATA(cm));
        break;
      case RDS_CMSG_ATOMIC_FADD:
      case RDS_CMSG_ATOMIC_CSWP:
      case RDS_CMSG_MASKED_ATOMIC_FADD:
      case RDS_CMSG_MASKED_ATOMIC_CSWP:
        if (atomic || dlen < sizeof(rds_atomic_args)) return fail(EINVAL);
        atomic = reinterpret_cast<const rds_atomic_args*>(CMSG_DATA(cm));
        atomic_kind = cm->cmsg_type;
        break;
      default:
        return fail(EINVAL);
    }
  }
  // {RDMA_DEST, RDMA_MAP, ZCOPY_COOKIE} and {RDMA_ARGS, ATOMIC} may not be mixed, and
  // MSG_ZEROCOPY needs a cookie (net/rds send.c rds_rm_size). A cookie needs a zero-copy
  // send of some payload: MSG_ZEROCOPY on a socket with SO_ZEROCOPY (rds_cmsg_zcopy).
  // Unlike Linux, which offers zero copy on RDS/TCP only (EOPNOTSUPP on IB), every
  // softverbs connection takes it.
  if ((dest_cookie || map || zcookie) && (rdma || atomic)) return fail(EINVAL);
  if ((flags & MSG_ZEROCOPY) && !zcookie) return fail(EINVAL);
  const bool zcopy = (flags & MSG_ZEROCOPY) && s->zerocopy;
  if (zcookie && !(zcopy && len)) return fail(EINVAL);
  const uint64_t rdma_bytes = rdma ? rdma->remote_vec.bytes : 0;
  if (std::max<uint64_t>(len, rdma_bytes) > kMaxMsgSize) return fail(EMSGSIZE);
  if (len > s->sndbuf) return fail(EMSGSIZE);
  if (rdma && rdma->nr_local > 1024) return fail(EMSGSIZE);
  if (rdma && rdma->nr_local == 0) return fail(EINVAL);
  if (atomic && (atomic->local_addr & 7)) return fail(EFAULT);

  if (int r = transport_start()) return fail(-r);
  // A device without atomics (Linux RDS: a transport without xmit_atomic, send.c).
  if (atomic && !G.atomics) return fail(EOPNOTSUPP);

  // The payload goes in now, as net/rds's rds_sendmsg copies it into the message
  // (rds_message_copy_from_user) once the arguments are checked and before the RDMA
  // arguments, the connection and the queue. A large copy, and a zero-copy send's
  // registration (a verbs call), run with the stack lock let go: a 1 MiB copy under it held
  // up every completion and receive on the stack for its length. A registration that failed
  // fails the send where it always did, after the waits.
  const bool gather = zcopy && zcopy_fits(msg);  // else its payload is copied
  if (gather || len >= kOffLockBytes) {
    off_stack_lock(lk, [&] {  // our posts are still quiet
      if (gather)
        zreg.reg(G.pd, msg);
      else
        copy_iovecs(msg, len, &payload);
    });
    if (s->closing) return fail(EBADF);  // close() ran meanwhile
  } else {
    copy_iovecs(msg, len, &payload);
  }

  auto m = std::make_unique<Message>();
  m->sock = s;
  m->src = s->bound_addr.sin_addr;
  m->dest = dest;
  m->h.sport = ntohs(s->bound_addr.sin_port);
  m->h.dport = ntohs(dest.sin_port);
  m->h.len = static_cast<uint32_t>(len);
  if (dest_cookie) {
    if (!s->mrs.count(static_cast<uint32_t>(*dest_cookie))) return fail(EINVAL);
    m->h.ext_rdma_dest = *dest_cookie;
  }
  uint64_t mapped_cookie = 0;
  if (map) {
    if (int r = map_region_locked(s, map->vec, map->flags, &mapped_cookie)) return fail(-r);
    m->h.ext_rdma_dest = mapped_cookie;
  }
  auto undo_map = [&] {
    if (map) {
      // RDS_FREE_MR may have freed it while we slept waiting (the stack lock let go).
      const auto rk = static_cast<uint32_t>(mapped_cookie);
      if (auto it = s->mrs.find(rk); it != s->mrs.end()) {
        dereg_after_unlock(it->second);
        s->mrs.erase(it);
        s->mr_flags.erase(rk);
      }
    }
  };
  // A message that goes no further: its mapped region and its ops' registrations go too (an
  // RDMA or atomic send refused with EAGAIN kept them pinned, one set per retry).
  auto abandon = [&] {
    undo_map();
    ops_release(m.get());
  };
  if (rdma) {
    if (int r = build_rdma_op(*rdma, &m->op)) return fail(-r);
    m->h.ext_rdma_rkey = m->op->rkey;
  }
  if (atomic) {
    if (int r = build_atomic_op(*atomic, atomic_kind, &m->atomic_op)) {
      ops_release(m.get());
      return fail(-r);
    }
    if (!rdma) m->h.ext_rdma_rkey = m->atomic_op->rkey;
  }
  // 6. which process owns the destination? This host's registry, else (another host)
  // what its directory told us, else ask it: the message waits for the answer. The
  // registry holds only this host's addresses (bind refuses others), so a message to
  // another host does not ask it: that cost a socket, a connect and a close per message.
  uint64_t peer_gen = 0;
  const bool local = is_local_ip_cached(dest.sin_addr);
  uint16_t cm_port = local ? registry_lookup(dest, &peer_gen) : 0;
  bool ask_directory = false;
  if (!cm_port) {
    const bool pending = directory_pending(dest);
    if (!pending) cm_port = directory_cached(dest, &peer_gen);
    ask_directory = !cm_port && (pending || !local);
  }
  if (!cm_port && !ask_directory) {
    // Nobody is bound there: Linux RDS sends it and the peer drops it silently. Its ops have
    // no process to run against, and still report (every RDS RDMA op does): dropped.
    count(Ctr::send_drop_no_sock);
    ops_report(m.get(), RDS_RDMA_DROPPED);
    ops_release(m.get());
    if (zcopy) queue_zcookie(s, *zcookie);  // its buffers are free at once
    return static_cast<ssize_t>(len);
  }
  Conn* c = cm_port ? conn_get(peer_gen, s->bound_addr.sin_addr, dest, cm_port) : nullptr;
  // A peer whose device has no atomics, once its private data said so (rdma.cc refuses
  // the ones queued before that).
  if (atomic && c && c->peer_no_atomics) {
    ops_release(m.get());
    return fail(EOPNOTSUPP);
  }
  // 8. congestion of the destination port, before the send buffer (net/rds send.c).
  const uint16_t dport = ntohs(dest.sin_port);
  while (c && cong_port_blocked(c, dport)) {
    if (nonblocking(s, flags)) {
      if (s->cong_monitor) s->cong_mask |= RDS_CONG_MONITOR_MASK(dport);
      s->seen_congestion = true;
      count(Ctr::cong_send_error);
      abandon();
      return fail(ENOBUFS);
    }
    count(Ctr::cong_send_blocked);
    wait_for_cong_update(s, lk);
    if (s->closing) {
      ops_release(m.get());  // close() let go of the socket's regions, the mapped one too
      return fail(EBADF);
    }
  }
  // 9. send buffer: accepted while snd_bytes < sndbuf (the last one may overshoot).
  while (s->snd_bytes >= s->sndbuf) {
    if (nonblocking(s, flags)) {
      count(Ctr::send_queue_full);
      abandon();
      return fail(EAGAIN);
    }
    wait_for_space(s, lk);
    if (s->closing) {
      ops_release(m.get());
      return fail(EBADF);
    }
  }
  if (zcopy) {
    m->zcopy = true;
    m->zcookie = *zcookie;
  }
  if (gather) {
    if (zreg.err) {
      undo_map();
      return fail(zreg.err == EINVAL ? EFAULT : zreg.err);
    }
    m->zmrs = std::exchange(zreg.mrs, {});
    // From the regions, not from a second read of the iovecs after the waits.
    for (ibv_mr* mr : m->zmrs)
      m->zsge.push_back(
          {reinterpret_cast<uint64_t>(mr->addr), static_cast<uint32_t>(mr->length), mr->lkey});
    count(Ctr::send_zcopy);
  } else {
    m->payload = std::move(payload);
  }
  s->snd_bytes += len;
  if (s->snd_bytes >= s->sndbuf / 2) m->h.flags |= sv::wire::kRdsFlagAckRequired;
  if (map) *reinterpret_cast<uint64_t*>(map->cookie_addr) = mapped_cookie;
  count(Ctr::send_queued_by_sock);
  sock_update_poll(s);
  if (!c) {
    directory_defer(m.release());  // sequenced when it joins the connection
    return static_cast<ssize_t>(len);
  }
  conn_enqueue(c, m.release());
  // The outermost call, holding nothing but the stack lock: its posts may let it go.
  conn_kick(c, XmitMode::may_unlock);
  return static_cast<ssize_t>(len);
}
