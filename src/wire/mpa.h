// MPA connection set-up frames: RFC 5044 §7.1 (Request/Reply) with the RFC 6581 enhanced
// connection establishment word (IRD/ORD, peer-to-peer RTR) at the start of private data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace sv::wire {

inline constexpr size_t kMpaHeaderLen = 20;  // key(16) + flags + rev + pd_length(2)
inline constexpr size_t kMpaRfcMaxPrivData = 512;
// Linux siw refuses pd_length > 256 (RDMA_MAX_PRIVATE_DATA); we never send more.
inline constexpr size_t kMpaSiwMaxPrivData = 256;
inline constexpr size_t kMpaV2WordLen = 4;
inline constexpr uint16_t kMpaIrdOrdMask = 0x3FFF;

// Byte 16 flag bits (RFC 5044 §7.1; E from RFC 6581 §5).
inline constexpr uint8_t kMpaFlagMarkers = 0x80;
inline constexpr uint8_t kMpaFlagCrc = 0x40;
inline constexpr uint8_t kMpaFlagReject = 0x20;
inline constexpr uint8_t kMpaFlagEnhanced = 0x10;
// softverbs capability bits in the reserved nibble. siw ignores Res (try_gso is const false)
// but copies the request's flags into its reply, so the two directions use different bits:
// a reply carries kMpaResSvReply only if its sender really is softverbs.
inline constexpr uint8_t kMpaResSvRequest = 0x01;
inline constexpr uint8_t kMpaResSvReply = 0x02;
// SOFTVERBS_IB_COMPLETION=1: "complete my Sends and Writes the IB way: ack what you place"
// (wire::RdmapOpcode::sv_ack), asked for in each direction, again on separate bits.
inline constexpr uint8_t kMpaResAckRequest = 0x04;
inline constexpr uint8_t kMpaResAckReply = 0x08;

enum class MpaKind : uint8_t { request, reply };

// RFC 6581 §5 enhanced word. IRD word: A=peer-to-peer, B=zero-length SEND RTR;
// ORD word: C=zero-length WRITE RTR, D=zero-length READ RTR.
struct MpaV2Word {
  bool p2p = false;
  bool rtr_send = false;
  bool rtr_write = false;
  bool rtr_read = false;
  uint16_t ird = 0;
  uint16_t ord = 0;
};

struct MpaFrame {
  MpaKind kind = MpaKind::request;
  bool markers = false;
  bool crc = false;
  bool reject = false;
  bool enhanced = false;
  uint8_t res = 0;  // reserved nibble, as received
  uint8_t rev = 2;
  MpaV2Word v2;  // valid when rev == 2 && enhanced
  // ULP private data (after the v2 word when present). Decoding points into the input.
  std::span<const std::byte> ulp_pdata;
};

enum class MpaError : uint8_t {
  ok,
  need_more,       // fewer bytes than the frame needs
  bad_key,         // neither "MPA ID Req Frame" nor "MPA ID Rep Frame", or not the expected one
  bad_revision,    // rev > 2
  pdata_too_long,  // pd_length beyond kMpaRfcMaxPrivData or the caller's limit
  v2_word_missing  // rev 2 with E set but pd_length < 4
};

const char* to_string(MpaError e) noexcept;

// Total frame length (20 + pd_length) from at least kMpaHeaderLen bytes, or 0 if fewer.
size_t mpa_frame_len(std::span<const std::byte> in) noexcept;

// Decodes one frame that must be of kind `expect`. `in` must hold exactly the frame
// (mpa_frame_len bytes) or more; extra bytes are not looked at.
[[nodiscard]] MpaError mpa_decode(std::span<const std::byte> in, MpaKind expect, size_t max_pdata,
                                  MpaFrame& out) noexcept;

// Bytes mpa_encode will write.
size_t mpa_encoded_len(const MpaFrame& f) noexcept;
// Encodes into out (must be at least mpa_encoded_len); returns bytes written or 0.
size_t mpa_encode(const MpaFrame& f, std::span<std::byte> out) noexcept;

}  // namespace sv::wire
