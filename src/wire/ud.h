// Unreliable Datagram messages between softverbs peers, one per UDP datagram.
//
// The UDP payload is what RoCEv2 (IBA Annex A17) puts after its UDP header: a Base Transport
// Header (IBA 9.2), a Datagram Extended Transport Header (9.3.2) and, for SEND Only with
// Immediate, the ImmDt (9.3.3), then the payload. Two departures from RoCEv2, both because
// the peer is a user-space process rather than a port: the UDP destination port is the
// destination QP's own (QPN = port << 8 | 0xFF, engine/qp_ud.cc) instead of 4791, and there
// is no ICRC (UDP's checksum covers the datagram; no switch rewrites it).
//
// The receiver sees a 40-byte GRH before the payload (IBA 11.4.1.1). As rxe does for
// RoCEv2, it holds the IPv6 header, or for IPv4 twenty zero bytes then the IPv4 header, so
// ibv_init_ah_from_wc (and rdma-core's header-version test) reads it as on any RoCE device.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sv::wire {

inline constexpr size_t kBthLen = 12;
inline constexpr size_t kDethLen = 8;
inline constexpr size_t kImmDtLen = 4;
inline constexpr size_t kUdMaxHdrLen = kBthLen + kDethLen + kImmDtLen;
inline constexpr size_t kGrhLen = 40;

// BTH OpCode (IBA Table 38): transport UD (011b), SEND Only [with Immediate].
inline constexpr uint8_t kUdSendOnly = 0x64;
inline constexpr uint8_t kUdSendOnlyImm = 0x65;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;

struct UdHeader {
  bool solicited = false;  // BTH SE
  bool has_imm = false;    // opcode SEND Only with Immediate
  uint16_t pkey = kDefaultPkey;
  uint32_t dest_qp = 0;  // 24 bits
  uint32_t psn = 0;      // 24 bits
  uint32_t qkey = 0;     // DETH
  uint32_t src_qp = 0;   // 24 bits
  uint32_t imm_be = 0;   // ImmDt as it sits in memory (ibv_wc.imm_data is big-endian)
  uint8_t pad = 0;       // BTH PadCnt: bytes after the payload to drop
};

enum class UdError : uint8_t {
  ok,
  short_datagram,  // shorter than its headers (and pad)
  bad_version,     // BTH TVer is not 0
  bad_opcode,      // not a UD SEND Only [with Immediate]
};
const char* to_string(UdError e);

// Writes BTH+DETH(+ImmDt) to out (kUdMaxHdrLen bytes of room); returns the length written.
size_t encode_ud_header(const UdHeader& h, std::byte* out);
// Parses a datagram's headers. On ok, *hdr_len is where the payload starts and *payload_len
// its length (pad removed).
UdError decode_ud_header(const std::byte* p, size_t n, UdHeader& h, size_t* hdr_len,
                         size_t* payload_len);

// A GRH as rdma-core reads it back: addresses as GIDs (IPv4 as ::ffff:a.b.c.d).
struct Grh {
  uint8_t sgid[16] = {};
  uint8_t dgid[16] = {};
  uint8_t traffic_class = 0;
  uint32_t flow_label = 0;
  uint8_t hop_limit = 0;
  int ip_version = 0;  // 4 or 6
};

// True if the GID is IPv4-mapped (::ffff:a.b.c.d).
bool gid_is_v4(const uint8_t gid[16]);
// Writes the 40-byte GRH of a UD message that carried `payload_len` bytes from sgid to dgid.
// Both IPv4-mapped: the IPv4 header (with checksum) at offset 20; otherwise an IPv6 header.
void encode_grh(const Grh& g, uint32_t payload_len, std::byte out[kGrhLen]);
// Reads a GRH written by encode_grh or by a RoCE device; false if it is neither an IPv6
// header nor (at offset 20) an IPv4 header with a valid checksum.
bool decode_grh(const std::byte in[kGrhLen], Grh& g);

// ---- rdma_cm over UD (RDMA_PS_UDP): service ID resolution ------------------------------
// IB's SIDR REQ/REP (IBA 12.11) carried in a UDP datagram to the listener's port: the
// request names nothing but private data; the reply carries the QPN and Q_Key to send to.
// Layout: "SVSI" | version | kind | status | pdata_len | req_id | qpn | qkey | pdata.
inline constexpr size_t kSidrHdrLen = 20;
inline constexpr uint8_t kSidrVersion = 1;
inline constexpr size_t kSidrReqMaxPrivData = 180;  // IBA SIDR REQ 216 - rdma_cm's 36
inline constexpr size_t kSidrRepMaxPrivData = 136;  // IBA SIDR REP private data
enum class SidrKind : uint8_t { req = 1, rep = 2 };
// SIDR REP status (IBA Table 124): what the kernel reports as UNREACHABLE's status.
inline constexpr uint8_t kSidrSuccess = 0, kSidrUnsupported = 1, kSidrReject = 2;

struct Sidr {
  SidrKind kind = SidrKind::req;
  uint8_t status = kSidrSuccess;
  uint32_t req_id = 0;
  uint32_t qpn = 0;
  uint32_t qkey = 0;
  const std::byte* pdata = nullptr;  // into the decoded buffer
  uint8_t pdata_len = 0;
};
// Writes the message (kSidrHdrLen + pdata_len bytes, pdata_len within its kind's limit).
size_t encode_sidr(const Sidr& m, std::byte* out);
// False unless a whole, well-formed message of a known kind and version.
bool decode_sidr(const std::byte* p, size_t n, Sidr& m);

}  // namespace sv::wire
