#include "engine/device.h"

#include <arpa/inet.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/log.h"
#include "util/fork_local.h"
#include "util/settings.h"

namespace sv::engine {

ibv_gid addr_to_gid(const transport::SockAddr& a) {
  ibv_gid g{};
  if (a.family() == AF_INET) {
    // RoCEv2-style IPv4-mapped GID ::ffff:a.b.c.d
    g.raw[10] = 0xff;
    g.raw[11] = 0xff;
    std::memcpy(&g.raw[12], &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4);
  } else if (a.family() == AF_INET6) {
    std::memcpy(g.raw, &reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr, 16);
  }
  return g;
}

bool gid_to_addr(const ibv_gid& gid, transport::SockAddr& out) {
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid.raw, kMapped, 12) == 0) {
    uint32_t a;
    std::memcpy(&a, &gid.raw[12], 4);
    out = transport::SockAddr::ipv4(a, 0);
    return a != 0;
  }
  static const uint8_t kZero[16] = {};
  if (std::memcmp(gid.raw, kZero, 16) == 0) return false;
  if (gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80) return false;  // link-local: no scope
  out = transport::SockAddr{};
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.ss);
  in6->sin6_family = AF_INET6;
  std::memcpy(&in6->sin6_addr, gid.raw, 16);
  out.len = sizeof(sockaddr_in6);
  return true;
}

// SOFTVERBS_NETDEV=lo,veth0 binds the device to those interfaces, as `rdma link add
// ... netdev` binds rxe/siw: only their addresses enter the GID table.
static bool netdev_selected(const std::string& ifname) {
  const char* e = settings::text_value(SV_SETTING("SOFTVERBS_NETDEV"));
  if (!e) return true;
  std::string list = std::string(",") + e + ",";
  return list.find("," + ifname + ",") != std::string::npos;
}

void refresh_gids(Device* d) {
  // Per process generation: a thread of a forking parent may have held it (fork_local.h).
  static ForkLocal<std::mutex> mu;
  std::lock_guard lk(mu.get());
  std::vector<ibv_gid> gids;
  std::vector<transport::SockAddr> addrs;
  for (const auto& h : transport::host_addresses()) {
    if (!netdev_selected(h.ifname)) continue;
    gids.push_back(addr_to_gid(h.addr));
    addrs.push_back(h.addr);
  }
  if (gids.empty()) {  // never an empty table: perftest and devinfo walk it
    auto lo = transport::SockAddr::ipv4(htonl(INADDR_LOOPBACK), 0);
    gids.push_back(addr_to_gid(lo));
    addrs.push_back(lo);
  }
  // Every open rescans, and the table is read without a lock (the progress thread picks a
  // connection's active side by it, verbs answer ibv_query_gid): rewrite it only when the
  // host's addresses changed, which a running program meets only if an interface comes or
  // goes under it.
  if (gids.size() == d->gids.size() &&
      std::equal(gids.begin(), gids.end(), d->gids.begin(),
                 [](const ibv_gid& a, const ibv_gid& b) { return !std::memcmp(a.raw, b.raw, 16); }))
    return;
  d->gids = std::move(gids);
  d->gid_addrs = std::move(addrs);
}

namespace {

struct Limits {
  int max[static_cast<int>(Limit::count)];
  std::atomic<int> used[static_cast<int>(Limit::count)] = {};
  Limits() {
    // In Limit's order. Each may only lower the device's own limit (its range's top).
    const settings::Setting* env[] = {
        &SV_SETTING("SOFTVERBS_MAX_QP"),  &SV_SETTING("SOFTVERBS_MAX_CQ"),
        &SV_SETTING("SOFTVERBS_MAX_PD"),  &SV_SETTING("SOFTVERBS_MAX_MR"),
        &SV_SETTING("SOFTVERBS_MAX_SRQ"), &SV_SETTING("SOFTVERBS_MAX_MW"),
        &SV_SETTING("SOFTVERBS_MAX_AH")};
    static_assert(std::size(env) == static_cast<size_t>(Limit::count));
    for (int i = 0; i < static_cast<int>(Limit::count); ++i)
      max[i] = static_cast<int>(settings::uint_value(*env[i]));
  }
};

// Per process generation: a forked child owns none of its parent's objects.
ForkLocal<Limits> g_limits;

// The settings' defaults are the device's limits.
static_assert(settings::get("SOFTVERBS_MAX_QP").dflt == kMaxQp);
static_assert(settings::get("SOFTVERBS_MAX_MR").dflt == kMaxMr);
static_assert(settings::get("SOFTVERBS_MAX_MW").dflt == kMaxMr);

}  // namespace

int limit_of(Limit l) {
  return g_limits.get().max[static_cast<int>(l)];
}

bool limit_take(Limit l) {
  Limits& t = g_limits.get();
  const int i = static_cast<int>(l);
  if (t.used[i].fetch_add(1, std::memory_order_relaxed) >= t.max[i]) {
    t.used[i].fetch_sub(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void limit_give(Limit l) {
  g_limits.get().used[static_cast<int>(l)].fetch_sub(1, std::memory_order_relaxed);
}

Device* the_device() {
  static Device* dev = [] {
    auto* d = new Device{};
    d->dev.node_type = IBV_NODE_CA;
    d->dev.transport_type = IBV_TRANSPORT_IB;
    std::strcpy(d->dev.name, "softverbs0");
    std::strcpy(d->dev.dev_name, "uverbs0");
    std::strcpy(d->dev.dev_path, "/dev/null/softverbs/uverbs0");
    std::strcpy(d->dev.ibdev_path, "/dev/null/softverbs/softverbs0");
    // Stable per host: derived from the host id so both ends of a test see distinct GUIDs
    // only across hosts, like a NIC's GUID.
    uint64_t g = static_cast<uint64_t>(gethostid()) << 24 ^ 0x5f7600000000001ull;
    d->guid = g ? g : 1;
    refresh_gids(d);
    return d;
  }();
  return dev;
}

void fill_device_attr(const Device* d, ibv_device_attr* a) {
  std::memset(a, 0, sizeof *a);
  std::strcpy(a->fw_ver, "0.1.0");
  a->node_guid = htobe64(d->guid);
  a->sys_image_guid = htobe64(d->guid);
  a->max_mr_size = ~0ull;
  a->page_size_cap = 4096;
  // rxe's vendor id (0xFFFFFF, no IEEE OUI): non-zero as rdma-core's tests require, and
  // unknown to perftest, which stays on its generic path.
  a->vendor_id = 0xFFFFFF;
  a->vendor_part_id = 0;
  a->hw_ver = 0;
  a->max_qp = limit_of(Limit::qp);
  a->max_qp_wr = kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
                        IBV_DEVICE_CHANGE_PHY_PORT | IBV_DEVICE_N_NOTIFY_CQ |
                        IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSgeRd;
  a->max_cq = limit_of(Limit::cq);
  a->max_cqe = kMaxCqe;
  a->max_mr = limit_of(Limit::mr);
  a->max_pd = limit_of(Limit::pd);
  a->max_mw = limit_of(Limit::mw);
  a->max_ah = limit_of(Limit::ah);
  a->max_qp_rd_atom = kMaxRdAtom;
  a->max_ee_rd_atom = 0;
  a->max_res_rd_atom = kMaxRdAtom * 1024;
  a->max_qp_init_rd_atom = kMaxRdAtom;
  // Atomics travel as RFC 7306 Atomic Operations, which SOFTVERBS_RFC7306=0 turns off toward
  // every peer: the device then has none, as siw reports (siw_query_device: IB_ATOMIC_NONE),
  // so a program that checks atomic_cap (RDS does) does not post atomics bound to fail.
  a->atomic_cap =
      settings::flag_value(SV_SETTING("SOFTVERBS_RFC7306")) ? IBV_ATOMIC_HCA : IBV_ATOMIC_NONE;
  a->max_srq = limit_of(Limit::srq);
  a->max_srq_wr = kMaxSrqWr;
  a->max_srq_sge = kMaxSge;
  a->max_pkeys = 1;
  // Multicast (UD over IP multicast, qp_ud.cc): rxe's numbers; groups per QP are enforced.
  a->max_mcast_grp = 8192;
  a->max_mcast_qp_attach = 56;
  a->max_total_mcast_qp_attach = 8192 * 56;
  a->local_ca_ack_delay = 15;
  a->phys_port_cnt = 1;
}

void fill_port_attr(const Device* d, ibv_port_attr* a) {
  std::memset(a, 0, sizeof *a);
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = static_cast<int>(d->gids.size());
  a->port_cap_flags = IBV_PORT_CM_SUP;
  a->max_msg_sz = kMaxMsgSize;
  a->bad_pkey_cntr = 0;
  a->qkey_viol_cntr = 0;
  a->pkey_tbl_len = 1;
  a->lid = 0;
  a->sm_lid = 0;
  a->lmc = 0;
  a->max_vl_num = 1;
  a->sm_sl = 0;
  a->subnet_timeout = 0;
  a->init_type_reply = 0;
  a->active_width = 2;   // 4x
  a->active_speed = 32;  // EDR-like label; software, not a measured rate
  a->phys_state = 5;     // LinkUp
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
  a->flags = 0;
  a->port_cap_flags2 = 0;
}

}  // namespace sv::engine
