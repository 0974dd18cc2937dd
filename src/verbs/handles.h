// Handle validation: verbs objects are found by their handle, as the kernel finds them.
//
// rdma-core hands the kernel nothing but an object's `handle` field, and uverbs looks that
// number up in the context's table (rdma_lookup_get_uobject): a handle that names no live
// object is ENOENT (Linux 6.1.141 and later, for every verb; destroy verbs always), one that
// names an object of another type EINVAL, and the object is left as it was, so a caller that
// restores the handle can then destroy it normally. Here each object also has an address:
// a verb first finds the address among the live objects (a garbled or destroyed object is
// never dereferenced), then checks that its handle field still names it. A thread remembers
// its last passes while no object of that kind was destroyed since (handles.cc); a destroy
// racing a verb on the same object in another thread is the caller's race, as in the kernel.
//
// Handles are numbered per context from 0, one counter for every type, as uverbs' xarray.
// Where the kernel would act on another live object that a rewritten handle happens to name,
// softverbs answers EINVAL instead: the object the caller passed is the one it would free.
//
// Data-path verbs (post, poll) are inline calls through the object itself and are not
// checked, as rdma-core does not check them either.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>

namespace sv::verbs {

// context and channel have no handle field (a context is the uverbs file, a channel a
// descriptor): for them only the address is checked, and a bad one is EINVAL.
enum class HKind : uint8_t { context, pd, mr, mw, cq, qp, srq, ah, channel };

// Registers a new object and gives it its handle (writes the object's handle field).
void handle_add(HKind k, void* h, const ibv_context* ctx);
// 0 if h is a live object of kind k (of context ctx, if given) whose handle names it; else
// the errno uverbs answers: ENOENT (names nothing), EINVAL (another kind or context).
int handle_check(HKind k, const void* h, const ibv_context* ctx = nullptr);
inline bool handle_ok(HKind k, const void* h, const ibv_context* ctx = nullptr) {
  return handle_check(k, h, ctx) == 0;
}
// handle_check, and on success forgets the object, at once (two destroys of one object
// cannot both pass).
int handle_take(HKind k, const void* h);
// Forgets h; false if it was not a live object of kind k.
bool handle_remove(HKind k, const void* h);

}  // namespace sv::verbs
