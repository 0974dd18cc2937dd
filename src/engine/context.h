// The verbs context (one per ibv_open_device) and its async event file.
#pragma once
#include <infiniband/verbs.h>

#include "engine/device.h"
#include "engine/event_queue.h"

namespace sv::engine {

struct Context {
  verbs_context vctx;  // first; &vctx.context is the ibv_context handed out
  Device* device = nullptr;
  EventQueue<ibv_async_event> async;  // vctx.context.async_fd is its fd

  ibv_context* ibctx() { return &vctx.context; }
  static Context* from(ibv_context* c) {
    return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) -
                                      offsetof(verbs_context, context));
  }
  // Queues an async event record for ibv_get_async_event, counted against its QP or SRQ
  // (the kernel's events_reported) so destroying that object can wait for the ack.
  void post_async(const ibv_async_event& ev);
  // Destroying a QP or SRQ, as uverbs does: its events not yet retrieved are dropped (and
  // count as acknowledged), then this waits until every one retrieved has been acked, as
  // libibverbs' destroy waits for events_completed == events_reported.
  void retire_async(ibv_qp* qp, uint32_t reported);
  void retire_async(ibv_srq* srq, uint32_t reported);
};
static_assert(offsetof(Context, vctx) == 0);

}  // namespace sv::engine
