// RDS over RC QPs set up with rdma_cm (net/rds ib_cm.c/ib_send.c/ib_recv.c in spirit):
// one connection per peer process, receive buffers posted up front, every send copied
// into a registered slot, and one engine thread for completions, CM events and reconnects.
//
// Connection life cycle (net/rds threads.c "Grand Unified Theory", reduced):
//   down --(send queued / peer connects)--> connecting --ESTABLISHED--> up
//   up/connecting --(error, DISCONNECTED, REJECTED)--> down, retransmit list back on
//   the send queue; reconnect after a random exponential backoff if anything is queued.
// Racing connects (both ends connect at once): see the CONNECT_REQUEST case in handle_cm.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "engine/log.h"
#include "rds/rds_impl.h"
#include "util/fork_local.h"
#include "util/pages.h"
#include "util/settings.h"

namespace sv::rds {
namespace {

constexpr int kMinBackoffMs = 1, kMaxBackoffMs = 1000;
constexpr uint16_t kChanData = wire::kRdsChanData, kChanRdma = wire::kRdsChanRdma;
using PrivBytes = std::array<std::byte, wire::kRdsConnPrivLen>;

// Scatter/gather entries our QPs ask for: 16, or fewer when the device has fewer (Linux siw:
// 6; and 1 for an RDMA Read's local buffers, iWARP's limit). Set by transport_start().
int g_max_send_sge = 16;
int g_max_read_sge = 16;
// SOFTVERBS_RDS_TEST_LATE_ESTABLISHED=1 (tests only): the passive side ignores ESTABLISHED.
const bool g_test_late_established =
    settings::flag_value(SV_SETTING("SOFTVERBS_RDS_TEST_LATE_ESTABLISHED"));
// softverbs_cq_busy_poll (softverbs/verbs_ext.h), null on another provider: our CQ stays
// armed for the completion handler, so the device cannot tell a busy poller by itself. Also
// what tells softverbs from other providers (srq_start, trim_when_quiet).
int (*g_cq_busy_poll)(ibv_cq*, int) = nullptr;
// softverbs_cq_block (verbs_ext.h), likewise.
int (*g_cq_block)(ibv_cq*, int) = nullptr;
// softverbs_cq_quiet (verbs_ext.h), likewise.
int (*g_cq_quiet)(ibv_cq*, int) = nullptr;
// softverbs_qp_set_ib_completion / softverbs_qp_ib_completion, null on another provider: the
// RDMA channel asks for IB's completion rule, and where the peer is softverbs its Writes
// complete once placed, so they need no confirming Read (rdma.cc).
int (*g_qp_set_ib_completion)(ibv_qp*, int) = nullptr;
int (*g_qp_ib_completion)(ibv_qp*) = nullptr;
// softverbs_srq_trim (verbs_ext.h), null on another provider: the shared receive pool gives
// its pages back when every connection is quiet (trim_when_quiet).
long (*g_srq_trim)(ibv_srq*) = nullptr;

uint64_t now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void comm_established(Conn* c);
int drain_cq_locked(bool own_deposit = false);
// This thread holds Global::poll_mu already (a completion handler, for its whole run).
thread_local bool tl_poll_held = false;

// The address of a connection's end, for the log (RDS connections are between addresses).
std::string addr_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return ip;
}

// The engine thread recomputes its poll() timeout (a new timer, or an ack due sooner).
void wake_engine() {
  if (g().wake_fd < 0) return;
  uint64_t one = 1;
  ssize_t w = write(g().wake_fd, &one, sizeof one);
  (void)w;
}

}  // namespace

// The CQ has a slot for every WR that can be outstanding on the QPs sharing it (an overrun
// is a CQ error on IB, spec 11.4.2.1). It starts at kCqInitial and grows with the QPs: a
// ring of 16,384 completions (772 KiB) was resident in every process, and once the ring
// has wrapped all of it is (issue 28 item 3). A provider that cannot resize (rdma-core's
// siw) gets kCqFixed at once and the QPs share it, as before.
namespace {

// Promises `need` more slots of the CQ, growing it first if it can. False if what is promised
// now passes what the CQ holds (the QPs share it then; the pool does not grow past it).
bool cq_reserve(uint32_t need) {
  Global& G = g();
  std::lock_guard lk(G.cq_size_mu);
  if (G.cq_resizable && G.cq_reserved + need > static_cast<uint32_t>(G.cq->cqe) &&
      G.cq->cqe < G.cq_max) {
    const uint32_t want = std::max(G.cq_reserved + need, 2 * static_cast<uint32_t>(G.cq->cqe));
    // Past the device's limit the QPs share what there is (as with a fixed CQ).
    if (ibv_resize_cq(G.cq, static_cast<int>(std::min<uint32_t>(want, G.cq_max))) != 0)
      SV_INFO("rds: CQ stays at %d entries", G.cq->cqe);
  }
  G.cq_reserved += need;
  return G.cq_reserved <= static_cast<uint32_t>(G.cq->cqe);
}

void cq_unreserve(uint32_t n) {
  std::lock_guard lk(g().cq_size_mu);
  g().cq_reserved -= n;
}

}  // namespace

int create_qp(rdma_cm_id* id, ibv_qp_init_attr* a) {
  Global& G = g();
  const uint32_t need = a->cap.max_send_wr + a->cap.max_recv_wr;
  cq_reserve(need);
  if (rdma_create_qp(id, G.pd, a)) {
    const int e = errno;
    std::lock_guard lk(G.cq_size_mu);
    G.cq_reserved -= need;
    errno = e;
    return -1;
  }
  std::lock_guard lk(G.cq_size_mu);
  G.cq_share[id->qp] = need;
  return 0;
}

void destroy_qp(rdma_cm_id* id) {
  if (!id->qp) return;
  Global& G = g();
  // A data QP on the shared receive queue goes to ERR first, as IB asks of a QP leaving an
  // SRQ (error, drain, destroy): on softverbs the receive it had taken, if a message was
  // half in, completes with a flush error, or goes back to the SRQ if the QP is destroyed
  // before its error transition ran (engine/qp_state.cc); either way its buffer returns.
  const bool on_srq = G.srq && G.data_qps.erase(id->qp->qp_num) != 0;
  if (on_srq) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(id->qp, &at, IBV_QP_STATE);
  }
  {
    std::lock_guard lk(G.cq_size_mu);
    auto it = G.cq_share.find(id->qp);
    if (it != G.cq_share.end()) {
      G.cq_reserved -= it->second;
      G.cq_share.erase(it);
    }
  }
  rdma_destroy_qp(id);
  // Every completion of the destroyed QP is in the CQ now (softverbs destroys a QP after its
  // queued work, in order; SRQ mode is softverbs only): take them in, their buffers back to
  // the pool, before a new QP can be given its number.
  if (on_srq) drain_cq_locked();
}

namespace {

// The pool's buffer idx: chunk idx / kSrqChunk, slot idx % kSrqChunk.
std::byte* srq_buf(uint32_t idx, uint32_t* lkey) {
  Global::SrqChunk& ch = *g().srq_chunks[idx / kSrqChunk];
  *lkey = ch.mr->lkey;
  return &ch.buf[static_cast<size_t>(idx % kSrqChunk) * kBufSize];
}

// A pool buffer as its receive names it: resolved under the lock (srq_chunks may grow, and
// move, under it), posted with or without it (a chunk, once made, stays where it is).
struct SrqRepost {
  uint64_t addr;
  uint32_t lkey;
  uint32_t idx;
};

SrqRepost srq_repost(uint32_t idx) {
  uint32_t lkey = 0;
  std::byte* b = srq_buf(idx, &lkey);
  return {reinterpret_cast<uint64_t>(b), lkey, idx};
}

// Pool buffers posted back in one chain: one call into the device. How many went.
size_t srq_post_chain(const SrqRepost* r, size_t n) {
  constexpr size_t kChain = 64;
  size_t posted = 0;
  while (n) {
    const size_t k = std::min(n, kChain);
    ibv_sge s[kChain];
    ibv_recv_wr wr[kChain];
    for (size_t i = 0; i < k; ++i) {
      s[i] = ibv_sge{r[i].addr, static_cast<uint32_t>(kBufSize), r[i].lkey};
      wr[i] = ibv_recv_wr{};
      wr[i].wr_id = make_wr_id(0, 0, kSrqRecv, r[i].idx);
      wr[i].sg_list = &s[i];
      wr[i].num_sge = 1;
      wr[i].next = i + 1 < k ? &wr[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    size_t lost = 0;
    // The verbs post calls return their error (libibverbs sets no errno for them).
    if (const int e = ibv_post_srq_recv(g().srq, wr, &bad)) {
      for (ibv_recv_wr* w = bad; w; w = w->next, ++lost)
        SV_WARN("rds: ibv_post_srq_recv: %s (receive buffer %u lost)", strerror(e),
                wr_idx(w->wr_id));
    }
    posted += k - lost;
    r += k;
    n -= k;
  }
  return posted;
}

void srq_post(uint32_t idx) {
  const SrqRepost r = srq_repost(idx);
  srq_post_chain(&r, 1);
}

// This thread's pool buffers to post back once it lets the stack lock go: a received
// fragment's buffer, once take_frag has copied what it keeps, is the pool's again, and its
// post is a verbs call the lock need not cover (issue 32's "no lock held across a verbs
// call"; net/rds's ib recv refill runs outside c_lock as well). The pool's buffers and the SRQ
// live as long as the process, so a post after the unlock finds them as they were. Kept as
// the deregistrations are (dereg_after_unlock): a plain array that each unlock empties, so
// a fork, whose prepare handler takes the lock, copies none into the child. At most 16 wait
// (a quarter of the initial pool, kSrqInitial): one long hold (a burst from many peers)
// must not take so much of the pool off the SRQ that it falls below kSrqLowWater, which
// would stall every connection (RNR) and grow the pool for good. Past that, the list goes at
// once, as one chain, under the lock.
constexpr size_t kDeferredReposts = 16;
thread_local SrqRepost tl_reposts[kDeferredReposts];
thread_local size_t tl_nrepost = 0;

// The pool's buffers this thread queued while it held the lock. The list is taken before its
// post, which can restart a stalled QP's receive path on this thread. `unlocked`: counted as
// posted off the lock.
void run_reposts(bool unlocked) {
  if (!tl_nrepost) return;
  SrqRepost r[kDeferredReposts];
  const size_t n = tl_nrepost;
  std::copy_n(tl_reposts, n, r);
  tl_nrepost = 0;
  const size_t posted = srq_post_chain(r, n);
  if (unlocked) count(Ctr::recv_repost_unlocked, posted);
}

void srq_post_after_unlock(uint32_t idx) {
  if (tl_nrepost == kDeferredReposts) run_reposts(false);
  tl_reposts[tl_nrepost++] = srq_repost(idx);
}

// Grows the pool to `want` buffers (at most the SRQ's max_wr), a chunk at a time; true if it
// grew. A chunk that cannot be had (memory, a registration, room in the CQ: an overrun CQ
// loses completions, and their buffers with them) leaves the pool as it is: the connections
// share fewer buffers, and wait (RNR) for them.
bool srq_grow(size_t want) {
  Global& G = g();
  const size_t before = G.srq_chunks.size();
  want = std::min<size_t>(want, static_cast<size_t>(G.srq_cap));
  while (G.srq_chunks.size() * kSrqChunk < want) {
    auto ch = std::make_unique<Global::SrqChunk>();
    if (!ch->buf.allocate(static_cast<size_t>(kSrqChunk) * kBufSize)) break;
    if (!cq_reserve(kSrqChunk)) {
      cq_unreserve(kSrqChunk);
      SV_INFO("rds: receive pool stays at %zu buffers: the CQ holds %d",
              G.srq_chunks.size() * kSrqChunk, G.cq->cqe);
      break;
    }
    ch->mr = ibv_reg_mr(G.pd, ch->buf.data(), ch->buf.size(), kLocalWrite);
    if (!ch->mr) {
      cq_unreserve(kSrqChunk);
      SV_INFO("rds: receive pool stays at %zu buffers: ibv_reg_mr: %s",
              G.srq_chunks.size() * kSrqChunk, strerror(errno));
      break;
    }
    const auto first = static_cast<uint32_t>(G.srq_chunks.size() * kSrqChunk);
    G.srq_chunks.push_back(std::move(ch));
    for (uint32_t i = 0; i < static_cast<uint32_t>(kSrqChunk); ++i) srq_post(first + i);
  }
  return G.srq_chunks.size() > before;
}

void srq_arm_limit();

// SRQ mode, at start: one receive queue for every data QP (net/rds ib's SRQ mode, as
// Oracle's UEK runs RDS-IB), so a peer costs no receive buffers of its own. Only on
// softverbs, whose QPs wait for a receive when the pool runs dry (RNR, as IB's): an iWARP
// device (Linux siw) ends the connection instead (DDP "no buffer"), and what it does with
// an SRQ's WQEs when a QP goes is its own. Off with SOFTVERBS_RDS_SRQ=0: a ring of
// kRecvBufs per connection, as on any other device.
void srq_start(const ibv_device_attr& da) {
  Global& G = g();
  if (!settings::flag_value(SV_SETTING("SOFTVERBS_RDS_SRQ")) || da.max_srq <= 0 ||
      da.max_srq_wr < kSrqInitial || !g_cq_busy_poll)
    return;
  ibv_srq_init_attr a{};
  a.attr.max_wr = static_cast<uint32_t>(std::min(da.max_srq_wr, kSrqMax));
  a.attr.max_sge = 1;
  G.srq = ibv_create_srq(G.pd, &a);
  if (!G.srq) {
    SV_INFO("rds: no shared receive queue (%s): receive buffers per connection", strerror(errno));
    return;
  }
  G.srq_cap = static_cast<int>(a.attr.max_wr);
  static const size_t first = settings::uint_value(SV_SETTING("SOFTVERBS_RDS_TEST_SRQ_BUFS"));
  if (!srq_grow(first ? first : kSrqInitial)) {
    // Not one buffer: every connection would wait for ever. The rings, as without SRQs.
    ibv_destroy_srq(G.srq);
    G.srq = nullptr;
    SV_INFO("rds: the receive pool has no buffer: receive buffers per connection");
    return;
  }
  srq_arm_limit();
}

// The pool grows where receives run short, not per connection: a peer that is connected
// but quiet costs no receive buffer (each buffer goes back as soon as its message is
// copied out). The SRQ's limit event (IB spec 10.2.9.4; rdma-core's ibv_modify_srq(3))
// says fewer than kSrqLowWater are posted; it is one-shot, so it is armed again after.
void srq_arm_limit() {
  Global& G = g();
  static const bool grow = settings::flag_value(SV_SETTING("SOFTVERBS_RDS_TEST_SRQ_GROW"));
  if (!grow || G.srq_chunks.size() * kSrqChunk >= static_cast<size_t>(G.srq_cap)) return;
  ibv_srq_attr at{};
  at.srq_limit = kSrqLowWater;
  if (ibv_modify_srq(G.srq, &at, IBV_SRQ_LIMIT))
    SV_INFO("rds: receive pool limit not armed: %s (the pool stays at %zu)", strerror(errno),
            G.srq_chunks.size() * kSrqChunk);
}

// The device's async events: the pool's limit, and whatever else comes (read so that the
// device's queue of them does not grow; the data path learns of a QP's failure from its
// completions and rdma_cm's events). The context is the one rdma_cm gives every id of the
// process: in SRQ mode RDS reads its events, non-blocking (docs/rds.md).
void handle_async_events() {
  Global& G = g();
  for (ibv_async_event ev; ibv_get_async_event(G.verbs, &ev) == 0;) {
    const bool limit = ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == G.srq;
    ibv_ack_async_event(&ev);
    if (!limit) continue;
    // Not armed again if it could not grow: the pool stays as it is (srq_grow said why).
    if (!srq_grow(G.srq_chunks.size() * kSrqChunk + kSrqChunk)) continue;
    count(Ctr::recv_pool_grown);
    srq_arm_limit();
  }
}

// A receive of connection c completed into buf: its fragment goes to the stack. False when
// there is none to take, or the connection went down over it (an error status, a protocol
// error: net/rds drops the connection, "disconnecting and reconnecting").
bool take_frag(Conn* c, const ibv_wc& wc, const std::byte* buf) {
  if (wc.status != IBV_WC_SUCCESS) {
    if (c->state == ConnState::up) conn_down(c, "recv error");
    return false;
  }
  // After a protocol error nothing more of this QP is taken, not even what conn_down's
  // drain still finds: the peer retransmits all that was not acked on the next connection,
  // and a message taken now past a gap (the held ones dropped) would make those look seen.
  if (c->rx_refused) return false;
  if (c->state == ConnState::connecting && !c->active) comm_established(c);
  // An active side may see the peer's first message before its ESTABLISHED (connecting);
  // comm_established may have brought it down instead (a bad ack).
  if (c->state == ConnState::down) return false;
  if (on_frag(c, buf, wc.byte_len)) return true;
  count(Ctr::recv_protocol_error);
  c->rx_refused = true;
  conn_down(c, "protocol error");
  return false;
}

// A receive of the pool completed, on the data QP it names.
void on_srq_recv(const ibv_wc& wc) {
  Global& G = g();
  const uint32_t idx = wr_idx(wc.wr_id);
  if (idx >= G.srq_chunks.size() * kSrqChunk) return;  // not one of ours: nothing to repost
  auto it = G.data_qps.find(wc.qp_num);
  Conn* c = it == G.data_qps.end() ? nullptr : it->second;
  if (!c) {
    // Its QP is gone (destroy_qp drained it): the buffer only goes back.
    count(Ctr::wc_stale);
    srq_post_after_unlock(idx);
    return;
  }
  c->last_active = std::chrono::steady_clock::now();
  uint32_t lkey = 0;
  take_frag(c, wc, srq_buf(idx, &lkey));
  srq_post_after_unlock(idx);  // whatever became of it: take_frag copied what it keeps
}

int setup_qp(Conn* c, rdma_cm_id* id) {
  Global& G = g();
  ibv_qp_init_attr a{};
  a.send_cq = G.cq;
  a.recv_cq = G.cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = kSendSlots + 64;
  a.cap.max_send_sge = static_cast<uint32_t>(g_max_send_sge);
  if (G.srq) {
    a.srq = G.srq;  // receives come from the pool
  } else {
    a.cap.max_recv_wr = kRecvBufs + 1;
    a.cap.max_recv_sge = 1;
  }
  if (create_qp(id, &a)) return -errno;
  // RFC 5040's rule on the data channel, whatever the process default: RDS's own sequence
  // numbers and acks say what the peer has, and a send slot that comes back on transmit
  // costs no round trip (busy-polled rds-stress -D 4096: 100 us a request under IB's rule,
  // 48 us under RFC 5040's). The RDMA channel asks for IB's rule (setup_chan_qp).
  if (g_qp_set_ib_completion) g_qp_set_ib_completion(id->qp, 0);
  // Registered once per connection object. A registration can fail (a real provider pins
  // the pages: ENOMEM beyond RLIMIT_MEMLOCK); the next setup tries again for what is missing.
  if (c->sbuf.empty() && !c->sbuf.allocate(static_cast<size_t>(kSendSlots) * kBufSize))
    return -ENOMEM;
  if (!G.srq && c->rbuf.empty() && !c->rbuf.allocate(static_cast<size_t>(kRecvBufs) * kBufSize))
    return -ENOMEM;
  if (!G.srq && !c->rmr) c->rmr = ibv_reg_mr(G.pd, c->rbuf.data(), c->rbuf.size(), kLocalWrite);
  if (!c->smr) c->smr = ibv_reg_mr(G.pd, c->sbuf.data(), c->sbuf.size(), 0);
  if ((!G.srq && !c->rmr) || !c->smr) return -ENOMEM;
  c->free_slots.clear();
  for (int i = 0; i < kSendSlots; ++i) c->free_slots.push_back(i);
  c->posted.clear();
  c->since_signal = 0;
  if (G.srq) {
    G.data_qps[id->qp->qp_num] = c;
    return 0;
  }
  const uint32_t cid = g().id_of[c];
  for (int i = 0; i < kRecvBufs; ++i) {
    ibv_sge s{reinterpret_cast<uint64_t>(&c->rbuf[static_cast<size_t>(i) * kBufSize]),
              static_cast<uint32_t>(kBufSize), c->rmr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = make_wr_id(cid, c->inc, kRecv, static_cast<uint32_t>(i));
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    if (ibv_post_recv(id->qp, &wr, &bad)) return -errno;
  }
  return 0;
}

// The RDMA channel carries RDMA Writes/Reads/atomics and the fences behind Writes (16-byte
// inline Sends): its passive side, which responds, receives the fences.
int setup_rdma_qp(rdma_cm_id* id) {
  Global& G = g();
  ibv_qp_init_attr a{};
  a.send_cq = G.cq;
  a.recv_cq = G.cq;
  a.qp_type = IBV_QPT_RC;
  // A Write may be followed by its confirming Read (rdma.cc).
  a.cap.max_send_wr = 2 * kRdmaDepth + 8;
  a.cap.max_recv_wr = kFenceRecvs;
  a.cap.max_send_sge = static_cast<uint32_t>(g_max_send_sge);
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = wire::kRdsFenceLen;
  if (create_qp(id, &a)) return -errno;
  // Only one-sided ops and fences run here, so no Send of the peer's can hold its acks back (RNR).
  // SOFTVERBS_RDS_CONFIRM_READ=1 keeps the confirming Read (the rule of any iWARP peer).
  if (g_qp_set_ib_completion && !settings::flag_value(SV_SETTING("SOFTVERBS_RDS_CONFIRM_READ")))
    g_qp_set_ib_completion(id->qp, 1);
  return 0;
}

PrivBytes make_priv(Conn* c, uint16_t kind = kChanData) {
  wire::RdsConnPriv p;
  p.ip = c->local.sin_addr.s_addr;
  p.cm_port = g().cm_port;
  p.kind = kind;
  if (!g().atomics) p.flags |= wire::kRdsPrivNoAtomics;
  if (g().mr_by_va) p.flags |= wire::kRdsPrivVaMrs;
  // An RDMA channel's accept acks the fences we have (rdma_fence_acked), a data
  // connection's the messages.
  p.ack_seq = kind == kChanRdma ? c->fence_seq : rx_ack_seq(c);
  p.gen = g().gen;
  PrivBytes b;
  wire::rds_conn_priv_encode(p, b.data());
  return b;
}

// What a peer's private data (request or accept, either channel) says of its device.
void note_peer_caps(Conn* c, const wire::RdsConnPriv& p) {
  c->peer_no_atomics = p.flags & wire::kRdsPrivNoAtomics;
  c->peer_va_mrs = p.flags & wire::kRdsPrivVaMrs;
}

void destroy_id(Conn* c) {
  if (!c->id) return;
  rdma_cm_id* id = c->id;
  c->id = nullptr;
  id->context = nullptr;
  destroy_qp(id);
  rdma_destroy_id(id);
}

// Randomised exponential backoff (net/rds threads.c rds_queue_reconnect).
void schedule_reconnect(Conn* c, uint16_t chan = kChanData) {
  int& backoff = chan == kChanData ? c->backoff_ms : c->chan_backoff_ms;
  const uint64_t attempts = chan == kChanData ? c->reconnects : c->chan_connects;
  backoff = backoff ? std::min(backoff * 2, kMaxBackoffMs) : kMinBackoffMs;
  (chan == kChanData ? c->reconnect_pending : c->chan_reconnect_pending) = true;
  uint32_t r;
  if (getrandom(&r, sizeof r, 0) != sizeof r) r = 7;
  const int delay = attempts == 0 ? 0 : static_cast<int>(r % static_cast<uint32_t>(backoff)) + 1;
  g().timers.emplace(std::chrono::steady_clock::now() + std::chrono::milliseconds(delay),
                     std::make_pair(c, chan));
  wake_engine();
}

void start_connect(Conn* c) {
  Global& G = g();
  if (c->state != ConnState::down) return;
  if (rdma_create_id(G.cm_ch, &c->id, c, RDMA_PS_TCP)) {
    schedule_reconnect(c);
    return;
  }
  c->state = ConnState::connecting;
  c->active = true;
  ++c->reconnects;
  count(Ctr::conn_connect_attempts);
  // From our address: the peer checks that the connection comes from where it claims.
  sockaddr_in src = c->local;
  src.sin_port = 0;
  if (rdma_resolve_addr(c->id, reinterpret_cast<sockaddr*>(&src),
                        reinterpret_cast<sockaddr*>(&c->peer), 2000)) {
    conn_down(c, "resolve_addr");
  }
}

int idle_close_ms() {
  static_assert(settings::get("SOFTVERBS_RDS_IDLE_MS").dflt == kIdleCloseMs);
  static const int ms = static_cast<int>(settings::uint_value(SV_SETTING("SOFTVERBS_RDS_IDLE_MS")));
  return ms;
}

// Closes connections that have had nothing to do for idle_close_ms (kIdleCloseMs).
void idle_sweep() {
  const int ms = idle_close_ms();
  if (ms <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto& [k, c] : g().conns) {
    if (c->state != ConnState::up || now - c->last_active < std::chrono::milliseconds(ms)) continue;
    if (!c->send_q.empty() || !c->retrans.empty() || !c->rdma_q.empty() || c->ack_needed ||
        c->chan_inflight || c->rx.in_msg)
      continue;
    count(Ctr::conn_idle_close);
    if (c->chan_id) rdma_chan_down(c, "idle");
    conn_down(c, "idle");
  }
}

// What a quiet spell gives back (SOFTVERBS_IDLE_TRIM_MS, at least 1 s here: a lower value,
// chosen for the engine's buffers, would make RDS ack and trim the heap all the time).
//
// A connection quiet that long gives back the pages of its free send slots (a burst of large
// messages leaves up to 64 x 64 KiB resident until the idle close, 30 s later). Slots sit
// 64 KiB + 48 apart, so a slot's first page is shared with the one before it: the pages go
// back by runs of adjacent free slots. Slots whose sends went unsignaled are not known to be
// free until a signaled one retires them: such a connection first sends one signaled ack,
// and its slots go back a quiet spell later. Only on softverbs, which reads a slot only
// while its send is posted: a device that pinned the slots' pages for its registration
// (siw, rxe, a NIC) would go on sending from the old pages while we write the new ones.
//
// Messages are assembled in the heap (recv.cc) and freed once read; the allocator keeps what
// a burst of large ones freed (8 MiB of a thread's arena after 20 peers sent 6 MB each). When
// a connection goes quiet, or all are, the free heap goes back (glibc's malloc_trim) at most
// once a period, outside the stack lock: true asks the caller for it.
bool trim_when_quiet() {
  static const auto ms = settings::uint_value(SV_SETTING("SOFTVERBS_IDLE_TRIM_MS"));
  if (ms == 0) return false;
  const bool softverbs = g_cq_busy_poll != nullptr;
  // Engine thread only.
  static std::chrono::steady_clock::time_point trimmed_for{}, heap_trimmed_at{};
  static bool heap_pending = false;
  const auto now = std::chrono::steady_clock::now();
  const auto quiet = std::chrono::milliseconds(std::max<uint64_t>(ms, 1000));
  std::chrono::steady_clock::time_point last{};
  std::vector<int> free_slots;
  for (auto& [k, c] : g().conns) {
    last = std::max(last, c->last_active);
    if (c->slots_trimmed_for == c->last_active || now - c->last_active < quiet) continue;
    c->slots_trimmed_for = c->last_active;
    heap_pending = true;
    if (!softverbs || c->sbuf.empty()) continue;
    if (!c->posted.empty() && c->state == ConnState::up) {
      c->signal_next = true;
      conn_send_ack(c);
    }
    free_slots.assign(c->free_slots.begin(), c->free_slots.end());
    std::sort(free_slots.begin(), free_slots.end());
    const auto base = reinterpret_cast<uintptr_t>(c->sbuf.data());
    for (size_t i = 0; i < free_slots.size();) {
      size_t j = i + 1;
      while (j < free_slots.size() && free_slots[j] == free_slots[j - 1] + 1) ++j;
      const uintptr_t from = base + static_cast<uintptr_t>(free_slots[i]) * kBufSize;
      const uintptr_t to = base + static_cast<uintptr_t>(free_slots[j - 1] + 1) * kBufSize;
      give_back_pages(from, to);
      i = j;
    }
  }
  if (last != trimmed_for && now - last >= quiet) {
    trimmed_for = last;
    heap_pending = true;
    // The pool keeps what the largest burst grew it to, every buffer of it written once and
    // resident (283 KiB per peer after 40 peers sent 6 MB each). Its posted buffers' pages
    // go back; they return, one message at a time, when traffic does.
    if (g().srq && g_srq_trim) {
      const long n = g_srq_trim(g().srq);
      if (n > 0) count(Ctr::recv_pool_trimmed_bytes, static_cast<uint64_t>(n));
    }
  }
  if (!heap_pending || now - heap_trimmed_at < quiet) return false;
  heap_pending = false;
  heap_trimmed_at = now;
  return true;
}

void conn_up(Conn* c, const wire::RdsConnPriv& peer) {
  // The accept acks what the peer has of ours; more than we ever sent is a lie.
  if (!on_ack(c, peer.ack_seq)) {
    count(Ctr::recv_bad_ack);
    conn_down(c, "bad ack");
    return;
  }
  c->state = ConnState::up;
  c->backoff_ms = 0;
  c->last_active = std::chrono::steady_clock::now();
  count(Ctr::conn_up);
  SV_INFO("rds: connection %s -> %s up", addr_text(c->local).c_str(), addr_text(c->peer).c_str());
  cong_send_map(c);  // every (re)connection carries our current map (threads.c)
  xmit(c);
  mr_base_flush(c);  // a question or answers the last connection lost
}

void handle_wc(const ibv_wc& wc);

// A receive on the QP we accepted proves the connection up, whether or not its ESTABLISHED
// event has been read yet (IB's COMM_EST, on which net/rds ib_cm.c calls rdma_notify). The
// engine thread reads that event; a process that takes its messages in on its own thread
// (a blocked poll(), a busy poller) and exits at once would otherwise never ack them: acks
// go only on a connection that is up, and its senders would keep them queued for nobody.
void comm_established(Conn* c) {
  wire::RdsConnPriv p;
  p.ack_seq = 0;  // as ESTABLISHED on this side: nothing acked, the request carried it
  count(Ctr::conn_up_by_receive);
  conn_up(c, p);
}

// Handles every completion already in the shared CQ; returns how many. A short batch ends
// it: the CQ was empty then, and polling again would only make the device look at its
// sockets once more (a syscall each) for bytes that, if they come, still wake whoever
// receives (the progress thread's level-triggered EPOLLIN, a poller's next pass).
//
// Handling a completion may drain again (a connection or RDMA channel going down takes in
// what its QP completed first). The completions polled and not yet handled wait in
// G.wc_backlog, and a nested drain handles them before it polls: so every completion is
// handled in CQ order. Handling them in a local batch reordered one QP's receives (the
// nested drain took a later message first, and the earlier one was then a duplicate: a
// message lost, and everything behind its fence held for ever).
int drain_cq_locked(bool own_deposit) {
  Global& G = g();
  int total = 0;
  bool more = true;
  for (;;) {
    if (G.wc_backlog.empty()) {
      if (!more) break;
      constexpr int kBatch = 32;
      std::unique_lock plk(G.poll_mu, std::defer_lock);
      if (!tl_poll_held) plk.lock();
      // A busy poller's catch first: it was polled before anything still in the CQ. The
      // CQ is polled after it, since a drain must see everything completed so far
      // (conn_down's); only the busy poller's own drain, whose short poll ran the receive
      // path a moment ago, takes it as that poll.
      if (!G.polled.empty()) {
        G.wc_backlog.swap(G.polled);
        const int n = static_cast<int>(G.wc_backlog.size());
        total += n;
        more = !own_deposit || n >= kBatch;
      } else {
        ibv_wc wc[kBatch];
        const int n = ibv_poll_cq(G.cq, kBatch, wc);
        if (n <= 0) break;
        G.wc_backlog.assign(wc, wc + n);
        total += n;
        more = n == kBatch;
      }
    }
    const ibv_wc w = G.wc_backlog.front();
    G.wc_backlog.pop_front();
    handle_wc(w);
  }
  return total;
}

// A connection that is down holds no buffers: a peer that went away (or went idle) costs
// the Conn alone, which keeps the sequence state a reconnect needs. setup_qp allocates them
// again. The QP is destroyed first, so nothing still writes into them.
void release_buffers(Conn* c) {
  if (c->rmr) ibv_dereg_mr(c->rmr);
  if (c->smr) ibv_dereg_mr(c->smr);
  c->rmr = c->smr = nullptr;
  c->rbuf.release();
  c->sbuf.release();
  c->free_slots.clear();
  // The QP's own memory (header arena, rings) was freed into the allocator, which keeps it;
  // a peer that went away should cost nothing, so hand free pages back (rare: per close).
  // On the engine thread, outside the stack lock: malloc_trim walks every arena, and every
  // completion handler would wait for it (they leave their work to the lock's holder).
  g().heap_trim_due.store(true, std::memory_order_relaxed);
  wake_engine();
}

}  // namespace

void conn_down(Conn* c, const char* why) {
  if (c->tearing_down || (c->state == ConnState::down && !c->id)) return;
  if (c->in_xmit) {
    // A sendmsg is posting on the QP with the stack lock let go: the QP, its send slots and
    // its queues are that thread's until it has the lock back, and it tears down then.
    if (!c->down_owed) c->down_owed = why;
    count(Ctr::conn_down_deferred);
    return;
  }
  SV_INFO("rds: connection %s -> %s down: %s", addr_text(c->local).c_str(),
          addr_text(c->peer).c_str(), why);
  // Completions generated before the disconnect event (the error that caused it, with
  // the failing op's status) must be seen before the queues are reset.
  c->tearing_down = true;
  drain_cq_locked();
  c->tearing_down = false;
  count(Ctr::conn_reset);
  // A connect that never came up: the process we looked up may be gone.
  const bool connect_failed = c->state == ConnState::connecting && c->active;
  if (connect_failed) {
    directory_forget(c->peer_gen);
    registry_forget(c->peer_gen);
  }
  c->state = ConnState::down;
  destroy_id(c);
  // Base lookups went with the QP: ours is asked again on the next connection (the peer
  // asks again for its own), unless its op has had its chances (mr_base_lost).
  mr_base_lost(c);
  c->mr_answers.clear();
  ++c->inc;  // whatever the old QP still completes is stale from here on
  c->rx_refused = false;
  conn_reset_queues(c);
  if (connect_failed) conn_reroute_orphans(c);
  release_buffers(c);
  // Forget the peer's congestion map: it may have changed while we were down, and a stale
  // congested bit would refuse every send (ENOBUFS) so nothing is queued and nobody
  // reconnects. The next connection brings the current map (cong_send_map at conn_up).
  cong_map_forgotten(c);
  if (!c->send_q.empty()) schedule_reconnect(c);
}

namespace {

// Events after which an rdma_cm id (and its QP) is of no further use.
bool cm_id_lost(rdma_cm_event_type e) {
  switch (e) {
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return true;
    default:
      return false;
  }
}

}  // namespace

void rdma_chan_down(Conn* c, const char* why) {
  if (c->chan_tearing_down || (c->chan_state == ConnState::down && !c->chan_id)) return;
  if (c->chan_in_xmit) {
    // A sendmsg is posting on the channel with the stack lock let go: its QP and its ops'
    // records are that thread's until it has the lock back, and it tears down then.
    if (!c->chan_down_owed) c->chan_down_owed = why;
    count(Ctr::rdma_chan_down_deferred);
    return;
  }
  SV_INFO("rds: RDMA channel %s -> %s down: %s", addr_text(c->local).c_str(),
          addr_text(c->peer).c_str(), why);
  c->chan_state = ConnState::down;
  // Drain first: the failing op's own completion names the culprit, and the flushed ops
  // behind it must be seen before the QP is destroyed.
  c->chan_tearing_down = true;
  drain_cq_locked();
  c->chan_tearing_down = false;
  count(Ctr::rdma_chan_reset);
  if (c->chan_id) {
    rdma_cm_id* id = c->chan_id;
    c->chan_id = nullptr;
    g().chan_conn.erase(id);
    destroy_qp(id);
    rdma_destroy_id(id);
  }
  ++c->chan_inc;
  rdma_chan_reset_ops(c);
  if (!c->rdma_q.empty()) schedule_reconnect(c, kChanRdma);
}

namespace {

void rdma_chan_connect(Conn* c) {
  if (c->chan_state != ConnState::down) return;
  if (rdma_create_id(g().cm_ch, &c->chan_id, nullptr, RDMA_PS_TCP)) {
    c->chan_id = nullptr;
    schedule_reconnect(c, kChanRdma);
    return;
  }
  g().chan_conn[c->chan_id] = c;
  c->chan_state = ConnState::connecting;
  ++c->chan_connects;
  count(Ctr::rdma_chan_connect_attempts);
  sockaddr_in src = c->local;
  src.sin_port = 0;
  if (rdma_resolve_addr(c->chan_id, reinterpret_cast<sockaddr*>(&src),
                        reinterpret_cast<sockaddr*>(&c->peer), 2000))
    rdma_chan_down(c, "resolve_addr");
}

void handle_rdma_cm(Conn* c, rdma_cm_event* ev) {
  rdma_cm_id* id = ev->id;
  switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(id, 2000)) rdma_chan_down(c, "resolve_route");
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (setup_rdma_qp(id)) {
        rdma_chan_down(c, "setup_qp");
        break;
      }
      const PrivBytes p = make_priv(c, kChanRdma);
      rdma_conn_param cp{};
      cp.private_data = p.data();
      cp.private_data_len = static_cast<uint8_t>(p.size());
      cp.responder_resources = 0;  // the peer never reads through this QP
      cp.initiator_depth = kRdmaDepth;
      cp.retry_count = 7;
      cp.rnr_retry_count = 7;
      if (rdma_connect(id, &cp)) rdma_chan_down(c, "connect");
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED: {
      c->chan_state = ConnState::up;
      c->chan_placed = g_qp_ib_completion && g_qp_ib_completion(id->qp) == 1;
      c->chan_backoff_ms = 0;
      count(Ctr::rdma_chan_up);
      SV_INFO("rds: RDMA channel %s -> %s up", addr_text(c->local).c_str(),
              addr_text(c->peer).c_str());
      // The accept says which of our fences the peer has: those ops are not redone.
      wire::RdsConnPriv p;
      if (wire::rds_conn_priv_decode(static_cast<const std::byte*>(ev->param.conn.private_data),
                                     ev->param.conn.private_data_len, p) &&
          p.kind == kChanRdma) {
        note_peer_caps(c, p);
        rdma_fence_acked(c, p.ack_seq);
      }
      rdma_post_pending(c);
      break;
    }
    default:
      if (cm_id_lost(ev->event)) rdma_chan_down(c, rdma_event_str(ev->event));
      break;
  }
}

void destroy_fence_chan(rdma_cm_id* id) {
  auto it = g().passive_rids.find(id);
  if (it == g().passive_rids.end()) return;
  FenceChan* f = it->second.get();
  g().fence_chans.erase(f->key);  // its receives' completions still queued are stale now
  destroy_qp(id);
  if (f->mr) ibv_dereg_mr(f->mr);
  g().passive_rids.erase(it);
  rdma_destroy_id(id);
}

bool post_fence_recv(FenceChan* f, uint32_t slot) {
  ibv_sge s{reinterpret_cast<uint64_t>(f->buf[slot]), static_cast<uint32_t>(wire::kRdsFenceLen),
            f->mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(f->key, 0, kFence, slot);
  wr.sg_list = &s;
  wr.num_sge = 1;
  ibv_recv_wr* bad;
  return ibv_post_recv(f->id->qp, &wr, &bad) == 0;
}

// A peer's RDMA channel for connection pc: we respond to its ops and take its fences. The
// accept tells it which fences we have. Destroyed when it goes.
void accept_rdma_chan(rdma_cm_id* id, Conn* pc) {
  auto f = std::make_unique<FenceChan>();
  f->id = id;
  f->c = pc;
  f->key = g().next_fence_key++ & 0xFFFFFF;  // the connection-id field of a wr id
  if (setup_rdma_qp(id)) {
    rdma_reject(id, nullptr, 0);
    return;
  }
  f->mr = ibv_reg_mr(g().pd, f->buf, sizeof f->buf, kLocalWrite);
  bool ok = f->mr != nullptr;
  for (uint32_t i = 0; ok && i < kFenceRecvs; ++i) ok = post_fence_recv(f.get(), i);
  const PrivBytes p = make_priv(pc, kChanRdma);
  rdma_conn_param cp{};
  cp.private_data = p.data();
  cp.private_data_len = static_cast<uint8_t>(p.size());
  cp.responder_resources = kRdmaDepth;
  cp.initiator_depth = 0;
  cp.rnr_retry_count = 7;  // its fences wait for a receive rather than end the channel
  if (!ok || rdma_accept(id, &cp)) {
    if (f->mr) ibv_dereg_mr(f->mr);
    destroy_qp(id);
    rdma_reject(id, nullptr, 0);
    return;
  }
  g().fence_chans[f->key] = f.get();
  g().passive_rids[id] = std::move(f);
  count(Ctr::rdma_chan_accepted);
}

// A receive on a peer's RDMA channel: a fence, or a lie that costs the peer its channel.
void on_fence_wc(const ibv_wc& wc) {
  auto it = g().fence_chans.find(wr_cid(wc.wr_id));
  if (it == g().fence_chans.end()) return;  // a channel already destroyed
  FenceChan* f = it->second;
  if (wc.status != IBV_WC_SUCCESS) return;  // flushed: the channel is going
  const uint32_t slot = wr_idx(wc.wr_id);
  wire::RdsFence fe;
  if (slot >= static_cast<uint32_t>(kFenceRecvs) ||
      !wire::rds_fence_decode(f->buf[slot], wc.byte_len, fe) || !on_fence(f->c, fe)) {
    count(Ctr::recv_fence_bad);
    rdma_disconnect(f->id);
    return;
  }
  count(Ctr::recv_fence);
  post_fence_recv(f, slot);
}

void handle_cm(rdma_cm_event* ev) {
  Global& G = g();
  if (directory_handles(ev)) return;
  if (auto it = g().chan_conn.find(ev->id); it != g().chan_conn.end()) {
    handle_rdma_cm(it->second, ev);
    return;
  }
  if (g().passive_rids.count(ev->id)) {
    if (cm_id_lost(ev->event)) destroy_fence_chan(ev->id);
    return;
  }
  rdma_cm_id* id = ev->id;
  auto* c = static_cast<Conn*>(id->context);
  switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (c && c->id == id && rdma_resolve_route(id, 2000)) conn_down(c, "resolve_route");
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      if (c && c->id == id) {
        if (setup_qp(c, id)) {
          conn_down(c, "setup_qp");
          break;
        }
        const PrivBytes p = make_priv(c);
        rdma_conn_param cp{};
        cp.private_data = p.data();
        cp.private_data_len = static_cast<uint8_t>(p.size());
        cp.responder_resources = 16;
        cp.initiator_depth = 16;
        cp.retry_count = 7;
        cp.rnr_retry_count = 7;
        if (rdma_connect(id, &cp)) conn_down(c, "connect");
      }
      break;
    case RDMA_CM_EVENT_CONNECT_REQUEST: {
      wire::RdsConnPriv pv;
      if (!wire::rds_conn_priv_decode(static_cast<const std::byte*>(ev->param.conn.private_data),
                                      ev->param.conn.private_data_len, pv)) {
        rdma_reject(id, nullptr, 0);
        count(Ctr::conn_reject_bad_priv);
        break;
      }
      const wire::RdsConnPriv* p = &pv;
      // The peer names the address its sockets send from; the connection must really come
      // from there (net/rds accepts a connection for the address pair it arrives on).
      const auto* from = reinterpret_cast<const sockaddr_in*>(rdma_get_peer_addr(id));
      const auto* to = reinterpret_cast<const sockaddr_in*>(rdma_get_local_addr(id));
      if (from->sin_family != AF_INET || to->sin_family != AF_INET ||
          from->sin_addr.s_addr != p->ip) {
        rdma_reject(id, nullptr, 0);
        count(Ctr::conn_reject_bad_addr);
        break;
      }
      sockaddr_in peer{};
      peer.sin_family = AF_INET;
      peer.sin_addr.s_addr = p->ip;
      peer.sin_port = htons(p->cm_port);
      const uint64_t mine = G.gen;
      const uint64_t theirs = p->gen;
      // A process sending to its own sockets connects to itself: the accepting half is a
      // connection object of its own (Linux RDS would use its loop transport here), keyed
      // by a generation no process has (they are odd).
      Conn* pc =
          conn_get(theirs == mine ? (theirs & ~1ull) : theirs, to->sin_addr, peer, p->cm_port);
      note_peer_caps(pc, *p);
      if (p->kind == kChanRdma) {  // its fences release messages of this connection
        accept_rdma_chan(id, pc);
        break;
      }
      // It acks what it has of ours: more than we ever sent on this connection is a lie, and
      // adopting it would drop our unacked messages as delivered.
      if (p->ack_seq >= pc->next_tx_seq) {
        rdma_reject(id, nullptr, 0);
        count(Ctr::recv_bad_ack);
        break;
      }
      // Both ends connecting at once: the connection the process with the smaller
      // generation number initiated is kept, the other refused (by it) or replaced.
      if (theirs != mine && pc->state == ConnState::connecting && pc->active && mine < theirs) {
        rdma_reject(id, nullptr, 0);
        count(Ctr::conn_connect_raced);
        break;
      }
      // A new connection from this peer replaces whatever we had (a rebooted or
      // reconnecting peer, net/rds threads.c).
      // Not while a sendmsg posts on the old QP with the lock let go (its teardown would be
      // put off, and pc is taken over at once): the peer retries with backoff.
      if (pc->in_xmit) {
        rdma_reject(id, nullptr, 0);
        count(Ctr::conn_reject_in_xmit);
        break;
      }
      if (pc->id) conn_down(pc, "replaced");
      id->context = pc;
      pc->id = id;
      pc->active = false;
      pc->state = ConnState::connecting;
      if (setup_qp(pc, id)) {
        pc->id = nullptr;
        destroy_qp(id);
        ++pc->inc;
        rdma_reject(id, nullptr, 0);
        pc->state = ConnState::down;
        break;
      }
      const PrivBytes mine_p = make_priv(pc);
      rdma_conn_param cp{};
      cp.private_data = mine_p.data();
      cp.private_data_len = static_cast<uint8_t>(mine_p.size());
      cp.responder_resources = 16;
      cp.initiator_depth = 16;
      if (rdma_accept(id, &cp)) conn_down(pc, "accept");
      on_ack(pc, p->ack_seq);
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
      // Test hook: the passive side's ESTABLISHED still on its way when the peer's messages
      // are in (comm_established's case, made certain).
      if (c && !c->active && g_test_late_established) break;
      if (c && c->id == id && c->state != ConnState::up) {
        // The passive side learns nothing here (it read the request); the active side reads
        // the accept's private data, which must be ours if there is any.
        wire::RdsConnPriv p;
        if (!c->active || !ev->param.conn.private_data_len) {
          p.ack_seq = 0;  // nothing acked: everything unacked is sent again
          conn_up(c, p);
        } else if (wire::rds_conn_priv_decode(
                       static_cast<const std::byte*>(ev->param.conn.private_data),
                       ev->param.conn.private_data_len, p)) {
          note_peer_caps(c, p);
          conn_up(c, p);
        } else {
          count(Ctr::conn_reject_bad_priv);
          conn_down(c, "bad accept");
        }
      }
      break;
    default:
      if (cm_id_lost(ev->event) && c && c->id == id) conn_down(c, rdma_event_str(ev->event));
      break;
  }
}

void handle_wc(const ibv_wc& wc) {
  const uint32_t cid = wr_cid(wc.wr_id);
  const uint64_t kind = wr_kind(wc.wr_id);
  const uint32_t idx = wr_idx(wc.wr_id);
  if (kind == kFence) {
    on_fence_wc(wc);
    return;
  }
  if (kind == kSrqRecv) {
    on_srq_recv(wc);
    return;
  }
  auto it = g().conn_by_id.find(cid);
  if (it == g().conn_by_id.end()) return;
  Conn* c = it->second;
  // A completion of a QP already destroyed: its op or buffer was dealt with then.
  if (wr_inc(wc.wr_id) != (kind == kRdma ? c->chan_inc : c->inc)) {
    count(Ctr::wc_stale);
    return;
  }
  c->last_active = std::chrono::steady_clock::now();
  if (kind == kRecv) {
    if (!take_frag(c, wc, &c->rbuf[static_cast<size_t>(idx) * kBufSize])) return;
    if (c->id && c->id->qp) {
      ibv_sge s{reinterpret_cast<uint64_t>(&c->rbuf[static_cast<size_t>(idx) * kBufSize]),
                static_cast<uint32_t>(kBufSize), c->rmr->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = wc.wr_id;
      wr.sg_list = &s;
      wr.num_sge = 1;
      ibv_recv_wr* bad;
      ibv_post_recv(c->id->qp, &wr, &bad);
    }
    return;
  }
  if (kind == kRdma) {
    if (on_rdma_complete(c, wc.wr_id, wc.status)) rdma_chan_down(c, ibv_wc_status_str(wc.status));
    return;
  }
  on_send_complete(c, wc.wr_id, wc.status);
  if (wc.status != IBV_WC_SUCCESS && wc.status != IBV_WC_WR_FLUSH_ERR && c->state == ConnState::up)
    conn_down(c, "send error");
}

// Work completions make possible: sends that waited for slots, acks that are due.
void after_completions_locked() {
  const auto t = std::chrono::steady_clock::now();
  for (auto& [k, c] : g().conns) {
    if (c->state != ConnState::up) continue;
    if (!c->send_q.empty()) xmit(c);  // completions freed send slots
    if ((c->mr_ask && !c->mr_ask_sent) || !c->mr_answers.empty()) mr_base_flush(c);
    if (!c->ack_needed) continue;
    if (c->ack_due == std::chrono::steady_clock::time_point{})
      c->ack_due = t + std::chrono::microseconds(kAckDelayUs);
    if (c->ack_now || c->ack_due <= t) conn_send_ack(c);
  }
}

// softverbs' completion handler (include/softverbs/verbs_ext.h): the device's progress thread
// hands us the CQ right after it queued a completion, so a message goes from the wire to the
// socket on that thread, without the engine thread's wake-up (net/rds does this work in its
// CQ tasklet). When the stack lock is taken it leaves the work to the holder (StackMutex).
// Takes the completions in, the stack lock held: the completion handler's work, whether the
// handler itself does it or the lock's holder, for a handler that found the lock taken.
void take_completions_locked() {
  Global& G = g();
  drain_cq_locked();
  ibv_req_notify_cq(G.cq, 0);
  drain_cq_locked();  // what came between the drain and the arm raised no notification
  after_completions_locked();
  // A delayed ack now due before the engine thread's next wake-up: it must hear of it.
  if (G.engine_wakes_at != std::chrono::steady_clock::time_point{}) {
    for (auto& [k, c] : G.conns)
      if (c->ack_needed && c->ack_due != std::chrono::steady_clock::time_point{} &&
          c->ack_due < G.engine_wakes_at) {
        G.engine_wakes_at = {};
        wake_engine();
        break;
      }
  }
}

// Tries lk; if it is taken, marks the stack's backlog and tries once more: its holder takes
// the completions in as it lets go, unless it let go before it could see the mark.
template <class Lock>
bool try_or_leave(Lock& lk) {
  if (lk.try_lock()) return true;
  g().mu.defer();
  return lk.try_lock();
}

void run_after_unlock();

bool handle_cq_ready() {
  Global& G = g();
  // A busy poller in its receive pass (poll_mu) looks for our mark once it is over, and
  // takes the lock for it: the progress thread does not wait for its pass. The same
  // handshake as with the lock's holder (StackMutex::unlock). Held from then on, so that
  // the handler's drains, its unlock's backlog run included, never wait for one either.
  std::unique_lock plk(G.poll_mu, std::defer_lock);
  if (!try_or_leave(plk)) {
    count(Ctr::cq_handler_deferred);
    return true;
  }
  // (after plk, before lk: cleared once lk's unlock has run, before poll_mu goes)
  const ScopedFlag held(tl_poll_held);
  std::unique_lock lk(G.mu, std::defer_lock);
  if (!try_or_leave(lk)) {
    count(Ctr::cq_handler_deferred);
    return true;
  }
  G.mu.backlog_taken();
  count(Ctr::cq_handler_runs);
  take_completions_locked();
  return true;
}

bool on_cq_ready(ibv_cq*, void*) {
  const bool r = handle_cq_ready();
  run_after_unlock();  // with poll_mu let go as well (StackMutex::unlock)
  return r;
}

void engine_loop() {
  Global& G = g();
  uint64_t last_publish = 0;
  bool trim_heap = false;
  std::string publish;  // built under G.mu, written without it
  for (;;) {
    // The flag first: a trim for trim_when_quiet covers release_buffers' too.
    if (G.heap_trim_due.exchange(false, std::memory_order_relaxed) || trim_heap) {
      // not under G.mu: it walks every arena (trim_when_quiet, release_buffers)
      malloc_trim(0);
      trim_heap = false;
    }
    if (!publish.empty()) info_write(std::exchange(publish, {}));
    int timeout = 500;  // also the rds-info publication period
    {
      // The earliest of: a reconnect timer, a directory retry or claim, a delayed ack.
      std::lock_guard lk(G.mu);
      const auto t = std::chrono::steady_clock::now();
      auto until = [&](std::chrono::steady_clock::time_point when) {
        const auto us = std::chrono::duration_cast<std::chrono::microseconds>(when - t).count();
        timeout = std::min<int>(timeout, us <= 0 ? 0 : static_cast<int>((us + 999) / 1000));
      };
      if (!g().timers.empty()) until(g().timers.begin()->first);
      if (const int d = directory_wait_ms(); d >= 0) timeout = std::min(timeout, d);
      for (auto& [k, c] : G.conns)
        if (c->ack_needed && c->ack_due != std::chrono::steady_clock::time_point{})
          until(c->ack_due);
      G.engine_wakes_at = t + std::chrono::milliseconds(timeout);
    }
    pollfd p[4] = {{G.cq_ch->fd, POLLIN, 0},
                   {G.cm_ch->fd, POLLIN, 0},
                   {G.wake_fd, POLLIN, 0},
                   {G.srq ? G.verbs->async_fd : -1, POLLIN, 0}};
    ::poll(p, 4, timeout);
    std::lock_guard lk(G.mu);
    QuietPosts quiet;        // what its own posts complete, it takes in before sleeping
    G.engine_wakes_at = {};  // awake: it recomputes its timeout before sleeping again
    if (p[2].revents) {
      uint64_t v;
      ssize_t r = read(G.wake_fd, &v, sizeof v);
      (void)r;
    }
    if (p[0].revents) {
      ibv_cq* cq;
      void* ctx;
      if (ibv_get_cq_event(G.cq_ch, &cq, &ctx) == 0) {
        ibv_ack_cq_events(cq, 1);
        count(Ctr::engine_cq_events);
      }
      ibv_req_notify_cq(G.cq, 0);
    }
    drain_cq_locked();
    if (p[3].revents) handle_async_events();
    for (rdma_cm_event* ev; rdma_get_cm_event(G.cm_ch, &ev) == 0;) {
      rdma_cm_event copy = *ev;
      // Ack first: destroying an id waits for its events to be acked.
      std::vector<std::byte> pd;
      if (copy.param.conn.private_data && copy.param.conn.private_data_len) {
        const auto* b = static_cast<const std::byte*>(copy.param.conn.private_data);
        pd.assign(b, b + copy.param.conn.private_data_len);
        copy.param.conn.private_data = pd.data();
      }
      rdma_ack_cm_event(ev);
      handle_cm(&copy);
    }
    const auto now = std::chrono::steady_clock::now();
    while (!g().timers.empty() && g().timers.begin()->first <= now) {
      auto [c, chan] = g().timers.begin()->second;
      g().timers.erase(g().timers.begin());
      (chan == kChanData ? c->reconnect_pending : c->chan_reconnect_pending) = false;
      if (chan == kChanRdma) {
        if (!c->rdma_q.empty()) rdma_chan_connect(c);
      } else if (c->state == ConnState::down && !c->send_q.empty()) {
        start_connect(c);
      }
    }
    directory_tick();
    idle_sweep();
    trim_heap = trim_when_quiet();
    if (now_ms() - last_publish >= 500) {
      publish = info_snapshot_locked();
      last_publish = now_ms();
    }
    after_completions_locked();
  }
}

}  // namespace

namespace {
// fork(): the child gets a stack of its own on first use (util/fork_local.h): new generation,
// rdma_cm port, device context and engine thread. What it inherited of the parent's stack is
// never touched again; its descriptors are closed here, and its sockets fail with EBADFD
// (af_rds.cc) but for close().
void release_after_fork(Global& G) {
  for (auto& [fd, s] : G.socks) sock_fork_release(s);
  if (G.wake_fd >= 0) close(G.wake_fd);
}
ForkLocal<Global> g_stack(&release_after_fork);

// The child walks the parent's tables: hold the stack lock across fork() so they are whole.
// And publish_mu: the engine thread writes its snapshot outside the stack lock, and may hold
// the host-wide retired-sum flock while it folds; a child forked then would keep that lock
// (an flock belongs to the open file) for every process of the user until it exits.
void fork_prepare() {
  if (Global* G = g_stack.peek()) {
    G->mu.lock();
    G->publish_mu.lock();
  }
}
void fork_parent() {
  // Not the stack's work here: other libraries' fork handlers may still hold their locks.
  if (Global* G = g_stack.peek()) {
    G->publish_mu.unlock();
    G->mu.unlock_to_engine();
  }
}
}  // namespace

bool PageBuf::allocate(size_t n) {
  release();
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  // Small pages: one touch must not make 2 MiB resident, and trim_when_quiet gives pages back.
  madvise(p, n, MADV_NOHUGEPAGE);
  p_ = static_cast<std::byte*>(p);
  n_ = n;
  return true;
}

void PageBuf::release() {
  if (p_) munmap(p_, n_);
  p_ = nullptr;
  n_ = 0;
}

namespace {
struct ErrnoKeeper {
  int saved = errno;
  ~ErrnoKeeper() { errno = saved; }
};
}  // namespace

namespace {
// This thread's regions to deregister once it lets the stack lock go (dereg_after_unlock).
// Only the lock's holder adds, and each unlock empties it, so a fork (whose prepare handler
// takes the lock) never copies a pending one into the child. A plain array: no allocation,
// and nothing for exit() to destroy before the atexit handler that still releases messages
// (glibc runs thread_local destructors first). When it is full, a region goes at once.
constexpr size_t kDeferredDeregs = 64;
thread_local ibv_mr* tl_deregs[kDeferredDeregs];
thread_local size_t tl_ndereg = 0;

// What this thread queued while it held the lock: the pool's buffers first (a connection
// may be waiting for one, RNR), then the regions.
void run_after_unlock() {
  run_reposts(true);
  if (!tl_ndereg) return;
  count(Ctr::rdma_dereg_unlocked, tl_ndereg);
  for (size_t i = 0; i < tl_ndereg; ++i) ibv_dereg_mr(tl_deregs[i]);
  tl_ndereg = 0;
}
}  // namespace

void dereg_after_unlock(ibv_mr* mr) {
  if (tl_ndereg == kDeferredDeregs) {
    ibv_dereg_mr(mr);
    return;
  }
  tl_deregs[tl_ndereg++] = mr;
}

void StackMutex::unlock() {
  // The socket calls let go as they return, errno set: what the backlog's own calls leave in
  // errno (a peer's reset), or a deregistration's, must not become theirs.
  const ErrnoKeeper keep;
  unlock_and_run_backlog();
  // A completion handler still holds poll_mu, which a lock holder's drain may wait for: it
  // runs them once it has let that go too (on_cq_ready).
  if (!tl_poll_held) run_after_unlock();
}

void StackMutex::unlock_and_run_backlog() {
  // One backlog run under the lock, and one more if a mark came as we let go: a holder is not
  // kept past that by a steady stream of completions (each can mark the backlog anew). What
  // is still marked then goes to the engine thread, whose own unlock runs it.
  for (int round = 0;; ++round) {
    if (backlog_.load(std::memory_order_relaxed) &&
        backlog_.exchange(false, std::memory_order_acq_rel)) {
      count(Ctr::cq_backlog_runs);
      // Its posts are quiet, as the socket calls' are: what they complete at once is taken in
      // here, not announced to the engine thread through the channel.
      QuietPosts quiet;
      take_completions_locked();
    }
    mu_.unlock();
    // A handler that marked the backlog after our look, and whose second try_lock found the
    // lock still ours, left it to us. That needs the mark seen here or the lock seen free
    // there: the mutex's lock and unlock are locked read-modify-writes on x86-64 (and
    // acquire/release pairs on AArch64), full barriers between each side's store and load.
    // The engine thread's pass every 500 ms is the backstop.
    if (!backlog_.load(std::memory_order_seq_cst)) return;
    if (round == 1) {
      wake_engine();
      return;
    }
    if (!mu_.try_lock()) return;  // its holder runs it
  }
}

void StackMutex::reacquire_after_post() {
  mu_.lock();
  if (backlog_.load(std::memory_order_relaxed) &&
      backlog_.exchange(false, std::memory_order_acq_rel)) {
    const ErrnoKeeper keep;
    count(Ctr::cq_backlog_runs);
    take_completions_locked();  // the poster's posts are quiet already (sendmsg's QuietPosts)
  }
}

void StackMutex::release_for_post() {
  mu_.unlock();
  // The buffers a backlog run took go back now, not after the holder's last post window.
  // Under the sendmsg's QuietPosts, like its own post: what a restarted receive path
  // completes is taken in by it.
  run_reposts(true);
}

void StackMutex::unlock_to_engine() {
  const ErrnoKeeper keep;
  // Under the lock: this holder may still be quiet (a sendmsg about to sleep, whose posts
  // must raise no event meanwhile: rds_impl.h QuietPosts), and what a restarted receive path
  // completes now is taken in by its QuietPosts, under the lock, as before the deferral.
  run_reposts(false);
  mu_.unlock();
  if (backlog_.load(std::memory_order_seq_cst)) wake_engine();
  run_after_unlock();
}

void StackMutex::defer() {
  backlog_.store(true, std::memory_order_seq_cst);
}

Global& g() {
  static const int hooks = pthread_atfork(fork_prepare, fork_parent, nullptr);
  (void)hooks;
  return g_stack.get();
}

void count(Ctr c, uint64_t n) {
  g().counters[static_cast<size_t>(c)].fetch_add(n, std::memory_order_relaxed);
}

int transport_start() {
  Global& G = g();
  if (G.started) return 0;
  int n = 0;
  ibv_context** devs = rdma_get_devices(&n);
  if (!devs || n < 1) return -ENODEV;
  G.verbs = devs[0];
  rdma_free_devices(devs);
  // A QP asking for more than the device's max_sge is refused (EINVAL): ask for what it has.
  ibv_device_attr da{};
  if (ibv_query_device(G.verbs, &da) == 0) {
    g_max_send_sge = std::clamp(da.max_sge, 1, 16);
    g_max_read_sge = std::clamp(da.max_sge_rd > 0 ? da.max_sge_rd : da.max_sge, 1, g_max_send_sge);
    G.mr_max = static_cast<uint32_t>(da.max_mr);
    G.cq_max = std::max(da.max_cqe, kCqInitial);
    G.atomics = da.atomic_cap != IBV_ATOMIC_NONE;
  }
  // Linux siw registers a user region at its user address whatever iova it is given
  // (siw_reg_user_mr: "rnic_va: not used by siw"), so a zero-based cookie would name nothing
  // there. siw reports vendor_id SIW_VENDOR_ID (drivers/infiniband/sw/siw/siw.h).
  constexpr uint32_t kSiwVendorId = 0x626d74;
  const uint64_t by_va = settings::uint_value(SV_SETTING("SOFTVERBS_RDS_MR_VA"));
  G.mr_by_va = by_va == 1 || (by_va == 2 && da.vendor_id == kSiwVendorId);
  G.pd = ibv_alloc_pd(G.verbs);
  // A page of its own (never freed): not a field of Global, whose page a provider's
  // don't-fork marking (RDMAV_FORK_SAFE on old kernels) would take from a forked child.
  if (void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      G.pd && p != MAP_FAILED) {
    G.confirm_sink = static_cast<uint64_t*>(p);
    G.confirm_mr = ibv_reg_mr(G.pd, p, 4096, kLocalWrite);
  }
  G.cq_ch = ibv_create_comp_channel(G.verbs);
  G.cq = G.pd && G.cq_ch ? ibv_create_cq(G.verbs, kCqInitial, nullptr, G.cq_ch, 0) : nullptr;
  G.cq_resizable = G.cq && ibv_resize_cq(G.cq, kCqInitial) == 0;
  if (G.cq && !G.cq_resizable) {  // create_qp cannot grow it: take the fixed size now
    ibv_destroy_cq(G.cq);
    G.cq = ibv_create_cq(G.verbs, std::min(kCqFixed, G.cq_max), nullptr, G.cq_ch, 0);
  }
  G.cm_ch = rdma_create_event_channel();
  if (!G.cq || !G.cm_ch || !G.confirm_mr) return -ENOMEM;
  g_cq_busy_poll =
      reinterpret_cast<int (*)(ibv_cq*, int)>(dlsym(RTLD_DEFAULT, "softverbs_cq_busy_poll"));
  srq_start(da);
  // Its async events are read by the engine thread without blocking (handle_async_events).
  if (G.srq) fcntl(G.verbs->async_fd, F_SETFL, fcntl(G.verbs->async_fd, F_GETFL) | O_NONBLOCK);
  fcntl(G.cm_ch->fd, F_SETFL, fcntl(G.cm_ch->fd, F_GETFL) | O_NONBLOCK);
  fcntl(G.cq_ch->fd, F_SETFL, fcntl(G.cq_ch->fd, F_GETFL) | O_NONBLOCK);
  // On softverbs, take completions on the device's progress thread (SOFTVERBS_RDS_CQ_HANDLER=0:
  // always through the engine thread, as on any other verbs provider).
  using SetHandler = int (*)(ibv_cq*, bool (*)(ibv_cq*, void*), void*);
  if (auto* set =
          reinterpret_cast<SetHandler>(dlsym(RTLD_DEFAULT, "softverbs_cq_set_comp_handler"));
      set && settings::flag_value(SV_SETTING("SOFTVERBS_RDS_CQ_HANDLER")))
    set(G.cq, on_cq_ready, nullptr);
  g_qp_set_ib_completion = reinterpret_cast<int (*)(ibv_qp*, int)>(
      dlsym(RTLD_DEFAULT, "softverbs_qp_set_ib_completion"));
  g_qp_ib_completion =
      reinterpret_cast<int (*)(ibv_qp*)>(dlsym(RTLD_DEFAULT, "softverbs_qp_ib_completion"));
  g_srq_trim = reinterpret_cast<long (*)(ibv_srq*)>(dlsym(RTLD_DEFAULT, "softverbs_srq_trim"));
  ibv_req_notify_cq(G.cq, 0);
  g_cq_block = reinterpret_cast<int (*)(ibv_cq*, int)>(dlsym(RTLD_DEFAULT, "softverbs_cq_block"));
  g_cq_quiet = reinterpret_cast<int (*)(ibv_cq*, int)>(dlsym(RTLD_DEFAULT, "softverbs_cq_quiet"));
  if (auto* wait_fd =
          reinterpret_cast<int (*)(ibv_cq*)>(dlsym(RTLD_DEFAULT, "softverbs_cq_wait_fd"));
      wait_fd && g_cq_block && settings::flag_value(SV_SETTING("SOFTVERBS_RDS_WAIT_RX")))
    G.cq_wait_fd.store(wait_fd(G.cq), std::memory_order_release);
  if (rdma_create_id(G.cm_ch, &G.listen_id, nullptr, RDMA_PS_TCP)) return -errno;
  sockaddr_in any{};
  any.sin_family = AF_INET;
  if (rdma_bind_addr(G.listen_id, reinterpret_cast<sockaddr*>(&any)) ||
      rdma_listen(G.listen_id, 128))
    return -errno;
  G.cm_port = ntohs(rdma_get_src_port(G.listen_id));
  if (getrandom(&G.gen, sizeof G.gen, 0) != sizeof G.gen) G.gen = now_ms();
  G.gen |= 1;
  G.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::atexit(info_unpublish);
  // Our RDS stack dies with the process (the kernel's would not): ack what we received
  // before exiting, or its senders would retransmit to nobody.
  std::atexit([] {
    std::lock_guard lk(g().mu);
    flush_acks_at_exit_locked();
    // Then close our connections gracefully: a socket the exit closes while the peer's
    // bytes are still arriving is reset, and the reset discards those acks before they
    // leave (tcp_close). rdma_disconnect closes it after what it holds (engine/linger.h).
    for (auto& [k, c] : g().conns) {
      if (c->state == ConnState::up && c->id) rdma_disconnect(c->id);
      if (c->chan_state == ConnState::up && c->chan_id) rdma_disconnect(c->chan_id);
    }
  });
  std::thread(engine_loop).detach();
  G.test_post_window_ms =
      static_cast<uint32_t>(settings::uint_value(SV_SETTING("SOFTVERBS_RDS_TEST_POST_WINDOW_MS")));
  G.started = true;
  G.poll_cq.store(G.cq, std::memory_order_release);
  return 0;
}

Conn* conn_get(uint64_t peer_gen, in_addr laddr, const sockaddr_in& faddr, uint16_t cm_port) {
  Global& G = g();
  const ConnKey key{peer_gen, laddr.s_addr, faddr.sin_addr.s_addr};
  auto it = G.conns.find(key);
  if (it != G.conns.end()) return it->second;
  auto* c = new Conn();
  c->peer_gen = peer_gen;
  c->peer.sin_family = AF_INET;
  c->peer.sin_addr = faddr.sin_addr;
  c->peer.sin_port = htons(cm_port);
  c->local.sin_family = AF_INET;
  c->local.sin_addr = laddr;
  const uint32_t id = g().next_conn_id++;
  g().conn_by_id[id] = c;
  g().id_of[c] = id;
  G.conns[key] = c;
  count(Ctr::conn_created);
  return c;
}

// Not while a reconnect is scheduled: its backoff is what spares a peer that refuses us (its
// peer_guard after our ops' protection errors) a connect per message (net/rds
// RDS_RECONNECT_PENDING).
void rdma_chan_kick(Conn* c) {
  if (c->chan_state == ConnState::down && !c->chan_id && !c->chan_reconnect_pending)
    rdma_chan_connect(c);
}

void conn_kick(Conn* c, XmitMode mode) {
  rdma_post_pending(c, mode);
  if (c->state == ConnState::up) {
    xmit(c, mode);
  } else if (c->state == ConnState::down && !c->send_q.empty() && !c->reconnect_pending) {
    start_connect(c);
  }
}

void conn_send_ack(Conn* c) {
  conn_send_header(c, {});
}

bool conn_send_header(Conn* c, wire::RdsHeader h) {
  if (c->in_xmit) {  // its poster sends what is due once it has the lock back (xmit)
    c->hdr_owed = true;
    return false;
  }
  if (c->free_slots.empty() || !c->id || !c->id->qp) return false;
  const int slot = c->free_slots.back();
  c->free_slots.pop_back();
  std::byte* b = &c->sbuf[static_cast<size_t>(slot) * kBufSize];
  h.sequence = 0;
  h.ack = rx_ack_seq(c);
  wire::rds_encode(h, b);
  ibv_sge s{reinterpret_cast<uint64_t>(b), static_cast<uint32_t>(wire::kRdsHeaderLen),
            c->smr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = make_wr_id(g().id_of[c], c->inc, kAck, static_cast<uint32_t>(slot));
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  if (post_data_send(c, &wr)) {
    c->free_slots.push_back(slot);
    return false;
  }
  c->ack_needed = c->ack_now = false;
  c->ack_due = {};
  c->unacked = 0;
  count(Ctr::ib_ack_sent);
  return true;
}

PostRec prep_data_send(Conn* c, ibv_send_wr* wr) {
  const PostRec r{wr->wr_id, c->since_signal, c->signal_next};
  // Signal when enough went unsignaled or slots run low, so slots keep coming back.
  const bool sig = ++c->since_signal >= kSignalEvery ||
                   c->free_slots.size() < static_cast<size_t>(kSignalEvery) || c->signal_next;
  c->signal_next = false;
  wr->send_flags = sig ? IBV_SEND_SIGNALED : 0;
  if (sig) c->since_signal = 0;
  c->posted.push_back(wr->wr_id);
  ++c->posts;
  return r;
}

bool unprep_data_send(Conn* c, const PostRec& r) {
  // Nothing else posted on the data QP since (in_xmit, or the lock held), and a completion
  // retires only up to an id that completed, which this one never did: it is the newest.
  assert(!c->posted.empty() && c->posted.back() == r.wr_id);
  if (c->posted.empty() || c->posted.back() != r.wr_id) return false;
  c->posted.pop_back();
  --c->posts;
  // What asked for a signal meanwhile (retire_later, trim_when_quiet, the exit's flush)
  // still stands.
  c->since_signal = std::max(c->since_signal, r.since_signal);
  c->signal_next = c->signal_next || r.signal_next;
  return true;
}

int post_data_send(Conn* c, ibv_send_wr* wr) {
  const PostRec r = prep_data_send(c, wr);
  ibv_send_wr* bad;
  if (ibv_post_send(c->id->qp, wr, &bad) == 0) return 0;
  unprep_data_send(c, r);
  return -1;
}

void flush_acks_locked() {
  bool sent = false;
  for (auto& [k, c] : g().conns)
    if (c->state == ConnState::up && c->ack_needed) {
      conn_send_ack(c);
      sent = true;
    }
  // The device may hold a post back to batch it with the next (softverbs' doorbell batching,
  // while the CQ is between a notification and its re-arm); arming the CQ sends it now, as
  // a caller about to exit needs (the ack must leave before the connection dies with us).
  if (sent) ibv_req_notify_cq(g().cq, 0);
}

// At exit, a posted ack (or message) may still be in the device's hands: held back for a
// batch, or queued behind the progress thread's own transmit. The process dies with it, and
// its senders would retransmit to nobody. So every connection gets a last, signaled ack,
// and we wait (bounded) for its completion: send completions come in order, so when it is
// done everything posted before it was handed to the socket too.
void flush_acks_at_exit_locked() {
  constexpr auto kExitWait = std::chrono::milliseconds(200);
  std::vector<std::pair<Conn*, uint64_t>> last;
  for (auto& [k, c] : g().conns) {
    if (c->state != ConnState::up || (!c->ack_needed && c->posted.empty())) continue;
    if (c->free_slots.empty()) drain_cq_locked();
    c->since_signal = kSignalEvery;  // the next post is signaled
    const size_t before = c->posted.size();
    conn_send_ack(c);
    if (c->posted.size() > before) last.emplace_back(c, c->posted.back());
  }
  if (last.empty()) return;
  ibv_req_notify_cq(g().cq, 0);  // a batched post leaves now
  const auto deadline = std::chrono::steady_clock::now() + kExitWait;
  for (;;) {
    drain_cq_locked();
    std::erase_if(last, [](const std::pair<Conn*, uint64_t>& e) {
      return e.first->state != ConnState::up ||
             std::find(e.first->posted.begin(), e.first->posted.end(), e.second) ==
                 e.first->posted.end();
    });
    if (last.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  count(last.empty() ? Ctr::exit_acks_sent : Ctr::exit_acks_timed_out);
}

QuietPosts::QuietPosts() {
  if (g_cq_quiet && g().cq) on_ = g_cq_quiet(g().cq, 1) == 0;
}

QuietPosts::~QuietPosts() {
  if (!on_) return;
  // Taking them in may post more (sends that waited for slots): quiet again, until none.
  for (int n; (n = g_cq_quiet(g().cq, 0)) > 0;) {
    g_cq_quiet(g().cq, 1);
    drain_cq_locked();
    after_completions_locked();
  }
}

uint32_t conn_id_of(Conn* c) {
  return g().id_of[c];
}

int max_local_sge(bool read) {
  return read ? g_max_read_sge : g_max_send_sge;
}

}  // namespace sv::rds

// Busy polling from an application thread: ibv_poll_cq on an empty CQ lets the device
// receive on the caller's thread too, so a message can go from the wire to the socket with
// no thread handoff. The poll, and the receive pass it runs, come before the stack lock
// (Global::poll_mu); what it took is then handled under the lock. Waits for the lock only
// when it took something.
extern "C" __attribute__((visibility("default"))) int svrds_busy_poll() {
  sv::rds::Global& G = sv::rds::g();
  ibv_cq* cq = G.poll_cq.load(std::memory_order_acquire);
  if (!cq) return 0;
  // This thread receives for the stack now: the device's progress thread steps back.
  if (sv::rds::g_cq_busy_poll) sv::rds::g_cq_busy_poll(cq, 1);
  int took = 0;
  {
    // Another poller's pass: it deposits what it takes, and this one has nothing to add.
    std::unique_lock plk(G.poll_mu, std::try_to_lock);
    if (plk.owns_lock()) {
      ibv_wc wc[32];
      took = ibv_poll_cq(cq, 32, wc);
      if (took > 0) G.polled.insert(G.polled.end(), wc, wc + took);
    }
  }
  std::unique_lock lk(G.mu, std::defer_lock);
  if (took > 0) {
    // What it took may well be what this thread waits for: it takes it in itself (one
    // wake-up, not a handoff to the holder and a second one), waiting for the lock if need
    // be. It holds nothing else.
    lk.lock();
  } else if (!G.mu.backlog_marked() || !lk.try_lock()) {
    return 0;  // nothing of its own; a handler's mark is the holder's to run
  }
  sv::rds::QuietPosts quiet;  // acks and sends the completions let go
  const int n = sv::rds::drain_cq_locked(true);
  if (n) {
    sv::rds::count(sv::rds::Ctr::busy_poll_completions,
                   static_cast<uint64_t>(n));  // taken on a caller's thread
    sv::rds::after_completions_locked();
  }
  return n;
}

// Blocking with the receive path (softverbs_cq_wait_fd): a thread about to block until an RDS
// socket is ready also waits on the returned descriptor, and when it turns readable runs the
// receive path itself (svrds_busy_poll): the bytes wake the thread that wants them, not the
// device's progress thread, which would have to wake it in turn. -1: wait without it. The
// CQ never changes once the stack is up, and the descriptor is published after it. Every
// svrds_block_prepare that returned a descriptor is followed by svrds_block_done once the
// caller woke: while it sleeps, the receive path is its alone.
extern "C" __attribute__((visibility("default"))) int svrds_block_prepare() {
  sv::rds::Global& G = sv::rds::g();
  const int fd = G.cq_wait_fd.load(std::memory_order_acquire);
  if (fd >= 0) sv::rds::g_cq_block(G.cq, 1);
  return fd;
}

extern "C" __attribute__((visibility("default"))) void svrds_block_done() {
  sv::rds::Global& G = sv::rds::g();
  if (G.cq_wait_fd.load(std::memory_order_acquire) >= 0) sv::rds::g_cq_block(G.cq, 0);
}

extern "C" __attribute__((visibility("default"))) void svrds_busy_poll_stop() {
  sv::rds::Global& G = sv::rds::g();
  std::lock_guard lk(G.mu);
  if (G.started && sv::rds::g_cq_busy_poll) sv::rds::g_cq_busy_poll(G.cq, 0);
}
