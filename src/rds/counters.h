// RDS's counters (rds-info -c, RDS_INFO_COUNTERS): fields with a name table, as net/rds's
// rds_stats (struct rds_statistics and its rds_stat_names), so counting is an array
// increment, not a lookup by name.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace sv::rds {

// clang-format off
#define SVRDS_COUNTERS(X) \
  X(busy_poll_completions) \
  X(cong_send_blocked) \
  X(cong_send_error) \
  X(cong_update_queued) \
  X(cong_update_received) \
  X(conn_connect_attempts) \
  X(conn_connect_raced) \
  X(conn_created) \
  X(conn_down_by_poster) \
  X(conn_down_deferred) \
  X(conn_idle_close) \
  X(conn_reject_bad_addr) \
  X(conn_reject_bad_priv) \
  X(conn_reject_in_xmit) \
  X(conn_reset) \
  X(conn_up) \
  X(conn_up_by_receive) \
  X(cq_backlog_runs) \
  X(cq_handler_deferred) \
  X(cq_handler_runs) \
  X(dir_lookup) \
  X(dir_lookup_retry) \
  X(dir_lookup_served) \
  X(dir_serving) \
  X(engine_cq_events) \
  X(exit_acks_sent) \
  X(exit_acks_timed_out) \
  X(ib_ack_sent) \
  X(info_snapshot_malformed) \
  X(poll_token_writes) \
  X(rdma_base_answered) \
  X(rdma_base_asked) \
  X(rdma_chan_accepted) \
  X(rdma_chan_connect_attempts) \
  X(rdma_chan_down_by_poster) \
  X(rdma_chan_down_deferred) \
  X(rdma_chan_reset) \
  X(rdma_chan_up) \
  X(rdma_dereg_unlocked) \
  X(rdma_mr_alloc) \
  X(rdma_mr_free) \
  X(rdma_post_raced) \
  X(rdma_post_unlocked) \
  X(recv_bad_ack) \
  X(recv_delivered) \
  X(recv_delivered_to_app) \
  X(recv_drop_bad_csum) \
  X(recv_drop_bad_frag) \
  X(recv_drop_bad_len) \
  X(recv_drop_bad_seq) \
  X(recv_drop_no_sock) \
  X(recv_drop_old_seq) \
  X(recv_drop_rdma_failed) \
  X(recv_fence) \
  X(recv_fence_bad) \
  X(recv_held_for_fence) \
  X(recv_held_too_much) \
  X(recv_ping) \
  X(recv_pool_grown) \
  X(recv_pool_trimmed_bytes) \
  X(recv_protocol_error) \
  X(recv_repost_unlocked) \
  X(registry_foreign_entry) \
  X(send_atomic) \
  X(send_atomic_masked_retry) \
  X(send_drop_acked) \
  X(send_drop_no_sock) \
  X(send_pong) \
  X(send_post_unlocked) \
  X(send_queue_full) \
  X(send_queued) \
  X(send_queued_by_sock) \
  X(send_rdma) \
  X(send_rdma_acked_unsettled) \
  X(send_rdma_bytes) \
  X(send_rdma_dropped) \
  X(send_rdma_failed) \
  X(send_rdma_fence_acked) \
  X(send_rdma_fenced) \
  X(send_rdma_gave_up) \
  X(send_rdma_no_region) \
  X(send_rdma_refused) \
  X(send_atomic_unsupported) \
  X(send_rdma_verdict) \
  X(send_rerouted) \
  X(send_xmit_raced) \
  X(send_zcopy) \
  X(wc_stale)
// clang-format on

enum class Ctr : uint16_t {
#define SVRDS_CTR_ENUM(n) n,
  SVRDS_COUNTERS(SVRDS_CTR_ENUM)
#undef SVRDS_CTR_ENUM
};

inline constexpr size_t kCtrCount = 0
#define SVRDS_CTR_ONE(n) +1
    SVRDS_COUNTERS(SVRDS_CTR_ONE)
#undef SVRDS_CTR_ONE
    ;

inline constexpr const char* kCtrNames[kCtrCount] = {
#define SVRDS_CTR_NAME(n) #n,
    SVRDS_COUNTERS(SVRDS_CTR_NAME)
#undef SVRDS_CTR_NAME
};

// rds_info_counter's name holds 31 characters and its NUL.
constexpr bool counter_names_fit() {
  for (const char* n : kCtrNames)
    if (std::char_traits<char>::length(n) > 31) return false;
  return true;
}
static_assert(counter_names_fit());

// Relaxed atomics, as net/rds's per-cpu rds_stats: counted under whichever lock the caller
// holds (the stack lock, a socket's rs_recv_lock) or none (the completion handler).
using Counters = std::array<std::atomic<uint64_t>, kCtrCount>;

void count(Ctr c, uint64_t n = 1);

}  // namespace sv::rds
