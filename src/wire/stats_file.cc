#include "wire/stats_file.h"

#include <algorithm>
#include <cstring>
#include <iterator>

namespace sv::wire {

namespace {

uint32_t ld32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t ld16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint64_t ld64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void st32(std::byte* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
void st64(std::byte* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}

void decode_slot(const std::byte* s, uint32_t ncounters, uint32_t nwc, QpStatsView& q) {
  q.qpn = ld32(s + kSlotQpn);
  q.state = ld32(s + kSlotState);
  q.qp_type = ld32(s + kSlotType);
  q.dest_qpn = ld32(s + kSlotDestQpn);
  q.family = ld16(s + kSlotFamily);
  q.port = ld16(s + kSlotPort);
  std::memcpy(q.addr.data(), s + kSlotAddr, q.addr.size());
  q.transport = ld32(s + kSlotTransport);
  const std::byte* c = s + kSlotCounters;
  for (uint32_t i = 0; i < ncounters && i < kCtrCount; ++i) q.ctr[i] = ld64(c + 8 * i);
  const std::byte* w = c + 8 * size_t{ncounters};
  for (uint32_t i = 0; i < nwc && i < kWcStatusCount; ++i) q.wc[i] = ld64(w + 8 * i);
}

}  // namespace

const char* wc_status_name(size_t s) {
  static constexpr const char* kNames[kWcStatusCount] = {
      "wc_success",
      "wc_loc_len_err",
      "wc_loc_qp_op_err",
      "wc_loc_eec_op_err",
      "wc_loc_prot_err",
      "wc_wr_flush_err",
      "wc_mw_bind_err",
      "wc_bad_resp_err",
      "wc_loc_access_err",
      "wc_rem_inv_req_err",
      "wc_rem_access_err",
      "wc_rem_op_err",
      "wc_retry_exc_err",
      "wc_rnr_retry_exc_err",
      "wc_loc_rdd_viol_err",
      "wc_rem_inv_rd_req_err",
      "wc_rem_abort_err",
      "wc_inv_eecn_err",
      "wc_inv_eec_state_err",
      "wc_fatal_err",
      "wc_resp_timeout_err",
      "wc_general_err",
      "wc_tm_err",
      "wc_tm_rndv_incomplete",
  };
  return s < kWcStatusCount ? kNames[s] : "wc_unknown";
}

const char* qp_state_name(uint32_t s) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s < std::size(kNames) ? kNames[s] : "UNKNOWN";
}

const char* ctr_name(Ctr c) {
  switch (c) {
    case Ctr::sent_pkts:
      return "sent_pkts";
    case Ctr::rcvd_pkts:
      return "rcvd_pkts";
    case Ctr::sent_bytes:
      return "sent_bytes";
    case Ctr::rcvd_bytes:
      return "rcvd_bytes";
    case Ctr::sent_sends:
      return "sent_sends";
    case Ctr::sent_writes:
      return "sent_writes";
    case Ctr::sent_read_reqs:
      return "sent_read_reqs";
    case Ctr::sent_atomics:
      return "sent_atomics";
    case Ctr::rcvd_sends:
      return "rcvd_sends";
    case Ctr::rcvd_writes:
      return "rcvd_writes";
    case Ctr::rcvd_read_reqs:
      return "rcvd_read_reqs";
    case Ctr::rcvd_atomics:
      return "rcvd_atomics";
    case Ctr::sent_terminates:
      return "sent_terminates";
    case Ctr::rcvd_terminates:
      return "rcvd_terminates";
    case Ctr::rnr_waits:
      return "rnr_waits";
    case Ctr::ud_dropped:
      return "ud_dropped";
    case Ctr::uc_dropped:
      return "uc_dropped";
    case Ctr::idle_trims:
      return "idle_trims";
    case Ctr::shm_bells:
      return "shm_bells";
    case Ctr::shm_pulls:
      return "shm_pulls";
    case Ctr::fault_reset:
      return "fault_reset";
    case Ctr::fault_stall:
      return "fault_stall";
    case Ctr::fault_corrupt:
      return "fault_corrupt";
    case Ctr::fault_drop:
      return "fault_drop";
    case Ctr::fault_dup:
      return "fault_dup";
    case Ctr::fault_delay:
      return "fault_delay";
    case Ctr::count:
      break;
  }
  return "?";
}

const char* to_string(StatsError e) {
  switch (e) {
    case StatsError::ok:
      return "ok";
    case StatsError::short_file:
      return "shorter than its header says";
    case StatsError::bad_magic:
      return "not a softverbs statistics file";
    case StatsError::bad_version:
      return "unknown version";
    case StatsError::bad_geometry:
      return "slot geometry out of bounds";
  }
  return "?";
}

StatsError decode_stats(std::span<const std::byte> f, StatsView& out) {
  out = StatsView{};
  if (f.size() < kStatsHeaderLen) return StatsError::short_file;
  if (std::memcmp(f.data(), kStatsMagic, sizeof kStatsMagic) != 0) return StatsError::bad_magic;
  const std::byte* h = f.data();
  if (ld32(h + kHdrVersion) != kStatsVersion) return StatsError::bad_version;
  const uint32_t header_len = ld32(h + kHdrHeaderLen);
  const uint32_t slot_size = ld32(h + kHdrSlotSize);
  const uint32_t nslots = ld32(h + kHdrNslots);
  const uint32_t ncounters = ld32(h + kHdrNcounters);
  const uint32_t nwc = ld32(h + kHdrNwc);
  // Geometry first, in 64-bit arithmetic: nothing below can overflow or leave the file.
  if (header_len < kStatsHeaderLen || nslots == 0 || nslots > kStatsMaxSlots ||
      ncounters > kStatsMaxCounters || nwc > kStatsMaxCounters ||
      uint64_t{slot_size} < kSlotCounters + 8 * (uint64_t{ncounters} + nwc))
    return StatsError::bad_geometry;
  if (uint64_t{header_len} + uint64_t{slot_size} * nslots > f.size()) return StatsError::short_file;
  out.pid = ld32(h + kHdrPid);
  out.start_time = ld64(h + kHdrStartTime);
  const char* comm = reinterpret_cast<const char*>(h + kHdrComm);
  out.comm.assign(comm, strnlen(comm, 16));
  const std::byte* slots = h + header_len;
  decode_slot(slots, ncounters, nwc, out.retired);
  out.retired.qpn = 0;
  for (uint32_t i = 1; i < nslots; ++i) {
    const std::byte* s = slots + size_t{slot_size} * i;
    if (ld32(s + kSlotQpn) == 0) continue;
    decode_slot(s, ncounters, nwc, out.qps.emplace_back());
  }
  return StatsError::ok;
}

void encode_stats_header(std::span<std::byte, kStatsHeaderLen> out, uint32_t nslots, uint32_t pid,
                         uint64_t start_time, const std::string& comm) {
  std::byte* h = out.data();
  std::memset(h, 0, kStatsHeaderLen);
  std::memcpy(h, kStatsMagic, sizeof kStatsMagic);
  st32(h + kHdrVersion, kStatsVersion);
  st32(h + kHdrHeaderLen, kStatsHeaderLen);
  st32(h + kHdrSlotSize, kSlotSize);
  st32(h + kHdrNslots, nslots);
  st32(h + kHdrNcounters, kCtrCount);
  st32(h + kHdrNwc, kWcStatusCount);
  st32(h + kHdrPid, pid);
  st64(h + kHdrStartTime, start_time);
  std::memcpy(h + kHdrComm, comm.data(), std::min<size_t>(comm.size(), 15));
}

}  // namespace sv::wire
