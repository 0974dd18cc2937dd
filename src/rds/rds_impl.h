// softverbs RDS internals.
//
// Theory of operation
// -------------------
// A process is one RDS "host stack". Its sockets share one connection per peer process,
// each an RC QP set up with rdma_cm (so the same code runs on real RDMA NICs through the
// system rdma-core). Which process owns a destination (ip, port) is found in a host
// registry (bind.cc): each bound (ip, port) is an abstract unix socket name, which the
// kernel lets only one socket hold, and whose holder answers lookups with its address.
//
// Reliability follows net/rds over IB, with the fixes rds-api.md §7 asks for: every
// message gets a per-connection sequence number, stays on the retransmit list until the
// peer's RDS ack (never TCP's), goes back on the send queue when the connection bounces,
// and the receiver drops anything whose sequence it has already seen (dedupe purely by
// sequence). RDMA ops run on a QP of their own per connection (Conn::chan_id). The message
// that reports a Write goes at once, marked fenced: a fence behind the Write on that QP
// tells the receiver when the data has landed, and it holds the message until then (RC
// order, not a wait for the Write's completion at the sender). Reads and atomics keep the
// older rule: the message is sent once its op completed. Either way, retransmitting the
// message never redoes the op.
//
// Locking: the stack lock (g.mu) guards connections, messages and the send side of every
// socket, as net/rds/cong.c argues for its map lock ("Yes, a global lock"); verbs calls are
// made under it. A socket's receive side is under its own rs_recv_lock (struct Sock), taken
// after g.mu, so receives and polls never wait for it. The engine thread (ib_transport.cc)
// waits on the CQ completion channel, the rdma_cm event channel and a timer, and takes g.mu
// to process them. Completions are taken on the device's progress thread (a completion
// handler); one that finds g.mu taken leaves them to its holder, who takes them in before
// letting go (StackMutex, below).
//
// Descriptors: an RDS socket is the application end of an AF_UNIX socketpair. We keep
// one byte queued toward it while it is readable (POLLIN) and fill its send direction
// while it has no send space (no POLLOUT), so the kernel's poll/epoll/select work on it
// as they are. The LD_PRELOAD shim still interposes poll, ppoll, select, pselect and
// epoll_ctl: its poll() answers from the stack's state (and busy-polls on request), which
// spares the byte's send and receive per message. The byte is then kept in step only
// while the kernel may be asked (lazy tokens, sock_update_poll).
#pragma once
#include <infiniband/verbs.h>
#include <linux/rds.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "rds/counters.h"
#include "wire/rds_hdr.h"
#include "wire/rds_rx.h"

namespace sv::rds {

inline constexpr size_t kMaxMsgSize = 1u << 20;  // RDS_MAX_MSG_SIZE
// IBV_ACCESS_LOCAL_WRITE as an int: verbs.h's ibv_reg_mr macro tests its flags against an
// enum of another type, which clang warns is deprecated (-Wdeprecated-enum-enum-conversion).
inline constexpr int kLocalWrite = IBV_ACCESS_LOCAL_WRITE;
inline constexpr size_t kFragSize = 64 * 1024;  // payload bytes per SEND
inline constexpr size_t kBufSize = kFragSize + wire::kRdsHeaderLen;
inline constexpr int kRecvBufs = 64;  // per connection (without the shared pool)
// The shared receive pool (SRQ mode, ib_transport.cc): every data QP of the process takes its
// receives from one SRQ. It starts with kSrqInitial buffers and grows by a registration of
// kSrqChunk each time fewer than kSrqLowWater are left (the SRQ's limit event), up to
// kSrqMax (64 MiB of address space, resident only where messages were written).
inline constexpr int kSrqChunk = 16;
inline constexpr int kSrqInitial = 64;
inline constexpr int kSrqLowWater = 8;
inline constexpr int kSrqMax = 1024;
inline constexpr int kSendSlots = 64;    // per connection
inline constexpr int kCqInitial = 1024;  // the CQ's first size; it grows with the QPs
inline constexpr int kCqFixed = 16384;   // its size where the provider cannot resize
inline constexpr int kRdmaDepth = 16;    // RDMA ops in flight per connection (its ORD)
// Receives for fences on a peer's RDMA channel: one per op it may have in flight, twice over,
// so its fences never wait for us to re-post one.
inline constexpr int kFenceRecvs = 2 * kRdmaDepth;
// What a receiver holds for fences not yet arrived (recv.cc). Held messages are not acked, so
// an honest sender's buffers stop it long before this; a peer past it ignores acks: the
// connection drops as for any protocol error, and what it made us hold goes.
inline constexpr size_t kMaxHeldBytes = 64u << 20;
inline constexpr size_t kHeldEntryCost = 4096;  // a Held entry: a page, so at most 16 Ki of them
// Base lookups (rdma.cc) a peer may have unanswered while our send slots are taken: an
// honest one has a single question out at a time.
inline constexpr size_t kMaxMrAnswersOwed = 16;
inline constexpr uint32_t kDefaultSndBuf = 256 * 1024;
inline constexpr uint32_t kDefaultRcvBuf = 256 * 1024;
// The smallest SO_SNDBUF/SO_RCVBUF RDS ends up with: half of the kernel's SOCK_MIN_SNDBUF
// (2 * TCP_SKB_MIN_TRUESIZE = 4608 on x86-64) and SOCK_MIN_RCVBUF (2304).
inline constexpr uint32_t kMinSndBuf = 2304;
inline constexpr uint32_t kMinRcvBuf = 1152;
inline constexpr int kAckEvery = 8;       // max_unacked_packets
inline constexpr int kAckDelayUs = 1000;  // a lone ack waits this long for a reply to ride
inline constexpr int kSignalEvery = 16;   // max_unsignaled_wrs (net/rds ib_send.c)
inline constexpr size_t kCongMapBytes = wire::kRdsCongMapBytes;  // RDS_CONG_MAP_BYTES
inline constexpr size_t kMaxZcopySge = 15;  // payload SGEs per SEND (the data QP has 16)
// A connection with nothing queued, unacked or in flight for this long is closed, freeing
// its send slots (4 MiB of address space; and its receive ring, 4 MiB more, without the
// shared pool); the next message reconnects it, sequence state intact.
// SOFTVERBS_RDS_IDLE_MS overrides it (0: never). Linux RDS never closes idle connections,
// but there one set of buffers serves a whole host, not every peer process.
inline constexpr int kIdleCloseMs = 30000;

struct Sock;
struct Conn;

struct RdmaOp {
  bool write = false;  // RDS_RDMA_READWRITE: we WRITE the peer's memory
  uint32_t rkey = 0;
  uint64_t remote_addr = 0;
  uint64_t bytes = 0;
  std::vector<ibv_sge> local;
  std::vector<ibv_mr*> local_mrs;
  uint64_t flags = 0;
  uint64_t user_token = 0;
  bool notify = false;
  bool atomic = false;
  int atomic_kind = 0;  // RDS_CMSG_ATOMIC_*
  uint64_t compare = 0, swap_add = 0;
  uint64_t compare_mask = ~0ull, swap_mask = ~0ull, nocarry_mask = 0;
  bool masked = false;  // non-trivial masks: run as a compare-and-swap loop (rdma.cc)
  uint64_t guess = 0;   // ... the old value it is trying next
  uint64_t atomic_local = 0;
  ibv_mr* atomic_mr = nullptr;
  bool posted = false;  // on the RDMA channel, completion not seen yet
  int losses = 0;       // channels lost under it with no culprit named (rdma.cc)
  int status = -1;      // RDS_RDMA_* once known
  bool notified = false;
  // Fenced (rdma.cc): a Write whose message did not wait for it. A fence behind the Write on
  // the RDMA channel tells the peer when the message may be delivered; the op is settled
  // once that fence, or the verdict on a Write that failed, is known to have arrived.
  bool fenced = false;
  bool verdict_due = false;  // it failed, and the peer has not yet been told to drop its message
  // Toward a peer whose regions are by virtual address (Conn::peer_va_mrs): the region's
  // base is added to remote_addr (based), or the peer has no such region (no_region).
  bool based = false;
  bool no_region = false;
};

struct Message {
  wire::RdsHeader h;
  std::vector<std::byte> payload;
  Sock* sock = nullptr;  // sending socket (null for acks/pongs)
  in_addr src{};         // the sending socket's bound address: it picks the connection
  sockaddr_in dest{};
  // RDMA_ARGS and/or one atomic: they run in that order, before the message is sent.
  std::unique_ptr<RdmaOp> op, atomic_op;
  bool queued_to_sock = true;  // counted in sock->snd_bytes
  uint32_t frags_posted = 0;
  // MSG_ZEROCOPY: the payload stays in the sender's buffers, registered (one MR per iovec)
  // and gathered straight into each SEND; the cookie completes when the message is released
  // (acked, cancelled or dropped), as the kernel's zcopy notifier fires when the last
  // reference goes.
  bool zcopy = false;
  uint32_t zcookie = 0;
  std::vector<ibv_sge> zsge;  // the payload's regions, in order
  std::vector<ibv_mr*> zmrs;
  uint64_t last_post = 0;  // Conn::posts when its last SEND was posted
};

// Receive path trace points (net/rds i_rx_lat_trace): header seen, delivery started,
// queued to the socket, handed to recvmsg. CLOCK_MONOTONIC ns.
enum RxTrace { kRxHdr = 0, kRxStart, kRxEnd, kRxCmsg, kRxPoints };

// A message that arrived before the fence of the Write it reports (recv.cc), or behind one
// that did: delivered in sequence order once the fences have come.
struct Held {
  wire::RdsHeader h;
  std::vector<std::byte> data;
  uint64_t hdr_ns = 0;
  bool failed = false;  // its Write failed (a failure verdict came): dropped, never delivered
};

struct Incoming {
  sockaddr_in from{};
  std::vector<std::byte> data;
  std::optional<uint64_t> rdma_dest;
  timespec rx_tstamp{};  // CLOCK_REALTIME when queued, if the socket asked (SO_TIMESTAMP)
  uint64_t lat[kRxPoints] = {};
};

uint64_t mono_ns();

// Locking (net/rds's rs_recv_lock): the receive side, the poll tokens and whatever recvmsg
// and poll() read are under rs_recv_lock, so a receive or a poll never waits for the stack
// lock (Global::mu), which the send path and the completions hold. The rest is under the
// stack lock. Fields both sides read are written holding both (stack lock first) and read
// under either. Lock order: Global::mu, then rs_recv_lock; nothing that takes the stack lock
// runs under rs_recv_lock.
struct Sock {
  std::mutex rs_recv_lock;
  // recvmsg, and a sendmsg waiting for send space or a congestion update, sleep here
  std::condition_variable rs_recv_cv;
  // Written under both locks: the descriptors (close), and rcvtstamp, tstamp_new, rx_traces,
  // rx_trace_pos and zerocopy below. The addresses, recverr and cong_monitor: the stack lock.
  int app_fd = -1;    // handed to the application
  int lib_fd = -1;    // our end of the socketpair
  uint64_t inum = 0;  // RDS_INFO_SOCKETS: the inode of app_fd, unique on the host
  bool bound = false;
  sockaddr_in bound_addr{};
  bool v6 = false;  // bound to a real IPv6 address (bound6)
  sockaddr_in6 bound6{};
  int lock_fd = -1;  // registry: the port's listening socket
  bool connected = false;
  sockaddr_in conn_addr{};
  // Atomics: sock_update_poll reads them for POLLOUT under rs_recv_lock, the send path
  // changes snd_bytes under the stack lock (and then updates the poll state).
  std::atomic<uint32_t> sndbuf = kDefaultSndBuf, rcvbuf = kDefaultRcvBuf;
  std::atomic<uint64_t> snd_bytes = 0;
  bool recverr = false;
  bool rcvtstamp = false;   // SO_TIMESTAMP: a receive timestamp on every datagram
  bool tstamp_new = false;  // ... as SO_TIMESTAMP_NEW (64-bit) rather than a timeval
  uint8_t rx_traces = 0;    // SO_RDS_MSG_RXPATH_LATENCY
  uint8_t rx_trace_pos[RDS_MSG_RX_DGRAM_TRACE_MAX] = {};
  bool zerocopy = false;  // SO_ZEROCOPY
  bool cong_monitor = false;
  uint64_t cong_mask = 0;           // stack lock
  std::map<uint32_t, ibv_mr*> mrs;  // rkey -> MR (RDS_GET_MR)
  std::map<uint32_t, uint64_t> mr_flags;
  // Set under both locks: the descriptor is closed (sock_of no longer finds the socket).
  std::atomic<bool> closing = false;

  // ---- rs_recv_lock ----
  std::deque<Incoming> rq;
  uint64_t rcv_bytes = 0;
  std::deque<rds_rdma_notify> notify;
  std::deque<rds_zcopy_cookies> zcookies;  // completed MSG_ZEROCOPY sends, 8 per entry
  uint64_t cong_notify = 0;
  // rcv_bytes is past rcvbuf (until it falls below rcvbuf/2): the port is to be congested.
  // The map's bit follows it under the stack lock (cong_sync_port).
  bool congested = false;
  bool token = false;    // a byte is queued toward app_fd (POLLIN)
  bool blocked = false;  // app_fd's send direction is filled (no POLLOUT)
  // Lazy tokens (sock_update_poll): with the shim's poll() answering from memory, the byte
  // is only kept in step while the kernel may be asked: a thread sleeps in the kernel on
  // app_fd (`sleepers`, the shim's poll), or app_fd went to a readiness call the stack
  // cannot answer for (`exposed`: epoll_ctl, select, ppoll; for good).
  int sleepers = 0;
  bool exposed = false;
  // Without RDS_CONG_MONITOR, Linux raises POLLIN once per congestion map update
  // (rds_cong_generation) so that ENOBUFS'd senders retry. We cannot see poll() itself, so a
  // socket that got ENOBUFS gets POLLIN when an update frees some port, and keeps it until
  // its next sendmsg or recvmsg (updates that only congest ports would be spurious wakeups).
  bool cong_poll = false;
  bool seen_congestion = false;  // the stack lock
};

enum class ConnState : uint8_t { down, connecting, up };

// A connection's registered buffers: anonymous pages, so that a page costs memory only once
// a message touched it, and all of it goes back to the system when the connection closes
// (a freed std::vector of this size stays in the allocator's arena).
class PageBuf {
 public:
  PageBuf() = default;
  PageBuf(const PageBuf&) = delete;
  PageBuf& operator=(const PageBuf&) = delete;
  ~PageBuf() { release(); }
  bool allocate(size_t n);  // ib_transport.cc
  void release();
  bool empty() const { return !p_; }
  std::byte* data() { return p_; }
  size_t size() const { return n_; }
  std::byte& operator[](size_t i) { return p_[i]; }

 private:
  std::byte* p_ = nullptr;
  size_t n_ = 0;
};

// A connection joins (local address, peer address) of this process and one peer process,
// as net/rds keys rds_connection by (laddr, faddr): the RDS header carries ports only, so
// the addresses a message was sent from and to are the connection's (recvmsg's source
// address, the receiver's socket lookup).
struct ConnKey {
  uint64_t gen;    // the peer process' generation number
  uint32_t laddr;  // network order
  uint32_t faddr;
  auto operator<=>(const ConnKey&) const = default;
};

struct Conn {
  // Peer process: the address its sockets are bound to and its rdma_cm port; our address.
  sockaddr_in peer{};
  sockaddr_in local{};
  uint64_t peer_gen = 0;
  ConnState state = ConnState::down;
  rdma_cm_id* id = nullptr;
  uint8_t inc = 0;       // data QP incarnation (in its wr ids)
  uint8_t chan_inc = 0;  // RDMA channel QP incarnation
  bool active = false;
  uint64_t next_tx_seq = 1;
  int unacked = 0;
  bool ack_needed = false;  // the peer has sequences we have not acked
  bool ack_now = false;     // ... and must hear about them without waiting for a reply
  std::chrono::steady_clock::time_point ack_due{};
  // Data QP sends in post order: most are unsignaled, and one signaled completion retires
  // every send posted before it (RC completes in order), freeing their slots.
  std::deque<uint64_t> posted;
  // Sends posted on the data QP so far: those not in `posted` have retired, so a send is
  // retired once posts - posted.size() reaches the count posts had at its post
  // (Message::last_post).
  uint64_t posts = 0;
  int since_signal = 0;
  std::deque<Message*> send_q;
  std::deque<Message*> retrans;
  // Acked (or dropped unsent) messages whose fenced Write is not settled yet: they keep the
  // op's buffers registered until its fence, or the verdict on its failure, has arrived.
  std::deque<Message*> op_wait;
  // Cancelled zero-copy messages whose SENDs the device may still be reading from the
  // sender's buffers: their regions stay registered, and their cookies wait, until those
  // SENDs retire (on_send_complete) or the QP is gone (conn_reset_queues), as net/rds's
  // zerocopy notifier fires only when the transport drops its reference (rds_message_put).
  std::deque<Message*> zc_retiring;
  // receive buffers (none in SRQ mode) and send slots, registered once per connection
  PageBuf rbuf, sbuf;
  ibv_mr* rmr = nullptr;
  ibv_mr* smr = nullptr;
  std::vector<int> free_slots;
  // RDMA channel: RDMA_ARGS and atomic ops run on a QP of their own. A bad cookie makes
  // the responder Terminate the stream it arrived on (RFC 5040 §7.1) and the QP go to
  // ERROR; on a separate QP that costs only the op (REMOTE_ERROR), never this connection,
  // which the process' other sockets share. A message with a Read or an atomic waits in
  // send_q until its op has completed, so it is only sent once the op is done, and never if
  // it failed; one with a Write alone is fenced (rdma.cc): it goes once the Write is posted,
  // and the receiver holds it until the fence behind the Write, or drops it on a verdict.
  rdma_cm_id* chan_id = nullptr;
  ConnState chan_state = ConnState::down;
  int chan_backoff_ms = 0;
  bool chan_reconnect_pending = false;  // a reconnect timer is set (schedule_reconnect)
  uint64_t chan_connects = 0;
  bool chan_culprit = false;  // this QP failed on an op's own error: the ops behind it never ran
  // Its Writes complete once the peer placed them (softverbs peers: IB's completion rule),
  // so a Write's own completion is the op's status and no confirming Read follows it.
  bool chan_placed = false;
  // The peer's device has no atomics (its private data said so): its atomics are refused at
  // sendmsg, or fail alone at post, instead of costing the RDMA channel (send.cc, rdma.cc).
  bool peer_no_atomics = false;
  // The peer registers its regions by virtual address (wire::kRdsPrivVaMrs): each op on its
  // cookies learns the region's base first (rdma.cc mr_base_ask). One question at a time, on
  // the data connection; asked again if that connection went down before the answer.
  bool peer_va_mrs = false;
  std::optional<uint32_t> mr_ask;  // the rkey asked about (or still to ask about)
  bool mr_ask_sent = false;        // ... and the question went out on this data connection
  // Answers we owe the peer that found no free send slot yet (a legitimate peer has one
  // question out at a time: more than kMaxMrAnswersOwed drops the connection).
  std::deque<wire::RdsMrBase> mr_answers;
  bool chan_tearing_down = false;
  // A sendmsg is posting an op on the RDMA channel with the stack lock let go (as in_xmit for
  // the data QP). The op is recorded as posted first (rdma_owner, chan_inflight, op->posted):
  // its completion may be taken in by another thread before the poster has the lock back.
  // Meanwhile nothing else posts on the channel (rdma_post_pending leaves chan_again), and
  // rdma_chan_down leaves its reason in chan_down_owed, for the poster to act on.
  bool chan_in_xmit = false;
  bool chan_again = false;
  const char* chan_down_owed = nullptr;
  int chan_inflight = 0;
  std::deque<Message*> rdma_q;              // messages whose op is still to be posted
  std::map<uint64_t, Message*> rdma_owner;  // wr_id -> message (RDMA channel)
  uint32_t next_rdma_wr = 0;
  // Receiving side of the peer's fences (recv.cc): the last fence's sequence (kept across
  // channels and reconnects; a new channel's accept tells the peer, which settles the ops it
  // covers instead of redoing them), failure verdicts for messages not arrived yet, and what
  // arrived before its fence.
  uint64_t fence_seq = 0;
  std::set<uint64_t> fence_failed;
  std::deque<Held> held;
  size_t held_bytes = 0;
  // reassembly and the sequences seen (rx.next_seq is kept across reconnects so
  // retransmits are recognised)
  wire::RdsRx rx;
  uint64_t cur_hdr_ns = 0;  // when the message's first fragment arrived (RXPATH_LATENCY)
  int backoff_ms = 0;
  bool reconnect_pending = false;  // a reconnect timer is set: kicks wait for it
  uint64_t reconnects = 0;
  bool tearing_down = false;
  bool rx_refused = false;  // a protocol error: this QP's receives are taken no more (take_frag)
  std::chrono::steady_clock::time_point last_active{};  // last completion or connect
  // The last_active its send slots were given back for (trim_when_quiet), once per quiet spell.
  std::chrono::steady_clock::time_point slots_trimmed_for{};
  bool signal_next = false;  // the next send is signaled (trim_when_quiet's ack)
  // A sendmsg is posting on the data QP with the stack lock let go (xmit, net/rds's
  // RDS_IN_XMIT: one task feeds a connection at a time). Nothing else posts on the data QP
  // meanwhile, so `posted` stays in post order: an xmit leaves xmit_again, a header-only
  // send hdr_owed, and conn_down its reason in down_owed, for the poster to act on once it
  // has the lock back. The message being posted stays at the front of send_q until then.
  bool in_xmit = false;
  bool xmit_again = false;
  bool hdr_owed = false;
  const char* down_owed = nullptr;
  // The highest ack on_ack took: a message the peer acked while its poster had the lock let
  // go was not on `retrans` yet, and is released when the poster sees it.
  uint64_t acked_seq = 0;
  std::vector<uint8_t> fcong;  // the peer's congestion map (RDS_CONG_MAP_BYTES)
  bool map_queued = false;     // send our map when the connection allows
};

// A peer's RDMA channel, accepted (ib_transport.cc): we respond to its Writes, Reads and
// atomics, and take its fences for the connection whose messages they release.
struct FenceChan {
  rdma_cm_id* id = nullptr;
  Conn* c = nullptr;
  uint32_t key = 0;
  std::byte buf[kFenceRecvs][wire::kRdsFenceLen] = {};
  ibv_mr* mr = nullptr;
};

// The sequence we ack (net/rds: the last one received in order), never past a message held
// for its fence: until the fence comes its sender keeps it, so the sender's send buffers,
// not our memory, bound what a slow fence holds up.
inline uint64_t rx_ack_seq(const Conn* c) {
  return c->held.empty() ? c->rx.next_seq - 1 : c->held.front().h.sequence - 1;
}

// The stack lock, with a socket backlog as net/core/sock.c has one: softirq input for a
// socket its user owns waits on sk_backlog, and release_sock runs it before letting go. Here,
// the completion handler on the device's progress thread must not wait for the lock, and
// leaving its work to the engine thread costs a wake-up and a second wait for the same lock.
// So a handler that finds the lock taken marks the backlog (defer) and the holder takes the
// completions in as it unlocks, then looks again once it has let go, for a mark made
// meanwhile. Nobody sleeps holding the lock: blocked socket calls let it go and sleep on their
// socket (rs_recv_cv), so the handler never has to give its work up to the engine thread.
// Lockable: lock_guard and unique_lock take it as a std::mutex.
class StackMutex {
 public:
  void lock() { mu_.lock(); }
  bool try_lock() { return mu_.try_lock(); }
  void unlock();  // ib_transport.cc; then what dereg_after_unlock and srq reposts queued
  // Lets go without running the backlog, which goes to the engine thread (a fork handler).
  void unlock_to_engine();
  // Around a post made with the lock let go (xmit from sendmsg): no backlog run as it lets
  // go, which would take completions in ahead of the post; once it has the lock back it runs
  // what a handler marked before or meanwhile (ib_transport.cc), while its connection is still
  // its own (in_xmit), so the other connections' deliveries do not wait for its whole send.
  void release_for_post();  // ib_transport.cc; the SRQ reposts queued go out too
  void reacquire_after_post();
  // Called by a completion handler that found the lock taken, before it tries once more:
  // the holder takes the completions in.
  void defer();
  // The handler holds the lock: what a deferral asked for is done by it.
  void backlog_taken() { backlog_.store(false, std::memory_order_relaxed); }
  // A handler has left completions to the holder (a busy poller that found nothing itself
  // takes the lock for them: its unlock runs the backlog).
  bool backlog_marked() const { return backlog_.load(std::memory_order_seq_cst); }

 private:
  void unlock_and_run_backlog();
  std::mutex mu_;
  std::atomic<bool> backlog_{false};
};

struct Global {
  StackMutex mu;
  // app_fd -> socket: changed under mu and socks_mu, iterated under mu; sock_of (sock.cc)
  // looks a descriptor up without mu.
  std::map<int, Sock*> socks;
  std::mutex socks_mu;
  // Open IPv4-bound sockets by (address, port) (bound_key): the receive path's lookup.
  std::unordered_map<uint64_t, Sock*> bound_v4;
  std::map<ConnKey, Conn*> conns;
  // verbs objects
  ibv_context* verbs = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* cq_ch = nullptr;
  ibv_cq* cq = nullptr;
  // Slots of cq promised to the QPs on it (create_qp): the CQ grows with them.
  std::mutex cq_size_mu;
  uint32_t cq_reserved = 0;
  std::map<ibv_qp*, uint32_t> cq_share;
  bool cq_resizable = false;
  int cq_max = kCqFixed;          // the device's max_cqe
  std::deque<ibv_wc> wc_backlog;  // polled, not yet handled (drain_cq_locked)
  // A busy poller polls cq before it takes mu (svrds_busy_poll): a poll of an empty CQ runs
  // the device's receive path on the caller's thread (a 1 MiB Write placed, hundreds of us),
  // which must not hold up every sender and completion of the stack. poll_mu serializes
  // every poll of cq with putting what it took in `polled`, so completions are still handled
  // in CQ order: a drain under mu takes `polled` before it polls again. Taken after mu;
  // the progress thread only tries it, before mu (on_cq_ready), and then holds it.
  std::mutex poll_mu;
  std::deque<ibv_wc> polled;              // under poll_mu
  std::atomic<ibv_cq*> poll_cq{nullptr};  // cq, published once the stack is up
  rdma_event_channel* cm_ch = nullptr;
  rdma_cm_id* listen_id = nullptr;
  uint16_t cm_port = 0;  // our rdma_cm listen port (host byte order)
  uint32_t mr_max = 0;   // the device's max_mr (RDS_INFO_IB_CONNECTIONS)
  bool atomics = true;   // the device's atomic_cap is not IBV_ATOMIC_NONE
  // Our regions are registered by virtual address: the device ignores ibv_reg_mr_iova2's
  // iova (SOFTVERBS_RDS_MR_VA, rdma.cc), and peers ask us where each one starts.
  bool mr_by_va = false;
  // Where a Write's confirming Read (rdma.cc) puts its byte: registered once, written by every
  // connection's confirming Reads and never read.
  uint64_t* confirm_sink = nullptr;
  ibv_mr* confirm_mr = nullptr;
  uint64_t gen = 0;  // random per process: a restarted peer is a new peer
  int wake_fd = -1;
  // When the engine thread's poll() times out (zero while it is awake): a completion handler
  // that makes an ack due before then wakes it (ib_transport.cc).
  std::chrono::steady_clock::time_point engine_wakes_at{};
  // softverbs_cq_wait_fd of cq, set once the stack is up (-1: none, another provider, or
  // SOFTVERBS_RDS_WAIT_RX=0): a thread blocking in poll() waits on it too (svrds_block_prepare).
  std::atomic<int> cq_wait_fd{-1};
  std::atomic<bool> rx_taker{false};  // a blocked recvmsg waits on cq_wait_fd (recv.cc)
  // Raised (under mu) when a peer's congestion map frees a port, or a map with a bit set is
  // forgotten, then every socket is woken: what a sender blocked by congestion waits for.
  std::atomic<uint64_t> cong_gen{0};
  std::atomic<bool> heap_trim_due{false};  // the engine thread runs malloc_trim (release_buffers)
  bool started = false;
  // SOFTVERBS_RDS_TEST_POST_WINDOW_MS, read at start: xmit's posts with the lock let go last
  // this long (tests).
  uint32_t test_post_window_ms = 0;
  // Our congestion map: one bit per port, little-endian bit order (net/rds cong.c).
  std::vector<uint8_t> lcong = std::vector<uint8_t>(kCongMapBytes, 0);
  Counters counters{};  // rds-info -c (counters.h)
  // Our counters are in the retired sum: publish no more (info.cc). Written under mu and
  // publish_mu, read under either.
  bool info_retired = false;
  // Serializes writing our snapshot (info_write, outside mu) with retiring it
  // (info_unpublish): a snapshot built before the retirement and written after it would
  // count our counters twice once folded. Taken after mu, never before it.
  std::mutex publish_mu;
  // ib_transport.cc: connection ids (in wr ids), reconnect timers (connection, channel),
  // RDMA channels: ours (active, by id) and the peers' (passive: we only respond on them).
  std::map<uint32_t, Conn*> conn_by_id;
  std::map<Conn*, uint32_t> id_of;
  uint32_t next_conn_id = 1;
  std::multimap<std::chrono::steady_clock::time_point, std::pair<Conn*, uint16_t>> timers;
  std::map<rdma_cm_id*, Conn*> chan_conn;
  std::map<rdma_cm_id*, std::unique_ptr<FenceChan>> passive_rids;
  std::map<uint32_t, FenceChan*> fence_chans;  // by key (its receives' wr ids)
  uint32_t next_fence_key = 1;
  std::map<uint32_t, int> ping_locks;  // ip -> our registry socket of (ip, 0): pings come here
  // SRQ mode (ib_transport.cc): the shared receive queue, its buffers, and which connection
  // each live data QP belongs to (a receive completion names its QP, not its connection).
  struct SrqChunk {
    PageBuf buf;
    ibv_mr* mr = nullptr;
  };
  ibv_srq* srq = nullptr;
  int srq_cap = 0;  // the SRQ's max_wr: the pool never grows past it
  std::vector<std::unique_ptr<SrqChunk>> srq_chunks;
  std::map<uint32_t, Conn*> data_qps;  // qp_num -> connection
};

Global& g();

// Global::bound_v4's key: an address and port, both in network order.
inline uint64_t bound_key(in_addr a, uint16_t port_be) {
  return (static_cast<uint64_t>(a.s_addr) << 16) | port_be;
}

// API edge: set errno and return -1, as the socket calls do.
inline int fail(int e) {
  errno = e;
  return -1;
}

// Posts made under the stack lock (sendmsg, close, cancel, the engine thread, a backlog run)
// made quiet with softverbs_cq_quiet: what completes at once (a Send TCP took) raises no CQ
// event, which would wake the engine thread only for it to wait for the lock we hold; the
// destructor takes those completions in instead, the lock held. It stays on while a blocked
// sendmsg sleeps with the lock let go (send.cc), which posts nothing meanwhile. Does nothing
// on another verbs provider.
class QuietPosts {
 public:
  QuietPosts();
  ~QuietPosts();
  QuietPosts(const QuietPosts&) = delete;
  QuietPosts& operator=(const QuietPosts&) = delete;

 private:
  bool on_ = false;
};

// af_rds.cc
// ---- sock.cc: the socket table and poll tokens -------------------------------------------
// Which descriptors are RDS sockets, readable without the global lock: the LD_PRELOAD shim
// asks on every socket call, including calls the library itself makes while holding g.mu.
// 1: ours; kInherited: inherited across fork() (sock_fork_release).
inline constexpr int kMaxFd = 1 << 16;
inline constexpr uint8_t kInherited = 2;
extern std::atomic<uint8_t> g_is_rds[kMaxFd];
// Set once, by the LD_PRELOAD shim when its poll() is the process' (svrds_shim_attach).
extern std::atomic<bool> g_lazy_tokens;
// Our own I/O on the socketpair, straight to the kernel (under the shim, send/recv on app_fd
// would be taken for RDS calls).
ssize_t raw_send(int fd, const void* b, size_t n, int flags);
ssize_t raw_recv(int fd, void* b, size_t n, int flags);
int raw_close(int fd);
int raw_poll(pollfd* p, nfds_t n, int timeout_ms);  // never the shim's poll()
// The open socket behind fd, or null; takes no lock for fd < kMaxFd. The table changes under
// the stack lock (socket, close).
Sock* sock_of(int fd);
// sock_of, its rs_recv_lock taken (into lk): the socket found is still fd's once locked.
Sock* sock_of_recv_locked(int fd, std::unique_lock<std::mutex>& lk);
void sock_table_add(Sock* s);
void sock_table_remove(int fd);
// errno for a descriptor sock_of does not know: EBADFD if it is an RDS socket inherited
// across fork() (it belongs to the parent's stack and only close() works on it), else EBADF.
int no_sock(int fd);
void sock_fork_release(Sock* s);  // in a forked child: let go of the parent's socket
// Port 0 of an address answers pings (rds-ping). Whoever is bound there may take it; a
// sender finds a holder, or failing that any process bound on the address (bind.cc).
void ping_claim(in_addr ip);
// POLLIN/POLLOUT state of app_fd. The _locked form: rs_recv_lock is held.
void sock_update_poll(Sock* s);
void sock_update_poll_locked(Sock* s);
// Data, notifications or congestion updates are queued: what poll() reports as POLLIN
// (rs_recv_lock held).
bool sock_readable(const Sock* s);
void sock_wake(Sock* s);  // senders and receivers re-check

// bind.cc: host registry of bound (ip, port) -> owning process' rdma_cm port. The fd
// claim returns is the port's listening socket (abstract unix namespace).
int registry_claim(const sockaddr_in& a, uint16_t cm_port, uint64_t gen);  // fd or -errno
int registry_claim6(const sockaddr_in6& a, uint16_t cm_port, uint64_t gen);
void registry_release(int lock_fd, const sockaddr_in& a);
// Not a unicast address: ANY, broadcast, multicast (EINVAL for bind, connect and sendmsg).
inline bool bad_unicast(const sockaddr_in& a) {
  const uint32_t h = ntohl(a.sin_addr.s_addr);
  return h == INADDR_ANY || h == INADDR_BROADCAST || IN_MULTICAST(h);
}
// net/rds's v4/v6 address rules (af_rds.cc): 4 = v4-mapped (*v4 set), 6 = IPv6, or -EINVAL.
int classify_v6(const sockaddr_in6& a, sockaddr_in* v4);
// Finds the process owning (ip, port): its rdma_cm port (0 if nobody holds it) and its
// generation number, which names the process whatever address reaches it. Port 0 with no
// holder: any process with a socket bound on ip (it answers pings as the kernel would).
uint16_t registry_lookup(const sockaddr_in& a, uint64_t* gen = nullptr);
void registry_forget(uint64_t gen);  // that process is gone: drop cached answers

// ib_transport.cc
int transport_start();  // lazily: device, PD, CQ, listener, engine thread
// Every RDS QP is made and destroyed through these: they size the shared CQ (ib_transport.cc).
// create_qp: 0, or -1 with errno. destroy_qp: nothing if id has no QP.
int create_qp(rdma_cm_id* id, ibv_qp_init_attr* a);
void destroy_qp(rdma_cm_id* id);
// The connection from our address laddr to the peer process `peer_gen` at faddr (whose
// rdma_cm listener is on cm_port), created down if new.
Conn* conn_get(uint64_t peer_gen, in_addr laddr, const sockaddr_in& faddr, uint16_t cm_port);
// How xmit posts: under the stack lock throughout, or (sendmsg's own kick, the outermost
// call, holding nothing else) with it let go around each large ibv_post_send, on the data QP
// or the RDMA channel.
enum class XmitMode : uint8_t { locked, may_unlock };
// sendmsg copies a payload, and posts a SEND fragment or an RDMA op, of at least this many
// bytes with the stack lock let go: long enough that the completions and other senders
// waiting for the lock are worth letting in. Less is done with the lock held: letting go and
// taking it back, under contention a second wait for it, cost a small send more than the work
// (posts: an 8 B ping-pong beside a 1 MiB flood, median 21-110 us against 23-38 us held).
inline constexpr size_t kOffLockBytes = 16 * 1024;
// Posts one sendmsg makes with the lock let go, on each of the data QP and the RDMA channel:
// then it goes on with the lock held, as net/rds's rds_send_xmit caps a pass
// (send_batch_count) rather than feed the connection for every other sender while
// completions keep making room.
inline constexpr int kUnlockedPosts = 32;
// Posts wr on qp with the stack lock let go, *busy (the QP's in-transmit bit) set across the
// window; returns ibv_post_send's result. What a completion handler found in the window
// (StackMutex's backlog) is taken in once the lock is back, before *busy is cleared.
int post_off_lock(ibv_qp* qp, ibv_send_wr* wr, bool* busy);
// Sets a flag for a scope (an in-transmit bit, the handler's hold of poll_mu).
struct ScopedFlag {
  bool& flag;
  explicit ScopedFlag(bool& f) : flag(f) { flag = true; }
  ~ScopedFlag() { flag = false; }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;
};
void conn_kick(Conn* c, XmitMode mode = XmitMode::locked);  // xmit what can be sent
// The connection goes down (its QP and buffers go, its queues wait for the next one), logged
// with why; put off to the poster while a sendmsg posts on it with the lock let go.
void conn_down(Conn* c, const char* why);
// The peer process did not answer a connect: its messages for this host's addresses go
// where their destination port is now (send.cc).
void conn_reroute_orphans(Conn* c);
void conn_send_ack(Conn* c);
// A header-only message (sequence 0) carrying our ack and h's extensions (a base lookup's
// question or answer). False when no send slot is free or the QP is gone.
bool conn_send_header(Conn* c, wire::RdsHeader h);
void flush_acks_locked();          // send every pending (delayed) ack now
void flush_acks_at_exit_locked();  // and wait (bounded) until they have left
// A SEND on the data QP, signaled only every kSignalEvery sends or when slots run low:
// prep_data_send records it as posted (posted, posts, the signal decision) before it is, since
// another thread may take its completion in before the poster has the lock back;
// unprep_data_send undoes that for one that was not posted (the newest first).
struct PostRec {
  uint64_t wr_id;
  int since_signal;
  bool signal_next;
};
PostRec prep_data_send(Conn* c, ibv_send_wr* wr);
bool unprep_data_send(Conn* c, const PostRec& r);  // false: it was not the newest (a bug)
// Posts one recorded SEND on the data QP, undoing the record if it fails: 0, or -1.
int post_data_send(Conn* c, ibv_send_wr* wr);
uint32_t conn_id_of(Conn* c);
// Scatter/gather entries a send (false) or an RDMA Read's local side (true) may have on
// this device: min(16, what it reports).
int max_local_sge(bool read);
void rdma_chan_kick(Conn* c);  // connect the RDMA channel if it is down
// The RDMA channel goes down (its QP goes, its ops wait for the next one or fail), logged with
// why; put off to the poster while a sendmsg posts on it with the lock let go.
void rdma_chan_down(Conn* c, const char* why);
// A local region whose use is over (a zero-copy send's pages, an RDMA op's local SGEs or
// atomic result: lkeys only, which no peer can name): deregistered once the calling thread
// lets the stack lock go, not under it (net/rds drops a message's pages with rds_message_put
// outside c_lock). ibv_dereg_mr takes the key table's write lock, which waits for a placement
// in progress under its read lock (a 1 MiB Write: 100 us and more), and every RDS caller would
// wait with it. Regions a peer holds a key to (RDS_GET_MR's) still go at once: their key must
// stop working before the call that frees them returns. Caller holds the stack lock.
void dereg_after_unlock(ibv_mr* mr);

// WR ids: connection id << 40 | QP incarnation << 32 | kind << 24 | index. The incarnation
// tells a completion of the QP we destroyed from one of its successor: completions the old QP
// generated after our last drain still sit in the shared CQ, and must neither re-post its
// receive buffers (now the new QP's) nor be taken for the new QP's errors.
// kFence receives carry a FenceChan key where the others have a connection id.
// kSrqRecv receives carry neither: they belong to the pool (their idx), not a connection.
enum WrKind : uint64_t { kRecv = 1, kSend = 2, kRdma = 3, kAck = 4, kFence = 5, kSrqRecv = 6 };
inline uint64_t make_wr_id(uint32_t cid, uint8_t inc, WrKind kind, uint32_t idx) {
  return (static_cast<uint64_t>(cid) << 40) | (static_cast<uint64_t>(inc) << 32) |
         (static_cast<uint64_t>(kind) << 24) | (idx & 0xFFFFFF);
}
inline uint32_t wr_cid(uint64_t w) {
  return static_cast<uint32_t>(w >> 40);
}
inline uint8_t wr_inc(uint64_t w) {
  return static_cast<uint8_t>(w >> 32);
}
inline uint64_t wr_kind(uint64_t w) {
  return (w >> 24) & 0xFF;
}
inline uint32_t wr_idx(uint64_t w) {
  return static_cast<uint32_t>(w & 0xFFFFFF);
}

// send.cc
void conn_enqueue(Conn* c, Message* m);  // sequence m and queue it (and its ops) on c
void xmit(Conn* c, XmitMode mode = XmitMode::locked);
// The peer has everything up to `ack`. False (nothing done) if that is more than we sent.
bool on_ack(Conn* c, uint64_t ack);
void on_send_complete(Conn* c, uint64_t wr_id, ibv_wc_status st);
void conn_reset_queues(Conn* c);  // connection went down
void queue_notify(Sock* s, uint64_t token, int status);
void queue_zcookie(Sock* s, uint32_t cookie);  // a MSG_ZEROCOPY send's buffers are free
void release_message(Message* m);
// A zero-copy message taken off the retransmit queue: true if its SENDs may still be in the
// device's hands; it then waits on c->zc_retiring (its socket's accounting is done now).
bool retire_later(Conn* c, Message* m);

// rdma.cc
int map_region_locked(Sock* s, const rds_iovec& v, uint64_t flags, uint64_t* cookie);
int build_rdma_op(const rds_rdma_args& a, std::unique_ptr<RdmaOp>* out);  // 0 or -errno
int build_atomic_op(const rds_atomic_args& a, int kind, std::unique_ptr<RdmaOp>* out);
RdmaOp* pending_op(Message* m);  // the next op to run (null: all have completed)
// Its op is on the RDMA channel, or is a fenced Write not settled yet (the peer holds the
// message for its fence): either way the op's buffers are not ours to release.
bool op_in_flight(Message* m);
bool ops_failed(Message* m);
void ops_report(Message* m, int status_if_unknown);  // notify what was not yet notified
void ops_release(Message* m);                        // deregister local buffers
// Posts queued ops on the RDMA channel; in may_unlock mode, a large Write or Read with the
// stack lock let go (chan_in_xmit).
void rdma_post_pending(Conn* c, XmitMode mode = XmitMode::locked);
// Returns true when the RDMA channel must be torn down (any error on it).
bool on_rdma_complete(Conn* c, uint64_t wr_id, ibv_wc_status st);
void rdma_chan_reset_ops(Conn* c);  // RDMA channel went down: ops to repost or drop
// A new RDMA channel's accept says the peer has our fences up to `seq`: those ops are settled.
void rdma_fence_acked(Conn* c, uint64_t seq);
// An acked message whose fenced Write is not settled: it waits in op_wait (true), else false.
bool park_unsettled(Conn* c, Message* m);
// Base lookups toward and from a peer whose regions are by virtual address (Conn::peer_va_mrs,
// Global::mr_by_va). The peer asks where our region `rkey` starts: false if it has more
// answers owed than a legitimate peer can (the connection drops). Its answer to ours. Sends
// what is due (on the data connection, as header-only messages) while send slots are free.
bool mr_base_asked(Conn* c, uint32_t rkey);
void mr_base_answered(Conn* c, const wire::RdsMrBase& a);
void mr_base_flush(Conn* c);
void mr_base_lost(Conn* c);  // the data connection went down: its question with it

// info.cc: RDS_INFO_* snapshots of this process' RDS stack. Returns the record size, or
// -ENOSPC with *len set to the bytes needed (net/rds info.c protocol).
int info_get(int optname, void* buf, socklen_t* len);
// The engine thread, every ~500 ms: this process' records under the stack lock, then written to its
// snapshot file without it (file I/O, and at first a fold of stale snapshots, would hold up every
// send and completion).
std::string info_snapshot_locked();
void info_write(const std::string& blob);
void info_unpublish();

// cong.c-style congestion (cong.cc)
bool cong_port_blocked(Conn* c, uint16_t port);
// After rcv_bytes changed (rs_recv_lock held): whether the socket's port is to be congested
// changed. Then cong_sync_port, under the stack lock, sets or clears the port's bit as it is
// by then and sends the map if the bit changed.
bool cong_rcvbuf_changed(Sock* s);
void cong_sync_port(Sock* s);
void cong_send_map(Conn* c);  // queue our map on c
void cong_map_received(Conn* c, const std::byte* map, size_t len);
void cong_map_forgotten(Conn* c);  // the connection went down: its peer's map is unknown

// directory.cc: owners of (ip, port) on other hosts
inline constexpr uint16_t kRdsCmPort = 18635;  // RDS_CM_PORT, where Linux RDS/IB listens
bool is_local_ip(in_addr a);                   // this host has the address (af_rds.cc)
// is_local_ip as it was within the last kLocalIpRecheckNs (a look costs three system calls,
// too many for every message). Caller holds the stack lock.
bool is_local_ip_cached(in_addr a);
inline constexpr uint64_t kLocalIpRecheckNs = 1'000'000'000;
uint16_t directory_cached(const sockaddr_in& d, uint64_t* gen);  // 0: not known
bool directory_pending(const sockaddr_in& d);                    // messages to d wait for a lookup
void directory_defer(Message* m);                       // hold m until its destination is known
void directory_forget(uint64_t gen);                    // that process is gone: look it up again
std::vector<std::deque<Message*>*> directory_queues();  // for cancel/close
bool directory_handles(rdma_cm_event* ev);              // lookups and the directory listener
void directory_tick();                                  // engine: retries, claim the listener
int directory_wait_ms();                                // engine: when the next tick is due (-1)

// recv.cc
// One received SEND. False on a protocol error (the caller drops the connection, as net/rds
// does): no header, a bad header checksum, an ack of what we never sent, a length beyond
// RDS_MAX_MSG_SIZE, a sequence outside the receive window, a fragment that does not fit.
bool on_frag(Conn* c, const std::byte* buf, uint32_t len);
// One fence from the peer's RDMA channel: releases (or, for a failure verdict, drops) the
// messages held for it. False if the peer lies (a sequence beyond the receive window, too
// many verdicts for messages not arrived): its RDMA channel is disconnected.
bool on_fence(Conn* c, const wire::RdsFence& f);
// How far past the next expected sequence a message may be (gaps are legal: a cancelled
// message keeps its number): anything further is a peer that lies about its sequence.
inline constexpr uint64_t kSeqWindow = 1ull << 32;

}  // namespace sv::rds
