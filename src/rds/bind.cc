// Host registry of bound RDS ports. Linux RDS keeps ports unique per IP in the kernel's
// bind hash; here each bound (ip, port) is a file under /dev/shm/softverbs-rds holding an
// exclusive flock for as long as the owning socket lives (the kernel drops the lock when
// the process dies, so a crashed owner frees its ports). The file holds the owner's
// rdma_cm port, so a sender can find the process to connect to.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rds/rds_impl.h"

namespace sv::rds {
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

}  // namespace

int registry_claim(const sockaddr_in& a, uint16_t cm_port, uint64_t gen) {
  mkdir(dir().c_str(), 01777);
  const std::string p = path(a);
  int fd = open(p.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  if (fd < 0) return -errno;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    close(fd);
    return -EADDRINUSE;
  }
  char buf[48];
  const int n =
      std::snprintf(buf, sizeof buf, "%u %llu\n", cm_port, static_cast<unsigned long long>(gen));
  if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, static_cast<size_t>(n), 0) != n) {
    close(fd);
    return -EIO;
  }
  return fd;
}

void registry_release(int lock_fd, const sockaddr_in&) {
  // No unlink: a racing binder may hold the old inode open; the lock is what matters.
  if (lock_fd >= 0) {
    if (ftruncate(lock_fd, 0) < 0) { /* a stale number is harmless: no lock, no owner */
    }
    close(lock_fd);
  }
}

uint16_t registry_lookup(const sockaddr_in& a, uint64_t* gen) {
  int fd = open(path(a).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  // If we can take a shared lock nobody owns the port: the file is stale.
  if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
    close(fd);
    return 0;
  }
  char buf[48] = {};
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  close(fd);
  if (n <= 0) return 0;
  char* end = nullptr;
  const auto port = static_cast<uint16_t>(std::strtoul(buf, &end, 10));
  if (gen) *gen = std::strtoull(end, nullptr, 10);
  return port;
}

}  // namespace sv::rds
