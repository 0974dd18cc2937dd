// iWARP connection set-up: TCP + MPA Request/Reply (RFC 5044 §7.1, RFC 6581), for both
// ways applications connect:
//  - rdma_cm (librdmacm): the application's port, MPA private data is the ULP's, exactly
//    what Linux iw_cm/siw put on the wire;
//  - out of band (ibv_modify_qp to RTR with the peer's GID and QPN): softverbs peers only.
//    Each process listens on one TCP port P and numbers its QPs (P << 8 | idx), so a
//    (GID, QPN) pair names an address and port with no daemon. The side with the smaller
//    (GID, QPN) connects (RDS's "smaller address initiates"); its MPA Request carries an
//    OobHeader naming both QPs.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/progress.h"
#include "transport/tcp.h"
#include "wire/mpa.h"

namespace sv::engine {

struct Qp;
class QpRef;

// Whether this side asks for MPA CRC (RFC 5044 §7.1: used if either side asks):
// SOFTVERBS_MPA_CRC, or a corrupt fault rule (a flipped bit must be caught, as a NIC's link
// CRC catches it).
bool mpa_crc_wanted();

// What one side offers in its MPA frame.
struct MpaOffer {
  bool crc = false;
  uint16_t ird = 0;
  uint16_t ord = 0;
  bool p2p = false;            // initiator: ask for peer-to-peer mode with a zero-length Write RTR
  bool ib_completion = false;  // ask a softverbs peer for Placement Acks (IB's completion rule)
  std::vector<std::byte> pdata;  // ULP private data (after the RFC 6581 word)
  // Initiator, out of band: the softverbs responder may send a park notice before its Reply
  // (its QP is not in RTR yet); on_parked runs when it arrives (progress thread).
  std::function<void()> on_parked;
};

// Outcome of a handshake, from this side's point of view.
struct MpaOutcome {
  bool crc = false;
  bool peer_sv = false;
  bool send_acks = false;  // the softverbs peer asked for Placement Acks
  bool wait_acks = false;  // we asked for them: our Sends/Writes complete on the peer's ack
  bool p2p = false;        // RTR exchange agreed (Write RTR)
  uint16_t peer_ird = 0;   // what the peer said
  uint16_t peer_ord = 0;
  uint8_t rev = 2;
  std::vector<std::byte> peer_pdata;
};

// softverbs out-of-band header in the MPA Request private data.
// The initiator's flags word (after the QPNs; an older initiator sends none, which reads
// as 0) says what it understands:
//  - kParkNotice: a responder that parks this Request because its QP is not in RTR yet
//    writes the 4 bytes "SVPK" before its Reply (Endpoint::notify_parked). That is the one
//    way the initiator learns "the peer's QP is not ready" (IB: the responder drops the
//    packets, the requester's retries run out) as opposed to "the peer has not read the
//    Request yet" (IB: packets in flight), so its transport timer runs only on the former.
struct OobHeader {
  static constexpr uint32_t kMagic = 0x53564F42;  // "SVOB"
  static constexpr uint32_t kParkNotice = 1;
  uint32_t dst_qpn = 0;
  uint32_t src_qpn = 0;
  uint32_t flags = 0;
  std::vector<std::byte> encode() const;
  static bool decode(std::span<const std::byte> pd, OobHeader& out);
};

class Endpoint : public Progress::Handler {
 public:
  enum class Role : uint8_t { active, passive };
  enum class State : uint8_t { connecting, wait_reply, wait_request, wait_decision, done, failed };

  // Active: connect to `to` and send a Request; on_done(ep, 0) after a good Reply,
  // (ep, -ECONNREFUSED) on reject, (ep, -errno) on failure.
  static Endpoint* connect(const transport::SockAddr& to, const transport::SockAddr* from,
                           MpaOffer offer, std::function<void(Endpoint*, int)> on_done);
  // Passive: an accepted socket; on_request(ep) once the Request is read; the owner then
  // calls accept() or reject() from any thread.
  static Endpoint* passive(int fd, std::function<void(Endpoint*)> on_request,
                           std::function<void(Endpoint*, int)> on_done);

  void accept(MpaOffer reply);  // sends the Reply; on_done(ep, 0) when it is written
  // While the owner has not decided (wait_decision), a peer that closes or resets fails the
  // endpoint (on_done(ep, -ECONNRESET)), so it does not hold the socket for good. Progress
  // thread only. The initiator sends nothing before our Reply (RFC 5044 §7.1.2), so only
  // hang-up is watched.
  void watch_for_hangup();
  void reject(std::vector<std::byte> pdata);
  // Tells an out-of-band initiator that asked for it that its Request waits for our QP to
  // reach RTR (the "SVPK" notice, OobHeader::kParkNotice). Progress thread, wait_decision.
  void notify_parked();
  static constexpr char kParkNoticeBytes[4] = {'S', 'V', 'P', 'K'};
  // Hands the socket to the caller (after done); the endpoint no longer owns it.
  int release_fd();
  // Destroys the endpoint on the progress thread.
  void dispose();

  Role role() const { return role_; }
  const MpaOutcome& outcome() const { return out_; }
  const wire::MpaFrame& request() const { return req_; }
  const std::vector<std::byte>& request_bytes() const { return in_; }
  bool rejected() const { return rejected_; }  // the peer answered with a rejecting Reply
  int fd() const { return fd_; }
  uint16_t negotiated_ird() const { return ird_; }
  uint16_t negotiated_ord() const { return ord_; }
  void* user = nullptr;
  // Which incarnation of `user` this is (rdma_cm's id serial): an id destroyed and another made
  // at its address must not receive the old handshake's outcome.
  uint64_t user_serial = 0;

  void on_event(uint32_t events) override;

  // MPA handshakes are bounded (RFC 5044 §7 leaves it to the implementation; siw gives a
  // Request or Reply 10 s): an endpoint still connecting, or waiting for a Request or a
  // Reply after this long, fails with -ETIMEDOUT (-ECONNREFUSED if it was connecting and an
  // attempt was refused: retry_refused). SOFTVERBS_MPA_TIMEOUT_MS overrides it.
  static std::chrono::milliseconds handshake_timeout();
  // Passive handshakes waiting for their Request are bounded, in total and per source
  // address, without refusing a prompt legitimate peer (issue 28 item 1):
  //  - at kMaxPendingRequests the listeners stop accepting, and connections wait in the
  //    kernel's listen backlog (as a SYN queue pushes back) until handshakes finish;
  //  - an address holding kMaxPendingPerAddr that has not completed a Request within
  //    kPromptWindow (a slowloris: it opens connections and says nothing) is refused more
  //    (accepted and closed), so it cannot fill the table. An address whose Requests keep
  //    coming (a peer connecting thousands of QPs, whose Requests trail its connects) is
  //    not; a softverbs initiator retries a refused handshake with backoff anyway;
  //  - an address whose protection errors emptied its bucket is refused (peer_guard.h).
  // All listeners together take at most kAcceptBatch connections per progress-loop round,
  // so the Requests of those taken are read before more are: prompt peers never pile up
  // as "pending", however many listeners they connect to.
  static constexpr int kMaxPendingRequests = 1024;
  static constexpr int kMaxPendingPerAddr = 256;
  static constexpr std::chrono::milliseconds kPromptWindow{1000};
  static constexpr int kAcceptBatch = 32;
  // Takes connections from listening socket lfd (progress thread; h is its handler) and
  // calls start(fd) for each admitted one, which must make it a passive endpoint.
  static void accept_batch(int lfd, Progress::Handler* h, const std::function<void(int)>& start);
  // A listener is being closed: it is no longer resumed after a pause (progress thread).
  static void listener_closed(int lfd);
  // Connections from this address accepted whose Request this process has not read yet: a
  // peer whose Request is among them is not to blame for a slow set-up. Progress thread.
  static bool requests_unread(const transport::SockAddr& from);
  // accept4 on a listener failed with err. Out of descriptors, the connection at the head of
  // the backlog is taken with a spare descriptor kept for this and closed, so the listener
  // drains instead of staying readable (and the progress thread spinning on it).
  static void accept_failed(int fd, int err);

 private:
  Endpoint() = default;
  void arm_timeout();
  void start_connect();          // active, progress thread: the TCP connect, again after a retry
  bool retry_refused();          // active: a refused connect is tried again (connect's comment)
  void extend_refused_window();  // active: refused_retry_until_ after a held ack
  void fail(int err);
  void stop_waiting();                  // leaves wait_request's count
  bool read_frame(wire::MpaKind kind);  // true once a whole frame is in in_
  bool write_all(const std::vector<std::byte>& b);

  Role role_ = Role::active;
  State st_ = State::connecting;
  int fd_ = -1;
  MpaOffer offer_;
  MpaOutcome out_;
  wire::MpaFrame req_{};
  std::vector<std::byte> in_;
  size_t want_ = wire::kMpaHeaderLen;
  uint16_t ird_ = 0, ord_ = 0;
  std::function<void(Endpoint*, int)> on_done_;
  std::function<void(Endpoint*)> on_request_;
  uint64_t serial_ = 0;                 // names it in the live table its timeout looks it up in
  bool watching_ = false;               // in epoll for hang-up while waiting for a decision
  std::array<uint8_t, 16> addr_key_{};  // source address, counted per address in wait_request
  bool parked_ = false;                 // initiator: the park notice arrived
  bool rejected_ = false;               // initiator: the Reply said Reject
  transport::SockAddr to_, from_;       // initiator: where to, and from (len 0: any)
  uint64_t refused_retry_until_ = 0;    // initiator: a refused connect is retried until (ns)
  uint64_t first_attempt_ns_ = 0;       // initiator: when connect() was called (mono ns)
  bool refused_once_ = false;           // initiator: an attempt was refused and retried
};

// Whether a connection of qp (null: one whose QP is not known yet) asks softverbs peers for
// IB's completion rule: the QP's own choice (softverbs_qp_set_ib_completion), else
// SOFTVERBS_IB_COMPLETION=1. Read when each connection is set up.
bool ib_completion_wanted(const Qp* qp);

// Out-of-band registry: the process' QP listener and QPN -> QP map.
namespace oob {
// Allocates a host-unique QPN; 0 if exhausted.
uint32_t alloc_qpn(Qp* qp);
// Enters a QPN chosen elsewhere (a UD QP's, from its UDP port); false if it is taken.
bool add_qpn(uint32_t qpn, Qp* qp);
void free_qpn(uint32_t qpn);
Qp* lookup(uint32_t qpn);
// The same, with a reference taken under the registry's lock: a QP destroyed on another
// thread meanwhile is never touched.
std::optional<QpRef> lookup_ref(uint32_t qpn);
// Runs fn on every registered QP under the registry lock (so none is freed meanwhile): fn
// must not block.
void for_each_qp(void (*fn)(Qp*));
// Called when a QP moves to RTR with a peer (GID, QPN): connects or waits for the peer.
void start(Qp* qp);
// Called when a QP is destroyed: drops parked passive endpoints.
void forget(Qp* qp);
// Whether qp's connection is still being set up through no fault of its peer's QP: our
// handshake is under way (or between retries after being pushed back) and the peer has
// neither parked nor rejected it nor been unreachable; or, as the responder, this process
// has Requests from the peer's address it has not read yet, or that address sent us one
// within `period` (it is connecting its QPs one by one). An IB requester's transport timer
// runs on the responder's silence, not on packets in flight; ours then waits, a bounded
// number of periods (qp.cc arm_transport_timer). Progress thread.
bool setup_in_flight(Qp* qp, std::chrono::milliseconds period);
}  // namespace oob

// Applies a finished handshake's outcome to a QP and hands it the socket.
void qp_take_endpoint(Qp* qp, Endpoint* ep);

}  // namespace sv::engine
