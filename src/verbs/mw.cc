// Memory windows: the ibv_context_ops behind the header's inline ibv_alloc_mw, ibv_bind_mw
// and ibv_dealloc_mw (verbs-abi.md §3). The window itself and the checks of a bind live in
// the engine's key table (engine/mr.h); a bind runs on the QP's requester, in SQ order.
#include <infiniband/verbs.h>

#include <cerrno>
#include <new>

#include "engine/device.h"
#include "engine/mr.h"
#include "engine/qp.h"
#include "verbs/handles.h"
#include "verbs/mw.h"

namespace sv::verbs {

using engine::KeyTable;
using engine::Limit;
using engine::Mw;
using engine::Pd;

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  // uverbs: the PD looked up (ENOENT if its handle names nothing), then a type other than
  // 1 or 2 is EINVAL.
  if (const int e = handle_check(HKind::pd, pd)) {
    errno = e;
    return nullptr;
  }
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  if (!engine::limit_take(Limit::mw)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* mw = new (std::nothrow) Mw();
  if (!mw) {
    engine::limit_give(Limit::mw);
    errno = ENOMEM;
    return nullptr;
  }
  mw->pd = reinterpret_cast<Pd*>(pd);
  mw->mw.context = pd->context;
  mw->mw.pd = pd;
  mw->mw.type = type;
  if (!KeyTable::get().add(mw)) {
    delete mw;
    engine::limit_give(Limit::mw);
    errno = ENOMEM;
    return nullptr;
  }
  ++mw->pd->users;
  handle_add(HKind::mw, &mw->mw, pd->context);
  return &mw->mw;
}

int dealloc_mw(ibv_mw* ibmw) {
  if (const int e = handle_take(HKind::mw, ibmw)) return errno = e;
  auto* mw = reinterpret_cast<Mw*>(ibmw);
  KeyTable::get().remove(mw);  // a bound window is unbound: its rkey stops working now
  --mw->pd->users;
  delete mw;
  engine::limit_give(Limit::mw);
  return 0;
}

// ibv_bind_mw (type 1): the inline verb has checked the type, and the region's PD (EPERM).
// As rdma-core's providers do, this posts a Bind WR with the next key and, once posted,
// gives the window that rkey (rdma-core's rxe: the application undoes it on an error
// completion).
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  if (!handle_ok(HKind::qp, qp) || !handle_ok(HKind::mw, mw, qp->context) || !bind)
    return errno = EINVAL;
  // o10-36.2.2: a type 1 window is never zero based (rdma-core's rxe refuses it at post).
  if (bind->bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED) return errno = EINVAL;
  ibv_send_wr wr{};
  wr.wr_id = bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = bind->bind_info;
  ibv_send_wr* bad = nullptr;
  if (int e = engine::qp_post_send(engine::Qp::from(qp), &wr, &bad)) return errno = e;
  mw->rkey = wr.bind_mw.rkey;
  return 0;
}

}  // namespace sv::verbs
