// rsockets inside softverbs' librdmacm: a byte stream over an RC QP, on rdma-core's wire
// protocol (docs/rsockets-protocol.md, src/wire/rsocket_wire.h) in its iWARP form: each data
// transfer is an RDMA WRITE into the peer's receive ring followed by a 4-byte SEND carrying
// the message word, so a softverbs rsocket speaks to an rdma-core rsocket on Linux siw.
//
// Files, one concern each:
//   rsocket.cc       descriptors, connection set-up (rconnect, rlisten, raccept), options,
//                    shutdown and close;
//   rsocket_data.cc  the data path: completions, credits and SGL grants, rsend/rrecv, iomaps;
//   rpoll.cc         rpoll and rselect over rsockets and ordinary fds together;
//   rsocket_table.cc the descriptor table and the wait helpers, which the others call down
//                    into (no two files call each other).
//
// Progress is driven by the calling threads, as in rdma-core: every call polls the socket's CQ
// under the socket's lock; a thread that must wait arms the CQ and sleeps in poll() on the
// completion channel, the rdma_cm channel and the socket's own eventfd (the descriptor the
// application holds), which a thread that made progress for others writes.
#pragma once
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "wire/rsocket_wire.h"

namespace sv::rsock {

namespace rs = sv::wire::rs;

// rdma-core's defaults (rsocket.c), so tools tuned for it behave the same.
inline constexpr uint32_t kDefaultQpSize = 384;
inline constexpr uint32_t kDefaultInline = 64;
inline constexpr uint32_t kDefaultBuf = 128 * 1024;
inline constexpr uint32_t kMinQpSize = 16;
inline constexpr uint32_t kMaxQpSize = 0xFFFE;
inline constexpr uint32_t kCtrlWrs = 4;        // RS_QP_CTRL_SIZE: send WRs kept for control
inline constexpr uint32_t kExtraRecvs = 8;     // receives beyond the credits we grant (§2.2 gap)
inline constexpr uint32_t kSndLowat = 2048;    // RS_SNDLOWAT
inline constexpr uint32_t kMaxXfer = 65536;    // RS_MAX_TRANSFER
inline constexpr uint32_t kMinXfer = 2048;     // RS_OLAP_START_SIZE
inline constexpr uint32_t kMaxBuf = 1u << 28;  // a DATA length must fit the 29-bit word

enum class State { init, bound, listening, connecting, connected, disconnected, error };

// A buffer this side exposed with riomap, and where its record went in the peer's table.
struct LocalIomap {
  void* buf = nullptr;
  size_t len = 0;
  uint64_t offset = 0;
  ibv_mr* mr = nullptr;
  int index = -1;     // slot in the peer's iomap table, -1 until one is free
  bool sent = false;  // the IOMAP_SGL update is posted
};

// What the peer exposed with riomap (its record in our target buffer, cached when the
// IOMAP_SGL word announcing it is polled).
struct PeerIomap {
  uint64_t offset = 0;
  rs::Sge sge;
};

struct Rs {
  int fd = -1;  // eventfd: the descriptor the application holds, and our wake-up
  int domain = AF_INET;
  std::mutex mu;
  State state = State::init;
  bool readable = false;  // the peer may still send: reads give EOF once false and drained
  bool writable = false;
  int err = 0;            // SO_ERROR
  bool nonblock = false;  // O_NONBLOCK (F_SETFL)
  int fd_flags = 0;       // FD_CLOEXEC (F_SETFD)
  int waiters = 0;        // threads asleep on this socket (rpoll, blocking calls)
  bool closed = false;    // rclose took it out of the table: sleepers leave with EBADF

  // Options; an accepted socket inherits them from its listener (rs_alloc).
  uint32_t sbuf_size = kDefaultBuf, rbuf_size = kDefaultBuf;
  uint32_t sq_size = kDefaultQpSize, rq_size = kDefaultQpSize;
  uint32_t inline_size = kDefaultInline;
  uint32_t iomap_size = 0;
  bool reuseaddr = false, keepalive = false, nodelay = false, v6only = false;

  // Connection manager: an asynchronous id on a channel of its own (non-blocking fd).
  rdma_event_channel* cm_ch = nullptr;
  rdma_cm_id* cm = nullptr;

  // Verbs resources (rs_create_ep): one CQ for both directions, every send signalled.
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<std::byte> sbuf, rbuf, tbuf, slots;
  ibv_mr *smr = nullptr, *rmr = nullptr, *tmr = nullptr, *slot_mr = nullptr;

  // Send side.
  uint32_t sbuf_head = 0, sbuf_avail = 0;
  uint32_t data_wrs = 0, ctrl_wrs = 0;  // send WRs free for data / for control
  uint16_t sseq_no = 0, sseq_comp = 0;  // DATA messages sent / the peer's credit limit
  rs::Sge target[rs::kSglEntries];      // where our next WRITEs land in the peer's rbuf
  uint32_t target_idx = 0;              // entry being filled
  uint32_t grant_idx = 1;               // entry the peer's next SGL update writes
  rs::Sge remote_sgl;                   // the peer's target-SGL array: our grants go there
  uint32_t remote_sge = 1;
  uint64_t remote_iomap_addr = 0;  // the peer's iomap table, after its SGL array
  uint32_t remote_iomap_key = 0, remote_iomap_count = 0;

  // Receive side.
  rs::RecvLedger ledger;
  std::deque<uint32_t> rmsg;  // lengths of DATA messages not yet read
  uint32_t rmsg_used = 0;     // bytes of rmsg.front() already read
  uint16_t rseq_no = 0, rseq_comp = 0;
  uint32_t recv_slots = 0;

  std::vector<LocalIomap> iomaps;
  std::vector<PeerIomap> peer_iomaps;  // our target-iomap slots (iomap_size of them)
};

// ---- rsocket_table.cc: the descriptor table and the wait helpers ---------------------------
// A socket lives while the table or a call holds a reference: an rclose while another thread
// is inside a call on the same descriptor (asleep in rrecv, raccept, rpoll) frees nothing
// under it, as close(2) frees no file another thread is using. The last reference tears the
// socket down (make_socket's deleter, rsocket.cc).
using RsRef = std::shared_ptr<Rs>;
inline constexpr int kMaxFds = 1 << 16;  // descriptors beyond are refused (EMFILE)
RsRef get(int fd);
void publish(const RsRef& s);  // get(s->fd) finds it from now on
bool unpublish(const Rs* s);   // ... no more; false if it was not (or no longer) there
int fail(int e);               // errno = e; -1

// rsocket_data.cc
bool create_ep(Rs* s);  // CQ, QP, buffers, receives posted (before connect/accept)
void destroy_ep(Rs* s);
void save_conn_data(Rs* s, const rs::ConnData& peer);
rs::ConnData local_conn_data(const Rs* s);
// rdma_cm events, then the CQ; wakes other waiters on progress. `armed`: the caller armed the
// CQ and sleeps next unless this makes it ready. The completion events stay queued then: an
// event raised after the arm is the sleep's only wake-up for completions that follow it (the
// arm is spent), so taking it here could leave them in the CQ while the caller sleeps
// (rdma-core's rs_process_cq reads events only once it has armed and found nothing).
void pump_locked(Rs* s, bool armed = false);
// rs_can_send, for a send with `left` bytes still to go.
bool can_send_locked(const Rs* s, size_t left = SIZE_MAX);
bool post_ctrl_locked(Rs* s, rs::Ctrl c);
bool sends_idle_locked(const Rs* s);
void fail_locked(Rs* s, int err);

// Sleep until `ready` holds (or nonblocking: -1/EAGAIN). Arms the CQ and polls again before
// sleeping, so no completion is missed. 0, or -1 with errno. Below, with its helpers
// (rsocket_table.cc).
template <typename Pred>
int wait_locked(Rs* s, std::unique_lock<std::mutex>& lk, Pred ready, bool nonblock);
// A connect's queued rdma_cm events, without blocking (rpoll, pump_locked): the active
// side's state machine (rs_do_connect), in rsocket_data.cc with the data path it sets up.
void connect_poll_locked(Rs* s);
// rdma_connect/rdma_accept's parameters, with our connection data as private data.
rdma_conn_param conn_param(const std::byte* pdata);
// A sleeper's fds for this socket (its eventfd, completion channel, rdma_cm channel), counted
// in waiters; leave_sleep_locked uncounts it and clears the wake-up after the last one.
inline constexpr int kSleepFds = 3;
nfds_t enter_sleep_locked(Rs* s, pollfd out[kSleepFds]);
void leave_sleep_locked(Rs* s);
int sleep_once(Rs* s, std::unique_lock<std::mutex>& lk, int timeout_ms);
void arm_locked(Rs* s);
void signal_waiters(Rs* s);

template <typename Pred>
int wait_locked(Rs* s, std::unique_lock<std::mutex>& lk, Pred ready, bool nonblock) {
  for (;;) {
    pump_locked(s);
    if (ready()) return 0;
    if (nonblock) {
      errno = EAGAIN;
      return -1;
    }
    arm_locked(s);
    pump_locked(s, true);
    if (ready()) return 0;
    if (sleep_once(s, lk, -1) < 0) return -1;
  }
}

}  // namespace sv::rsock
