// RDMA and atomic operations (net/rds rdma.c + the op half of ib_send.c): regions and
// cookies, building ops from RDS_CMSG_RDMA_ARGS / RDS_CMSG_ATOMIC_*, running them on the
// connection's RDMA channel, and reporting each one (RDS_CMSG_RDMA_STATUS).
//
// A message may carry one RDMA op and one atomic; they run in that order (rds-api.md §2.1),
// one at a time. A message with only a Write is fenced between softverbs peers: it is sent
// without waiting, and a fence Send behind the Write tells the receiver when to deliver it
// (see post_op). Any other message is sent once its ops completed. Masked atomics cannot be
// expressed in the standard verbs API, so they run as a compare-and-swap loop: guess the old value
// g, CSWP(g -> masked_result(g)); a miss returns the real value, which is the next guess. The swap
// that finally hits is atomic, so the result is what the masked atomic would produce.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "rds/rds_impl.h"
#include "util/settings.h"

namespace sv::rds {

namespace {

int rdma_status(ibv_wc_status st) {
  if (st == IBV_WC_SUCCESS) return RDS_RDMA_SUCCESS;
  if (st == IBV_WC_REM_ACCESS_ERR) return RDS_RDMA_REMOTE_ERROR;
  return RDS_RDMA_OTHER_ERROR;
}

void notify(Message* m, RdmaOp* op, int status) {
  if (!op || op->notified || !m->sock) return;
  if (op->notify || (m->sock->recverr && status != RDS_RDMA_SUCCESS)) {
    queue_notify(m->sock, op->user_token, status);
    op->notified = true;
  }
}

// An op of m failed: the ones after it do not run (the message is dropped: both or neither),
// and each still reports its status (every RDS RDMA op reports, failures included).
void fail_rest(Message* m) {
  for (RdmaOp* op : {m->op.get(), m->atomic_op.get()})
    if (op && op->status < 0 && !op->posted) {
      op->status = RDS_RDMA_DROPPED;
      notify(m, op, op->status);
    }
}

// Fetch-and-add where each set bit of nocarry ends a field: no carry crosses it
// (IB masked fetch-and-add).
uint64_t masked_add(uint64_t v, uint64_t add, uint64_t nocarry) {
  uint64_t r = 0, carry = 0;
  for (int i = 0; i < 64; ++i) {
    const uint64_t a = (v >> i) & 1, b = (add >> i) & 1;
    r |= (a ^ b ^ carry) << i;
    carry = (a & b) | (a & carry) | (b & carry);
    if ((nocarry >> i) & 1) carry = 0;
  }
  return r;
}

// What a masked atomic leaves in memory that held v.
uint64_t masked_result(const RdmaOp* op, uint64_t v) {
  if (op->atomic_kind == RDS_CMSG_MASKED_ATOMIC_FADD)
    return masked_add(v, op->swap_add, op->nocarry_mask);
  if ((op->compare ^ v) & op->compare_mask) return v;  // compare fails: unchanged
  return (v & ~op->swap_mask) | (op->swap_add & op->swap_mask);
}

bool fences_enabled() {
  static const bool on = settings::flag_value(SV_SETTING("SOFTVERBS_RDS_FENCE"));
  return on;
}

// The op m still needs the RDMA channel for: its next op, or a fenced Write's verdict.
RdmaOp* chan_op(Message* m) {
  if (RdmaOp* op = pending_op(m)) return op;
  return m->op && m->op->verdict_due ? m->op.get() : nullptr;
}

// A fenced Write is settled: the message, if acked meanwhile, goes now.
void settled(Conn* c, Message* m) {
  if (auto it = std::find(c->op_wait.begin(), c->op_wait.end(), m); it != c->op_wait.end()) {
    c->op_wait.erase(it);
    release_message(m);
  }
}

bool post_fence(Conn* c, uint64_t wid, uint64_t seq, bool ok) {
  std::byte b[wire::kRdsFenceLen];
  wire::rds_fence_encode({seq, ok}, b);
  ibv_sge sge{reinterpret_cast<uint64_t>(b), static_cast<uint32_t>(sizeof b), 0};
  ibv_send_wr wr{};
  wr.wr_id = wid;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_send_wr* bad;
  return ibv_post_send(c->chan_id->qp, &wr, &bad) == 0;
}

// The op fails alone, OTHER_ERROR, before it reaches the wire; the message is dropped with it
// (fail_rest). Returns post_op's verdict: true, the op is done with, unless it is a repost
// of a fenced Write, whose peer may hold the message and must hear the verdict first.
bool refuse_op(Message* m, RdmaOp* op, Ctr why, int status = RDS_RDMA_OTHER_ERROR) {
  op->status = status;
  notify(m, op, op->status);
  fail_rest(m);
  count(why);
  if (op->fenced) {
    op->verdict_due = true;
    return false;
  }
  return true;
}

// Asks the peer where its region `rkey` starts. One question at a time: while one is out
// (about another region, if the queue's front changed meanwhile: an atomic behind its
// message's RDMA, a channel's ops reordered), its answer comes first, and then
// rdma_post_pending asks for the new front. So the peer never owes more than one answer, and
// an answer can only be to the question in hand (answers do not outlive their QP).
void mr_base_ask(Conn* c, uint32_t rkey) {
  if (c->mr_ask_sent) return;
  if (c->mr_ask != rkey) {
    c->mr_ask = rkey;
    count(Ctr::rdma_base_asked);
  }
  mr_base_flush(c);
}

// What post_op did with m's op: left it queued (the channel's queue is full, or it waits for
// a base), put it on the channel, or was done with it (refused: its message is dropped), or
// refused it with a verdict owed (a fenced Write whose message may have gone while the lock
// was let go: the peer holds it until it hears).
enum class Posted : uint8_t { queued, posted, done, verdict };

// refuse_op's verdict: done with the op, or its failure verdict is owed (it goes next).
Posted refused(bool done) {
  return done ? Posted::done : Posted::verdict;
}

// m's op is on the channel under wid (on_rdma_complete finds it by wid).
void record_posted(Conn* c, Message* m, RdmaOp* op, uint64_t wid) {
  c->rdma_owner[wid] = m;
  ++c->chan_inflight;
  op->posted = true;
}

// Posts wr (and what is chained to it) on the channel, recorded first as m's op under wid:
// with the stack lock let go (off_lock), another thread may take its completion in before
// the poster has the lock back, and on_rdma_complete ignores a wid it does not know (the op
// would hang as posted for ever). 0, or ibv_post_send's error with the record undone. Once it
// has returned 0, m may be gone (its op completed and released it meanwhile).
int post_recorded_op(Conn* c, Message* m, RdmaOp* op, uint64_t wid, ibv_send_wr* wr,
                     bool newly_fenced, bool off_lock) {
  // Marked before the post too: on_rdma_complete settles a fenced Write by it, and xmit
  // sends a fenced Write's message as soon as it sees it.
  const uint64_t last_post = m->last_post;
  record_posted(c, m, op, wid);
  if (newly_fenced) {
    op->fenced = true;
    m->h.ext_fenced = true;  // from now on the message need not wait for the op
  }
  ibv_qp* qp = c->chan_id->qp;
  ibv_send_wr* bad;
  int e;
  if (off_lock) {
    e = post_off_lock(qp, wr, &c->chan_in_xmit);
    count(Ctr::rdma_post_unlocked);
  } else {
    e = ibv_post_send(qp, wr, &bad);
  }
  if (!e) return 0;
  // Not posted: no completion came for wid, and nothing could release m (op_in_flight).
  c->rdma_owner.erase(wid);
  --c->chan_inflight;
  op->posted = false;
  // The fence stays if a fragment of the message went meanwhile: the peer holds it for the
  // fence (or its verdict), as after a channel lost under a fenced Write (op_unfinished).
  if (newly_fenced && m->last_post == last_post) {
    op->fenced = false;
    m->h.ext_fenced = false;
  }
  return e;
}

// let_go: the stack lock was let go around the post (the queue may have changed meanwhile).
Posted post_op(Conn* c, Message* m, XmitMode mode, bool* let_go) {
  RdmaOp* op = chan_op(m);
  // Queued before the peer's private data said it has no atomics (sendmsg refuses them
  // once it knows): posted, the peer would answer with a Terminate and the channel, with
  // every op behind this one, would go down for it. Refused before the message's Write
  // too, if it has one: both or neither (the Write reports DROPPED).
  if (c->peer_no_atomics && m->atomic_op && m->atomic_op->status < 0)
    return refused(refuse_op(m, m->atomic_op.get(), Ctr::send_atomic_unsupported));
  // The peer's regions are by virtual address: the cookie's offset counts from the base
  // it tells us (mr_base_answered posts the op then). A cookie naming no region of the
  // peer's fails as its Write or Read would have: REMOTE_ERROR (IB's remote access error).
  // (A failure verdict's op was posted once, so it has its base.)
  if (c->peer_va_mrs && !op->based && !op->verdict_due) {
    mr_base_ask(c, op->rkey);
    return Posted::queued;
  }
  if (op->no_region)
    return refused(refuse_op(m, op, Ctr::send_rdma_no_region, RDS_RDMA_REMOTE_ERROR));
  const uint64_t wid = make_wr_id(conn_id_of(c), c->chan_inc, kRdma, c->next_rdma_wr++);
  if (op->verdict_due) {
    // The peer holds this message for its fence: tell it the Write failed.
    if (!post_fence(c, wid, m->h.sequence, false)) return Posted::queued;
    record_posted(c, m, op, wid);  // (posted with the lock held: after is soon enough)
    count(Ctr::send_rdma_verdict);
    return Posted::posted;
  }
  ibv_send_wr wr{};
  wr.wr_id = wid;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_sge sge{};
  if (op->atomic) {
    sge = ibv_sge{op->atomic_local, 8, op->atomic_mr->lkey};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.atomic.remote_addr = op->remote_addr;
    wr.wr.atomic.rkey = op->rkey;
    if (op->masked) {
      wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
      wr.wr.atomic.compare_add = op->guess;
      wr.wr.atomic.swap = masked_result(op, op->guess);
    } else if (op->atomic_kind == RDS_CMSG_ATOMIC_FADD ||
               op->atomic_kind == RDS_CMSG_MASKED_ATOMIC_FADD) {
      wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
      wr.wr.atomic.compare_add = op->swap_add;
    } else {
      wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
      wr.wr.atomic.compare_add = op->compare;
      wr.wr.atomic.swap = op->swap_add;
    }
  } else {
    wr.sg_list = op->local.data();
    wr.num_sge = static_cast<int>(op->local.size());
    wr.opcode = op->write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    wr.wr.rdma.remote_addr = op->remote_addr;
    wr.wr.rdma.rkey = op->rkey;
  }
  ibv_send_wr confirm{};
  std::byte fb[wire::kRdsFenceLen];
  ibv_sge fsge{reinterpret_cast<uint64_t>(fb), static_cast<uint32_t>(sizeof fb), 0};
  ibv_sge csge{};  // the confirming Read's byte
  // Fenced: a Write alone in its message, to a peer that completes Writes once placed (IB's
  // rule, Conn::rplaced), so that the fence's own completion means the peer has it.
  const bool fence = op->fenced || (op->write && !op->atomic && !m->atomic_op && c->chan_placed &&
                                    fences_enabled());
  if (fence) {
    // Write (unsignaled: an error completes it anyway), then the fence, whose completion
    // settles the op. A Send is delivered only after the Writes before it were placed
    // (RFC 5040 §5.5), and none after a Terminate: a bad cookie fails the Write and the fence
    // never arrives. Its verdict follows on the next channel.
    wire::rds_fence_encode({m->h.sequence, true}, fb);
    wr.send_flags = 0;
    confirm.wr_id = wid;
    confirm.opcode = IBV_WR_SEND;
    confirm.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    confirm.sg_list = &fsge;
    confirm.num_sge = 1;
    wr.next = &confirm;
  } else if (op->write && !op->atomic && !c->chan_placed) {
    // Over iWARP a Write completes once TCP has it, and a bad cookie only comes back
    // as a Terminate. A Read behind it completes only after the peer placed
    // the Write (RFC 5040 §5.4: Read Responses are not passed by earlier Writes), or fails
    // with the Write's error (REM_ACCESS_ERR): its completion is the operation's status.
    // Unsignaled, but with the op's wr_id: an error completes it anyway (IB spec
    // 10.8.3.2), and whichever of the two carries the error reports the op. Between
    // softverbs peers (IB's completion rule, Conn::rplaced) the Write's own completion
    // says the same, a round trip sooner, as on InfiniBand.
    // One byte (of what the Write placed), not none: Linux siw (6.1) answers a zero-length
    // Read that waits behind another Read Response with that response's length and source
    // (siw_activate_tx leaves sge[0] as it was when the request has none, and its transmitter
    // then sends one SGE), which we reject as a response we never asked for (BAD_RESP_ERR:
    // the channel and its ops go down).
    wr.send_flags = 0;
    confirm.wr_id = wid;
    confirm.opcode = IBV_WR_RDMA_READ;
    confirm.send_flags = IBV_SEND_SIGNALED;
    confirm.wr.rdma.remote_addr = op->remote_addr;
    confirm.wr.rdma.rkey = op->rkey;
    if (op->bytes) {
      csge = ibv_sge{reinterpret_cast<uint64_t>(g().confirm_sink), 1, g().confirm_mr->lkey};
      confirm.sg_list = &csge;
      confirm.num_sge = 1;
    }
    wr.next = &confirm;
  }
  // Read before the post: once posted, m may be released under us (post_recorded_op).
  const bool atomic = op->atomic;
  const uint64_t bytes = op->bytes;
  const bool newly_fenced = fence && !op->fenced;
  const bool off_lock = mode == XmitMode::may_unlock && !atomic && bytes >= kOffLockBytes;
  *let_go = off_lock;
  if (const int e = post_recorded_op(c, m, op, wid, &wr, newly_fenced, off_lock)) {
    if (e == ENOMEM) return Posted::queued;  // send queue full: try again after completions
    // The device refuses the op itself (e.g. a misaligned atomic target, which a NIC would
    // fail at completion): it fails alone, OTHER_ERROR, rather than block the queue.
    return refused(refuse_op(m, op, Ctr::send_rdma_refused));
  }
  if (newly_fenced) count(Ctr::send_rdma_fenced);
  count(atomic ? Ctr::send_atomic : Ctr::send_rdma);
  if (!atomic) count(Ctr::send_rdma_bytes, bytes);
  return Posted::posted;
}

// m's op was not posted: back on the channel's queue. Where it was, if the stack lock was
// held throughout; else by sequence (the peer's fences must come in it), since a completion
// taken in meanwhile may have queued another message's next op at the front.
void requeue_op(Conn* c, Message* m, bool let_go) {
  if (!let_go) {
    c->rdma_q.push_front(m);
    return;
  }
  auto at = std::find_if(c->rdma_q.begin(), c->rdma_q.end(),
                         [m](const Message* q) { return q->h.sequence > m->h.sequence; });
  c->rdma_q.insert(at, m);
}

// An error that belongs to the op itself (the peer refused it and terminated the stream),
// as opposed to losing the connection under it.
bool op_own_error(ibv_wc_status st) {
  return st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR && st != IBV_WC_RETRY_EXC_ERR &&
         st != IBV_WC_RNR_RETRY_EXC_ERR;
}

// The op did not complete and the channel is going down. After an op's own error the
// responder stopped there (RFC 5040 §7: nothing after a Terminate is processed), so the
// ops flushed behind it never ran and are posted again on the next channel. Without such
// a culprit the connection was lost under them: Writes and Reads are repeatable, but an
// atomic may have executed, so it is reported DROPPED (every RDS RDMA op must report).
// Not forever, though: a provider may report an op's own failure as a flush (Linux siw
// after the peer's Terminate), and the op would go round new channels endlessly; after
// kMaxOpLosses channels lost under it, it fails (OTHER_ERROR).
constexpr int kMaxOpLosses = 8;
void op_unfinished(Conn* c, Message* m) {
  RdmaOp* op = chan_op(m);
  if (!op) return;
  op->posted = false;
  // A fenced op stays unsettled: it, or its verdict, goes again on the next channel. Never
  // given up: fenced ops run only between softverbs peers, which name an op's own failure.
  if (c->chan_culprit || op->fenced) return;
  if (op->atomic || ++op->losses >= kMaxOpLosses) {
    op->status = op->atomic ? RDS_RDMA_DROPPED : RDS_RDMA_OTHER_ERROR;
    notify(m, op, op->status);
    fail_rest(m);
    count(op->atomic ? Ctr::send_rdma_dropped : Ctr::send_rdma_gave_up);
  }
}

ibv_mr* reg_local(void* addr, size_t len) {
  return ibv_reg_mr(g().pd, addr, len, kLocalWrite);
}

}  // namespace

RdmaOp* pending_op(Message* m) {
  for (RdmaOp* op : {m->op.get(), m->atomic_op.get()})
    if (op && op->status < 0) return op;
  return nullptr;
}

bool op_in_flight(Message* m) {
  const RdmaOp* op = chan_op(m);
  return op && (op->posted || op->fenced);
}

bool park_unsettled(Conn* c, Message* m) {
  if (!m->op || !m->op->fenced || !chan_op(m)) return false;
  c->op_wait.push_back(m);
  count(Ctr::send_rdma_acked_unsettled);
  return true;
}

void rdma_fence_acked(Conn* c, uint64_t seq) {
  std::vector<Message*> done;  // settled after the walk: releasing one edits rdma_q
  for (auto it = c->rdma_q.begin(); it != c->rdma_q.end();) {
    Message* m = *it;
    RdmaOp* op = m->op.get();
    if (!op || !op->fenced || op->posted || m->h.sequence > seq) {
      ++it;
      continue;
    }
    // The peer has this op's fence: the Write landed (or the verdict on it arrived). Its
    // completion was lost with the old channel; doing it again could overwrite memory the
    // receiver has already been told about.
    if (op->status < 0) {
      op->status = RDS_RDMA_SUCCESS;
      if (op->notify) notify(m, op, op->status);
    }
    op->verdict_due = false;
    count(Ctr::send_rdma_fence_acked);
    it = c->rdma_q.erase(it);
    done.push_back(m);
  }
  for (Message* m : done) settled(c, m);
}

bool ops_failed(Message* m) {
  for (RdmaOp* op : {m->op.get(), m->atomic_op.get()})
    if (op && op->status >= 0 && op->status != RDS_RDMA_SUCCESS) return true;
  return false;
}

void ops_report(Message* m, int status_if_unknown) {
  for (RdmaOp* op : {m->op.get(), m->atomic_op.get()})
    if (op) notify(m, op, op->status >= 0 ? op->status : status_if_unknown);
}

void ops_release(Message* m) {
  for (RdmaOp* op : {m->op.get(), m->atomic_op.get()}) {
    if (!op) continue;
    for (ibv_mr* mr : op->local_mrs) dereg_after_unlock(mr);
    op->local_mrs.clear();
    if (op->atomic_mr) dereg_after_unlock(op->atomic_mr);
    op->atomic_mr = nullptr;
  }
}

void rdma_post_pending(Conn* c, XmitMode mode) {
  if (c->rdma_q.empty()) return;
  if (c->chan_state != ConnState::up || !c->chan_id || !c->chan_id->qp) {
    rdma_chan_kick(c);
    return;
  }
  if (c->chan_in_xmit) {  // a sendmsg posts on this channel: it looks again (as xmit)
    c->chan_again = true;
    count(Ctr::rdma_post_raced);
    return;
  }
  bool refused = false;
  int unlocked_left = kUnlockedPosts;
  do {
    c->chan_again = false;
    while (!c->rdma_q.empty() && c->chan_inflight < kRdmaDepth) {
      // Off the queue while it is posted: with the lock let go, a completion taken in
      // meanwhile may queue another message's op at the front.
      Message* m = c->rdma_q.front();
      c->rdma_q.pop_front();
      bool let_go = false;
      const XmitMode m_mode = unlocked_left > 0 ? mode : XmitMode::locked;
      const Posted p = post_op(c, m, m_mode, &let_go);
      if (let_go) --unlocked_left;
      if (p == Posted::queued || p == Posted::verdict) requeue_op(c, m, let_go);
      if (p == Posted::done) refused = true;
      if (const char* why = std::exchange(c->chan_down_owed, nullptr)) {
        count(Ctr::rdma_chan_down_by_poster);
        rdma_chan_down(c, why);  // put off while we posted: after the bookkeeping above
        break;
      }
      if (p == Posted::queued) break;  // (a verdict goes next: the loop goes on)
    }
  } while (c->chan_again && c->chan_state == ConnState::up && c->chan_id);
  if (refused && c->state == ConnState::up) xmit(c);  // drop the refused ops' messages
}

bool on_rdma_complete(Conn* c, uint64_t wr_id, ibv_wc_status st) {
  auto it = c->rdma_owner.find(wr_id);
  if (it == c->rdma_owner.end()) return st != IBV_WC_SUCCESS;  // e.g. a Write's confirm
  Message* m = it->second;
  c->rdma_owner.erase(it);
  --c->chan_inflight;
  RdmaOp* op = chan_op(m);
  if (!op) return st != IBV_WC_SUCCESS;
  if (op->verdict_due) {  // a failure verdict's fence
    op->posted = false;
    if (st != IBV_WC_SUCCESS) return true;  // again on the next channel
    op->verdict_due = false;
    settled(c, m);
    rdma_post_pending(c);
    return false;
  }
  if (st == IBV_WC_SUCCESS && op->masked) {
    uint64_t old;
    std::memcpy(&old, reinterpret_cast<const void*>(op->atomic_local), sizeof old);
    if (old != op->guess) {  // missed: the real value is the next guess
      op->guess = old;
      op->posted = false;
      c->rdma_q.push_front(m);
      count(Ctr::send_atomic_masked_retry);
      rdma_post_pending(c);
      return false;
    }
  }
  if (st == IBV_WC_SUCCESS || op_own_error(st)) {
    op->status = rdma_status(st);
    if (op_own_error(st)) c->chan_culprit = true;
    // Notify at completion, as net/rds ib_send.c does for NOTIFY_ME; failures too.
    if (op->status != RDS_RDMA_SUCCESS || op->notify) notify(m, op, op->status);
    op->posted = false;
    if (st != IBV_WC_SUCCESS) {
      fail_rest(m);
      if (op->fenced) op->verdict_due = true;  // the peer may hold its message: drop it
      return true;
    }
    if (op->fenced)
      settled(c, m);  // (m may be gone: a fenced Write is its message's only op)
    else if (pending_op(m))
      c->rdma_q.push_front(m);  // the atomic after the RDMA
    rdma_post_pending(c);
    return false;
  }
  op_unfinished(c, m);
  return true;
}

void rdma_chan_reset_ops(Conn* c) {
  // Ops posted on the old QP whose completions never came are unfinished too.
  for (auto& [wid, m] : c->rdma_owner) op_unfinished(c, m);
  c->rdma_owner.clear();
  c->chan_inflight = 0;
  c->chan_culprit = false;
  // Repost in sequence order (the peer's fences must arrive in it): rebuild the queue from
  // the messages still needing the channel. Fenced ones may have been sent, even acked.
  c->rdma_q.clear();
  for (auto* q : {&c->op_wait, &c->retrans, &c->send_q})
    for (Message* m : *q)
      if (RdmaOp* op = chan_op(m); op && !op->posted) c->rdma_q.push_back(m);
  std::stable_sort(c->rdma_q.begin(), c->rdma_q.end(), [](const Message* a, const Message* b) {
    return a->h.sequence < b->h.sequence;
  });
}

// Registers [addr, addr+len) for the peer as RDS does: whole pages, zero-based, so the
// cookie is rkey | in-page offset << 32 and remote addresses are offsets into the region.
// On a device that ignores the iova (Global::mr_by_va) the region is registered at its
// virtual address instead, with the same cookie: a peer adds the base we tell it.
int map_region_locked(Sock* s, const rds_iovec& v, uint64_t flags, uint64_t* cookie) {
  if (int r = transport_start()) return r;
  if (v.bytes == 0 || v.addr + v.bytes < v.addr) return -EINVAL;
  const uint64_t base = v.addr & ~4095ull;
  const uint64_t end = (v.addr + v.bytes + 4095) & ~4095ull;
  if (end - base > kMaxMsgSize + 4096) return -EMSGSIZE;
  ibv_mr* mr =
      ibv_reg_mr_iova2(g().pd, reinterpret_cast<void*>(base), end - base, g().mr_by_va ? base : 0,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           IBV_ACCESS_REMOTE_ATOMIC);
  if (!mr) return -errno;
  s->mrs[mr->rkey] = mr;
  s->mr_flags[mr->rkey] = flags;
  *cookie = mr->rkey | ((v.addr - base) << 32);
  count(Ctr::rdma_mr_alloc);
  return 0;
}

bool mr_base_asked(Conn* c, uint32_t rkey) {
  if (c->mr_answers.size() >= kMaxMrAnswersOwed) return false;
  // Any socket's region: a cookie is not tied to the socket or address it was made on
  // (net/rds looks the rkey up in the socket the RDMA names, but the responder is the NIC).
  uint64_t base = 0;
  if (g().mr_by_va)
    for (auto& [fd, s] : g().socks)
      if (auto it = s->mrs.find(rkey); !s->closing && it != s->mrs.end()) {
        base = reinterpret_cast<uint64_t>(it->second->addr);
        break;
      }
  c->mr_answers.push_back({rkey, base});
  count(Ctr::rdma_base_answered);
  mr_base_flush(c);
  return true;
}

void mr_base_answered(Conn* c, const wire::RdsMrBase& a) {
  if (c->mr_ask != a.rkey) return;  // an answer to a question we no longer have
  c->mr_ask.reset();
  c->mr_ask_sent = false;
  // Every queued op on that cookie: one question serves the messages that share it.
  for (Message* m : c->rdma_q)
    for (RdmaOp* op : {m->op.get(), m->atomic_op.get()})
      if (op && op->status < 0 && !op->based && op->rkey == a.rkey) {
        op->based = true;
        op->no_region = a.base == 0;
        op->remote_addr += a.base;
      }
  rdma_post_pending(c);
}

void mr_base_lost(Conn* c) {
  const bool asked = c->mr_ask_sent;
  c->mr_ask_sent = false;
  // Only a question that went out on this connection was lost with it (one still waiting
  // for the connection to come up was not).
  if (!c->mr_ask || !asked) return;
  // The op waiting for the answer never ran, but the peer may be gone for good, and then no
  // question goes out again: it is treated as an op the connection was lost under
  // (op_unfinished). An atomic reports DROPPED at once (it was dropped, though unlike a
  // posted one it cannot have run); a Write or Read fails after kMaxOpLosses.
  bool waiting = false;
  for (auto it = c->rdma_q.begin(); it != c->rdma_q.end();) {
    Message* m = *it;
    RdmaOp* op = pending_op(m);
    if (!op || op->based || op->rkey != *c->mr_ask) {
      ++it;
      continue;
    }
    if (!op->atomic && ++op->losses < kMaxOpLosses) {
      waiting = true;
      ++it;
      continue;
    }
    op->status = op->atomic ? RDS_RDMA_DROPPED : RDS_RDMA_OTHER_ERROR;
    notify(m, op, op->status);
    fail_rest(m);
    count(op->atomic ? Ctr::send_rdma_dropped : Ctr::send_rdma_gave_up);
    // Its message stays in send_q until xmit drops it (ops_failed), on the next connection.
    it = c->rdma_q.erase(it);
  }
  if (!waiting) c->mr_ask.reset();  // else asked again once the connection is back
}

void mr_base_flush(Conn* c) {
  if (c->state != ConnState::up) return;
  while (!c->mr_answers.empty()) {
    wire::RdsHeader h;
    h.ext_mr_base = c->mr_answers.front();
    if (!conn_send_header(c, h)) return;
    c->mr_answers.pop_front();
  }
  if (c->mr_ask && !c->mr_ask_sent) {
    wire::RdsHeader h;
    h.ext_mr_base_req = *c->mr_ask;
    c->mr_ask_sent = conn_send_header(c, h);
  }
}

int build_rdma_op(const rds_rdma_args& a, std::unique_ptr<RdmaOp>* out) {
  auto op = std::make_unique<RdmaOp>();
  op->rkey = static_cast<uint32_t>(a.cookie);
  op->flags = a.flags;
  op->user_token = a.user_token;
  op->notify = a.flags & RDS_RDMA_NOTIFY_ME;
  op->write = a.flags & RDS_RDMA_READWRITE;
  op->remote_addr = a.remote_vec.addr + (a.cookie >> 32);
  op->bytes = a.remote_vec.bytes;
  const auto* iov = reinterpret_cast<const rds_iovec*>(a.local_vec_addr);
  uint64_t total = 0;
  for (uint64_t i = 0; i < a.nr_local; ++i) {
    // An empty or wrapping iovec spans no pages: EINVAL (net/rds rdma.c rds_pages_in_vec).
    if (iov[i].addr + iov[i].bytes <= iov[i].addr) return -EINVAL;
    total += iov[i].bytes;
  }
  if (total > a.remote_vec.bytes) return -EINVAL;
  if (a.nr_local > static_cast<uint64_t>(max_local_sge(!op->write))) return -EMSGSIZE;
  for (uint64_t i = 0; i < a.nr_local; ++i) {
    ibv_mr* mr = reg_local(reinterpret_cast<void*>(iov[i].addr), iov[i].bytes);
    if (!mr) {
      const int e = errno == EINVAL ? EFAULT : errno;
      for (ibv_mr* x : op->local_mrs) ibv_dereg_mr(x);
      return -e;
    }
    op->local_mrs.push_back(mr);
    op->local.push_back(ibv_sge{iov[i].addr, static_cast<uint32_t>(iov[i].bytes), mr->lkey});
  }
  *out = std::move(op);
  return 0;
}

int build_atomic_op(const rds_atomic_args& a, int kind, std::unique_ptr<RdmaOp>* out) {
  auto op = std::make_unique<RdmaOp>();
  op->atomic = true;
  op->atomic_kind = kind;
  op->rkey = static_cast<uint32_t>(a.cookie);
  op->flags = a.flags;
  op->user_token = a.user_token;
  op->notify = a.flags & RDS_RDMA_NOTIFY_ME;
  op->remote_addr = a.remote_addr + (a.cookie >> 32);
  op->atomic_local = a.local_addr;
  switch (kind) {
    case RDS_CMSG_ATOMIC_CSWP:
      op->compare = a.cswp.compare;
      op->swap_add = a.cswp.swap;
      break;
    case RDS_CMSG_MASKED_ATOMIC_CSWP:
      op->compare = a.m_cswp.compare;
      op->swap_add = a.m_cswp.swap;
      op->compare_mask = a.m_cswp.compare_mask;
      op->swap_mask = a.m_cswp.swap_mask;
      op->masked = op->compare_mask != ~0ull || op->swap_mask != ~0ull;
      op->guess = op->compare;
      break;
    case RDS_CMSG_ATOMIC_FADD:
      op->swap_add = a.fadd.add;
      break;
    default:  // RDS_CMSG_MASKED_ATOMIC_FADD
      op->swap_add = a.m_fadd.add;
      op->nocarry_mask = a.m_fadd.nocarry_mask;
      op->masked = op->nocarry_mask != 0;
      op->guess = 0;
      break;
  }
  op->atomic_mr = reg_local(reinterpret_cast<void*>(a.local_addr), 8);
  if (!op->atomic_mr) return -EFAULT;
  *out = std::move(op);
  return 0;
}

}  // namespace sv::rds
