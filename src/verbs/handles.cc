#include "verbs/handles.h"

#include <atomic>
#include <cerrno>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "util/fork_local.h"

namespace sv::verbs {

namespace {

struct Table {
  struct Entry {
    HKind kind;
    const ibv_context* ctx;
    uint32_t handle;
  };
  std::mutex mu;
  std::unordered_map<const void*, Entry> live;  // by address
  std::map<std::pair<const ibv_context*, uint32_t>, const void*> by_handle;
  std::unordered_map<const ibv_context*, uint32_t> next;  // per context, from 0
};

// A forked child starts with none: its parent's objects are not its own (fork_local.h).
ForkLocal<Table> g_table;

// Objects of each kind forgotten so far (handle_take, handle_remove): bumped under Table::mu.
// A check of kind k that passed while k's count had some value still passes while it has it,
// as long as the object's handle field is unchanged: nothing else about a live entry ever
// changes, and only the removal of an entry of kind k can end one (an MR's address reused
// by a new CQ was an MR's, not a CQ's). Per kind: RDS deregisters a region per RDMA op.
constexpr size_t kKinds = static_cast<size_t>(HKind::channel) + 1;
std::atomic<uint64_t> g_removals[kKinds];

// The checks that passed last on this thread. RDS's busy poller makes its softverbs_cq_busy_poll
// and softverbs_cq_quiet calls ~19 times per message on one CQ, and each full check took the
// table's mutex and two lookups: 3.1M of them in 4 s of a busy-polled RDS ping-pong.
struct Passed {
  const void* h = nullptr;
  const ibv_context* ctx = nullptr;
  uint64_t removals = 0;
  unsigned forks = 0;  // fork_detail::g_generation: a child re-checks (its table is empty)
  uint32_t handle = 0;
  HKind kind = HKind::context;
};
constexpr int kPassed = 4;
thread_local Passed tl_passed[kPassed];
thread_local int tl_next_passed = 0;

uint32_t* handle_field(HKind k, void* h);

bool passed_before(HKind k, const void* h, const ibv_context* ctx) {
  const uint64_t removals = g_removals[static_cast<size_t>(k)].load(std::memory_order_acquire);
  const unsigned forks = fork_detail::g_generation.load(std::memory_order_relaxed);
  for (const Passed& p : tl_passed) {
    if (p.h != h || p.kind != k || p.ctx != ctx || p.removals != removals || p.forks != forks)
      continue;
    const uint32_t* f = handle_field(k, const_cast<void*>(h));
    return !f || *f == p.handle;
  }
  return false;
}

// The object's own handle field, or null for the kinds that have none.
uint32_t* handle_field(HKind k, void* h) {
  switch (k) {
    case HKind::pd:
      return &static_cast<ibv_pd*>(h)->handle;
    case HKind::mr:
      return &static_cast<ibv_mr*>(h)->handle;
    case HKind::mw:
      return &static_cast<ibv_mw*>(h)->handle;
    case HKind::cq:  // an extended CQ too: ibv_cq_ex begins with ibv_cq's members
      return &static_cast<ibv_cq*>(h)->handle;
    case HKind::qp:
      return &static_cast<ibv_qp*>(h)->handle;
    case HKind::srq:
      return &static_cast<ibv_srq*>(h)->handle;
    case HKind::ah:
      return &static_cast<ibv_ah*>(h)->handle;
    case HKind::context:
    case HKind::channel:
      return nullptr;
  }
  return nullptr;
}

int check_locked(Table& t, HKind k, const void* h, const ibv_context* ctx) {
  if (!h) return EINVAL;
  const bool has_handle = k != HKind::context && k != HKind::channel;
  auto it = t.live.find(h);
  // An address we never handed out (or took back): the handle it holds names nothing.
  if (it == t.live.end()) return has_handle ? ENOENT : EINVAL;
  const Table::Entry& e = it->second;
  if (e.kind != k || (ctx && e.ctx != ctx)) return EINVAL;
  const uint32_t* f = handle_field(k, const_cast<void*>(h));
  if (!f || *f == e.handle) return 0;
  // The caller rewrote the handle: what does the number name in this context?
  auto named = t.by_handle.find({e.ctx, *f});
  return named == t.by_handle.end() ? ENOENT : EINVAL;
}

}  // namespace

void handle_add(HKind k, void* h, const ibv_context* ctx) {
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  uint32_t handle = 0;
  if (uint32_t* f = handle_field(k, h)) {
    handle = t.next[ctx]++;
    *f = handle;
    t.by_handle[{ctx, handle}] = h;
  }
  t.live[h] = {k, ctx, handle};
}

int handle_check(HKind k, const void* h, const ibv_context* ctx) {
  if (h && passed_before(k, h, ctx)) return 0;
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  const int e = check_locked(t, k, h, ctx);
  if (e == 0) {
    const uint32_t* f = handle_field(k, const_cast<void*>(h));
    tl_passed[tl_next_passed] = {h,
                                 ctx,
                                 g_removals[static_cast<size_t>(k)].load(std::memory_order_relaxed),
                                 fork_detail::g_generation.load(std::memory_order_relaxed),
                                 f ? *f : 0u,
                                 k};
    tl_next_passed = (tl_next_passed + 1) % kPassed;
  }
  return e;
}

int handle_take(HKind k, const void* h) {
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  if (const int e = check_locked(t, k, h, nullptr)) return e;
  auto it = t.live.find(h);
  if (handle_field(k, const_cast<void*>(h))) t.by_handle.erase({it->second.ctx, it->second.handle});
  t.live.erase(it);
  g_removals[static_cast<size_t>(k)].fetch_add(1, std::memory_order_release);
  return 0;
}

bool handle_remove(HKind k, const void* h) {
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  auto it = t.live.find(h);
  if (it == t.live.end() || it->second.kind != k) return false;
  if (handle_field(k, const_cast<void*>(h))) t.by_handle.erase({it->second.ctx, it->second.handle});
  if (k == HKind::context) t.next.erase(static_cast<const ibv_context*>(h));
  t.live.erase(it);
  g_removals[static_cast<size_t>(k)].fetch_add(1, std::memory_order_release);
  return true;
}

}  // namespace sv::verbs
