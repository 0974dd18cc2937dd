// RDS_INFO_* (net/rds info.c): getsockopt returns the size of one record and sets *len
// to the total; a short buffer gets ENOSPC with *len = bytes needed. Each process is its
// own RDS stack here, so the snapshot is this process' sockets, connections and queues.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "rds/rds_impl.h"

namespace sv::rds {
namespace {

template <typename T>
int emit(const std::vector<T>& recs, void* buf, socklen_t* len) {
  const size_t need = recs.size() * sizeof(T);
  if (*len < need) {
    *len = static_cast<socklen_t>(need);
    return -ENOSPC;
  }
  if (need) std::memcpy(buf, recs.data(), need);
  *len = static_cast<socklen_t>(need);
  return static_cast<int>(sizeof(T));
}

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

int info_get(int optname, void* buf, socklen_t* len) {
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
      return emit(v, buf, len);
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
      return emit(v, buf, len);
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
      return emit(v, buf, len);
    }
    case RDS_INFO_SEND_MESSAGES:
    case RDS_INFO_RETRANS_MESSAGES: {
      std::vector<rds_info_message> v;
      for (auto& [k, c] : G.conns)
        add_messages(v, c, optname == RDS_INFO_SEND_MESSAGES ? c->send_q : c->retrans);
      return emit(v, buf, len);
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
      return emit(v, buf, len);
    }
    default:
      return -ENOPROTOOPT;
  }
}

}  // namespace sv::rds
