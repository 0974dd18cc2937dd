// The QP connection's transition table (engine/qp_state.h): every event in every state,
// against the table in its header comment and docs/architecture.md.
#include <gtest/gtest.h>

#include <string>

#include "engine/qp_state.h"

namespace sv::engine {
namespace {

constexpr ConnState kStates[] = {ConnState::idle, ConnState::up, ConnState::peer_gone,
                                 ConnState::failed};
constexpr ConnEvent kEvents[] = {ConnEvent::established, ConnEvent::peer_closed_idle,
                                 ConnEvent::error, ConnEvent::reset, ConnEvent::destroy};

// "-" where the event cannot happen in the state.
std::string table_entry(ConnState s, ConnEvent e) {
  const auto to = conn_next(s, e);
  return to ? conn_state_name(*to) : "-";
}

TEST(QpConnState, TheTransitionTable) {
  const char* want[4][5] = {
      // established, peer_closed_idle, error, reset, destroy
      {"up", "-", "failed", "idle", "idle"},         // idle
      {"-", "peer_gone", "failed", "idle", "idle"},  // up: a second connection is refused
      {"up", "-", "failed", "idle", "idle"},         // peer_gone: a new handshake may come
      {"-", "-", "failed", "idle", "idle"},          // failed: only reset or destroy leave it
  };
  for (int s = 0; s < 4; ++s)
    for (int e = 0; e < 5; ++e)
      EXPECT_EQ(table_entry(kStates[s], kEvents[e]), want[s][e])
          << conn_state_name(kStates[s]) << " + " << conn_event_name(kEvents[e]);
}

TEST(QpConnState, EveryStateAndEventHasAName) {
  for (auto s : kStates) EXPECT_STRNE(conn_state_name(s), "?");
  for (auto e : kEvents) EXPECT_STRNE(conn_event_name(e), "?");
  EXPECT_STREQ(qp_state_name(IBV_QPS_RTS), "RTS");
  EXPECT_STREQ(qp_state_name(IBV_QPS_ERR), "ERR");
  EXPECT_STREQ(qp_state_name(static_cast<ibv_qp_state>(99)), "UNKNOWN");
}

}  // namespace
}  // namespace sv::engine
