// RDS_INFO_* (net/rds info.c): getsockopt returns the size of one record and sets *len
// to the total; a short buffer gets ENOSPC with *len = bytes needed.
// In Linux the snapshot is host-wide. Here each process is its own RDS stack, so every
// process publishes its records to <registry>/info/<pid> about twice a second, and a
// query returns this process' live records plus those of every other live process
// (counters summed by name), so rds-info sees the whole host.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
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

void info_publish() {
  // File: repeated [int id][int each][u32 bytes][records].
  std::string blob;
  for (int id : kInfoIds) {
    std::vector<char> r;
    int each = 0;
    if (local_records(id, r, &each) < 0) continue;
    wire::info_blob_append(blob, id, each, r.data(), static_cast<uint32_t>(r.size()));
  }
  const std::string dir = info_dir();
  if (!shared_dir_ready(dir.substr(0, dir.rfind('/'))) || !shared_dir_ready(dir)) return;
  const std::string path = dir + "/" + std::to_string(getpid());
  const std::string tmp = path + ".tmp";
  // Never through a symlink, never into another user's file (bind.cc open_own_entry).
  const int fd = open_own_entry(tmp);
  if (fd < 0) return;
  bool ok = ftruncate(fd, 0) == 0;
  for (size_t off = 0; ok && off < blob.size();) {
    const ssize_t w = write(fd, blob.data() + off, blob.size() - off);
    ok = w > 0;
    off += ok ? static_cast<size_t>(w) : 0;
  }
  close(fd);
  if (ok) std::rename(tmp.c_str(), path.c_str());
}

void info_unpublish() {
  unlink((info_dir() + "/" + std::to_string(getpid())).c_str());
}

namespace {
// A snapshot another process published: a regular file (no symlink), at most 16 MiB.
bool read_snapshot(const std::string& p, std::string& out) {
  constexpr size_t kMax = 16u << 20;
  const int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) > kMax) {
    close(fd);
    return false;
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = read(fd, out.data() + got, out.size() - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  close(fd);
  return true;
}

// Other live processes' published records for one id.
void remote_records(int optname, int each, std::vector<char>& out) {
  DIR* d = opendir(info_dir().c_str());
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 0 || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) < 0 && errno == ESRCH) {
      unlink((info_dir() + "/" + e->d_name).c_str());  // its owner is gone
      continue;
    }
    std::string blob;
    if (!read_snapshot(info_dir() + "/" + e->d_name, blob)) continue;
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
}  // namespace

int info_get(int optname, void* buf, socklen_t* len) {
  std::vector<char> all;
  int each = 0;
  if (int r = local_records(optname, all, &each); r < 0) return r;
  remote_records(optname, each, all);
  if (optname == RDS_INFO_COUNTERS) {
    // Counters are host-wide in Linux: sum them by name.
    std::vector<rds_info_counter> sum;
    for (size_t off = 0; off + sizeof(rds_info_counter) <= all.size();
         off += sizeof(rds_info_counter)) {
      rds_info_counter c;
      std::memcpy(&c, all.data() + off, sizeof c);
      bool merged = false;
      for (auto& x : sum)
        if (!std::memcmp(x.name, c.name, sizeof c.name)) {
          x.value += c.value;
          merged = true;
        }
      if (!merged) sum.push_back(c);
    }
    all.assign(reinterpret_cast<const char*>(sum.data()),
               reinterpret_cast<const char*>(sum.data()) + sum.size() * sizeof(rds_info_counter));
  }
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
      Counters now = G.counters;
      now[static_cast<size_t>(Ctr::cq_handler_declined)] +=
          G.cq_declined.load(std::memory_order_relaxed);
      std::vector<rds_info_counter> v(kCtrCount);
      for (size_t i = 0; i < kCtrCount; ++i) {
        std::strncpy(reinterpret_cast<char*>(v[i].name), kCtrNames[i], sizeof v[i].name - 1);
        v[i].value = now[i];
      }
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
        r.max_recv_wr = kRecvBufs + 1;
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
      for (auto& [fd, s] : G.socks)
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
