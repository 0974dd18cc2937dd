// libFuzzer target for what any host that reaches a UD QP's UDP port sends it: datagrams
// through the engine's UD receive path (engine/qp_ud.cc) on a real UD QP of this process's
// device, with posted receives in a guarded, registered buffer. The datagrams are real UDP
// datagrams over loopback; this thread drives the receive path (the QP's socket is taken out
// of the progress thread's epoll set).
//
// Input: byte 0 configures the run (bits 0-2: receives posted; bit 3: receives of 104 bytes,
// too small for most messages, else 4200; bit 4: the second half of the receives split over
// two SGEs). The rest is datagrams, each as a 16-bit big-endian length and its bytes (at most
// 16 datagrams of at most 4200 bytes). A destination QPN field of 1 (bytes 5-7) is replaced
// with the QP's, and a Q_Key field of 1 (bytes 12-15) with its Q_Key, so inputs can be
// well addressed. Seeds: fuzz/corpus/ud_rx.
//
// Beyond "no crash, no sanitizer report" it traps when:
//  - a byte outside the receive buffers' SGEs changes (guards around the region, and the gap
//    between a split receive's two SGEs);
//  - a receive completes that was not posted, or twice;
//  - a successful receive is not GRH + payload within what was posted, or lacks the GRH flag;
//  - the QP leaves RTS without an error completion telling why.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/progress.h"
#include "engine/qp.h"
#include "fuzz_check.h"
#include "fuzz_verbs.h"
#include "wire/be.h"
#include "wire/ud.h"

using namespace sv::engine;

namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint32_t kBigRecv = 4200;
constexpr uint32_t kSmallRecv = 104;
constexpr uint32_t kSplitGap = 8;  // bytes between a split receive's SGEs: never written
constexpr int kMaxRecv = 7;
constexpr int kMaxDatagrams = 16;

struct World {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<uint8_t> mem;
  size_t len = 0;
  ibv_mr* mr = nullptr;
  Qp* qp = nullptr;
  int tx = -1;  // the sending host's socket

  World() {
    const FuzzDevice d = open_fuzz_device();
    ctx = d.ctx;
    pd = d.pd;
    cq = d.cq;
    len = static_cast<size_t>(kBigRecv) * kMaxRecv;
    mem.resize(len + 2 * kGuard);
    const int access = IBV_ACCESS_LOCAL_WRITE;
    mr = ibv_reg_mr(pd, mem.data() + kGuard, len, access);
    FUZZ_CHECK(mr);
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap = {8, 8, 2, 2, 0};
    ibv_qp* q = ibv_create_qp(pd, &ia);
    FUZZ_CHECK(q);
    qp = Qp::from(q);
    // This thread alone reads the socket.
    Progress::get().run_sync([this] {
      Progress::get().del(qp->ud_fd);
      qp->ud_registered = false;
    });
    tx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(tx >= 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons(static_cast<uint16_t>(qp->qpn() >> 8));
    FUZZ_CHECK(connect(tx, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0);
  }

  // RESET -> INIT -> RTR -> RTS, as an application brings a UD QP up.
  void ready() {
    ibv_qp* q = qp->ibqp();
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    FUZZ_CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE) == 0);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = kQkey;
    FUZZ_CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ==
               0);
    a.qp_state = IBV_QPS_RTR;
    FUZZ_CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE) == 0);
    a.qp_state = IBV_QPS_RTS;
    FUZZ_CHECK(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
  }

  uint8_t* body() { return mem.data() + kGuard; }
};

World& world() {
  static World* w = new World();  // lives as long as the process (the progress thread)
  return *w;
}

void drain(int fd) {
  char buf[8192];
  while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) >= 0) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  World& w = world();
  Qp* qp = w.qp;
  const uint8_t cfg = data[0];
  w.ready();
  {
    ibv_wc wc[16];
    while (ibv_poll_cq(w.cq, 16, wc) > 0) {
    }
  }
  std::memset(w.mem.data(), kGuardByte, w.mem.size());

  const int nrecv = cfg & 7;
  const uint32_t rlen = (cfg & 8) ? kSmallRecv : kBigRecv;
  const bool split = cfg & 16;
  uint32_t posted_len[kMaxRecv] = {};
  for (int i = 0; i < nrecv; ++i) {
    const uint64_t base = reinterpret_cast<uintptr_t>(w.body()) + uint64_t{kBigRecv} * i;
    ibv_sge sg[2];
    ibv_recv_wr wr{};
    if (split && i >= nrecv / 2) {
      sg[0] = {base, rlen / 2, w.mr->lkey};
      sg[1] = {base + rlen / 2 + kSplitGap, rlen / 2 - kSplitGap, w.mr->lkey};
      wr.num_sge = 2;
      posted_len[i] = rlen - kSplitGap;
    } else {
      sg[0] = {base, rlen, w.mr->lkey};
      wr.num_sge = 1;
      posted_len[i] = rlen;
    }
    wr.wr_id = 1000 + i;
    wr.sg_list = sg;
    ibv_recv_wr* bad = nullptr;
    FUZZ_CHECK(ibv_post_recv(qp->ibqp(), &wr, &bad) == 0);
  }

  // The datagrams, sent before any is read.
  size_t off = 1;
  for (int k = 0; k < kMaxDatagrams && off + 2 <= size; ++k) {
    size_t n = (size_t{data[off]} << 8) | data[off + 1];
    off += 2;
    n = std::min({n, size - off, size_t{kBigRecv}});
    std::vector<uint8_t> d(data + off, data + off + n);
    off += n;
    if (n >= 8 && d[4] == 0 && d[5] == 0 && d[6] == 0 && d[7] == 1)
      sv::wire::store_be32(reinterpret_cast<std::byte*>(&d[4]), qp->qpn());
    if (n >= 16 && d[12] == 0 && d[13] == 0 && d[14] == 0 && d[15] == 1)
      sv::wire::store_be32(reinterpret_cast<std::byte*>(&d[12]), kQkey);
    send(w.tx, d.data(), d.size(), 0);
  }
  // Loopback delivers within the send; wait briefly for the socket in case it did not.
  pollfd p{qp->ud_fd, POLLIN, 0};
  poll(&p, 1, 1);
  {
    std::lock_guard rx(qp->rx_mu);
    ud_rx_run_locked(qp);
  }

  // Completions: each posted receive at most once, within what it posted.
  bool seen[kMaxRecv] = {};
  bool error_seen = false;
  ibv_wc wc[16];
  int n;
  while ((n = ibv_poll_cq(w.cq, 16, wc)) > 0) {
    for (int i = 0; i < n; ++i) {
      FUZZ_CHECK(wc[i].opcode & IBV_WC_RECV);
      const uint64_t k = wc[i].wr_id - 1000;
      FUZZ_CHECK(wc[i].wr_id >= 1000 && k < static_cast<uint64_t>(nrecv) && !seen[k]);
      seen[k] = true;
      if (wc[i].status == IBV_WC_SUCCESS) {
        FUZZ_CHECK(wc[i].byte_len >= sv::wire::kGrhLen && wc[i].byte_len <= posted_len[k]);
        FUZZ_CHECK(wc[i].wc_flags & IBV_WC_GRH);
        FUZZ_CHECK(wc[i].src_qp <= 0xFFFFFF);
      } else {
        error_seen = true;
      }
    }
  }
  // The QP left RTS only with an error completion saying why.
  FUZZ_CHECK(qp->state.load() == IBV_QPS_RTS || error_seen);

  // Nothing written outside the receives' SGEs.
  for (size_t i = 0; i < kGuard; ++i) {
    FUZZ_CHECK(w.mem[i] == kGuardByte);
    FUZZ_CHECK(w.mem[kGuard + w.len + i] == kGuardByte);
  }
  for (int i = 0; i < kMaxRecv; ++i) {
    const uint8_t* r = w.body() + size_t{kBigRecv} * i;
    const uint32_t first = (split && i >= nrecv / 2 && i < nrecv) ? rlen / 2 : 0;
    const uint32_t end = i < nrecv ? rlen : 0;
    for (uint32_t b = i < nrecv ? end : 0; b < kBigRecv; ++b) FUZZ_CHECK(r[b] == kGuardByte);
    if (first)
      for (uint32_t b = first; b < first + kSplitGap; ++b) FUZZ_CHECK(r[b] == kGuardByte);
  }
  // What this run left in the socket does not leak into the next.
  Progress::get().run_sync([] {});
  drain(qp->ud_fd);
  return 0;
}
