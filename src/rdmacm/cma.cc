// librdmacm.so.1: the rdma_cm API over softverbs' iWARP connection set-up (engine/iw_cm.h).
// As with Linux iw_cm, the rdma_cm port is the TCP port, and a connection is a TCP
// connection carrying an MPA Request/Reply with the ULP's private data, so a softverbs
// rping talks to a siw rping.
//
// Events: each rdma_event_channel is an EventQueue (engine/event_queue.h), so blocking,
// O_NONBLOCK -> EAGAIN and poll() on channel->fd behave as with the kernel's rdma_cm file.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/fault.h"
#include "engine/iw_cm.h"
#include "engine/qp.h"
#include "util/fork_local.h"
#include "util/raw_socket.h"
#include "util/settings.h"
#include "wire/ud.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

using namespace sv::engine;
using sv::transport::SockAddr;
namespace wire = sv::wire;

namespace {

struct CmEvent {
  rdma_cm_event ev;  // first: handed out
  std::vector<std::byte> pdata;
};

struct Channel {
  rdma_event_channel ch;  // first; ch.fd is events.fd()
  EventQueue<CmEvent*> events;
};

struct CmId;
struct SidrSock;

struct Listener : Progress::Handler {
  CmId* id = nullptr;
  int fd = -1;
  void on_event(uint32_t) override;
};

std::atomic<uint64_t> g_cm_serial{0};

constexpr uint8_t kDefaultAckTimeout = 14;

struct CmId {
  rdma_cm_id id;  // first: handed out
  // Names this id in callbacks posted for later: a destroyed id's address may be reused by
  // a new one (rsockets' rclose then raccept), which must not get the old id's events.
  const uint64_t serial = ++g_cm_serial;
  std::mutex mu;
  bool sync = false;  // created with a NULL channel (rdma_create_ep style)
  Channel* own_channel = nullptr;
  int bound_fd = -1;  // bound, not yet listening
  Listener* listener = nullptr;
  Endpoint* ep = nullptr;  // handshake in flight or waiting for accept/reject
  bool accepted = false;   // passive: accept() was called; on_passive_done owns ep now
  bool connected = false;
  bool disconnected = false;  // DISCONNECTED already queued
  // rdma_create_ep on a passive id: rdma_get_request creates a QP like this on each child.
  std::unique_ptr<ibv_qp_init_attr> child_qp_attr;
  uint8_t resp_res = 0, init_depth = 0;
  // The RTS attribute `timeout` its QP gets: librdmacm's ucma_modify_qp_rts leaves the
  // kernel's (14 for iWARP, as iw_cm) unless RDMA_OPTION_ID_ACK_TIMEOUT set one.
  uint8_t ack_timeout = kDefaultAckTimeout;
  // RDMA_PS_UDP: the SIDR socket (listener's, or the requester's while it resolves). A
  // request's child answers on a duplicate of its listener's socket, to the requester.
  SidrSock* sidr = nullptr;
  int sidr_reply_fd = -1;
  SockAddr sidr_peer;
  uint32_t sidr_req_id = 0;
  // Events handed out and not yet acked (rdma_destroy_id waits). Counted as an event is taken
  // off its queue, under the queue's lock (EventQueue::pop), so a destroy that has purged the
  // queue sees every one handed out before; dropped by rdma_ack_cm_event under mu.
  std::atomic<int> outstanding{0};
  // A listener's connect requests queued and not yet retrieved, and how many it may have: the
  // kernel's ucma counts them against the listen backlog (ctx->backlog, at most 1024) and
  // refuses the rest, so a peer that floods requests the application is not taking costs
  // a bounded number of ids, sockets and events.
  std::atomic<int> reqs_queued{0};
  int reqs_backlog = 1024;
  std::condition_variable cv;
  // Multicast groups joined (rdma_join_multicast), under mc_mu: held across each change of
  // the list and its attach or detach, so they happen in one order. Not mu: an attach waits
  // for the progress thread, whose callbacks take mu (on_qp_disconnect); none takes mc_mu.
  std::mutex mc_mu;
  struct McJoin {
    sockaddr_storage addr{};
    socklen_t len = 0;
    ibv_gid mgid{};
    bool attached = false;  // the id's QP is attached (not for a send-only join)
  };
  std::vector<McJoin> mc;
  // The application's own QP this id connects (conn_param.qp_num, no rdma_create_qp), under
  // the registry lock: see conn_qp.
  std::optional<sv::engine::QpRef> ext_qp;
};

// Live ids. A QP may outlive its id (rdma_destroy_id before ibv_destroy_qp) and an id
// may outlive its QP (ibv_destroy_qp instead of rdma_destroy_qp), so the QP's disconnect
// hook and the endpoint callbacks (progress thread) find their id through this set and
// hold g_live.get().mu while they use it; rdma_destroy_id removes the id first.
// Never destroyed: progress-thread callbacks may run while exit() destroys statics. A forked
// child starts with none: its parent's ids are not its own (util/fork_local.h).
struct LiveIds {
  std::mutex mu;
  std::vector<CmId*> ids;
};
sv::ForkLocal<LiveIds> g_live;

bool alive(CmId* id) {
  return std::find(g_live.get().ids.begin(), g_live.get().ids.end(), id) != g_live.get().ids.end();
}
// The same id, not one made since at its address (the allocator hands a freed id's memory to
// the next rdma_create_id): what deferred work checks before it acts on an id it kept.
bool alive(CmId* id, uint64_t serial) {
  return alive(id) && id->serial == serial;
}

Channel* chan(rdma_event_channel* c) {
  return reinterpret_cast<Channel*>(c);
}
CmId* cmid(rdma_cm_id* i) {
  return reinterpret_cast<CmId*>(i);
}

// One device context shared by every rdma_cm_id, as librdmacm keeps one per device (and a
// forked child opens its own), with the device's default PD: librdmacm allocates one per
// device on first need and uses it wherever a PD is left NULL (rdma_create_qp, rdma_create_ep).
struct SharedContext {
  ibv_context* ctx = nullptr;
  std::mutex mu;
  ibv_pd* pd = nullptr;
  SharedContext() {
    int n = 0;
    ibv_device** l = ibv_get_device_list(&n);
    ctx = n > 0 ? ibv_open_device(l[0]) : nullptr;
    ibv_free_device_list(l);
  }
  ibv_pd* default_pd() {
    std::lock_guard lk(mu);
    if (!pd && ctx) pd = ibv_alloc_pd(ctx);
    return pd;
  }
};
sv::ForkLocal<SharedContext> g_shared_ctx;

ibv_context* g_verbs() {
  return g_shared_ctx.get().ctx;
}

// The id now belongs to the device (librdmacm's ucma_get_device, on bind to an address,
// address resolution or a request): its verbs context, and the device's default PD unless
// it has one. Programs create their objects on id->pd (pyverbs' CMID does).
void attach_device(rdma_cm_id* i) {
  i->verbs = g_verbs();
  i->port_num = 1;
  if (!i->pd) i->pd = g_shared_ctx.get().default_pd();
}

void queue_event(CmId* id, rdma_cm_event_type type, int status,
                 const std::vector<std::byte>* pdata = nullptr, rdma_cm_id* ev_id = nullptr,
                 uint8_t resp_res = 0, uint8_t init_depth = 0, const rdma_ud_param* ud = nullptr) {
  auto* e = new CmEvent();
  e->ev.id = ev_id ? ev_id : &id->id;
  e->ev.listen_id = ev_id ? &id->id : nullptr;
  e->ev.event = type;
  e->ev.status = status;
  if (pdata && !pdata->empty()) {
    e->pdata = *pdata;
    e->ev.param.conn.private_data = e->pdata.data();
    e->ev.param.conn.private_data_len =
        static_cast<uint8_t>(std::min<size_t>(e->pdata.size(), 255));
  }
  if (ud) {
    // A UD event's parameters are rdma_ud_param (same private data fields at the front).
    e->ev.param.ud.ah_attr = ud->ah_attr;
    if (!e->ev.param.ud.private_data) e->ev.param.ud.private_data = ud->private_data;
    e->ev.param.ud.qp_num = ud->qp_num;
    e->ev.param.ud.qkey = ud->qkey;
  } else {
    e->ev.param.conn.responder_resources = resp_res;
    e->ev.param.conn.initiator_depth = init_depth;
  }
  CmId* owner = ev_id ? cmid(ev_id) : id;
  chan(owner->id.channel)->events.push(e);
}

SockAddr id_src(CmId* id) {
  return SockAddr::from(&id->id.route.addr.src_addr);
}
SockAddr id_dst(CmId* id) {
  return SockAddr::from(&id->id.route.addr.dst_addr);
}

void set_src(CmId* id, const SockAddr& a) {
  std::memset(&id->id.route.addr.src_storage, 0, sizeof(sockaddr_storage));
  std::memcpy(&id->id.route.addr.src_storage, &a.ss, a.len);
}
void set_dst(CmId* id, const SockAddr& a) {
  std::memset(&id->id.route.addr.dst_storage, 0, sizeof(sockaddr_storage));
  std::memcpy(&id->id.route.addr.dst_storage, &a.ss, a.len);
}

bool is_any(const SockAddr& a) {
  if (a.family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a.family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr);
  return true;
}

// The source address the kernel would use toward `to` (connecting a UDP socket sends
// nothing), with port `port`; false if there is no route.
bool route_source(const SockAddr& to, uint16_t port, SockAddr& out) {
  const int fd = sv::raw_socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  SockAddr probe = to;
  if (probe.port() == 0) probe.set_port(9);
  const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&probe.ss), probe.len) == 0;
  if (ok) {
    out = sv::transport::local_addr(fd);
    out.set_port(port);
  }
  close(fd);
  return ok;
}

socklen_t sa_len(const sockaddr* sa) {
  if (!sa) return 0;
  return sa->sa_family == AF_INET6  ? sizeof(sockaddr_in6)
         : sa->sa_family == AF_INET ? sizeof(sockaddr_in)
                                    : 0;
}

// The QP this id connects: its own (rdma_create_qp), or the application's own QP that
// rdma_connect's or rdma_accept's conn_param.qp_num named (an external QP: the program moves
// it through INIT, RTR and RTS itself with rdma_init_qp_attr's attributes, as rdma-core's
// test_rdmacm with_ext_qp does). Null if neither, or the external one was destroyed. Under
// the registry lock.
Qp* conn_qp(CmId* id) {
  if (id->id.qp) return Qp::from(id->id.qp);
  return id->ext_qp && id->ext_qp->live() ? id->ext_qp->get() : nullptr;
}

void on_qp_disconnect(void* p, uint64_t serial);

// rdma_connect or rdma_accept with conn_param.qp_num and no QP of the id's own: that QP of
// this process is the one the id connects (librdmacm hands the number to the kernel, which
// finds the QP). rdma_cm owns its connection from now on; the placeholder peer of its RTR
// (kRdmaCmPlaceholderQpn) started no out-of-band handshake. EINVAL for a number that names
// no RC or UC QP of ours, or one that cannot be this id's (qp_cm_adopt).
int adopt_ext_qp(CmId* id, const rdma_conn_param* param) {
  if (id->id.qp || !param || !param->qp_num) return 0;
  std::optional<sv::engine::QpRef> ref = sv::engine::oob::lookup_ref(param->qp_num);
  if (!ref) return EINVAL;
  if (int e = sv::engine::qp_cm_adopt(ref->get(), id, id->serial, on_qp_disconnect)) return e;
  std::lock_guard reg(g_live.get().mu);
  if (!id->ext_qp || id->ext_qp->get() != ref->get()) id->ext_qp.emplace(std::move(*ref));
  return 0;
}

// The MPA exchange completed: the engine moves the QP through RTR to RTS with the
// negotiated resources (qp_state.h). False if the application moved the QP to ERR or RESET
// meanwhile: as siw refuses RTS then, the connection fails.
bool qp_connect(CmId* id, Endpoint* ep) {
  uint8_t timeout;
  {
    std::lock_guard lk(id->mu);  // rdma_set_option may run on the application's thread
    timeout = id->ack_timeout;
  }
  Qp* qp = conn_qp(id);
  return qp && qp_cm_established(qp, ep, timeout);
}

// The QP refused the connection (qp_connect): the socket closes, so the peer sees it end,
// and the id is told with librdmacm's event for a failed establishment.
void connect_failed(CmId* id, Endpoint* ep) {
  {
    std::lock_guard lk(id->mu);
    id->connected = false;
  }
  ep->dispose();
  queue_event(id, RDMA_CM_EVENT_CONNECT_ERROR, -EINVAL);
}

void on_qp_disconnect(void* p, uint64_t serial) {
  auto* id = static_cast<CmId*>(p);
  bool fire = false;
  std::lock_guard reg(g_live.get().mu);
  if (!alive(id) || id->serial != serial) return;  // gone, maybe replaced at its address
  {
    std::lock_guard lk(id->mu);
    if (id->connected && !id->disconnected) {
      id->disconnected = true;
      fire = true;
    }
  }
  if (fire) queue_event(id, RDMA_CM_EVENT_DISCONNECTED, 0);
}

void on_passive_done(Endpoint* ep, int err) {
  auto* child = static_cast<CmId*>(ep->user);
  std::lock_guard reg(g_live.get().mu);
  if (!alive(child, ep->user_serial)) {
    ep->dispose();
    return;
  }
  if (err) {
    bool accepted;
    {
      std::lock_guard lk(child->mu);
      child->ep = nullptr;
      accepted = child->accepted;
    }
    ep->dispose();
    // An accepted connection that failed before it was established (the Reply could not be
    // sent, the peer went): the application hears of it, as rdma_cm reports a passive
    // side's failed establishment; a synchronous rdma_accept returns its error.
    if (accepted) queue_event(child, RDMA_CM_EVENT_CONNECT_ERROR, err > 0 ? -err : err);
    return;
  }
  {
    std::lock_guard lk(child->mu);
    child->ep = nullptr;
    child->connected = true;
  }
  if (conn_qp(child) && !qp_connect(child, ep)) {
    connect_failed(child, ep);
    return;
  }
  ep->dispose();
  queue_event(child, RDMA_CM_EVENT_ESTABLISHED, 0);
}

void on_passive_request(Endpoint* ep) {
  auto* lid = static_cast<CmId*>(ep->user);
  std::lock_guard reg(g_live.get().mu);
  if (!alive(lid, ep->user_serial) || !lid->listener) {
    ep->reject({});
    return;
  }
  if (lid->reqs_queued.load() >= lid->reqs_backlog) {  // the backlog is full: refused
    ep->reject({});
    return;
  }
  lid->reqs_queued.fetch_add(1);
  auto* child = new CmId();
  child->id.channel = lid->id.channel;
  child->id.context = lid->id.context;
  child->id.ps = lid->id.ps;
  child->id.qp_type = IBV_QPT_RC;
  child->id.pd = lid->id.pd;
  attach_device(&child->id);
  child->ep = ep;
  g_live.get().ids.push_back(child);
  set_src(child, sv::transport::local_addr(ep->fd()));
  set_dst(child, sv::transport::peer_addr(ep->fd()));
  const auto& o = ep->outcome();
  // iw_cm convention: the peer's ORD is what we must serve (responder_resources), its
  // IRD bounds what we may issue (initiator_depth).
  child->resp_res = static_cast<uint8_t>(std::min<uint16_t>(o.peer_ord, kMaxRdAtom));
  child->init_depth = static_cast<uint8_t>(std::min<uint16_t>(o.peer_ird, kMaxRdAtom));
  ep->user = child;
  ep->user_serial = child->serial;
  queue_event(lid, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &o.peer_pdata, &child->id, child->resp_res,
              child->init_depth);
}

void Listener::on_event(uint32_t) {
  Endpoint::accept_batch(fd, this, [this](int c) {
    Endpoint* ep = Endpoint::passive(c, on_passive_request, on_passive_done);
    ep->user = id;
    ep->user_serial = id->serial;
  });
}

int fail(int e) {
  errno = e;
  return -1;
}

// Synchronous ids (NULL channel): wait for the next event of this id and ack it.
int sync_wait(CmId* id, rdma_cm_event_type want) {
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(id->id.channel, &ev)) return -1;
  const bool ok = ev->event == want && ev->status == 0;
  const int st = ev->status;
  rdma_ack_cm_event(ev);
  if (!ok) return fail(st ? -st : ECONNREFUSED);
  return 0;
}

// ---- RDMA_PS_UDP: SIDR over UDP -------------------------------------------------------------
// rdma_cm's UD "connection" is IB's service ID resolution (IBA 12.11): rdma_connect sends a
// SIDR REQ with the ULP's private data to the listener's port; rdma_accept answers with a
// SIDR REP naming the QPN and Q_Key to send to, and the requester gets ESTABLISHED with an
// rdma_ud_param (AH attributes, QPN, Q_Key). The passive side gets no event after accepting.
// Nothing stays connected: the QPs exchange datagrams (engine/qp_ud.cc). We carry the two
// messages in UDP datagrams (wire/ud.h); the rdma_cm port is the UDP port.
constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY, librdmacm's Q_Key for PS_UDP
constexpr int kSidrTries = 8;              // REQ retransmissions before UNREACHABLE
constexpr auto kSidrRetry = std::chrono::milliseconds(250);
// Requests a listener remembers: those still waiting for the application (at most its
// backlog, itself at most this) and recent answers, for retransmitted REQs. A flood of
// distinct requests beyond the backlog is dropped, as a full listen backlog drops SYNs.
constexpr size_t kSidrAnswered = 64;

struct SidrSock : Progress::Handler {
  CmId* id = nullptr;
  int fd = -1;
  bool passive = false;
  size_t backlog = kSidrAnswered;  // passive: pending requests allowed
  // active: the request, resent until a reply or kSidrTries
  std::vector<std::byte> req;
  uint32_t req_id = 0;
  int tries = 0;
  bool done = false;
  // passive: requests whose child is still deciding, and recent answers
  struct Seen {
    SockAddr from;
    uint32_t req_id;
    std::vector<std::byte> rep;  // empty while pending
  };
  std::deque<Seen> seen;
  void on_event(uint32_t) override;
};

bool same_addr(const SockAddr& a, const SockAddr& b) {
  return a.len == b.len && std::memcmp(&a.ss, &b.ss, a.len) == 0;
}

// The AH attributes that reach `peer` from this device (GID of our source address).
ibv_ah_attr ah_toward(const SockAddr& src, const SockAddr& peer) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.dgid = addr_to_gid(peer);
  a.grh.hop_limit = 64;
  const ibv_gid mine = addr_to_gid(src);
  const Device* d = the_device();
  for (size_t i = 0; i < d->gids.size(); ++i)
    if (std::memcmp(d->gids[i].raw, mine.raw, 16) == 0) a.grh.sgid_index = static_cast<uint8_t>(i);
  return a;
}

void sidr_finish(SidrSock* s, rdma_cm_event_type type, int status, const wire::Sidr* rep) {
  // Called with g_live.get().mu held and s->id alive.
  s->done = true;
  CmId* id = s->id;
  if (type != RDMA_CM_EVENT_ESTABLISHED) {
    queue_event(id, type, status);
    return;
  }
  std::vector<std::byte> pd(rep->pdata, rep->pdata + rep->pdata_len);
  rdma_ud_param ud{};
  ud.ah_attr = ah_toward(id_src(id), id_dst(id));
  ud.qp_num = rep->qpn;
  ud.qkey = rep->qkey;
  {
    std::lock_guard lk(id->mu);
    id->connected = true;
  }
  queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &pd, nullptr, 0, 0, &ud);
}

// RDMA_PS_UDP set-up messages go under SOFTVERBS_FAULT's datagram rules as the QPs' own
// datagrams do (docs/fault-injection.md): one frame count for the process's set-up
// messages, as if one QP sent them all, and the firings in the process's totals.
struct SidrFaults {
  std::mutex mu;
  sv::engine::fault::QpFaults f{0, ~uint64_t{0}};
};
SidrFaults* sidr_faults() {
  static SidrFaults* sf = sv::engine::fault::active() ? new SidrFaults() : nullptr;
  return sf;
}

bool sidr_fault(sv::engine::fault::FaultDir dir, const SockAddr& peer,
                sv::engine::fault::Fired& fx) {
  SidrFaults* sf = sidr_faults();
  if (!sf) return false;
  {
    std::lock_guard lk(sf->mu);
    if (!sf->f.on_frame(dir, true, fx, &peer)) return false;
  }
  sv::engine::stats::add_retired(sv::engine::fault::counter_of(fx.action));
  return true;
}

// Sends one set-up message on fd, to `to` (or, with none, to the socket's peer): lost,
// twice or late if a fault rule says so. The requester retries a lost REQ; a lost REP is
// answered again when the REQ comes again (sidr_on_request). False, with errno, if the
// socket refused it (a fault's loss is no error: UD is unreliable).
bool sidr_send(int fd, const std::vector<std::byte>& msg, const SockAddr* to) {
  int copies = 1;
  sv::engine::fault::Fired fx;
  if (sidr_fault(sv::engine::fault::FaultDir::tx, to ? *to : sv::transport::peer_addr(fd), fx)) {
    using sv::engine::fault::FaultAction;
    if (fx.action == FaultAction::drop) return true;
    if (fx.action == FaultAction::dup) copies = 2;
    if (fx.action == FaultAction::delay) {
      // Its own descriptor: the answering id closes its reply socket right after this.
      const int late = fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (late < 0) return false;
      SockAddr dst;
      if (to) dst = *to;
      Progress::get().post_after(std::chrono::milliseconds(fx.ms), [late, msg, dst] {
        if (dst.len)
          (void)!sendto(late, msg.data(), msg.size(), MSG_DONTWAIT,
                        reinterpret_cast<const sockaddr*>(&dst.ss), dst.len);
        else
          (void)!send(late, msg.data(), msg.size(), MSG_DONTWAIT);
        close(late);
      });
      return true;
    }
  }
  ssize_t n = 0;
  for (int i = 0; i < copies; ++i) {
    n = to ? sendto(fd, msg.data(), msg.size(), MSG_DONTWAIT,
                    reinterpret_cast<const sockaddr*>(&to->ss), to->len)
           : send(fd, msg.data(), msg.size(), MSG_DONTWAIT);
  }
  return n >= 0;
}

void sidr_on_request(SidrSock* s, const wire::Sidr& m, const SockAddr& from) {
  for (auto& seen : s->seen) {
    if (seen.req_id != m.req_id || !same_addr(seen.from, from)) continue;
    // A retransmission: answer again, or keep waiting for the application.
    if (!seen.rep.empty()) (void)sidr_send(s->fd, seen.rep, &from);
    return;
  }
  // Room: forget the oldest answered request; with none to forget, or the backlog full of
  // undecided ones, drop this request (the requester retries, then gives up).
  size_t pending = 0;
  for (const auto& seen : s->seen) pending += seen.rep.empty();
  if (pending >= s->backlog) return;
  if (s->seen.size() >= kSidrAnswered) {
    auto old = std::find_if(s->seen.begin(), s->seen.end(),
                            [](const SidrSock::Seen& x) { return !x.rep.empty(); });
    if (old == s->seen.end()) return;
    s->seen.erase(old);
  }
  CmId* lid = s->id;
  auto* child = new CmId();
  child->id.channel = lid->id.channel;
  child->id.context = lid->id.context;
  child->id.ps = RDMA_PS_UDP;
  child->id.qp_type = IBV_QPT_UD;
  child->id.pd = lid->id.pd;
  attach_device(&child->id);
  child->sidr_reply_fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
  child->sidr_peer = from;
  child->sidr_req_id = m.req_id;
  g_live.get().ids.push_back(child);
  SockAddr src = sv::transport::local_addr(s->fd);
  // A wildcard listener: the address the requester reached is the one routed back from.
  if (is_any(src)) route_source(from, src.port(), src);
  set_src(child, src);
  set_dst(child, from);
  s->seen.push_back({from, m.req_id, {}});
  std::vector<std::byte> pd(m.pdata, m.pdata + m.pdata_len);
  rdma_ud_param ud{};
  queue_event(lid, RDMA_CM_EVENT_CONNECT_REQUEST, 0, &pd, &child->id, 0, 0, &ud);
}

void SidrSock::on_event(uint32_t) {
  std::lock_guard reg(g_live.get().mu);
  for (;;) {
    std::array<std::byte, wire::kSidrHdrLen + wire::kSidrReqMaxPrivData + 1> buf;
    sockaddr_storage from{};
    socklen_t flen = sizeof from;
    const ssize_t n = recvfrom(fd, buf.data(), buf.size(), MSG_DONTWAIT,
                               reinterpret_cast<sockaddr*>(&from), &flen);
    if (n < 0) {
      // A connected requester socket learns of a closed port (ICMP): no such service.
      if (errno == ECONNREFUSED && !passive && !done && alive(id))
        sidr_finish(this, RDMA_CM_EVENT_UNREACHABLE, wire::kSidrUnsupported, nullptr);
      if (errno == EINTR || errno == ECONNREFUSED) continue;
      return;
    }
    if (!alive(id) || done) continue;
    wire::Sidr m;
    if (!wire::decode_sidr(buf.data(), static_cast<size_t>(n), m)) continue;  // not ours
    const SockAddr src = SockAddr::from(reinterpret_cast<sockaddr*>(&from));
    sv::engine::fault::Fired fx;
    if (sidr_fault(sv::engine::fault::FaultDir::rx, src, fx)) continue;  // drop on the way in
    if (passive && m.kind == wire::SidrKind::req) {
      sidr_on_request(this, m, src);
    } else if (!passive && m.kind == wire::SidrKind::rep && m.req_id == req_id) {
      if (m.status == wire::kSidrSuccess)
        sidr_finish(this, RDMA_CM_EVENT_ESTABLISHED, 0, &m);
      else
        sidr_finish(this, RDMA_CM_EVENT_UNREACHABLE, m.status, nullptr);
    }
  }
}

void sidr_retry(CmId* id, SidrSock* s) {
  Progress::get().post_after(kSidrRetry, [id, s, serial = id->serial] {
    std::lock_guard reg(g_live.get().mu);
    if (!alive(id, serial) || id->sidr != s || s->done) return;
    if (++s->tries >= kSidrTries) {
      sidr_finish(s, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, nullptr);
      return;
    }
    (void)sidr_send(s->fd, s->req, nullptr);
    sidr_retry(id, s);
  });
}

// Unregisters and frees an id's SIDR socket (progress thread).
void sidr_close(CmId* id) {
  Progress::get().run_sync([id] {
    if (!id->sidr) return;
    Progress::get().del(id->sidr->fd);
    close(id->sidr->fd);
    delete id->sidr;
    id->sidr = nullptr;
  });
}

// Private data an MPA v2 Request or Reply carries whole: siw's 256 bytes less the word of
// IRD/ORD in front of it. More is EINVAL, as a provider refuses it, rather than data cut short.
bool pdata_fits(const rdma_conn_param* param) {
  return !param || !param->private_data ||
         param->private_data_len <= sv::wire::kMpaSiwMaxPrivData - sv::wire::kMpaV2WordLen;
}

int sidr_connect(CmId* id, const rdma_conn_param* param) {
  if (id->sidr || id->connected) return fail(EISCONN);
  // More than a SIDR REQ carries beside rdma_cm's header: EINVAL (ib_send_cm_sidr_req), not
  // data cut short.
  if (param && param->private_data && param->private_data_len > wire::kSidrReqMaxPrivData)
    return fail(EINVAL);
  const SockAddr dst = id_dst(id);
  if (!dst.len) return fail(EINVAL);
  const int fd = sv::raw_socket(dst.family(), SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  const SockAddr src = id_src(id);
  if (src.len && !is_any(src)) {
    SockAddr b = src;
    b.set_port(0);
    if (bind(fd, reinterpret_cast<const sockaddr*>(&b.ss), b.len) != 0) {
      const int e = errno;
      close(fd);
      return fail(e);
    }
  }
  // Connected, so a closed port comes back as ECONNREFUSED.
  if (connect(fd, reinterpret_cast<const sockaddr*>(&dst.ss), dst.len) != 0) {
    const int e = errno;
    close(fd);
    return fail(e);
  }
  auto* s = new SidrSock();
  s->id = id;
  s->fd = fd;
  wire::Sidr m;
  m.kind = wire::SidrKind::req;
  m.req_id = static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
             static_cast<uint32_t>(reinterpret_cast<uintptr_t>(id));
  if (param && param->private_data && param->private_data_len) {
    m.pdata = static_cast<const std::byte*>(param->private_data);
    m.pdata_len =
        static_cast<uint8_t>(std::min<size_t>(param->private_data_len, wire::kSidrReqMaxPrivData));
  }
  s->req_id = m.req_id;
  s->req.resize(wire::kSidrHdrLen + m.pdata_len);
  s->req.resize(wire::encode_sidr(m, s->req.data()));
  const bool sync = id->sync;
  {
    std::lock_guard reg(g_live.get().mu);
    id->sidr = s;
  }
  Progress::get().run_sync([s] { Progress::get().add(s->fd, EPOLLIN, s); });
  (void)sidr_send(fd, s->req, nullptr);
  sidr_retry(id, s);
  return sync ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

// rdma_accept / rdma_reject of a UD request: one SIDR REP.
int sidr_answer(CmId* id, uint8_t status, uint32_t qpn, uint32_t qkey, const void* pdata,
                size_t pdata_len) {
  if (id->sidr_reply_fd < 0) return fail(EINVAL);
  if (pdata && pdata_len > wire::kSidrRepMaxPrivData) return fail(EINVAL);  // sidr_rep's
  wire::Sidr m;
  m.kind = wire::SidrKind::rep;
  m.status = status;
  m.req_id = id->sidr_req_id;
  m.qpn = qpn;
  m.qkey = qkey;
  m.pdata = static_cast<const std::byte*>(pdata);
  m.pdata_len = static_cast<uint8_t>(std::min(pdata_len, wire::kSidrRepMaxPrivData));
  std::vector<std::byte> rep(wire::kSidrHdrLen + m.pdata_len);
  rep.resize(wire::encode_sidr(m, rep.data()));
  const SockAddr to = id->sidr_peer;
  const bool sent = sidr_send(id->sidr_reply_fd, rep, &to);
  const int send_err = errno;
  // Remembered by the listener, if it is still there, for a retransmitted REQ.
  std::lock_guard reg(g_live.get().mu);
  for (CmId* l : g_live.get().ids) {
    if (!l->sidr || !l->sidr->passive) continue;
    for (auto& seen : l->sidr->seen)
      if (seen.req_id == id->sidr_req_id && same_addr(seen.from, to)) seen.rep = rep;
  }
  close(id->sidr_reply_fd);  // one answer per request, delivered or not (UD is unreliable)
  id->sidr_reply_fd = -1;
  return sent ? 0 : fail(send_err);
}

}  // namespace

// ---- event channels -------------------------------------------------------------------

SV_EXPORT rdma_event_channel* rdma_create_event_channel(void) {
  if (!g_verbs()) return errno = ENODEV, nullptr;
  auto* c = new (std::nothrow) Channel();
  if (!c) return errno = ENOMEM, nullptr;
  if (c->events.open() < 0) {
    delete c;
    return nullptr;
  }
  c->ch.fd = c->events.fd();
  return &c->ch;
}

SV_EXPORT void rdma_destroy_event_channel(rdma_event_channel* channel) {
  Channel* c = chan(channel);
  c->events.close_fd();
  for (auto* e : c->events.drain()) delete e;
  delete c;
}

// The id an event is counted against until it is acked: the listener for a connect request
// (librdmacm acks it on the listen id, evt->id_priv, as the kernel reports it on the listen
// context), else the event's id. So a program may reject and destroy the new id before it
// acks the request (cmtime does) without waiting for itself.
CmId* event_owner(const CmEvent* e) {
  return cmid(e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.listen_id ? e->ev.listen_id
                                                                              : e->ev.id);
}

SV_EXPORT int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  for (;;) {
    CmEvent* e = nullptr;
    // errno from read (EAGAIN, EINTR)
    if (chan(channel)->events.pop(e, [](CmEvent* t) {
          CmId* owner = event_owner(t);
          owner->outstanding.fetch_add(1);
          if (t->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && t->ev.listen_id)
            owner->reqs_queued.fetch_sub(1);  // its place in the backlog is free again
        }))
      return -1;
    rdma_cm_id* child = e->ev.id;
    // A synchronous listener's new id is synchronous too, on a channel of its own, however
    // its request is read (librdmacm's ucma_process_conn_req migrates it to a new channel).
    // On the listener's private channel, it would lose that channel to the listener's
    // rdma_migrate_id or destroy. If no channel can be made, the request is refused and
    // the next event read, as librdmacm does.
    if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.listen_id &&
        cmid(e->ev.listen_id)->sync && !cmid(child)->sync && rdma_migrate_id(child, nullptr)) {
      // The new id goes before the ack, as librdmacm frees it before completing the event:
      // the ack lets a waiting destroy or migrate of the listener free the channel the new
      // id is still on.
      rdma_reject(child, nullptr, 0);
      rdma_destroy_id(child);
      rdma_ack_cm_event(&e->ev);
      continue;
    }
    *event = &e->ev;
    return 0;
  }
}

SV_EXPORT int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  auto* e = reinterpret_cast<CmEvent*>(event);
  CmId* id = event_owner(e);
  {
    // Notify under the lock: rdma_destroy_id may free the id as soon as it sees zero.
    std::lock_guard lk(id->mu);
    --id->outstanding;
    id->cv.notify_all();
  }
  delete e;
  return 0;
}

SV_EXPORT const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE:
      return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR:
      return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
    default:
      return "UNKNOWN EVENT";
  }
}

// ---- ids ------------------------------------------------------------------------------

SV_EXPORT int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context,
                             rdma_port_space ps) {
  if (!out) return fail(EINVAL);
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_IB && ps != RDMA_PS_UDP) return fail(EPROTONOSUPPORT);
  auto* id = new (std::nothrow) CmId();
  if (!id) return fail(ENOMEM);
  if (!channel) {
    channel = rdma_create_event_channel();
    if (!channel) {
      delete id;
      return -1;
    }
    id->sync = true;
    id->own_channel = chan(channel);
  }
  id->id.channel = channel;
  id->id.context = context;
  id->id.ps = ps;
  id->id.qp_type = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
  {
    std::lock_guard reg(g_live.get().mu);
    g_live.get().ids.push_back(id);
  }
  *out = &id->id;
  return 0;
}

SV_EXPORT int rdma_destroy_id(rdma_cm_id* i) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  Endpoint* passive_ep = nullptr;
  {
    // Under g_live.get().mu the connect completion cannot be disposing of id->ep: it takes this
    // lock, and once the id is out of g_live.get().ids it disposes of an active endpoint itself. So
    // take the endpoint now; reading id->ep after the erase raced with that dispose (use after
    // free).
    std::lock_guard reg(g_live.get().mu);
    g_live.get().ids.erase(std::remove(g_live.get().ids.begin(), g_live.get().ids.end(), id),
                           g_live.get().ids.end());
    std::lock_guard lk(id->mu);
    // A passive endpoint still waiting for accept/reject is refused here; once accepted, its
    // completion (on_passive_done) finds the id gone and disposes of it.
    if (id->ep && id->ep->role() == Endpoint::Role::passive && !id->accepted) passive_ep = id->ep;
    id->ep = nullptr;
  }
  // Out of g_live, no more events are queued for it. Those queued but never retrieved die with
  // it; a listener's connect requests take their new ids with them (refused, as the kernel's
  // ucma_cleanup_ctx_events destroys a closing listener's pending requests).
  std::vector<rdma_cm_id*> orphans;
  for (auto* e : chan(id->id.channel)->events.take_if([i](CmEvent* e) {
         return e->ev.id == i ||
                (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.listen_id == i);
       })) {
    if (e->ev.id != i) orphans.push_back(e->ev.id);
    delete e;
  }
  for (rdma_cm_id* child : orphans) rdma_destroy_id(child);
  {
    // librdmacm: destroy waits until the events handed out have been acknowledged. After the
    // purge: an event taken meanwhile was counted under the queue's lock, before it.
    std::unique_lock lk(id->mu);
    id->cv.wait(lk, [id] { return id->outstanding.load() == 0; });
  }
  Progress::get().run_sync([id] {
    if (id->listener) {
      Endpoint::listener_closed(id->listener->fd);
      Progress::get().del(id->listener->fd);
      close(id->listener->fd);
      delete id->listener;
      id->listener = nullptr;
    }
  });
  if (id->bound_fd >= 0) close(id->bound_fd);
  sidr_close(id);
  // A UD request destroyed undecided is rejected, as the kernel's cma does; that also frees
  // its place in the listener's backlog.
  if (id->sidr_reply_fd >= 0) sidr_answer(id, wire::kSidrReject, 0, 0, nullptr, 0);
  // An active handshake still running finds the id gone and disposes of itself; a
  // passive one waiting for accept/reject is refused.
  if (passive_ep) passive_ep->reject({});
  if (id->own_channel) rdma_destroy_event_channel(&id->own_channel->ch);
  delete id;
  return 0;
}

SV_EXPORT int rdma_bind_addr(rdma_cm_id* i, sockaddr* addr) {
  if (!i || !addr || !sa_len(addr)) return fail(EINVAL);
  CmId* id = cmid(i);
  if (id->bound_fd >= 0 || id->listener || id->sidr) return fail(EINVAL);
  SockAddr a = SockAddr::from(addr);
  // The rdma_cm port is a TCP port (iWARP) or, for RDMA_PS_UDP, a UDP port (SIDR).
  const int type = i->ps == RDMA_PS_UDP ? SOCK_DGRAM : SOCK_STREAM;
  int fd = sv::raw_socket(a.family(), type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int one = 1;
  // RDMA_PS_TCP ports have no TIME_WAIT: perftest -R re-listens on the port at once.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (a.family() == AF_INET6) {
    int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&a.ss), a.len) < 0) {
    int e = errno;
    close(fd);
    return fail(e);
  }
  id->bound_fd = fd;
  set_src(id, sv::transport::local_addr(fd));
  if (!is_any(a)) attach_device(&id->id);
  return 0;
}

SV_EXPORT int rdma_listen(rdma_cm_id* i, int backlog) {
  CmId* id = cmid(i);
  qp_flush_deferred_all();  // this thread answers nothing on a QP now (qp.h)
  if (id->bound_fd < 0) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (rdma_bind_addr(i, reinterpret_cast<sockaddr*>(&any))) return -1;
  }
  if (i->ps == RDMA_PS_UDP) {
    auto* s = new SidrSock();
    s->id = id;
    s->fd = id->bound_fd;
    s->passive = true;
    s->backlog = backlog > 0 ? std::min<size_t>(backlog, kSidrAnswered) : kSidrAnswered;
    id->bound_fd = -1;
    {
      std::lock_guard reg(g_live.get().mu);
      id->sidr = s;
    }
    Progress::get().run_sync([s] { Progress::get().add(s->fd, EPOLLIN, s); });
    return 0;
  }
  // The TCP accept queue is not the application's backlog of CONNECT_REQUESTs: the progress
  // thread empties it as fast as handshakes allow (Endpoint::accept_batch), and one too
  // short drops SYNs, which costs the initiator a retransmit, 1 s and more (cmtime -c 2000
  // took 2.8 s with 128 here). So it is as deep as the kernel allows.
  if (listen(id->bound_fd, SOMAXCONN) < 0) return -1;
  // The application's backlog is what ucma allows: as asked, or its maximum (1024) for 0,
  // a negative value or more.
  id->reqs_backlog = backlog > 0 && backlog < 1024 ? backlog : 1024;
  auto* l = new Listener();
  l->id = id;
  l->fd = id->bound_fd;
  id->bound_fd = -1;
  id->listener = l;
  Progress::get().run_sync([l] { Progress::get().add(l->fd, EPOLLIN, l); });
  return 0;
}

SV_EXPORT int rdma_resolve_addr(rdma_cm_id* i, sockaddr* src, sockaddr* dst, int) {
  if (!i || !dst || !sa_len(dst)) return fail(EINVAL);
  qp_flush_deferred_all();  // this thread answers nothing on a QP now (qp.h)
  CmId* id = cmid(i);
  SockAddr d = SockAddr::from(dst);
  set_dst(id, d);
  if (src && sa_len(src)) {
    SockAddr s = SockAddr::from(src);
    set_src(id, s);
  } else if (SockAddr s; route_source(d, 0, s)) {
    set_src(id, s);  // the source the kernel would pick
  }
  attach_device(&id->id);
  const bool sync = id->sync;  // the event may be handled and the id destroyed at once
  queue_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  return sync ? sync_wait(id, RDMA_CM_EVENT_ADDR_RESOLVED) : 0;
}

// ---- multicast ------------------------------------------------------------------------
// IP multicast underneath (engine/qp_ud.cc): a group is its IP address, and joining is
// attaching the id's UD QP, at once (librdmacm attaches when the join event is read), then
// RDMA_CM_EVENT_MULTICAST_JOIN with the group's AH, QPN 0xFFFFFF and the port space's Q_Key.
// The MGID is RoCEv2's: ::ffff:a.b.c.d for an IPv4 group, the address for an IPv6 one.

static int join_multicast(CmId* id, const sockaddr* addr, uint16_t flags, void* context) {
  const socklen_t len = sa_len(addr);
  if (!len) return fail(EINVAL);
  // The kernel's cma: the id must be bound to the device (bound or resolved).
  if (!id->id.verbs) return fail(EINVAL);
  SockAddr group = SockAddr::from(addr);
  const ibv_gid mgid = addr_to_gid(group);
  if (!gid_is_multicast(mgid)) return fail(EINVAL);
  CmId::McJoin j;
  std::memcpy(&j.addr, addr, len);
  j.len = len;
  j.mgid = mgid;
  int err = 0;
  {
    std::lock_guard lk(id->mc_mu);
    for (const auto& o : id->mc)
      if (o.len == len && std::memcmp(&o.addr, addr, len) == 0) return fail(EADDRINUSE);
    if (id->id.qp && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
      err = ibv_attach_mcast(id->id.qp, &mgid, 0);
      j.attached = err == 0;
    }
    id->mc.push_back(j);
  }
  if (err) {
    // librdmacm turns a failed attach into this event.
    queue_event(id, RDMA_CM_EVENT_MULTICAST_ERROR, -err);
    return 0;
  }
  rdma_ud_param ud{};
  ud.ah_attr = ah_toward(id_src(id), group);
  ud.ah_attr.grh.dgid = mgid;
  ud.private_data = context;  // librdmacm hands the join's context back here
  ud.qp_num = kMcastQpn;
  ud.qkey = kUdpQkey;
  queue_event(id, RDMA_CM_EVENT_MULTICAST_JOIN, 0, nullptr, nullptr, 0, 0, &ud);
  return 0;
}

SV_EXPORT int rdma_join_multicast(rdma_cm_id* i, sockaddr* addr, void* context) {
  if (!i || !addr) return fail(EINVAL);
  return join_multicast(cmid(i), addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context);
}

SV_EXPORT int rdma_join_multicast_ex(rdma_cm_id* i, rdma_cm_join_mc_attr_ex* a, void* context) {
  if (!i || !a) return fail(EINVAL);
  if (a->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) return fail(ENOTSUP);
  if (!(a->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) || !a->addr) return fail(EINVAL);
  if (!(a->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
      a->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
    return fail(EINVAL);
  return join_multicast(cmid(i), a->addr, static_cast<uint16_t>(a->join_flags), context);
}

SV_EXPORT int rdma_leave_multicast(rdma_cm_id* i, sockaddr* addr) {
  if (!i || !addr) return fail(EINVAL);
  const socklen_t len = sa_len(addr);
  if (!len) return fail(EINVAL);
  CmId* id = cmid(i);
  ibv_gid mgid{};
  bool attached = false;
  std::lock_guard lk(id->mc_mu);
  auto it = std::find_if(id->mc.begin(), id->mc.end(), [&](const CmId::McJoin& o) {
    return o.len == len && std::memcmp(&o.addr, addr, len) == 0;
  });
  if (it == id->mc.end()) return fail(EADDRNOTAVAIL);  // librdmacm: no such join
  mgid = it->mgid;
  attached = it->attached;
  id->mc.erase(it);
  if (attached && i->qp) ibv_detach_mcast(i->qp, &mgid, 0);
  return 0;
}

SV_EXPORT int rdma_resolve_route(rdma_cm_id* i, int) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  if (!id->id.verbs) return fail(EINVAL);
  // iWARP has no path records: TCP routes the connection.
  const bool sync = id->sync;  // the event may be handled and the id destroyed at once
  queue_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  return sync ? sync_wait(id, RDMA_CM_EVENT_ROUTE_RESOLVED) : 0;
}

// ---- QPs ------------------------------------------------------------------------------

// id->id.qp changes under the registry lock: the connection callbacks read it under that
// lock on the progress thread (on_passive_done, rdma_connect's completion).
static void publish_qp(CmId* id, ibv_qp* qp) {
  std::lock_guard reg(g_live.get().mu);
  id->id.qp = qp;
  id->id.pd = qp->pd;  // librdmacm's rdma_create_qp_ex: the id's PD is its QP's
}

SV_EXPORT int rdma_create_qp_ex(rdma_cm_id* i, ibv_qp_init_attr_ex* attr) {
  if (!i || !attr) return fail(EINVAL);
  CmId* id = cmid(i);
  if (id->id.qp) return fail(EINVAL);
  if (!id->id.verbs) id->id.verbs = g_verbs();
  ibv_pd* pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) && attr->pd ? attr->pd : id->id.pd;
  if (!pd) pd = g_shared_ctx.get().default_pd();  // librdmacm: the device's default PD
  if (!pd) return fail(ENOMEM);
  if (!id->id.pd) id->id.pd = pd;
  if (attr->comp_mask & ~(IBV_QP_INIT_ATTR_PD)) return fail(EOPNOTSUPP);
  ibv_qp_init_attr init{};
  init.qp_context = attr->qp_context;
  init.send_cq = attr->send_cq;
  init.recv_cq = attr->recv_cq;
  init.srq = attr->srq ? attr->srq : id->id.srq;
  init.cap = attr->cap;
  init.qp_type = attr->qp_type;
  init.sq_sig_all = attr->sq_sig_all;
  // librdmacm creates CQs and completion channels the caller did not supply.
  if (!init.send_cq || !init.recv_cq) {
    if (!init.recv_cq) {
      id->id.recv_cq_channel = ibv_create_comp_channel(id->id.verbs);
      id->id.recv_cq = ibv_create_cq(id->id.verbs, std::max<int>(attr->cap.max_recv_wr, 1), id,
                                     id->id.recv_cq_channel, 0);
      init.recv_cq = id->id.recv_cq;
    }
    if (!init.send_cq) {
      id->id.send_cq_channel = ibv_create_comp_channel(id->id.verbs);
      id->id.send_cq = ibv_create_cq(id->id.verbs, std::max<int>(attr->cap.max_send_wr, 1), id,
                                     id->id.send_cq_channel, 0);
      init.send_cq = id->id.send_cq;
    }
  }
  ibv_qp* qp = ibv_create_qp(pd, &init);
  if (!qp) return -1;
  attr->cap = init.cap;
  qp_cm_bind(Qp::from(qp), id, id->serial, on_qp_disconnect);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  if (init.qp_type == IBV_QPT_UD) {
    // librdmacm's ucma_init_ud_qp: INIT with the port space's Q_Key, then RTR and RTS; the
    // QP is ready to send and receive as soon as it exists.
    a.qkey = kUdpQkey;
    int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
    a.qp_state = IBV_QPS_RTR;
    if (!e) e = ibv_modify_qp(qp, &a, IBV_QP_STATE);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    if (!e) e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
    if (e) {
      ibv_destroy_qp(qp);
      return fail(e);
    }
    publish_qp(id, qp);
    return 0;
  }
  // iw_cm_init_qp_attr grants remote read and write; we also offer atomics.
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                      IBV_ACCESS_LOCAL_WRITE;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    return fail(e);
  }
  publish_qp(id, qp);
  return 0;
}

SV_EXPORT int rdma_create_qp(rdma_cm_id* i, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!i || !qp_init_attr) return fail(EINVAL);
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = qp_init_attr->qp_context;
  ex.send_cq = qp_init_attr->send_cq;
  ex.recv_cq = qp_init_attr->recv_cq;
  ex.srq = qp_init_attr->srq;
  ex.cap = qp_init_attr->cap;
  ex.qp_type = qp_init_attr->qp_type;
  ex.sq_sig_all = qp_init_attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  int r = rdma_create_qp_ex(i, &ex);
  if (r == 0) {
    qp_init_attr->cap = ex.cap;
    qp_init_attr->send_cq = i->qp->send_cq;
    qp_init_attr->recv_cq = i->qp->recv_cq;
  }
  return r;
}

SV_EXPORT void rdma_destroy_qp(rdma_cm_id* i) {
  if (!i || !i->qp) return;
  {
    // The groups rdma_cm attached the QP to let go of it first: an attached QP is busy
    // (ibv_destroy_qp would say EBUSY and leave it behind).
    CmId* id = cmid(i);
    std::lock_guard lk(id->mc_mu);  // not mu: see CmId::mc_mu
    for (auto& j : id->mc)
      if (j.attached && ibv_detach_mcast(i->qp, &j.mgid, 0) == 0) j.attached = false;
  }
  ibv_qp* qp = nullptr;
  {
    // Unpublished before it is destroyed. A connection that completes meanwhile (its
    // callback runs on the progress thread, under this lock) either finds no QP and leaves
    // the socket with the id, or hands the QP its socket before qp_destroy closes it. Read
    // after close_conn, the old pointer gave a dying QP a socket whose epoll registration
    // outlived it (a TSan-found use after free under rds_reliability's resets).
    std::lock_guard reg(g_live.get().mu);
    qp = i->qp;
    i->qp = nullptr;
  }
  qp_cm_unbind(Qp::from(qp));
  ibv_destroy_qp(qp);
  if (i->send_cq) {
    ibv_destroy_cq(i->send_cq);
    i->send_cq = nullptr;
  }
  if (i->send_cq_channel) {
    ibv_destroy_comp_channel(i->send_cq_channel);
    i->send_cq_channel = nullptr;
  }
  if (i->recv_cq) {
    ibv_destroy_cq(i->recv_cq);
    i->recv_cq = nullptr;
  }
  if (i->recv_cq_channel) {
    ibv_destroy_comp_channel(i->recv_cq_channel);
    i->recv_cq_channel = nullptr;
  }
}

// ---- connection -----------------------------------------------------------------------

SV_EXPORT int rdma_connect(rdma_cm_id* i, rdma_conn_param* param) {
  if (!i) return fail(EINVAL);
  qp_flush_deferred_all();  // this thread answers nothing on a QP now (qp.h)
  CmId* id = cmid(i);
  if (i->ps == RDMA_PS_UDP) return sidr_connect(id, param);
  if (id->ep || id->connected) return fail(EISCONN);
  SockAddr dst = id_dst(id);
  if (!dst.len) return fail(EINVAL);
  if (!pdata_fits(param)) return fail(EINVAL);
  if (int e = adopt_ext_qp(id, param)) return fail(e);
  MpaOffer o;
  o.crc = sv::engine::mpa_crc_wanted();
  o.ird = param ? param->responder_resources : 1;
  o.ord = param ? param->initiator_depth : 1;
  o.p2p = true;  // RFC 6581: ask for a Write RTR so either side may send first
  {
    std::lock_guard reg(g_live.get().mu);
    o.ib_completion = ib_completion_wanted(conn_qp(id));
  }
  if (param && param->private_data && param->private_data_len) {
    const auto* p = static_cast<const std::byte*>(param->private_data);
    o.pdata.assign(p, p + param->private_data_len);
  }
  SockAddr src = id_src(id);
  const SockAddr* from = (src.len && !is_any(src)) ? &src : nullptr;
  // Held across the assignment: the completion may run on the progress thread before
  // Endpoint::connect even returns, and it clears id->ep under this lock.
  std::unique_lock hold(id->mu);
  id->ep =
      Endpoint::connect(dst, from, std::move(o), [id, serial = id->serial](Endpoint* ep, int err) {
        std::lock_guard reg(g_live.get().mu);
        if (!alive(id, serial)) {  // destroyed while connecting (maybe replaced at its address)
          ep->dispose();
          return;
        }
        {
          std::lock_guard lk(id->mu);
          id->ep = nullptr;
        }
        if (err) {
          const auto& pd = ep->outcome().peer_pdata;
          if (err == -ECONNREFUSED)
            queue_event(id, RDMA_CM_EVENT_REJECTED, err, &pd);
          else
            queue_event(id, RDMA_CM_EVENT_UNREACHABLE, err);
          ep->dispose();
          return;
        }
        set_src(id, sv::transport::local_addr(ep->fd()));
        {
          std::lock_guard lk(id->mu);
          id->connected = true;
        }
        if (id->id.qp) {
          if (!qp_connect(id, ep)) {
            connect_failed(id, ep);
            return;
          }
          ep->dispose();
          queue_event(id, RDMA_CM_EVENT_ESTABLISHED, 0, &ep->outcome().peer_pdata);
        } else {
          std::lock_guard lk(id->mu);
          id->ep = ep;  // rdma_establish() or a later QP picks it up
          queue_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0, &ep->outcome().peer_pdata);
        }
      });
  const bool sync = id->sync;  // before unlocking: see rdma_accept
  // Without a QP of its own (none, or an external one) the id stops at CONNECT_RESPONSE and
  // the program finishes with rdma_establish; librdmacm's synchronous rdma_connect returns 0
  // on that event too (ucma_complete).
  const rdma_cm_event_type done =
      id->id.qp ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_CONNECT_RESPONSE;
  hold.unlock();
  return sync ? sync_wait(id, done) : 0;
}

SV_EXPORT int rdma_establish(rdma_cm_id* i) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  Endpoint* ep = nullptr;
  {
    std::lock_guard lk(id->mu);
    ep = id->ep;
    id->ep = nullptr;
  }
  bool ok = false;
  {
    std::lock_guard reg(g_live.get().mu);  // as the progress thread's callers of qp_connect
    if (!ep || !conn_qp(id)) {
      if (ep) {  // not connected: the endpoint stays for a later call
        std::lock_guard lk(id->mu);
        id->ep = ep;
      }
      return fail(EINVAL);
    }
    ok = qp_connect(id, ep);
  }
  ep->dispose();  // on failure the socket closes and the peer sees the connection end
  return ok ? 0 : fail(EINVAL);
}

SV_EXPORT int rdma_accept(rdma_cm_id* i, rdma_conn_param* param) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  if (i->ps == RDMA_PS_UDP) {
    // SIDR REP: the QPN to send to (the caller's, else the id's QP) and that QP's Q_Key.
    // librdmacm returns at once for UD: no ESTABLISHED on this side.
    uint32_t qpn = param && param->qp_num ? param->qp_num : (i->qp ? i->qp->qp_num : 0);
    uint32_t qkey = kUdpQkey;
    if (i->qp) qkey = Qp::from(i->qp)->attr.qkey;
    if (!qpn) return fail(EINVAL);
    return sidr_answer(id, wire::kSidrSuccess, qpn, qkey, param ? param->private_data : nullptr,
                       param && param->private_data ? param->private_data_len : 0);
  }
  Endpoint* ep = id->ep;
  if (!ep || ep->role() != Endpoint::Role::passive) return fail(EINVAL);
  if (!pdata_fits(param)) return fail(EINVAL);
  if (int e = adopt_ext_qp(id, param)) return fail(e);
  MpaOffer o;
  o.crc = sv::engine::mpa_crc_wanted();
  o.ird = param ? param->responder_resources : std::max<uint8_t>(id->resp_res, 1);
  o.ord = param ? param->initiator_depth : std::max<uint8_t>(id->init_depth, 1);
  {
    std::lock_guard reg(g_live.get().mu);
    o.ib_completion = ib_completion_wanted(conn_qp(id));
  }
  if (param && param->private_data && param->private_data_len) {
    const auto* p = static_cast<const std::byte*>(param->private_data);
    o.pdata.assign(p, p + param->private_data_len);
  }
  {
    std::lock_guard lk(id->mu);
    id->accepted = true;
  }
  // Read before the accept goes out: an asynchronous id may be established, disconnected
  // and destroyed by the application's event thread before this call returns (cmtime).
  const bool sync = id->sync;
  ep->accept(std::move(o));
  return sync ? sync_wait(id, RDMA_CM_EVENT_ESTABLISHED) : 0;
}

SV_EXPORT int rdma_reject(rdma_cm_id* i, const void* pdata, uint8_t len) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  if (i->ps == RDMA_PS_UDP) return sidr_answer(id, wire::kSidrReject, 0, 0, pdata, pdata ? len : 0);
  Endpoint* ep = id->ep;
  if (!ep || ep->role() != Endpoint::Role::passive) return fail(EINVAL);
  std::vector<std::byte> b;
  if (pdata && len)
    b.assign(static_cast<const std::byte*>(pdata), static_cast<const std::byte*>(pdata) + len);
  id->ep = nullptr;
  ep->reject(std::move(b));
  return 0;
}

SV_EXPORT int rdma_reject_ece(rdma_cm_id* i, const void* pdata, uint8_t len) {
  return rdma_reject(i, pdata, len);
}

SV_EXPORT int rdma_disconnect(rdma_cm_id* i) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  {
    std::lock_guard lk(id->mu);
    if (!id->connected) return fail(EINVAL);
  }
  // TCP close is the iWARP disconnect (siw sends no close message); the QP flushes.
  Qp* qp = nullptr;
  std::optional<sv::engine::QpRef> hold;  // an external QP stays allocated meanwhile
  {
    std::lock_guard reg(g_live.get().mu);
    qp = conn_qp(id);
    if (qp && !id->id.qp) hold.emplace(qp);
  }
  if (qp)
    qp_set_error(qp, IBV_WC_WR_FLUSH_ERR, false);
  else
    on_qp_disconnect(id, id->serial);
  return 0;
}

SV_EXPORT int rdma_notify(rdma_cm_id* i, ibv_event_type) {
  return i ? 0 : fail(EINVAL);
}

SV_EXPORT int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) return fail(EINVAL);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(listen->channel, &ev)) return -1;
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_cm_id* cid = ev->id;  // synchronous, as its listener, since rdma_get_cm_event
      rdma_ack_cm_event(ev);
      // rdma_create_ep(RAI_PASSIVE) with QP attributes: each request gets its QP (librdmacm).
      if (const ibv_qp_init_attr* proto = cmid(listen)->child_qp_attr.get()) {
        ibv_qp_init_attr a = *proto;
        if (rdma_create_qp(cid, listen->pd, &a)) {
          const int e = errno;
          rdma_reject(cid, nullptr, 0);
          rdma_destroy_id(cid);
          return fail(e);
        }
      }
      *id = cid;
      return 0;
    }
    rdma_ack_cm_event(ev);
  }
}

// ---- options, addresses, devices ----------------------------------------------------------

SV_EXPORT int rdma_set_option(rdma_cm_id* i, int level, int optname, void* optval, size_t optlen) {
  if (!i || !optval) return fail(EINVAL);
  if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT) {
    // librdmacm takes one byte; the kernel's rdma_set_ack_timeout only for RC ids (EINVAL
    // otherwise). A value past the 5-bit IB field would fail the QP's move to RTS: refused
    // here instead, where the caller can see it.
    if (optlen != sizeof(uint8_t) || i->qp_type != IBV_QPT_RC) return fail(EINVAL);
    const uint8_t t = *static_cast<const uint8_t*>(optval);
    if (t > 31) return fail(EINVAL);
    std::lock_guard lk(cmid(i)->mu);
    cmid(i)->ack_timeout = t;
    return 0;
  }
  if (level == RDMA_OPTION_ID || level == RDMA_OPTION_IB) {
    (void)optlen;
    return 0;  // TOS, REUSEADDR, AFONLY, IB_PATH: TCP already covers them
  }
  return fail(ENOSYS);
}

// librdmacm: the id moves to `channel` and becomes asynchronous; with a NULL channel it gets
// a channel of its own and becomes synchronous (the calls that wait for their event block).
// Events not yet retrieved move with it; those retrieved must be acked first (we wait, as
// librdmacm waits for events_completed == events_reported).
SV_EXPORT int rdma_migrate_id(rdma_cm_id* i, rdma_event_channel* channel) {
  if (!i) return fail(EINVAL);
  CmId* id = cmid(i);
  const bool to_sync = channel == nullptr;
  if (to_sync) {
    if (id->sync) return fail(EINVAL);
    channel = rdma_create_event_channel();
    if (!channel) return -1;
  }
  {
    std::unique_lock lk(id->mu);
    id->cv.wait(lk, [id] { return id->outstanding.load() == 0; });
  }
  Channel* old_own = id->own_channel;
  {
    // The progress thread queues this id's events holding this lock: none lands in the old
    // channel once the pending ones have moved.
    std::lock_guard reg(g_live.get().mu);
    // A listener's connect requests go with it (ucma_move_events), and so do their new ids:
    // left behind, they were counted against a listener that could be destroyed meanwhile.
    auto moving = chan(i->channel)->events.take_if([i](CmEvent* e) {
      return e->ev.id == i ||
             (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST && e->ev.listen_id == i);
    });
    id->own_channel = to_sync ? chan(channel) : nullptr;
    id->sync = to_sync;
    i->channel = channel;
    for (auto* e : moving) {
      if (e->ev.id != i) e->ev.id->channel = channel;
      chan(channel)->events.push(e);
    }
  }
  if (old_own) rdma_destroy_event_channel(&old_own->ch);
  return 0;
}

SV_EXPORT __be16 rdma_get_src_port(rdma_cm_id* i) {
  return htons(id_src(cmid(i)).port());
}
SV_EXPORT __be16 rdma_get_dst_port(rdma_cm_id* i) {
  return htons(id_dst(cmid(i)).port());
}

SV_EXPORT ibv_context** rdma_get_devices(int* num) {
  auto** l = static_cast<ibv_context**>(calloc(2, sizeof(ibv_context*)));
  if (!l) return errno = ENOMEM, nullptr;
  l[0] = g_verbs();
  if (num) *num = l[0] ? 1 : 0;
  return l;
}

SV_EXPORT void rdma_free_devices(ibv_context** list) {
  free(list);
}

namespace {
sockaddr* copy_addr(const sockaddr* a, socklen_t len) {
  auto* c = static_cast<sockaddr*>(calloc(1, sizeof(sockaddr_storage)));
  if (c) std::memcpy(c, a, std::min<size_t>(len, sizeof(sockaddr_storage)));
  return c;
}

// No node and no service: the result is the hints' own addresses (libfabric's verbs provider
// asks this way), with their family and the hints' flags, QP type and port space.
int addrinfo_from_hints(const rdma_addrinfo* h, rdma_addrinfo** res) {
  if (!h || (!h->ai_src_len && !h->ai_dst_len)) {
    errno = EINVAL;
    return -1;
  }
  auto* ra = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!ra) return errno = ENOMEM, -1;
  ra->ai_flags = h->ai_flags;
  ra->ai_qp_type = h->ai_qp_type                     ? h->ai_qp_type
                   : h->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD
                                                     : IBV_QPT_RC;
  ra->ai_port_space = h->ai_port_space ? h->ai_port_space : RDMA_PS_TCP;
  if (h->ai_src_len && h->ai_src_addr) {
    ra->ai_src_addr = copy_addr(h->ai_src_addr, h->ai_src_len);
    ra->ai_src_len = h->ai_src_len;
    ra->ai_family = h->ai_src_addr->sa_family;
  }
  if (h->ai_dst_len && h->ai_dst_addr) {
    ra->ai_dst_addr = copy_addr(h->ai_dst_addr, h->ai_dst_len);
    ra->ai_dst_len = h->ai_dst_len;
    ra->ai_family = h->ai_dst_addr->sa_family;
  }
  if ((h->ai_src_len && !ra->ai_src_addr) || (h->ai_dst_len && !ra->ai_dst_addr)) {
    rdma_freeaddrinfo(ra);
    return errno = ENOMEM, -1;
  }
  *res = ra;
  return 0;
}
}  // namespace

SV_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints,
                               rdma_addrinfo** res) {
  if (!res) return errno = EINVAL, -1;
  if (!node && !service) return addrinfo_from_hints(hints, res);
  addrinfo h{};
  h.ai_socktype = SOCK_STREAM;
  h.ai_family = hints ? hints->ai_family : AF_UNSPEC;
  const bool passive = hints && (hints->ai_flags & RAI_PASSIVE);
  if (passive) h.ai_flags |= AI_PASSIVE;
  if (hints && (hints->ai_flags & RAI_NUMERICHOST)) h.ai_flags |= AI_NUMERICHOST;
  addrinfo* ai = nullptr;
  int r = getaddrinfo(node, service, &h, &ai);
  if (r) return r;
  auto* ra = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  ra->ai_flags = hints ? hints->ai_flags : 0;
  ra->ai_family = ai->ai_family;
  ra->ai_qp_type = hints && hints->ai_qp_type                     ? hints->ai_qp_type
                   : hints && hints->ai_port_space == RDMA_PS_UDP ? IBV_QPT_UD
                                                                  : IBV_QPT_RC;
  ra->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
  auto* a = static_cast<sockaddr*>(calloc(1, sizeof(sockaddr_storage)));
  std::memcpy(a, ai->ai_addr, ai->ai_addrlen);
  if (passive) {
    ra->ai_src_addr = a;
    ra->ai_src_len = ai->ai_addrlen;
  } else {
    ra->ai_dst_addr = a;
    ra->ai_dst_len = ai->ai_addrlen;
    if (hints && hints->ai_src_addr && hints->ai_src_len) {
      ra->ai_src_addr = static_cast<sockaddr*>(calloc(1, sizeof(sockaddr_storage)));
      std::memcpy(ra->ai_src_addr, hints->ai_src_addr, hints->ai_src_len);
      ra->ai_src_len = hints->ai_src_len;
    }
  }
  if (node) {
    if (passive)
      ra->ai_src_canonname = strdup(node);
    else
      ra->ai_dst_canonname = strdup(node);
  }
  freeaddrinfo(ai);
  *res = ra;
  return 0;
}

SV_EXPORT void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* n = res->ai_next;
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_route);
    free(res->ai_connect);
    free(res);
    res = n;
  }
}

// The attributes that move a QP to the state the caller asks for in attr->qp_state (INIT,
// RTR or RTS; anything else EINVAL), as librdmacm passes that state to the kernel's
// rdma_init_qp_attr (iw_cm_init_qp_attr for iWARP). Programs that move their own QP (an
// external one, or the id's) call it once per step.
SV_EXPORT int rdma_init_qp_attr(rdma_cm_id* i, ibv_qp_attr* attr, int* mask) {
  if (!i || !attr || !mask) return fail(EINVAL);
  CmId* id = cmid(i);
  const ibv_qp_state want = attr->qp_state;
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = want;
  if (i->qp_type == IBV_QPT_UD) {
    // ucma_init_ud_qp's sequence: INIT with the Q_Key, RTR, RTS with an SQ PSN.
    switch (want) {
      case IBV_QPS_INIT:
        attr->port_num = 1;
        attr->qkey = kUdpQkey;
        *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        return 0;
      case IBV_QPS_RTR:
        *mask = IBV_QP_STATE;
        return 0;
      case IBV_QPS_RTS:
        *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        return 0;
      default:
        return fail(EINVAL);
    }
  }
  switch (want) {
    case IBV_QPS_INIT:
      attr->port_num = 1;
      attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_LOCAL_WRITE;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      return 0;
    case IBV_QPS_RTR:
      attr->path_mtu = IBV_MTU_4096;
      attr->dest_qp_num = sv::engine::kRdmaCmPlaceholderQpn;
      attr->max_dest_rd_atomic = std::max<uint8_t>(id->resp_res, 1);
      attr->min_rnr_timer = 12;
      *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      return 0;
    case IBV_QPS_RTS: {
      std::lock_guard lk(id->mu);
      attr->timeout = id->ack_timeout;
      attr->retry_cnt = 7;
      attr->rnr_retry = 7;
      attr->max_rd_atomic = std::max<uint8_t>(id->init_depth, 1);
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
              IBV_QP_MAX_QP_RD_ATOMIC;
      return 0;
    }
    default:
      return fail(EINVAL);
  }
}

// ---- endpoint helpers (rdma_verbs.h style) ----------------------------------------------

SV_EXPORT int rdma_create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd,
                             ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  if (res->ai_qp_type && res->ai_qp_type != IBV_QPT_RC) return fail(EOPNOTSUPP);  // RC only
  rdma_cm_id* i = nullptr;
  if (rdma_create_id(nullptr, &i, nullptr, static_cast<rdma_port_space>(res->ai_port_space)))
    return -1;
  // librdmacm: the id's QP type is the address's (ai_qp_type), and so is any QP made here.
  if (res->ai_qp_type) i->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  int r;
  if (res->ai_flags & RAI_PASSIVE) {
    r = rdma_bind_addr(i, res->ai_src_addr);
    if (!r) {
      // Passive: no QP on the listening id; rdma_get_request makes one on each child, with
      // these attributes and this PD.
      i->verbs = g_verbs();
      if (pd) i->pd = pd;
      if (qp_init_attr) {
        auto a = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
        a->qp_type = i->qp_type;
        cmid(i)->child_qp_attr = std::move(a);
      }
    }
  } else {
    r = rdma_resolve_addr(i, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (!r) r = rdma_resolve_route(i, 2000);
    if (!r && qp_init_attr) {
      qp_init_attr->qp_type = i->qp_type;
      r = rdma_create_qp(i, pd, qp_init_attr);
    } else if (!r && pd) {
      i->pd = pd;
    }
  }
  if (r) {
    int e = errno;
    rdma_destroy_id(i);
    return fail(e);
  }
  *out = i;
  return 0;
}

SV_EXPORT void rdma_destroy_ep(rdma_cm_id* i) {
  if (!i) return;
  rdma_destroy_qp(i);
  if (i->srq) ibv_destroy_srq(i->srq);
  rdma_destroy_id(i);
}

SV_EXPORT int rdma_create_srq_ex(rdma_cm_id* i, ibv_srq_init_attr_ex* attr) {
  if (!i || !attr) return fail(EINVAL);
  ibv_pd* pd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) && attr->pd ? attr->pd : i->pd;
  if (!pd) return fail(EINVAL);
  ibv_srq_init_attr init{};
  init.srq_context = attr->srq_context;
  init.attr = attr->attr;
  ibv_srq* s = ibv_create_srq(pd, &init);
  if (!s) return -1;
  i->srq = s;
  return 0;
}

SV_EXPORT int rdma_create_srq(rdma_cm_id* i, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!i || !attr) return fail(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.comp_mask = IBV_SRQ_INIT_ATTR_PD;
  ex.pd = pd;
  return rdma_create_srq_ex(i, &ex);
}

SV_EXPORT void rdma_destroy_srq(rdma_cm_id* i) {
  if (i && i->srq) {
    ibv_destroy_srq(i->srq);
    i->srq = nullptr;
  }
}

// Enhanced connection establishment (IB ECE) has no iWARP equivalent.
SV_EXPORT int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) {
  return fail(EOPNOTSUPP);
}
SV_EXPORT int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) {
  return fail(EOPNOTSUPP);
}
