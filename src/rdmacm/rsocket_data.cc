// rsockets' data path (rsocket_impl.h): endpoint resources, completions, message credits and
// receive-buffer grants, rsend/rrecv and their variants, and the iomap calls (riomap,
// riounmap, riowrite). Wire behaviour follows rdma-core's rsocket.c in RS_OPT_MSG_SEND mode;
// docs/rsockets-protocol.md §2-3 has the rules cited here.
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/app_memory.h"
#include "engine/log.h"
#include "rdmacm/rsocket_impl.h"
#include "transport/tcp.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

namespace sv::rsock {

namespace {

// Send wr_ids are ours alone (the word travels in the SEND's payload): the kind in the top
// byte, the sbuf bytes a WRITE releases in the low 32 bits. Bit 63 marks a receive and its
// slot, as in rdma-core. kWrite and kDataMsg take data WRs, kCtrl the control reserve.
constexpr uint64_t kRecvBit = 1ull << 63;
enum Kind : uint64_t { kWrite = 1, kDataMsg = 2, kCtrl = 3 };
constexpr uint64_t wr_id(Kind k, uint32_t bytes = 0) {
  return uint64_t{k} << 56 | bytes;
}
constexpr Kind wr_kind(uint64_t id) {
  return static_cast<Kind>((id >> 56) & 0x7f);
}

ibv_pd* shared_pd(ibv_context* ctx) {
  // One PD for every rsocket of the process, as librdmacm uses the device's default PD.
  static std::mutex mu;
  static ibv_pd* pd = nullptr;
  static ibv_context* for_ctx = nullptr;
  std::lock_guard lk(mu);
  if (!pd || for_ctx != ctx) {
    pd = ibv_alloc_pd(ctx);
    for_ctx = ctx;
  }
  return pd;
}

bool post_recv_slot(Rs* s, uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(s->slots.data() + slot * 4), 4, s->slot_mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = kRecvBit | slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(s->qp, &wr, &bad) == 0;
}

// An RDMA WRITE of sge[0..nsge) to (raddr, rkey), signalled like every send.
ibv_send_wr rdma_write(uint64_t id, ibv_sge* sge, int nsge, bool inl, uint64_t raddr,
                       uint32_t rkey) {
  ibv_send_wr w{};
  w.wr_id = id;
  w.opcode = IBV_WR_RDMA_WRITE;
  w.send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0);
  w.sg_list = sge;
  w.num_sge = nsge;
  w.wr.rdma.remote_addr = raddr;
  w.wr.rdma.rkey = rkey;
  return w;
}

// Posts `write` (may be null) then the 4-byte SEND carrying `word`, inline.
bool post_write_msg(Rs* s, ibv_send_wr* write, uint32_t word, Kind msg_kind) {
  ibv_sge wsge{reinterpret_cast<uintptr_t>(&word), 4, 0};
  ibv_send_wr send{};
  send.wr_id = wr_id(msg_kind);
  send.opcode = IBV_WR_SEND;
  send.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  send.sg_list = &wsge;
  send.num_sge = 1;
  ibv_send_wr* first = &send;
  if (write) {
    write->next = &send;
    first = write;
  }
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(s->qp, first, &bad) == 0;
}

// rs_give_credits: grant a free half of rbuf (SGL record + word) when one is whole again,
// or just new message credits once half of them are used.
void give_credits_locked(Rs* s) {
  if (s->state != State::connected || !s->qp) return;
  const uint16_t limit = static_cast<uint16_t>(s->rseq_no + s->rq_size);
  if (s->ledger.can_grant() && s->ctrl_wrs >= 2) {
    const uint32_t off = s->ledger.grant();
    rs::Sge g{reinterpret_cast<uintptr_t>(s->rbuf.data() + off), s->rmr->rkey, s->ledger.half()};
    ibv_sge sge{reinterpret_cast<uintptr_t>(&g), sizeof g, 0};
    ibv_send_wr w = rdma_write(wr_id(kCtrl), &sge, 1, true,
                               s->remote_sgl.addr + s->remote_sge * rs::kSgeLen, s->remote_sgl.key);
    if (!post_write_msg(s, &w, rs::msg(rs::Op::sgl, limit), kCtrl)) return fail_locked(s, EIO);
    s->ctrl_wrs -= 2;
    s->remote_sge = (s->remote_sge + 1) % rs::kSglEntries;
    s->rseq_comp = static_cast<uint16_t>(s->rseq_no + s->rq_size / 2);
  } else if (static_cast<int16_t>(s->rseq_no - s->rseq_comp) >= 0 && s->ctrl_wrs >= 1) {
    if (!post_write_msg(s, nullptr, rs::msg(rs::Op::sgl, limit), kCtrl)) return fail_locked(s, EIO);
    s->ctrl_wrs -= 1;
    s->rseq_comp = static_cast<uint16_t>(s->rseq_no + s->rq_size / 2);
  }
}

// An SGL word: new credits, and perhaps a new grant in the entry the peer writes next. The
// peer's RDMA WRITE of that record is placed before its SEND (DDP in-order placement), and it
// writes an entry only after we have filled the grant it held, so the entry is ours to read.
void on_sgl(Rs* s, uint32_t data) {
  s->sseq_comp = static_cast<uint16_t>(data);
  rs::Sge& local = s->target[s->grant_idx];
  if (local.length != 0) return;
  std::byte* rec = s->tbuf.data() + s->grant_idx * rs::kSgeLen;
  rs::Sge g = rs::load_sge(rec);
  if (g.length == 0) return;  // a credit-only update
  local = g;
  std::memset(rec, 0, rs::kSgeLen);
  s->grant_idx = (s->grant_idx + 1) % rs::kSglEntries;
}

void on_iomap_sgl(Rs* s, uint32_t index) {
  if (index >= s->peer_iomaps.size()) return fail_locked(s, EPROTO);
  const std::byte* rec = s->tbuf.data() + rs::kSglEntries * rs::kSgeLen + index * rs::kIomapLen;
  PeerIomap m;
  std::memcpy(&m.offset, rec, 8);
  m.sge = rs::load_sge(rec + 8);
  s->peer_iomaps[index] = m;
}

void on_recv(Rs* s, const ibv_wc& wc) {
  const uint32_t slot = static_cast<uint32_t>(wc.wr_id);
  if (wc.status != IBV_WC_SUCCESS || slot >= s->recv_slots) {
    if (wc.status != IBV_WC_WR_FLUSH_ERR && s->state == State::connected) fail_locked(s, EIO);
    return;
  }
  uint32_t word = 0;
  if (wc.byte_len == 4) std::memcpy(&word, s->slots.data() + slot * 4, 4);
  if (s->state == State::connected) (void)post_recv_slot(s, slot);
  if (wc.byte_len != 4) return fail_locked(s, EPROTO);  // control is always a 4-byte SEND
  const uint32_t data = rs::msg_data(word);
  switch (rs::msg_op(word)) {
    case rs::Op::data:
      if (!s->ledger.on_data(data)) return fail_locked(s, EPROTO);
      if (data) s->rmsg.push_back(data);
      break;
    case rs::Op::sgl:
      on_sgl(s, data);
      break;
    case rs::Op::iomap_sgl:
      on_iomap_sgl(s, data);
      break;
    case rs::Op::ctrl:
      if (data == static_cast<uint32_t>(rs::Ctrl::disconnect)) {
        s->readable = s->writable = false;
        if (s->state == State::connected) s->state = State::disconnected;
      } else if (data == static_cast<uint32_t>(rs::Ctrl::shutdown)) {
        s->readable = false;  // a half-close: the peer sends nothing more
        if (!s->writable && s->state == State::connected) s->state = State::disconnected;
      }
      break;  // keepalive: nothing to do
    default:
      fail_locked(s, EPROTO);
  }
}

void on_send(Rs* s, const ibv_wc& wc) {
  switch (wr_kind(wc.wr_id)) {
    case kWrite:
      s->data_wrs++;
      s->sbuf_avail += static_cast<uint32_t>(wc.wr_id);
      break;
    case kDataMsg:
      s->data_wrs++;
      break;
    case kCtrl:
      s->ctrl_wrs++;
      break;
  }
  if (wc.status == IBV_WC_SUCCESS) return;
  if (wc.status == IBV_WC_WR_FLUSH_ERR) {
    // The connection is gone (peer closed, or we did): reads drain what came, writes fail.
    s->writable = false;
    s->readable = false;
    if (s->state == State::connected) s->state = State::disconnected;
    return;
  }
  if (s->state == State::connected) fail_locked(s, EIO);
}

// A connected socket's rdma_cm events (a connecting one's are its connect's: connect_step).
// True if one changed what its waiters wait for.
bool drain_cm(Rs* s) {
  if (!s->cm_ch || s->state == State::listening || s->state == State::connecting) return false;
  bool changed = false;
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(s->cm_ch, &ev) == 0) {
    const auto type = ev->event;
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      changed |= s->readable || s->writable;
      s->readable = s->writable = false;
      if (s->state == State::connected) s->state = State::disconnected;
    }
  }
  return changed;
}

bool all_in(uint32_t n, uint32_t max) {
  return n == max;
}

}  // namespace

void fail_locked(Rs* s, int err) {
  if (s->state == State::error) return;
  SV_WARN("rsocket %d: connection failed: %s", s->fd, std::strerror(err));
  s->state = State::error;
  s->err = err;
  s->readable = s->writable = false;
}

bool create_ep(Rs* s) {
  ibv_context* ctx = s->cm->verbs;
  ibv_pd* pd = ctx ? shared_pd(ctx) : nullptr;
  if (!pd) return errno = ENODEV, false;
  s->sbuf.assign(s->sbuf_size, std::byte{0});
  s->rbuf.assign(s->rbuf_size, std::byte{0});
  s->iomaps.clear();
  s->peer_iomaps.assign(s->iomap_size, PeerIomap{});
  s->tbuf.assign(rs::kSglEntries * rs::kSgeLen + s->iomap_size * rs::kIomapLen, std::byte{0});
  s->recv_slots = s->rq_size + kExtraRecvs;
  s->slots.assign(s->recv_slots * 4, std::byte{0});
  // As ints: verbs.h's ibv_reg_mr macro tests the flags against an enum of another type,
  // which clang warns is deprecated (-Wdeprecated-enum-enum-conversion).
  constexpr int kLocal = IBV_ACCESS_LOCAL_WRITE;
  constexpr int kRing = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  s->smr = ibv_reg_mr(pd, s->sbuf.data(), s->sbuf.size(), kLocal);
  s->rmr = ibv_reg_mr(pd, s->rbuf.data(), s->rbuf.size(), kRing);
  s->tmr = ibv_reg_mr(pd, s->tbuf.data(), s->tbuf.size(), kRing);
  s->slot_mr = ibv_reg_mr(pd, s->slots.data(), s->slots.size(), kLocal);
  if (!s->smr || !s->rmr || !s->tmr || !s->slot_mr) return false;
  s->cc = ibv_create_comp_channel(ctx);
  if (!s->cc) return false;
  sv::transport::set_nonblock(s->cc->fd, true);
  s->cq = ibv_create_cq(ctx, static_cast<int>(s->sq_size + s->recv_slots), s, s->cc, 0);
  if (!s->cq) return false;
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = s->cq;
  a.qp_type = IBV_QPT_RC;
  a.sq_sig_all = 1;
  a.cap.max_send_wr = s->sq_size;
  a.cap.max_recv_wr = s->recv_slots;
  a.cap.max_send_sge = 2;
  a.cap.max_recv_sge = 1;
  // At least the 16-byte SGL record inline (control messages); data goes inline only up to
  // what the application asked for (RDMA_INLINE), as rdma-core's HEAD raises it to 4.
  a.cap.max_inline_data = std::max<uint32_t>(s->inline_size, rs::kSgeLen);
  if (rdma_create_qp(s->cm, pd, &a)) return false;
  s->qp = s->cm->qp;
  s->inline_size = std::min<uint32_t>(s->inline_size, a.cap.max_inline_data);
  s->sbuf_head = 0;
  s->sbuf_avail = s->sbuf_size;
  s->ctrl_wrs = kCtrlWrs;
  s->data_wrs = s->sq_size - kCtrlWrs;
  s->ledger.reset(s->rbuf_size, s->rq_size + kExtraRecvs);
  s->rseq_no = 0;
  s->rseq_comp = static_cast<uint16_t>(s->rq_size / 2);
  for (uint32_t i = 0; i < s->recv_slots; ++i)
    if (!post_recv_slot(s, i)) return false;
  return ibv_req_notify_cq(s->cq, 0) == 0;
}

void destroy_ep(Rs* s) {
  if (s->cm && s->qp) rdma_destroy_qp(s->cm);
  s->qp = nullptr;
  if (s->cq) {
    ibv_cq* ev_cq = nullptr;
    void* ctx = nullptr;
    unsigned n = 0;
    while (ibv_get_cq_event(s->cc, &ev_cq, &ctx) == 0) ++n;
    if (n) ibv_ack_cq_events(s->cq, n);
    ibv_destroy_cq(s->cq);
    s->cq = nullptr;
  }
  if (s->cc) ibv_destroy_comp_channel(s->cc);
  s->cc = nullptr;
  for (ibv_mr** mr : {&s->smr, &s->rmr, &s->tmr, &s->slot_mr}) {
    if (*mr) ibv_dereg_mr(*mr);
    *mr = nullptr;
  }
  for (auto& m : s->iomaps)
    if (m.mr) ibv_dereg_mr(m.mr);
  s->iomaps.clear();
}

rs::ConnData local_conn_data(const Rs* s) {
  rs::ConnData c;
  c.credits = static_cast<uint16_t>(s->rq_size);
  c.target_iomap_size = rs::iomap_value_to_scale(s->iomap_size);
  c.target_sgl = {reinterpret_cast<uintptr_t>(s->tbuf.data()), s->tmr->rkey, rs::kSglEntries};
  c.data_buf = {reinterpret_cast<uintptr_t>(s->rbuf.data()), s->rmr->rkey, s->ledger.half()};
  return c;
}

// rs_save_conn_data.
void save_conn_data(Rs* s, const rs::ConnData& peer) {
  s->remote_sgl = peer.target_sgl;
  s->remote_sge = 1;
  s->target[0] = peer.data_buf;
  s->target[1] = {};
  s->target_idx = 0;
  s->grant_idx = 1;
  s->sseq_no = 0;
  s->sseq_comp = peer.credits;
  s->remote_iomap_addr = peer.target_sgl.addr + rs::kSgeLen * rs::kSglEntries;
  s->remote_iomap_key = peer.target_sgl.key;
  s->remote_iomap_count = rs::iomap_scale_to_value(peer.target_iomap_size);
}

rdma_conn_param conn_param(const std::byte* pdata) {
  rdma_conn_param p{};
  p.private_data = pdata;
  p.private_data_len = rs::kConnDataLen;
  p.flow_control = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.initiator_depth = 1;  // iWARP: rdma-core asks ORD 1 for the MPA ready-to-receive exchange
  return p;
}

namespace {
int cm_errno(const rdma_cm_event& ev) {
  if (ev.event == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  if (ev.status < 0) return -ev.status;
  return ev.event == RDMA_CM_EVENT_UNREACHABLE ? EHOSTUNREACH : ECONNREFUSED;
}

// The active side's state machine (rs_do_connect), one rdma_cm event at a time.
void connect_step(Rs* s, rdma_cm_event* ev) {
  const rdma_cm_event e = *ev;
  std::optional<rs::ConnData> peer;
  if (e.event == RDMA_CM_EVENT_ESTABLISHED)
    peer = rs::decode_conn_data(static_cast<const std::byte*>(e.param.conn.private_data),
                                e.param.conn.private_data_len);
  rdma_ack_cm_event(ev);
  switch (e.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(s->cm, 2000)) fail_locked(s, errno);
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      if (!create_ep(s)) return fail_locked(s, errno ? errno : ENOMEM);
      std::byte pd[rs::kConnDataLen];
      rs::encode_conn_data(local_conn_data(s), pd);
      rdma_conn_param p = conn_param(pd);
      if (rdma_connect(s->cm, &p)) fail_locked(s, errno);
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED:
      if (!peer) {
        fail_locked(s, ENOTSUP);  // not an rsocket of version 1 (rs_do_connect)
        rdma_disconnect(s->cm);
        break;
      }
      save_conn_data(s, *peer);
      s->state = State::connected;
      s->readable = s->writable = true;
      break;
    case RDMA_CM_EVENT_DISCONNECTED:
      fail_locked(s, ECONNRESET);
      break;
    default:
      fail_locked(s, cm_errno(e));
  }
}
}  // namespace

void connect_poll_locked(Rs* s) {
  rdma_cm_event* ev = nullptr;
  while (s->state == State::connecting && rdma_get_cm_event(s->cm_ch, &ev) == 0)
    connect_step(s, ev);
}

void pump_locked(Rs* s, bool armed) {
  if (s->cc && !armed) {
    ibv_cq* ev_cq = nullptr;
    void* ctx = nullptr;
    unsigned n = 0;
    while (ibv_get_cq_event(s->cc, &ev_cq, &ctx) == 0) ++n;
    if (n) ibv_ack_cq_events(s->cq, n);
  }
  // A connecting socket's rdma_cm events drive its connect (rs_do_connect), whoever pumps:
  // read as anything else, they were lost and the connect never ended. Where it gets to,
  // and a disconnect, wake the socket's other waiters (one of them read the event that
  // the others' sleep was watching for).
  bool progress = false;
  if (s->state == State::connecting) {
    connect_poll_locked(s);
    progress = s->state != State::connecting;
  }
  // CM first: a DISCONNECTED queued after the last data means those completions are in the CQ
  // by now, and the CQ is drained next.
  progress |= drain_cm(s);
  if (s->cq) {
    ibv_wc wc[32];
    int n;
    while ((n = ibv_poll_cq(s->cq, 32, wc)) > 0) {
      progress = true;
      for (int i = 0; i < n; ++i) {
        if (wc[i].wr_id & kRecvBit)
          on_recv(s, wc[i]);
        else
          on_send(s, wc[i]);
      }
    }
  }
  give_credits_locked(s);
  if (progress && s->waiters) signal_waiters(s);
}

bool can_send_locked(const Rs* s, size_t left) {
  // rs_can_send: a WRITE and a SEND, a credit, granted space, and room in the send ring
  // unless what is left goes inline.
  return s->data_wrs >= 2 && s->sseq_no != s->sseq_comp && s->target[s->target_idx].length != 0 &&
         (s->sbuf_avail >= std::min(kSndLowat, s->sbuf_size) || left <= s->inline_size);
}

bool sends_idle_locked(const Rs* s) {
  return all_in(s->data_wrs, s->sq_size - kCtrlWrs) && all_in(s->ctrl_wrs, kCtrlWrs);
}

bool post_ctrl_locked(Rs* s, rs::Ctrl c) {
  if (!post_write_msg(s, nullptr, rs::msg(rs::Op::ctrl, static_cast<uint32_t>(c)), kCtrl))
    return false;
  s->ctrl_wrs--;
  return true;
}

namespace {

int conn_errno(const Rs* s) {
  if (s->state == State::error) return s->err ? s->err : EIO;
  if (s->state == State::connecting) return EAGAIN;
  if (s->state == State::connected || s->state == State::disconnected) return ECONNRESET;
  return ENOTCONN;
}

// Copies [src, src+len) of the application's data into the sbuf ring at its head: one or two
// SGEs (the copy may wrap). A read of application memory like the engine's DMA
// (engine/app_memory.h): riostream sends from the buffer it riomaps, which its peer's
// riowrite fills and whose arrival it learns by polling that memory, an ordering through
// the network that TSan cannot see.
int stage(Rs* s, const std::byte* src, uint32_t len, ibv_sge sge[2]) {
  const uint32_t first = std::min(len, s->sbuf_size - s->sbuf_head);
  sv::engine::copy_from_app(s->sbuf.data() + s->sbuf_head, src, first);
  sge[0] = {reinterpret_cast<uintptr_t>(s->sbuf.data() + s->sbuf_head), first, s->smr->lkey};
  int n = 1;
  if (len > first) {
    sv::engine::copy_from_app(s->sbuf.data(), src + first, len - first);
    sge[1] = {reinterpret_cast<uintptr_t>(s->sbuf.data()), len - first, s->smr->lkey};
    n = 2;
  }
  s->sbuf_head = (s->sbuf_head + len) % s->sbuf_size;
  s->sbuf_avail -= len;
  return n;
}

// The WRITE of up to n bytes of application data at src to (raddr, rkey): inline when n
// fits the socket's inline size (the data is copied at post), else staged in the sbuf ring,
// with n cut to the ring's free bytes. Its completion releases what it staged.
ibv_send_wr data_write(Rs* s, const std::byte* src, uint32_t& n, uint64_t raddr, uint32_t rkey,
                       ibv_sge sge[2]) {
  if (n <= s->inline_size) {
    sge[0] = {reinterpret_cast<uintptr_t>(src), n, 0};
    return rdma_write(wr_id(kWrite), sge, 1, true, raddr, rkey);
  }
  n = std::min(n, s->sbuf_avail);
  const int nsge = stage(s, src, n, sge);
  return rdma_write(wr_id(kWrite, n), sge, nsge, false, raddr, rkey);
}

// Posts pending iomap records to the peer's table (rs_send_iomaps), before data or riowrite.
void send_iomaps_locked(Rs* s) {
  for (auto& m : s->iomaps) {
    if (m.sent) continue;
    if (m.index < 0) {
      std::vector<bool> used(s->remote_iomap_count, false);
      for (const auto& o : s->iomaps)
        if (o.index >= 0) used[static_cast<size_t>(o.index)] = true;
      auto it = std::find(used.begin(), used.end(), false);
      if (it == used.end()) continue;  // the peer's table is full: stays local
      m.index = static_cast<int>(it - used.begin());
    }
    if (s->data_wrs < 2) return;
    std::byte rec[rs::kIomapLen];
    rs::Sge g{reinterpret_cast<uintptr_t>(m.buf), m.mr->rkey, static_cast<uint32_t>(m.len)};
    std::memcpy(rec, &m.offset, 8);
    std::memcpy(rec + 8, &g, sizeof g);
    ibv_sge sge{reinterpret_cast<uintptr_t>(rec), sizeof rec, 0};
    ibv_send_wr w = rdma_write(
        wr_id(kWrite), &sge, 1, true,
        s->remote_iomap_addr + static_cast<uint64_t>(m.index) * rs::kIomapLen, s->remote_iomap_key);
    if (!post_write_msg(s, &w, rs::msg(rs::Op::iomap_sgl, static_cast<uint32_t>(m.index)),
                        kDataMsg))
      return fail_locked(s, EIO);
    s->data_wrs -= 2;
    m.sent = true;
  }
}

// One DATA transfer of at most `len` bytes; returns the bytes sent.
uint32_t send_chunk_locked(Rs* s, const std::byte* src, uint32_t len, uint32_t& xfer) {
  rs::Sge& t = s->target[s->target_idx];
  uint32_t n = std::min({len, xfer, t.length});
  ibv_sge sge[2];
  ibv_send_wr w = data_write(s, src, n, t.addr, t.key, sge);
  if (!post_write_msg(s, &w, rs::msg(rs::Op::data, n), kDataMsg)) {
    fail_locked(s, EIO);
    return 0;
  }
  s->data_wrs -= 2;
  s->sseq_no++;
  t.addr += n;
  t.length -= n;
  if (t.length == 0) s->target_idx = (s->target_idx + 1) % rs::kSglEntries;
  if (xfer < kMaxXfer) xfer *= 2;
  return n;
}

ssize_t send_iov(int fd, const iovec* iov, int iovcnt, int flags) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return errno = EBADF, -1;
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  std::unique_lock lk(s->mu);
  const bool nb = s->nonblock || (flags & MSG_DONTWAIT);
  if (s->state == State::connecting &&
      wait_locked(
          s, lk, [s] { return s->state != State::connecting; }, nb))
    return -1;
  if (s->state != State::connected || !s->writable) {
    pump_locked(s);
    return errno = conn_errno(s), -1;
  }
  size_t sent = 0;
  int vi = 0;
  size_t voff = 0;
  uint32_t xfer = kMinXfer;
  // Blocking sockets send everything (as TCP and rdma-core's rsend do); non-blocking ones
  // return what went out, or EAGAIN if nothing did.
  auto ready = [s, &sent, total] {
    return s->state != State::connected || !s->writable || can_send_locked(s, total - sent);
  };
  while (sent < total) {
    if (!ready()) {
      if (wait_locked(s, lk, ready, nb)) {
        if (sent) break;
        return -1;
      }
      continue;
    }
    if (s->state != State::connected || !s->writable) {
      if (sent) break;
      errno = s->state == State::error ? conn_errno(s) : ECONNRESET;
      return -1;
    }
    send_iomaps_locked(s);
    if (!can_send_locked(s, total - sent)) continue;  // its records took the WRs: look again
    while (iov[vi].iov_len == voff) {
      ++vi;
      voff = 0;
    }
    const auto* src = static_cast<const std::byte*>(iov[vi].iov_base) + voff;
    const uint32_t want = static_cast<uint32_t>(std::min<size_t>(iov[vi].iov_len - voff, kMaxXfer));
    const uint32_t n = send_chunk_locked(s, src, want, xfer);
    if (n == 0) {
      if (sent) break;
      errno = conn_errno(s);
      return -1;
    }
    sent += n;
    voff += n;
  }
  return static_cast<ssize_t>(sent);
}

ssize_t recv_iov(int fd, const iovec* iov, int iovcnt, int flags) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return errno = EBADF, -1;
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  std::unique_lock lk(s->mu);
  const bool nb = s->nonblock || (flags & MSG_DONTWAIT);
  if (s->state == State::init || s->state == State::bound || s->state == State::listening)
    return errno = ENOTCONN, -1;
  // Connecting: what the connect comes to, first (EAGAIN meanwhile if non-blocking, as
  // rdma-core's rrecv turns rs_do_connect's EINPROGRESS into); it was read as EOF.
  if (s->state == State::connecting &&
      wait_locked(
          s, lk, [s] { return s->state != State::connecting; }, nb))
    return -1;
  size_t got = 0;
  for (;;) {
    auto have = [s] { return !s->rmsg.empty() || !s->readable; };
    if (wait_locked(s, lk, have, nb || (got > 0 && !(flags & MSG_WAITALL)))) {
      if (got) break;
      return -1;
    }
    if (s->rmsg.empty()) {
      if (got) break;
      if (s->state == State::error && s->err) {
        errno = s->err;
        s->err = 0;
        return -1;
      }
      return 0;  // EOF
    }
    // Copy out of the ring, message by message (a message never crosses the ring's end).
    uint32_t off = s->ledger.read_offset();
    uint32_t used = s->rmsg_used;
    size_t mi = 0;
    uint32_t consumed = 0, done_msgs = 0;
    int vi = 0;
    size_t voff = got;
    while (vi < iovcnt && voff >= iov[vi].iov_len) voff -= iov[vi++].iov_len;
    while (got < total && mi < s->rmsg.size()) {
      const uint32_t left = s->rmsg[mi] - used;
      const size_t n = std::min<size_t>({left, iov[vi].iov_len - voff});
      std::memcpy(static_cast<std::byte*>(iov[vi].iov_base) + voff, s->rbuf.data() + off, n);
      got += n;
      voff += n;
      off = static_cast<uint32_t>((off + n) % s->ledger.size());
      consumed += static_cast<uint32_t>(n);
      used += static_cast<uint32_t>(n);
      if (used == s->rmsg[mi]) {
        ++mi;
        ++done_msgs;
        used = 0;
      }
      if (voff == iov[vi].iov_len && ++vi < iovcnt) voff = 0;
      if (vi >= iovcnt) break;
    }
    if (flags & MSG_PEEK) break;
    s->ledger.consume(consumed, done_msgs);
    for (uint32_t i = 0; i < done_msgs; ++i) s->rmsg.pop_front();
    s->rmsg_used = used;
    s->rseq_no = static_cast<uint16_t>(s->rseq_no + done_msgs);
    give_credits_locked(s);
    if (!(flags & MSG_WAITALL) || got >= total) break;
  }
  return static_cast<ssize_t>(got);
}

}  // namespace
}  // namespace sv::rsock

using namespace sv::rsock;

SV_EXPORT ssize_t rsend(int fd, const void* buf, size_t len, int flags) {
  iovec v{const_cast<void*>(buf), len};
  return send_iov(fd, &v, 1, flags);
}

SV_EXPORT ssize_t rsendto(int fd, const void* buf, size_t len, int flags, const sockaddr*,
                          socklen_t) {
  // A connected stream: the address is ignored, as TCP does.
  return rsend(fd, buf, len, flags);
}

SV_EXPORT ssize_t rsendmsg(int fd, const msghdr* msg, int flags) {
  if (!msg) return errno = EFAULT, -1;
  if (msg->msg_controllen) return errno = EOPNOTSUPP, -1;
  return send_iov(fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

SV_EXPORT ssize_t rwrite(int fd, const void* buf, size_t count) {
  return rsend(fd, buf, count, 0);
}

SV_EXPORT ssize_t rwritev(int fd, const iovec* iov, int iovcnt) {
  return send_iov(fd, iov, iovcnt, 0);
}

SV_EXPORT ssize_t rrecv(int fd, void* buf, size_t len, int flags) {
  iovec v{buf, len};
  return recv_iov(fd, &v, 1, flags);
}

SV_EXPORT ssize_t rrecvmsg(int fd, msghdr* msg, int flags) {
  if (!msg) return errno = EFAULT, -1;
  msg->msg_controllen = 0;
  msg->msg_flags = 0;
  return recv_iov(fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

SV_EXPORT ssize_t rread(int fd, void* buf, size_t count) {
  return rrecv(fd, buf, count, 0);
}

SV_EXPORT ssize_t rreadv(int fd, const iovec* iov, int iovcnt) {
  return recv_iov(fd, iov, iovcnt, 0);
}

// riomap: expose `buf` to the peer's riowrite at `offset` (-1: the buffer's address).
SV_EXPORT off_t riomap(int fd, void* buf, size_t len, int prot, int /*flags*/, off_t offset) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return errno = EBADF, -1;
  if (!buf || !len || prot != PROT_WRITE) return errno = EINVAL, -1;
  std::unique_lock lk(s->mu);
  if (!s->cm || !s->qp || s->state != State::connected) return errno = ENOTCONN, -1;
  // Every map takes a slot of the peer's table (which the peer sized): none free is ENOMEM,
  // as rs_get_iomap_mr finds none. It used to succeed, and the peer's riowrite then failed.
  if (s->iomaps.size() >= s->remote_iomap_count) return errno = ENOMEM, -1;
  LocalIomap m;
  m.buf = buf;
  m.len = len;
  m.offset = offset == -1 ? reinterpret_cast<uintptr_t>(buf) : static_cast<uint64_t>(offset);
  m.mr = ibv_reg_mr(s->qp->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!m.mr) return -1;
  s->iomaps.push_back(m);
  send_iomaps_locked(s);
  return static_cast<off_t>(m.offset);
}

SV_EXPORT int riounmap(int fd, void* buf, size_t len) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return errno = EBADF, -1;
  std::unique_lock lk(s->mu);
  auto it = std::find_if(s->iomaps.begin(), s->iomaps.end(),
                         [&](const LocalIomap& m) { return m.buf == buf && m.len == len; });
  if (it == s->iomaps.end()) return errno = EINVAL, -1;
  ibv_dereg_mr(it->mr);
  s->iomaps.erase(it);
  return 0;
}

// riowrite: RDMA WRITE into the peer's iomap'ed buffer at `offset`; no message follows (the
// peer watches its memory). (size_t)-1 with errno on error, as rdma-core.
SV_EXPORT size_t riowrite(int fd, const void* buf, size_t count, off_t offset, int flags) {
  const RsRef ref = get(fd);
  Rs* s = ref.get();
  if (!s) return errno = EBADF, static_cast<size_t>(-1);
  std::unique_lock lk(s->mu);
  const bool nb = s->nonblock || (flags & MSG_DONTWAIT);
  if (s->state != State::connected || !s->writable) {
    errno = conn_errno(s);
    return static_cast<size_t>(-1);
  }
  const auto* src = static_cast<const std::byte*>(buf);
  size_t done = 0;
  uint64_t off = static_cast<uint64_t>(offset);
  auto ready = [s] {
    return s->state != State::connected || (s->data_wrs >= 1 && s->sbuf_avail >= 1);
  };
  while (done < count) {
    send_iomaps_locked(s);
    const PeerIomap* m = nullptr;
    for (const auto& p : s->peer_iomaps)
      if (p.sge.length && off >= p.offset && off - p.offset < p.sge.length) m = &p;
    if (!m) {
      if (done) break;
      errno = EINVAL;
      return static_cast<size_t>(-1);
    }
    if (!ready()) {
      if (wait_locked(s, lk, ready, nb)) {
        if (done) break;
        return static_cast<size_t>(-1);
      }
      // The wait let go of the lock: the peer may have replaced the entry; look it up again.
      continue;
    }
    if (s->state != State::connected) {
      if (done) break;
      errno = conn_errno(s);
      return static_cast<size_t>(-1);
    }
    uint32_t n = static_cast<uint32_t>(
        std::min<uint64_t>({count - done, m->sge.length - (off - m->offset), kMaxXfer}));
    ibv_sge sge[2];
    ibv_send_wr w = data_write(s, src + done, n, m->sge.addr + (off - m->offset), m->sge.key, sge);
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(s->qp, &w, &bad)) {
      fail_locked(s, EIO);
      if (done) break;
      errno = EIO;
      return static_cast<size_t>(-1);
    }
    s->data_wrs--;
    done += n;
    off += n;
  }
  return done;
}
