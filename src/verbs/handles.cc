#include "verbs/handles.h"

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
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  return check_locked(t, k, h, ctx);
}

int handle_take(HKind k, const void* h) {
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  if (const int e = check_locked(t, k, h, nullptr)) return e;
  auto it = t.live.find(h);
  if (handle_field(k, const_cast<void*>(h))) t.by_handle.erase({it->second.ctx, it->second.handle});
  t.live.erase(it);
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
  return true;
}

}  // namespace sv::verbs
