#include "engine/linger.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <unordered_set>

#include "engine/progress.h"

namespace sv::engine {

namespace {

// Long enough for a peer to read what we sent and close; a peer that keeps its end open
// past it gets the close then (and a RST if it still sends).
constexpr std::chrono::seconds kLingerMax{10};
// At exit the process waits this long at most for lingering sockets: exit() closes them, and
// bytes reaching a closed socket are answered with a RST that drops what we still had queued
// (rstream's server exits right after rclose; a siw client then lost the end of the stream).
constexpr std::chrono::seconds kExitWait{3};

std::atomic<int> g_count{0};

void wait_at_exit() {
  const auto end = std::chrono::steady_clock::now() + kExitWait;
  while (g_count.load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

struct Linger : Progress::Handler {
  int fd;
  explicit Linger(int f) : fd(f) {}
  void on_event(uint32_t events) override;
};

// Lingering sockets, so the deadline timer finds out whether its socket is still there.
// Progress thread only.
std::unordered_set<Linger*>& lingering() {
  static auto* s = new std::unordered_set<Linger*>();
  return *s;
}

void finish(Linger* l) {
  Progress::get().del(l->fd);
  close(l->fd);
  lingering().erase(l);
  delete l;
  g_count.fetch_sub(1, std::memory_order_release);
}

void Linger::on_event(uint32_t events) {
  static char sink[16384];
  for (;;) {
    const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !(events & (EPOLLHUP | EPOLLERR)))
      return;
    finish(this);  // the peer's FIN (n == 0), or the connection is gone
    return;
  }
}

}  // namespace

void linger_close(int fd) {
  if (shutdown(fd, SHUT_WR) < 0) {
    close(fd);  // not connected (any more): nothing to deliver
    return;
  }
  static const bool registered = [] {
    // A forked child closes its copies of the parent's lingering sockets
    // (Progress::release_after_fork) and must not wait for them at its exit.
    pthread_atfork(nullptr, nullptr, [] { g_count.store(0, std::memory_order_relaxed); });
    return std::atexit(wait_at_exit) == 0;
  }();
  (void)registered;
  auto* l = new Linger(fd);
  lingering().insert(l);
  g_count.fetch_add(1, std::memory_order_relaxed);
  Progress::get().add(fd, EPOLLIN | EPOLLRDHUP, l);
  l->on_event(0);  // the peer may have closed already
  Progress::get().post_after(kLingerMax, [l] {
    if (lingering().count(l)) finish(l);
  });
}

}  // namespace sv::engine
