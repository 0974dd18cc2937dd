// Finding the process that owns (ip, port) on another host.
//
// Within a host the registry (bind.cc) answers. Across hosts, each host runs one directory:
// the first RDS process there listens on the well-known rdma_cm port RDS_CM_PORT (18635,
// where Linux RDS over IB listens) and answers lookups from its registry; if it exits,
// another process takes the port over within a second. A lookup is an rdma_cm connect with
// private data naming (ip, port); the directory rejects it, and the reject's private data
// carries the owner's rdma_cm port and generation (or port 0: nobody is bound there). So
// "any socket reaches any (ip, port) on any host with no set-up" holds with no daemon.
//
// Messages sent before the answer wait here in order and get their sequence numbers when
// they join the connection. No owner: they are dropped, as the peer host would drop them
// (net/rds recv.c, no socket bound). No directory reachable: retried with randomised
// exponential backoff, as a connection would be.
#include <arpa/inet.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>

#include "rds/rds_impl.h"
#include "util/fork_local.h"

namespace sv::rds {
namespace {

constexpr int kMaxBackoffMs = 1000;

struct Lookup {
  sockaddr_in dest{};
  rdma_cm_id* id = nullptr;
  std::deque<Message*> waiting;
  int backoff_ms = 0;
  std::chrono::steady_clock::time_point retry_at{};
};

struct Resolved {
  uint16_t cm_port;
  uint64_t gen;
};

uint64_t key_of(const sockaddr_in& a) {
  return (static_cast<uint64_t>(a.sin_addr.s_addr) << 16) | a.sin_port;
}

// Process-lifetime tables (see ib_transport.cc: the engine thread outlives static dtors);
// a forked child starts with none (util/fork_local.h).
struct DirState {
  std::map<uint64_t, Lookup> lookups;
  std::map<rdma_cm_id*, uint64_t> by_id;
  std::map<uint64_t, Resolved> cache;
  rdma_cm_id* dir_id = nullptr;
  std::chrono::steady_clock::time_point next_claim{};
};
ForkLocal<DirState> g_dir;
DirState& D() {
  return g_dir.get();
}

void start_lookup(Lookup& l);

void finish(Lookup& l, uint16_t cm_port, uint64_t gen) {
  if (cm_port) D().cache[key_of(l.dest)] = Resolved{cm_port, gen};
  std::vector<Conn*> kick;
  for (Message* m : l.waiting) {
    if (!cm_port) {
      count(Ctr::send_drop_no_sock);
      ops_report(m, RDS_RDMA_DROPPED);  // no process owns it: its ops never run, and say so
      release_message(m);
      continue;
    }
    Conn* c = conn_get(gen, m->src, l.dest, cm_port);  // each source address its connection
    conn_enqueue(c, m);
    if (std::find(kick.begin(), kick.end(), c) == kick.end()) kick.push_back(c);
  }
  l.waiting.clear();
  for (Conn* c : kick) conn_kick(c);
}

void drop_id(Lookup& l) {
  if (!l.id) return;
  D().by_id.erase(l.id);
  destroy_qp(l.id);
  rdma_destroy_id(l.id);
  l.id = nullptr;
}

void retry_later(Lookup& l) {
  drop_id(l);
  l.backoff_ms = l.backoff_ms ? std::min(l.backoff_ms * 2, kMaxBackoffMs) : 1;
  uint32_t r = 7;
  if (getrandom(&r, sizeof r, 0) != sizeof r) r = 7;
  l.retry_at = std::chrono::steady_clock::now() +
               std::chrono::milliseconds(r % static_cast<uint32_t>(l.backoff_ms) + 1);
  count(Ctr::dir_lookup_retry);
}

void start_lookup(Lookup& l) {
  Global& G = g();
  if (rdma_create_id(G.cm_ch, &l.id, nullptr, RDMA_PS_TCP)) {
    l.id = nullptr;
    retry_later(l);
    return;
  }
  D().by_id[l.id] = key_of(l.dest);
  sockaddr_in dir = l.dest;
  dir.sin_port = htons(kRdsCmPort);
  count(Ctr::dir_lookup);
  if (rdma_resolve_addr(l.id, nullptr, reinterpret_cast<sockaddr*>(&dir), 2000)) retry_later(l);
}

void on_lookup_event(Lookup& l, rdma_cm_event* ev) {
  switch (ev->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rdma_resolve_route(l.id, 2000)) retry_later(l);
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED: {
      // iWARP connects a QP: give the lookup a minimal one (real iw_cm requires it).
      ibv_qp_init_attr a{};
      a.send_cq = g().cq;
      a.recv_cq = g().cq;
      a.qp_type = IBV_QPT_RC;
      a.cap.max_send_wr = a.cap.max_recv_wr = a.cap.max_send_sge = a.cap.max_recv_sge = 1;
      wire::RdsDirPriv q;
      q.ip = l.dest.sin_addr.s_addr;
      q.port = l.dest.sin_port;
      std::byte pd[wire::kRdsDirPrivLen];
      wire::rds_dir_priv_encode(q, pd);
      rdma_conn_param cp{};
      cp.private_data = pd;
      cp.private_data_len = sizeof pd;
      if (create_qp(l.id, &a) || rdma_connect(l.id, &cp)) retry_later(l);
      break;
    }
    case RDMA_CM_EVENT_REJECTED: {
      wire::RdsDirPriv r;
      if (!wire::rds_dir_priv_decode(ev->param.conn.private_data, ev->param.conn.private_data_len,
                                     r)) {
        retry_later(l);  // nobody answering lookups there (yet)
        break;
      }
      drop_id(l);
      l.backoff_ms = 0;
      finish(l, r.cm_port, r.gen);
      break;
    }
    case RDMA_CM_EVENT_ESTABLISHED:  // not a directory: it accepted
      rdma_disconnect(l.id);
      retry_later(l);
      break;
    default:
      retry_later(l);
      break;
  }
}

// We are the host's directory: answer from the registry, always by rejecting.
void serve(rdma_cm_event* ev) {
  wire::RdsDirPriv q, r;
  if (wire::rds_dir_priv_decode(ev->param.conn.private_data, ev->param.conn.private_data_len, q)) {
    sockaddr_in d{};
    d.sin_family = AF_INET;
    d.sin_addr.s_addr = q.ip;
    d.sin_port = q.port;
    r.cm_port = registry_lookup(d, &r.gen);
    count(Ctr::dir_lookup_served);
  }
  std::byte pd[wire::kRdsDirPrivLen];
  wire::rds_dir_priv_encode(r, pd);
  rdma_reject(ev->id, pd, sizeof pd);
}

}  // namespace

uint16_t directory_cached(const sockaddr_in& d, uint64_t* gen) {
  auto it = D().cache.find(key_of(d));
  if (it == D().cache.end()) return 0;
  *gen = it->second.gen;
  return it->second.cm_port;
}

bool directory_pending(const sockaddr_in& d) {
  auto it = D().lookups.find(key_of(d));
  return it != D().lookups.end() && !it->second.waiting.empty();
}

void directory_defer(Message* m) {
  Lookup& l = D().lookups[key_of(m->dest)];
  l.waiting.push_back(m);
  if (l.waiting.size() == 1 && !l.id) {
    l.dest = m->dest;
    l.backoff_ms = 0;
    start_lookup(l);
  }
}

void directory_forget(uint64_t gen) {
  for (auto it = D().cache.begin(); it != D().cache.end();)
    it = it->second.gen == gen ? D().cache.erase(it) : std::next(it);
}

std::vector<std::deque<Message*>*> directory_queues() {
  std::vector<std::deque<Message*>*> v;
  for (auto& [k, l] : D().lookups) v.push_back(&l.waiting);
  return v;
}

int directory_wait_ms() {
  const auto now = std::chrono::steady_clock::now();
  auto next = D().dir_id ? std::chrono::steady_clock::time_point::max() : D().next_claim;
  for (auto& [k, l] : D().lookups)
    if (!l.id && !l.waiting.empty()) next = std::min(next, l.retry_at);
  if (next == std::chrono::steady_clock::time_point::max()) return -1;
  if (next <= now) return 0;
  return static_cast<int>(
             std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count()) +
         1;
}

bool directory_handles(rdma_cm_event* ev) {
  if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && D().dir_id && ev->listen_id == D().dir_id) {
    serve(ev);
    return true;
  }
  auto it = D().by_id.find(ev->id);
  if (it == D().by_id.end()) return false;
  on_lookup_event(D().lookups[it->second], ev);
  return true;
}

void directory_tick() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [k, l] : D().lookups)
    if (!l.id && !l.waiting.empty() && l.retry_at <= now) start_lookup(l);
  // Claim the host's directory port if nobody holds it (its holder may have exited).
  if (D().dir_id || now < D().next_claim) return;
  D().next_claim = now + std::chrono::seconds(1);
  if (rdma_create_id(g().cm_ch, &D().dir_id, nullptr, RDMA_PS_TCP)) {
    D().dir_id = nullptr;
    return;
  }
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(kRdsCmPort);
  if (rdma_bind_addr(D().dir_id, reinterpret_cast<sockaddr*>(&any)) ||
      rdma_listen(D().dir_id, 64)) {
    rdma_destroy_id(D().dir_id);
    D().dir_id = nullptr;
    return;
  }
  count(Ctr::dir_serving);
}

}  // namespace sv::rds
