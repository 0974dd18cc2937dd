// fork() support for process-wide library state.
//
// After fork() only the forking thread exists in the child (POSIX): our progress and engine
// threads are gone, any lock they held stays held, and the sockets, epoll set and listeners
// are shared with the parent. So the child never touches what the parent built: every piece
// of process-wide state is a ForkLocal, which the child rebuilds on first use, and modules
// register a hook that lets go of the parent's descriptors in the child (a TCP socket the
// child kept open would keep the parent's connection alive after the parent closed it).
// This is rdma-core's rule too: a child may not use RDMA resources its parent created, but
// it may open the device and create its own.
//
// Header-only: each library (libibverbs, librdmacm, libsvrds) keeps its own hook table.
#pragma once
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <new>

namespace sv {

namespace fork_detail {
struct Hook {
  void (*fn)(void*);
  void* arg;
  bool rebuild;  // a ForkLocal's reset: runs after every release hook
};
inline constexpr int kMaxHooks = 32;
inline Hook g_hooks[kMaxHooks];
inline std::atomic<int> g_nhooks{0};
inline std::atomic<unsigned> g_generation{0};

inline void run_child_hooks() {
  g_generation.fetch_add(1, std::memory_order_relaxed);
  // Release hooks first (they still see the parent's state through ForkLocal::peek), in
  // registration order; then every ForkLocal forgets its instance.
  const int n = g_nhooks.load(std::memory_order_acquire);
  for (bool rebuild : {false, true})
    for (int i = 0; i < n; ++i)
      if (g_hooks[i].rebuild == rebuild) g_hooks[i].fn(g_hooks[i].arg);
}

inline void add_hook(void (*fn)(void*), void* arg, bool rebuild) {
  static std::mutex mu;  // registration is rare; fork never happens while it is held by us
  static const int registered = pthread_atfork(nullptr, nullptr, run_child_hooks);
  (void)registered;
  std::lock_guard lk(mu);
  const int i = g_nhooks.load(std::memory_order_relaxed);
  if (i >= kMaxHooks) return;  // a fixed, small number of modules register
  g_hooks[i] = {fn, arg, rebuild};
  g_nhooks.store(i + 1, std::memory_order_release);
}
}  // namespace fork_detail

// Runs fn(arg) in every child this process forks, before fork() returns there: let go of
// the parent's descriptors (the instance is still reachable with ForkLocal::peek).
inline void on_fork_child(void (*fn)(void*), void* arg) {
  fork_detail::add_hook(fn, arg, false);
}

// How many forks separate this process from the one that loaded the library.
inline unsigned fork_generation() {
  return fork_detail::g_generation.load(std::memory_order_relaxed);
}

// A lazily built, never destroyed singleton that a forked child rebuilds from scratch.
// The parent's instance is leaked in the child: its locks may be held by threads that no
// longer exist. `release`, if given, runs on it in the child first, to close descriptors
// (it must take no lock of the instance). T's constructor must not call get() on the same
// ForkLocal.
template <class T>
class ForkLocal {
 public:
  constexpr ForkLocal() = default;
  constexpr explicit ForkLocal(void (*release)(T&)) : release_(release) {}
  ForkLocal(const ForkLocal&) = delete;
  ForkLocal& operator=(const ForkLocal&) = delete;

  T& get() {
    if (T* p = ptr_.load(std::memory_order_acquire)) return *p;
    std::lock_guard lk(mu_);
    if (T* p = ptr_.load(std::memory_order_relaxed)) return *p;
    if (!registered_) {
      if (release_) on_fork_child(&ForkLocal::release, this);
      fork_detail::add_hook(&ForkLocal::reset, this, true);
      registered_ = true;
    }
    T* p = new T();
    ptr_.store(p, std::memory_order_release);
    return *p;
  }
  // The instance if one was built (in this process, since the last fork), else null.
  T* peek() const { return ptr_.load(std::memory_order_acquire); }

 private:
  static void release(void* self) {
    auto* s = static_cast<ForkLocal*>(self);
    if (T* p = s->ptr_.load(std::memory_order_relaxed)) s->release_(*p);
  }
  static void reset(void* self) {
    auto* s = static_cast<ForkLocal*>(self);
    s->ptr_.store(nullptr, std::memory_order_relaxed);
    new (&s->mu_) std::mutex();  // a thread of the parent may have held it at fork
  }
  void (*release_)(T&) = nullptr;
  std::atomic<T*> ptr_{nullptr};
  std::mutex mu_;
  bool registered_ = false;
};

}  // namespace sv
