// Memory window verbs (ibv_context_ops.alloc_mw, bind_mw, dealloc_mw).
#pragma once
#include <infiniband/verbs.h>

namespace sv::verbs {

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);

}  // namespace sv::verbs
