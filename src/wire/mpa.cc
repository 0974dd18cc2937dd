#include "wire/mpa.h"

#include <cstring>

#include "wire/be.h"

namespace sv::wire {
namespace {

constexpr char kReqKey[] = "MPA ID Req Frame";
constexpr char kRepKey[] = "MPA ID Rep Frame";
constexpr uint16_t kV2HighBit = 0x8000;  // A in the IRD word, C in the ORD word
constexpr uint16_t kV2LowBit = 0x4000;   // B in the IRD word, D in the ORD word

bool v2_present(const MpaFrame& f) {
  return f.rev == 2 && f.enhanced;
}

}  // namespace

const char* to_string(MpaError e) noexcept {
  switch (e) {
    case MpaError::ok:
      return "ok";
    case MpaError::need_more:
      return "incomplete MPA frame";
    case MpaError::bad_key:
      return "bad MPA key";
    case MpaError::bad_revision:
      return "unsupported MPA revision";
    case MpaError::pdata_too_long:
      return "MPA private data too long";
    case MpaError::v2_word_missing:
      return "MPA v2 IRD/ORD word missing";
  }
  return "?";
}

size_t mpa_frame_len(std::span<const std::byte> in) noexcept {
  if (in.size() < kMpaHeaderLen) return 0;
  return kMpaHeaderLen + load_be16(in.data() + 18);
}

MpaError mpa_decode(std::span<const std::byte> in, MpaKind expect, size_t max_pdata,
                    MpaFrame& out) noexcept {
  if (in.size() < kMpaHeaderLen) return MpaError::need_more;
  const char* key = expect == MpaKind::request ? kReqKey : kRepKey;
  if (std::memcmp(in.data(), key, 16) != 0) return MpaError::bad_key;
  const auto flags = static_cast<uint8_t>(in[16]);
  out = MpaFrame{};
  out.kind = expect;
  out.markers = flags & kMpaFlagMarkers;
  out.crc = flags & kMpaFlagCrc;
  out.reject = flags & kMpaFlagReject;
  out.enhanced = flags & kMpaFlagEnhanced;
  out.res = flags & 0x0F;
  out.rev = static_cast<uint8_t>(in[17]);
  if (out.rev > 2) return MpaError::bad_revision;
  const size_t pd_len = load_be16(in.data() + 18);
  if (pd_len > kMpaRfcMaxPrivData || pd_len > max_pdata) return MpaError::pdata_too_long;
  if (in.size() < kMpaHeaderLen + pd_len) return MpaError::need_more;
  auto pd = in.subspan(kMpaHeaderLen, pd_len);
  if (v2_present(out)) {
    if (pd_len < kMpaV2WordLen) return MpaError::v2_word_missing;
    const uint16_t ird = load_be16(pd.data());
    const uint16_t ord = load_be16(pd.data() + 2);
    out.v2.p2p = ird & kV2HighBit;
    out.v2.rtr_send = ird & kV2LowBit;
    out.v2.rtr_write = ord & kV2HighBit;
    out.v2.rtr_read = ord & kV2LowBit;
    out.v2.ird = ird & kMpaIrdOrdMask;
    out.v2.ord = ord & kMpaIrdOrdMask;
    pd = pd.subspan(kMpaV2WordLen);
  }
  out.ulp_pdata = pd;
  return MpaError::ok;
}

size_t mpa_encoded_len(const MpaFrame& f) noexcept {
  return kMpaHeaderLen + (v2_present(f) ? kMpaV2WordLen : 0) + f.ulp_pdata.size();
}

size_t mpa_encode(const MpaFrame& f, std::span<std::byte> out) noexcept {
  const size_t len = mpa_encoded_len(f);
  if (out.size() < len || len - kMpaHeaderLen > kMpaRfcMaxPrivData) return 0;
  std::memcpy(out.data(), f.kind == MpaKind::request ? kReqKey : kRepKey, 16);
  uint8_t flags = f.res & 0x0F;
  if (f.markers) flags |= kMpaFlagMarkers;
  if (f.crc) flags |= kMpaFlagCrc;
  if (f.reject) flags |= kMpaFlagReject;
  if (f.enhanced) flags |= kMpaFlagEnhanced;
  out[16] = std::byte{flags};
  out[17] = std::byte{f.rev};
  store_be16(out.data() + 18, static_cast<uint16_t>(len - kMpaHeaderLen));
  std::byte* p = out.data() + kMpaHeaderLen;
  if (v2_present(f)) {
    uint16_t ird = f.v2.ird & kMpaIrdOrdMask;
    uint16_t ord = f.v2.ord & kMpaIrdOrdMask;
    if (f.v2.p2p) ird |= kV2HighBit;
    if (f.v2.rtr_send) ird |= kV2LowBit;
    if (f.v2.rtr_write) ord |= kV2HighBit;
    if (f.v2.rtr_read) ord |= kV2LowBit;
    store_be16(p, ird);
    store_be16(p + 2, ord);
    p += kMpaV2WordLen;
  }
  if (!f.ulp_pdata.empty()) std::memcpy(p, f.ulp_pdata.data(), f.ulp_pdata.size());
  return len;
}

}  // namespace sv::wire
