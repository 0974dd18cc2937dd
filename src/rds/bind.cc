// Host registry of bound RDS ports. Linux RDS keeps ports unique per IP in the kernel's
// bind hash, per network namespace. Here each bound (ip, port) is a listening unix socket in
// the abstract namespace, "@softverbs-rds/<realm>/<ip>_<port>" (wire/rds_files.h):
//  - binding an abstract name is atomic and exclusive within a network namespace, and the
//    kernel drops the name when its socket is closed or its process dies: no stale entry
//    outlives its owner, and there is nothing to clean up;
//  - there is no file or folder, so no other local user can deny RDS to everyone by
//    creating the registry's folder first, nor rename, delete or rewrite an entry, as they
//    could with the /dev/shm/softverbs-rds folder this replaces (issue 28). As on Linux,
//    any user may bind a port nobody holds, first come, first served;
//  - a lookup connects to the name, and the kernel tells who holds it (SO_PEERCRED: the
//    pid and uid of the process that called listen()). The owner's entry, its rdma_cm port
//    and generation, is in a second name it holds for as long as it has a port,
//    "@softverbs-rds/<realm>/pid/<pid>=<cm_port>_<gen>" (the random generation makes it
//    unguessable, so nobody can take it first). The querier lists the listening sockets
//    under that prefix with their owners' uids (sock_diag), takes only the owner's uid's,
//    and believes one only if the kernel says that pid holds it. So no name of another
//    user is ever a candidate, and no answer waits for the owner: a stopped owner is found
//    as a running one (its messages wait, as for a stopped process' kernel socket).
// A querier keeps its connection to the port's socket as the cache of its answer. The
// owner's registry thread takes it in and holds it while it holds the port, at most a
// quarter of its descriptor limit in all (past that, and while the owner is stopped,
// queriers wait in the kernel's backlog, SOMAXCONN per port, where their answers hold as
// well); on release the owner closes them, or the kernel does at its death. So a querier
// checks its answer with one non-blocking peek (end of file: stale). The thread takes no
// lock of the RDS stack. Processes in different PID namespaces sharing a network namespace
// do not find each other (the pid the kernel gives is not the one in the name).
// realm: "host", or a hash of SOFTVERBS_RDS_DIR when set (tests, and a private registry
// per simulated host sharing one network namespace).
#include <arpa/inet.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rds/rds_impl.h"
#include "util/fork_local.h"
#include "wire/rds_files.h"
#include "wire/unix_diag.h"

namespace sv::rds {
namespace {

// An owner holds at most a quarter of its descriptor limit in queriers' connections, all
// ports together: past it, it stops taking them in, and they wait in the kernel's backlog
// (SOMAXCONN per port), where their answers hold as well. So neither many local peers nor
// another user connecting in a loop can run us out of descriptors.
size_t max_queriers() {
  rlimit rl{};
  const rlim_t cur = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  return static_cast<size_t>(std::clamp<rlim_t>(cur / 4, 64, 65536));
}
// Queriers taken in per wake-up of the registry thread, so that lookups of our own ports,
// which wait for its lock, wait for little.
constexpr int kAcceptBatch = 64;
// Candidate process names tried per lookup at most (only misses of the cache look).
constexpr size_t kMaxCandidates = 64;

// Read once per process (a forked child reads it again: in_private_child sets it after fork).
// SOFTVERBS_RDS_DIR set to the default folder (with or without a trailing slash) is the
// host's realm, as unset. Read at each claim and each lookup the cache misses (a test may
// give itself a private registry before it starts its peers): a claim holds our process
// name in its realm too (Owner::proc_fds), so a lookup in any realm we claimed in finds us.
std::string realm() {
  const char* d = std::getenv("SOFTVERBS_RDS_DIR");
  std::string dir = d ? d : "";
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return wire::registry_realm(dir == "/dev/shm/softverbs-rds" ? nullptr : dir.c_str());
}

using Key = std::pair<uint32_t, uint16_t>;  // IPv4 address and port, network order
Key key_of(const sockaddr_in& a) {
  return {a.sin_addr.s_addr, a.sin_port};
}

std::string ip_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return ip;
}

std::string name_of(const std::string& r, const sockaddr_in& a) {
  return wire::registry_name(r, ip_text(a), ntohs(a.sin_port));
}

std::string name_of6(const std::string& r, const sockaddr_in6& a) {
  char ip[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof ip);
  return wire::registry_name(r, ip, ntohs(a.sin6_port));
}

// The abstract address of name: sun_path starts with a NUL, and its length is exact.
socklen_t abstract_addr(const std::string& name, sockaddr_un* su) {
  std::memset(su, 0, sizeof *su);
  su->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof su->sun_path - 1);
  std::memcpy(su->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// The owner side: our listeners and the queriers connected to each.
struct Owner {
  struct Port {
    std::string name;
    std::vector<int> queriers;
  };
  std::mutex mu;
  int ep = -1;
  bool started = false;
  std::map<std::string, int> proc_fds;  // realm -> our process name there, from its first claim
  uint16_t cm_port = 0;
  uint64_t gen = 0;
  std::chrono::steady_clock::time_point paused_at;  // when paused last became non-empty
  std::map<int, Port> ports;                        // listener fd ->
  std::map<Key, int> own_v4;                        // our IPv4 ports -> listener fd
  std::map<int, int> querier_of;                    // querier connection fd -> its listener fd
  std::vector<int> paused;  // listeners not watched for now (see accept_locked)
  size_t max_held = max_queriers();
};

void owner_release(Owner& o) {
  // fork(): the child's copies. Closing them frees nothing of the parent's, and a querier
  // of the parent sees its end of file only when the parent lets go too.
  for (auto& [fd, p] : o.ports) {
    close(fd);
    for (int q : p.queriers) close(q);
  }
  for (auto& [r, fd] : o.proc_fds) close(fd);
  if (o.ep >= 0) close(o.ep);
}
ForkLocal<Owner> g_owner(&owner_release);

void watch_locked(Owner& o, int listener, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = listener;
  epoll_ctl(o.ep, EPOLL_CTL_MOD, listener, &ev);
}

// Listeners that stopped taking queriers in try again.
void resume_locked(Owner& o) {
  for (int l : o.paused) watch_locked(o, l, EPOLLIN);
  o.paused.clear();
}

void drop_querier_locked(Owner& o, int q) {
  auto it = o.querier_of.find(q);
  if (it == o.querier_of.end()) return;
  if (auto p = o.ports.find(it->second); p != o.ports.end()) std::erase(p->second.queriers, q);
  o.querier_of.erase(it);
  close(q);          // also leaves the epoll set
  resume_locked(o);  // a descriptor is free
}

// Takes in the queriers waiting on a listener: held for a port, closed at once for the
// process name (a querier only asked the kernel who holds it). A port's listener stops
// while we hold max_held, and any listener while we are out of descriptors: its queriers
// wait in the backlog (their answers stand), and it is watched again once one leaves or
// after a second; else, still readable, it would spin this thread.
void accept_locked(Owner& o, int listener) {
  auto p = o.ports.find(listener);
  bool pause = false;
  for (int i = 0; i < kAcceptBatch && !pause; ++i) {
    if (p != o.ports.end() && o.querier_of.size() >= o.max_held) {
      pause = true;
      break;
    }
    const int q = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (q < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // all taken in
    if (q < 0 && (errno == ECONNABORTED || errno == EINTR)) continue;
    if (q < 0) {  // EMFILE, ENFILE, ENOMEM, ENOBUFS: they wait
      pause = true;
      break;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = q;
    if (p == o.ports.end() || epoll_ctl(o.ep, EPOLL_CTL_ADD, q, &ev)) {
      close(q);
      continue;
    }
    p->second.queriers.push_back(q);
    o.querier_of[q] = listener;
  }
  if (!pause) return;  // a full batch: the rest at the next wake-up (level-triggered)
  watch_locked(o, listener, 0);
  if (o.paused.empty()) o.paused_at = std::chrono::steady_clock::now();
  o.paused.push_back(listener);
}

// The registry thread: takes queriers in, and lets go of those that left. A querier never
// writes: anything readable on its connection is its end of file.
void owner_loop(Owner* o) {
  epoll_event evs[64];
  int timeout = -1;
  for (;;) {
    const int n = epoll_wait(o->ep, evs, 64, timeout);
    std::lock_guard lk(o->mu);
    // A second after the first pause, whatever else woke us meanwhile (descriptors the
    // application freed elsewhere are no querier leaving).
    if (!o->paused.empty() &&
        std::chrono::steady_clock::now() - o->paused_at >= std::chrono::seconds(1))
      resume_locked(*o);
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      // An event of a descriptor released meanwhile (and maybe reused) finds it in no map,
      // or in one by its new role: a spurious accept or close, both harmless.
      const bool proc = std::any_of(o->proc_fds.begin(), o->proc_fds.end(),
                                    [&](const auto& kv) { return kv.second == fd; });
      if (o->ports.count(fd) || proc)
        accept_locked(*o, fd);
      else
        drop_querier_locked(*o, fd);
    }
    timeout = o->paused.empty() ? -1 : 250;
  }
}

// A listening socket holding name, watched by the registry thread; -errno on failure.
int listen_on_locked(Owner& o, const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  sockaddr_un su;
  const socklen_t len = abstract_addr(name, &su);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  // The backlog holds queriers while we are stopped (capped by net.core.somaxconn).
  if (bind(fd, reinterpret_cast<sockaddr*>(&su), len) != 0 || listen(fd, SOMAXCONN) != 0 ||
      epoll_ctl(o.ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
    const int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

// name is in realm r: our process name there is held first, so that a lookup in r finds it.
int claim(const std::string& r, const std::string& name, uint16_t cm_port, uint64_t gen) {
  Owner& o = g_owner.get();
  std::lock_guard lk(o.mu);
  if (!o.started) {
    o.ep = epoll_create1(EPOLL_CLOEXEC);
    if (o.ep < 0) return -errno;
    std::thread(owner_loop, &o).detach();
    o.started = true;
  }
  if (!o.proc_fds.count(r)) {
    // Our entry never changes (a forked child builds a registry of its own).
    const int fd = listen_on_locked(o, wire::registry_proc_name(r, getpid(), cm_port, gen));
    if (fd < 0) return fd == -EADDRINUSE ? -EAGAIN : fd;  // a stale holder of our pid's name
    o.proc_fds[r] = fd;
    o.cm_port = cm_port;
    o.gen = gen;
  }
  const int fd = listen_on_locked(o, name);
  if (fd < 0) return fd;
  o.ports[fd] = Owner::Port{name, {}};
  return fd;
}

}  // namespace

int registry_claim(const sockaddr_in& a, uint16_t cm_port, uint64_t gen) {
  const std::string r = realm();
  const int fd = claim(r, name_of(r, a), cm_port, gen);
  if (fd >= 0) {
    Owner& o = g_owner.get();
    std::lock_guard lk(o.mu);
    o.own_v4[key_of(a)] = fd;
  }
  return fd;
}

int registry_claim6(const sockaddr_in6& a, uint16_t cm_port, uint64_t gen) {
  const std::string r = realm();
  return claim(r, name_of6(r, a), cm_port, gen);
}

void registry_release(int lock_fd, const sockaddr_in&) {
  if (lock_fd < 0) return;
  Owner& o = g_owner.get();
  std::lock_guard lk(o.mu);
  auto it = o.ports.find(lock_fd);
  if (it == o.ports.end()) return;
  // Our queriers see their end of file: their cached answers are stale from now on.
  for (int q : std::vector<int>(it->second.queriers)) drop_querier_locked(o, q);
  std::erase_if(o.own_v4, [&](const auto& kv) { return kv.second == lock_fd; });
  std::erase(o.paused, lock_fd);
  o.ports.erase(it);
  close(lock_fd);  // the name is free once this returns
}

namespace {
// Lookups are on every sendmsg: a cached answer costs one non-blocking peek at the owner's
// connection, which reads "nothing yet" while it holds the port.
struct Cached {
  int fd;
  uint16_t port;
  uint64_t gen;
};
using Cache = std::map<Key, Cached>;
// A forked child closes its copies of the parent's descriptors and starts empty.
void close_cached(Cache& c) {
  for (auto& [k, v] : c) close(v.fd);
}
ForkLocal<Cache> g_cache_(&close_cached);

void uncache(Cache::iterator it) {
  close(it->second.fd);
  g_cache_.get().erase(it);
}

// Our own port: the answer without asking the kernel.
bool own_answer(const Key& k, uint16_t* port, uint64_t* gen) {
  Owner* o = g_owner.peek();
  if (!o) return false;
  std::lock_guard lk(o->mu);
  if (!o->own_v4.count(k)) return false;
  *port = o->cm_port;
  *gen = o->gen;
  return true;
}

// Who holds the listening socket fd is connected to, as the kernel tells it (the process
// that called listen()); pid 0 if it cannot.
ucred holder(int fd) {
  ucred cr{};
  socklen_t len = sizeof cr;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) cr.pid = 0;
  return cr;
}

// A connection to whoever holds name (-1: nobody).
int connect_to(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un su;
  const socklen_t len = abstract_addr(name, &su);
  // ECONNREFUSED: nobody holds it. EAGAIN: its backlog is full (SOMAXCONN queriers it has
  // not taken in): no waiting here, under the stack's lock.
  if (connect(fd, reinterpret_cast<sockaddr*>(&su), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The listening sockets whose abstract name starts with prefix (without its NUL), and, if
// uid is given, whose owner is uid: at most kMaxCandidates, each once, from a sock_diag dump,
// which says whose each socket is. The owner is filtered before the count, so that another
// user's names never take a candidate's place. False if the kernel would not answer (a
// seccomp profile): then from /proc/net/unix, which says nothing of owners.
bool diag_listeners(const std::string& prefix, const uid_t* uid,
                    std::vector<wire::UnixSocketName>& out) {
  const int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return false;
  struct {
    nlmsghdr h;
    unix_diag_req r;
  } req{};
  req.h.nlmsg_len = sizeof req;
  req.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.r.sdiag_family = AF_UNIX;
  req.r.udiag_states = 1u << 10;  // TCP_LISTEN: listeners only, not their connections
  req.r.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID;
  sockaddr_nl nl{};
  nl.nl_family = AF_NETLINK;
  bool ok = sendto(fd, &req, sizeof req, 0, reinterpret_cast<sockaddr*>(&nl), sizeof nl) ==
            static_cast<ssize_t>(sizeof req);
  alignas(nlmsghdr) std::byte buf[16384];
  std::vector<wire::UnixSocketName> batch;
  for (auto st = wire::DiagStatus::more; ok && st == wire::DiagStatus::more;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);  // the kernel answers a dump at once
    if (n <= 0) {
      ok = false;
      break;
    }
    batch.clear();
    st = wire::parse_unix_diag(buf, static_cast<size_t>(n), batch, SIZE_MAX);
    ok = st != wire::DiagStatus::error;
    for (auto& s : batch)
      if (out.size() < kMaxCandidates && s.name.size() > prefix.size() && s.name[0] == '\0' &&
          s.name.compare(1, prefix.size(), prefix) == 0 && (!uid || !s.has_uid || s.uid == *uid))
        out.push_back({s.name.substr(1), s.uid, s.has_uid});
  }
  close(fd);
  return ok;
}

std::vector<wire::UnixSocketName> listeners_with(const std::string& prefix,
                                                 const uid_t* uid = nullptr) {
  std::vector<wire::UnixSocketName> out;
  if (diag_listeners(prefix, uid, out)) return out;
  out.clear();
  std::ifstream f("/proc/net/unix");
  std::string line;
  while (std::getline(f, line) && out.size() < kMaxCandidates) {
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos || line.compare(sp + 1, 1 + prefix.size(), "@" + prefix) != 0)
      continue;
    std::string name = line.substr(sp + 2);  // without the '@'
    if (std::none_of(out.begin(), out.end(), [&](const auto& s) { return s.name == name; }))
      out.push_back({std::move(name), 0, false});
  }
  return out;
}

// The entry of process pid (owner uid): from a process name that pid holds. Another user's
// names are no candidates (the dump says whose they are); a name that claims to be pid's is
// believed only if the kernel says pid holds it.
bool entry_of(const std::string& r, const ucred& owner, uint16_t* port, uint64_t* gen) {
  const std::string prefix = wire::registry_proc_prefix(r, owner.pid);
  for (const auto& cand : listeners_with(prefix, &owner.uid)) {
    uint16_t p = 0;
    uint64_t g = 0;
    if ((cand.has_uid && cand.uid != owner.uid) ||
        !wire::registry_proc_parse(cand.name, prefix, p, g))
      continue;
    const int fd = connect_to(cand.name);
    if (fd < 0) continue;
    const bool theirs = holder(fd).pid == owner.pid;
    close(fd);
    if (theirs) {
      *port = p;
      *gen = g;
      return true;
    }
  }
  return false;
}

// Asks the kernel who holds name and finds that process' entry; the connection to name on
// success (the cache of the answer), else -1.
int ask(const std::string& r, const std::string& name, uint16_t* port, uint64_t* gen) {
  const int fd = connect_to(name);
  if (fd < 0) return -1;
  const ucred owner = holder(fd);
  if (owner.pid <= 0 || !entry_of(r, owner, port, gen)) {
    close(fd);
    return -1;
  }
  return fd;
}

uint16_t lookup_name(const sockaddr_in& a, uint64_t* gen) {
  const Key key = key_of(a);
  uint16_t port = 0;
  uint64_t g = 0;
  if (own_answer(key, &port, &g)) {
    if (gen) *gen = g;
    return port;
  }
  if (auto it = g_cache_.get().find(key); it != g_cache_.get().end()) {
    char c;
    // Nothing to read while the owner holds the port; end of file (or anything else) once
    // it let go or died.
    if (recv(it->second.fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN) {
      if (gen) *gen = it->second.gen;
      return it->second.port;
    }
    uncache(it);
  }
  const std::string r = realm();
  const int fd = ask(r, name_of(r, a), &port, &g);
  if (fd < 0) return 0;
  if (g_cache_.get().size() >= 1024) uncache(g_cache_.get().begin());
  g_cache_.get().emplace(key, Cached{fd, port, g});
  if (gen) *gen = g;
  return port;
}

// Port 0 nobody holds: the first live owner of any port on the address, from the abstract
// names the kernel lists (only for pings to an address whose ping holder has exited).
uint16_t any_owner_on(in_addr ip, uint64_t* gen) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr = ip;
  const std::string prefix = wire::registry_name_prefix(realm(), ip_text(a));
  for (const auto& l : listeners_with(prefix)) {
    const uint16_t p = wire::registry_name_port(l.name, prefix);
    if (!p) continue;
    a.sin_port = htons(p);
    if (uint16_t found = lookup_name(a, gen)) return found;
  }
  return 0;
}
}  // namespace

uint16_t registry_lookup(const sockaddr_in& a, uint64_t* gen) {
  const uint16_t port = lookup_name(a, gen);
  return port || a.sin_port ? port : any_owner_on(a.sin_addr, gen);
}

void registry_forget(uint64_t gen) {
  for (auto it = g_cache_.get().begin(); it != g_cache_.get().end();) {
    auto next = std::next(it);
    if (it->second.gen == gen) uncache(it);
    it = next;
  }
}

}  // namespace sv::rds
