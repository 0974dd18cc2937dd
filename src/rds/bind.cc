// Host registry of bound RDS ports. Linux RDS keeps ports unique per IP in the kernel's
// bind hash; here each bound (ip, port) is a file under /dev/shm/softverbs-rds holding an
// exclusive flock for as long as the owning socket lives (the kernel drops the lock when
// the process dies, so a crashed owner frees its ports). The file holds the owner's
// rdma_cm port, so a sender can find the process to connect to.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "rds/rds_impl.h"
#include "util/fork_local.h"
#include "wire/rds_files.h"

namespace sv::rds {
namespace {
int claim(const std::string& p, uint16_t cm_port, uint64_t gen);
}  // namespace

namespace {

std::string dir() {
  const char* d = std::getenv("SOFTVERBS_RDS_DIR");
  return d && *d ? d : "/dev/shm/softverbs-rds";
}

std::string path(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return dir() + "/" + ip + "_" + std::to_string(ntohs(a.sin_port));
}

std::string path6(const sockaddr_in6& a) {
  char ip[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, &a.sin6_addr, ip, sizeof ip);
  return dir() + "/" + ip + "_" + std::to_string(ntohs(a.sin6_port));
}

}  // namespace

int registry_claim(const sockaddr_in& a, uint16_t cm_port, uint64_t gen) {
  return claim(path(a), cm_port, gen);
}

int registry_claim6(const sockaddr_in6& a, uint16_t cm_port, uint64_t gen) {
  return claim(path6(a), cm_port, gen);
}

// Shared directories (registry, info/) are used as /tmp is: created 01777 whatever the
// umask, trusted only if really a directory (not a symlink) owned by root or by us, and
// sticky when others may write (so nobody else can remove or rename our entries).
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

namespace {
int claim(const std::string& p, uint16_t cm_port, uint64_t gen) {
  if (!shared_dir_ready(dir())) return -EACCES;
  const int fd = open_own_entry(p);
  if (fd < 0) return fd;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    close(fd);
    return -EADDRINUSE;
  }
  const std::string e = wire::registry_entry_format(cm_port, gen);
  const auto n = static_cast<ssize_t>(e.size());
  if (ftruncate(fd, 0) < 0 || pwrite(fd, e.data(), e.size(), 0) != n) {
    close(fd);
    return -EIO;
  }
  return fd;
}
}  // namespace

void registry_release(int lock_fd, const sockaddr_in&) {
  // No unlink: a racing binder may hold the old inode open; the lock is what matters.
  if (lock_fd >= 0) {
    if (ftruncate(lock_fd, 0) < 0) { /* a stale number is harmless: no lock, no owner */
    }
    close(lock_fd);
  }
}

namespace {
// Lookups are on every sendmsg: keep the owner's file open and re-read only its contents
// (one pread, not open+flock+pread+close). A release truncates the file, so a changed or
// empty content sends us back to the full check; a crashed owner's stale content is caught
// when connecting to it fails (registry_forget).
struct Cached {
  int fd;
  std::string content;
  uint16_t port;
  uint64_t gen;
};
using Cache = std::map<std::pair<uint32_t, uint16_t>, Cached>;
// A forked child closes its copies of the parent's descriptors and starts empty.
void close_cached(Cache& c) {
  for (auto& [k, v] : c) close(v.fd);
}
ForkLocal<Cache> g_cache_(&close_cached);

bool parse(const char* buf, uint16_t* port, uint64_t* gen) {
  return wire::registry_entry_parse(buf, *port, *gen);
}

void uncache(Cache::iterator it) {
  close(it->second.fd);
  g_cache_.get().erase(it);
}
}  // namespace

namespace {
uint16_t lookup_file(const sockaddr_in& a, uint64_t* gen);

// Port 0 nobody holds: the first live owner of any port on the address (a readdir, only
// for pings to an address whose ping holder has exited).
uint16_t any_owner_on(in_addr ip, uint64_t* gen) {
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &ip, text, sizeof text);
  const std::string prefix = std::string(text) + "_";
  DIR* d = opendir(dir().c_str());
  if (!d) return 0;
  uint16_t found = 0;
  while (dirent* e = readdir(d)) {
    const std::string_view name(e->d_name);
    if (name.substr(0, prefix.size()) != prefix) continue;
    char* end = nullptr;
    const unsigned long p = std::strtoul(e->d_name + prefix.size(), &end, 10);
    if (*end || p == 0 || p > 65535) continue;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr = ip;
    a.sin_port = htons(static_cast<uint16_t>(p));
    if ((found = lookup_file(a, gen))) break;
  }
  closedir(d);
  return found;
}
}  // namespace

uint16_t registry_lookup(const sockaddr_in& a, uint64_t* gen) {
  const uint16_t port = lookup_file(a, gen);
  return port || a.sin_port ? port : any_owner_on(a.sin_addr, gen);
}

namespace {
uint16_t lookup_file(const sockaddr_in& a, uint64_t* gen) {
  const auto key = std::make_pair(a.sin_addr.s_addr, a.sin_port);
  char buf[48] = {};
  if (auto it = g_cache_.get().find(key); it != g_cache_.get().end()) {
    const ssize_t n = pread(it->second.fd, buf, sizeof buf - 1, 0);
    // A ping holder that exited leaves its number behind: for port 0 (pings only, so the
    // cost is off the data path) check that somebody still holds the lock.
    const bool dead = !a.sin_port && flock(it->second.fd, LOCK_SH | LOCK_NB) == 0;
    if (!dead && n > 0 && it->second.content == std::string_view(buf, static_cast<size_t>(n))) {
      if (gen) *gen = it->second.gen;
      return it->second.port;
    }
    uncache(it);
  }
  int fd = open(path(a).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return 0;
  // If we can take a shared lock nobody owns the port: the file is stale.
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
    close(fd);
    return 0;
  }
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  uint16_t port = 0;
  uint64_t g = 0;
  if (n <= 0 || !parse(buf, &port, &g)) {
    close(fd);
    return 0;
  }
  if (g_cache_.get().size() >= 1024) uncache(g_cache_.get().begin());
  g_cache_.get().emplace(key, Cached{fd, std::string(buf, static_cast<size_t>(n)), port, g});
  if (gen) *gen = g;
  return port;
}
}  // namespace

void registry_forget(uint64_t gen) {
  for (auto it = g_cache_.get().begin(); it != g_cache_.get().end();) {
    auto next = std::next(it);
    if (it->second.gen == gen) uncache(it);
    it = next;
  }
}

}  // namespace sv::rds
