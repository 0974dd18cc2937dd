// libibverbs.so.1 ABI: the exported verbs (verbs-abi.md §1.4) and the ops the header's
// inline verbs call through (ibv_context_ops, verbs_context). Conventions follow
// libibverbs: create_* return NULL with errno set; modify/destroy return a positive errno;
// post_* return a positive errno and set *bad_wr.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/busy_poll.h"
#include "engine/context.h"
#include "engine/cq.h"
#include "engine/device.h"
#include "engine/fault.h"
#include "engine/mr.h"
#include "engine/qp.h"
#include "engine/settings.h"
#include "softverbs/verbs_ext.h"
#include "util/clock.h"
#include "verbs/cq_ex.h"
#include "verbs/handles.h"
#include "verbs/mw.h"
#include "verbs/qp_ex.h"
#include "wire/ud.h"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

using namespace sv::engine;
using sv::verbs::handle_add;
using sv::verbs::handle_check;
using sv::verbs::handle_ok;
using sv::verbs::handle_remove;
using sv::verbs::handle_take;
using sv::verbs::HKind;

namespace {
void flush_deferred_tx(Cq* cq);
}  // namespace

namespace sv::verbs {
void drive_empty_cq(Cq* cq) {
  if (cq->nqps.load(std::memory_order_acquire) == 0) return;
  // An application thread spinning on an unarmed CQ owns the receive path for a while and
  // the progress thread steps back (busy_poll.h). A held Placement Ack leaves at the second
  // empty poll of a spin: the first may come just before the answer is posted.
  const uint64_t now = sv::mono_ns();
  cq->flush_deferred_tx(cq_spinning(cq, now));
  if (cq_owned_elsewhere(cq, now)) return;
  const bool yielded = cq_busy_poll_empty(cq, now);
  // Empty: run the attached QPs' receive path here rather than waiting for the
  // progress thread to wake up (a cross-core wake-up costs ~30 us on this class of VM).
  // A clock read costs as much as a tenth of an empty pass: one more only after a yield or
  // a pass that took bytes, the kinds that can be long (a large Write placed). A yield
  // taken for a short pass would end the streak, and with it the yielding.
  const bool took = cq->progress_qps();
  cq_busy_poll_empty_done(cq, took || yielded ? sv::mono_ns() : now);
}
}  // namespace sv::verbs

namespace {

// Posts that doorbell batching held back leave when a poll comes up empty or the CQ is
// armed, so a caller waiting for their completions never waits for the batch timer.
void flush_deferred_tx(Cq* cq) {
  cq->flush_deferred_tx();
}

int op_poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  Cq* cq = Cq::from(ibcq);
  if (n <= 0) return 0;
  int got = cq->poll(n, wc);
  // A poll that finds completions leaves a batch to grow (a streaming sender polls between
  // posts); one that finds none may be waiting for what the batch holds: flush it.
  if (got) {
    cq_busy_poll_found(cq);
    return got;
  }
  sv::verbs::drive_empty_cq(cq);
  got = cq->poll(n, wc);
  // What the receive pass just completed ends the empty streak as surely as what was
  // queued: otherwise a ping-pong whose completions all come from its own passes would look
  // like one long spin, and after SOFTVERBS_SPIN_YIELD_US every empty poll would yield (a
  // yield that on a busy machine costs a whole time slice, hundreds of us, per message).
  if (got) cq_busy_poll_found(cq);
  return got;
}

int op_req_notify_cq(ibv_cq* ibcq, int solicited) {
  Cq* cq = Cq::from(ibcq);
  // A thread that sleeps in ibv_get_cq_event arms between an event and its answer (perftest's
  // ctx_notify_events: get, ack, arm; then poll and post): a Placement Ack held for that
  // answer stays held for it, or the ack leaves alone, a sendmsg per message (ib_send_lat -e:
  // 2 per message, not 1). If the thread sleeps again instead, channel_block sends it.
  cq->flush_deferred_tx(!cq_channel_sleeper_is_me(cq));
  const int r = cq->arm(solicited != 0);
  // A poller that arms will wait for an event: the progress thread must receive for it.
  // After the arm, so that what the progress thread then receives raises the event.
  if (!Progress::get().on_thread()) cq_busy_poll_armed(cq);
  return r;
}

int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return qp_post_send(Qp::from(qp), wr, bad);
}
int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return qp_post_recv(Qp::from(qp), wr, bad);
}
int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return srq_post_recv(reinterpret_cast<Srq*>(srq), wr, bad);
}

int op_query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr, size_t len) {
  if (port != 1) return EINVAL;
  ibv_port_attr a;
  fill_port_attr(Context::from(ctx)->device, &a);
  std::memset(attr, 0, len);
  std::memcpy(attr, &a, std::min(len, sizeof a));
  return 0;
}

int op_query_device_ex(ibv_context* ctx, const ibv_query_device_ex_input* input,
                       ibv_device_attr_ex* attr, size_t size) {
  if (input && input->comp_mask) return EINVAL;
  if (size < sizeof(attr->orig_attr)) return EINVAL;
  ibv_device_attr_ex a{};
  fill_device_attr(Context::from(ctx)->device, &a.orig_attr);
  a.max_dm_size = 0;
  a.device_cap_flags_ex = a.orig_attr.device_cap_flags;
  a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
  // Extended CQs can stamp completions (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP): a 64-bit ns clock.
  a.completion_timestamp_mask = ~0ull;
  a.hca_core_clock = sv::verbs::kHcaCoreClockKhz;
  std::memset(attr, 0, size);
  std::memcpy(attr, &a, std::min(size, sizeof a));
  return 0;
}

int check_port(uint8_t port) {
  return port == 1 ? 0 : EINVAL;
}

}  // namespace

// ---- devices --------------------------------------------------------------------------

SV_EXPORT ibv_device** ibv_get_device_list(int* num) {
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = &the_device()->dev;
  if (num) *num = 1;
  return list;
}

SV_EXPORT void ibv_free_device_list(ibv_device** list) {
  free(list);
}

SV_EXPORT const char* ibv_get_device_name(ibv_device* dev) {
  return dev ? dev->name : nullptr;
}

SV_EXPORT __be64 ibv_get_device_guid(ibv_device* dev) {
  return htobe64(reinterpret_cast<Device*>(dev)->guid);
}

SV_EXPORT int ibv_get_device_index(ibv_device*) {
  return 0;
}

SV_EXPORT ibv_context* ibv_open_device(ibv_device* dev) {
  sv::engine::check_settings();  // once per process: a bad SOFTVERBS_* value is named
  if (!sv::engine::fault::plan_ok()) {
    // A malformed SOFTVERBS_FAULT (named on stderr): a test run under "faults" that are not
    // there would prove nothing, so the device does not open.
    errno = EINVAL;
    return nullptr;
  }
  auto* c = new (std::nothrow) Context();
  if (!c) {
    errno = ENOMEM;
    return nullptr;
  }
  std::memset(&c->vctx, 0, sizeof c->vctx);
  c->device = reinterpret_cast<Device*>(dev);
  refresh_gids(c->device);
  if (c->async.open() < 0) {
    delete c;
    return nullptr;
  }
  ibv_context& ctx = c->vctx.context;
  ctx.device = dev;
  // A real descriptor, as a provider's uverbs fd is: programs dup() it to share the context
  // (rdma-core's test_shared_pd), and ibv_import_device then answers EOPNOTSUPP.
  ctx.cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ctx.async_fd = c->async.fd();
  ctx.num_comp_vectors = 1;
  pthread_mutex_init(&ctx.mutex, nullptr);
  ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
  ctx.ops.poll_cq = op_poll_cq;
  ctx.ops.req_notify_cq = op_req_notify_cq;
  ctx.ops.post_send = op_post_send;
  ctx.ops.post_recv = op_post_recv;
  ctx.ops.post_srq_recv = op_post_srq_recv;
  ctx.ops.alloc_mw = sv::verbs::alloc_mw;
  ctx.ops.bind_mw = sv::verbs::bind_mw;
  ctx.ops.dealloc_mw = sv::verbs::dealloc_mw;
  c->vctx.sz = sizeof(verbs_context);
  c->vctx.query_port = op_query_port;
  c->vctx.query_device_ex = op_query_device_ex;
  c->vctx.create_cq_ex = sv::verbs::create_cq_ex;
  c->vctx.create_qp_ex = sv::verbs::create_qp_ex;
  c->vctx.query_rt_values = sv::verbs::query_rt_values;
  handle_add(HKind::context, &ctx, &ctx);
  return &ctx;
}

SV_EXPORT int ibv_close_device(ibv_context* ctx) {
  if (!handle_remove(HKind::context, ctx)) return EINVAL;
  Context* c = Context::from(ctx);
  c->async.close_fd();
  if (ctx->cmd_fd >= 0) close(ctx->cmd_fd);
  pthread_mutex_destroy(&ctx->mutex);
  delete c;
  return 0;
}

SV_EXPORT int ibv_query_device(ibv_context* ctx, ibv_device_attr* attr) {
  if (!ctx || !attr) return EINVAL;
  fill_device_attr(Context::from(ctx)->device, attr);
  return 0;
}

#undef ibv_query_port
SV_EXPORT int ibv_query_port(ibv_context* ctx, uint8_t port, _compat_ibv_port_attr* attr) {
  // Old entry point for binaries built before the size-aware verbs_context op.
  // _compat_ibv_port_attr is only declared; its layout is ibv_port_attr up to link_layer.
  return op_query_port(ctx, port, reinterpret_cast<ibv_port_attr*>(attr),
                       offsetof(ibv_port_attr, flags));
}

SV_EXPORT int ibv_query_gid(ibv_context* ctx, uint8_t port, int index, ibv_gid* gid) {
  Device* d = Context::from(ctx)->device;
  if (check_port(port) || index < 0) {
    errno = EINVAL;
    return -1;
  }
  if (static_cast<size_t>(index) >= d->gids.size()) {
    errno = EINVAL;
    return -1;
  }
  *gid = d->gids[index];
  return 0;
}

SV_EXPORT int ibv_query_pkey(ibv_context*, uint8_t port, int index, __be16* pkey) {
  if (check_port(port) || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(kPkey);
  return 0;
}

SV_EXPORT int ibv_get_pkey_index(ibv_context*, uint8_t port, __be16 pkey) {
  if (check_port(port) || be16toh(pkey) != kPkey) {
    errno = ENOENT;
    return -1;
  }
  return 0;
}

static void fill_gid_entry(Device* d, uint32_t i, ibv_gid_entry* e) {
  std::memset(e, 0, sizeof *e);
  e->gid = d->gids[i];
  e->gid_index = i;
  e->port_num = 1;
  e->gid_type = IBV_GID_TYPE_ROCE_V2;
  e->ndev_ifindex = 0;
}

SV_EXPORT int _ibv_query_gid_ex(ibv_context* ctx, uint32_t port, uint32_t index,
                                ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  Device* d = Context::from(ctx)->device;
  if (port != 1 || flags || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  if (index >= d->gids.size()) return ENODATA;
  fill_gid_entry(d, index, entry);
  return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(ibv_context* ctx, ibv_gid_entry* entries, size_t max_entries,
                                       uint32_t flags, size_t entry_size) {
  Device* d = Context::from(ctx)->device;
  if (flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  if (max_entries < d->gids.size()) return -EINVAL;
  for (uint32_t i = 0; i < d->gids.size(); ++i)
    fill_gid_entry(
        d, i, reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size));
  return static_cast<ssize_t>(d->gids.size());
}

// enum ibv_gid_type_sysfs (driver.h, not installed): 0 = IB/RoCE v1, 1 = RoCE v2.
SV_EXPORT int ibv_query_gid_type(ibv_context* ctx, uint8_t port, unsigned int index, int* type) {
  Device* d = Context::from(ctx)->device;
  if (port != 1 || index >= d->gids.size()) {
    errno = EINVAL;
    return -1;
  }
  *type = 1;
  return 0;
}

// ---- protection domains and memory regions --------------------------------------------

SV_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (!handle_ok(HKind::context, ctx)) {
    errno = EINVAL;
    return nullptr;
  }
  if (!limit_take(Limit::pd)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* pd = new (std::nothrow) Pd();
  if (!pd) {
    limit_give(Limit::pd);
    errno = ENOMEM;
    return nullptr;
  }
  pd->pd.context = ctx;
  handle_add(HKind::pd, &pd->pd, ctx);
  return &pd->pd;
}

SV_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (const int e = handle_check(HKind::pd, pd)) return errno = e;
  auto* p = reinterpret_cast<Pd*>(pd);
  if (p->users.load()) return errno = EBUSY;  // as the kernel (errno too, as the write() sets it)
  if (const int e = handle_take(HKind::pd, pd)) return errno = e;
  delete p;
  limit_give(Limit::pd);
  return 0;
}

namespace {
constexpr int kMrAllowed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND |
                           IBV_ACCESS_ZERO_BASED | IBV_ACCESS_HUGETLB;

int check_mr_access(int access) {
  access &= ~IBV_ACCESS_OPTIONAL_RANGE;  // best-effort bits (RELAXED_ORDERING): ignored
  if (access & IBV_ACCESS_ON_DEMAND) return EOPNOTSUPP;
  if (access & ~kMrAllowed) return EINVAL;
  // IB spec 10.6.3.1: remote write/atomic require local write.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}
}  // namespace

SV_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                   unsigned int access) {
  if (const int e = handle_check(HKind::pd, pd)) {
    errno = e;
    return nullptr;
  }
  if ((!addr && length) || length == 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (int e = check_mr_access(static_cast<int>(access))) {
    errno = e;
    return nullptr;
  }
  if (!limit_take(Limit::mr)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* mr = new (std::nothrow) Mr();
  if (!mr) {
    limit_give(Limit::mr);
    errno = ENOMEM;
    return nullptr;
  }
  mr->pd = reinterpret_cast<Pd*>(pd);
  mr->access = static_cast<int>(access) & kMrAllowed;
  mr->iova = (access & IBV_ACCESS_ZERO_BASED) ? 0 : iova;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  if (!KeyTable::get().add(mr)) {
    delete mr;
    limit_give(Limit::mr);
    errno = ENOMEM;
    return nullptr;
  }
  ++mr->pd->users;
  handle_add(HKind::mr, &mr->mr, pd->context);
  return &mr->mr;
}

#undef ibv_reg_mr
SV_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned>(access));
}

#undef ibv_reg_mr_iova
SV_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                  int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

SV_EXPORT int ibv_dereg_mr(ibv_mr* ibmr) {
  if (const int e = handle_check(HKind::mr, ibmr)) return e;
  auto* mr = reinterpret_cast<Mr*>(ibmr);
  // Windows still bound to the region keep it (IBA 10.6.7.2.6; rxe answers EINVAL).
  if (!KeyTable::get().remove(mr)) return errno = EINVAL;
  handle_remove(HKind::mr, ibmr);
  --mr->pd->users;
  delete mr;
  limit_give(Limit::mr);
  return 0;
}

// rdma-core's ibv_rereg_mr: its own input checks fail with IBV_REREG_MR_ERR_INPUT, what the
// kernel refuses with IBV_REREG_MR_ERR_CMD, errno set either way. CHANGE_PD and CHANGE_ACCESS
// keep the keys (rxe changes the region in place; a peer's rkey goes on working); a new
// translation gets new keys, as after a fresh registration.
SV_EXPORT int ibv_rereg_mr(ibv_mr* ibmr, int flags, ibv_pd* pd, void* addr, size_t length,
                           int access) {
  auto input_error = [] {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  };
  auto cmd_error = [](int e) {
    errno = e;
    return IBV_REREG_MR_ERR_CMD;
  };
  if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) return input_error();
  if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!addr || !length)) return input_error();
  if (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS)) return input_error();
  if (!flags) return cmd_error(EINVAL);  // uverbs: nothing to change is EINVAL
  // Then the kernel looks the region up (ib_uverbs_rereg_mr: uobj_get_write).
  if (const int e = handle_check(HKind::mr, ibmr)) return cmd_error(e);
  auto* mr = reinterpret_cast<Mr*>(ibmr);
  if ((flags & IBV_REREG_MR_CHANGE_ACCESS))
    if (int e = check_mr_access(access)) return cmd_error(e);
  if (flags & IBV_REREG_MR_CHANGE_PD)
    if (const int e = handle_check(HKind::pd, pd, ibmr->context)) return cmd_error(e);
  Pd* new_pd = (flags & IBV_REREG_MR_CHANGE_PD) ? reinterpret_cast<Pd*>(pd) : mr->pd;
  const int new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access & kMrAllowed : mr->access;
  auto& kt = KeyTable::get();
  // A bound window views this memory in this PD: neither may change under it.
  if ((flags & (IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD)) && kt.has_windows(mr))
    return cmd_error(EINVAL);
  if (new_pd != mr->pd) {
    ++new_pd->users;
    --mr->pd->users;
    mr->mr.pd = pd;
  }
  if (!(flags & IBV_REREG_MR_CHANGE_TRANSLATION)) {
    kt.change(mr, new_pd, new_access);
    return 0;
  }
  (void)kt.remove(mr);  // no windows: checked above
  mr->pd = new_pd;
  mr->access = new_access;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->iova = reinterpret_cast<uintptr_t>(addr);
  if (!kt.add(mr)) return cmd_error(ENOMEM);
  return 0;
}

// ---- completion channels and CQs --------------------------------------------------------

SV_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  if (!handle_ok(HKind::context, ctx)) {
    errno = EINVAL;
    return nullptr;
  }
  auto* ch = new (std::nothrow) CompChannel();
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  if (ch->events.open() < 0) {
    delete ch;
    return nullptr;
  }
  ch->ch.context = ctx;
  ch->ch.fd = ch->events.fd();
  ch->ch.refcnt = 0;
  handle_add(HKind::channel, &ch->ch, ctx);
  return &ch->ch;
}

SV_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!handle_ok(HKind::channel, channel)) return EINVAL;
  auto* ch = reinterpret_cast<CompChannel*>(channel);
  if (ch->ch.refcnt) return EBUSY;
  // Taken once: of two destroys racing, one frees (the other finds no handle).
  if (!handle_remove(HKind::channel, channel)) return EINVAL;
  ch->events.close_fd();
  channel_put(ch);
  return 0;
}

namespace sv::verbs {
Cq* cq_new(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel,
           int comp_vector) {
  if (!handle_ok(HKind::context, ctx) || (channel && !handle_ok(HKind::channel, channel, ctx)) ||
      cqe < 1 || cqe > kMaxCqe || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  if (!limit_take(Limit::cq)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* cq = new (std::nothrow) Cq();
  if (!cq) {
    limit_give(Limit::cq);
    errno = ENOMEM;
    return nullptr;
  }
  cq->ctx = Context::from(ctx);
  cq->channel = reinterpret_cast<CompChannel*>(channel);
  cq->cqe = cqe;
  cq->ring.allocate(static_cast<size_t>(cqe) + 1);
  ibv_cq* c = cq->ibcq();
  c->context = ctx;
  c->channel = channel;
  c->cq_context = cq_context;
  c->cqe = cqe;
  pthread_mutex_init(&c->mutex, nullptr);
  pthread_cond_init(&c->cond, nullptr);
  if (channel) {
    ++channel->refcnt;
    channel_cq_add(cq->channel, cq);
  }
  return cq;
}
}  // namespace sv::verbs

SV_EXPORT ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context,
                                ibv_comp_channel* channel, int comp_vector) {
  Cq* cq = sv::verbs::cq_new(ctx, cqe, cq_context, channel, comp_vector);
  if (!cq) return nullptr;
  handle_add(HKind::cq, cq->ibcq(), ctx);
  return cq->ibcq();
}

SV_EXPORT int softverbs_cq_set_comp_handler(ibv_cq* ibcq, bool (*handler)(ibv_cq*, void*),
                                            void* arg) {
  if (!handle_ok(HKind::cq, ibcq) || !ibcq->channel) return EINVAL;
  Cq::from(ibcq)->set_comp_handler(handler, arg);
  return 0;
}

SV_EXPORT int softverbs_cq_busy_poll(ibv_cq* ibcq, int on) {
  if (!handle_ok(HKind::cq, ibcq)) return EINVAL;
  if (on)
    cq_busy_poll_mark(Cq::from(ibcq));
  else
    cq_busy_poll_end(Cq::from(ibcq));
  return 0;
}

SV_EXPORT int softverbs_cq_quiet(ibv_cq* ibcq, int on) {
  if (!handle_ok(HKind::cq, ibcq) || on < 0 || on > 1 || (!on && tl_quiet != Cq::from(ibcq))) {
    errno = EINVAL;
    return -1;
  }
  if (!on) {
    tl_quiet = nullptr;
    // Those the caller has not polled already: a consumer that drained the CQ during its
    // quiet spell (RDS's busy poller does) then does not poll again, an empty poll that
    // would drive the receive path once more for nothing.
    return std::min(tl_quiet_made, static_cast<int>(Cq::from(ibcq)->pending()));
  }
  if (tl_quiet) {  // one CQ at a time
    errno = EBUSY;
    return -1;
  }
  tl_quiet = Cq::from(ibcq);
  tl_quiet_made = 0;
  return 0;
}

SV_EXPORT long softverbs_srq_trim(ibv_srq* srq) {
  if (!handle_ok(HKind::srq, srq)) {
    errno = EINVAL;
    return -1;
  }
  return static_cast<long>(srq_trim(reinterpret_cast<Srq*>(srq)));
}

SV_EXPORT int softverbs_cq_block(ibv_cq* ibcq, int on) {
  if (!handle_ok(HKind::cq, ibcq) || on < 0 || on > 1) return EINVAL;
  if (on) {
    // A thread about to sleep posts no answer: what waits for one (a Placement Ack held for
    // it, doorbell-batched posts) leaves now.
    flush_deferred_tx(Cq::from(ibcq));
    cq_block_begin(Cq::from(ibcq));
  } else {
    cq_block_end(Cq::from(ibcq));
  }
  return 0;
}

SV_EXPORT int softverbs_cq_wait_fd(ibv_cq* ibcq) {
  if (!handle_ok(HKind::cq, ibcq)) {
    errno = EINVAL;
    return -1;
  }
  return cq_wait_fd(Cq::from(ibcq));
}

SV_EXPORT int softverbs_qp_set_ib_completion(ibv_qp* ibqp, int on) {
  if (!handle_ok(HKind::qp, ibqp) || on < -1 || on > 1) return EINVAL;
  Qp::from(ibqp)->ib_completion_pref.store(on);
  return 0;
}

SV_EXPORT int softverbs_qp_inject_fault(ibv_qp* ibqp, const char* fault) {
  if (!handle_ok(HKind::qp, ibqp)) return EINVAL;
  return qp_inject_fault(Qp::from(ibqp), fault);
}

SV_EXPORT int softverbs_qp_ib_completion(ibv_qp* ibqp) {
  if (!handle_ok(HKind::qp, ibqp)) {
    errno = EINVAL;
    return -1;
  }
  return qp_ib_completion_in_effect(Qp::from(ibqp)) ? 1 : 0;
}

SV_EXPORT int ibv_destroy_cq(ibv_cq* ibcq) {
  if (const int e = handle_check(HKind::cq, ibcq)) return e;
  Cq* cq = Cq::from(ibcq);
  if (cq->nqps.load()) return EBUSY;
  if (const int e = handle_take(HKind::cq, ibcq)) return e;
  // A notification the progress thread deferred must not outlive the CQ.
  if (cq->comp_handler) Progress::get().run_sync([cq] { Progress::get().forget_cq(cq); });
  if (cq->channel) {
    channel_cq_remove(cq->channel, cq);
    // As uverbs' destroy (ib_uverbs_release_ucq): the CQ's events still queued go with it,
    // so no ibv_get_cq_event returns a freed CQ; those already returned must be acked first
    // (libibverbs' ibv_cmd_destroy_cq waits for comp_events_completed to reach the kernel's
    // comp_events_reported).
    cq->channel->events.take_if([ibcq](ibv_cq* c) { return c == ibcq; });
    const uint32_t reported = cq->comp_events_reported.load();
    pthread_mutex_lock(&ibcq->mutex);
    while (ibcq->comp_events_completed != reported) pthread_cond_wait(&ibcq->cond, &ibcq->mutex);
    pthread_mutex_unlock(&ibcq->mutex);
  }
  if (ibcq->channel) --ibcq->channel->refcnt;
  if (const int fd = cq->wait_epfd.load(); fd >= 0) close(fd);  // no QP is attached any more
  if (const int fd = cq->kick_fd.load(); fd >= 0) close(fd);
  pthread_mutex_destroy(&ibcq->mutex);
  pthread_cond_destroy(&ibcq->cond);
  delete cq;
  limit_give(Limit::cq);
  return 0;
}

SV_EXPORT int ibv_resize_cq(ibv_cq* ibcq, int cqe) {
  if (const int e = handle_check(HKind::cq, ibcq)) return e;
  if (cqe < 1 || cqe > kMaxCqe) return EINVAL;
  return Cq::from(ibcq)->resize(cqe);
}

SV_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  ibv_cq* p = nullptr;
  auto* ch = reinterpret_cast<CompChannel*>(channel);
  ch->refs.fetch_add(1);
  struct Put {  // on return, and on a cancel's unwinding
    CompChannel* ch;
    ~Put() { channel_put(ch); }
  } put{ch};
  // The sleep owns the channel's CQs' receive paths (engine/busy_poll.h channel_block).
  if (channel_block(ch) ||
      ch->events.pop(p, [](ibv_cq* c) { Cq::from(c)->comp_events_reported.fetch_add(1); }))
    return -1;
  *cq = p;
  *cq_context = p->cq_context;
  return 0;
}

SV_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_broadcast(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

// ---- QPs ------------------------------------------------------------------------------

namespace sv::verbs {
ibv_qp* qp_new(ibv_pd* pd, ibv_qp_init_attr* init) {
  // The PD, both CQs and the SRQ must be live objects of one context (the kernel looks up
  // each handle: QP_CREATE's attributes).
  int e = handle_check(HKind::pd, pd);
  if (!e && !init) e = EINVAL;
  if (!e && init->send_cq) e = handle_check(HKind::cq, init->send_cq, pd->context);
  if (!e && init->recv_cq) e = handle_check(HKind::cq, init->recv_cq, pd->context);
  if (!e && init->srq) e = handle_check(HKind::srq, init->srq, pd->context);
  if (e) {
    errno = e;
    return nullptr;
  }
  if (!limit_take(Limit::qp)) {
    errno = ENOMEM;
    return nullptr;
  }
  int err = 0;
  Qp* qp = qp_create(Context::from(pd->context), reinterpret_cast<Pd*>(pd), init, &err);
  if (!qp) {
    limit_give(Limit::qp);
    errno = err;
    return nullptr;
  }
  init->cap = qp->cap;
  ++qp->pd->users;
  handle_add(HKind::qp, qp->ibqp(), pd->context);
  return qp->ibqp();
}
}  // namespace sv::verbs

SV_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
  return sv::verbs::qp_new(pd, init);
}

SV_EXPORT int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) {
  if (const int e = handle_check(HKind::qp, qp)) return e;
  if (!attr) return EINVAL;
  return qp_query(Qp::from(qp), attr, mask, init);
}

SV_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (const int e = handle_check(HKind::qp, qp)) return e;
  return qp_modify(Qp::from(qp), attr, mask);
}

SV_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  // A QP attached to multicast groups is in use: EBUSY (the kernel's qp->usecnt).
  if (handle_ok(HKind::qp, qp) && Qp::from(qp)->mcast_groups.load()) return EBUSY;
  if (const int e = handle_take(HKind::qp, qp)) return e;
  Pd* pd = Qp::from(qp)->pd;
  qp_destroy(Qp::from(qp));  // cannot fail once the handle is taken
  --pd->users;
  limit_give(Limit::qp);
  return 0;
}

SV_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  // As libibverbs: the extended QP of one created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, else
  // NULL.
  if (!handle_ok(HKind::qp, qp) || !Qp::from(qp)->wr_batch) return nullptr;
  return &Qp::from(qp)->qpx;
}

SV_EXPORT int ibv_query_qp_data_in_order(ibv_qp*, enum ibv_wr_opcode, uint32_t) {
  // TCP delivers in order and we place in order, but we make no promise about visibility
  // order of bytes inside one message to CPUs polling memory.
  return 0;
}

// ---- SRQs -----------------------------------------------------------------------------

SV_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* init) {
  if (const int e = handle_check(HKind::pd, pd)) {
    errno = e;
    return nullptr;
  }
  if (!init || init->attr.max_wr == 0 || init->attr.max_wr > static_cast<uint32_t>(kMaxSrqWr) ||
      init->attr.max_sge > static_cast<uint32_t>(kMaxSge) ||
      init->attr.srq_limit > init->attr.max_wr) {
    errno = EINVAL;
    return nullptr;
  }
  if (!limit_take(Limit::srq)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* s = new (std::nothrow) Srq();
  if (!s) {
    limit_give(Limit::srq);
    errno = ENOMEM;
    return nullptr;
  }
  s->ctx = Context::from(pd->context);
  s->pd = reinterpret_cast<Pd*>(pd);
  s->max_wr = init->attr.max_wr;
  s->max_sge = std::max<uint32_t>(init->attr.max_sge, 1);
  s->limit = init->attr.srq_limit;
  s->ring.resize(s->max_wr);
  s->sge.resize(static_cast<size_t>(s->max_wr) * s->max_sge);
  for (uint32_t i = 0; i < s->max_wr; ++i) s->ring[i].sge = &s->sge[i * s->max_sge];
  s->srq.context = pd->context;
  s->srq.srq_context = init->srq_context;
  s->srq.pd = pd;
  pthread_mutex_init(&s->srq.mutex, nullptr);
  pthread_cond_init(&s->srq.cond, nullptr);
  init->attr.max_sge = s->max_sge;
  ++s->pd->users;
  handle_add(HKind::srq, &s->srq, pd->context);
  return &s->srq;
}

SV_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  auto* s = reinterpret_cast<Srq*>(srq);
  if (const int e = handle_check(HKind::srq, srq)) return e;
  if (!attr || (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))) return EINVAL;
  return srq_modify(s, attr, mask);
}

SV_EXPORT int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (const int e = handle_check(HKind::srq, srq)) return e;
  if (!attr) return EINVAL;
  srq_query(reinterpret_cast<Srq*>(srq), attr);
  return 0;
}

SV_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  if (const int e = handle_check(HKind::srq, srq)) return e;
  auto* s = reinterpret_cast<Srq*>(srq);
  if (srq_in_use(s)) return EBUSY;
  if (const int e = handle_take(HKind::srq, srq)) return e;
  pthread_mutex_lock(&srq->mutex);
  const uint32_t reported = s->events_reported;
  pthread_mutex_unlock(&srq->mutex);
  s->ctx->retire_async(srq, reported);
  pthread_mutex_destroy(&srq->mutex);
  pthread_cond_destroy(&srq->cond);
  --s->pd->users;
  delete s;
  limit_give(Limit::srq);
  return 0;
}

// ---- address handles (UD: engine/qp_ud.cc) -----------------------------------------------

SV_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (const int e = handle_check(HKind::pd, pd)) {
    errno = e;  // a RoCE port's AH is the kernel's (uverbs CREATE_AH looks the PD up)
    return nullptr;
  }
  if (!attr || attr->port_num != 1) {
    errno = EINVAL;
    return nullptr;
  }
  // An Ethernet (RoCE-style) port is addressed by GID only: an AH without a GRH, or naming a
  // source GID the port does not have, is EINVAL (the kernel's rdma_check_ah_attr). A GID
  // that names no IP address cannot be routed to (the kernel's neighbour resolution fails).
  sv::transport::SockAddr to;
  if (!attr->is_global || attr->grh.sgid_index >= Context::from(pd->context)->device->gids.size() ||
      !gid_to_addr(attr->grh.dgid, to)) {
    errno = EINVAL;
    return nullptr;
  }
  if (!limit_take(Limit::ah)) {
    errno = ENOMEM;
    return nullptr;
  }
  auto* ah = new (std::nothrow) Ah();
  if (!ah) {
    limit_give(Limit::ah);
    errno = ENOMEM;
    return nullptr;
  }
  ah->attr = *attr;
  ah->ah.context = pd->context;
  ah->ah.pd = pd;
  ++reinterpret_cast<Pd*>(pd)->users;
  handle_add(HKind::ah, &ah->ah, pd->context);
  return &ah->ah;
}

SV_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (const int e = handle_take(HKind::ah, ah)) return e;
  --reinterpret_cast<Pd*>(ah->pd)->users;
  delete Ah::from(ah);
  limit_give(Limit::ah);
  return 0;
}

// The AH that answers a UD receive (IBA 11.4.1.1 / rdma-core's ibv_init_ah_from_wc): the
// GRH's source GID becomes the destination, and its destination the source GID index.
SV_EXPORT int ibv_init_ah_from_wc(ibv_context* ctx, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                  ibv_ah_attr* ah_attr) {
  if (!ctx || !wc || !ah_attr || port_num != 1) {
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH) || !grh) {
    errno = EPROTONOSUPPORT;  // no GRH: an Ethernet port cannot answer it
    return -1;
  }
  sv::wire::Grh g;
  if (!sv::wire::decode_grh(reinterpret_cast<const std::byte*>(grh), g)) {
    errno = EPROTONOSUPPORT;
    return -1;
  }
  const Device* d = Context::from(ctx)->device;
  size_t idx = 0;
  while (idx < d->gids.size() && std::memcmp(d->gids[idx].raw, g.dgid, 16) != 0) ++idx;
  if (idx == d->gids.size()) {
    errno = ENOENT;  // rdma-core: the GID the message was sent to is not ours
    return -1;
  }
  ah_attr->is_global = 1;
  std::memcpy(ah_attr->grh.dgid.raw, g.sgid, 16);
  ah_attr->grh.sgid_index = static_cast<uint8_t>(idx);
  ah_attr->grh.flow_label = g.flow_label;
  ah_attr->grh.traffic_class = g.traffic_class;
  ah_attr->grh.hop_limit = 0xFF;
  return 0;
}

SV_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  ibv_ah_attr attr;
  if (!pd || ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

// Multicast over IP multicast (engine/qp_ud.cc). As ib_attach_mcast: UD QPs only, and a
// multicast GID (EINVAL otherwise); the LID is not checked, as on an Ethernet port.
SV_EXPORT int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (const int e = handle_check(HKind::qp, qp)) return e;
  if (!gid || qp->qp_type != IBV_QPT_UD) return EINVAL;
  return ud_attach_mcast(Qp::from(qp), *gid);
}
SV_EXPORT int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t) {
  if (const int e = handle_check(HKind::qp, qp)) return e;
  if (!gid || qp->qp_type != IBV_QPT_UD) return EINVAL;
  return ud_detach_mcast(Qp::from(qp), *gid);
}

// ---- async events ---------------------------------------------------------------------

SV_EXPORT int ibv_get_async_event(ibv_context* ctx, ibv_async_event* event) {
  return Context::from(ctx)->async.pop(*event);
}

SV_EXPORT void ibv_ack_async_event(ibv_async_event* event) {
  switch (event->event_type) {
    case IBV_EVENT_CQ_ERR: {
      ibv_cq* cq = event->element.cq;
      pthread_mutex_lock(&cq->mutex);
      ++cq->async_events_completed;
      pthread_cond_broadcast(&cq->cond);
      pthread_mutex_unlock(&cq->mutex);
      break;
    }
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED: {
      ibv_srq* srq = event->element.srq;
      pthread_mutex_lock(&srq->mutex);
      ++srq->events_completed;
      pthread_cond_broadcast(&srq->cond);
      pthread_mutex_unlock(&srq->mutex);
      break;
    }
    case IBV_EVENT_DEVICE_FATAL:
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      break;
    default: {
      ibv_qp* qp = event->element.qp;
      pthread_mutex_lock(&qp->mutex);
      ++qp->events_completed;
      pthread_cond_broadcast(&qp->cond);
      pthread_mutex_unlock(&qp->mutex);
      break;
    }
  }
}

// ---- fork -------------------------------------------------------------------

SV_EXPORT int ibv_fork_init(void) {
  return 0;
}
SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) {
  return IBV_FORK_UNNEEDED;
}
SV_EXPORT int ibv_dontfork_range(void*, size_t) {
  return 0;
}
SV_EXPORT int ibv_dofork_range(void*, size_t) {
  return 0;
}

SV_EXPORT int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t[6], uint16_t*) {
  return EOPNOTSUPP;  // no L2 below us: TCP picks the route
}

SV_EXPORT int ibv_query_ece(ibv_qp*, ibv_ece*) {
  return EOPNOTSUPP;
}
SV_EXPORT int ibv_set_ece(ibv_qp*, ibv_ece*) {
  return EOPNOTSUPP;
}
