#include "engine/progress.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <future>

#include "engine/log.h"

namespace sv::engine {

Progress& Progress::get() {
  // Leaked on purpose: the thread runs until the process exits, and static destructors
  // must not tear down state it is using.
  static Progress* p = new Progress();
  return *p;
}

Progress::Progress() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  evfd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, evfd_, &ev);
  std::promise<std::thread::id> started;
  auto f = started.get_future();
  thread_ = std::thread([this, &started] {
    started.set_value(std::this_thread::get_id());
    loop();
  });
  tid_ = f.get();
  thread_.detach();
}

void Progress::add(int fd, uint32_t events, Handler* h) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = h;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) < 0) SV_DBG("epoll add fd %d: errno %d", fd, errno);
}

void Progress::mod(int fd, uint32_t events, Handler* h) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = h;
  epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void Progress::del(int fd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

void Progress::wake() {
  uint64_t one = 1;
  ssize_t r = write(evfd_, &one, sizeof one);
  (void)r;
}

void Progress::post(std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(fn));
  }
  wake();
}

void Progress::run_sync(std::function<void()> fn) {
  if (on_thread()) {
    fn();
    return;
  }
  std::promise<void> done;
  auto f = done.get_future();
  post([&] {
    fn();
    done.set_value();
  });
  f.wait();
}

void Progress::post_after(std::chrono::milliseconds delay, std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    timers_.emplace(std::chrono::steady_clock::now() + delay, std::move(fn));
  }
  wake();
}

void Progress::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event evs[kMaxEvents];
  for (;;) {
    int timeout = -1;
    {
      std::lock_guard lk(mu_);
      if (!timers_.empty()) {
        auto d = std::chrono::duration_cast<std::chrono::milliseconds>(
            timers_.begin()->first - std::chrono::steady_clock::now());
        timeout = d.count() < 0 ? 0 : static_cast<int>(d.count()) + 1;
      }
    }
    int n = epoll_wait(epfd_, evs, kMaxEvents, timeout);
    if (n < 0 && errno != EINTR) SV_DBG("epoll_wait errno %d", errno);
    for (int i = 0; i < n; ++i) {
      auto* h = static_cast<Handler*>(evs[i].data.ptr);
      if (!h) {
        uint64_t v;
        ssize_t r = read(evfd_, &v, sizeof v);
        (void)r;
        continue;
      }
      h->on_event(evs[i].events);
    }
    // Commands and due timers. Commands may free handlers, so they run after dispatch.
    for (;;) {
      std::function<void()> fn;
      {
        std::lock_guard lk(mu_);
        if (!queue_.empty()) {
          fn = std::move(queue_.front());
          queue_.pop_front();
        } else if (!timers_.empty() && timers_.begin()->first <= std::chrono::steady_clock::now()) {
          fn = std::move(timers_.begin()->second);
          timers_.erase(timers_.begin());
        }
      }
      if (!fn) break;
      fn();
    }
  }
}

}  // namespace sv::engine
