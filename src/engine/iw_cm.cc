#include "engine/iw_cm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "engine/fault.h"
#include "engine/log.h"
#include "engine/peer_guard.h"
#include "engine/qp.h"
#include "util/clock.h"
#include "util/fork_local.h"
#include "util/settings.h"
#include "wire/be.h"

namespace sv::engine {

using wire::MpaFrame;
using wire::MpaKind;

std::vector<std::byte> OobHeader::encode() const {
  std::vector<std::byte> b(16);
  wire::store_be32(b.data(), kMagic);
  wire::store_be32(b.data() + 4, dst_qpn);
  wire::store_be32(b.data() + 8, src_qpn);
  wire::store_be32(b.data() + 12, flags);
  return b;
}

bool OobHeader::decode(std::span<const std::byte> pd, OobHeader& out) {
  if (pd.size() < 12 || wire::load_be32(pd.data()) != kMagic) return false;
  out.dst_qpn = wire::load_be32(pd.data() + 4);
  out.src_qpn = wire::load_be32(pd.data() + 8);
  out.flags = pd.size() >= 16 ? wire::load_be32(pd.data() + 12) : 0;
  return true;
}

bool mpa_crc_wanted() {
  static const bool on =
      settings::flag_value(SV_SETTING("SOFTVERBS_MPA_CRC")) || fault::wants_crc();
  return on;
}

// ---- Endpoint ------------------------------------------------------------------------

namespace {
// Endpoints whose handshake timer may still fire, by serial (progress thread only: timers,
// dispose and registration all run there). A serial is never reused, so a timer never
// mistakes a new endpoint at the same address for the one it was set for.
struct LiveEndpoints {
  std::map<uint64_t, Endpoint*> by_serial;
  uint64_t next = 1;
  int waiting_requests = 0;  // passive endpoints in wait_request
  std::map<peer_guard::AddrKey, int> waiting_by_addr;
  // When each address last completed a Request (admit's slowloris test); entries older
  // than kPromptWindow are pruned past kMaxPromptAddrs.
  std::map<peer_guard::AddrKey, std::chrono::steady_clock::time_point> last_request;
  // Listeners stopped (fd, handler): at kMaxPendingRequests, or when this round's accept
  // budget is spent; resumed below the one with budget left.
  std::vector<std::pair<int, Progress::Handler*>> paused;
  int accept_budget = Endpoint::kAcceptBatch;  // accepts left in this progress-loop round
  bool refill_posted = false;
};
ForkLocal<LiveEndpoints> g_live;

constexpr size_t kMaxPromptAddrs = 4096;

void note_request(const peer_guard::AddrKey& from) {
  auto& lr = g_live.get().last_request;
  const auto now = std::chrono::steady_clock::now();
  if (lr.size() >= kMaxPromptAddrs) {
    std::erase_if(lr, [&](const auto& e) { return now - e.second >= Endpoint::kPromptWindow; });
    if (lr.size() >= kMaxPromptAddrs) lr.erase(lr.begin());
  }
  lr[from] = now;
}

void resume_listeners() {
  auto& live = g_live.get();
  if (live.paused.empty() || live.waiting_requests >= Endpoint::kMaxPendingRequests ||
      live.accept_budget <= 0)
    return;
  for (auto [fd, h] : live.paused) Progress::get().mod(fd, EPOLLIN, h);
  live.paused.clear();
}
}  // namespace

std::chrono::milliseconds Endpoint::handshake_timeout() {
  static const long ms = [] {
    return static_cast<long>(settings::uint_value(SV_SETTING("SOFTVERBS_MPA_TIMEOUT_MS")));
  }();
  return std::chrono::milliseconds(ms);
}

void Endpoint::arm_timeout() {
  auto& live = g_live.get();
  serial_ = live.next++;
  live.by_serial[serial_] = this;
  Progress::get().post_after(handshake_timeout(), [serial = serial_] {
    auto& l = g_live.get();
    auto it = l.by_serial.find(serial);
    if (it == l.by_serial.end()) return;
    Endpoint* ep = it->second;
    // A connect whose attempts were refused (retry_refused) was refused, not unanswered,
    // whether it times out between two attempts or during one.
    if (ep->st_ == State::connecting && ep->refused_once_) {
      ep->fail(-ECONNREFUSED);
    } else if (ep->st_ == State::connecting || ep->st_ == State::wait_reply ||
               ep->st_ == State::wait_request) {
      SV_WARN("MPA handshake timed out (fd %d)", ep->fd_);
      ep->fail(-ETIMEDOUT);
    }
  });
}

namespace {
// One descriptor held back (on /dev/null) for refusing connections at EMFILE.
std::atomic<int> g_spare_fd{-1};
void keep_spare() {
  if (g_spare_fd.load() < 0) g_spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}
}  // namespace

namespace {
// May the connection just accepted on fd wait for its Request? Closes it if not.
bool admit(int fd, const peer_guard::AddrKey& key) {
  const transport::SockAddr peer = transport::peer_addr(fd);
  if (!peer_guard::admit(peer)) {
    SV_WARN("refusing fd %d: its address keeps failing protection checks", fd);
    close(fd);
    return false;
  }
  auto& live = g_live.get();
  auto it = live.waiting_by_addr.find(key);
  if (it == live.waiting_by_addr.end() || it->second < Endpoint::kMaxPendingPerAddr) return true;
  auto done = live.last_request.find(key);
  if (done != live.last_request.end() &&
      std::chrono::steady_clock::now() - done->second < Endpoint::kPromptWindow)
    return true;  // its Requests keep coming: a busy peer, not a silent one
  SV_WARN("%s has %d MPA handshakes pending and sends no Request: refusing fd %d",
          peer.str().c_str(), it->second, fd);
  close(fd);
  return false;
}
}  // namespace

void Endpoint::accept_batch(int lfd, Progress::Handler* h, const std::function<void(int)>& start) {
  keep_spare();
  auto& live = g_live.get();
  for (;;) {
    if (live.waiting_requests >= kMaxPendingRequests || live.accept_budget <= 0) {
      // Push back: the rest wait in the kernel's backlog (and beyond it, the initiators'
      // SYN retries) until handshakes finish, or until this round's Requests are read.
      Progress::get().mod(lfd, 0, h);
      live.paused.emplace_back(lfd, h);
      if (live.accept_budget <= 0 && !live.refill_posted) {
        live.refill_posted = true;
        // Commands run after this round's events: the next round reads the Requests of
        // the connections taken in this one before any listener takes more.
        Progress::get().post([] {
          auto& l = g_live.get();
          l.refill_posted = false;
          l.accept_budget = kAcceptBatch;
          resume_listeners();
        });
      }
      return;
    }
    const int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      accept_failed(lfd, errno);
      return;
    }
    --live.accept_budget;
    if (admit(c, peer_guard::addr_key(transport::peer_addr(c)))) start(c);
  }
}

void Endpoint::listener_closed(int lfd) {
  auto& p = g_live.get().paused;
  p.erase(std::remove_if(p.begin(), p.end(), [lfd](const auto& e) { return e.first == lfd; }),
          p.end());
}

bool Endpoint::requests_unread(const transport::SockAddr& from) {
  const auto& live = g_live.get();
  return live.waiting_by_addr.count(peer_guard::addr_key(from)) > 0;
}

void Endpoint::stop_waiting() {
  auto& live = g_live.get();
  --live.waiting_requests;
  auto it = live.waiting_by_addr.find(addr_key_);
  if (it != live.waiting_by_addr.end() && --it->second <= 0) live.waiting_by_addr.erase(it);
  resume_listeners();
}

void Endpoint::accept_failed(int fd, int err) {
  if (err != EMFILE && err != ENFILE) return;
  const int spare = g_spare_fd.exchange(-1);
  if (spare < 0) return;
  close(spare);
  const int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (c >= 0) close(c);  // refused: we have no descriptor to serve it with
  SV_WARN("accept: out of descriptors, refused one connection");
  keep_spare();
}

// A connect refused (no listener) within SOFTVERBS_REFUSED_RETRY_US (default 3 ms) of a
// Placement Ack that this process held for an answer and sent without one is tried again,
// every kRefusedRetryGap, until then. IB's responder acks a message microseconds after it
// arrives; ours waited for an answer, so a peer that completes its Send only on that ack and
// listens only after it (perftest -R's server: the handshake's last Send, then rdma_listen,
// about 100 us after the ack here) refused the connect that followed (1-3 in 40 runs of
// ib_write_lat -R; none under RFC 5040's rule, whose Send completes on transmit). A connect
// that succeeds costs nothing, and one refused for good reports it at most twice the window
// after its first attempt.
constexpr std::chrono::microseconds kRefusedRetryGap{250};

namespace {
uint64_t refused_retry_ns() {
  static const uint64_t ns = sv::setting_us_as_ns(SV_SETTING("SOFTVERBS_REFUSED_RETRY_US"));
  return ns;
}
}  // namespace

// The retry window's end: it follows an ack held and flushed after the first attempt too (a
// QP whose tx_mu was busy at the flush sends it late), up to twice the window in all.
void Endpoint::extend_refused_window() {
  const uint64_t window = refused_retry_ns();
  const uint64_t acked = held_ack_flushed_at();  // before the clock: acked <= now
  const uint64_t now = sv::mono_ns();
  if (!window || !acked || now - acked >= window) return;
  refused_retry_until_ =
      std::min(std::max(refused_retry_until_, acked + window), first_attempt_ns_ + 2 * window);
}

Endpoint* Endpoint::connect(const transport::SockAddr& to, const transport::SockAddr* from,
                            MpaOffer offer, std::function<void(Endpoint*, int)> on_done) {
  auto* ep = new Endpoint();
  ep->role_ = Role::active;
  ep->offer_ = std::move(offer);
  ep->on_done_ = std::move(on_done);
  ep->to_ = to;
  if (from) ep->from_ = *from;
  ep->first_attempt_ns_ = sv::mono_ns();
  ep->extend_refused_window();
  Progress::get().post([ep] {
    ep->arm_timeout();
    ep->start_connect();
  });
  return ep;
}

void Endpoint::start_connect() {
  int fd = transport::tcp_connect_nb(to_, from_.len ? &from_ : nullptr);
  if (fd < 0) {
    if (fd == -ECONNREFUSED && retry_refused()) return;
    fail(fd);
    return;
  }
  fd_ = fd;
  st_ = State::connecting;
  Progress::get().add(fd, EPOLLOUT, this);
  // Often connected already (a local peer): the Request goes now, not one epoll round
  // later, so the responder does not accept a connection whose Request is still here.
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, 0) == 1) on_event(static_cast<uint32_t>(p.revents));
}

bool Endpoint::retry_refused() {
  if (role_ != Role::active) return false;
  extend_refused_window();
  if (sv::mono_ns() >= refused_retry_until_) return false;
  if (fd_ >= 0) {
    Progress::get().del(fd_);
    close(fd_);
    fd_ = -1;
  }
  st_ = State::connecting;
  if (!refused_once_)
    SV_DBG("connect to %s refused soon after a held ack left: trying again", to_.str().c_str());
  refused_once_ = true;
  // By serial, as the handshake's timeout: the owner may dispose of it meanwhile.
  Progress::get().post_after(kRefusedRetryGap, [serial = serial_] {
    auto& l = g_live.get();
    auto it = l.by_serial.find(serial);
    if (it == l.by_serial.end()) return;
    Endpoint* ep = it->second;
    if (ep->st_ == State::connecting && ep->fd_ < 0) ep->start_connect();
  });
  return true;
}

Endpoint* Endpoint::passive(int fd, std::function<void(Endpoint*)> on_request,
                            std::function<void(Endpoint*, int)> on_done) {
  auto* ep = new Endpoint();
  ep->role_ = Role::passive;
  ep->fd_ = fd;
  ep->st_ = State::wait_request;
  ep->on_request_ = std::move(on_request);
  ep->on_done_ = std::move(on_done);
  transport::set_nodelay(fd);
  transport::set_nonblock(fd, true);
  ep->addr_key_ = peer_guard::addr_key(transport::peer_addr(fd));
  Progress::get().run_sync([ep] {
    Progress::get().add(ep->fd_, EPOLLIN, ep);
    auto& live = g_live.get();
    ++live.waiting_requests;
    ++live.waiting_by_addr[ep->addr_key_];
    ep->arm_timeout();
  });
  return ep;
}

void Endpoint::fail(int err) {
  if (st_ == State::failed || st_ == State::done) return;
  if (st_ == State::wait_request) stop_waiting();
  st_ = State::failed;
  if (fd_ >= 0) {
    Progress::get().del(fd_);
    close(fd_);
    fd_ = -1;
  }
  if (on_done_) on_done_(this, err);
}

bool Endpoint::write_all(const std::vector<std::byte>& b) {
  size_t off = 0;
  while (off < b.size()) {
    ssize_t n = send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 5000) <= 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool Endpoint::read_frame(MpaKind) {
  // Read exactly the frame: bytes behind it belong to the FPDU stream (siw may send its
  // first FPDU right behind its Reply).
  while (in_.size() < want_) {
    std::byte buf[wire::kMpaHeaderLen + wire::kMpaRfcMaxPrivData];
    ssize_t n = recv(fd_, buf, want_ - in_.size(), 0);
    if (n == 0) {
      fail(-ECONNRESET);
      return false;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return false;
      fail(-errno);
      return false;
    }
    in_.insert(in_.end(), buf, buf + n);
    // A park notice comes before the Reply and only if we asked for it; a Reply starts
    // with "MPA ", so the two cannot be confused.
    if (role_ == Role::active && offer_.on_parked && !parked_ &&
        in_.size() >= sizeof kParkNoticeBytes &&
        std::memcmp(in_.data(), kParkNoticeBytes, sizeof kParkNoticeBytes) == 0) {
      in_.erase(in_.begin(), in_.begin() + sizeof kParkNoticeBytes);
      parked_ = true;
      offer_.on_parked();
    }
    if (in_.size() == wire::kMpaHeaderLen) {
      want_ = wire::mpa_frame_len(in_);
      if (want_ > wire::kMpaHeaderLen + wire::kMpaRfcMaxPrivData) {
        fail(-EPROTO);
        return false;
      }
    }
  }
  return true;
}

// SOFTVERBS_RFC7306=0 makes this process a plain RFC 5040/5041/5044/6581 peer (as siw
// is): it neither announces nor accepts the softverbs extensions (atomics, immediate).
static bool extensions_enabled() {
  return settings::flag_value(SV_SETTING("SOFTVERBS_RFC7306"));
}

// IB's completion rule: between softverbs peers, Sends and Writes complete once the
// responder has placed them, and remote errors land on the WQE that caused them.
bool ib_completion_wanted(const Qp* qp) {
  if (!extensions_enabled()) return false;
  // UC has no acks: a UC WQE is done once its last packet has left (rxe_req.c), which is
  // RFC 5040's rule.
  if (qp && qp->uc) return false;
  if (qp && qp->ib_completion_pref >= 0) return qp->ib_completion_pref == 1;
  return settings::flag_value(SV_SETTING("SOFTVERBS_IB_COMPLETION"));
}

static std::vector<std::byte> encode_frame(const MpaFrame& f) {
  std::vector<std::byte> b(wire::mpa_encoded_len(f));
  wire::mpa_encode(f, b);
  return b;
}

void Endpoint::watch_for_hangup() {
  if (st_ != State::wait_decision || fd_ < 0 || watching_) return;
  watching_ = true;
  Progress::get().add(fd_, EPOLLRDHUP, this);
}

void Endpoint::on_event(uint32_t events) {
  if (st_ == State::wait_decision) {
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      SV_DBG("MPA: peer left while its Request waited (fd %d)", fd_);
      fail(-ECONNRESET);
    }
    return;
  }
  if (st_ == State::connecting) {
    int r = transport::tcp_connect_result(fd_);
    if (r != 0 || (events & (EPOLLERR | EPOLLHUP))) {
      if (r == -ECONNREFUSED && retry_refused()) return;
      fail(r ? r : -ECONNREFUSED);
      return;
    }
    MpaFrame f;
    f.kind = MpaKind::request;
    f.rev = 2;
    f.enhanced = true;
    f.crc = offer_.crc;
    f.res = extensions_enabled() ? wire::kMpaResSvRequest : 0;
    if (offer_.ib_completion) f.res |= wire::kMpaResAckRequest;
    f.v2.ird = offer_.ird;
    f.v2.ord = offer_.ord;
    f.v2.p2p = offer_.p2p;
    f.v2.rtr_write = offer_.p2p;
    f.ulp_pdata = offer_.pdata;
    if (!write_all(encode_frame(f))) {
      fail(-ECONNRESET);
      return;
    }
    st_ = State::wait_reply;
    Progress::get().mod(fd_, EPOLLIN, this);
    return;
  }
  if (st_ == State::wait_reply) {
    if (!read_frame(MpaKind::reply)) return;
    MpaFrame rep;
    auto e = wire::mpa_decode(in_, MpaKind::reply, wire::kMpaRfcMaxPrivData, rep);
    if (e != wire::MpaError::ok) {
      SV_WARN("bad MPA reply: %s", wire::to_string(e));
      fail(-EPROTO);
      return;
    }
    out_.peer_pdata.assign(rep.ulp_pdata.begin(), rep.ulp_pdata.end());
    if (rep.reject) {
      rejected_ = true;
      fail(-ECONNREFUSED);
      return;
    }
    // We sent v2 + E: like siw we require the same back (RFC 6581 §5), no markers.
    if (rep.rev != 2 || !rep.enhanced || rep.markers) {
      fail(-ECONNRESET);
      return;
    }
    out_.rev = 2;
    out_.crc = offer_.crc || rep.crc;  // RFC 5044 §7.1: CRC if either side asks
    out_.peer_sv = extensions_enabled() && (rep.res & wire::kMpaResSvReply);
    out_.send_acks = out_.peer_sv && (rep.res & wire::kMpaResAckReply);
    out_.wait_acks = out_.peer_sv && offer_.ib_completion;
    out_.peer_ird = rep.v2.ird;
    out_.peer_ord = rep.v2.ord;
    out_.p2p = offer_.p2p && rep.v2.p2p && rep.v2.rtr_write;
    ord_ = std::min(offer_.ord, rep.v2.ird);
    ird_ = offer_.ird;
    st_ = State::done;
    Progress::get().del(fd_);
    if (on_done_) on_done_(this, 0);
    return;
  }
  if (st_ == State::wait_request) {
    if (!read_frame(MpaKind::request)) return;
    auto e = wire::mpa_decode(in_, MpaKind::request, wire::kMpaRfcMaxPrivData, req_);
    if (e != wire::MpaError::ok) {
      SV_WARN("bad MPA request: %s", wire::to_string(e));
      fail(-EPROTO);
      return;
    }
    if (req_.markers) {
      // siw behaviour: markers are not implemented; answer with R=1 and close.
      MpaFrame f;
      f.kind = MpaKind::reply;
      f.rev = req_.rev;
      f.enhanced = req_.enhanced;
      f.reject = true;
      write_all(encode_frame(f));
      fail(-EPROTO);
      return;
    }
    out_.rev = req_.rev;
    out_.peer_sv = extensions_enabled() && (req_.res & wire::kMpaResSvRequest);
    out_.send_acks = out_.peer_sv && (req_.res & wire::kMpaResAckRequest);
    out_.peer_ird = req_.v2.ird;
    out_.peer_ord = req_.v2.ord;
    out_.peer_pdata.assign(req_.ulp_pdata.begin(), req_.ulp_pdata.end());
    note_request(addr_key_);
    stop_waiting();
    st_ = State::wait_decision;
    Progress::get().del(fd_);
    if (on_request_) on_request_(this);
    return;
  }
}

void Endpoint::accept(MpaOffer reply) {
  Progress::get().post([this, reply = std::move(reply)] {
    if (st_ != State::wait_decision) return;
    if (watching_) {
      // The socket is about to be the QP's: out of the epoll set under this handler.
      Progress::get().del(fd_);
      watching_ = false;
    }
    MpaFrame f;
    f.kind = MpaKind::reply;
    f.rev = req_.rev;
    f.enhanced = req_.enhanced;
    f.crc = req_.crc || reply.crc;
    f.res = out_.peer_sv ? wire::kMpaResSvReply : 0;
    out_.wait_acks = out_.peer_sv && reply.ib_completion;  // the accepting QP's choice
    if (out_.wait_acks) f.res |= wire::kMpaResAckReply;
    if (req_.rev == 2 && req_.enhanced) {
      // RFC 6581 §5: our ORD must not exceed the initiator's IRD.
      f.v2.ird = reply.ird;
      f.v2.ord = std::min(reply.ord, req_.v2.ird);
      if (req_.v2.p2p) {
        f.v2.p2p = true;
        // Prefer the Write RTR, as siw does; a Read RTR is answered by the normal
        // Read Response path. We never ask for the Send RTR (it would eat a receive).
        f.v2.rtr_write = req_.v2.rtr_write;
        f.v2.rtr_read = !req_.v2.rtr_write && req_.v2.rtr_read;
      }
      ird_ = f.v2.ird;
      ord_ = f.v2.ord;
    } else {
      // MPA v1 has no IRD/ORD exchange; unlike siw (which then reports 0) we keep our own
      // limits so a v1 peer can still be served Reads.
      ird_ = reply.ird;
      ord_ = reply.ord;
    }
    out_.crc = f.crc;
    out_.p2p = f.v2.p2p;
    f.ulp_pdata = reply.pdata;
    if (!write_all(encode_frame(f))) {
      fail(-ECONNRESET);
      return;
    }
    st_ = State::done;
    if (on_done_) on_done_(this, 0);
  });
}

void Endpoint::reject(std::vector<std::byte> pdata) {
  Progress::get().post([this, pdata = std::move(pdata)] {
    if (st_ != State::wait_decision) return;
    MpaFrame f;
    f.kind = MpaKind::reply;
    f.rev = req_.rev;
    f.enhanced = req_.enhanced;
    f.reject = true;
    f.ulp_pdata = pdata;
    write_all(encode_frame(f));
    fail(-ECONNREFUSED);
  });
}

void Endpoint::notify_parked() {
  if (st_ != State::wait_decision || fd_ < 0) return;
  // Four bytes on a socket nothing was written to: they fit (no partial write to finish).
  if (send(fd_, kParkNoticeBytes, sizeof kParkNoticeBytes, MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof kParkNoticeBytes))
    fail(-ECONNRESET);
}

int Endpoint::release_fd() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Endpoint::dispose() {
  Progress::get().post([this] {
    if (serial_) g_live.get().by_serial.erase(serial_);
    if (fd_ >= 0) {
      Progress::get().del(fd_);
      close(fd_);
    }
    delete this;
  });
}

// ---- out-of-band registry -------------------------------------------------------------

namespace oob {
namespace {

struct Listener : Progress::Handler {
  int fd = -1;
  uint16_t port = 0;
  std::vector<bool> used = std::vector<bool>(256, false);
  uint32_t next = 1;
  void on_event(uint32_t) override;
};

constexpr size_t kMaxParkedPerQp = 4;

struct Registry {
  std::mutex mu;
  std::vector<Listener*> listeners;
  std::map<uint32_t, Qp*> qps;
  std::multimap<uint32_t, Endpoint*> parked;  // dst_qpn -> passive endpoints waiting for RTR
  // Our QPs whose active set-up is under way (first attempt to success or giving up), and
  // whether their peer has shown its QP is not ready: a park notice, a rejecting Reply, or
  // no listener (setup_in_flight).
  std::map<uint32_t, bool> active_setup;  // qpn -> peer not ready
  // When each peer address last sent us an out-of-band Request (at most kMaxHeard, the
  // stalest dropped): a peer busy connecting its QPs to us is alive and getting there.
  std::map<peer_guard::AddrKey, std::chrono::steady_clock::time_point> heard;
};
constexpr size_t kMaxHeard = 4096;

// A forked child gets its own listener (and so its own QPN space); the parent's listening
// socket is closed in the child with the rest of the progress thread's sockets.
ForkLocal<Registry> g_reg;

Registry& reg() {
  return g_reg.get();
}

Listener* new_listener() {
  auto* l = new Listener();
  transport::SockAddr any;
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&any.ss);
  in6->sin6_family = AF_INET6;
  in6->sin6_addr = in6addr_any;
  any.len = sizeof(sockaddr_in6);
  // Connections wait in the backlog while handshakes are at their bound (accept_batch):
  // as deep as the kernel allows (net.core.somaxconn caps it).
  int fd = transport::tcp_listen(any, SOMAXCONN, true);
  if (fd < 0)
    fd = transport::tcp_listen(transport::SockAddr::ipv4(htonl(INADDR_ANY), 0), SOMAXCONN, true);
  if (fd < 0) {
    delete l;
    return nullptr;
  }
  l->fd = fd;
  l->port = transport::local_addr(fd).port();
  Progress::get().run_sync([l] { Progress::get().add(l->fd, EPOLLIN, l); });
  return l;
}

void accept_parked(Qp* qp, Endpoint* ep) {
  MpaOffer o;
  o.crc = mpa_crc_wanted();
  o.ird = static_cast<uint16_t>(std::max<uint8_t>(qp->attr.max_dest_rd_atomic, 1));
  o.ord = static_cast<uint16_t>(kMaxRdAtom);
  o.ib_completion = ib_completion_wanted(qp);
  ep->user = qp;
  ep->accept(std::move(o));
}

void on_request(Endpoint* ep) {
  OobHeader h;
  if (!OobHeader::decode(ep->outcome().peer_pdata, h)) {
    ep->reject({});
    return;
  }
  auto& r = reg();
  std::unique_lock lk(r.mu);
  if (r.heard.size() >= kMaxHeard) {
    auto stalest =
        std::min_element(r.heard.begin(), r.heard.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    r.heard.erase(stalest);
  }
  r.heard[peer_guard::addr_key(transport::peer_addr(ep->fd()))] = std::chrono::steady_clock::now();
  auto it = r.qps.find(h.dst_qpn);
  if (it == r.qps.end()) {
    lk.unlock();
    ep->reject({});
    return;
  }
  Qp* qp = it->second;
  const auto st = qp->state.load();
  if ((st == IBV_QPS_RTR || st == IBV_QPS_RTS) && qp->attr.dest_qp_num == h.src_qpn &&
      !qp->conn_up()) {
    lk.unlock();
    accept_parked(qp, ep);
    return;
  }
  if (st == IBV_QPS_ERR || qp->conn_up()) {
    lk.unlock();
    ep->reject({});
    return;
  }
  // A QP waits for one peer; a few more Requests can be legitimate (retries whose earlier
  // attempt has not been seen to leave yet). Beyond that the oldest gives way, so nobody can
  // hold a QP's set-up by parking Requests for it.
  Endpoint* evict = nullptr;
  if (r.parked.count(h.dst_qpn) >= kMaxParkedPerQp) {
    auto oldest = r.parked.find(h.dst_qpn);  // equal keys keep insertion order
    evict = oldest->second;
    r.parked.erase(oldest);
  }
  ep->user = reinterpret_cast<void*>(static_cast<uintptr_t>(h.src_qpn));
  r.parked.emplace(h.dst_qpn, ep);  // wait until the QP reaches RTR
  lk.unlock();
  ep->watch_for_hangup();  // ... or its peer gives up
  if (evict) evict->reject({});
  if (h.flags & OobHeader::kParkNotice) ep->notify_parked();
}

void on_passive_done(Endpoint* ep, int err) {
  if (err) {
    // A parked one whose peer left (or that was refused): no longer a candidate. Parking and
    // taking from `parked` also run on the progress thread, so nobody holds it meanwhile.
    {
      auto& r = reg();
      std::lock_guard lk(r.mu);
      for (auto it = r.parked.begin(); it != r.parked.end();)
        it = it->second == ep ? r.parked.erase(it) : std::next(it);
    }
    ep->dispose();
    return;
  }
  auto* qp = static_cast<Qp*>(ep->user);
  {
    std::lock_guard lk(reg().mu);
    auto it = reg().qps.find(qp->qpn());
    if (it == reg().qps.end() || it->second != qp) {
      ep->dispose();
      return;
    }
  }
  qp_take_endpoint(qp, ep);
  ep->dispose();
}

void Listener::on_event(uint32_t) {
  Endpoint::accept_batch(fd, this,
                         [](int c) { Endpoint::passive(c, on_request, on_passive_done); });
}

void connect_active(uint32_t qpn, int attempt);

void end_active_setup(uint32_t qpn) {
  std::lock_guard lk(reg().mu);
  reg().active_setup.erase(qpn);
}

void peer_not_ready(uint32_t qpn) {
  std::lock_guard lk(reg().mu);
  auto it = reg().active_setup.find(qpn);
  if (it != reg().active_setup.end()) it->second = true;
}

void on_active_done(uint32_t qpn, int attempt, Endpoint* ep, int err) {
  Qp* qp = lookup(qpn);
  if (!qp) {
    end_active_setup(qpn);
    ep->dispose();
    return;
  }
  if (err == 0) {
    end_active_setup(qpn);
    qp_take_endpoint(qp, ep);
    ep->dispose();
    return;
  }
  // Refused: the peer's QP is not there (a rejecting Reply) or nothing listens; or we are
  // out of descriptors or memory here: the transport timer runs. A reset is the peer
  // pushing back (a refused slot): its QP may be ready, the set-up is in flight.
  if (err == -EMFILE || err == -ENFILE || err == -ENOMEM || err == -ENOBUFS) {
    if (attempt == 0) SV_WARN("qp %u: cannot connect: %s", qpn, std::strerror(-err));
    peer_not_ready(qpn);
  }
  // Unreachable, or silent for a whole handshake timeout: the peer is not answering.
  if (ep->rejected() || err == -ECONNREFUSED || err == -EHOSTUNREACH || err == -ENETUNREACH ||
      err == -ETIMEDOUT)
    peer_not_ready(qpn);
  ep->dispose();
  // The peer may not have created its listener's QP yet or is slow: retry with backoff
  // for retry_cnt rounds, then give up like an RC QP whose retries are exhausted.
  // retry_cnt is written by ibv_modify_qp (RTR->RTS) under tx_mu, which may run right now.
  uint8_t retry_cnt;
  {
    std::lock_guard lk(qp->tx_mu);
    retry_cnt = qp->attr.retry_cnt;
  }
  const int retries = std::max<int>(retry_cnt, 3) * 4;
  if (attempt < retries) {
    Progress::get().post_after(std::chrono::milliseconds(10 << std::min(attempt, 5)),
                               [qpn, attempt] { connect_active(qpn, attempt + 1); });
    return;
  }
  SV_INFO("qp %u: connect failed (%d)", qpn, err);
  end_active_setup(qpn);
  qp_set_error(qp, IBV_WC_RETRY_EXC_ERR, true);
}

bool remote_of(Qp* qp, transport::SockAddr& to) {
  const auto& ah = qp->attr.ah_attr;
  if (ah.is_global && gid_to_addr(ah.grh.dgid, to)) {
    to.set_port(static_cast<uint16_t>(qp->attr.dest_qp_num >> 8));
    return true;
  }
  // No GRH (ibv_rc_pingpong without -g): LIDs are 0 on Ethernet, so the only peer we can
  // name is this host.
  to = transport::SockAddr::ipv4(htonl(INADDR_LOOPBACK),
                                 static_cast<uint16_t>(qp->attr.dest_qp_num >> 8));
  return true;
}

void connect_active(uint32_t qpn, int attempt) {
  Qp* qp = lookup(qpn);
  if (!qp || qp->state.load() == IBV_QPS_ERR || qp->conn_up()) {
    end_active_setup(qpn);
    return;
  }
  if (attempt == 0) {
    std::lock_guard lk(reg().mu);
    reg().active_setup[qpn] = false;
  }
  transport::SockAddr to;
  remote_of(qp, to);
  MpaOffer o;
  o.crc = mpa_crc_wanted();
  o.ird = static_cast<uint16_t>(std::max<uint8_t>(qp->attr.max_dest_rd_atomic, 1));
  o.ord = static_cast<uint16_t>(kMaxRdAtom);
  o.p2p = true;
  o.ib_completion = ib_completion_wanted(qp);
  o.pdata = OobHeader{qp->attr.dest_qp_num, qpn, OobHeader::kParkNotice}.encode();
  o.on_parked = [qpn] { peer_not_ready(qpn); };
  Endpoint::connect(to, nullptr, std::move(o), [qpn, attempt](Endpoint* ep, int err) {
    on_active_done(qpn, attempt, ep, err);
  });
}

}  // namespace

uint32_t alloc_qpn(Qp* qp) {
  auto& r = reg();
  std::lock_guard lk(r.mu);
  for (;;) {
    for (auto* l : r.listeners) {
      for (uint32_t k = 0; k < 254; ++k) {
        uint32_t idx = l->next;
        l->next = l->next >= 254 ? 1 : l->next + 1;  // rotate: QPNs are not soon reused
        if (!l->used[idx]) {
          l->used[idx] = true;
          uint32_t qpn = (static_cast<uint32_t>(l->port) << 8) | idx;
          r.qps[qpn] = qp;
          return qpn;
        }
      }
    }
    if (r.listeners.size() >= 256) return 0;
    Listener* l = new_listener();
    if (!l) return 0;
    r.listeners.push_back(l);
  }
}

bool add_qpn(uint32_t qpn, Qp* qp) {
  auto& r = reg();
  std::lock_guard lk(r.mu);
  return r.qps.emplace(qpn, qp).second;
}

void free_qpn(uint32_t qpn) {
  auto& r = reg();
  std::lock_guard lk(r.mu);
  r.qps.erase(qpn);
  for (auto* l : r.listeners)
    if (l->port == (qpn >> 8)) l->used[qpn & 0xFF] = false;
}

Qp* lookup(uint32_t qpn) {
  auto& r = reg();
  std::lock_guard lk(r.mu);
  auto it = r.qps.find(qpn);
  return it == r.qps.end() ? nullptr : it->second;
}

std::optional<QpRef> lookup_ref(uint32_t qpn) {
  auto& r = reg();
  std::lock_guard lk(r.mu);
  auto it = r.qps.find(qpn);
  if (it == r.qps.end()) return std::nullopt;
  return QpRef(it->second);
}

void for_each_qp(void (*fn)(Qp*)) {
  auto& r = reg();
  std::lock_guard lk(r.mu);
  for (auto& [qpn, qp] : r.qps) fn(qp);
}

static bool local_is_active(Qp* qp) {
  // Compare (our GID, our QPN) with (peer GID, peer QPN); the smaller connects.
  const auto& ah = qp->attr.ah_attr;
  ibv_gid mine{}, theirs{};
  if (ah.is_global) {
    theirs = ah.grh.dgid;
    Device* d = the_device();
    if (ah.grh.sgid_index < d->gids.size()) mine = d->gids[ah.grh.sgid_index];
  }
  int c = std::memcmp(mine.raw, theirs.raw, 16);
  if (c != 0) return c < 0;
  return qp->qpn() < qp->attr.dest_qp_num;
}

void start(Qp* qp) {
  const uint32_t qpn = qp->qpn();
  if (local_is_active(qp)) {
    Progress::get().post([qpn] { connect_active(qpn, 0); });
    return;
  }
  // Passive: a Request may already be parked.
  Progress::get().post([qpn] {
    Qp* q = lookup(qpn);
    if (!q) return;
    Endpoint* ep = nullptr;
    {
      auto& r = reg();
      std::lock_guard lk(r.mu);
      auto range = r.parked.equal_range(qpn);
      for (auto it = range.first; it != range.second; ++it) {
        if (reinterpret_cast<uintptr_t>(it->second->user) == q->attr.dest_qp_num) {
          ep = it->second;
          r.parked.erase(it);
          break;
        }
      }
    }
    if (ep) accept_parked(q, ep);
  });
}

bool setup_in_flight(Qp* qp, std::chrono::milliseconds period) {
  const uint32_t qpn = qp->qpn();
  transport::SockAddr peer;
  remote_of(qp, peer);
  {
    auto& r = reg();
    std::lock_guard lk(r.mu);
    auto it = r.active_setup.find(qpn);
    if (it != r.active_setup.end()) return !it->second;
    if (local_is_active(qp)) return false;  // not started, or given up
    // Responder: the peer connects its QPs one after another; while it has been connecting
    // others to us within the period, it is alive and this one's turn is coming.
    auto h = r.heard.find(peer_guard::addr_key(peer));
    if (h != r.heard.end() && std::chrono::steady_clock::now() - h->second < period) return true;
  }
  // Or one of its Requests is waiting in our own queues.
  return Endpoint::requests_unread(peer);
}

void forget(Qp* qp) {
  auto& r = reg();
  std::vector<Endpoint*> drop;
  {
    std::lock_guard lk(r.mu);
    auto range = r.parked.equal_range(qp->qpn());
    for (auto it = range.first; it != range.second; ++it) drop.push_back(it->second);
    r.parked.erase(range.first, range.second);
    r.active_setup.erase(qp->qpn());  // its QPN may be the next QP's
  }
  for (auto* ep : drop) ep->reject({});
}

}  // namespace oob

}  // namespace sv::engine
