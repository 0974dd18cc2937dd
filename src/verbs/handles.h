// Handle validation: the live verbs objects of this process, by address.
//
// The kernel looks up every handle a verb names (uverbs' idr) and answers EINVAL for one that
// names nothing, or an object of another context. Here the "handle" is the object's address,
// so each verb that takes one checks it in this table before touching the object: a garbled
// pointer, a destroyed object or another context's object is EINVAL, and never dereferenced.
// Data-path verbs (post, poll) are inline calls through the object itself and are not
// checked, as rdma-core does not check them either.
#pragma once
#include <infiniband/verbs.h>

namespace sv::verbs {

enum class HKind : uint8_t { context, pd, mr, mw, cq, qp, srq, ah, channel };

void handle_add(HKind k, const void* h, const ibv_context* ctx);
// h is a live object of kind k (and, if ctx is given, of that context).
bool handle_ok(HKind k, const void* h, const ibv_context* ctx = nullptr);
// Forgets h; false if it was not a live object of kind k.
bool handle_remove(HKind k, const void* h);

}  // namespace sv::verbs
