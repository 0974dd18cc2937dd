// libFuzzer target for what a connected iWARP peer sends: the resumable FPDU stream parser
// (engine/iw_rx.cc) with placement, the responder (Send, Write, Read Request, Atomic,
// Immediate, Terminate) and the completer's response matching, on a real QP of this
// process's device with real MRs and posted receives. The input is the stream the peer
// writes after MPA, fed through a socketpair and ended with EOF.
//
// Input: byte 0 configures the connection (bits 0-2: receives posted, 3: MPA CRC,
// 4: the peer is softverbs (RFC 7306 opcodes allowed), 5: peer-to-peer RTR expected,
// 6-7: the RX buffer size, which moves where the parser has to resume). The rest is the
// stream. STags are random (engine/mr.h), so a fuzzer cannot guess them: the big-endian
// words kStagMark | i in the stream are replaced with MR i's real rkey. MR i starts at
// TO kIova[i]. Seeds: fuzz/corpus/make_iw_rx.py.
//
// Beyond "no crash, no sanitizer report" it traps when:
//  - a byte outside the registered ranges changes (guards around each MR), the read-only
//    MR changes, or the local-only MR changes anywhere but in a posted receive's SGEs;
//  - a receive completes more bytes than it posted, twice, or one that was never posted;
//  - the parser does not reach a verdict on a stream that has ended (EOF or stall).
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/progress.h"
#include "engine/qp.h"
#include "fuzz_check.h"
#include "fuzz_verbs.h"
#include "wire/be.h"

using namespace sv::engine;

namespace {

constexpr uint32_t kStagMark = 0x7EA50000;
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint32_t kRecvLen = 1024;
constexpr int kMaxRecv = 7;
// Zero-based-style TOs, so seeds can name a target offset whatever malloc returned.
constexpr uint64_t kIova[3] = {1u << 20, 2u << 20, 3u << 20};

// A buffer with guard bytes on both sides, registered in the middle.
struct Region {
  std::vector<uint8_t> mem;
  size_t len = 0;
  ibv_mr* mr = nullptr;
  uint8_t* body() { return mem.data() + kGuard; }
  void fill(uint8_t seed) {
    std::memset(mem.data(), kGuardByte, mem.size());
    for (size_t i = 0; i < len; ++i) body()[i] = static_cast<uint8_t>(seed + i * 7);
  }
  void restore(const std::vector<uint8_t>& b) { std::memcpy(body(), b.data(), len); }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[i] != kGuardByte || mem[kGuard + len + i] != kGuardByte) return false;
    return true;
  }
};

struct World {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  // 0: remote write/read/atomic; 1: remote read only; 2: local only (receive buffers).
  std::array<Region, 3> r;
  std::vector<uint8_t> ro_copy;                  // region 1 as registered
  std::array<std::vector<uint8_t>, 3> pristine;  // each region's bytes before a run
  Qp* qp = nullptr;

  World() {
    const FuzzDevice d = open_fuzz_device();
    ctx = d.ctx;
    pd = d.pd;
    cq = d.cq;
    const size_t lens[3] = {4096, 4096, kRecvLen * kMaxRecv};
    const int access[3] = {IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
                           IBV_ACCESS_REMOTE_READ, IBV_ACCESS_LOCAL_WRITE};
    for (int i = 0; i < 3; ++i) {
      r[i].len = lens[i];
      r[i].mem.resize(lens[i] + 2 * kGuard);
      r[i].fill(static_cast<uint8_t>(i));
      r[i].mr = ibv_reg_mr_iova(pd, r[i].body(), lens[i], kIova[i], access[i]);
      FUZZ_CHECK(r[i].mr);
    }
    ro_copy.assign(r[1].body(), r[1].body() + r[1].len);
    for (int i = 0; i < 3; ++i) pristine[i].assign(r[i].body(), r[i].body() + r[i].len);

    // One QP for every run: creating and destroying one costs three round trips to the
    // progress thread, which made the target four times slower. reset_qp makes it new.
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {8, 8, 2, 2, 64};
    ibv_qp* q = ibv_create_qp(pd, &ia);
    FUZZ_CHECK(q);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    FUZZ_CHECK(ibv_modify_qp(
                   q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
               0);
    qp = Qp::from(q);
    qp->attr.max_rd_atomic = 4;
    qp->attr.max_dest_rd_atomic = 4;
    qp->conn.rxbuf.allocate(64 * 1024);
    qp->conn.iov.allocate(Conn::kMaxIov);
    qp->conn.arena.allocate(Conn::kHdrArena);
  }

  // The QP as qp_create and a new connection leave it: empty rings, fresh parser and
  // sequence numbers, RX and TX not blocked. Its buffers are kept.
  void reset_qp() {
    std::lock_guard rx(qp->rx_mu);
    std::lock_guard tx(qp->tx_mu);
    std::lock_guard rq(qp->rq_mu);
    Conn fresh;
    fresh.rxbuf.swap(qp->conn.rxbuf);
    fresh.rxbuf.allocate(64 * 1024);
    fresh.iov.swap(qp->conn.iov);
    fresh.arena.swap(qp->conn.arena);
    qp->conn = std::move(fresh);
    qp->sq_head = qp->sq_tx = qp->sq_count = 0;
    qp->orq_used = 0;
    qp->irq_head = qp->irq_count = 0;
    qp->rq_head = qp->rq_count = 0;
    qp->rx_stalled = false;
    qp->tx_blocked = false;
    qp->error_reported = false;
  }

  void check_completions(int nrecv) {
    bool seen[kMaxRecv] = {};
    ibv_wc wc[16];
    int n;
    while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
      for (int i = 0; i < n; ++i) {
        FUZZ_CHECK(wc[i].opcode & IBV_WC_RECV);  // nothing was posted to send
        const uint64_t k = wc[i].wr_id - 1000;
        FUZZ_CHECK(wc[i].wr_id >= 1000 && k < static_cast<uint64_t>(nrecv) && !seen[k]);
        seen[k] = true;
        if (wc[i].status == IBV_WC_SUCCESS) FUZZ_CHECK(wc[i].byte_len <= kRecvLen);
      }
    }
  }
};

World& world() {
  static World* w = new World();  // lives as long as the process (the progress thread)
  return *w;
}

void substitute_stags(std::vector<std::byte>& s, const World& w) {
  for (size_t i = 0; i + 4 <= s.size(); ++i) {
    const uint32_t v = sv::wire::load_be32(&s[i]);
    if ((v & 0xFFFFFF00u) != kStagMark || (v & 0xFF) >= w.r.size()) continue;
    sv::wire::store_be32(&s[i], w.r[v & 0xFF].mr->rkey);
    i += 3;
  }
}

void drain(int fd) {
  char buf[65536];
  while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = world();
  const uint8_t cfg = data[0];
  std::vector<std::byte> stream(reinterpret_cast<const std::byte*>(data + 1),
                                reinterpret_cast<const std::byte*>(data + size));
  substitute_stags(stream, w);

  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const int big = 1 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);

  Qp* qp = w.qp;
  ibv_qp* ibqp = qp->ibqp();
  w.reset_qp();

  // Receives: odd ones split over two SGEs, so placement crosses an SGE boundary.
  const int nrecv = cfg & 7;
  ibv_sge sges[kMaxRecv][2];
  for (int i = 0; i < nrecv; ++i) {
    ibv_recv_wr wr{};
    const uint64_t base = reinterpret_cast<uintptr_t>(w.r[2].body()) + i * kRecvLen;
    if (i & 1) {
      sges[i][0] = {base, kRecvLen / 2 - 8, w.r[2].mr->lkey};
      sges[i][1] = {base + kRecvLen / 2, kRecvLen / 2, w.r[2].mr->lkey};
      wr.num_sge = 2;
    } else {
      sges[i][0] = {base, kRecvLen, w.r[2].mr->lkey};
      wr.num_sge = 1;
    }
    wr.wr_id = 1000 + i;
    wr.sg_list = sges[i];
    ibv_recv_wr* bad = nullptr;
    FUZZ_CHECK(ibv_post_recv(ibqp, &wr, &bad) == 0);
  }

  // Connected, as qp_take_endpoint leaves it after MPA, but driven from this thread: the
  // socket is never put in the progress thread's epoll set (registered = true makes the
  // interest updates no-ops on it).
  {
    std::lock_guard rx(qp->rx_mu);
    std::lock_guard tx(qp->tx_mu);
    for (ibv_qp_state st : {IBV_QPS_RTR, IBV_QPS_RTS}) {
      qp->state = st;
      qp->attr.qp_state = st;
      qp->qpx.qp_base.state = st;
    }
    Conn& c = qp->conn;
    c.fd = sv[0];
    c.crc = cfg & 0x08;
    c.peer_sv = cfg & 0x10;
    c.expect_rtr = cfg & 0x20;
    c.tx_gated = c.expect_rtr;
    c.ird = c.ord = 4;
    c.max_ulpdu = 1448;
    static constexpr size_t kRxBuf[4] = {37, 512, 4096, 64 * 1024};
    c.rxbuf.allocate(kRxBuf[cfg >> 6]);
    c.registered = true;
    sv::transport::set_nonblock(sv[0], true);
    qp->conn_state = sv::engine::ConnState::up;
  }

  // The peer's whole stream, then its FIN.
  size_t off = 0;
  while (off < stream.size()) {
    const ssize_t n = send(sv[1], stream.data() + off, stream.size() - off, MSG_NOSIGNAL);
    FUZZ_CHECK(n > 0);
    off += static_cast<size_t>(n);
  }
  shutdown(sv[1], SHUT_WR);

  // Parse until the connection ends or RX stalls waiting for a receive that will not come.
  // Our answers (Read Responses, Terminates) are drained so TX never blocks for long.
  bool verdict = false;
  for (int round = 0; round < 64 && !verdict; ++round) {
    {
      std::lock_guard rx(qp->rx_mu);
      verdict = !rx_run_locked(qp) || qp->rx_stalled || qp->state.load() == IBV_QPS_ERR;
    }
    drain(sv[1]);
    std::lock_guard tx(qp->tx_mu);
    if (qp->conn.fd >= 0) tx_run_locked(qp);
  }
  FUZZ_CHECK(verdict);
  drain(sv[1]);
  // What RX posted to the progress thread (closing or shutting the socket) runs now, while
  // this run's connection is still the QP's.
  Progress::get().run_sync([] {});
  {
    std::lock_guard rx(qp->rx_mu);
    std::lock_guard tx(qp->tx_mu);
    if (qp->conn.fd >= 0) close(qp->conn.fd);
    qp->conn.fd = -1;
    qp->conn_state = sv::engine::ConnState::idle;
  }
  close(sv[1]);

  // Completions: only posted receives, each at most once and within its length. Whatever
  // is still posted when the stream ends is dropped by the next reset_qp.
  w.check_completions(nrecv);
  ibv_async_event ev;
  while (ibv_get_async_event(w.ctx, &ev) == 0) {
    FUZZ_CHECK(ev.element.qp == ibqp);
    ibv_ack_async_event(&ev);
  }

  // Nothing outside the registered bytes moved; the read-only region did not move at all;
  // the local-only one only inside posted receives.
  for (auto& r : w.r) FUZZ_CHECK(r.guards_intact());
  FUZZ_CHECK(std::memcmp(w.r[1].body(), w.ro_copy.data(), w.r[1].len) == 0);
  for (size_t i = 0; i < w.r[2].len; ++i) {
    const size_t k = i / kRecvLen, at = i % kRecvLen;
    const bool posted =
        k < static_cast<size_t>(nrecv) && !((k & 1) && at >= kRecvLen / 2 - 8 && at < kRecvLen / 2);
    if (!posted) FUZZ_CHECK(w.r[2].body()[i] == w.pristine[2][i]);
  }
  w.r[0].restore(w.pristine[0]);
  w.r[2].restore(w.pristine[2]);
  return 0;
}
