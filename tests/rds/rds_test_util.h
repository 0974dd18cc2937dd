// Helpers for RDS tests: sockets on loopback, a private registry directory per run.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/rds.h>
#include <poll.h>
#include <softverbs/rds.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "wire/rds_files.h"

namespace rdstest {

inline sockaddr_in addr(uint16_t port, const char* ip = "127.0.0.1") {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// A block of 64 ports unique to this process among all that use this helper on the host (the
// registry is host-wide): the block at getpid() % 700 if free, else the next free one. The
// claim is an flock held until the process exits. Blocks picked by pid alone collided when
// two processes' pids differed by a multiple of 700, which a long test outlives under -j2.
inline int port_block() {
  static pid_t owner = 0;
  static int block = 0;
  if (owner == getpid()) return block;
  owner = getpid();
  block = owner % 700;
  const std::string dir = "/tmp/softverbs-test-ports";
  mkdir(dir.c_str(), 01777);
  for (int k = 0; k < 700; ++k) {
    const int b = (owner % 700 + k) % 700;
    const int fd =
        open((dir + "/" + std::to_string(b)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) break;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      block = b;  // fd stays open: it is the claim
      break;
    }
    close(fd);
  }
  return block;
}

inline uint16_t port(int i) {
  return static_cast<uint16_t>(20000 + port_block() * 64 + i);
}

inline int bound_socket(uint16_t p) {
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a = addr(p);
  EXPECT_EQ(svrds_bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  return fd;
}

// A registry and info/ folder of this test's own, from here to the end of the scope, for the
// processes it starts too (they inherit the environment): RDS_INFO_COUNTERS then sums only
// theirs, so an equality on a counter does not see another test's process that exits
// meanwhile. Before the stack's first use in this process (a test runs in its own process).
struct PrivateRegistry {
  char dir[32] = "/tmp/sv-rds-priv-XXXXXX";
  PrivateRegistry() {
    EXPECT_NE(mkdtemp(dir), nullptr);
    setenv("SOFTVERBS_RDS_DIR", dir, 1);
  }
  ~PrivateRegistry() {
    unsetenv("SOFTVERBS_RDS_DIR");
    const std::string cmd = std::string("rm -rf ") + dir;
    if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd;
  }
};

// Runs fn in a forked child with a fresh RDS stack (fork-local) and a registry directory, so
// counters (RDS_INFO_COUNTERS sums the host), of its own. Returns fn's result, the child's
// exit code (100 + the signal if it was killed; -1..-3 if the set-up itself failed).
template <class Fn>
int in_private_child(Fn fn) {
  char dir[] = "/tmp/sv-rds-child-XXXXXX";
  if (!mkdtemp(dir)) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("SOFTVERBS_RDS_DIR", dir, 1);
    _exit(fn());
  }
  int status = 0;
  const bool waited = pid > 0 && waitpid(pid, &status, 0) == pid;
  std::string cmd = std::string("rm -rf ") + dir;
  if (std::system(cmd.c_str()) != 0) return -2;
  if (!waited) return -3;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// The registry's abstract unix address of (127.0.0.1, port) in this process' realm.
inline socklen_t registry_addr(uint16_t port, sockaddr_un* su) {
  const std::string name = sv::wire::registry_name(
      sv::wire::registry_realm(std::getenv("SOFTVERBS_RDS_DIR")), "127.0.0.1", port);
  *su = {};
  su->sun_family = AF_UNIX;
  std::memcpy(su->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// The pid holding the registry name of (127.0.0.1, port), as the kernel says (0: nobody).
// *conn, if given, gets the connection (open) instead of closing it.
inline pid_t registry_holder(uint16_t port, int* conn = nullptr) {
  sockaddr_un su;
  const socklen_t len = registry_addr(port, &su);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return 0;
  pid_t pid = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&su), len) == 0) {
    ucred cr{};
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0) pid = cr.pid;
  }
  if (conn && pid)
    *conn = fd;
  else
    close(fd);
  return pid;
}

// The registry entry ("<rdma_cm port> <gen>") of the process holding (127.0.0.1, port), read
// as another process would (bind.cc), or "" when nobody holds it.
inline std::string registry_ask(uint16_t port) {
  const pid_t pid = registry_holder(port);
  if (!pid) return "";
  const std::string prefix =
      "@" + sv::wire::registry_proc_prefix(
                sv::wire::registry_realm(std::getenv("SOFTVERBS_RDS_DIR")), pid);
  std::ifstream f("/proc/net/unix");
  for (std::string line; std::getline(f, line);) {
    const auto sp = line.rfind(' ');
    uint16_t cm = 0;
    uint64_t gen = 0;
    if (sp != std::string::npos &&
        sv::wire::registry_proc_parse(std::string_view(line).substr(sp + 1), prefix, cm, gen))
      return std::to_string(cm) + " " + std::to_string(gen);
  }
  return "";
}

// Waits (bounded) until fd reports `ev`; returns revents or 0 on timeout.
inline short wait_for(int fd, short ev, int ms = 5000) {
  pollfd p{fd, ev, 0};
  if (poll(&p, 1, ms) <= 0) return 0;
  return p.revents;
}

inline ssize_t send_to(int fd, uint16_t dport, const void* buf, size_t len, int flags = 0) {
  sockaddr_in d = addr(dport);
  return svrds_sendto(fd, buf, len, flags, reinterpret_cast<sockaddr*>(&d), sizeof d);
}

// Receives one datagram (blocking up to 5 s through poll).
inline ssize_t recv_one(int fd, std::vector<char>& buf, sockaddr_in* from = nullptr, int flags = 0,
                        int ms = 5000) {
  if (!wait_for(fd, POLLIN, ms)) return -2;
  socklen_t fl = sizeof(sockaddr_in);
  return svrds_recvfrom(fd, buf.data(), buf.size(), flags | MSG_DONTWAIT,
                        reinterpret_cast<sockaddr*>(from), from ? &fl : nullptr);
}

// Two bound sockets of this process on consecutive ports of its block: a "client" that owns
// memory and a "server" that performs RDMA on it.
struct Pair {
  int client, server;
  uint16_t cport, sport;
  explicit Pair(int base) : cport(port(base)), sport(port(base + 1)) {
    client = bound_socket(cport);
    server = bound_socket(sport);
  }
  ~Pair() {
    svrds_close(client);
    svrds_close(server);
  }
};

// Two sockets of this process bound to ports pa and pb of 127.0.0.1 (for a forked child, whose
// stack is its own): false if a socket or bind failed.
inline bool bound_pair(uint16_t pa, uint16_t pb, int* a, int* b) {
  *a = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  *b = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in aa = addr(pa), ba = addr(pb);
  return *a >= 0 && *b >= 0 && svrds_bind(*a, reinterpret_cast<sockaddr*>(&aa), sizeof aa) == 0 &&
         svrds_bind(*b, reinterpret_cast<sockaddr*>(&ba), sizeof ba) == 0;
}

// RDS_GET_MR on [addr, addr+len): the cookie.
inline uint64_t get_mr(int fd, void* addr, size_t len, uint64_t flags = 0) {
  uint64_t cookie = 0;
  rds_get_mr_args g{
      {reinterpret_cast<uint64_t>(addr), len}, reinterpret_cast<uint64_t>(&cookie), flags};
  EXPECT_EQ(svrds_setsockopt(fd, SOL_RDS, RDS_GET_MR, &g, sizeof g), 0) << strerror(errno);
  return cookie;
}

// One recvmsg (bounded wait, then MSG_DONTWAIT) into a one-byte buffer with room for a
// control message of `len` payload bytes: recvmsg's result (-1 on timeout too), and the
// first SOL_RDS cmsg's payload copied to `out` if its type is `type` (*got says whether).
inline ssize_t recv_one_ctl(int fd, int type, void* out, size_t len, int ms, bool* got) {
  *got = false;
  if (!(wait_for(fd, POLLIN, ms) & POLLIN)) return -1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(64)];
  char d;
  iovec v{&d, 1};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = CMSG_SPACE(len);
  const ssize_t r = svrds_recvmsg(fd, &m, MSG_DONTWAIT);
  const cmsghdr* cm = r >= 0 ? CMSG_FIRSTHDR(&m) : nullptr;
  if (cm && cm->cmsg_level == SOL_RDS && cm->cmsg_type == type) {
    std::memcpy(out, CMSG_DATA(cm), len);
    *got = true;
  }
  return r;
}

// recvmsg of one control-only message (RDMA notification, congestion update): the first
// SOL_RDS cmsg of type `type`, its payload copied to `out`. False on timeout or anything else.
inline bool recv_cmsg(int fd, int type, void* out, size_t len, int ms) {
  bool got = false;
  return recv_one_ctl(fd, type, out, len, ms, &got) == 0 && got;
}

// One RDS_CMSG_RDMA_STATUS notification (bounded wait).
inline bool get_notify(int fd, rds_rdma_notify& n, int ms = 5000) {
  return recv_cmsg(fd, RDS_CMSG_RDMA_STATUS, &n, sizeof n, ms);
}

// Whatever the socket has first (recvmsg returns notifications before datagrams): 1 for a
// one-byte datagram (taken), 0 for an RDMA notification (in n), -1 for anything else.
inline int recv_byte_or_notify(int fd, rds_rdma_notify& n, int ms = 5000) {
  bool got = false;
  const ssize_t r = recv_one_ctl(fd, RDS_CMSG_RDMA_STATUS, &n, sizeof n, ms, &got);
  return r == 1 ? 1 : (r == 0 && got ? 0 : -1);
}

// One RDS_CMSG_CONG_UPDATE (bounded wait): the port-group mask.
inline bool get_cong_update(int fd, uint64_t& mask, int ms = 5000) {
  return recv_cmsg(fd, RDS_CMSG_CONG_UPDATE, &mask, sizeof mask, ms);
}

// One of this process' RDS_INFO_COUNTERS (0 if absent).
inline uint64_t counter(int fd, const char* name) {
  socklen_t len = 0;
  char probe[1];
  svrds_getsockopt(fd, SOL_RDS, RDS_INFO_COUNTERS, probe, &len);
  std::vector<char> buf(len);
  const int each = svrds_getsockopt(fd, SOL_RDS, RDS_INFO_COUNTERS, buf.data(), &len);
  if (each <= 0) return 0;
  for (size_t off = 0; off + sizeof(rds_info_counter) <= len; off += static_cast<size_t>(each)) {
    rds_info_counter c;
    std::memcpy(&c, buf.data() + off, sizeof c);
    if (std::strncmp(reinterpret_cast<const char*>(c.name), name, sizeof c.name) == 0)
      return c.value;
  }
  return 0;
}

// RDS_INFO_* message records (rds_info_message) of this host whose ports match. For
// SEND/RETRANS lport is the sender's port, for RECV the receiving socket's port.
inline int count_info_messages(int fd, int id, uint16_t lport, uint16_t fport) {
  std::vector<char> buf(64 * 1024);
  for (int tries = 0; tries < 20; ++tries) {
    socklen_t len = static_cast<socklen_t>(buf.size());
    const int each = svrds_getsockopt(fd, SOL_RDS, id, buf.data(), &len);
    if (each < 0) {
      if (errno != ENOSPC) return -1;
      buf.resize(len + 4096);
      continue;
    }
    int n = 0;
    for (size_t off = 0; off + each <= len; off += each) {
      rds_info_message r;
      std::memcpy(&r, buf.data() + off, sizeof r);
      if (r.lport == htons(lport) && r.fport == htons(fport)) ++n;
    }
    return n;
  }
  return -1;
}

// Waits (bounded, polling every few ms) until every message from sport to dport is acked,
// i.e. sits in the receiver's queue: neither queued nor awaiting its ack here.
inline bool all_acked(int fd, uint16_t sport, uint16_t dport, int ms = 3000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    if (count_info_messages(fd, RDS_INFO_SEND_MESSAGES, sport, dport) == 0 &&
        count_info_messages(fd, RDS_INFO_RETRANS_MESSAGES, sport, dport) == 0)
      return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    poll(nullptr, 0, 2);
  }
}

// Sends `msg` with an RDMA op on `cookie` from the server socket.
inline ssize_t send_rdma(int fd, uint16_t dport, uint64_t cookie, bool write,
                         std::vector<rds_iovec>& local, uint64_t remote_off, uint64_t bytes,
                         uint64_t token, const char* msg, uint64_t extra_flags = RDS_RDMA_NOTIFY_ME,
                         int send_flags = 0) {
  rds_rdma_args ra{};
  ra.cookie = cookie;
  ra.remote_vec = {remote_off, bytes};
  ra.local_vec_addr = reinterpret_cast<uint64_t>(local.data());
  ra.nr_local = local.size();
  ra.flags = (write ? RDS_RDMA_READWRITE : 0) | extra_flags;
  ra.user_token = token;
  char ctl[CMSG_SPACE(sizeof ra)] = {};
  iovec v{const_cast<char*>(msg), std::strlen(msg)};
  sockaddr_in d = addr(dport);
  msghdr m{};
  m.msg_name = &d;
  m.msg_namelen = sizeof d;
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  cmsghdr* cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_RDMA_ARGS;
  cm->cmsg_len = CMSG_LEN(sizeof ra);
  std::memcpy(CMSG_DATA(cm), &ra, sizeof ra);
  return svrds_sendmsg(fd, &m, send_flags);
}

}  // namespace rdstest
