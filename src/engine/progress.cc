#include "engine/progress.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <vector>

#include "engine/cq.h"
#include "engine/log.h"
#include "util/fork_local.h"

namespace sv::engine {

namespace {
// Leaked on purpose: the thread runs until the process exits, and static destructors must
// not tear down state it is using. A forked child gets a progress thread of its own.
ForkLocal<Progress> g_progress(&Progress::release_after_fork);
}  // namespace

Progress& Progress::get() {
  return g_progress.get();
}

void Progress::release_after_fork(Progress& p) {
  // Every socket the engine owns is in this epoll set while it is open (listeners, MPA
  // handshakes, QP streams). The child closes its copies, so a QP or listener the parent
  // closes is really closed (peers see the FIN), and the child never reads the parent's
  // streams. The kernel lists the set in fdinfo ("tfd: N ... ino:I"), with the parent's
  // numbers, which are the child's too. But an entry outlives the number it was added
  // under while its file lives on elsewhere (epoll(7): a socket handed on by
  // F_DUPFD_CLOEXEC, or held by another process), and the number may since be another
  // file of the application's: only a socket whose inode is the entry's is closed. (The
  // child of an RDS process lost the pipe it had just made this way.)
  // No malloc here: in the child of a threaded process only async-signal-safe calls are
  // safe (fork(2)), and an allocator lock another thread held at the fork stays held (TSan's
  // did: a child hung in fopen). The file is read with read(2) into pages of its own.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", p.epfd_);
  const int f = open(path, O_RDONLY | O_CLOEXEC);
  size_t cap = 1 << 16, len = 0;
  void* m = f >= 0 ? mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                   : MAP_FAILED;
  auto* buf = static_cast<char*>(m == MAP_FAILED ? nullptr : m);
  while (buf) {
    if (len == cap) {
      void* g = mremap(buf, cap, cap * 2, MREMAP_MAYMOVE);
      if (g == MAP_FAILED) break;
      buf = static_cast<char*>(g);
      cap *= 2;
    }
    const ssize_t n = read(f, buf + len, cap - len);
    if (n <= 0) break;
    len += static_cast<size_t>(n);
  }
  if (f >= 0) close(f);  // before closing: its descriptor must not be taken for one of them
  for (char* line = buf; line && line < buf + len;) {
    // Whole lines only (the kernel ends each with one): a read cut short must not turn
    // "tfd:     17 ... ino:..." into a "tfd:      1" with no inode to check.
    char* end = static_cast<char*>(std::memchr(line, '\n', static_cast<size_t>(buf + len - line)));
    if (!end) break;
    *end = '\0';
    if (std::strncmp(line, "tfd:", 4) == 0) {
      const int fd = static_cast<int>(std::strtol(line + 4, nullptr, 10));
      const char* ino_at = std::strstr(line, "ino:");  // since Linux 3.8; else 0: no check
      const unsigned long ino = ino_at ? std::strtoul(ino_at + 4, nullptr, 16) : 0;
      struct stat st {};
      if (fd >= 0 && fd != p.epfd_ && fd != p.evfd_ && fstat(fd, &st) == 0 &&
          (ino == 0 || (S_ISSOCK(st.st_mode) && st.st_ino == ino)))
        close(fd);
    }
    line = end + 1;
  }
  if (buf) munmap(buf, cap);
  close(p.evfd_);
  close(p.epfd_);
}

Progress::Progress() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  evfd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, evfd_, &ev);
  std::promise<void> started;
  auto f = started.get_future();
  thread_ = std::thread([this, &started] {
    // Its timers are microseconds apart: the default 50 us of timer slack would swamp them.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    tid_ = std::this_thread::get_id();  // before anything here can ask on_thread()
    started.set_value();
    loop();
  });
  f.get();
  thread_.detach();
}

void Progress::add(int fd, uint32_t events, Handler* h) {
  epoll_event ev{};
  ev.events = events;
  ev.data.ptr = h;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) < 0) SV_ERR("epoll add fd %d: errno %d", fd, errno);
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
  // From the progress thread itself, loop() runs the queue before it sleeps again: waking
  // it would cost an eventfd write, an epoll return and a read for nothing.
  if (!on_thread()) wake();
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

void Progress::defer_cq(Cq* cq) {
  if (std::find(due_cqs_.begin(), due_cqs_.end(), cq) == due_cqs_.end()) due_cqs_.push_back(cq);
}

void Progress::forget_cq(Cq* cq) {
  due_cqs_.erase(std::remove(due_cqs_.begin(), due_cqs_.end(), cq), due_cqs_.end());
}

void Progress::run_deferred_cqs() {
  // A handler may raise the next notification (it re-arms and polls): run until quiet.
  while (!due_cqs_.empty()) {
    Cq* cq = due_cqs_.front();
    due_cqs_.erase(due_cqs_.begin());
    cq->run_handler();
  }
}

void Progress::post_after(std::chrono::microseconds delay, std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    timers_.emplace(std::chrono::steady_clock::now() + delay, std::move(fn));
  }
  if (!on_thread()) wake();  // the loop computes its next timeout after this returns
}

void Progress::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event evs[kMaxEvents];
  for (;;) {
    bool timed = false;
    timespec ts{};
    {
      std::lock_guard lk(mu_);
      if (!timers_.empty()) {
        const auto d = std::chrono::duration_cast<std::chrono::nanoseconds>(
            timers_.begin()->first - std::chrono::steady_clock::now());
        const int64_t ns = std::max<int64_t>(d.count(), 0);
        ts.tv_sec = static_cast<time_t>(ns / 1000000000);
        ts.tv_nsec = static_cast<long>(ns % 1000000000);
        timed = true;
      }
    }
    // epoll_pwait2 (Linux 5.11) takes a timespec: timers finer than epoll_wait's millisecond
    // (the TX batch flush is due microseconds after a post). Older kernels: milliseconds.
    int n = epoll_pwait2(epfd_, evs, kMaxEvents, timed ? &ts : nullptr, nullptr);
    if (n < 0 && errno == ENOSYS) {
      const int ms = timed ? static_cast<int>(ts.tv_sec * 1000 + ts.tv_nsec / 1000000) + 1 : -1;
      n = epoll_wait(epfd_, evs, kMaxEvents, ms);
    }
    if (n < 0 && errno != EINTR) SV_ERR("epoll_wait errno %d", errno);
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
    run_deferred_cqs();
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
      run_deferred_cqs();
    }
  }
}

}  // namespace sv::engine
