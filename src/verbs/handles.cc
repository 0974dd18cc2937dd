#include "verbs/handles.h"

#include <mutex>
#include <unordered_map>

#include "util/fork_local.h"

namespace sv::verbs {

namespace {

struct Table {
  struct Entry {
    HKind kind;
    const ibv_context* ctx;
  };
  std::mutex mu;
  std::unordered_map<const void*, Entry> live;
};

// A forked child starts with none: its parent's objects are not its own (fork_local.h).
ForkLocal<Table> g_table;

}  // namespace

void handle_add(HKind k, const void* h, const ibv_context* ctx) {
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  t.live[h] = {k, ctx};
}

bool handle_ok(HKind k, const void* h, const ibv_context* ctx) {
  if (!h) return false;
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  auto it = t.live.find(h);
  return it != t.live.end() && it->second.kind == k && (!ctx || it->second.ctx == ctx);
}

bool handle_remove(HKind k, const void* h) {
  Table& t = g_table.get();
  std::lock_guard lk(t.mu);
  auto it = t.live.find(h);
  if (it == t.live.end() || it->second.kind != k) return false;
  t.live.erase(it);
  return true;
}

}  // namespace sv::verbs
