// Hostile and broken frames against a real QP: a fake peer speaks MPA over raw TCP to the
// QP's out-of-band listener, then sends one bad FPDU. The QP must answer with the
// Terminate RFC 5040/5041 prescribe (layer, etype, ecode), go to ERR and flush, and the
// process must not crash. A Terminate from the peer must end an outstanding READ with the
// status it maps to (RDMAP remote operation -> IBV_WC_REM_OP_ERR).
#include <sys/mman.h>

#include <chrono>
#include <thread>

#include "engine/qp.h"
#include "fake_peer.h"

using namespace wire_peer;

namespace {
std::vector<std::byte> untagged(RdmapOpcode op, uint32_t qn, uint32_t msn, size_t payload) {
  std::vector<std::byte> u(kDdpUntaggedHdrLen + payload, std::byte{0x5a});
  encode_untagged(u.data(), op, true, 0, qn, msn, 0);
  return u;
}

// A zero-length Write: as MPA responder the QP sends nothing before the peer's first FPDU.
void open_stream(FakePeer& p) {
  std::vector<std::byte> w(kDdpTaggedHdrLen);
  encode_tagged(w.data(), RdmapOpcode::rdma_write, true, 0, 0);
  p.send_fpdu(w);
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
    u[1] = std::byte{0x4e};  // opcode 14: no such RDMAP message
    v.push_back({"unknown_opcode", u, 0, TermLayer::rdmap, uint8_t(RdmapEtype::remote_operation),
                 uint8_t(RdmapEcode::unexpected_opcode)});
  }
  // A Placement Ack (softverbs' opcode 12) from a peer we never asked for acks.
  v.push_back({"unasked_placement_ack", untagged(RdmapOpcode::sv_ack, kQnSvAck, 1, 0), 0,
               TermLayer::rdmap, uint8_t(RdmapEtype::remote_operation),
               uint8_t(RdmapEcode::unexpected_opcode)});
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

// With SOFTVERBS_IB_COMPLETION=1 we ask the (softverbs-speaking) peer for Placement Acks; one
// acking messages we never sent is a broken or hostile peer: Terminate, QP in ERR.
TEST(PlacementAck, ForMoreThanWeSentTerminates) {
  setenv("SOFTVERBS_IB_COMPLETION", "1", 1);
  {
    Local l;
    FakePeer p(l.qp->qp_num);
    unsetenv("SOFTVERBS_IB_COMPLETION");
    // Asked for: an ack of nothing (count 0) is in order and changes nothing.
    p.send_fpdu(untagged(RdmapOpcode::sv_ack, kQnSvAck, 0, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_NE(l.state(), IBV_QPS_ERR) << "an ack we asked for was refused";
    p.send_fpdu(untagged(RdmapOpcode::sv_ack, kQnSvAck, 3, 0));
    Terminate t;
    ASSERT_TRUE(p.read_terminate(t)) << "no Terminate came back";
    EXPECT_EQ(t.layer, TermLayer::rdmap);
    EXPECT_EQ(t.etype, uint8_t(RdmapEtype::remote_operation));
    EXPECT_EQ(t.ecode, uint8_t(RdmapEcode::unexpected_opcode));
    EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
  }
  unsetenv("SOFTVERBS_IB_COMPLETION");
}

// The thread that reads a Placement Ack does not wait for the QP's tx_mu while another
// thread holds it (ibv_post_send in a long sendmsg): the count waits in Qp::ack_stash and is
// taken once tx_mu is free. White box: the test holds tx_mu itself. A good ack then completes
// the Send; a bad one, read while tx_mu was held, still ends in a Terminate and ERR.
TEST(PlacementAck, ReadWhileTxMuIsHeldIsTakenOnceItIsFree) {
  setenv("SOFTVERBS_IB_COMPLETION", "1", 1);
  {
    Local l;
    FakePeer p(l.qp->qp_num);
    unsetenv("SOFTVERBS_IB_COMPLETION");
    open_stream(p);
    ASSERT_EQ(l.post_send(9, 16), 0);
    std::byte len[2];
    ASSERT_TRUE(p.read_exact(len, 2)) << "our Send never left";
    std::vector<std::byte> body(load_be16(len) + fpdu_pad(load_be16(len)) + 4);
    ASSERT_TRUE(p.read_exact(body.data(), body.size()));
    sv::engine::Qp* q = sv::engine::Qp::from(l.qp);
    std::mutex& tx_mu = q->tx_mu;
    tx_mu.lock();
    p.send_fpdu(untagged(RdmapOpcode::sv_ack, kQnSvAck, 1, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ibv_wc wc{};
    EXPECT_EQ(ibv_poll_cq(l.cq, 1, &wc), 0) << "completed without tx_mu";
    EXPECT_TRUE(q->ack_stashed.load()) << "the reader waited for tx_mu";
    tx_mu.unlock();
    auto done = l.poll(1);
    ASSERT_EQ(done.size(), 1u) << "the ack read meanwhile was lost";
    EXPECT_EQ(done[0].wr_id, 9u);
    EXPECT_EQ(done[0].status, IBV_WC_SUCCESS);
    tx_mu.lock();
    p.send_fpdu(untagged(RdmapOpcode::sv_ack, kQnSvAck, 5, 0));  // only 1 was sent
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_TRUE(q->ack_stashed.load());
    tx_mu.unlock();
    Terminate t;
    ASSERT_TRUE(p.read_terminate(t)) << "no Terminate came back";
    EXPECT_EQ(t.layer, TermLayer::rdmap);
    EXPECT_EQ(t.ecode, uint8_t(RdmapEcode::unexpected_opcode));
    EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
  }
  unsetenv("SOFTVERBS_IB_COMPLETION");
}

// A Terminate from the peer (RDMAP remote operation) ends our outstanding READ with
// IBV_WC_REM_OP_ERR and flushes the rest.
TEST(PeerTerminate, RemoteOperationErrorEndsTheReadWithRemOpErr) {
  Local l;
  FakePeer p(l.qp->qp_num);
  open_stream(p);
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

namespace {

// A Read far larger than one transmit batch (kMaxIov iovecs, about 16 MiB of 64 KiB FPDUs)
// stays in the IRQ while it is framed batch by batch. With a small send buffer on our QP's
// socket and a small receive window at the peer, the first batch cannot leave while the peer
// does not read, so the Read is still in the IRQ when the next frames arrive.
constexpr int kSmallBuf = 4096;
constexpr uint32_t kReadLen = 32u << 20;

struct BigRegion {
  void* mem = nullptr;
  ibv_mr* mr = nullptr;
  BigRegion(ibv_pd* pd, char fill) {
    mem = mmap(nullptr, kReadLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::memset(mem, fill, kReadLen);
    mr = ibv_reg_mr(pd, mem, kReadLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  }
  ~BigRegion() {
    if (mr) ibv_dereg_mr(mr);
    munmap(mem, kReadLen);
  }
  uint64_t to() const { return reinterpret_cast<uint64_t>(mem); }
};

std::vector<std::byte> read_request(uint32_t msn, uint64_t source_to, uint32_t stag, uint32_t len) {
  auto u = untagged(RdmapOpcode::read_request, kQnReadRequest, msn, kReadRequestLen);
  encode_read_request(u.data() + kDdpUntaggedHdrLen, ReadRequest{0x5151, 0, len, stag, source_to});
  return u;
}

void send_all(FakePeer& p, const std::vector<std::vector<std::byte>>& ulpdus) {
  std::vector<std::byte> all;
  for (const auto& u : ulpdus) {
    std::vector<std::byte> f(fpdu_len(u.size()), std::byte{0});
    store_be16(f.data(), static_cast<uint16_t>(u.size()));
    std::memcpy(f.data() + 2, u.data(), u.size());
    all.insert(all.end(), f.begin(), f.end());
  }
  ASSERT_EQ(write(p.fd, all.data(), all.size()), static_cast<ssize_t>(all.size()));
}

}  // namespace

// Read and Atomic Requests share the IRQ, bounded by our IRD (1 here). A peer that ignores its
// ORD and sends an Atomic while a Read is still being answered gets a Terminate (RFC 5040
// §5.2, as siw), and the Atomic is refused before it runs: the target word is unchanged.
TEST(PeerIgnoringOrd, AnAtomicBeyondIrdIsRefusedBeforeItRuns) {
  setenv("SOFTVERBS_SNDBUF", std::to_string(kSmallBuf).c_str(), 1);
  Local l;
  alignas(8) static uint64_t word = 77;
  ibv_mr* amr =
      ibv_reg_mr(l.pd, &word, sizeof word, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(amr, nullptr);
  ibv_qp_attr a{};
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_EQ(ibv_modify_qp(l.qp, &a, IBV_QP_ACCESS_FLAGS), 0);
  FakePeer p(l.qp->qp_num, "127.0.0.1", true, kSmallBuf);
  auto atomic = untagged(RdmapOpcode::atomic_request, kQnReadRequest, 2, kAtomicRequestLen);
  AtomicRequest ar;
  ar.op = AtomicOp::fetch_add;
  ar.req_id = 9;
  ar.stag = amr->rkey;
  ar.to = reinterpret_cast<uint64_t>(&word);
  ar.add_swap = 1;
  encode_atomic_request(atomic.data() + kDdpUntaggedHdrLen, ar);
  BigRegion big(l.pd, 'R');
  ASSERT_NE(big.mr, nullptr);
  send_all(p, {read_request(1, big.to(), big.mr->rkey, kReadLen), atomic});
  EXPECT_TRUE(l.wait_state(IBV_QPS_ERR)) << "an Atomic beyond IRD was accepted";
  EXPECT_EQ(word, 77u) << "the Atomic beyond IRD ran";
  ibv_dereg_mr(amr);
  unsetenv("SOFTVERBS_SNDBUF");
}

// The source of a Read Response is checked again as each batch of it is framed: deregistered
// while the response waits for the peer's window, the rest of the region is not sent (what
// was framed before is, as a NIC's DMA in flight would be); the peer gets a Terminate, and
// the QP ends with the access-violation event.
TEST(ReadResponse, ARegionDeregisteredMidResponseIsNotSent) {
  setenv("SOFTVERBS_SNDBUF", std::to_string(kSmallBuf).c_str(), 1);
  Local l;
  BigRegion src(l.pd, 'S');
  ASSERT_NE(src.mr, nullptr);
  FakePeer p(l.qp->qp_num, "127.0.0.1", true, kSmallBuf);
  send_all(p, {read_request(1, src.to(), src.mr->rkey, kReadLen)});
  // The response has started and stalled on the peer's window (the Request was taken: the
  // QP is alive and nothing more is coming). Deregister, then let it drain.
  std::byte first[2];
  ASSERT_TRUE(p.read_exact(first, 2));
  ASSERT_EQ(ibv_dereg_mr(src.mr), 0);
  src.mr = nullptr;
  std::vector<std::byte> body(load_be16(first) + fpdu_pad(load_be16(first)) + 4);
  ASSERT_TRUE(p.read_exact(body.data(), body.size()));
  uint64_t sent_after_dereg = 0;
  bool terminated = false;
  for (int i = 0; i < 2000 && !terminated; ++i) {
    std::byte len[2];
    if (!p.read_exact(len, 2)) break;
    const uint16_t ul = load_be16(len);
    std::vector<std::byte> b(ul + fpdu_pad(ul) + 4);
    if (!p.read_exact(b.data(), b.size())) break;
    DdpSegment seg;
    ASSERT_EQ(ddp_decode(b, ul, seg), DdpError::ok);
    if (seg.opcode == RdmapOpcode::terminate) {
      terminated = true;
    } else {
      ASSERT_EQ(seg.opcode, RdmapOpcode::read_response);
      sent_after_dereg += ul - seg.hdr_len;
    }
  }
  EXPECT_TRUE(terminated) << "no Terminate after the region went away";
  EXPECT_LT(sent_after_dereg, kReadLen);
  EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(l.ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  ibv_ack_async_event(&ev);
  unsetenv("SOFTVERBS_SNDBUF");
}
