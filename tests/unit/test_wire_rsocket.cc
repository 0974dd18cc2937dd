// rsocket wire codec (src/wire/rsocket_wire.h) against the layout rdma-core's rsocket.c puts
// on the wire (docs/rsockets-protocol.md §1.1, §2.1), and the receive ledger's bounds.
#include <gtest/gtest.h>

#include <vector>

#include "wire/rsocket_wire.h"

namespace rs = sv::wire::rs;

TEST(RsocketWire, ConnDataLayoutIsRdmaCoresBigEndianForty) {
  rs::ConnData c;
  c.credits = 384;
  c.target_iomap_size = rs::iomap_value_to_scale(1);
  c.target_sgl = {0x0102030405060708ull, 0x11223344, 2};
  c.data_buf = {0x8877665544332211ull, 0xaabbccdd, 65536};
  std::byte b[rs::kConnDataLen];
  rs::encode_conn_data(c, b);
  const std::vector<uint8_t> want = {
      1,    2,    0x01, 0x80, 0,    0,    0,    1,     // version, flags (IOMAP), credits, iomap
      1,    2,    3,    4,    5,    6,    7,    8,     // target_sgl.addr
      0x11, 0x22, 0x33, 0x44, 0,    0,    0,    2,     // key, length (entries)
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // data_buf.addr
      0xaa, 0xbb, 0xcc, 0xdd, 0,    1,    0,    0};    // key, length (bytes)
  ASSERT_EQ(want.size(), rs::kConnDataLen);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(uint8_t(b[i]), want[i]) << "byte " << i;
  auto d = rs::decode_conn_data(b, sizeof b);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->credits, 384);
  EXPECT_EQ(d->target_sgl.addr, c.target_sgl.addr);
  EXPECT_EQ(d->data_buf.length, 65536u);
  EXPECT_EQ(rs::iomap_scale_to_value(d->target_iomap_size), 1u);
}

TEST(RsocketWire, ConnDataThatIsNotAVersion1RsocketIsRefused) {
  rs::ConnData c;
  c.credits = 16;
  c.target_sgl = {1, 1, 2};
  c.data_buf = {1, 1, 4096};
  std::byte b[rs::kConnDataLen];
  rs::encode_conn_data(c, b);
  EXPECT_TRUE(rs::decode_conn_data(b, sizeof b));
  EXPECT_FALSE(rs::decode_conn_data(b, sizeof b - 1));  // short
  EXPECT_FALSE(rs::decode_conn_data(nullptr, 40));
  auto bad = [&](size_t off, uint8_t v) {
    std::byte x[rs::kConnDataLen];
    std::memcpy(x, b, sizeof x);
    x[off] = std::byte(v);
    return !rs::decode_conn_data(x, sizeof x);
  };
  EXPECT_TRUE(bad(0, 2));     // version
  EXPECT_TRUE(bad(1, 0x03));  // a big-endian peer
  EXPECT_TRUE(bad(23, 3));    // three SGL entries
  EXPECT_TRUE(bad(3, 0));     // no credits (credits 16 -> 0)
  std::byte z[rs::kConnDataLen];
  std::memcpy(z, b, sizeof z);
  std::memset(z + 36, 0, 4);  // nothing granted
  EXPECT_FALSE(rs::decode_conn_data(z, sizeof z));
}

TEST(RsocketWire, MessageWordAndIomapScale) {
  EXPECT_EQ(rs::msg(rs::Op::sgl, 400), 0x80000190u);
  EXPECT_EQ(rs::msg(rs::Op::ctrl, uint32_t(rs::Ctrl::shutdown)), 0xe0000002u);
  EXPECT_EQ(rs::msg_op(0xc0000005u), rs::Op::iomap_sgl);
  EXPECT_EQ(rs::msg_data(0xffffffffu), rs::kMsgDataMask);
  EXPECT_EQ(rs::iomap_value_to_scale(128), 0x80);
  EXPECT_EQ(rs::iomap_scale_to_value(0x80), 128u);
  EXPECT_EQ(rs::iomap_value_to_scale(512), 0x82);
  EXPECT_EQ(rs::iomap_scale_to_value(0x82), 512u);
  EXPECT_EQ(rs::iomap_scale_to_value(rs::iomap_value_to_scale(300)), 256u);  // rounded down
}

TEST(RsocketWire, LedgerFollowsTheTwoHalfRing) {
  rs::RecvLedger l;
  l.reset(1024, 8);
  EXPECT_TRUE(l.can_grant());  // the second half is free at once
  EXPECT_EQ(l.grant(), 512u);
  EXPECT_FALSE(l.can_grant());
  EXPECT_TRUE(l.on_data(500));
  EXPECT_TRUE(l.on_data(12));  // first half full
  EXPECT_TRUE(l.on_data(512));
  EXPECT_FALSE(l.on_data(1));  // nothing granted is left
  EXPECT_EQ(l.queued_bytes(), 1024u);
  l.consume(512, 2);
  EXPECT_EQ(l.read_offset(), 512u);
  ASSERT_TRUE(l.can_grant());
  EXPECT_EQ(l.grant(), 0u);
  EXPECT_TRUE(l.on_data(512));  // wraps to offset 0
}

TEST(RsocketWire, LedgerRefusesWhatAPeerWasNotGranted) {
  rs::RecvLedger l;
  l.reset(1024, 2);
  EXPECT_FALSE(l.on_data(513));  // beyond the first grant
  (void)l.grant();
  EXPECT_TRUE(l.on_data(1000));
  EXPECT_FALSE(l.on_data(100));  // would cross the ring's end
  EXPECT_TRUE(l.on_data(24));
  EXPECT_FALSE(l.on_data(0) && l.on_data(1));  // a third queued message is refused
  EXPECT_EQ(l.queued_msgs(), 2u);
}
