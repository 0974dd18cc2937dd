// RDS_INFO_* (net/rds info.c): getsockopt returns the size of one record and sets *len
// to the total; a short buffer gets ENOSPC with *len = bytes needed.
// In Linux the snapshot is host-wide. Here each process is its own RDS stack, so every
// process publishes its records to <registry>/info/<pid> about twice a second, and a
// query returns this process' live records plus those of every other live process
// (counters summed by name), so rds-info sees the whole host.
// Counters only grow, as net/rds's rds_stats (per-cpu sums since boot): a process that
// ends folds its counters into <registry>/info/retired.<uid>, and a killed process'
// last snapshot is folded by the next reader of its user, so the host's sums never go
// down when a process exits.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "rds/rds_impl.h"
#include "wire/rds_files.h"

namespace sv::rds {
namespace {

// RDS6_INFO_* report IPv4 addresses v4-mapped, as net/rds does.
in6_addr mapped(uint32_t v4) {
  in6_addr a{};
  a.s6_addr[10] = a.s6_addr[11] = 0xff;
  std::memcpy(&a.s6_addr[12], &v4, 4);
  return a;
}

template <class Rec>
void add_messages(std::vector<Rec>& v, Conn* c, const std::deque<Message*>& q) {
  for (Message* m : q) {
    Rec r{};
    r.seq = m->h.sequence;
    r.len = m->h.len;
    if constexpr (std::is_same_v<Rec, rds_info_message>) {
      r.laddr = c->local.sin_addr.s_addr;
      r.faddr = c->peer.sin_addr.s_addr;
    } else {
      r.laddr = mapped(c->local.sin_addr.s_addr);
      r.faddr = mapped(c->peer.sin_addr.s_addr);
    }
    r.lport = htons(m->h.sport);
    r.fport = htons(m->h.dport);
    r.flags = (m->h.flags & wire::kRdsFlagAckRequired) ? RDS_INFO_MESSAGE_FLAG_ACK : 0;
    v.push_back(r);
  }
}

uint8_t conn_flags(const Conn* c) {
  return (c->state == ConnState::up ? RDS_INFO_CONNECTION_FLAG_CONNECTED : 0) |
         (c->state == ConnState::connecting ? RDS_INFO_CONNECTION_FLAG_CONNECTING : 0) |
         (!c->send_q.empty() ? RDS_INFO_CONNECTION_FLAG_SENDING : 0);
}

constexpr char kTransport[] = "softverbs";

// Shared directories (the info/ folder and its parent) are used as /tmp is: created 01777 whatever
// the umask, trusted only if really a directory (not a symlink) owned by root or by us, and sticky
// when others may write (so nobody else can remove or rename our entries).
bool shared_dir_ready(const std::string& d) {
  if (mkdir(d.c_str(), 01777) == 0) chmod(d.c_str(), 01777);  // the umask cut the mode
  struct stat st {};
  if (lstat(d.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  if (st.st_uid != 0 && st.st_uid != geteuid()) return false;
  if ((st.st_mode & (S_IWOTH | S_IWGRP)) && !(st.st_mode & S_ISVTX)) return false;
  return true;
}

// Opens our own entry p for writing, creating it 0644 (others read, only we write). Never
// follows a symlink. An entry of another user, or a planted symlink, is removed if nobody
// holds it and we may (its owner or root: the directory is sticky); otherwise -EADDRINUSE.
int open_own_entry(const std::string& p) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) {
      struct stat st {};
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
          st.st_nlink == 1) {
        if ((st.st_mode & 07777) != 0644) fchmod(fd, 0644);
        return fd;
      }
      close(fd);
    } else if (errno != ELOOP && errno != EACCES && errno != EPERM) {
      return -errno;
    }
    // Someone else's: live while its owner holds the lock.
    const int rfd = open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (rfd >= 0) {
      const bool live = flock(rfd, LOCK_SH | LOCK_NB) != 0;
      close(rfd);
      if (live) return -EADDRINUSE;
    }
    count(Ctr::registry_foreign_entry);
    if (unlink(p.c_str()) != 0) return -EADDRINUSE;
  }
  return -EADDRINUSE;
}

}  // namespace

// This process' records for one id, as raw bytes; record size in *each. -ENOPROTOOPT for
// an unknown id.
int local_records(int optname, std::vector<char>& out, int* each);

std::string info_dir() {
  const char* d = std::getenv("SOFTVERBS_RDS_DIR");
  return std::string(d && *d ? d : "/dev/shm/softverbs-rds") + "/info";
}

constexpr int kInfoIds[] = {
    RDS_INFO_COUNTERS,       RDS_INFO_SOCKETS,           RDS_INFO_CONNECTIONS,
    RDS_INFO_SEND_MESSAGES,  RDS_INFO_RETRANS_MESSAGES,  RDS_INFO_RECV_MESSAGES,
    RDS_INFO_IB_CONNECTIONS, RDS6_INFO_SOCKETS,          RDS6_INFO_CONNECTIONS,
    RDS6_INFO_SEND_MESSAGES, RDS6_INFO_RETRANS_MESSAGES, RDS6_INFO_RECV_MESSAGES,
    RDS6_INFO_IB_CONNECTIONS};

namespace {
void fold_stale_own();

// Writes `blob` to <path>.tmp (ours: never through a symlink, never another user's file,
// open_own_entry) and renames it over `path`: readers see the old file or the new
// one, whole.
bool replace_file(const std::string& path, const std::string& blob) {
  const std::string tmp = path + ".tmp";
  const int fd = open_own_entry(tmp);
  if (fd < 0) return false;
  bool ok = ftruncate(fd, 0) == 0;
  for (size_t off = 0; ok && off < blob.size();) {
    const ssize_t w = write(fd, blob.data() + off, blob.size() - off);
    ok = w > 0;
    off += ok ? static_cast<size_t>(w) : 0;
  }
  close(fd);
  return ok && std::rename(tmp.c_str(), path.c_str()) == 0;
}
std::string snapshot_path(long pid) {
  return info_dir() + "/" + std::to_string(pid);
}

// /proc/<pid>/stat's starttime (field 22), 0 if the process is gone or unreadable.
uint64_t start_time(long pid) {
  char buf[1024];
  const int fd = open(("/proc/" + std::to_string(pid) + "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // comm may hold spaces and parentheses
  for (int field = 2; p && field < 22; ++field) p = std::strchr(p + 1, ' ');
  return p ? std::strtoull(p + 1, nullptr, 10) : 0;
}

uint64_t pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

wire::InfoMeta my_meta() {
  static const wire::InfoMeta m = [] {
    wire::InfoMeta x;
    x.start = start_time(getpid());
    x.pidns = pid_namespace();
    return x;
  }();
  wire::InfoMeta x = m;
  x.gen = g().gen;
  return x;
}
}  // namespace

std::string info_snapshot_locked() {
  // File: repeated [int id][int each][u32 bytes][records].
  std::string blob;
  const wire::InfoMeta meta = my_meta();
  wire::info_blob_append(blob, wire::kInfoMeta, sizeof meta, reinterpret_cast<const char*>(&meta),
                         sizeof meta);
  for (int id : kInfoIds) {
    std::vector<char> r;
    int each = 0;
    if (local_records(id, r, &each) < 0) continue;
    wire::info_blob_append(blob, id, each, r.data(), static_cast<uint32_t>(r.size()));
  }
  return blob;
}

namespace {
// Global::publish_mu held.
void write_snapshot_publish_locked(const std::string& blob) {
  const std::string dir = info_dir();
  if (!shared_dir_ready(dir.substr(0, dir.rfind('/'))) || !shared_dir_ready(dir)) return;
  const std::string path = snapshot_path(getpid());
  static pid_t first_published = 0;  // per process: a fork()ed child publishes anew
  if (first_published != getpid()) {
    // A snapshot left under our pid by a process that died before us: fold it first.
    fold_stale_own();
    first_published = getpid();
  }
  replace_file(path, blob);
}
}  // namespace

void info_write(const std::string& blob) {
  std::lock_guard lk(g().publish_mu);
  if (blob.empty() || g().info_retired) return;
  write_snapshot_publish_locked(blob);
}

namespace {
// A file another process (maybe another user) wrote: a regular file, at most 16 MiB.
bool read_bounded(int fd, std::string& out, struct stat* st_out = nullptr) {
  constexpr size_t kMax = 16u << 20;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) > kMax)
    return false;
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  if (st_out) *st_out = st;
  return true;
}

// A file in the info directory (never through a symlink), and its owner.
bool read_info_file(const std::string& p, std::string& out, uid_t* owner = nullptr) {
  const int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st {};
  const bool ok = read_bounded(fd, out, &st);
  close(fd);
  if (owner) *owner = st.st_uid;
  return ok;
}

bool process_gone(long pid) {
  return kill(static_cast<pid_t>(pid), 0) < 0 && errno == ESRCH;
}

// Whether the process that wrote a snapshot has ended. Only a process of our own pid
// namespace can be known to be gone; any other stays (counted, never folded by us).
bool writer_gone(long pid, const wire::InfoMeta& m) {
  if (m.pidns != my_meta().pidns) return false;
  const uint64_t st = start_time(pid);
  return st == 0 || st != m.start;
}

// Adds counter records to `sum` by name. Only the names `sum` already has (ours, in
// kCtrNames' order) are taken: another user's file cannot grow the table, and the merge
// stays O(records x names) whatever it holds. Sums saturate rather than wrap.
void merge_counters(std::vector<rds_info_counter>& sum, const char* recs, size_t bytes) {
  for (size_t off = 0; off + sizeof(rds_info_counter) <= bytes; off += sizeof(rds_info_counter)) {
    rds_info_counter c;
    std::memcpy(&c, recs + off, sizeof c);
    for (auto& x : sum)
      if (!std::memcmp(x.name, c.name, sizeof c.name)) {
        x.value = x.value + c.value < x.value ? UINT64_MAX : x.value + c.value;
        break;
      }
  }
}

std::vector<rds_info_counter> zero_counters() {
  std::vector<rds_info_counter> v(kCtrCount);
  for (size_t i = 0; i < kCtrCount; ++i)
    std::strncpy(reinterpret_cast<char*>(v[i].name), kCtrNames[i], sizeof v[i].name - 1);
  return v;
}

// A retired sum: its counters and the generations folded into it.
struct Retired {
  std::vector<char> counters;
  std::vector<uint64_t> folded;
};
bool parse_retired(std::string_view blob, Retired& r) {
  return wire::info_retired_parse(blob, RDS_INFO_COUNTERS, sizeof(rds_info_counter), r.counters,
                                  r.folded);
}

// This user's retired sum is rewritten by one process at a time: under an flock of a file
// only this user can open (0600), so no other user can make our processes wait.
int lock_retired() {
  const std::string p = info_dir() + "/retired." + std::to_string(geteuid()) + ".lock";
  const int fd = open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -1;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);  // planted by someone else: nothing is folded (snapshots stay, counted)
    return -1;
  }
  for (int i = 0; i < 100; ++i) {  // our own processes hold it for a file rewrite
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (errno != EWOULDBLOCK && errno != EINTR) break;
    usleep(1000);
  }
  close(fd);
  return -1;
}

// Adds `counters` of generation `gen` to this user's retired sum (a new file renamed into
// place: a reader sees the old sum or the new one, whole), then removes `snapshot` if
// given. Caller holds lock_retired(). Readers take a snapshot's counters only if its
// generation is not in the sum's folded list, and read the sums after the snapshots (see
// counter_view): so whenever this happens, a reader counts these counters exactly once.
bool retire_locked(uint64_t gen, const char* counters, size_t bytes, const std::string& snapshot) {
  const std::string path = info_dir() + "/retired." + std::to_string(geteuid());
  Retired old;
  std::string blob;
  uid_t owner = 0;
  if (read_info_file(path, blob, &owner) && owner == geteuid() && !parse_retired(blob, old))
    return false;  // ours but unreadable: keep what we have rather than start over
  std::vector<rds_info_counter> sum = zero_counters();
  merge_counters(sum, old.counters.data(), old.counters.size());
  merge_counters(sum, counters, bytes);
  old.folded.push_back(gen);
  if (old.folded.size() > wire::kInfoFoldedMax)
    old.folded.erase(
        old.folded.begin(),
        old.folded.begin() + static_cast<long>(old.folded.size() - wire::kInfoFoldedMax));
  std::string out;
  wire::info_blob_append(out, RDS_INFO_COUNTERS, sizeof(rds_info_counter),
                         reinterpret_cast<const char*>(sum.data()),
                         static_cast<uint32_t>(sum.size() * sizeof(rds_info_counter)));
  wire::info_blob_append(out, wire::kInfoFolded, 8,
                         reinterpret_cast<const char*>(old.folded.data()),
                         static_cast<uint32_t>(old.folded.size() * 8));
  if (!replace_file(path, out)) return false;
  if (!snapshot.empty()) unlink(snapshot.c_str());
  return true;
}

// Snapshots of this user's processes that ended without exiting (SIGKILL), or whose pid
// we now have: folded into the retired sum. A leftover .tmp of such a process: removed.
void fold_stale_own() {
  DIR* d = opendir(info_dir().c_str());
  if (!d) return;
  std::vector<std::pair<long, std::string>> stale;
  while (dirent* e = readdir(d)) {
    char* end;
    const long pid = std::strtol(e->d_name, &end, 10);
    const bool tmp = std::strcmp(end, ".tmp") == 0;
    if ((*end && !tmp) || pid <= 0) continue;
    struct stat st {};
    const std::string p = info_dir() + "/" + e->d_name;
    if (lstat(p.c_str(), &st) != 0 || st.st_uid != geteuid()) continue;
    if (tmp) {
      if (pid != getpid() && process_gone(pid)) unlink(p.c_str());
    } else if (stale.size() < 256) {  // per call; the next read takes the rest
      stale.emplace_back(pid, p);
    }
  }
  closedir(d);
  int lk = -1;
  for (const auto& [pid, p] : stale) {
    std::string blob;
    uid_t owner = 0;
    wire::InfoMeta m;
    // Read twice: cheaply to skip the live ones, then under the lock (another of our
    // processes may have folded it meanwhile, or a new one taken the pid and published).
    if (!read_info_file(p, blob, &owner)) continue;
    if (!wire::info_meta_parse(blob, m)) {  // an older release's, or garbage: ours, so removable
      if (pid != getpid() && process_gone(pid)) unlink(p.c_str());
      continue;
    }
    if (m.gen == g().gen || !writer_gone(pid, m)) continue;
    if (lk < 0 && (lk = lock_retired()) < 0) return;
    if (!read_info_file(p, blob, &owner) || owner != geteuid() || !wire::info_meta_parse(blob, m) ||
        m.gen == g().gen || !writer_gone(pid, m))
      continue;
    std::vector<char> recs;
    if (!wire::info_blob_records(blob, RDS_INFO_COUNTERS, sizeof(rds_info_counter), recs)) continue;
    retire_locked(m.gen, recs.data(), recs.size(), p);
  }
  if (lk >= 0) close(lk);
}

// Other live processes' published records for one id.
void remote_records(int optname, int each, std::vector<char>& out) {
  DIR* d = opendir(info_dir().c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == getpid() || process_gone(pid)) continue;
    std::string blob;
    if (!read_info_file(info_dir() + "/" + e->d_name, blob)) continue;
    // Another process' (maybe another user's) file: only whole records of the size we
    // know are taken, so a bad one cannot shift everyone else's.
    std::vector<char> recs;
    if (wire::info_blob_records(blob, optname, each, recs))
      out.insert(out.end(), recs.begin(), recs.end());
    else
      count(Ctr::info_snapshot_malformed);
  }
  closedir(d);
}

// Counters are host-wide in Linux, and only grow: ours, every other process' snapshot (live
// or not yet folded) and every user's retired sum, added by name. The snapshots are read
// first, the retired sums after: a process whose counters were folded in between is in a
// sum's folded list, and its snapshot is then not counted. A sum's list covers only its
// own user's snapshots, so nobody can make another user's counters disappear.
void counter_view(std::vector<char>& all) {
  {
    // Not beside the engine thread's first publication's fold: two of our descriptors of the
    // retired-sum lock would exclude each other (flock), and one would give up.
    std::lock_guard lk(g().publish_mu);
    fold_stale_own();
  }
  struct Snap {
    uid_t owner;
    uint64_t gen;
    std::vector<char> counters;
  };
  std::vector<Snap> snaps;
  const std::string dir = info_dir();
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char* end;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (*end || pid <= 0) continue;
      Snap s{};
      std::string blob;
      wire::InfoMeta m;
      if (!read_info_file(dir + "/" + e->d_name, blob, &s.owner)) continue;
      if (!wire::info_meta_parse(blob, m)) {
        count(Ctr::info_snapshot_malformed);
        continue;
      }
      if (m.gen == g().gen) continue;  // ours: the live counters are in `all` already
      s.gen = m.gen;
      if (!wire::info_blob_records(blob, RDS_INFO_COUNTERS, sizeof(rds_info_counter), s.counters))
        count(Ctr::info_snapshot_malformed);
      snaps.push_back(std::move(s));
    }
    closedir(d);
  }
  std::unordered_map<uid_t, std::unordered_set<uint64_t>> folded;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strncmp(e->d_name, "retired.", 8) != 0) continue;
      char* end;
      const unsigned long uid = std::strtoul(e->d_name + 8, &end, 10);
      std::string blob;
      uid_t owner = 0;
      Retired r;
      // One sum per user, in a file that user owns: nobody adds to another's share.
      if (*end || !read_info_file(dir + "/" + e->d_name, blob, &owner) || owner != uid) continue;
      if (!parse_retired(blob, r)) {
        count(Ctr::info_snapshot_malformed);
        continue;
      }
      all.insert(all.end(), r.counters.begin(), r.counters.end());
      folded[owner].insert(r.folded.begin(), r.folded.end());
    }
    closedir(d);
  }
  for (const Snap& s : snaps) {
    auto it = folded.find(s.owner);
    if (it == folded.end() || !it->second.count(s.gen))
      all.insert(all.end(), s.counters.begin(), s.counters.end());
  }
  std::vector<rds_info_counter> sum = zero_counters();
  merge_counters(sum, all.data(), all.size());
  all.assign(reinterpret_cast<const char*>(sum.data()),
             reinterpret_cast<const char*>(sum.data()) + sum.size() * sizeof(rds_info_counter));
}
}  // namespace

void info_unpublish() {
  // atexit (every handler a fork()ed child inherited too: only the first does anything).
  // Our final counters go into the retired sum and our snapshot away, and the engine
  // thread, which runs until the process ends, publishes no more.
  Global& G = g();
  std::lock_guard lk(G.mu);
  if (!G.cm_port || G.info_retired) return;  // never used RDS, or done
  std::lock_guard plk(G.publish_mu);
  G.info_retired = true;
  const std::string dir = info_dir();
  if (!shared_dir_ready(dir.substr(0, dir.rfind('/'))) || !shared_dir_ready(dir)) return;
  std::vector<char> recs;
  int each = 0;
  if (local_records(RDS_INFO_COUNTERS, recs, &each) < 0) return;
  const int lk_fd = lock_retired();
  if (lk_fd >= 0 && retire_locked(G.gen, recs.data(), recs.size(), snapshot_path(getpid()))) {
    close(lk_fd);
    return;
  }
  if (lk_fd >= 0) close(lk_fd);
  // Not folded: our last counters stay in a snapshot, for our next process to fold.
  write_snapshot_publish_locked(info_snapshot_locked());
}

int info_get(int optname, void* buf, socklen_t* len) {
  std::vector<char> all;
  int each = 0;
  if (int r = local_records(optname, all, &each); r < 0) return r;
  if (optname == RDS_INFO_COUNTERS)
    counter_view(all);
  else
    remote_records(optname, each, all);
  if (*len < all.size()) {
    *len = static_cast<socklen_t>(all.size());
    return -ENOSPC;
  }
  if (!all.empty()) std::memcpy(buf, all.data(), all.size());
  *len = static_cast<socklen_t>(all.size());
  return each;
}

namespace {
template <typename T>
int as_bytes(const std::vector<T>& v, std::vector<char>& out, int* each) {
  out.assign(reinterpret_cast<const char*>(v.data()),
             reinterpret_cast<const char*>(v.data()) + v.size() * sizeof(T));
  *each = static_cast<int>(sizeof(T));
  return 0;
}
}  // namespace

int local_records(int optname, std::vector<char>& out, int* each) {
  Global& G = g();
  switch (optname) {
    case RDS_INFO_COUNTERS: {
      // Every counter, zeros included, as the kernel's rds_stat_names.
      std::vector<rds_info_counter> v = zero_counters();
      for (size_t i = 0; i < kCtrCount; ++i)
        v[i].value = G.counters[i].load(std::memory_order_relaxed);
      return as_bytes(v, out, each);
    }
    case RDS_INFO_SOCKETS: {
      std::vector<rds_info_socket> v;
      for (auto& [fd, s] : G.socks) {
        if (s->v6) continue;  // RDS6_INFO_SOCKETS lists it
        rds_info_socket r{};
        r.sndbuf = s->sndbuf;
        r.rcvbuf = s->rcvbuf;
        r.bound_addr = s->bound_addr.sin_addr.s_addr;
        r.bound_port = s->bound_addr.sin_port;
        r.connected_addr = s->conn_addr.sin_addr.s_addr;
        r.connected_port = s->conn_addr.sin_port;
        r.inum = s->inum;
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS6_INFO_SOCKETS: {
      std::vector<rds6_info_socket> v;
      for (auto& [fd, s] : G.socks) {
        rds6_info_socket r{};
        r.sndbuf = s->sndbuf;
        r.rcvbuf = s->rcvbuf;
        r.bound_addr = s->v6 ? s->bound6.sin6_addr : mapped(s->bound_addr.sin_addr.s_addr);
        r.bound_port = s->bound_addr.sin_port;
        r.connected_addr = mapped(s->conn_addr.sin_addr.s_addr);
        r.connected_port = s->conn_addr.sin_port;
        r.inum = s->inum;
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS_INFO_CONNECTIONS: {
      std::vector<rds_info_connection> v;
      for (auto& [k, c] : G.conns) {
        rds_info_connection r{};
        r.next_tx_seq = c->next_tx_seq;
        r.next_rx_seq = c->rx.next_seq;
        r.laddr = c->local.sin_addr.s_addr;
        r.faddr = c->peer.sin_addr.s_addr;
        std::strncpy(reinterpret_cast<char*>(r.transport), kTransport, sizeof r.transport - 1);
        r.flags = conn_flags(c);
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS6_INFO_CONNECTIONS: {
      std::vector<rds6_info_connection> v;
      for (auto& [k, c] : G.conns) {
        rds6_info_connection r{};
        r.next_tx_seq = c->next_tx_seq;
        r.next_rx_seq = c->rx.next_seq;
        r.laddr = mapped(c->local.sin_addr.s_addr);
        r.faddr = mapped(c->peer.sin_addr.s_addr);
        std::strncpy(reinterpret_cast<char*>(r.transport), kTransport, sizeof r.transport - 1);
        r.flags = conn_flags(c);
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS_INFO_IB_CONNECTIONS:
    case RDS6_INFO_IB_CONNECTIONS: {
      // The RC QP of each connection (net/rds ib.c rds_ib_conn_info_visitor): GIDs only once
      // it is up; ours are the addresses, IPv4-mapped as the device's GID table has them.
      std::vector<rds_info_rdma_connection> v4;
      std::vector<rds6_info_rdma_connection> v6;
      for (auto& [k, c] : G.conns) {
        rds6_info_rdma_connection r{};
        r.src_addr = mapped(c->local.sin_addr.s_addr);
        r.dst_addr = mapped(c->peer.sin_addr.s_addr);
        if (c->state == ConnState::up) {
          std::memcpy(r.src_gid, &r.src_addr, sizeof r.src_gid);
          std::memcpy(r.dst_gid, &r.dst_addr, sizeof r.dst_gid);
        }
        r.max_send_wr = kSendSlots + 64;
        // SRQ mode: the receives its QP may take are the shared pool's.
        r.max_recv_wr = G.srq ? static_cast<uint32_t>(G.srq_cap) : kRecvBufs + 1;
        r.max_send_sge = 16;
        r.rdma_mr_max = G.mr_max;
        r.rdma_mr_size = static_cast<uint32_t>(kMaxMsgSize / 4096);  // pages per mapping
        if (optname == RDS6_INFO_IB_CONNECTIONS) {
          v6.push_back(r);
          continue;
        }
        rds_info_rdma_connection r4{};
        r4.src_addr = c->local.sin_addr.s_addr;
        r4.dst_addr = c->peer.sin_addr.s_addr;
        std::memcpy(r4.src_gid, r.src_gid, sizeof r4.src_gid);
        std::memcpy(r4.dst_gid, r.dst_gid, sizeof r4.dst_gid);
        r4.max_send_wr = r.max_send_wr;
        r4.max_recv_wr = r.max_recv_wr;
        r4.max_send_sge = r.max_send_sge;
        r4.rdma_mr_max = r.rdma_mr_max;
        r4.rdma_mr_size = r.rdma_mr_size;
        v4.push_back(r4);
      }
      return optname == RDS_INFO_IB_CONNECTIONS ? as_bytes(v4, out, each) : as_bytes(v6, out, each);
    }
    case RDS_INFO_SEND_MESSAGES:
    case RDS_INFO_RETRANS_MESSAGES: {
      std::vector<rds_info_message> v;
      for (auto& [k, c] : G.conns)
        add_messages(v, c, optname == RDS_INFO_SEND_MESSAGES ? c->send_q : c->retrans);
      return as_bytes(v, out, each);
    }
    case RDS6_INFO_SEND_MESSAGES:
    case RDS6_INFO_RETRANS_MESSAGES: {
      std::vector<rds6_info_message> v;
      for (auto& [k, c] : G.conns)
        add_messages(v, c, optname == RDS6_INFO_SEND_MESSAGES ? c->send_q : c->retrans);
      return as_bytes(v, out, each);
    }
    case RDS_INFO_RECV_MESSAGES:
    case RDS6_INFO_RECV_MESSAGES: {
      std::vector<rds_info_message> v;
      std::vector<rds6_info_message> v6;
      for (auto& [fd, s] : G.socks) {
        std::lock_guard rlk(s->rs_recv_lock);
        for (const Incoming& in : s->rq) {
          rds6_info_message r{};
          r.len = static_cast<uint32_t>(in.data.size());
          r.laddr = s->v6 ? s->bound6.sin6_addr : mapped(s->bound_addr.sin_addr.s_addr);
          r.lport = s->bound_addr.sin_port;
          r.faddr = mapped(in.from.sin_addr.s_addr);
          r.fport = in.from.sin_port;
          if (optname == RDS6_INFO_RECV_MESSAGES) {
            v6.push_back(r);
          } else if (!s->v6) {
            rds_info_message r4{};
            r4.len = r.len;
            r4.laddr = s->bound_addr.sin_addr.s_addr;
            r4.lport = r.lport;
            r4.faddr = in.from.sin_addr.s_addr;
            r4.fport = r.fport;
            v.push_back(r4);
          }
        }
      }
      return optname == RDS_INFO_RECV_MESSAGES ? as_bytes(v, out, each) : as_bytes(v6, out, each);
    }
    // RDS_INFO_TCP_SOCKETS / RDS6_INFO_TCP_SOCKETS: there is no RDS/TCP transport here, as
    // on a host with rds_rdma and no rds_tcp loaded. RDS_INFO_CONNECTION_STATS and
    // RDS_INFO_IWARP_CONNECTIONS have no handler in upstream Linux either.
    default:
      return -ENOPROTOOPT;
  }
}

}  // namespace sv::rds
