// Hostile and broken frames against a real QP: a fake peer speaks MPA over raw TCP to the
// QP's out-of-band listener, then sends one bad FPDU. The QP must answer with the
// Terminate RFC 5040/5041 prescribe (layer, etype, ecode), go to ERR and flush, and the
// process must not crash. A Terminate from the peer must end an outstanding READ with the
// status it maps to (RDMAP remote operation -> IBV_WC_REM_OP_ERR).
#include "fake_peer.h"

using namespace wire_peer;

namespace {
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
