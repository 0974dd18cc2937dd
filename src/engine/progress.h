// The per-process progress thread: one epoll set for listeners, connection set-up and
// established QP sockets, plus a command queue (eventfd) and timers.
//
// Every epoll registration change and every handler destruction runs on this thread
// (post/run_sync), so a handler is never freed while an event for it is being dispatched.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace sv {
template <class T>
class ForkLocal;
}

namespace sv::engine {

struct Cq;

class Progress {
 public:
  struct Handler {
    virtual ~Handler() = default;
    virtual void on_event(uint32_t events) = 0;
  };

  static Progress& get();
  // fork(): in the child, close the parent's engine sockets (util/fork_local.h).
  static void release_after_fork(Progress& p);
  bool on_thread() const { return std::this_thread::get_id() == tid_; }

  // Registration helpers: must run on the progress thread.
  void add(int fd, uint32_t events, Handler* h);
  void mod(int fd, uint32_t events, Handler* h);
  void del(int fd);

  // Runs fn on the progress thread soon (never inline).
  void post(std::function<void()> fn);
  // Runs fn on the progress thread and waits; inline when already on it.
  void run_sync(std::function<void()> fn);
  // A CQ notification raised on this thread: its handler runs once the current event or
  // command is done, with no engine lock held (progress thread only).
  void defer_cq(Cq* cq);
  // The CQ is being destroyed: drop a deferred notification of it (progress thread only).
  void forget_cq(Cq* cq);
  // Runs fn on the progress thread after `delay` (microsecond resolution: epoll_pwait2).
  void post_after(std::chrono::microseconds delay, std::function<void()> fn);

 private:
  friend class sv::ForkLocal<Progress>;
  Progress();
  void loop();
  void wake();
  void run_deferred_cqs();

  int epfd_ = -1;
  int evfd_ = -1;
  std::thread thread_;
  std::thread::id tid_;
  std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> timers_;
  std::vector<Cq*> due_cqs_;  // progress thread only
};

}  // namespace sv::engine
