// Fault injection (SOFTVERBS_FAULT, wire/fault_spec.h): which frame of which QP a rule hits.
//
// The plan is parsed once per process, when the device is first opened; a malformed one
// fails ibv_open_device with EINVAL (a test "under faults" that runs without them proves
// nothing). A QP made while the plan has rules gets a QpFaults; the data path asks it once
// per frame, behind a null check, so a process without rules pays one predictable branch.
//
// Determinism: frames are numbered per QP and direction, and a rule's random draws come
// from a generator seeded with (seed, rule, the QP's creation order in the process), so the
// same program with the same seed fires the same faults on the same frames.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/stats.h"
#include "transport/tcp.h"
#include "wire/fault_spec.h"

namespace sv::engine::fault {

using wire::FaultAction;
using wire::FaultDir;

// The process plan. False if SOFTVERBS_FAULT is malformed (said once on stderr, naming the
// token); the verbs layer then refuses to open the device with EINVAL.
bool plan_ok();
// Whether the plan has any rule.
bool active();
// Whether a corrupt rule exists: MPA CRC is then asked for on every connection, so the
// flipped bit is caught by the receiver as a NIC's link CRC would catch it.
bool wants_crc();

struct Fired {
  FaultAction action = FaultAction::reset;
  uint32_t ms = 0;
  uint64_t frame = 0;
  uint32_t bit = 0;  // corrupt: which bit of the 32-bit MPA CRC to flip
};

class QpFaults {
 public:
  QpFaults(uint32_t qpn, uint64_t ordinal);
  // The connection's peer, for peer= rules (RC/UC: set when the connection comes up; UD:
  // per datagram).
  void set_peer(const transport::SockAddr& peer);
  // Frame `++frames[dir]` of a connection (datagram == false) or a datagram: the first rule
  // that fires on it, if any. Logs the firing at warn level ("fault ...").
  bool on_frame(FaultDir dir, bool datagram, Fired& out, const transport::SockAddr* peer = nullptr);

 private:
  uint32_t qpn_;
  uint64_t frames_[2] = {0, 0};
  std::vector<uint64_t> eligible_;  // per rule
  std::vector<uint64_t> rng_;       // per rule
  uint8_t family_ = 0;
  uint8_t addr_[16] = {};
};

// The counter of an action's firings: stats::Ctr has one per action, in FaultAction's order.
inline stats::Ctr counter_of(FaultAction a) {
  static_assert(static_cast<size_t>(stats::Ctr::fault_delay) -
                    static_cast<size_t>(stats::Ctr::fault_reset) + 1 ==
                wire::kFaultActions);
  return static_cast<stats::Ctr>(static_cast<size_t>(stats::Ctr::fault_reset) +
                                 static_cast<size_t>(a));
}

// A QP's fault state, or null when the plan has no rules.
std::unique_ptr<QpFaults> attach(uint32_t qpn);

// Parses the per-QP injection of softverbs_qp_inject_fault ("reset", "stall:ms=N",
// "corrupt"): false for anything else.
bool parse_inject(const char* what, FaultAction& action, uint32_t& ms);

}  // namespace sv::engine::fault
