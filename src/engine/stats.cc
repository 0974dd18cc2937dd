#include "engine/stats.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "engine/log.h"
#include "util/fork_local.h"
#include "util/private_dir.h"
#include "util/proc.h"
#include "util/settings.h"

namespace sv::engine::stats {

namespace {

// The statistics file of this process (one per fork generation).
struct File {
  std::mutex mu;  // slot claims and releases
  std::byte* map = nullptr;
  size_t len = 0;
  uint32_t nslots = 0;
  pid_t pid = 0;
  int lock_fd = -1;  // the file, open and flock'ed while we live (remove_stale)
  std::string path;
  Slot local_retired{};  // slot 0 when nothing is published

  File();
  Slot* slot(uint32_t i) {
    return reinterpret_cast<Slot*>(map + wire::kStatsHeaderLen + size_t{i} * wire::kSlotSize);
  }
  Slot* retired() { return map ? slot(0) : &local_retired; }
  bool owns(const Slot* s) const {
    auto* p = reinterpret_cast<const std::byte*>(s);
    return map && p >= map && p < map + len;
  }
};

// A fork child closes its copy of the parent's locked descriptor: the lock stays the
// parent's (flock(2): released when every duplicate is closed), and dies with it.
ForkLocal<File> g_file{[](File& f) {
  if (f.lock_fd >= 0) close(f.lock_fd);
}};

std::string stats_dir() {
  const char* d = settings::text_value(SV_SETTING("SOFTVERBS_STATS_DIR"));
  return d ? d : "/dev/shm/softverbs-stats-" + std::to_string(geteuid());
}

std::string comm() {
  char buf[32] = {};
  if (FILE* f = std::fopen("/proc/self/comm", "re")) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = '\0';
    std::fclose(f);
  }
  std::string s = buf;
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

// Files of processes that are gone (killed before they could remove theirs). Each live
// process holds its file's flock, and a file is unlinked only under that lock: with pids
// reused (pid_max 32768), a process may create the file of a dead one's pid between our look
// at /proc and our unlink, and lost its statistics that way (a test found no file).
void remove_stale(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char proc[32];
    std::snprintf(proc, sizeof proc, "/proc/%ld", pid);
    if (access(proc, F_OK) == 0) continue;
    const int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) unlinkat(dirfd(d), e->d_name, 0);
    close(fd);
  }
  closedir(d);
}

// Our file at `path`, created or taken over (a dead process's of our pid), flock'ed, and still
// named by `path` once locked (a remove_stale elsewhere may have unlinked it just before).
int open_locked(const std::string& path) {
  for (int tries = 0; tries < 8; ++tries) {
    const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    struct stat held {
    }, named{};
    if (flock(fd, LOCK_EX) == 0 && fstat(fd, &held) == 0 && stat(path.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev)
      return fd;
    close(fd);
  }
  return -1;
}

void remove_at_exit() {
  if (File* f = g_file.peek(); f && f->map && f->pid == getpid()) unlink(f->path.c_str());
}

File::File() {
  if (!settings::flag_value(SV_SETTING("SOFTVERBS_STATS"))) return;
  static_assert(settings::get("SOFTVERBS_STATS_QPS").hi < wire::kStatsMaxSlots);
  const auto qps = static_cast<uint32_t>(settings::uint_value(SV_SETTING("SOFTVERBS_STATS_QPS")));
  const std::string dir = stats_dir();
  if (!own_private_dir(dir)) {
    SV_WARN("stats: %s is not a private directory of ours; not publishing", dir.c_str());
    return;
  }
  remove_stale(dir);
  pid = getpid();
  path = dir + "/" + std::to_string(pid);
  const size_t want = wire::kStatsHeaderLen + size_t{qps + 1} * wire::kSlotSize;
  const int fd = open_locked(path);
  if (fd < 0) return;
  void* m = MAP_FAILED;
  if (ftruncate(fd, 0) == 0 && ftruncate(fd, static_cast<off_t>(want)) == 0)
    m = mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    unlink(path.c_str());
    close(fd);
    return;
  }
  lock_fd = fd;
  map = static_cast<std::byte*>(m);
  len = want;
  nslots = qps + 1;
  wire::encode_stats_header(std::span<std::byte, wire::kStatsHeaderLen>(map, wire::kStatsHeaderLen),
                            nslots, static_cast<uint32_t>(pid), proc_start_time(pid), comm());
  static const int registered = std::atexit(remove_at_exit);
  (void)registered;
}

void clear(Slot* s) {
  s->state.store(0, std::memory_order_relaxed);
  s->qp_type.store(0, std::memory_order_relaxed);
  s->dest_qpn.store(0, std::memory_order_relaxed);
  s->family = 0;
  s->port = 0;
  std::memset(s->addr, 0, sizeof s->addr);
  for (auto& c : s->ctr) c.store(0, std::memory_order_relaxed);
  for (auto& c : s->wc) c.store(0, std::memory_order_relaxed);
}

}  // namespace

Slot* attach(uint32_t qpn, uint32_t qp_type) {
  File& f = g_file.get();
  Slot* s = nullptr;
  {
    std::lock_guard lk(f.mu);
    for (uint32_t i = 1; f.map && i < f.nslots; ++i) {
      if (f.slot(i)->qpn.load(std::memory_order_relaxed) == 0) {
        s = f.slot(i);
        break;
      }
    }
    if (!s) s = new Slot{};  // not published: counted all the same
    clear(s);
    s->qp_type.store(qp_type, std::memory_order_relaxed);
    s->qpn.store(qpn, std::memory_order_release);
  }
  return s;
}

void detach(Slot* s) {
  File& f = g_file.get();
  std::lock_guard lk(f.mu);
  Slot* r = f.retired();
  for (size_t i = 0; i < wire::kCtrCount; ++i)
    r->ctr[i].fetch_add(s->ctr[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  for (size_t i = 0; i < wire::kWcStatusCount; ++i)
    r->wc[i].fetch_add(s->wc[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  if (f.owns(s)) {
    s->qpn.store(0, std::memory_order_release);
    clear(s);
  } else {
    delete s;
  }
}

void add_retired(Ctr c, uint64_t n) {
  File& f = g_file.get();
  std::lock_guard lk(f.mu);  // the file may be mapped meanwhile
  add(f.retired(), c, n);
}

void set_peer(Slot* s, const transport::SockAddr& peer, uint32_t dest_qpn) {
  File& f = g_file.get();
  std::lock_guard lk(f.mu);  // the address is plain bytes: one writer at a time
  s->dest_qpn.store(dest_qpn, std::memory_order_relaxed);
  s->family = static_cast<uint16_t>(peer.family());
  s->port = htons(peer.port());
  std::memset(s->addr, 0, sizeof s->addr);
  if (peer.family() == AF_INET)
    std::memcpy(s->addr, &reinterpret_cast<const sockaddr_in*>(&peer.ss)->sin_addr, 4);
  else if (peer.family() == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&peer.ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a)) {  // a dual-stack listener's IPv4 peer: show it as IPv4
      s->family = AF_INET;
      std::memcpy(s->addr, &a.s6_addr[12], 4);
    } else {
      std::memcpy(s->addr, &a, 16);
    }
  }
}

const char* file_path() {
  File& f = g_file.get();
  return f.map ? f.path.c_str() : "";
}

}  // namespace sv::engine::stats
