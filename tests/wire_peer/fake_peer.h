// A real QP of this process in RTS waiting for its peer, and a fake peer speaking MPA and
// FPDUs over raw TCP to the QP's out-of-band listener (hostile_frames, hostile_guess).
#pragma once
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "wire/be.h"
#include "wire/ddp_rdmap.h"
#include "wire/mpa.h"
#include "wire/terminate_codes.h"

namespace wire_peer {

using namespace sv::wire;

inline constexpr uint32_t kFakeQpn = 2;  // smaller than any real QPN: the real QP is passive

struct Local {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<char> buf = std::vector<char>(65536);
  ibv_mr* mr = nullptr;
  Local() {
    int n = 0;
    ibv_device** l = ibv_get_device_list(&n);
    ctx = ibv_open_device(l[0]);
    ibv_free_device_list(l);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {16, 16, 1, 1, 0};
    qp = ibv_create_qp(pd, &ia);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    EXPECT_EQ(
        ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
        0);
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = kFakeQpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    EXPECT_EQ(ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    EXPECT_EQ(ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }
  ~Local() {
    ibv_destroy_qp(qp);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
  ibv_qp_state state() {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
    return a.qp_state;
  }
  bool wait_state(ibv_qp_state s) {
    for (int i = 0; i < 500; ++i) {
      if (state() == s) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // A Send of the first `len` bytes of buf; signaled unless told otherwise. ibv_post_send's
  // return value.
  int post_send(uint64_t wr_id, uint32_t len, bool signaled = true) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf.data()), len, mr->lkey};
    ibv_send_wr w{};
    w.wr_id = wr_id;
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    ibv_send_wr* bad;
    return ibv_post_send(qp, &w, &bad);
  }
  std::vector<ibv_wc> poll(size_t n) {
    std::vector<ibv_wc> out;
    for (int i = 0; i < 500 && out.size() < n; ++i) {
      ibv_wc wc;
      while (ibv_poll_cq(cq, 1, &wc) == 1) out.push_back(wc);
      if (out.size() < n) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return out;
  }
};

// The fake peer: MPA initiator on the QP's listener (port = QPN >> 8), from `src` (any
// loopback address).
struct FakePeer {
  int fd = -1;
  bool accepted = false;  // a Reply that accepts came back
  // rcvbuf: a small receive buffer (set before connecting, so the window stays small) lets a
  // test stop the QP's transmit by not reading.
  explicit FakePeer(uint32_t qpn, const char* src = "127.0.0.1", bool expect_accept = true,
                    int rcvbuf = 0) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf) {
      EXPECT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf), 0);
    }
    sockaddr_in b{};
    b.sin_family = AF_INET;
    inet_pton(AF_INET, src, &b.sin_addr);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof b), 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(qpn >> 8));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    std::vector<std::byte> pd(12);
    store_be32(pd.data(), 0x53564F42);  // softverbs OOB header: "SVOB", dst, src
    store_be32(pd.data() + 4, qpn);
    store_be32(pd.data() + 8, kFakeQpn);
    MpaFrame f;
    f.kind = MpaKind::request;
    f.enhanced = true;
    f.res = kMpaResSvRequest;
    f.v2.ird = f.v2.ord = 1;
    f.ulp_pdata = pd;
    std::vector<std::byte> req(mpa_encoded_len(f));
    mpa_encode(f, req);
    EXPECT_EQ(write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    std::vector<std::byte> rep(kMpaHeaderLen);
    const bool got = read_exact(rep.data(), kMpaHeaderLen);
    if (!expect_accept && !got) return;  // refused before any handshake
    EXPECT_TRUE(got);
    // A new vector rather than rep.resize(): GCC 12 -O3 reports a false -Warray-bounds there.
    std::vector<std::byte> whole(std::max(mpa_frame_len(rep), kMpaHeaderLen));
    std::memcpy(whole.data(), rep.data(), kMpaHeaderLen);
    EXPECT_TRUE(read_exact(whole.data() + kMpaHeaderLen, whole.size() - kMpaHeaderLen));
    rep = std::move(whole);
    MpaFrame r;
    EXPECT_EQ(mpa_decode(rep, MpaKind::reply, 512, r), MpaError::ok);
    accepted = !r.reject;
    if (expect_accept) {
      EXPECT_TRUE(accepted);
    }
  }
  ~FakePeer() { close(fd); }
  bool read_exact(std::byte* p, size_t n) {
    while (n) {
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, 5000) <= 0) return false;
      ssize_t r = read(fd, p, n);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  // Sends one FPDU with the given ULPDU (no CRC negotiated: zero CRC field).
  void send_fpdu(const std::vector<std::byte>& ulpdu, uint16_t declared_len = 0) {
    std::vector<std::byte> f(fpdu_len(ulpdu.size()), std::byte{0});
    store_be16(f.data(), declared_len ? declared_len : static_cast<uint16_t>(ulpdu.size()));
    std::memcpy(f.data() + 2, ulpdu.data(), ulpdu.size());
    EXPECT_EQ(write(fd, f.data(), f.size()), static_cast<ssize_t>(f.size()));
  }
  // Reads FPDUs until a Terminate; returns its control word (or nullopt on EOF/timeout).
  bool read_terminate(Terminate& t) {
    for (int i = 0; i < 16; ++i) {
      std::byte len[2];
      if (!read_exact(len, 2)) return false;
      const uint16_t ul = load_be16(len);
      std::vector<std::byte> body(ul + fpdu_pad(ul) + 4);
      if (!read_exact(body.data(), body.size())) return false;
      DdpSegment seg;
      if (ddp_decode(body, ul, seg) == DdpError::ok && seg.opcode == RdmapOpcode::terminate) {
        t = decode_terminate(body.data() + kDdpUntaggedHdrLen);
        return true;
      }
    }
    return false;
  }
};

}  // namespace wire_peer
