// Enum-to-text helpers and rate conversions of libibverbs (verbs.h "ibv_*_str", IBTA
// static rate encodings).
#include <infiniband/verbs.h>

#include <iterator>

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

SV_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const kStr[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM rendezvous incomplete",
  };
  const auto i = static_cast<size_t>(status);
  return i < std::size(kStr) ? kStr[i] : "unknown";
}

SV_EXPORT const char* ibv_node_type_str(enum ibv_node_type t) {
  switch (t) {
    case IBV_NODE_CA:
      return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH:
      return "InfiniBand switch";
    case IBV_NODE_ROUTER:
      return "InfiniBand router";
    case IBV_NODE_RNIC:
      return "iWARP NIC";
    case IBV_NODE_USNIC:
      return "usNIC";
    case IBV_NODE_USNIC_UDP:
      return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED:
      return "unspecified";
    default:
      return "unknown";
  }
}

SV_EXPORT const char* ibv_port_state_str(enum ibv_port_state s) {
  switch (s) {
    case IBV_PORT_NOP:
      return "PORT_NOP";
    case IBV_PORT_DOWN:
      return "PORT_DOWN";
    case IBV_PORT_INIT:
      return "PORT_INIT";
    case IBV_PORT_ARMED:
      return "PORT_ARMED";
    case IBV_PORT_ACTIVE:
      return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "PORT_ACTIVE_DEFER";
    default:
      return "invalid state";
  }
}

SV_EXPORT const char* ibv_event_type_str(enum ibv_event_type e) {
  static const char* const kStr[] = {
      "CQ error",
      "local work queue catastrophic error",
      "communication established",
      "send queue drained",
      "path migrated",
      "invalid request local work queue error",
      "local access violation work queue error",
      "path migration request error",
      "local catastrophic error",
      "port active",
      "port error",
      "LID change",
      "P_Key change",
      "SM change",
      "SRQ catastrophic error",
      "SRQ limit reached",
      "last WQE reached",
      "client reregistration",
      "GID table change",
      "WQ fatal",
  };
  const auto i = static_cast<size_t>(e);
  return i < std::size(kStr) ? kStr[i] : "unknown";
}

namespace {
struct RateRow {
  ibv_rate rate;
  int mult;
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},     {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},     {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},    {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},  {IBV_RATE_14_GBPS, 5, 14062},
    {IBV_RATE_56_GBPS, 22, 56250},    {IBV_RATE_112_GBPS, 45, 112500},
    {IBV_RATE_168_GBPS, 67, 168750},  {IBV_RATE_25_GBPS, 10, 25781},
    {IBV_RATE_100_GBPS, 40, 103125},  {IBV_RATE_200_GBPS, 80, 206250},
    {IBV_RATE_300_GBPS, 120, 309375}, {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},    {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},
};
}  // namespace

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mult;
  return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult) {
  for (const auto& r : kRates)
    if (r.mult == mult) return r.rate;
  return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate) {
  for (const auto& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const auto& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}
