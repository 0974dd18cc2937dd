// Congestion (net/rds cong.c): receiver-side, per port. A socket whose receive queue
// holds more than its rcvbuf marks its port congested; below rcvbuf/2 it clears the mark
// (hysteresis). On every change the whole map (one bit per port, little-endian bit
// order) goes to every connected peer as a message with h_flags == RDS_FLAG_CONG_BITMAP.
// A sender checks the destination port in its peer's map before queueing: ENOBUFS for
// a non-blocking send (and, with RDS_CONG_MONITOR, the port's bit joins the socket's
// monitor mask), a blocking send waits. When a peer's map clears bits, monitoring
// sockets get those bits as an RDS_CMSG_CONG_UPDATE (POLLIN) and blocked senders wake.
// One map per process here, covering the ports of all its addresses.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "rds/rds_impl.h"

namespace sv::rds {

bool cong_port_blocked(Conn* c, uint16_t port) {
  if (c->fcong.size() != kCongMapBytes) return false;
  return c->fcong[port >> 3] & (1u << (port & 7));
}

void cong_send_map(Conn* c) {
  c->map_queued = true;
  if (c->state != ConnState::up) return;  // sent when the connection comes up
  c->map_queued = false;
  const auto* map = reinterpret_cast<const std::byte*>(g().lcong.data());
  // One unsent map per connection, the current one: a peer that takes nothing (RNR keeps its
  // connection up, and idle close never comes with a queue) would otherwise collect one 8 KiB
  // map per change of any of our ports (net/rds sends the map as it is at transmit time).
  for (Message* q : c->send_q)
    if ((q->h.flags & wire::kRdsFlagCongBitmap) && q->frags_posted == 0) {
      q->payload.assign(map, map + kCongMapBytes);
      conn_kick(c);
      return;
    }
  auto* m = new Message();
  m->queued_to_sock = false;
  m->h.flags = wire::kRdsFlagCongBitmap;
  m->h.len = static_cast<uint32_t>(kCongMapBytes);
  m->payload.assign(map, map + kCongMapBytes);
  // Not sequenced and never retransmitted: a newer map supersedes it (net/rds send.c). Ahead
  // of the queue, but never inside a message whose fragments have started to go: the peer
  // reassembles a message's fragments in a row.
  auto at = c->send_q.begin();
  if (at != c->send_q.end() && (*at)->frags_posted > 0) ++at;
  c->send_q.insert(at, m);
  count(Ctr::cong_update_queued);
  conn_kick(c);
}

bool cong_rcvbuf_changed(Sock* s) {
  if (!s->congested && s->rcv_bytes > s->rcvbuf) {
    s->congested = true;
    return true;
  }
  if (s->congested && s->rcv_bytes < s->rcvbuf / 2) {
    s->congested = false;
    return true;
  }
  return false;
}

// Whoever changed `congested` calls this after it: the last such call sees the last change,
// so the bit ends as the sockets want it however receives and deliveries interleave. The map
// has one bit per port for the process, and sockets on other addresses (or IPv6) may share
// the port: the bit is set while any open one is congested.
void cong_sync_port(Sock* s) {
  if (!s->bound) return;
  const uint16_t port = ntohs(s->bound_addr.sin_port);
  bool want = false;
  for (auto& [fd, o] : g().socks) {
    if (!o->bound || o->closing || ntohs(o->bound_addr.sin_port) != port) continue;
    std::lock_guard lk(o->rs_recv_lock);
    if ((want = o->congested)) break;
  }
  uint8_t& byte = g().lcong[port >> 3];
  const auto bit = static_cast<uint8_t>(1u << (port & 7));
  if (static_cast<bool>(byte & bit) == want) return;
  byte = want ? static_cast<uint8_t>(byte | bit) : static_cast<uint8_t>(byte & ~bit);
  for (auto& [k, c] : g().conns) cong_send_map(c);
}

void cong_map_received(Conn* c, const std::byte* map, size_t len) {
  if (len != kCongMapBytes) return;
  count(Ctr::cong_update_received);
  const uint64_t portmask = wire::rds_cong_update(c->fcong, map, len);
  if (!portmask) return;  // no port was freed: nobody waits for this one
  g().cong_gen.fetch_add(1, std::memory_order_relaxed);
  for (auto& [fd, s] : g().socks) {
    {
      // Under the lock a blocked sender checks cong_gen with (send.cc wait_for_cong_update).
      std::lock_guard lk(s->rs_recv_lock);
      if (s->cong_monitor && (s->cong_mask & portmask)) {
        s->cong_notify |= s->cong_mask & portmask;
        s->cong_mask &= ~portmask;
        sock_update_poll_locked(s);
      } else if (!s->cong_monitor && s->seen_congestion && portmask) {
        s->cong_poll = true;  // "retry ENOBUFS'd sends after POLLIN" (rds-api.md §3.2)
        sock_update_poll_locked(s);
      }
    }
    sock_wake(s);  // blocked senders re-check
  }
}

void cong_map_forgotten(Conn* c) {
  const bool had_bits = std::any_of(c->fcong.begin(), c->fcong.end(), [](uint8_t b) { return b; });
  c->fcong.clear();
  if (!had_bits) return;  // nobody waits on this connection's map
  g().cong_gen.fetch_add(1, std::memory_order_relaxed);
  for (auto& [fd, s] : g().socks) {
    { std::lock_guard lk(s->rs_recv_lock); }  // see cong_map_received
    sock_wake(s);
  }
}

}  // namespace sv::rds
