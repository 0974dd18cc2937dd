// RX: a resumable parser over the TCP byte stream (RFC 5044 §4 FPDUs), in the manner of
// siw_tcp_rx_data: header -> data -> trailer, any of which may span reads. Payload bytes
// are copied from the read buffer into their target, or, for long tagged payloads, read
// from the socket straight into the target memory region.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/app_memory.h"
#include "engine/cq.h"
#include "engine/log.h"
#include "engine/rx_dispatch.h"
#include "wire/be.h"
#include "wire/crc32c.h"
#include "wire/terminate_codes.h"

namespace sv::engine {
namespace {

constexpr uint32_t kDirectMin = 4096;  // below this, one buffered read beats a second recv
// After a payload read straight into its target, the same recvmsg takes only the FPDU's
// trailer (pad + CRC) and the next segment's header into rxbuf: MPA length (2) + the
// longest common DDP/RDMAP header (untagged: control 2, RsvdULP 4, QN 4, MSN 4, MO 4).
// Reading more would stage the next payload and copy it; reading less would cost a call.
// So a stream of large segments settles into one recvmsg and no copy per segment.
constexpr size_t kNextHdr = 2 + 18;

void place_bytes(Conn& c, const std::byte* src, uint32_t n) {
  Placement& p = c.place;
  switch (p.kind) {
    case Placement::Kind::discard:
      break;
    case Placement::Kind::contiguous:
      copy_to_app(p.ptr, src, n);
      p.ptr += n;
      break;
    case Placement::Kind::sgl:
      p.offset += copy_to_sgl(p.sge, p.num_sge, p.offset, src, n);
      break;
  }
}

// The target of the next `len` payload bytes as iovecs. Returns how many.
int target_iov(const Conn& c, uint32_t len, iovec* iov) {
  const Placement& p = c.place;
  if (p.kind == Placement::Kind::contiguous) {
    iov[0] = iovec{p.ptr, len};
    return 1;
  }
  int k = 0;
  uint32_t off = p.offset, left = len;
  for (uint32_t i = 0; i < p.num_sge && left && k < static_cast<int>(kMaxSge); ++i) {
    const ibv_sge& s = p.sge[i];
    if (off >= s.length) {
      off -= s.length;
      continue;
    }
    const uint32_t take = std::min(left, s.length - off);
    iov[k++] = iovec{reinterpret_cast<std::byte*>(s.addr) + off, take};
    left -= take;
    off = 0;
  }
  return k;
}

void crc_targets(Conn& c, const iovec* iov, int k, uint32_t n) {
  for (int i = 0; i < k && n; ++i) {
    const uint32_t take = static_cast<uint32_t>(std::min<size_t>(n, iov[i].iov_len));
    c.crc_state = wire::crc32c_update(c.crc_state, iov[i].iov_base, take);
    n -= take;
  }
}

// How much a buffered read may take. Normally all the socket has: many small FPDUs per
// call. But after a large segment the next one is likely large too, and a full read would
// stage its payload and copy it (a receiver that catches up with its sender mid-trailer
// does this on every segment): then take only the rest of this FPDU and the next header,
// so the payload after it goes direct.
size_t rx_read_len(const Conn& c) {
  if (!c.big_seg) return c.rxbuf.size();
  const size_t trailer = wire::fpdu_pad(c.ulpdu_len) + wire::kMpaCrcLen;
  switch (c.phase) {
    case RxPhase::data:
      return c.data_left + trailer + kNextHdr;
    case RxPhase::trailer:
      return trailer - c.trailer_have + kNextHdr;
    case RxPhase::header:
      break;
  }
  if (c.hdr_have < 4) return kNextHdr - c.hdr_have;
  const size_t hl = wire::ddp_header_len(std::span<const std::byte, 2>(&c.hdr[2], 2));
  const size_t need = 2 + std::max<size_t>(hl, 2);
  return need > c.hdr_have ? need - c.hdr_have : 1;
}

// Accounts for n payload bytes that were written to the target directly.
void advance_place(Conn& c, uint32_t n) {
  if (c.place.kind == Placement::Kind::contiguous)
    c.place.ptr += n;
  else
    c.place.offset += n;
}

void conn_eof(Qp* qp) {
  Conn& c = qp->conn;
  if (c.have_recv) {
    complete_recv(qp, c.cur_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
    c.have_recv = false;
  }
  if (c.imm_pending) {
    complete_recv(qp, c.imm_recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, 0);
    c.imm_pending = false;
  }
  qp->rx_stalled = true;  // stop reading
  qp_conn_lost(qp, IBV_WC_RETRY_EXC_ERR);
}

// A segment by reference (kDdpSvRef) has passed its checks: its data comes from the peer's
// memory into the target its header was checked against, as a payload would have.
bool pull_ref(Qp* qp) {
  Conn& c = qp->conn;
  c.ref_pending = false;
  iovec iov[kMaxSge];
  const int k = target_iov(c, c.ref_len, iov);
  const int err = c.shm ? shm_pull(qp, iov, static_cast<size_t>(k), c.ref_addr, c.ref_len) : EFAULT;
  if (err == 0) {
    advance_place(c, c.ref_len);
    return true;
  }
  if (err == ESRCH || err == ECONNRESET) {
    // The peer is exiting (its memory goes before its socket closes), or its QP failed and
    // gave what this names back to its application (it revoked its references): as its EOF.
    conn_eof(qp);
    return false;
  }
  // The peer named memory it does not have: its stream is broken. Our Read that this
  // answered fails as a bad response (IB 10.8.3.1).
  rx_fail(qp, llp_term(wire::LlpEcode::stream_lost),
          c.seg.opcode == wire::RdmapOpcode::read_response ? RxBlame::response : RxBlame::peer);
  return false;
}

// An incoming FPDU, whole, before its CRC check (SOFTVERBS_FAULT dir=rx). False if a reset
// fault ended the connection.
bool rx_fault(Qp* qp, size_t pad) {
  Conn& c = qp->conn;
  fault::Fired fx;
  if (!qp->faults->on_frame(fault::FaultDir::rx, false, fx)) return true;
  qp_fault_count(qp, fx.action);
  switch (fx.action) {
    case fault::FaultAction::reset:
      qp->rx_stalled = true;  // read nothing more; the QP fails (qp_fault_reset_locked)
      qp_fault_reset_locked(qp);
      return false;
    case fault::FaultAction::corrupt:
      // As a bit flipped on the wire: the CRC check below fails and Terminates.
      if (c.crc)
        c.trailer[pad + fx.bit / 8] ^= static_cast<std::byte>(1u << (fx.bit % 8));
      else
        SV_WARN("qp %u: corrupt fault on a connection without MPA CRC: not applied", qp->qpn());
      return true;
    case fault::FaultAction::stall:
      qp_fault_hold(qp, fx.ms);  // this FPDU is taken; the next waits
      return true;
    default:
      return true;
  }
}

// One accepted DDP segment; a message is counted at its last segment.
void count_rx_segment(stats::Slot* s, const wire::DdpSegment& seg) {
  stats::add_serial(s, stats::Ctr::rcvd_pkts);
  if (!seg.last) return;
  switch (seg.opcode) {
    case wire::RdmapOpcode::send:
    case wire::RdmapOpcode::send_inv:
    case wire::RdmapOpcode::send_se:
    case wire::RdmapOpcode::send_se_inv:
      stats::add_serial(s, stats::Ctr::rcvd_sends);
      break;
    case wire::RdmapOpcode::rdma_write:
      stats::add_serial(s, stats::Ctr::rcvd_writes);
      break;
    case wire::RdmapOpcode::read_request:
      stats::add_serial(s, stats::Ctr::rcvd_read_reqs);
      break;
    case wire::RdmapOpcode::atomic_request:
      stats::add_serial(s, stats::Ctr::rcvd_atomics);
      break;
    case wire::RdmapOpcode::terminate:
      stats::add_serial(s, stats::Ctr::rcvd_terminates);
      break;
    default:
      break;
  }
}

// An RNR stall hides the Placement Acks behind the Send it waits on. IB's ACKs do not queue
// behind the responder's own requests, so neither may our completions: while it lasts,
// what we sent completes on transmit (Conn::acks_unseen).
void set_acks_unseen(Qp* qp, bool unseen) {
  Conn& c = qp->conn;
  if (!c.wait_acks) return;
  std::lock_guard lk(qp->tx_mu);
  c.acks_unseen = unseen;
  if (unseen) complete_sq_locked(qp);
}

}  // namespace

bool rx_run_locked(Qp* qp) {
  Conn& c = qp->conn;
  if (c.fd < 0 || c.rxbuf.empty()) return false;
  const bool was_stalled = qp->rx_stalled;
  // A read that returned less than it asked for emptied the socket: the next one would only
  // say EAGAIN, a syscall on every pass (every poll of a ping-pong). Whatever arrives after
  // it is not lost: the socket stays readable (level-triggered) for the next pass.
  bool drained = false;
  for (;;) {
    // A stall fault: nothing is read until its timer (qp_fault_hold).
    if (qp->fault_held.load(std::memory_order_acquire) != 0) [[unlikely]]
      break;
    if (qp->rx_stalled) {
      // Retry the header that stalled (a receive may have been posted since).
      if (qp->state.load() == IBV_QPS_ERR) return false;
      if (c.phase != RxPhase::header || c.ulpdu_len == 0) break;
      RxAction a = rx_on_header(qp);
      if (a == RxAction::stall) {
        // Still none: the post that restarted us may have cleared the SRQ's mark, and the
        // next must see it again (srq_mark_stalled).
        if (srq_mark_stalled(qp)) continue;
        break;
      }
      qp->rx_stalled = false;
      set_acks_unseen(qp, false);
      if (a == RxAction::dead) return false;
      c.data_left = c.seg.payload_len;
      c.phase = RxPhase::data;
    }
    size_t avail = c.rx_end - c.rx_begin;
    if (avail == 0) {
      c.rx_begin = c.rx_end = 0;
      if (drained) break;
      ssize_t n;
      if (c.phase == RxPhase::data && c.data_left >= kDirectMin &&
          c.place.kind != Placement::Kind::discard) {
        // Scatter read: the payload goes straight from the socket into its target (MR or
        // receive buffers), whatever follows it into rxbuf. No second copy, no extra call.
        iovec iov[kMaxSge + 1];
        const int k = target_iov(c, c.data_left, iov);
        const size_t tail = wire::fpdu_pad(c.ulpdu_len) + wire::kMpaCrcLen + kNextHdr;
        iov[k] = iovec{c.rxbuf.data(), tail};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = static_cast<size_t>(k) + 1;
        n = qp->rx_ring.load(std::memory_order_relaxed)
                ? shm_rx_read(qp, iov, mh.msg_iovlen, true)
                : transport::sys_recvmsg(c.fd, &mh, MSG_DONTWAIT);
        if (n > 0) {
          size_t asked = 0;
          for (int i = 0; i <= k; ++i) asked += iov[i].iov_len;
          drained = static_cast<size_t>(n) < asked;
          stats::add_serial(qp->stats, stats::Ctr::rcvd_bytes, static_cast<uint64_t>(n));
          c.rx_active = true;
          ++c.rx_reads;
          const uint32_t direct = static_cast<uint32_t>(std::min<size_t>(n, c.data_left));
          if (c.crc) crc_targets(c, iov, k, direct);
          advance_place(c, direct);
          c.data_left -= direct;
          c.rx_end = static_cast<size_t>(n) - direct;
          if (c.data_left == 0) {
            c.phase = RxPhase::trailer;
            c.trailer_have = 0;
          }
          continue;
        }
      } else {
        // Never more than the buffer holds (a fuzzed connection runs with small ones).
        const size_t asked = std::min(rx_read_len(c), c.rxbuf.size());
        if (qp->rx_ring.load(std::memory_order_relaxed)) {
          iovec v{c.rxbuf.data(), asked};
          n = shm_rx_read(qp, &v, 1);
        } else {
          n = transport::sys_recv(c.fd, c.rxbuf.data(), asked, MSG_DONTWAIT);
        }
        if (n > 0) {
          drained = static_cast<size_t>(n) < asked;
          stats::add_serial(qp->stats, stats::Ctr::rcvd_bytes, static_cast<uint64_t>(n));
          c.rx_active = true;
          ++c.rx_reads;
          c.rx_end = static_cast<size_t>(n);
          continue;
        }
      }
      if (n == 0) {
        conn_eof(qp);
        return false;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      if (errno == EPROTO) {
        // The peer's shared-memory ring lies about its bytes: the stream is lost (RFC 5044's
        // LLP error), as a TCP stream whose framing breaks.
        rx_fail(qp, llp_term(wire::LlpEcode::stream_lost), RxBlame::stream);
        return false;
      }
      conn_eof(qp);
      return false;
    }
    const std::byte* in = c.rxbuf.data() + c.rx_begin;
    switch (c.phase) {
      case RxPhase::header: {
        // ULPDU_Length(2) + DDP/RDMAP control(2) tell how many header bytes follow.
        size_t need = 4;
        if (c.hdr_have >= 4) {
          const size_t hl = wire::ddp_header_len(std::span<const std::byte, 2>(&c.hdr[2], 2));
          need = 2 + std::max<size_t>(hl, 2);
        }
        const size_t take = std::min(avail, need - c.hdr_have);
        std::memcpy(&c.hdr[c.hdr_have], in, take);
        c.hdr_have += take;
        c.rx_begin += take;
        if (c.hdr_have < need) continue;
        if (need == 4) {
          const size_t hl = wire::ddp_header_len(std::span<const std::byte, 2>(&c.hdr[2], 2));
          if (hl > 2) continue;  // more header bytes to collect
        }
        c.ulpdu_len = wire::load_be16(c.hdr.data());
        auto e = wire::ddp_decode(std::span<const std::byte>(&c.hdr[2], c.hdr_have - 2),
                                  c.ulpdu_len, c.seg);
        if (e != wire::DdpError::ok) {
          SV_WARN("qp %u: bad segment header: %s", qp->qpn(), wire::to_string(e));
          rx_fail(qp, ddp_error_term(e), RxBlame::peer, IBV_WC_REM_OP_ERR);
          return false;
        }
        if (c.crc) c.crc_state = wire::crc32c_update(wire::kCrc32cInit, c.hdr.data(), c.hdr_have);
        count_rx_segment(qp->stats, c.seg);
        if (c.shm_offer_on_cap && c.seg.sv_shm_cap) [[unlikely]]
          shm_peer_capable(qp);
        if (c.tx_gated && !c.expect_rtr) {
          std::lock_guard lk(qp->tx_mu);
          c.tx_gated = false;
          tx_run_locked(qp);
        }
        const RxAction a = rx_on_header(qp);
        if (a == RxAction::dead) return false;
        if (a == RxAction::stall) {
          qp->rx_stalled = true;
          set_acks_unseen(qp, true);
          stats::add_serial(qp->stats, stats::Ctr::rnr_waits);
          // A receive posted between take_recv's look and rx_stalled's store saw no stalled
          // QP to restart (restart_rx): look once more now that the store is visible. An
          // SRQ shared by many connections runs empty and refills all the time; its posts
          // visit its QPs only once one marked it (srq_mark_stalled).
          if (qp->srq ? srq_mark_stalled(qp) : recv_posted(qp))
            continue;  // the stalled branch above retries the header
          break;
        }
        c.data_left = c.seg.payload_len;
        c.big_seg = c.data_left >= kDirectMin;
        c.phase = RxPhase::data;
        if (c.data_left == 0) {
          c.phase = RxPhase::trailer;
          c.trailer_have = 0;
        }
        continue;
      }
      case RxPhase::data: {
        const uint32_t take = static_cast<uint32_t>(std::min<size_t>(avail, c.data_left));
        place_bytes(c, in, take);
        if (c.crc) c.crc_state = wire::crc32c_update(c.crc_state, in, take);
        c.rx_begin += take;
        c.data_left -= take;
        if (c.data_left == 0) {
          c.phase = RxPhase::trailer;
          c.trailer_have = 0;
        }
        continue;
      }
      case RxPhase::trailer: {
        const size_t pad = wire::fpdu_pad(c.ulpdu_len);
        const size_t need = pad + wire::kMpaCrcLen;
        const size_t take = std::min(avail, need - c.trailer_have);
        std::memcpy(&c.trailer[c.trailer_have], in, take);
        c.trailer_have += take;
        c.rx_begin += take;
        if (c.trailer_have < need) continue;
        if (qp->faults) [[unlikely]] {
          if (!rx_fault(qp, pad)) return false;
        }
        if (c.crc) {
          uint32_t s = wire::crc32c_update(c.crc_state, c.trailer.data(), pad);
          if (wire::crc32c_final(s) != wire::load_le32(&c.trailer[pad])) {
            SV_WARN("qp %u: MPA CRC error", qp->qpn());
            rx_fail(qp, llp_term(wire::LlpEcode::crc_error), RxBlame::stream);
            return false;
          }
        }
        c.phase = RxPhase::header;
        c.hdr_have = 0;
        c.ulpdu_len = 0;
        if (c.ref_pending && !pull_ref(qp)) return false;
        if (!rx_on_segment_end(qp)) return false;
        if (c.rx_switch_after_seg) [[unlikely]] {
          shm_rx_switch_locked(qp);
          drained = false;
          continue;
        }
        if (c.expect_rtr) {
          // The peer-to-peer RTR has arrived (RFC 6581 §4): we may now send.
          c.expect_rtr = false;
          std::lock_guard lk(qp->tx_mu);
          c.tx_gated = false;
          tx_run_locked(qp);
        }
        continue;
      }
    }
    break;
  }
  if (qp->rx_stalled != was_stalled) qp_update_interest(qp);
  if (c.send_acks && c.units_rx != c.units_published) {
    // One Placement Ack for everything this pass placed (coalesced, IB's "ack coalescing");
    // when it leaves is tx_ack_locked's choice. Nobody answers a stream: a pass that
    // placed several messages sends it once the pass is over.
    const bool no_one_answer = c.units_rx - c.units_published > 1;
    c.units_published = c.units_rx;
    // The same count in the shared segment, for a peer whose RX waits on a receive buffer
    // and cannot read our ack (qp_completer.cc placed_in_shm).
    if (c.shm) c.shm->rx.publish_placed(c.units_rx);
    std::lock_guard lk(qp->tx_mu);
    c.ack_to_send = c.units_rx;
    tx_ack_locked(qp, c.ack_requested, no_one_answer);
    c.ack_requested = false;
  }
  return true;
}

}  // namespace sv::engine
