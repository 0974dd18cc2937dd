// The statistics file each softverbs process publishes (engine/stats.cc writes it,
// tools/softverbs-stat reads it): the per-process equivalent of rxe's hw_counters under
// /sys/class/infiniband/<dev>/ports/1/hw_counters, which `rdma statistic` shows.
//
// One file per process, /dev/shm/softverbs-stats-<uid>/<pid>, host byte order (it never
// leaves the host), fixed offsets:
//   header (kStatsHeaderLen bytes), then nslots slots of slot_size bytes.
//   Slot 0 holds the totals of the process's destroyed QPs (so a device total is slot 0
//   plus every live slot); slots 1.. hold live QPs, qpn 0 marking a free slot.
// The reader copies the file into memory first and decodes the copy: decode_stats is a pure
// function over bytes, bounded in what it allocates, and fuzzed (fuzz/fuzz_stats.cc),
// because the file is written by another process.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace sv::wire {

// Counters kept per QP. Names follow rxe's hw_counters where one exists (sent_pkts,
// rcvd_pkts, rcvd_rnr_err...); iWARP adds FPDU and Terminate counts. TCP retransmits are the
// kernel's (ss -ti), not ours.
enum class Ctr : uint8_t {
  sent_pkts,   // FPDUs framed
  rcvd_pkts,   // FPDUs whose header was accepted
  sent_bytes,  // bytes handed to the socket or ring (framing included), and those the
               // peer reads by reference (shared memory: Writes and Read Responses)
  rcvd_bytes,  // bytes read from the socket or ring, and read by reference from the peer
  sent_sends,  // messages started, by opcode
  sent_writes,
  sent_read_reqs,
  sent_atomics,
  rcvd_sends,  // messages received (last segment), by opcode
  rcvd_writes,
  rcvd_read_reqs,
  rcvd_atomics,
  sent_terminates,
  rcvd_terminates,
  rnr_waits,    // a Send arrived with no receive posted (we stop reading: RNR)
  ud_dropped,   // UD datagrams dropped: malformed, Q_Key/P_Key/QPN mismatch, QP not ready
  uc_dropped,   // UC messages dropped: no receive posted, too long, Write access denied
  fault_reset,  // SOFTVERBS_FAULT firings, by action (wire/fault_spec.h's order)
  fault_stall,
  fault_corrupt,
  fault_drop,
  fault_dup,
  fault_delay,
  // Appended, as every counter: readers map counters by index (decode_slot).
  idle_trims,  // stream buffers given back while the connection was idle (engine/qp_trim.cc)
  shm_bells,   // doorbells rung on a shared-memory connection (engine/qp_shm.cc): one system
               // call each; a spinning peer needs none
  shm_pulls,   // Writes and Read Responses this QP read straight from the peer's memory (one
               // copy, engine/qp_shm.cc shm_pull)
  count
};
inline constexpr size_t kCtrCount = static_cast<size_t>(Ctr::count);
const char* ctr_name(Ctr c);

inline constexpr size_t kWcStatusCount = 24;  // IBV_WC_SUCCESS .. IBV_WC_TM_RNDV_INCOMPLETE
// The key of completions of status `s` (ibv_wc_status's order): the enum's name without
// IBV_, lower case ("wc_wr_flush_err"), so key/value readers can take the output;
// ibv_wc_status_str's texts have spaces. "wc_unknown" past the table.
const char* wc_status_name(size_t s);
// The name of a QP state as the file records it (ibv_qp_state's order: RESET .. ERR), as
// ibv_devinfo and rdma-tool print them; "UNKNOWN" past the table.
const char* qp_state_name(uint32_t s);

inline constexpr char kStatsMagic[8] = {'S', 'V', 'S', 'T', 'A', 'T', 'S', '1'};
inline constexpr uint32_t kStatsVersion = 1;
inline constexpr size_t kStatsHeaderLen = 64;
// Header: magic[8] | u32 version | u32 header_len | u32 slot_size | u32 nslots |
//         u32 ncounters | u32 nwc | u32 pid | u32 reserved | u64 start_time | char comm[16]
inline constexpr size_t kHdrVersion = 8, kHdrHeaderLen = 12, kHdrSlotSize = 16, kHdrNslots = 20,
                        kHdrNcounters = 24, kHdrNwc = 28, kHdrPid = 32, kHdrStartTime = 40,
                        kHdrComm = 48;
// Slot: u32 qpn | u32 state | u32 qp_type | u32 dest_qpn | u16 family | u16 port (network
// order) | u8 addr[16] | u32 transport | u64 counters[ncounters] | u64 wc_status[nwc]
// transport: 0 the socket (TCP, or UDP for UD), kTransportShm shared memory (issue 29); a
// writer older than it leaves 0 there.
inline constexpr size_t kSlotQpn = 0, kSlotState = 4, kSlotType = 8, kSlotDestQpn = 12,
                        kSlotFamily = 16, kSlotPort = 18, kSlotAddr = 20, kSlotTransport = 36,
                        kSlotCounters = 40;
inline constexpr uint32_t kTransportShm = 1;
inline constexpr size_t kSlotSize = kSlotCounters + 8 * (kCtrCount + kWcStatusCount);

// Limits a reader enforces (a writer never exceeds them).
inline constexpr uint32_t kStatsMaxSlots = 65536;
inline constexpr uint32_t kStatsMaxCounters = 64;
inline constexpr size_t kStatsMaxFile = 32u << 20;

struct QpStatsView {
  uint32_t qpn = 0;  // 0: the destroyed QPs' totals (slot 0)
  uint32_t state = 0;
  uint32_t qp_type = 0;
  uint32_t dest_qpn = 0;
  uint16_t family = 0;
  uint16_t port = 0;  // network order
  std::array<uint8_t, 16> addr{};
  uint32_t transport = 0;                     // kTransportShm, or 0: the socket
  std::array<uint64_t, kCtrCount> ctr{};      // counters this reader knows; others dropped
  std::array<uint64_t, kWcStatusCount> wc{};  // completions by ibv_wc_status (0: success)
};

struct StatsView {
  uint32_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells a reused pid apart
  std::string comm;
  QpStatsView retired;           // slot 0
  std::vector<QpStatsView> qps;  // live slots only
};

enum class StatsError { ok, short_file, bad_magic, bad_version, bad_geometry };
const char* to_string(StatsError e);

// Decodes a copy of a statistics file. Never reads outside `file`; allocates at most one
// QpStatsView per slot the file's length can hold.
StatsError decode_stats(std::span<const std::byte> file, StatsView& out);

// Writes a header for a file of `nslots` slots (the writer's side; pure).
void encode_stats_header(std::span<std::byte, kStatsHeaderLen> out, uint32_t nslots, uint32_t pid,
                         uint64_t start_time, const std::string& comm);

}  // namespace sv::wire
