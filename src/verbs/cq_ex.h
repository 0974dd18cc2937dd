// Extended CQs (ibv_create_cq_ex and the ibv_cq_ex poll API) and what they share with the
// plain CQ verbs in verbs.cc.
#pragma once
#include <infiniband/verbs.h>

#include "engine/cq.h"

namespace sv::verbs {

// ibv_create_cq's checks and construction; nullptr with errno set.
engine::Cq* cq_new(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
                   int comp_vector);
// A poll found the CQ empty: flush deferred posts and run the QPs' receive path here.
void drive_empty_cq(engine::Cq* cq);
// verbs_context ops behind the header's inline ibv_create_cq_ex and ibv_query_rt_values_ex.
ibv_cq_ex* create_cq_ex(ibv_context* ctx, ibv_cq_init_attr_ex* attr);
int query_rt_values(ibv_context* ctx, ibv_values_ex* values);

// The completion timestamp clock: CLOCK_MONOTONIC in ns, reported as a 1 GHz HCA clock.
inline constexpr uint64_t kHcaCoreClockKhz = 1000000;

}  // namespace sv::verbs
