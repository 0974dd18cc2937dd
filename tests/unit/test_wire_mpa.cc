// MPA Request/Reply frames (RFC 5044 §7.1, RFC 6581 §5) against the frames captured from
// Linux siw in iwarp-wire.md §1.6, plus every MpaError path.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "hex.h"
#include "wire/mpa.h"

namespace sv::wire {
namespace {

using test::Bytes;
using test::cat;
using test::hex;
using test::to_hex;

const Bytes kReqKey = hex("4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65");  // "MPA ID Req Frame"
const Bytes kRepKey = hex("4d 50 41 20 49 44 20 52 65 70 20 46 72 61 6d 65");  // "MPA ID Rep Frame"

struct Golden {
  const char* name;
  Bytes wire;
  MpaFrame expect;  // ulp_pdata left empty: none of the captured frames carries ULP data
};

MpaFrame frame(MpaKind kind, uint8_t rev, bool markers, bool crc, bool reject, bool enhanced,
               MpaV2Word v2 = {}) {
  MpaFrame f;
  f.kind = kind;
  f.rev = rev;
  f.markers = markers;
  f.crc = crc;
  f.reject = reject;
  f.enhanced = enhanced;
  f.v2 = v2;
  return f;
}

MpaV2Word v2(bool p2p, bool rtr_send, bool rtr_write, bool rtr_read, uint16_t ird, uint16_t ord) {
  return MpaV2Word{p2p, rtr_send, rtr_write, rtr_read, ird, ord};
}

// iwarp-wire.md §1.6, byte for byte.
std::vector<Golden> golden_frames() {
  using K = MpaKind;
  return {
      {"siw request v2 IRD=1 ORD=1", cat({kReqKey, hex("10 02 00 04 00 01 00 01")}),
       frame(K::request, 2, false, false, false, true, v2(false, false, false, false, 1, 1))},
      {"siw reply v2 echo", cat({kRepKey, hex("10 02 00 04 00 01 00 01")}),
       frame(K::reply, 2, false, false, false, true, v2(false, false, false, false, 1, 1))},
      {"siw reply when initiator set C", cat({kRepKey, hex("50 02 00 04 00 01 00 01")}),
       frame(K::reply, 2, false, true, false, true, v2(false, false, false, false, 1, 1))},
      {"siw reply to v1 request", cat({kRepKey, hex("00 01 00 00")}),
       frame(K::reply, 1, false, false, false, false)},
      {"siw reply P2P + WRITE RTR", cat({kRepKey, hex("10 02 00 04 80 01 80 01")}),
       frame(K::reply, 2, false, false, false, true, v2(true, false, true, false, 1, 1))},
      {"siw reply P2P + READ RTR", cat({kRepKey, hex("10 02 00 04 80 01 40 01")}),
       frame(K::reply, 2, false, false, false, true, v2(true, false, false, true, 1, 1))},
      {"siw reject (request had M=1)", cat({kRepKey, hex("30 02 00 04 00 00 00 00")}),
       frame(K::reply, 2, false, false, true, true, v2(false, false, false, false, 0, 0))},
  };
}

void expect_same(const MpaFrame& got, const MpaFrame& want, const std::string& ctx) {
  EXPECT_EQ(got.kind, want.kind) << ctx;
  EXPECT_EQ(got.markers, want.markers) << ctx;
  EXPECT_EQ(got.crc, want.crc) << ctx;
  EXPECT_EQ(got.reject, want.reject) << ctx;
  EXPECT_EQ(got.enhanced, want.enhanced) << ctx;
  EXPECT_EQ(got.res, want.res) << ctx;
  EXPECT_EQ(got.rev, want.rev) << ctx;
  EXPECT_EQ(got.v2.p2p, want.v2.p2p) << ctx;
  EXPECT_EQ(got.v2.rtr_send, want.v2.rtr_send) << ctx;
  EXPECT_EQ(got.v2.rtr_write, want.v2.rtr_write) << ctx;
  EXPECT_EQ(got.v2.rtr_read, want.v2.rtr_read) << ctx;
  EXPECT_EQ(got.v2.ird, want.v2.ird) << ctx;
  EXPECT_EQ(got.v2.ord, want.v2.ord) << ctx;
  EXPECT_EQ(to_hex(got.ulp_pdata), to_hex(want.ulp_pdata)) << ctx;
}

Bytes encode(const MpaFrame& f) {
  Bytes out(mpa_encoded_len(f), std::byte{0xEE});
  const size_t n = mpa_encode(f, out);
  EXPECT_EQ(n, out.size());
  out.resize(n);
  return out;
}

TEST(Mpa, Rfc6581GoldenSiwFramesDecode) {
  for (const auto& g : golden_frames()) {
    MpaFrame f;
    f.res = 0x0F;  // decode must overwrite every field, not leave stale values
    f.v2.ird = 0x1234;
    ASSERT_EQ(mpa_decode(g.wire, g.expect.kind, kMpaSiwMaxPrivData, f), MpaError::ok) << g.name;
    expect_same(f, g.expect, g.name);
    EXPECT_EQ(mpa_frame_len(g.wire), g.wire.size()) << g.name;
  }
}

TEST(Mpa, Rfc6581GoldenSiwFramesEncodeByteExact) {
  for (const auto& g : golden_frames()) {
    // From the expected fields (independent of the decoder)...
    EXPECT_EQ(mpa_encoded_len(g.expect), g.wire.size()) << g.name;
    EXPECT_EQ(to_hex(encode(g.expect)), to_hex(g.wire)) << g.name;
    // ...and from what the decoder produced.
    MpaFrame f;
    ASSERT_EQ(mpa_decode(g.wire, g.expect.kind, kMpaRfcMaxPrivData, f), MpaError::ok) << g.name;
    EXPECT_EQ(to_hex(encode(f)), to_hex(g.wire)) << g.name;
  }
}

TEST(Mpa, Rfc6581UlpPrivateDataFollowsV2Word) {
  const Bytes wire = cat({kReqKey, hex("50 02 00 09 80 10 40 20"), hex("68 65 6c 6c 6f")});
  MpaFrame f;
  ASSERT_EQ(mpa_decode(wire, MpaKind::request, 256, f), MpaError::ok);
  EXPECT_TRUE(f.crc);
  EXPECT_TRUE(f.enhanced);
  EXPECT_TRUE(f.v2.p2p);
  EXPECT_FALSE(f.v2.rtr_send);
  EXPECT_FALSE(f.v2.rtr_write);
  EXPECT_TRUE(f.v2.rtr_read);
  EXPECT_EQ(f.v2.ird, 0x10);
  EXPECT_EQ(f.v2.ord, 0x20);
  ASSERT_EQ(f.ulp_pdata.size(), 5u);
  EXPECT_EQ(f.ulp_pdata.data(), wire.data() + 24);  // points into the input, no copy
  EXPECT_EQ(to_hex(encode(f)), to_hex(wire));
}

TEST(Mpa, Rfc6581IrdOrdAre14BitsAndAllFlagBitsRoundTrip) {
  MpaFrame f = frame(MpaKind::reply, 2, false, false, false, true,
                     v2(true, true, true, true, 0x3FFF, 0x2AAA));
  const Bytes wire = encode(f);
  EXPECT_EQ(to_hex(wire), to_hex(cat({kRepKey, hex("10 02 00 04 ff ff ea aa")})));
  MpaFrame d;
  ASSERT_EQ(mpa_decode(wire, MpaKind::reply, 256, d), MpaError::ok);
  expect_same(d, f, "all v2 bits");

  // Values wider than 14 bits are masked on encode, never bleed into the flag bits.
  f.v2 = v2(false, false, false, false, 0xC001, 0x4002);
  EXPECT_EQ(to_hex(encode(f)), to_hex(cat({kRepKey, hex("10 02 00 04 00 01 00 02")})));
}

TEST(Mpa, Rfc5044Sec7_1V1PrivateDataHasNoV2Word) {
  // Rev 1 (and rev 2 without E): all private data is ULP data, even if E is set on rev 1.
  for (const char* hdr : {"00 01 00 04", "10 01 00 04", "00 02 00 04"}) {
    const Bytes wire = cat({kRepKey, hex(hdr), hex("00 01 00 01")});
    MpaFrame f;
    ASSERT_EQ(mpa_decode(wire, MpaKind::reply, 256, f), MpaError::ok) << hdr;
    EXPECT_EQ(to_hex(f.ulp_pdata), "00 01 00 01") << hdr;
    EXPECT_EQ(f.v2.ird, 0) << hdr;
    EXPECT_EQ(f.v2.ord, 0) << hdr;
    EXPECT_EQ(to_hex(encode(f)), to_hex(wire)) << hdr;
  }
}

TEST(Mpa, Rfc5044Sec7_1ReservedFlagBitsAreKeptAsReceived) {
  const Bytes wire = cat({kReqKey, hex("1b 02 00 04 00 01 00 01")});
  MpaFrame f;
  ASSERT_EQ(mpa_decode(wire, MpaKind::request, 256, f), MpaError::ok);
  EXPECT_EQ(f.res, 0x0B);
  EXPECT_TRUE(f.enhanced);
  EXPECT_FALSE(f.markers);
  EXPECT_EQ(to_hex(encode(f)), to_hex(wire));
}

TEST(Mpa, TrailingBytesAfterTheFrameAreNotLookedAt) {
  // A reply followed immediately by the first FPDU (the siw trap of iwarp-wire.md §0.4).
  const Bytes wire = cat({kRepKey, hex("10 02 00 04 00 01 00 01"), hex("00 0e c1 40 00 00 00 01")});
  MpaFrame f;
  ASSERT_EQ(mpa_decode(wire, MpaKind::reply, 256, f), MpaError::ok);
  EXPECT_TRUE(f.ulp_pdata.empty());
  EXPECT_EQ(mpa_frame_len(wire), 24u);
}

TEST(Mpa, Rfc5044Sec7_1BadKey) {
  for (size_t i = 0; i < 16; ++i) {
    Bytes wire = cat({kReqKey, hex("10 02 00 04 00 01 00 01")});
    wire[i] ^= std::byte{0x20};
    MpaFrame f;
    EXPECT_EQ(mpa_decode(wire, MpaKind::request, 256, f), MpaError::bad_key) << "byte " << i;
  }
}

TEST(Mpa, Rfc5044Sec7_1RequestDecodedAsReplyIsBadKey) {
  const auto g = golden_frames();
  MpaFrame f;
  EXPECT_EQ(mpa_decode(g[0].wire, MpaKind::reply, 256, f), MpaError::bad_key);
  EXPECT_EQ(mpa_decode(g[1].wire, MpaKind::request, 256, f), MpaError::bad_key);
}

TEST(Mpa, Rfc6581Rev3IsBadRevision) {
  MpaFrame f;
  EXPECT_EQ(mpa_decode(cat({kReqKey, hex("10 03 00 04 00 01 00 01")}), MpaKind::request, 256, f),
            MpaError::bad_revision);
  EXPECT_EQ(mpa_decode(cat({kRepKey, hex("00 ff 00 00")}), MpaKind::reply, 256, f),
            MpaError::bad_revision);
  // Rev 0 (pre-standard draft) is not refused by the codec; policy is the caller's.
  EXPECT_EQ(mpa_decode(cat({kRepKey, hex("00 00 00 00")}), MpaKind::reply, 256, f), MpaError::ok);
  EXPECT_EQ(f.rev, 0);
}

TEST(Mpa, Rfc5044Sec7_1PdLength513IsTooLongEvenIfCallerAllowsMore) {
  const Bytes wire = cat({kReqKey, hex("00 01 02 01"), Bytes(513)});
  MpaFrame f;
  EXPECT_EQ(mpa_decode(wire, MpaKind::request, 4096, f), MpaError::pdata_too_long);
  // Refused from the header alone, before waiting for 513 bytes that may never come.
  EXPECT_EQ(mpa_decode(std::span(wire).first(20), MpaKind::request, 4096, f),
            MpaError::pdata_too_long);
  // 512 is the RFC maximum and is fine.
  const Bytes ok = cat({kReqKey, hex("00 01 02 00"), Bytes(512)});
  ASSERT_EQ(mpa_decode(ok, MpaKind::request, 4096, f), MpaError::ok);
  EXPECT_EQ(f.ulp_pdata.size(), 512u);
}

TEST(Mpa, PdLengthOverCallerLimit256IsTooLong) {
  MpaFrame f;
  const Bytes over = cat({kRepKey, hex("10 02 01 01"), hex("00 01 00 01"), Bytes(253)});
  EXPECT_EQ(mpa_decode(over, MpaKind::reply, kMpaSiwMaxPrivData, f), MpaError::pdata_too_long);
  EXPECT_EQ(mpa_decode(over, MpaKind::reply, kMpaRfcMaxPrivData, f), MpaError::ok);
  const Bytes at = cat({kRepKey, hex("10 02 01 00"), hex("00 01 00 01"), Bytes(252)});
  ASSERT_EQ(mpa_decode(at, MpaKind::reply, kMpaSiwMaxPrivData, f), MpaError::ok);
  EXPECT_EQ(f.ulp_pdata.size(), 252u);
}

TEST(Mpa, Rfc6581EnhancedWithPdLength2IsV2WordMissing) {
  MpaFrame f;
  EXPECT_EQ(mpa_decode(cat({kReqKey, hex("10 02 00 02 00 01")}), MpaKind::request, 256, f),
            MpaError::v2_word_missing);
  EXPECT_EQ(mpa_decode(cat({kReqKey, hex("10 02 00 00")}), MpaKind::request, 256, f),
            MpaError::v2_word_missing);
  EXPECT_EQ(mpa_decode(cat({kReqKey, hex("10 02 00 03 00 01 00")}), MpaKind::request, 256, f),
            MpaError::v2_word_missing);
}

TEST(Mpa, TruncatedInputIsNeedMore) {
  for (const auto& g : golden_frames()) {
    for (size_t n = 0; n < g.wire.size(); ++n) {
      MpaFrame f;
      EXPECT_EQ(mpa_decode(std::span(g.wire).first(n), g.expect.kind, 256, f), MpaError::need_more)
          << g.name << " prefix " << n;
    }
  }
  // Header complete, private data short by one byte.
  const Bytes wire = cat({kReqKey, hex("10 02 00 09 00 01 00 01 61 62 63 64")});
  MpaFrame f;
  EXPECT_EQ(mpa_decode(wire, MpaKind::request, 256, f), MpaError::need_more);
}

TEST(Mpa, FrameLen) {
  const auto g = golden_frames();
  EXPECT_EQ(mpa_frame_len(g[0].wire), 24u);
  EXPECT_EQ(mpa_frame_len(g[3].wire), 20u);
  for (size_t n = 0; n < kMpaHeaderLen; ++n)
    EXPECT_EQ(mpa_frame_len(std::span(g[0].wire).first(n)), 0u) << n;
  EXPECT_EQ(mpa_frame_len(std::span(g[0].wire).first(20)), 24u);  // header is enough
  // Taken from the header as is: limits are mpa_decode's business.
  EXPECT_EQ(mpa_frame_len(cat({kReqKey, hex("00 01 02 01")})), 20u + 513u);
  EXPECT_EQ(mpa_frame_len(cat({kReqKey, hex("00 01 ff ff")})), 20u + 65535u);
}

TEST(Mpa, EncodeRefusesShortBufferAndOversizedPrivateData) {
  const auto g = golden_frames();
  Bytes out(g[0].wire.size() - 1);
  EXPECT_EQ(mpa_encode(g[0].expect, out), 0u);

  const Bytes big(509);  // 4 (v2 word) + 509 = 513 > 512
  MpaFrame f = g[0].expect;
  f.ulp_pdata = big;
  Bytes buf(mpa_encoded_len(f));
  EXPECT_EQ(buf.size(), 20u + 513u);
  EXPECT_EQ(mpa_encode(f, buf), 0u);

  f.ulp_pdata = std::span(big).first(508);  // exactly 512
  buf.assign(mpa_encoded_len(f), std::byte{0});
  ASSERT_EQ(mpa_encode(f, buf), 20u + 512u);
  EXPECT_EQ(to_hex(std::span(buf).subspan(16, 8)), "10 02 02 00 00 01 00 01");
}

TEST(Mpa, ErrorNamesAreDistinct) {
  std::set<std::string> names;
  for (auto e : {MpaError::ok, MpaError::need_more, MpaError::bad_key, MpaError::bad_revision,
                 MpaError::pdata_too_long, MpaError::v2_word_missing}) {
    ASSERT_NE(to_string(e), nullptr);
    EXPECT_STRNE(to_string(e), "?");
    names.insert(to_string(e));
  }
  EXPECT_EQ(names.size(), 6u);
}

}  // namespace
}  // namespace sv::wire
