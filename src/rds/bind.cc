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
// can check its answer with one non-blocking peek (end of file: stale). Every sendmsg
// looks its destination up, and that peek was a system call per message (about 0.7 us of
// a busy-polled request/ack's 6.5 us over shared memory), so the owner also sends each
// querier it takes in a hello with its live table (wire/rds_files.h): a sealed memfd with a
// robust lock its registry thread holds (the kernel marks it at the thread's death, before
// the names go) and a word per port (cleared before the port's name goes). A querier that
// mapped the table checks its answer with two loads; it believes only a table no one but
// the owner can write or shrink, and checks by peeking otherwise (an owner that sent no
// hello, or one it refused). An owner can lie about its own ports either way, as it could
// by keeping its queriers' connections open. The thread takes no lock of the RDS stack. Processes
// in different PID namespaces sharing a network namespace do not find each other (the pid the
// kernel gives is not the one in the name). realm: "host", or a hash of SOFTVERBS_RDS_DIR when set
// (tests, and a private registry per simulated host sharing one network namespace).
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <linux/sockios.h>
#include <linux/unix_diag.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// Our live table (wire/rds_files.h): queriers check their answers against it with two
// loads. Written under Owner::mu; null where the kernel would not make one (no memfd or
// seals: queriers then peek at their connection per send, as before).
struct LiveTable {
  int fd = -1;
  std::byte* base = nullptr;  // kLiveTableBytes, mapped writable before the seals
  uint32_t tid = 0;           // our registry thread, once it holds the lock
  uint32_t next = 0;          // slots below are in use or free
  std::vector<uint32_t> free;
  uint64_t next_token = 0;
  bool inherited = false;  // MADV_DONTFORK failed: a forked child unmaps its copy

  std::atomic_ref<uint64_t> slot(uint32_t i) {
    return std::atomic_ref<uint64_t>(
        *reinterpret_cast<uint64_t*>(base + wire::kLiveSlotsOffset + size_t{i} * 8));
  }
  pthread_mutex_t* lock() {
    return reinterpret_cast<pthread_mutex_t*>(base + wire::kLiveLockOffset);
  }
};
static_assert(sizeof(pthread_mutex_t) <= wire::kLiveSlotsOffset - wire::kLiveLockOffset);

// A table for this process, sealed so that no one we send it to can write it or shrink it
// under us or the others (F_SEAL_FUTURE_WRITE: our mapping stays the only writable one).
bool live_open(LiveTable& t) {
  const int fd = memfd_create("softverbs-rds-live", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return false;
  void* p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(wire::kLiveTableBytes)) == 0)
    p = mmap(nullptr, wire::kLiveTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  pthread_mutexattr_t a;
  bool ok = p != MAP_FAILED && pthread_mutexattr_init(&a) == 0;
  if (ok) {
    ok = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) == 0 &&
         pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) == 0 &&
         pthread_mutex_init(
             reinterpret_cast<pthread_mutex_t*>(static_cast<std::byte*>(p) + wire::kLiveLockOffset),
             &a) == 0;
    pthread_mutexattr_destroy(&a);
  }
  ok = ok &&
       fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) == 0;
  if (!ok) {
    if (p != MAP_FAILED) munmap(p, wire::kLiveTableBytes);
    close(fd);
    return false;
  }
  // No child gets our writable mapping, even one forked without the atfork hooks (_Fork).
  t.inherited = madvise(p, wire::kLiveTableBytes, MADV_DONTFORK) != 0;
  t.fd = fd;
  t.base = static_cast<std::byte*>(p);
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, 0) != sizeof r) r = static_cast<uint64_t>(getpid()) << 32;
  t.next_token = r;
  return true;
}

// The owner side: our listeners and the queriers connected to each.
struct Owner {
  struct Port {
    std::string name;
    std::vector<int> queriers;
    uint32_t slot = wire::kLiveSlots;  // in the live table; kLiveSlots: none
    uint64_t token = 0;
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
  LiveTable live;
  // Queriers whose hello (and the table's descriptor in it) they may not have read yet.
  // The kernel counts a descriptor in flight against its sender's user until it is read,
  // and past RLIMIT_NOFILE of them refuses that user any more (ETOOMANYREFS, for all its
  // programs): so at most kMaxUnreadHellos, and a querier that reads none makes no room.
  std::vector<int> unread;
};
constexpr size_t kMaxUnreadHellos = 64;

void owner_release(Owner& o) {
  // fork(): the child's copies. Closing them frees nothing of the parent's, and a querier
  // of the parent sees its end of file only when the parent lets go too. The child never
  // writes the parent's live table: its mapping goes.
  for (auto& [fd, p] : o.ports) {
    close(fd);
    for (int q : p.queriers) close(q);
  }
  for (auto& [r, fd] : o.proc_fds) close(fd);
  if (o.ep >= 0) close(o.ep);
  if (o.live.base && o.live.inherited) munmap(o.live.base, wire::kLiveTableBytes);
  if (o.live.fd >= 0) close(o.live.fd);
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
  std::erase(o.unread, q);
  close(q);          // also leaves the epoll set
  resume_locked(o);  // a descriptor is free
}

// The querier q of port p gets our live table and the port's slot in it. Best effort: a
// querier that gets none (a full socket, too many descriptors in flight) peeks per send.
void send_hello_locked(Owner& o, int q, const Owner::Port& p) {
  if (!o.live.tid || p.slot >= wire::kLiveSlots) return;
  std::erase_if(o.unread, [](int r) {
    int left = 0;  // bytes the querier has not read
    return ioctl(r, SIOCOUTQ, &left) != 0 || left == 0;
  });
  if (o.unread.size() >= kMaxUnreadHellos) return;
  std::byte b[wire::kRegistryHelloLen];
  wire::registry_hello_encode({p.slot, o.live.tid, p.token}, b);
  iovec iov{b, sizeof b};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &o.live.fd, sizeof(int));
  if (sendmsg(q, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) o.unread.push_back(q);
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
    send_hello_locked(o, q, p->second);
  }
  if (!pause) return;  // a full batch: the rest at the next wake-up (level-triggered)
  watch_locked(o, listener, 0);
  if (o.paused.empty()) o.paused_at = std::chrono::steady_clock::now();
  o.paused.push_back(listener);
}

// The registry thread: takes queriers in, and lets go of those that left. A querier never
// writes: anything readable on its connection is its end of file.
void owner_loop(Owner* o) {
  // This thread holds the live table's lock for as long as the process lives: its death,
  // however it comes, is in the lock's word before our names go (wire/rds_files.h).
  // (glibc keeps the locker's thread id in the mutex's first word, as the robust futex
  // protocol asks: with a C library that did not, the table would be sent to nobody.)
  const auto tid = static_cast<uint32_t>(gettid());
  if (o->live.base && pthread_mutex_lock(o->live.lock()) == 0 &&
      (__atomic_load_n(reinterpret_cast<const uint32_t*>(o->live.lock()), __ATOMIC_RELAXED) &
       wire::kFutexTidMask) == tid) {
    std::lock_guard lk(o->mu);
    o->live.tid = tid;
  }
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
    (void)live_open(o.live);  // without one, queriers peek
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
  Owner::Port port{name, {}};
  if (o.live.base && (!o.live.free.empty() || o.live.next < wire::kLiveSlots)) {
    if (o.live.free.empty()) {
      port.slot = o.live.next++;
    } else {
      port.slot = o.live.free.back();
      o.live.free.pop_back();
    }
    if (++o.live.next_token == 0) ++o.live.next_token;  // 0 is a port let go
    port.token = o.live.next_token;
    o.live.slot(port.slot).store(port.token, std::memory_order_release);
  }
  o.ports[fd] = std::move(port);
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
  // The slot first: a querier that reads it after this finds the port let go, as one that
  // peeks after the close below finds its end of file.
  if (it->second.slot < wire::kLiveSlots) {
    o.live.slot(it->second.slot).store(0, std::memory_order_seq_cst);
    o.live.free.push_back(it->second.slot);
  }
  // Our queriers see their end of file: their cached answers are stale from now on.
  for (int q : std::vector<int>(it->second.queriers)) drop_querier_locked(o, q);
  std::erase_if(o.own_v4, [&](const auto& kv) { return kv.second == lock_fd; });
  std::erase(o.paused, lock_fd);
  o.ports.erase(it);
  close(lock_fd);  // the name is free once this returns
}

namespace {
// Lookups are on every sendmsg. A cached answer is checked against the owner's live table
// (two loads: its registry thread alive, the port's slot still the port's) once the owner's
// hello brought it; before that, and for an owner that sends none, with one non-blocking
// peek at the owner's connection, which reads "nothing yet" while it holds the port.
struct Cached {
  int fd;
  uint16_t port;
  uint64_t gen;
  const std::byte* live = nullptr;  // the owner's table, mapped read-only
  wire::RegistryHello hello;
  bool no_hello = false;  // it sent something else: peeks only
  uint32_t checks = 0;    // by the table
};
// One check by the table in kPeekEvery also peeks at the connection: should the kernel ever
// leave a dead owner's lock word as it was (its robust list lost), the answer still goes
// stale within that many sends.
constexpr uint32_t kPeekEvery = 1024;
using Cache = std::map<Key, Cached>;
void unmap_live(const Cached& c) {
  if (c.live) munmap(const_cast<std::byte*>(c.live), wire::kLiveTableBytes);
}
// A forked child closes its copies of the parent's descriptors and starts empty.
void close_cached(Cache& c) {
  for (auto& [k, v] : c) {
    close(v.fd);
    unmap_live(v);
  }
}
ForkLocal<Cache> g_cache_(&close_cached);

void uncache(Cache::iterator it) {
  close(it->second.fd);
  unmap_live(it->second);
  g_cache_.get().erase(it);
}

// The owner's table, from a descriptor another process (maybe another user's) sent: only a
// memfd that can neither shrink (a read past its end would be a SIGBUS) nor be written by
// anyone but the owner who sealed it (F_SEAL_FUTURE_WRITE: no one it was sent to can forge
// its words), of exactly the table's size, on tmpfs. Closes fd.
const std::byte* map_live(int fd) {
  constexpr int kNeed = F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE;
  struct stat st {};
  struct statfs fs {};
  const int seals = fcntl(fd, F_GET_SEALS);
  void* p = MAP_FAILED;
  // Exactly a table's size, on tmpfs: a hugetlbfs memfd would map (and have to be unmapped)
  // in huge pages, not in kLiveTableBytes.
  if (seals >= 0 && (seals & kNeed) == kNeed && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) == wire::kLiveTableBytes && fstatfs(fd, &fs) == 0 &&
      fs.f_type == TMPFS_MAGIC)
    p = mmap(nullptr, wire::kLiveTableBytes, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<const std::byte*>(p);
}

bool live_holds(const Cached& c) {
  const auto* lock = reinterpret_cast<const uint32_t*>(c.live + wire::kLiveLockOffset);
  const auto* slot =
      reinterpret_cast<const uint64_t*>(c.live + wire::kLiveSlotsOffset + size_t{c.hello.slot} * 8);
  // Acquire: what the owner let go of before it cleared the slot, or the kernel before it
  // marked the lock, is gone for us too.
  return wire::registry_live(__atomic_load_n(lock, __ATOMIC_ACQUIRE),
                             __atomic_load_n(slot, __ATOMIC_ACQUIRE), c.hello);
}

// Nothing to read while the owner holds the port; end of file (or anything else) once it
// let go or died.
bool peek_holds(const Cached& c) {
  char b;
  return recv(c.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && errno == EAGAIN;
}

// The cached answer c, checked with a system call: the owner's hello if it came (then the
// table says), else a peek. True while the owner holds the port.
bool check_by_connection(Cached& c) {
  if (c.no_hello) return peek_holds(c);
  alignas(8) std::byte b[wire::kRegistryHelloLen + 1];  // one more: a longer message is none
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 4)];
  iovec iov{b, sizeof b};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  const ssize_t n = recvmsg(c.fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return errno == EAGAIN;  // nothing yet: the owner holds the port
  if (n == 0) return false;           // it let go, or died
  // Whatever descriptors came: at most one is the table, the rest are closed.
  int table = -1;
  int extra = 0;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
      if (table < 0) {
        table = fd;
      } else {
        close(fd);
        ++extra;
      }
    }
  }
  wire::RegistryHello h;
  const bool good = !(mh.msg_flags & MSG_CTRUNC) && !extra && table >= 0 &&
                    wire::registry_hello_decode(b, static_cast<size_t>(n), h);
  const std::byte* live = good ? map_live(table) : nullptr;
  if (!good && table >= 0) close(table);
  if (!live) {
    // Not a hello we take: the owner stays checked by peeks (more bytes from it read as
    // its end, and the port is asked again).
    c.no_hello = true;
    return true;
  }
  c.live = live;
  c.hello = h;
  return live_holds(c);
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
    Cached& c = it->second;
    const bool peek = c.live && ++c.checks % kPeekEvery == 0;
    if (c.live ? live_holds(c) && (!peek || peek_holds(c)) : check_by_connection(c)) {
      if (gen) *gen = c.gen;
      return c.port;
    }
    uncache(it);  // let go, or dead: ask again
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
