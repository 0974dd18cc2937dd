// The software device: one "softverbs0" per process, its attributes and GID table.
// Persona (verbs-abi.md §3.7): node CA, transport IB, Ethernet link layer like rxe, vendor
// 0xFFFFFF / part 0 like rxe (non-zero for rdma-core's tests; unknown to perftest, so it stays
// on its generic path); GIDs are IPv4-mapped host addresses so a GID names
// an IP address that peers can connect to.
#pragma once
#include <infiniband/verbs.h>

#include <mutex>
#include <vector>

#include "transport/tcp.h"

namespace sv::engine {

inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = 16;
inline constexpr int kMaxSgeRd = 16;
inline constexpr int kMaxCqe = 4 * 1024 * 1024;
inline constexpr int kMaxInline = 256;
inline constexpr int kMaxRdAtom = 128;  // same as siw
inline constexpr int kMaxMr = 65535;
inline constexpr int kMaxQp = 256 * 254;  // QPNs: 256 out-of-band listeners x 254 (iw_cm.cc)
inline constexpr int kMaxSrqWr = 16384;
inline constexpr uint32_t kMaxMsgSize = 1u << 31;
inline constexpr uint16_t kPkey = 0xFFFF;

struct Device {
  ibv_device dev;  // first: handed out as ibv_device*
  uint64_t guid = 0;
  std::vector<ibv_gid> gids;
  std::vector<transport::SockAddr> gid_addrs;
};

// Object limits, as ibv_query_device reports them and as creation enforces them (ENOMEM
// beyond, as the kernel's pools): the defaults, or lower values from SOFTVERBS_MAX_{QP,CQ,
// PD,MR,SRQ,MW,AH} (like a provider's module parameters; read once per process).
enum class Limit : uint8_t { qp, cq, pd, mr, srq, mw, ah, count };
int limit_of(Limit l);
// Takes one object of kind l; false (nothing taken) at the limit.
bool limit_take(Limit l);
void limit_give(Limit l);

// The process' device list (built once). Refreshes the GID table on each call.
Device* the_device();
void refresh_gids(Device* d);
void fill_device_attr(const Device* d, ibv_device_attr* a);
void fill_port_attr(const Device* d, ibv_port_attr* a);
// GID -> IP address (IPv4-mapped or IPv6). False if the GID names no address.
bool gid_to_addr(const ibv_gid& gid, transport::SockAddr& out);
ibv_gid addr_to_gid(const transport::SockAddr& a);

}  // namespace sv::engine
