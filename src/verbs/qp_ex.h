// The ibv_qp_ex work-request API (ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
// ibv_wr_*), and what it shares with ibv_create_qp in verbs.cc.
#pragma once
#include <infiniband/verbs.h>

namespace sv::verbs {

// ibv_create_qp's checks and construction; nullptr with errno set.
ibv_qp* qp_new(ibv_pd* pd, ibv_qp_init_attr* init);
// The verbs_context op behind the header's inline ibv_create_qp_ex.
ibv_qp* create_qp_ex(ibv_context* ctx, ibv_qp_init_attr_ex* attr);

}  // namespace sv::verbs
