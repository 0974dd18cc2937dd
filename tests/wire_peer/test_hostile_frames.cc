// Hostile and broken frames against a real QP: a fake peer speaks MPA over raw TCP to the
// QP's out-of-band listener, then sends one bad FPDU. The QP must answer with the
// Terminate RFC 5040/5041 prescribe (layer, etype, ecode), go to ERR and flush, and the
// process must not crash. A Terminate from the peer must end an outstanding READ with the
// status it maps to (RDMAP remote operation -> IBV_WC_REM_OP_ERR).
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

using namespace sv::wire;

namespace {

constexpr uint32_t kFakeQpn = 2;  // smaller than any real QPN: the real QP is passive

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

// The fake peer: MPA initiator on the QP's listener (port = QPN >> 8).
struct FakePeer {
  int fd = -1;
  explicit FakePeer(uint32_t qpn) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
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
    EXPECT_TRUE(read_exact(rep.data(), kMpaHeaderLen));
    const size_t more = mpa_frame_len(rep) - kMpaHeaderLen;
    rep.resize(kMpaHeaderLen + more);
    EXPECT_TRUE(read_exact(rep.data() + kMpaHeaderLen, more));
    MpaFrame r;
    EXPECT_EQ(mpa_decode(rep, MpaKind::reply, 512, r), MpaError::ok);
    EXPECT_FALSE(r.reject);
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

std::vector<std::byte> untagged(RdmapOpcode op, uint32_t qn, uint32_t msn, size_t payload) {
  std::vector<std::byte> u(kDdpUntaggedHdrLen + payload, std::byte{0x5a});
  encode_untagged(u.data(), op, true, 0, qn, msn, 0);
  return u;
}

struct Case {
  const char* name;
  std::vector<std::byte> ulpdu;
  uint16_t declared_len;
  TermLayer layer;
  uint8_t etype;
  uint8_t ecode;
  // What the one posted receive completes with: flushed when the bad frame was not aimed
  // at it, or the local error of the Send that was (RFC 5041 §7 / IB: a Send longer than
  // the receive is a local length error on the receive).
  ibv_wc_status recv_status = IBV_WC_WR_FLUSH_ERR;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  auto send_ok = untagged(RdmapOpcode::send, kQnSend, 1, 8);
  {
    auto u = send_ok;
    u[0] = std::byte{0x42};  // DDP version 2
    v.push_back({"ddp_version", u, 0, TermLayer::ddp, uint8_t(DdpEtype::untagged),
                 uint8_t(DdpUntaggedEcode::invalid_version)});
  }
  {
    auto u = send_ok;
    u[1] = std::byte{0x83};  // RDMAP version 2
    v.push_back({"rdmap_version", u, 0, TermLayer::rdmap, uint8_t(RdmapEtype::remote_operation),
                 uint8_t(RdmapEcode::invalid_version)});
  }
  {
    auto u = send_ok;
    u[1] = std::byte{0x4c};  // opcode 12: no such RDMAP message
    v.push_back({"unknown_opcode", u, 0, TermLayer::rdmap, uint8_t(RdmapEtype::remote_operation),
                 uint8_t(RdmapEcode::unexpected_opcode)});
  }
  v.push_back({"msn_out_of_range", untagged(RdmapOpcode::send, kQnSend, 7, 8), 0, TermLayer::ddp,
               uint8_t(DdpEtype::untagged), uint8_t(DdpUntaggedEcode::msn_range)});
  v.push_back({"bad_qn", untagged(RdmapOpcode::send, 5, 1, 8), 0, TermLayer::ddp,
               uint8_t(DdpEtype::untagged), uint8_t(DdpUntaggedEcode::invalid_qn)});
  v.push_back({"send_too_long", untagged(RdmapOpcode::send, kQnSend, 1, 200), 0, TermLayer::ddp,
               uint8_t(DdpEtype::untagged), uint8_t(DdpUntaggedEcode::too_long),
               IBV_WC_LOC_LEN_ERR});
  {
    std::vector<std::byte> u(kDdpTaggedHdrLen + 16, std::byte{1});
    encode_tagged(u.data(), RdmapOpcode::rdma_write, true, 0xdead0001, 0);
    v.push_back({"write_bad_stag", u, 0, TermLayer::ddp, uint8_t(DdpEtype::tagged),
                 uint8_t(DdpTaggedEcode::invalid_stag)});
  }
  {
    auto u = untagged(RdmapOpcode::read_request, kQnReadRequest, 1, kReadRequestLen);
    ReadRequest rr{1, 0, 64, 0xbad00001, 0};
    encode_read_request(u.data() + kDdpUntaggedHdrLen, rr);
    v.push_back({"read_bad_source_stag", u, 0, TermLayer::rdmap,
                 uint8_t(RdmapEtype::remote_protection), uint8_t(RdmapEcode::invalid_stag)});
  }
  {
    auto u = untagged(RdmapOpcode::read_request, kQnReadRequest, 1, kReadRequestLen + 4);
    ReadRequest rr{1, 0, 4, 0, 0};
    encode_read_request(u.data() + kDdpUntaggedHdrLen, rr);
    v.push_back({"read_request_with_payload", u, 0, TermLayer::rdmap,
                 uint8_t(RdmapEtype::remote_operation), uint8_t(RdmapEcode::unexpected_opcode)});
  }
  return v;
}

}  // namespace

class HostileFrame : public ::testing::TestWithParam<size_t> {};

TEST_P(HostileFrame, TerminateQpErrorAndFlushNeverACrash) {
  const Case c = cases()[GetParam()];
  SCOPED_TRACE(c.name);
  Local l;
  ibv_sge s{reinterpret_cast<uint64_t>(l.buf.data()), 64, l.mr->lkey};
  ibv_recv_wr r{};
  r.wr_id = 77;
  r.sg_list = &s;
  r.num_sge = 1;
  ibv_recv_wr* bad;
  ASSERT_EQ(ibv_post_recv(l.qp, &r, &bad), 0);
  FakePeer p(l.qp->qp_num);
  p.send_fpdu(c.ulpdu, c.declared_len);
  Terminate t;
  ASSERT_TRUE(p.read_terminate(t)) << "no Terminate came back";
  EXPECT_EQ(t.layer, c.layer);
  EXPECT_EQ(t.etype, c.etype);
  EXPECT_EQ(t.ecode, c.ecode);
  EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
  auto wc = l.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 77u);
  EXPECT_EQ(wc[0].status, c.recv_status) << ibv_wc_status_str(wc[0].status);
}

// Every case of cases(), however many there are.
std::vector<size_t> case_indices() {
  std::vector<size_t> v(cases().size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

INSTANTIATE_TEST_SUITE_P(Frames, HostileFrame, ::testing::ValuesIn(case_indices()),
                         [](const auto& info) { return std::string(cases()[info.param].name); });

// A Terminate from the peer (RDMAP remote operation) ends our outstanding READ with
// IBV_WC_REM_OP_ERR and flushes the rest.
TEST(PeerTerminate, RemoteOperationErrorEndsTheReadWithRemOpErr) {
  Local l;
  FakePeer p(l.qp->qp_num);
  // A zero-length Write first: as MPA responder we send nothing before the first FPDU.
  std::vector<std::byte> w(kDdpTaggedHdrLen);
  encode_tagged(w.data(), RdmapOpcode::rdma_write, true, 0, 0);
  p.send_fpdu(w);
  ibv_sge s{reinterpret_cast<uint64_t>(l.buf.data()), 64, l.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 5;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = 0x1000;
  wr.wr.rdma.rkey = 0x1234;
  ibv_send_wr second = wr;
  second.wr_id = 6;
  second.opcode = IBV_WR_SEND;
  wr.next = &second;
  ibv_send_wr* bad;
  ASSERT_EQ(ibv_post_send(l.qp, &wr, &bad), 0);
  // Consume the Read Request, then answer it with a Terminate.
  std::byte hdr[2];
  ASSERT_TRUE(p.read_exact(hdr, 2));
  std::vector<std::byte> rest(load_be16(hdr) + fpdu_pad(load_be16(hdr)) + 4);
  ASSERT_TRUE(p.read_exact(rest.data(), rest.size()));
  auto u = untagged(RdmapOpcode::terminate, kQnTerminate, 1, kTerminateCtrlLen);
  Terminate t;
  t.layer = TermLayer::rdmap;
  t.etype = uint8_t(RdmapEtype::remote_operation);
  t.ecode = uint8_t(RdmapEcode::catastrophic_stream);
  encode_terminate(u.data() + kDdpUntaggedHdrLen, t);
  p.send_fpdu(u);
  auto wc = l.poll(2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_OP_ERR) << ibv_wc_status_str(wc[0].status);
  EXPECT_EQ(wc[1].wr_id, 6u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
}
