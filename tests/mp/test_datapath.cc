// Data path across processes: every opcode, pattern-verified, with the sizes, SGE lists and
// flags applications use. `local` (this process) is the requester unless a test says
// otherwise; `remote` is the child process.
//
// iWARP note: a SEND or RDMA WRITE completes at the requester once its bytes are handed to
// the transport, not when the peer has placed them (RFC 5040 has no ACK). A test that checks
// WRITE data at the peer therefore follows the WRITE with a SEND and waits for the peer's
// receive completion, which orders after the WRITE's placement -- as applications must.
#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "harness.h"

namespace mp {
namespace {

constexpr uint32_t kMiB = 1u << 20;
constexpr uint32_t kGuard = 4096;  // bytes past a message that must stay untouched
constexpr uint32_t kGuardSeed = 0x6A4D;
constexpr uint32_t kSizes[] = {0, 1, 4095, 65536 + 7, kMiB};

SendSpec send_of(uint64_t wr_id, uint64_t off, uint32_t len, uint32_t flags = IBV_SEND_SIGNALED) {
  // A zero-length message goes out with no SGE at all.
  return len ? make_send(wr_id, {sge(off, len)}, flags) : make_send(wr_id, {}, flags);
}

SendSpec rdma_of(ibv_wr_opcode op, uint64_t wr_id, uint64_t off, uint32_t len, uint64_t raddr,
                 uint32_t rkey) {
  return len ? make_rdma(op, wr_id, {sge(off, len)}, raddr, rkey)
             : make_rdma(op, wr_id, {}, raddr, rkey);
}

TEST_F(XProc, SendRecvAllSizes) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  uint32_t seed = 100;
  for (uint32_t len : kSizes) {
    SCOPED_TRACE(testing::Message() << "len=" << len);
    remote->fill(0, 0, len + kGuard, kGuardSeed);
    ASSERT_EQ(remote->post_recv(5000 + len, {sge(0, kMiB + kGuard)}), 0);
    local->fill(0, 0, len, seed);
    ASSERT_EQ(local->post_send(send_of(len, 0, len)), 0);

    auto s = local->poll(CqSel::send, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(wc_is(s[0], len, IBV_WC_SUCCESS, IBV_WC_SEND));
    EXPECT_EQ(s[0].qp_num, li.qpn);

    auto r = remote->poll(CqSel::recv, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_TRUE(wc_is(r[0], 5000 + len, IBV_WC_SUCCESS, IBV_WC_RECV));
    EXPECT_EQ(r[0].byte_len, len);
    EXPECT_EQ(r[0].wc_flags & (IBV_WC_WITH_IMM | IBV_WC_WITH_INV), 0u);
    EXPECT_EQ(r[0].qp_num, ri.qpn);
    EXPECT_EQ(remote->check(0, 0, len, seed), -1);
    EXPECT_EQ(remote->check(0, len, kGuard, kGuardSeed, len), -1)
        << "bytes past the message were written";
    ++seed;
  }
}

TEST_F(XProc, SendRecvFromPeer) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t len = 65536 + 7;
  local->fill(0, 0, len + kGuard, kGuardSeed);
  ASSERT_EQ(local->post_recv(3, {sge(0, kMiB)}), 0);
  remote->fill(0, 0, len, 7);
  ASSERT_EQ(remote->post_send(send_of(4, 0, len)), 0);
  auto s = remote->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 4, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 3, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, len);
  EXPECT_EQ(local->check(0, 0, len, 7), -1);
  EXPECT_EQ(local->check(0, len, kGuard, kGuardSeed, len), -1);
}

TEST_F(XProc, SendWithImm) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t lens[] = {0, 1, 65536 + 7};
  uint32_t seed = 200;
  for (uint32_t len : lens) {
    SCOPED_TRACE(testing::Message() << "len=" << len);
    const uint32_t imm_host = 0xA1B2C300u + len;
    remote->fill(0, 0, len + kGuard, kGuardSeed);
    ASSERT_EQ(remote->post_recv(9, {sge(0, kMiB)}), 0);
    local->fill(0, 0, len, seed);
    SendSpec s = send_of(10, 0, len);
    s.opcode = IBV_WR_SEND_WITH_IMM;
    s.imm_or_inv = htonl(imm_host);
    ASSERT_EQ(local->post_send(s), 0);

    auto sw = local->poll(CqSel::send, 1);
    ASSERT_EQ(sw.size(), 1u);
    EXPECT_TRUE(wc_is(sw[0], 10, IBV_WC_SUCCESS, IBV_WC_SEND));
    auto r = remote->poll(CqSel::recv, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_TRUE(wc_is(r[0], 9, IBV_WC_SUCCESS, IBV_WC_RECV));
    EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_IMM);
    EXPECT_FALSE(r[0].wc_flags & IBV_WC_WITH_INV);
    EXPECT_EQ(ntohl(r[0].imm_data), imm_host) << "imm_data is network order end to end";
    EXPECT_EQ(r[0].byte_len, len);
    EXPECT_EQ(remote->check(0, 0, len, seed), -1);
    EXPECT_EQ(remote->check(0, len, kGuard, kGuardSeed, len), -1);
    ++seed;
  }
}

// Send with Invalidate: test_mw.cc (it names a window the receiver bound).

TEST_F(XProc, RdmaWriteAllSizes) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  uint32_t seed = 400;
  const uint64_t marker_off = 3 * kMiB;  // where the marker SEND lands at the peer
  for (uint32_t len : kSizes) {
    SCOPED_TRACE(testing::Message() << "len=" << len);
    remote->fill(0, 0, len + kGuard, kGuardSeed);
    ASSERT_EQ(remote->post_recv(900, {sge(marker_off, 64)}), 0);
    local->fill(0, 0, len, seed);
    ASSERT_EQ(local->post_send(rdma_of(IBV_WR_RDMA_WRITE, len, 0, len, ri.addr, ri.rkey)), 0);
    ASSERT_EQ(local->post_send(send_of(901, 0, 0)), 0);

    auto s = local->poll(CqSel::send, 2);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_TRUE(wc_is(s[0], len, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
    EXPECT_TRUE(wc_is(s[1], 901, IBV_WC_SUCCESS, IBV_WC_SEND));
    // The WRITE consumed no receive: the only one posted went to the marker.
    auto r = remote->poll(CqSel::recv, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_TRUE(wc_is(r[0], 900, IBV_WC_SUCCESS, IBV_WC_RECV));
    EXPECT_EQ(r[0].byte_len, 0u);
    EXPECT_EQ(remote->check(0, 0, len, seed), -1);
    EXPECT_EQ(remote->check(0, len, kGuard, kGuardSeed, len), -1);
    ++seed;
  }
}

TEST_F(XProc, RdmaWriteFromPeer) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t len = kMiB - 3;
  local->fill(0, 8, len + kGuard, kGuardSeed);
  ASSERT_EQ(local->post_recv(1, {sge(3 * kMiB, 64)}), 0);
  remote->fill(0, 0, len, 33);
  ASSERT_EQ(remote->post_send(rdma_of(IBV_WR_RDMA_WRITE, 2, 0, len, li.addr + 8, li.rkey)), 0);
  ASSERT_EQ(remote->post_send(send_of(3, 0, 0)), 0);
  auto s = remote->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_TRUE(wc_is(s[1], 3, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = local->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(local->check(0, 8, len, 33), -1);
  EXPECT_EQ(local->check(0, 8 + len, kGuard, kGuardSeed, len), -1);
}

TEST_F(XProc, RdmaWriteWithImm) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t len = 65536 + 7;
  const uint64_t rq_off = 3 * kMiB;
  remote->fill(0, 0, len + kGuard, kGuardSeed);
  remote->fill(0, rq_off, 8192, kGuardSeed + 1);
  // Two receives: the WRITE_WITH_IMM consumes the first, the SEND after it the second.
  ASSERT_EQ(remote->post_recv(1, {sge(rq_off, 4096)}), 0);
  ASSERT_EQ(remote->post_recv(2, {sge(rq_off + 4096, 4096)}), 0);
  local->fill(0, 0, len, 55);
  local->fill(0, 2 * kMiB, 16, 56);
  SendSpec w = rdma_of(IBV_WR_RDMA_WRITE_WITH_IMM, 11, 0, len, ri.addr, ri.rkey);
  w.imm_or_inv = htonl(0xDEADBEEFu);
  ASSERT_EQ(local->post_send(w), 0);
  ASSERT_EQ(local->post_send(send_of(12, 2 * kMiB, 16)), 0);

  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[0], 11, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_TRUE(wc_is(s[1], 12, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = remote->poll(CqSel::recv, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM));
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(ntohl(r[0].imm_data), 0xDEADBEEFu);
  EXPECT_TRUE(wc_is(r[1], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[1].byte_len, 16u);
  EXPECT_FALSE(r[1].wc_flags & IBV_WC_WITH_IMM);
  // Data went to the WRITE's target; the consumed receive buffer was not written.
  EXPECT_EQ(remote->check(0, 0, len, 55), -1);
  EXPECT_EQ(remote->check(0, len, kGuard, kGuardSeed, len), -1);
  EXPECT_EQ(remote->check(0, rq_off, 4096, kGuardSeed + 1), -1);
  EXPECT_EQ(remote->check(0, rq_off + 4096, 16, 56), -1);
}

// rdma-core convention for IBV_WC_RECV_RDMA_WITH_IMM: byte_len is the length of the RDMA
// WRITE (ibv_poll_cq(3): "byte_len ... relevant if the Receive Queue for incoming Send or
// RDMA Write with immediate operations"; rxe reports qp->resp.length since the kernel fix
// for write-with-imm byte_len, mlx5 reports the CQE byte count). An application that sizes
// the data it was just written from byte_len (it used to get 0 from softverbs).
TEST_F(XProc, RdmaWriteWithImmByteLenIsWriteLength) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t len = 4095;
  ASSERT_EQ(remote->post_recv(1, {sge(3 * kMiB, 64)}), 0);
  local->fill(0, 0, len, 57);
  SendSpec w = rdma_of(IBV_WR_RDMA_WRITE_WITH_IMM, 1, 0, len, ri.addr, ri.rkey);
  w.imm_or_inv = htonl(7);
  ASSERT_EQ(local->post_send(w), 0);
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM));
  EXPECT_EQ(r[0].byte_len, len);
  EXPECT_EQ(local->poll(CqSel::send, 1).size(), 1u);
}

TEST_F(XProc, RdmaReadAllSizes) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  uint32_t seed = 600;
  for (uint32_t len : kSizes) {
    SCOPED_TRACE(testing::Message() << "len=" << len);
    remote->fill(0, 16, len, seed);
    local->fill(0, 0, len + kGuard, kGuardSeed);
    ASSERT_EQ(local->post_send(rdma_of(IBV_WR_RDMA_READ, len, 0, len, ri.addr + 16, ri.rkey)), 0);
    auto s = local->poll(CqSel::send, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(wc_is(s[0], len, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
    EXPECT_EQ(s[0].byte_len, len);
    EXPECT_EQ(local->check(0, 0, len, seed), -1);
    EXPECT_EQ(local->check(0, len, kGuard, kGuardSeed, len), -1);
    ++seed;
  }
}

TEST_F(XProc, RdmaReadFromPeer) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t len = 65536 + 7;
  local->fill(0, 4096, len, 61);
  remote->fill(0, 0, len + kGuard, kGuardSeed);
  ASSERT_EQ(remote->post_send(rdma_of(IBV_WR_RDMA_READ, 5, 0, len, li.addr + 4096, li.rkey)), 0);
  auto s = remote->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 5, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
  EXPECT_EQ(remote->check(0, 0, len, 61), -1);
  EXPECT_EQ(remote->check(0, len, kGuard, kGuardSeed, len), -1);
}

TEST_F(XProc, AtomicFetchAddAndCompareSwap) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint64_t off = 4096;  // 8-byte aligned target
  remote->fill(0, off - 64, 192, kGuardSeed);
  const uint64_t v0 = 0x0123456789ABCDEFull;
  remote->write_u64(0, off, v0);
  local->fill(0, 0, 64, 9);  // stale bytes where the original values will land
  auto result = [&](uint64_t loff) {
    uint64_t v;
    std::memcpy(&v, local->ptr(0, loff), 8);
    return v;
  };

  // FETCH_AND_ADD: returns the original, remote memory becomes original + add.
  ASSERT_EQ(local->post_send(make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 1, sge(0, 8), ri.addr + off,
                                         ri.rkey, 0x1111)),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD));
  EXPECT_EQ(s[0].byte_len, 8u);
  EXPECT_EQ(result(0), v0);
  EXPECT_EQ(remote->read_u64(0, off), v0 + 0x1111);

  // CMP_AND_SWP hit: returns the original, memory becomes swap.
  const uint64_t swapped = 0xFEEDFACECAFEBEEFull;
  ASSERT_EQ(local->post_send(make_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 2, sge(8, 8), ri.addr + off,
                                         ri.rkey, v0 + 0x1111, swapped)),
            0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP));
  EXPECT_EQ(result(8), v0 + 0x1111);
  EXPECT_EQ(remote->read_u64(0, off), swapped);

  // CMP_AND_SWP miss: returns the original, memory unchanged.
  ASSERT_EQ(local->post_send(make_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 3, sge(16, 8), ri.addr + off,
                                         ri.rkey, 42, 7)),
            0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 3, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP));
  EXPECT_EQ(result(16), swapped);
  EXPECT_EQ(remote->read_u64(0, off), swapped);

  // FETCH_AND_ADD wraps modulo 2^64.
  remote->write_u64(0, off + 8, ~0ull);
  ASSERT_EQ(local->post_send(make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 4, sge(24, 8),
                                         ri.addr + off + 8, ri.rkey, 2)),
            0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 4, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD));
  EXPECT_EQ(result(24), ~0ull);
  EXPECT_EQ(remote->read_u64(0, off + 8), 1u);

  // Only the 8 target bytes changed at the peer, and only the result bytes locally.
  EXPECT_EQ(remote->check(0, off - 64, 64, kGuardSeed), -1);
  EXPECT_EQ(remote->check(0, off + 16, 112, kGuardSeed, 80), -1);
  EXPECT_EQ(local->check(0, 32, 32, 9, 32), -1);
}

TEST_F(XProc, GatherSendScatterRecv) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  // Gather: three SGEs at scattered offsets; the message is their concatenation.
  const uint32_t glen[3] = {100, 5000, 70000};
  const uint64_t goff[3] = {0, 8192, 65536};
  uint64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    local->fill(0, goff[i], glen[i], 71, total);
    total += glen[i];
  }
  // Scatter: the message fills the first two SGEs and part of the third.
  const uint32_t slen[3] = {30000, 7, 60000};
  const uint64_t soff[3] = {0, 100000, 200000};
  remote->fill(0, 0, 300000, kGuardSeed);
  ASSERT_EQ(
      remote->post_recv(1, {sge(soff[0], slen[0]), sge(soff[1], slen[1]), sge(soff[2], slen[2])}),
      0);
  ASSERT_EQ(local->post_send(make_send(
                2, {sge(goff[0], glen[0]), sge(goff[1], glen[1]), sge(goff[2], glen[2])})),
            0);
  auto s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, total);
  const uint32_t third = static_cast<uint32_t>(total - slen[0] - slen[1]);
  EXPECT_EQ(remote->check(0, soff[0], slen[0], 71, 0), -1);
  EXPECT_EQ(remote->check(0, soff[1], slen[1], 71, slen[0]), -1);
  EXPECT_EQ(remote->check(0, soff[2], third, 71, slen[0] + slen[1]), -1);
  // Nothing between or after the SGEs was written.
  EXPECT_EQ(remote->check(0, slen[0], soff[1] - slen[0], kGuardSeed, slen[0]), -1);
  EXPECT_EQ(remote->check(0, soff[1] + slen[1], soff[2] - soff[1] - slen[1], kGuardSeed,
                          soff[1] + slen[1]),
            -1);
  EXPECT_EQ(
      remote->check(0, soff[2] + third, 300000 - soff[2] - third, kGuardSeed, soff[2] + third), -1);
}

TEST_F(XProc, GatherWriteAndScatterRead) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  // WRITE gathered from three SGEs into one contiguous remote range.
  const uint32_t glen[3] = {4097, 1, 65536};
  const uint64_t goff[3] = {0, 10000, 20000};
  uint64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    local->fill(0, goff[i], glen[i], 81, total);
    total += glen[i];
  }
  remote->fill(0, 0, total + kGuard, kGuardSeed);
  ASSERT_EQ(remote->post_recv(1, {sge(3 * kMiB, 64)}), 0);
  ASSERT_EQ(
      local->post_send(make_rdma(
          IBV_WR_RDMA_WRITE, 2,
          {sge(goff[0], glen[0]), sge(goff[1], glen[1]), sge(goff[2], glen[2])}, ri.addr, ri.rkey)),
      0);
  ASSERT_EQ(local->post_send(send_of(3, 0, 0)), 0);
  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[0], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, total, 81), -1);
  EXPECT_EQ(remote->check(0, total, kGuard, kGuardSeed, total), -1);

  // READ from one contiguous remote range scattered into three local SGEs.
  const uint32_t rlen = 75100;
  remote->fill(0, kMiB, rlen, 82);
  const uint32_t slen[3] = {30000, 7, 45093};
  const uint64_t soff[3] = {kMiB, kMiB + 100000, kMiB + 200000};
  local->fill(0, kMiB, 300000, kGuardSeed);
  ASSERT_EQ(local->post_send(
                make_rdma(IBV_WR_RDMA_READ, 4,
                          {sge(soff[0], slen[0]), sge(soff[1], slen[1]), sge(soff[2], slen[2])},
                          ri.addr + kMiB, ri.rkey)),
            0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], 4, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
  EXPECT_EQ(local->check(0, soff[0], slen[0], 82, 0), -1);
  EXPECT_EQ(local->check(0, soff[1], slen[1], 82, slen[0]), -1);
  EXPECT_EQ(local->check(0, soff[2], slen[2], 82, slen[0] + slen[1]), -1);
  EXPECT_EQ(local->check(0, soff[0] + slen[0], soff[1] - soff[0] - slen[0], kGuardSeed, slen[0]),
            -1);
  EXPECT_EQ(local->check(0, soff[2] + slen[2], kGuard, kGuardSeed, soff[2] + slen[2] - kMiB), -1);
}

TEST_F(XProc, InlineSendBufferReusableOnReturn) {
  PeerConfig lc;
  lc.max_inline_data = 200;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  ASSERT_GE(local->cap.max_inline_data, 200u);
  ASSERT_EQ(remote->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_recv(2, {sge(4096, 4096)}), 0);

  // One SGE from an unregistered stack buffer: inline data needs no lkey.
  uint8_t buf[200];
  fill_pattern(buf, sizeof buf, 91);
  ibv_sge sg{reinterpret_cast<uint64_t>(buf), sizeof buf, 0};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(local->qp, &wr, &bad), 0);
  std::memset(buf, 0xEE, sizeof buf);  // reuse at once

  // Two SGEs from unregistered heap memory.
  std::vector<uint8_t> a(120), b(80);
  fill_pattern(a.data(), a.size(), 92, 0);
  fill_pattern(b.data(), b.size(), 92, a.size());
  ibv_sge sg2[2] = {{reinterpret_cast<uint64_t>(a.data()), 120, 0},
                    {reinterpret_cast<uint64_t>(b.data()), 80, 0}};
  wr.wr_id = 2;
  wr.sg_list = sg2;
  wr.num_sge = 2;
  ASSERT_EQ(ibv_post_send(local->qp, &wr, &bad), 0);
  std::memset(a.data(), 0xEE, a.size());
  std::memset(b.data(), 0xEE, b.size());

  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_TRUE(wc_is(s[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = remote->poll(CqSel::recv, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_TRUE(wc_is(r[1], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, 200u);
  EXPECT_EQ(r[1].byte_len, 200u);
  EXPECT_EQ(remote->check(0, 0, 200, 91), -1);
  EXPECT_EQ(remote->check(0, 4096, 200, 92), -1);
}

TEST_F(XProc, UnsignaledWrsReleaseSlotsAndOnlySignaledComplete) {
  PeerConfig lc;
  lc.max_send_wr = 8;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  const uint32_t cap = local->cap.max_send_wr;
  ASSERT_GE(cap, 8u);
  ASSERT_LE(cap, 64u);
  constexpr uint32_t kRounds = 3;
  for (uint32_t i = 0; i < kRounds * cap; ++i)
    ASSERT_EQ(remote->post_recv(i, {sge(i * 64, 64)}), 0);
  // Each round fills the whole SQ: cap-1 unsignaled WRs and a signaled one. The next
  // round only fits if the unsignaled WQEs were retired along with the signaled one.
  for (uint32_t round = 0; round < kRounds; ++round) {
    for (uint32_t i = 0; i < cap; ++i) {
      const uint32_t n = round * cap + i;
      local->fill(0, n * 16, 16, 1000 + n);
      const uint32_t flags = i + 1 == cap ? IBV_SEND_SIGNALED : 0;
      ASSERT_EQ(local->post_send(make_send(n, {sge(n * 16, 16)}, flags)), 0)
          << "round " << round << " wr " << i;
    }
    auto s = local->poll(CqSel::send, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(wc_is(s[0], round * cap + cap - 1, IBV_WC_SUCCESS, IBV_WC_SEND));
    // Completions are FIFO: a CQE for any unsignaled WR would have come first.
    ibv_wc extra;
    EXPECT_EQ(ibv_poll_cq(local->scq, 1, &extra), 0) << wc_str(extra);
  }
  auto r = remote->poll(CqSel::recv, kRounds * cap);
  ASSERT_EQ(r.size(), kRounds * cap);
  for (uint32_t n = 0; n < kRounds * cap; ++n) {
    EXPECT_TRUE(wc_is(r[n], n, IBV_WC_SUCCESS, IBV_WC_RECV));
    EXPECT_EQ(r[n].byte_len, 16u);
    EXPECT_EQ(remote->check(0, n * 64, 16, 1000 + n), -1) << "message " << n;
  }
}

TEST_F(XProc, SqSigAllSignalsEveryWr) {
  PeerConfig lc;
  lc.sq_sig_all = 1;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(local->qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(init.sq_sig_all, 1);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(remote->post_recv(i, {sge(i * 64, 64)}), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(local->post_send(make_send(i, {sge(0, 8)}, 0)), 0);
  ASSERT_EQ(
      local->post_send(make_rdma(IBV_WR_RDMA_WRITE, 3, {sge(0, 8)}, ri.addr + kMiB, ri.rkey, 0)),
      0);
  auto s = local->poll(CqSel::send, 4);
  ASSERT_EQ(s.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(wc_is(s[i], i, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_TRUE(wc_is(s[3], 3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_EQ(remote->poll(CqSel::recv, 3).size(), 3u);
}

TEST_F(XProc, ReadsAndAtomicsBeyondMaxRdAtomicCompleteInOrder) {
  PeerConfig lc, rc;
  lc.max_rd_atomic = 4;
  rc.max_dest_rd_atomic = 4;
  ASSERT_NO_FATAL_FAILURE(Connect(lc, rc));
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(local->qp, &attr, IBV_QP_MAX_QP_RD_ATOMIC, &init), 0);
  EXPECT_EQ(attr.max_rd_atomic, 4);

  constexpr uint32_t kReads = 64, kChunk = 8192, kAtomics = 16;
  const uint64_t counter = 2 * kMiB;
  remote->fill(0, 0, kReads * kChunk, 23);
  remote->write_u64(0, counter, 0);
  local->fill(0, 0, kReads * kChunk, kGuardSeed);
  std::vector<SendSpec> chain;
  for (uint32_t i = 0; i < kReads; ++i)
    chain.push_back(
        make_rdma(IBV_WR_RDMA_READ, i, {sge(i * kChunk, kChunk)}, ri.addr + i * kChunk, ri.rkey));
  for (uint32_t i = 0; i < kAtomics; ++i)
    chain.push_back(make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, kReads + i, sge(counter + i * 8, 8),
                                ri.addr + counter, ri.rkey, 1));
  ptrdiff_t bad = -2;
  ASSERT_EQ(local->post_send_chain(chain, &bad), 0);
  EXPECT_EQ(bad, -1);
  auto s = local->poll(CqSel::send, kReads + kAtomics);
  ASSERT_EQ(s.size(), kReads + kAtomics);
  for (uint32_t i = 0; i < kReads; ++i) {
    EXPECT_TRUE(wc_is(s[i], i, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
    EXPECT_EQ(s[i].byte_len, kChunk);
  }
  for (uint32_t i = 0; i < kAtomics; ++i) {
    EXPECT_TRUE(wc_is(s[kReads + i], kReads + i, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD));
    uint64_t v;
    std::memcpy(&v, local->ptr(0, counter + i * 8), 8);
    EXPECT_EQ(v, i) << "atomics executed out of order";
  }
  EXPECT_EQ(local->check(0, 0, kReads * kChunk, 23), -1);
  EXPECT_EQ(remote->read_u64(0, counter), kAtomics);
}

TEST_F(XProc, FenceHoldsSendUntilPriorReadCompletes) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t len = 65536 + 7;
  local->fill(0, 0, len, 31);   // stale content of the READ sink
  remote->fill(0, 0, len, 32);  // what the READ brings
  ASSERT_EQ(remote->post_recv(1, {sge(kMiB, kMiB)}), 0);
  // The SEND gathers from the READ's sink. Fenced, it may only start once the READ has
  // completed, so it must carry what the READ brought, never the stale bytes.
  std::vector<SendSpec> chain = {make_rdma(IBV_WR_RDMA_READ, 1, {sge(0, len)}, ri.addr, ri.rkey),
                                 make_send(2, {sge(0, len)}, IBV_SEND_SIGNALED | IBV_SEND_FENCE)};
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, 2);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
  EXPECT_TRUE(wc_is(s[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, len);
  EXPECT_EQ(remote->check(0, kMiB, len, 32), -1) << "fenced SEND went out before the READ data";
}

TEST_F(XProc, CompletionOrderIsPostingOrder) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint64_t atom = 3 * kMiB;
  remote->write_u64(0, atom, 100);
  ASSERT_EQ(remote->post_recv(1, {sge(0, 4096)}), 0);
  ASSERT_EQ(remote->post_recv(2, {sge(4096, 4096)}), 0);
  local->fill(0, 0, 65536, 3);
  std::vector<SendSpec> chain = {
      make_rdma(IBV_WR_RDMA_READ, 10, {sge(kMiB, 65536)}, ri.addr + kMiB, ri.rkey),
      make_send(11, {sge(0, 1024)}),
      make_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 12, sge(2 * kMiB, 8), ri.addr + atom, ri.rkey, 5),
      make_rdma(IBV_WR_RDMA_WRITE, 13, {sge(0, 65536)}, ri.addr + 2 * kMiB, ri.rkey),
      make_rdma(IBV_WR_RDMA_READ, 14, {sge(kMiB + 65536, 4096)}, ri.addr + kMiB, ri.rkey),
      make_send(15, {}),
      make_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 16, sge(2 * kMiB + 8, 8), ri.addr + atom, ri.rkey, 105,
                  1)};
  const int opcodes[] = {IBV_WC_RDMA_READ, IBV_WC_SEND, IBV_WC_FETCH_ADD, IBV_WC_RDMA_WRITE,
                         IBV_WC_RDMA_READ, IBV_WC_SEND, IBV_WC_COMP_SWAP};
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, chain.size());
  ASSERT_EQ(s.size(), chain.size());
  for (size_t i = 0; i < chain.size(); ++i)
    EXPECT_TRUE(wc_is(s[i], 10 + i, IBV_WC_SUCCESS, opcodes[i])) << "position " << i;
  EXPECT_EQ(remote->read_u64(0, atom), 1u);
  auto r = remote->poll(CqSel::recv, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].byte_len, 1024u);
  EXPECT_EQ(r[1].byte_len, 0u);
}

// Two QPs of one process, connected over loopback TCP, are as good as two processes.
TEST_F(InProc, SendWriteReadBetweenQpsOfOneProcess) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const PeerInfo bi = b->info();
  const uint32_t len = 65536 + 7;
  a->fill(0, 0, len, 1);
  ASSERT_EQ(b->post_recv(1, {sge(0, kMiB)}), 0);
  ASSERT_EQ(a->post_send(make_send(1, {sge(0, len)})), 0);
  ASSERT_EQ(a->post_send(make_rdma(IBV_WR_RDMA_WRITE, 2, {sge(0, len)}, bi.addr + kMiB, bi.rkey)),
            0);
  b->fill(0, 2 * kMiB, len, 2);
  ASSERT_EQ(
      a->post_send(make_rdma(IBV_WR_RDMA_READ, 3, {sge(kMiB, len)}, bi.addr + 2 * kMiB, bi.rkey)),
      0);
  auto s = a->poll(CqSel::send, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_TRUE(wc_is(s[1], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  EXPECT_TRUE(wc_is(s[2], 3, IBV_WC_SUCCESS, IBV_WC_RDMA_READ));
  auto r = b->poll(CqSel::recv, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(wc_is(r[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(r[0].byte_len, len);
  EXPECT_EQ(b->check(0, 0, len, 1), -1);
  // The READ completed after the WRITE on the same QP: the WRITE is placed by now.
  EXPECT_EQ(b->check(0, kMiB, len, 1), -1);
  EXPECT_EQ(a->check(0, kMiB, len, 2), -1);
}

// A chain long enough to fill a batch's iovec list, of Writes and Sends with immediate, each
// gathered from two pieces: somewhere a batch ends between a message's data and its Immediate
// Data. The next batch sends only the Immediate Data (the data is not framed a second time):
// every receive completes once, with its message's length and immediate.
TEST_F(XProc, WithImmediateMessagesCutByAFullBatchArriveWhole) {
  PeerConfig lc;
  lc.max_send_wr = 256;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  constexpr uint64_t kN = 240;
  local->fill(0, 0, 400, 3);
  std::vector<SendSpec> chain;
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(remote->post_recv(i, {sge(kMiB + i * 512, 512)}), 0);
    const bool send = i % 3 == 2;
    SendSpec w = send ? make_send(i, {sge(0, 100), sge(100, 100)})
                      : make_rdma(IBV_WR_RDMA_WRITE_WITH_IMM, i, {sge(0, 100), sge(100, 100)},
                                  ri.addr + i * 512, ri.rkey);
    if (send) w.opcode = IBV_WR_SEND_WITH_IMM;
    w.imm_or_inv = htonl(static_cast<uint32_t>(1000 + i));
    chain.push_back(w);
  }
  ASSERT_EQ(local->post_send_chain(chain), 0);
  auto s = local->poll(CqSel::send, kN);
  ASSERT_EQ(s.size(), kN);
  for (const auto& wc : s) ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  auto r = remote->poll(CqSel::recv, kN);
  ASSERT_EQ(r.size(), kN);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(wc_is(r[i], i, IBV_WC_SUCCESS)) << wc_str(r[i]);
    EXPECT_EQ(r[i].byte_len, 200u) << i;
    EXPECT_EQ(ntohl(r[i].imm_data), 1000 + i) << i;
  }
  EXPECT_TRUE(remote->poll(CqSel::recv, 1, Ms(100)).empty()) << "a receive completed twice";
  EXPECT_EQ(wait_state(*remote, IBV_QPS_RTS), IBV_QPS_RTS);
}

// Doorbell batching (qp_post_send): a post right after a transmit waits for the next flush
// point. With a 2 s window the batch timer never fires during the test, so what arrives
// shows which call flushed. (The variable is read once, at the first post.)
TEST_F(XProc, BatchedPostsLeaveAtThePollOrArmAndArmedCqsAreNotBatched) {
  setenv("SOFTVERBS_TX_BATCH_US", "2000000", 1);
  // On TCP: a shared-memory set-up's messages, answered from the receive path, are flush
  // points of their own, and would move what this test watches (settings are read once).
  setenv("SOFTVERBS_SHM", "0", 1);
  g_child_env = {"SOFTVERBS_SHM=0"};
  ASSERT_NO_FATAL_FAILURE(Connect());
  for (uint64_t i = 0; i < 9; ++i) ASSERT_EQ(remote->post_recv(i, {sge(i * 64, 64)}), 0);
  ASSERT_EQ(local->post_send(make_send(0, {sge(0, 16)})), 0);
  auto first = remote->poll(CqSel::recv, 1);
  ASSERT_EQ(first.size(), 1u) << "a post after a quiet spell goes at once";
  EXPECT_TRUE(wc_is(first[0], 0, IBV_WC_SUCCESS, IBV_WC_RECV));
  for (uint64_t i = 1; i < 5; ++i) ASSERT_EQ(local->post_send(make_send(i, {sge(i * 64, 16)})), 0);
  // Staying put is the expected outcome: this bound only limits how long we give a wrong
  // early transmit to show up, it never decides a pass by running out.
  EXPECT_TRUE(remote->poll(CqSel::recv, 1, Ms(200)).empty()) << "batched posts left unflushed";
  auto sent = local->poll(CqSel::send, 5);  // the flush point
  ASSERT_EQ(sent.size(), 5u);
  auto rest = remote->poll(CqSel::recv, 4);
  ASSERT_EQ(rest.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(wc_is(rest[i], i + 1, IBV_WC_SUCCESS, IBV_WC_RECV));
  // Arming the send CQ flushes too (the caller is about to block on its channel).
  for (uint64_t i = 5; i < 8; ++i) ASSERT_EQ(local->post_send(make_send(i, {sge(i * 64, 16)})), 0);
  EXPECT_TRUE(remote->poll(CqSel::recv, 1, Ms(200)).empty());
  ASSERT_EQ(ibv_req_notify_cq(local->scq, 0), 0);
  auto armed = remote->poll(CqSel::recv, 3);
  ASSERT_EQ(armed.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(wc_is(armed[i], i + 5, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(local->poll(CqSel::send, 3).size(), 3u);
  // A consumer with an armed CQ is event-driven (it blocks on a channel, or has a completion
  // handler): it may never poll or arm again, so its posts are not batched. Within the window
  // still, this one arrives long before the window's timer could send it.
  ASSERT_EQ(ibv_req_notify_cq(local->scq, 0), 0);
  ASSERT_EQ(local->post_send(make_send(8, {sge(8 * 64, 16)})), 0);
  auto lone = remote->poll(CqSel::recv, 1, Ms(1000));
  ASSERT_EQ(lone.size(), 1u) << "a post to an armed CQ's QP waited for the batch";
  EXPECT_TRUE(wc_is(lone[0], 8, IBV_WC_SUCCESS, IBV_WC_RECV));
  unsetenv("SOFTVERBS_TX_BATCH_US");
  g_child_env.clear();
}

// A post that answers a message the peer sent since the last post is a ping-pong's turn:
// it leaves at once even inside the window. Held back, every turn of a ping-pong faster than
// the window waited for a flush point (8 B SEND latency was 10-12 us instead of 4-6). With a
// 2 s window the answer can only arrive in time if it was sent at the post.
TEST_F(XProc, AnAnswerToThePeerIsNotHeldBackByBatching) {
  setenv("SOFTVERBS_TX_BATCH_US", "2000000", 1);
  // On TCP: a shared-memory set-up's messages, answered from the receive path, are flush
  // points of their own, and would move what this test watches (settings are read once).
  setenv("SOFTVERBS_SHM", "0", 1);
  g_child_env = {"SOFTVERBS_SHM=0"};
  ASSERT_NO_FATAL_FAILURE(Connect());
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(remote->post_recv(i, {sge(i * 64, 64)}), 0);
  ASSERT_EQ(local->post_recv(100, {sge(4096, 64)}), 0);
  ASSERT_EQ(local->post_send(make_send(0, {sge(0, 16)})), 0);  // opens the window
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  // Still inside the window and nothing received since: batched, as before.
  ASSERT_EQ(local->post_send(make_send(1, {sge(64, 16)})), 0);
  EXPECT_TRUE(remote->poll(CqSel::recv, 1, Ms(200)).empty()) << "a streaming post left at once";
  ASSERT_EQ(local->poll(CqSel::send, 1).size(), 1u);  // the flush point
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  // The peer speaks; our next post answers it and goes without any flush point.
  ASSERT_EQ(remote->post_send(make_send(50, {sge(1024, 16)})), 0);
  auto in = local->poll(CqSel::recv, 1);
  ASSERT_EQ(in.size(), 1u);
  EXPECT_TRUE(wc_is(in[0], 100, IBV_WC_SUCCESS, IBV_WC_RECV));
  ASSERT_EQ(local->post_send(make_send(2, {sge(128, 16)})), 0);
  auto answer = remote->poll(CqSel::recv, 1, Ms(1000));
  ASSERT_EQ(answer.size(), 1u) << "the answer waited for the batch";
  EXPECT_TRUE(wc_is(answer[0], 2, IBV_WC_SUCCESS, IBV_WC_RECV));
  EXPECT_EQ(local->poll(CqSel::send, 1).size(), 1u);
  unsetenv("SOFTVERBS_TX_BATCH_US");
  g_child_env.clear();
}

// With the default window a batch leaves on the progress thread's timer when the sender
// neither polls nor arms (it may be waiting on memory for its peer's answer).
TEST_F(XProc, BatchedPostsLeaveOnTheTimerWhenNobodyPolls) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  for (uint64_t i = 0; i < 17; ++i) ASSERT_EQ(remote->post_recv(i, {sge(i * 64, 64)}), 0);
  // A first round trip: the connection is up, so the posts below can be batched.
  ASSERT_EQ(local->post_send(make_send(0, {sge(0, 16)}, 0)), 0);
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  for (uint64_t i = 1; i < 17; ++i)
    ASSERT_EQ(local->post_send(make_send(i, {sge(i * 64, 16)}, 0)), 0);  // unsignaled
  auto got = remote->poll(CqSel::recv, 16);
  ASSERT_EQ(got.size(), 16u) << "a batch waited for a poll that never came";
  for (uint64_t i = 0; i < 16; ++i) EXPECT_TRUE(wc_is(got[i], i + 1, IBV_WC_SUCCESS, IBV_WC_RECV));
}

}  // namespace
}  // namespace mp
