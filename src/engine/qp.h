// Reliable-connected queue pairs over iWARP.
//
// Theory of operation
// -------------------
// Each RC QP owns one TCP connection carrying MPA FPDUs (RFC 5044) once it is connected.
// Three engines act on a QP, split as in rxe:
//   requester (qp_requester.cc): turns SQ WQEs and pending Read/Atomic responses into FPDUs
//            and writes them to the socket (TX);
//   responder (qp_responder.cc): validates and executes inbound Send/Write/Read Request/
//            Atomic/Immediate messages, and matches inbound Read/Atomic responses to the
//            oldest outstanding request (the ORQ: RFC 5040 §4.5, they arrive in order);
//   completer (qp_completer.cc): retires SQ WQEs in order into the send CQ, and flushes.
// qp_state.cc owns the connection's lifecycle and the move to ERR (qp_state.h).
// iw_rx.cc parses the byte stream (resumable header/data/trailer machine, as siw's
// SIW_GET_HDR/DATA/TRAILER) and dispatches to the responder or completer.
//
// Threads: the application thread (post_send, post_recv, poll_cq) and one progress thread
// per process (progress.cc, epoll). Either may run TX or RX of a QP:
//   tx_mu  guards the SQ ring, IRQ, TX batch and socket writes;
//   rx_mu  guards the RX parser; taken with try_lock by pollers so nobody waits for it;
//   rq_mu  guards the RQ ring.
// Lock order: rx_mu -> tx_mu -> rq_mu -> Cq::mu. The state is an atomic so the hot path can
// read it without a lock; transitions happen under tx_mu.
#pragma once
#include <infiniband/verbs.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/context.h"
#include "engine/cq.h"
#include "engine/fault.h"
#include "engine/mr.h"
#include "engine/progress.h"
#include "engine/qp_state.h"
#include "engine/shm_link.h"
#include "engine/stats.h"
#include "transport/tcp.h"
#include "util/raw_array.h"
#include "wire/ddp_rdmap.h"
#include "wire/terminate_codes.h"

namespace sv::engine {

struct Srq;

// Marker in a Send's RsvdULP field: an RFC 7306 Immediate Data message carrying this
// Send's immediate value follows. Only ever sent to a peer known to be softverbs.
inline constexpr uint32_t kSvImmFollows = 0x53560001;  // "SV" 0001
// First 4 bytes of Immediate Data: the imm value; next 4: 1 if it belongs to the Send
// just before it, 0 if it stands alone (RDMA Write with immediate).
inline constexpr uint32_t kSvImmAttached = 1;

enum class WqeState : uint8_t { queued, sending, sent, awaiting_response, done };

struct SendWqe {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned flags = 0;
  uint32_t imm_or_inv = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint32_t num_sge = 0;
  uint32_t length = 0;
  ibv_sge* sge = nullptr;  // into the QP's pool; inline data gets one SGE to inline_buf
  BindArgs bind;           // IBV_WR_BIND_MW
  bool signaled = false;
  // progress
  WqeState state = WqeState::queued;
  uint32_t sent = 0;         // payload bytes already framed
  bool data_framed = false;  // the message's data is framed (its Immediate Data may not be)
  uint64_t stream_end = 0;   // TX stream offset just past this WQE's last byte
  uint32_t msn = 0;          // Read/Atomic request MSN (also the atomic request id)
  uint32_t resp_bytes = 0;   // Read Response bytes placed
  uint32_t ack_seq = 0;      // softverbs peer: complete once peer_acked reaches it
  bool by_ref = false;       // a segment named its data (kDdpSvRef): the peer reads it from
                             // our memory until it acks, whatever acks_unseen says
  // UD (qp_ud.cc): the destination, copied from the AH at post so it may be destroyed.
  ibv_gid dgid{};
  uint8_t sgid_index = 0;  // the interface a multicast datagram leaves on
  uint32_t remote_qpn = 0;
  uint32_t remote_qkey = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
};

// An address handle (UD): where a datagram goes. Only global (GRH) addresses exist on our
// Ethernet-like port.
struct Ah {
  ibv_ah ah;  // first: handed out as ibv_ah*
  ibv_ah_attr attr{};
  static const Ah* from(const ibv_ah* a) { return reinterpret_cast<const Ah*>(a); }
};

// A multicast group a UD QP is attached to (ibv_attach_mcast): a UDP socket of its own,
// bound to the group's port and joined to the group (qp_ud.cc).
struct McastMember {
  ibv_gid gid{};
  int fd = -1;
  uint32_t events = 0;
  std::unique_ptr<Progress::Handler> io;
};

struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  uint32_t length = 0;
  ibv_sge* sge = nullptr;
};

// Inbound Read Request or Atomic being answered (RFC 5040 §5.2: the IRQ, bounded by IRD).
struct IrqEntry {
  bool atomic = false;
  uint32_t sink_stag = 0;
  uint64_t sink_to = 0;
  const std::byte* src = nullptr;
  uint32_t src_stag = 0;  // re-checked as each Read Response segment is framed
  uint64_t src_to = 0;
  uint32_t length = 0;
  uint32_t sent = 0;
  wire::AtomicResponse aresp{};
};

enum class RxPhase : uint8_t { header, data, trailer };

// Where the current segment's payload goes.
struct Placement {
  enum class Kind : uint8_t { discard, contiguous, sgl } kind = Kind::discard;
  std::byte* ptr = nullptr;      // contiguous
  const ibv_sge* sge = nullptr;  // sgl
  uint32_t num_sge = 0;
  uint32_t offset = 0;  // byte offset into the sgl
};

struct Conn {
  int fd = -1;
  bool crc = false;
  bool peer_sv = false;    // peer is softverbs: RFC 7306 opcodes allowed
  bool send_acks = false;  // softverbs peer asked for Placement Acks (SOFTVERBS_IB_COMPLETION)
  bool wait_acks = false;  // we did: our Sends/Writes complete on its acks
  // Responder: send nothing until the first FPDU arrives. Written with rx_mu and tx_mu
  // held (set up, and RX taking the first FPDU), so either lock reads it.
  bool tx_gated = false;
  // tx_mu: nothing more is framed, after a Terminate or a reset fault. Apart from tx_gated,
  // which the peer's next FPDU lifts.
  bool tx_stopped = false;
  bool expect_rtr = false;    // p2p responder: the first FPDU is the RTR, not for the ULP
  bool send_rtr = false;      // p2p initiator: send a zero-length Write first
  uint32_t max_ulpdu = 0;     // largest ULPDU we send
  uint16_t ird = 0, ord = 0;  // negotiated (RFC 6581 §5)

  // RX (under rx_mu)
  util::RawArray<std::byte> rxbuf;
  size_t rx_begin = 0, rx_end = 0;
  RxPhase phase = RxPhase::header;
  std::array<std::byte, 96> hdr{};
  size_t hdr_have = 0;
  uint16_t ulpdu_len = 0;
  wire::DdpSegment seg{};
  uint32_t data_left = 0;
  bool big_seg = false;  // the last segment's payload went (or could go) direct
  Placement place;
  uint32_t crc_state = 0;
  std::array<std::byte, 8> trailer{};
  size_t trailer_have = 0;
  // Idle trimming (qp_trim.cc): a read into rxbuf since the last sweep; rxbuf has pages the
  // sweep has not given back since.
  bool rx_active = false;
  bool rx_resident = false;
  uint64_t rx_reads = 0;   // reads that took bytes, ever (a poller's pass took some)
  uint32_t recv_msn = 1;   // next expected MSN, QN 0 (RFC 5041 §5.3: starts at 1)
  uint32_t rreq_msn = 1;   // QN 1
  uint32_t aresp_msn = 1;  // QN 3
  RecvWqe cur_recv{};      // receive WQE being filled
  bool have_recv = false;
  bool recv_error = false;
  bool imm_pending = false;  // completed Send awaits its Immediate Data
  RecvWqe imm_recv{};
  uint32_t imm_len = 0;
  uint32_t rnr_gen = 0;                    // identifies the current receive-buffer stall
  uint32_t write_len = 0;                  // bytes of the RDMA Write being received
  uint32_t last_write_len = 0;             // length of the last complete one (Write with immediate)
  std::array<ibv_sge, kMaxSge> cur_sge{};  // copies: the RQ slot is reusable once popped
  std::array<ibv_sge, kMaxSge> imm_sge{};
  std::array<ibv_sge, kMaxSge> tmp_sge{};
  // UC (IB spec 9.9.3, responder class D): a message that cannot be placed is dropped, not
  // Terminated. Its remaining segments are discarded; an Immediate Data message right behind
  // a dropped Send or Write is part of it and goes too. A non-SRQ receive that a too-long
  // Send had started is kept for the next Send (rxe do_class_d1e_error).
  enum class UcDrop : uint8_t { none, send, write } uc_drop = UcDrop::none;
  bool uc_drop_imm = false;      // the next message, if Immediate Data, belongs to a dropped one
  bool recv_reuse = false;       // cur_recv is held, unused: the next Send starts it over
  uint32_t units_rx = 0;         // softverbs peer: Send/Write/Immediate Data messages placed
  uint32_t units_published = 0;  // ... of which the TX side has been told
  bool ack_requested = false;    // a message placed in this pass asked for its ack now

  // TX (under tx_mu)
  static constexpr size_t kMaxIov = 512;
  static constexpr size_t kHdrArena = 128 * 1024;
  util::RawArray<iovec> iov;
  size_t iov_n = 0, iov_pos = 0;
  util::RawArray<std::byte> arena;  // headers and trailers of the current batch
  size_t arena_used = 0;
  bool tx_active = false;  // the arena was written since the last sweep (qp_trim.cc)
  bool tx_resident = false;
  uint64_t tx_queued = 0, tx_sent = 0;
  uint32_t send_msn = 0;      // last MSN used, QN 0
  uint32_t rreq_msn_tx = 0;   // QN 1
  uint32_t aresp_msn_tx = 0;  // QN 3
  uint32_t term_msn_tx = 0;   // QN 2
  // Placement acks between softverbs peers (wire::RdmapOpcode::sv_ack). Ours: ack_to_send is
  // the count the RX path has published, ack_sent the last one framed. Theirs: units_tx counts
  // the Send/Write/Immediate Data messages we framed, peer_acked how many they placed.
  uint32_t ack_to_send = 0, ack_sent = 0;
  uint32_t units_tx = 0, peer_acked = 0;
  uint32_t unrequested = 0;  // messages framed since the last one that asked for an ack
  // tx_mu: our RX waits for a receive for the peer's Send (RNR), so its acks, queued behind
  // that Send on the stream, cannot be read. Until it moves on, our Sends and Writes complete
  // on transmit (RFC 5040), else a peer that placed them would wait on us and we on it.
  bool acks_unseen = false;

  // Shared memory (issue 29, shm_link.h, qp_shm.cc). shm is set and reset with rx_mu and
  // tx_mu held; the set-up flags below are written with tx_mu held (RX takes it to answer).
  std::unique_ptr<ShmLink> shm;
  bool shm_cap_tx = false;           // our FPDUs carry kDdpSvShmCap (peer_sv and SOFTVERBS_SHM)
  bool shm_passive = false;          // the MPA responder: the one side that answers offers
  bool shm_offer_on_cap = false;     // initiator: offer once the peer's FPDUs carry the bit
                                     // (written with rx_mu and tx_mu held)
  uint8_t shm_tx_due = 0;            // a wire::ShmCtrl::Type to frame next (0: none)
  bool shm_wait_answer = false;      // initiator: offered, no accept or decline yet
  bool shm_wait_switch = false;      // responder: accepted, the initiator's switch not yet read
  bool shm_tx_switch = false;        // tx_mu: once this batch is sent, TX goes to the ring
  bool rx_switch_after_seg = false;  // rx_mu: the peer's bytes after this segment are in its ring
  uint64_t bell_check_ns = 0;        // rx_mu: when RX last looked at the socket for bells
  uint64_t bell_wait_since = 0;      // rx_mu: since when bell_pending is set with no byte come
  bool shm_placed = false;   // tx_mu: the peer publishes its placed count in the segment (our
                             // TX is on the ring, so it maps it): Conn::acks_unseen reads it
  bool ref_pending = false;  // rx_mu: this segment's data is read from the peer at its
  uint64_t ref_addr = 0;     // end (kDdpSvRef): from ref_addr, ref_len bytes, into
  uint32_t ref_len = 0;      // `place`

  bool fault_reset = false;  // tx_mu: a reset fault cut the batch; abort once it is sent
  bool registered = false;   // in the progress thread's epoll set
  uint32_t events = 0;       // current epoll interest
};

// The ibv_wr_* batch being built between ibv_wr_start and ibv_wr_complete (verbs/qp_ex.cc).
// SGEs and inline copies are kept by index; pointers are resolved at ibv_wr_complete.
struct WrBatch {
  std::vector<ibv_send_wr> wrs;
  std::vector<uint32_t> first_sge;  // per WR: its SGEs start here in sges
  std::vector<ibv_sge> sges;        // inline WRs: addr is an offset into inline_data
  std::vector<std::byte> inline_data;
  int err = 0;  // a builder or setter misused since ibv_wr_start
};

struct Qp {
  ibv_qp_ex qpx;  // first: ibv_qp_ex begins with ibv_qp
  // Created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: ibv_qp_to_qp_ex answers, qpx's ops are set.
  std::unique_ptr<WrBatch> wr_batch;
  Context* ctx = nullptr;
  Pd* pd = nullptr;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  Srq* srq = nullptr;
  bool sq_sig_all = false;

  // attributes (ibv_query_qp)
  ibv_qp_cap cap{};
  ibv_qp_attr attr{};
  std::atomic<ibv_qp_state> state{IBV_QPS_RESET};
  bool rnr_retry_set = false;  // IBV_QP_RNR_RETRY was given (a QP left in RTR never sets it)
  // softverbs_qp_set_ib_completion: -1 follows SOFTVERBS_IB_COMPLETION, 0/1 overrides it.
  std::atomic<int> ib_completion_pref{-1};

  // SQ ring (tx_mu)
  std::mutex tx_mu;
  std::vector<SendWqe> sq;
  // Written at post (qp_post_send), never read past what was posted: not cleared, so an idle
  // QP's unused slots cost no resident memory (128 WRs x 16 SGEs: 55 KiB of the two).
  util::RawArray<ibv_sge> sq_sge;
  util::RawArray<std::byte> sq_inline;
  uint32_t sq_head = 0;  // oldest not yet completed
  uint32_t sq_tx = 0;    // next to frame
  uint32_t sq_count = 0;
  // Doorbell batching (qp_post_send): posts that follow a transmit within the batch window
  // are queued, and go out together at the next flush point (a post after the window, an
  // ibv_poll_cq or ibv_req_notify_cq of its send CQ, or the progress thread's timer).
  uint64_t tx_window_end_ns = 0;
  // Messages of the peer placed here (Sends, Writes, Read and Atomic Responses). A post that
  // follows one answers it, a turn of a ping-pong rather than part of a stream: it is never
  // held back, however soon after the last post it comes (tx_post_locked).
  std::atomic<uint32_t> rx_turns{0};
  uint32_t tx_turns_seen = 0;   // tx_mu: rx_turns at the last post
  uint64_t flush_timer_at = 0;  // tx_mu: when the flush timer that acts is due (mono ns), 0: none
  bool lazy_ack_timer = false;  // an unrequested Placement Ack's timer is pending
  uint32_t lazy_ack_armed_at = 0;  // tx_mu: Conn::ack_to_send when that timer was armed
  uint32_t lazy_ack_rearms = 0;    // tx_mu: times it waited again for a busy stream
  bool ack_held = false;           // tx_mu: an ack the peer asked for waits for an answer
  uint32_t ack_held_to = 0;        // tx_mu: Conn::ack_to_send when it was held (tx_flush_locked)
  uint8_t ack_answers = 0;         // tx_mu: held acks in a row an answer carried (tx_ack_locked)
  uint32_t holds = 0, holds_seen = 0;    // tx_mu: acks held, and as the flush timer last saw
  std::atomic<bool> tx_deferred{false};  // WQEs wait for a flush
  uint64_t tx_defer_due = 0;             // tx_mu: when what is deferred now must leave (mono ns)
  uint32_t orq_used = 0;                 // outstanding Read/Atomic requests (<= ORD)
  std::vector<IrqEntry> irq;             // ring, size IRD
  uint32_t irq_head = 0, irq_count = 0;

  // RQ ring (rq_mu)
  std::mutex rq_mu;
  std::vector<RecvWqe> rq;
  std::vector<ibv_sge> rq_sge;
  uint32_t rq_head = 0, rq_count = 0;

  std::mutex rx_mu;
  Conn conn;  // conn.fd is written only on the progress thread holding rx_mu and tx_mu
  // Read without locks by pollers and the progress thread, hence atomics:
  // The connection's lifecycle (qp_state.h): written only by conn_transition_locked.
  std::atomic<ConnState> conn_state{ConnState::idle};
  bool conn_up() const { return conn_state.load(std::memory_order_acquire) == ConnState::up; }
  uint32_t conn_gen = 0;  // rx_mu and tx_mu: connections this QP has taken (qp_take_endpoint)
  std::atomic<bool> rx_stalled{false};  // no receive buffer: stop reading (RNR wait)
  std::atomic<bool> tx_blocked{false};  // socket full: EPOLLOUT armed
  // Busy-poll ownership (busy_poll.h), progress thread only: a poller runs RX, the socket is
  // out of the progress thread's EPOLLIN until a recheck (timer) or the poller's end.
  bool rx_yielded = false;
  // The step-back could not take rx_mu to quiet the ring (the poller held it, in a pass):
  // the poller does it after its pass (qp_busy_quiet_locked). Else the peer rang for every
  // message, and the poller took each bell with a recv, for as long as it polled.
  std::atomic<bool> rx_quiet_due{false};
  // rx_yielded as the poller sees it (qp_busy_quiet_locked, qp_busy_bell_taken_locked).
  std::atomic<bool> rx_handed{false};
  // qp_busy_bell_taken_locked posted a step-back that has not run yet.
  std::atomic<bool> step_back_asked{false};
  uint64_t yield_timer_at = 0;  // the soonest recheck pending (mono ns; 0: none)
  uint32_t yield_backoff = 0;   // rechecks while still polled come this many hold times apart
  uint64_t park_gen = 0;        // the blocker's sleep (Cq::block_gen) the last park saw
  uint32_t park_backoff = 1;    // rechecks during it come this many kBlockRecheckNs apart
  // Blocking ownership (busy_poll.h): the socket is in the wait set of the scq (bit 0) and
  // the rcq (bit 1). Progress thread only.
  uint8_t wait_sets = 0;

  // connection set-up (qp_state.cc)
  bool cm_managed = false;  // rdma_cm drives transitions and owns set-up
  bool error_reported = false;
  bool ack_timer_armed = false;  // tx_mu: a transport-timeout check is pending
  uint16_t setup_deferrals = 0;  // transport-timer periods granted to a set-up in flight
  void* cm_id = nullptr;         // rdma_cm_id when cm_managed
  uint64_t cm_serial = 0;        // and that id's serial: a later id may reuse its address
  // rdma_cm is told when the connection ends (peer closed or QP error). Cleared by
  // rdma_destroy_qp while the progress thread may be reading it.
  std::atomic<DisconnectFn> on_disconnect{nullptr};
  std::unique_ptr<Progress::Handler> io;  // epoll handler for conn.fd
  uint32_t events_reported = 0;           // async events posted for it (qpx.qp_base.mutex)

  // UC: an RC connection underneath; the IB differences are at post (no Read or Atomic),
  // completion (on transmit: UC has no acks) and the responder (drops instead of errors).
  bool uc = false;
  // UD (qp_ud.cc): the QP's own UDP socket, bound to the port in its QPN (port << 8 | 0xFF).
  bool ud = false;
  int ud_fd = -1;
  bool ud_registered = false;       // progress thread only
  uint32_t ud_events = 0;           // progress thread only
  std::vector<std::byte> ud_rxbuf;  // rx_mu: one datagram
  bool ud_dual_stack = false;       // ud_fd is AF_INET6 taking IPv4 too
  uint32_t ud_psn = 0;              // tx_mu
  bool ud_tx_failed = false;        // tx_mu: a WQE failed, the QP is going to ERR
  // Attached multicast groups: changed and read on the progress thread only; their count
  // is read by ibv_destroy_qp (EBUSY while any is attached, as the kernel's usecnt).
  std::vector<std::unique_ptr<McastMember>> mcast;
  std::atomic<uint32_t> mcast_groups{0};
  int mcast_tx_sgid = -1;  // tx_mu: the GID index the multicast interface is set for

  ibv_qp* ibqp() { return &qpx.qp_base; }
  static Qp* from(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
  uint32_t qpn() const { return qpx.qp_base.qp_num; }
  stats::Slot* stats = nullptr;  // counters, published for softverbs-stat (never null once made)
  // SOFTVERBS_FAULT (engine/fault.h): null unless the process runs under fault rules; set
  // at creation, never changed.
  std::unique_ptr<fault::QpFaults> faults;
  std::atomic<bool> fault_corrupt_armed{false};  // softverbs_qp_inject_fault: the next FPDU
  // A Placement Ack read while another thread held tx_mu (ibv_post_send writing a large
  // batch on the caller's thread): its count waits here and the holder folds it in with its
  // next completion pass (complete_sq_locked), so the reader never blocks behind a sendmsg;
  // a task on the progress thread folds it should nobody else (on_sv_ack). Conn state, kept
  // here because Conn is swapped for a fresh one on RESET and atomics do not move.
  std::atomic<uint32_t> ack_stash{0};
  std::atomic<bool> ack_stashed{false};
  // A stall fault holds the connection both ways: nothing is sent or read until its timer.
  // Non-zero while held: the generation of the latest stall, so only its timer releases it
  // (a compare-and-swap, which a newer stall makes fail).
  std::atomic<uint32_t> fault_held{0};
  std::atomic<uint32_t> fault_hold_gen{0};
  // TX writes to the shared-memory ring (Conn::shm): the socket carries only doorbells from
  // us. Written with tx_mu held; read by RX (which may ring for room only then) and by the
  // progress thread (a full ring waits for a bell, EPOLLIN, not EPOLLOUT).
  std::atomic<bool> tx_ring{false};
  // RX reads the peer's ring; the socket holds only bells (written with rx_mu held; read by
  // the progress thread for the socket's interest).
  std::atomic<bool> rx_ring{false};
  // The socket said EOF or reset while on shared memory: a full ring will never drain.
  std::atomic<bool> shm_gone{false};
  std::atomic<bool> shm_tx_timer{false};      // a retry of a full ring is scheduled
  std::atomic<bool> shm_placed_timer{false};  // shm_watch_placed_locked's look is scheduled

  // Lifetime, as rxe's kref on its QP (rxe_get/rxe_put): ibv_create_qp's reference, and one
  // per piece of deferred work (QpRef). qp_destroy tears the QP down, sets `destroyed` on the
  // progress thread (where deferred work runs), and drops its reference; the memory goes
  // with the last one, so deferred work never re-finds a QP by number (whose QPN and
  // address a new QP may have taken meanwhile).
  std::atomic<uint32_t> refs{1};
  std::atomic<bool> destroyed{false};
};

// Frees the QP when the last reference goes (qp_destroy drops ibv_create_qp's).
inline void qp_put(Qp* qp) {
  if (qp->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete qp;
}

// A reference held by deferred work (Progress::post/post_after lambdas). live() is false
// once qp_destroy has run; the memory stays valid until the reference goes.
class QpRef {
 public:
  explicit QpRef(Qp* qp) : qp_(qp) { qp_->refs.fetch_add(1, std::memory_order_relaxed); }
  QpRef(const QpRef& o) : QpRef(o.qp_) {}
  QpRef(QpRef&& o) noexcept : qp_(o.qp_) { o.qp_ = nullptr; }
  QpRef& operator=(const QpRef&) = delete;
  ~QpRef() {
    if (qp_) qp_put(qp_);
  }
  Qp* get() const { return qp_; }
  bool live() const { return !qp_->destroyed.load(std::memory_order_acquire); }

 private:
  Qp* qp_;
};

struct Srq {
  ibv_srq srq;  // first
  Context* ctx = nullptr;
  Pd* pd = nullptr;
  std::mutex mu;
  std::vector<RecvWqe> ring;
  std::vector<ibv_sge> sge;
  uint32_t head = 0, count = 0;
  uint32_t max_wr = 0, max_sge = 0, limit = 0;
  std::mutex qps_mu;
  std::vector<Qp*> qps;          // to restart QPs stalled waiting for a buffer
  uint32_t events_reported = 0;  // async events posted for it (srq.mutex)
  // A QP stalled waiting for one of its receives since a post last looked (srq_mark_stalled):
  // only then does a post visit qps. RDS shares one SRQ among all its connections and posts
  // to it once a message: a visit of every QP each time was O(connections) per message.
  std::atomic<bool> maybe_stalled{false};
};

// RX of qp found no receive in its SRQ and stalled: marks the SRQ so that its next post
// restarts qp, then says whether a receive was posted before the mark (then qp retries now:
// that post did not see the mark). False for a QP without an SRQ.
bool srq_mark_stalled(Qp* qp);

// ---- qp.cc: creation, state machine, posting -------------------------------------------
Qp* qp_create(Context* ctx, Pd* pd, const ibv_qp_init_attr* init, int* err);
int qp_destroy(Qp* qp);
int qp_modify(Qp* qp, ibv_qp_attr* attr, int mask);
int qp_query(Qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init);
// all_or_nothing (ibv_wr_complete): every WR is checked, and the SQ's room, before any is
// queued; on error none is.
int qp_post_send(Qp* qp, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing = false);
int qp_post_recv(Qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int srq_post_recv(Srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
// Puts back a receive WQE a QP took from srq and will never complete (destroy, RESET).
// False if the ring is full.
bool srq_requeue(Srq* srq, const RecvWqe& w);
// ibv_modify_srq (mask already checked to be MAX_WR and/or LIMIT) and ibv_query_srq.
int srq_modify(Srq* srq, const ibv_srq_attr* attr, int mask);
void srq_query(Srq* srq, ibv_srq_attr* attr);
// Gives back the pages wholly inside the receive buffers still posted to it (MADV_DONTNEED),
// for softverbs_srq_trim (verbs_ext.h). Returns the bytes advised away.
size_t srq_trim(Srq* srq);
// A QP still uses it (ibv_destroy_srq: EBUSY).
bool srq_in_use(Srq* srq);
// ---- qp_state.cc: the connection lifecycle (qp_state.h) and the move to ERR --------------
// The one writer of a QP's state: the engine's copy (qp->state, read lock-free), the copy
// ibv_query_qp reports (attr.qp_state / cur_qp_state), the one the application may read in
// struct ibv_qp, and the published one (softverbs-stat). Called with tx_mu held.
void qp_set_state_locked(Qp* qp, ibv_qp_state s);

// Moves the QP to ERR and flushes it. With `fatal`, the first error raises `event` (an
// affiliated asynchronous event: QP_FATAL, or QP_ACCESS_ERR for an access violation).
// `report`, if given, pushes the completion of the WQE that failed: it runs once the QP is in
// ERR and before the flush, so a consumer that polls it finds the QP in ERR already, and the
// flushed WQEs after it.
void qp_set_error(Qp* qp, ibv_wc_status status, bool fatal,
                  ibv_event_type event = IBV_EVENT_QP_FATAL,
                  const std::function<void()>& report = {});  // qp_state.cc
// Runs pending RX and TX without blocking (called by poll_cq and the progress thread).
// True if RX took bytes.
bool qp_progress(Qp* qp);
// Connection established: start TX/RX through the progress thread.
void qp_attach_conn(Qp* qp);
// Recomputes the socket's epoll interest (EPOLLIN unless stalled, EPOLLOUT if blocked).
void qp_update_interest(Qp* qp);
// The connection ended under us (EOF, reset, Terminate): error the QP.
void qp_conn_lost(Qp* qp, ibv_wc_status status);

// ---- qp_fault.cc ----------------------------------------------------------------------
// What a fired SOFTVERBS_FAULT rule does to a connected QP (fault.h decides which frame).
// Counts the firing in the QP's counters.
void qp_fault_count(Qp* qp, fault::FaultAction a);
// stall: nothing is sent or read on the connection for `ms`, then it goes on as before.
void qp_fault_hold(Qp* qp, uint32_t ms);
// reset: an abortive close (RST), as a pulled cable; the QP then fails as on a lost
// connection. Caller holds tx_mu or rx_mu.
void qp_fault_reset_locked(Qp* qp);
// softverbs_qp_inject_fault: 0, EINVAL (unknown fault), EOPNOTSUPP (not a connected QP,
// or corrupt on a connection without MPA CRC) or ENOTCONN (no connection to act on).
int qp_inject_fault(Qp* qp, const char* what);

// ---- qp_requester.cc ------------------------------------------------------------------
// Frames and writes as much as the socket takes. Caller holds tx_mu.
void tx_run_locked(Qp* qp);
void tx_post_locked(Qp* qp);  // after a post: transmit now or batch (doorbell batching)
// A Placement Ack is due for a receive pass: now or at the poller's next flush point if the
// peer asked (requested; right after the pass when the poller has no one answer to post),
// else lazily (coalesced).
void tx_ack_locked(Qp* qp, bool requested, bool no_one_answer);
void tx_kick(Qp* qp);  // takes tx_mu
// Sends what doorbell batching deferred (takes tx_mu; nothing to do is one atomic load).
// false: with_acks was false and all qp holds is a Placement Ack, kept (Cq::flush_deferred_tx).
bool qp_tx_flush(Qp* qp, bool with_acks = true);
// Every QP's held transmit leaves now: posts held for a batch, and Placement Acks held for
// an answer. At exit (the application posted them, and a peer waits on the ack), and when a
// thread turns to rdma_cm (it is not about to answer on a QP: perftest -R's client connects
// right after the handshake Send it received, and its ack, held, let the server, waiting
// for that Send to complete before it listens, lose the race and refuse it).
void qp_flush_deferred_all();
// When a Placement Ack held for an answer last left without one (at its hold's end, a flush
// point or an rdma_cm call), mono ns; 0: never. Endpoint::connect retries a refused connect
// for a while after it (iw_cm.h).
uint64_t held_ack_flushed_at();
// Sends a Terminate (best effort) and no more FPDUs afterwards. Caller holds tx_mu.
void tx_terminate_locked(Qp* qp, const wire::Terminate& t);

// ---- qp_completer.cc ------------------------------------------------------------------
// Retires finished WQEs from sq_head in order. Caller holds tx_mu.
void complete_sq_locked(Qp* qp);
// tx_mu held: a Placement Ack on_sv_ack left (Qp::ack_stash) takes effect. One that is
// invalid (more than we sent, or going back) fails the QP, from the progress thread.
void fold_stashed_ack_locked(Qp* qp);
void flush_qp_locked(Qp* qp, ibv_wc_status first_status);
void complete_recv(Qp* qp, const RecvWqe& w, ibv_wc_status st, uint32_t byte_len, ibv_wc_opcode op,
                   unsigned wc_flags, uint32_t imm, uint32_t inv);
// A UD receive: the sender's QPN, the GRH flag and the solicited bit come with the datagram;
// l3_type is the GRH's content as mlx5 reports it in wc.sl (kUdL3Ipv4 / kUdL3Ipv6).
inline constexpr uint8_t kUdL3Ipv6 = 1, kUdL3Ipv4 = 2;
void complete_recv_ud(Qp* qp, const RecvWqe& w, ibv_wc_status st, uint32_t byte_len,
                      uint32_t src_qp, bool imm, uint32_t imm_be, bool solicited,
                      uint8_t l3_type = 0);

// ---- qp_responder.cc: receive WQEs, shared with qp_ud.cc --------------------------------
// Pops a receive WQE (RQ or SRQ) into out, its SGEs copied into sge. False if none.
bool take_recv(Qp* qp, RecvWqe& out, std::array<ibv_sge, kMaxSge>& sge);
// Whether a receive is posted (the QP's RQ, or its SRQ) for take_recv to take.
bool recv_posted(Qp* qp);
// The WQE's buffers are registered for local write in the PD its queue belongs to.
bool recv_keys_ok(Qp* qp, const RecvWqe& w);
// The same, for a caller already holding KeyTable's read guard (to place under it).
bool recv_keys_ok_guarded(Qp* qp, const RecvWqe& w);

// ---- qp_ud.cc: unreliable datagram QPs over UDP ---------------------------------------
inline constexpr uint32_t kUdQpnLow = 0xFF;  // RC QPNs use 1..254 (iw_cm.cc)
inline constexpr uint32_t kUdMtu = 4096;     // the port's active_mtu: largest UD payload
// Opens the QP's UDP socket and gives it its QPN; 0 or an errno.
int ud_open(Qp* qp);
void ud_close(Qp* qp);
// Sends the queued WQEs from sq_tx (RTS only). Caller holds tx_mu.
void ud_tx_locked(Qp* qp);
// Receives what the socket holds while receive WQEs are posted. Caller holds rx_mu.
void ud_rx_run_locked(Qp* qp);
// The same from one of its sockets: its own, or a multicast group's (mcast). Holds rx_mu.
void ud_rx_fd_locked(Qp* qp, int fd, bool mcast);
void ud_update_interest(Qp* qp);
// The QPN a multicast datagram is addressed to (the IB spec reserves 0xFFFFFF for it).
inline constexpr uint32_t kMcastQpn = 0xFFFFFF;
// A multicast GID: IPv4-mapped 224.0.0.0/4 or ff00::/8 (the kernel's rdma_is_multicast_addr).
bool gid_is_multicast(const ibv_gid& gid);
// ibv_attach_mcast / ibv_detach_mcast on a UD QP: 0 or an errno.
int ud_attach_mcast(Qp* qp, const ibv_gid& gid);
int ud_detach_mcast(Qp* qp, const ibv_gid& gid);
// The receive side of either QP type (RC: rx_run_locked). Caller holds rx_mu.
void qp_rx_locked(Qp* qp);

// ---- iw_rx.cc -------------------------------------------------------------------------
// Parses what the socket holds. Caller holds rx_mu. Returns false if the connection died.
bool rx_run_locked(Qp* qp);

// ---- qp_shm.cc: the shared-memory transport (shm_link.h) -------------------------------
// SOFTVERBS_SHM: offer shared memory to softverbs peers on this host, and accept it.
bool shm_wanted();
// Initiator, connection just up (rx_mu and tx_mu held): creates the segment and queues the
// offer; on any failure the connection stays on TCP.
void shm_offer_locked(Qp* qp);
// Busy-poll ownership and the ring's bells (busy_poll.cc). Progress thread, for QPs whose RX
// is on a ring (else they do nothing and return false):
// Both with rx_mu held (the consumer's index is rx_mu's):
//  shm_quiet_locked: a spinner owns the QP's RX; the peer stops ringing.
//  shm_ring_on_locked: bells on again; true if bytes wait in the ring that a receive pass
//  would take now (the caller reads them, or wakes whoever will).
void shm_quiet_locked(Qp* qp);
bool shm_ring_on_locked(Qp* qp);
// shm_ring_on_locked from an application thread about to block (cq_block_begin, with the
// CQ's qps_mu held): takes the QP's rx_mu.
bool shm_wake_locked_out(Qp* qp);
// RX (rx_mu held): the peer's FPDU carried kDdpSvShmCap; an initiator that waits for it offers.
void shm_peer_capable(Qp* qp);
// Progress thread: a full ring whose consumer cannot ring us yet (our RX still reads TCP, the
// peer's switch not read): retry TX on a timer instead of waiting on the socket.
void shm_tx_retry_later(Qp* qp);
// Writes the kShmCtrlLen bytes of a control message of `type` (tx_mu held).
void shm_encode_ctrl(Qp* qp, uint8_t type, std::byte* out);
// tx_mu held: the batch that carried our accept or switch is sent; TX uses the ring now.
void shm_tx_switched_locked(Qp* qp);
// RX (rx_mu held), a shared-memory control message's header is in conn.hdr: answers or
// switches. False, with the reason in *err, for a message out of order or from a peer that
// never said it is softverbs (the caller Terminates).
bool shm_on_ctrl(Qp* qp, const char** err);
// rx_mu held: the segment that carried the peer's accept or switch is done; RX reads the ring.
void shm_rx_switch_locked(Qp* qp);
// rx_mu held, RX on the ring: takes the doorbells off the socket. False if it says EOF or
// reset (what is still in the ring is read first, then the connection ends).
bool shm_take_bells_locked(Qp* qp);
// The ring's counterparts of recv/recvmsg and sendmsg: bytes moved, 0 at the end of the
// stream (RX), or -1 with errno EAGAIN (empty / full) or EPROTO (the peer corrupted the ring).
// `app`: the iovecs include application memory (a payload placed straight from the ring).
ssize_t shm_rx_read(Qp* qp, iovec* iov, size_t n, bool app = false);
ssize_t shm_tx_write(Qp* qp, const iovec* iov, size_t n);
// tx_mu held, an RNR stall hides the peer's acks: while the oldest WR waits for the peer to
// read its data from our memory (SendWqe::by_ref), a timer looks at the peer's count of placed
// messages in the shared segment every millisecond.
void shm_watch_placed_locked(Qp* qp);
// tx_mu held: `len` bytes of a Write or Read Response go by reference (kDdpSvRef) now: TX is
// on the ring, the peer can read our memory, and len reaches SOFTVERBS_SHM_PULL_MIN.
bool shm_sends_refs(const Qp* qp, uint32_t len);
// rx_mu held: reads `len` bytes at `src` in the peer's memory into `dst` (n iovecs, as many
// bytes). 0, or the errno: ESRCH if the peer has exited, EFAULT if it does not have them.
int shm_pull(Qp* qp, const iovec* dst, size_t n, uint64_t src, uint32_t len);

// ---- errors.cc ------------------------------------------------------------------------
// The status of the WQE a Terminate fails; `head_is_atomic`: the oldest outstanding WQE is
// an Atomic (a Terminate that can only answer one says so).
ibv_wc_status terminate_to_wc_status(const wire::Terminate& t, bool head_is_atomic = false);
wire::Terminate access_to_terminate(AccessResult r, bool tagged);
wire::Terminate ddp_error_term(wire::DdpError e);         // a DDP/RDMAP header we refuse
wire::Terminate untagged_term(wire::DdpUntaggedEcode e);  // DDP untagged buffer errors
wire::Terminate rdmap_op_term(wire::RdmapEcode e);        // RDMAP remote operation errors
wire::Terminate rdmap_prot_term(wire::RdmapEcode e);      // RDMAP remote protection errors
wire::Terminate rdmap_catastrophic_term();                // a peer overrunning our IRD
wire::Terminate ddp_catastrophic_term();                  // our receive buffer failed its check
wire::Terminate llp_term(wire::LlpEcode e);               // MPA (LLP) errors

}  // namespace sv::engine
