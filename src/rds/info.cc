// RDS_INFO_* (net/rds info.c): getsockopt returns the size of one record and sets *len
// to the total; a short buffer gets ENOSPC with *len = bytes needed.
// In Linux the snapshot is host-wide. Here each process is its own RDS stack, so every
// process publishes its records to <registry>/info/<pid> about twice a second, and a
// query returns this process' live records plus those of every other live process
// (counters summed by name), so rds-info sees the whole host.
#include <arpa/inet.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "rds/rds_impl.h"

namespace sv::rds {
namespace {

void add_messages(std::vector<rds_info_message>& v, Conn* c, const std::deque<Message*>& q) {
  for (Message* m : q) {
    rds_info_message r{};
    r.seq = m->h.sequence;
    r.len = m->h.len;
    r.laddr = c->local.sin_addr.s_addr;
    r.faddr = c->peer.sin_addr.s_addr;
    r.lport = htons(m->h.sport);
    r.fport = htons(m->h.dport);
    r.flags = (m->h.flags & wire::kRdsFlagAckRequired) ? RDS_INFO_MESSAGE_FLAG_ACK : 0;
    v.push_back(r);
  }
}

}  // namespace

// This process' records for one id, as raw bytes; record size in *each. -ENOPROTOOPT for
// an unknown id.
int local_records(int optname, std::vector<char>& out, int* each);

std::string info_dir() {
  const char* d = std::getenv("SOFTVERBS_RDS_DIR");
  return std::string(d && *d ? d : "/dev/shm/softverbs-rds") + "/info";
}

constexpr int kInfoIds[] = {RDS_INFO_COUNTERS,         RDS_INFO_SOCKETS,
                            RDS_INFO_CONNECTIONS,      RDS_INFO_SEND_MESSAGES,
                            RDS_INFO_RETRANS_MESSAGES, RDS_INFO_RECV_MESSAGES};

void info_publish() {
  // File: repeated [int id][int each][u32 bytes][records].
  std::string blob;
  for (int id : kInfoIds) {
    std::vector<char> r;
    int each = 0;
    if (local_records(id, r, &each) < 0) continue;
    const uint32_t n = static_cast<uint32_t>(r.size());
    blob.append(reinterpret_cast<const char*>(&id), sizeof id);
    blob.append(reinterpret_cast<const char*>(&each), sizeof each);
    blob.append(reinterpret_cast<const char*>(&n), sizeof n);
    blob.append(r.data(), r.size());
  }
  const std::string dir = info_dir();
  mkdir(dir.substr(0, dir.rfind('/')).c_str(), 01777);
  mkdir(dir.c_str(), 01777);
  const std::string path = dir + "/" + std::to_string(getpid());
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return;
  const bool ok = std::fwrite(blob.data(), 1, blob.size(), f) == blob.size();
  std::fclose(f);
  if (ok) std::rename(tmp.c_str(), path.c_str());
}

void info_unpublish() {
  unlink((info_dir() + "/" + std::to_string(getpid())).c_str());
}

namespace {
// Other live processes' published records for one id.
void remote_records(int optname, std::vector<char>& out) {
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
    std::ifstream f(info_dir() + "/" + e->d_name, std::ios::binary);
    std::string blob((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t off = 0;
    while (off + 12 <= blob.size()) {
      int id, each;
      uint32_t n;
      std::memcpy(&id, blob.data() + off, 4);
      std::memcpy(&each, blob.data() + off + 4, 4);
      std::memcpy(&n, blob.data() + off + 8, 4);
      off += 12;
      if (off + n > blob.size()) break;
      if (id == optname) out.insert(out.end(), blob.data() + off, blob.data() + off + n);
      off += n;
    }
  }
  closedir(d);
}
}  // namespace

int info_get(int optname, void* buf, socklen_t* len) {
  std::vector<char> all;
  int each = 0;
  if (int r = local_records(optname, all, &each); r < 0) return r;
  remote_records(optname, all);
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
      std::vector<rds_info_counter> v;
      for (auto& [name, val] : G.counters) {
        rds_info_counter r{};
        std::strncpy(reinterpret_cast<char*>(r.name), name.c_str(), sizeof r.name - 1);
        r.value = val;
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS_INFO_SOCKETS: {
      std::vector<rds_info_socket> v;
      for (auto& [fd, s] : G.socks) {
        rds_info_socket r{};
        r.sndbuf = s->sndbuf;
        r.rcvbuf = s->rcvbuf;
        r.bound_addr = s->bound_addr.sin_addr.s_addr;
        r.bound_port = s->bound_addr.sin_port;
        r.connected_addr = s->conn_addr.sin_addr.s_addr;
        r.connected_port = s->conn_addr.sin_port;
        r.inum = static_cast<uint64_t>(fd);
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS_INFO_CONNECTIONS: {
      std::vector<rds_info_connection> v;
      for (auto& [k, c] : G.conns) {
        rds_info_connection r{};
        r.next_tx_seq = c->next_tx_seq;
        r.next_rx_seq = c->next_rx_seq;
        r.laddr = c->local.sin_addr.s_addr;
        r.faddr = c->peer.sin_addr.s_addr;
        std::strncpy(reinterpret_cast<char*>(r.transport), "softverbs", sizeof r.transport - 1);
        r.flags = (c->state == ConnState::up ? RDS_INFO_CONNECTION_FLAG_CONNECTED : 0) |
                  (c->state == ConnState::connecting ? RDS_INFO_CONNECTION_FLAG_CONNECTING : 0) |
                  (!c->send_q.empty() ? RDS_INFO_CONNECTION_FLAG_SENDING : 0);
        v.push_back(r);
      }
      return as_bytes(v, out, each);
    }
    case RDS_INFO_SEND_MESSAGES:
    case RDS_INFO_RETRANS_MESSAGES: {
      std::vector<rds_info_message> v;
      for (auto& [k, c] : G.conns)
        add_messages(v, c, optname == RDS_INFO_SEND_MESSAGES ? c->send_q : c->retrans);
      return as_bytes(v, out, each);
    }
    case RDS_INFO_RECV_MESSAGES: {
      std::vector<rds_info_message> v;
      for (auto& [fd, s] : G.socks)
        for (const Incoming& in : s->rq) {
          rds_info_message r{};
          r.len = static_cast<uint32_t>(in.data.size());
          r.laddr = s->bound_addr.sin_addr.s_addr;
          r.lport = s->bound_addr.sin_port;
          r.faddr = in.from.sin_addr.s_addr;
          r.fport = in.from.sin_port;
          v.push_back(r);
        }
      return as_bytes(v, out, each);
    }
    default:
      return -ENOPROTOOPT;
  }
}

}  // namespace sv::rds
