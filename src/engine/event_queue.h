// An event file: an eventfd in semaphore mode plus a queue of records. Each queued record
// adds 1 to the counter, each read takes exactly 1, so the fd behaves like the kernel's
// uverbs/rdma_cm event files: read blocks or gives EAGAIN under O_NONBLOCK, poll/epoll see
// POLLIN while events are pending, and closing it does not wake a thread blocked in read
// with a spurious EOF (a pipe would: rping's CM thread exits on that).
#pragma once
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <mutex>

#include "util/cancel_unwind.h"

namespace sv::engine {

template <typename T>
class EventQueue {
 public:
  // Returns the fd, or -1 with errno set.
  int open() {
    fd_ = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    return fd_;
  }
  int fd() const { return fd_; }
  // An application may destroy a channel while another of its threads is blocked
  // reading it (rping does); that thread stays blocked, as with the kernel's files.
  void close_fd() {
    const int fd = fd_.exchange(-1);
    if (fd >= 0) ::close(fd);
  }

  void push(const T& v) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(v);
    }
    const uint64_t one = 1;
    ssize_t r = write(fd_, &one, sizeof one);
    (void)r;
  }

  // A record for the thread that pushes it to read next itself (channel_block: the
  // channel's sleeper ran the receive pass that raised it, and reads the channel now): no
  // eventfd write, and its read no eventfd read, 2 system calls of 9 per event-driven message.
  // The counter stays the number of the other records, so a poll on the descriptor sees only
  // them. At most one such record at a time (Cq::push), which its pusher reads next.
  void push_for_self(const T& v) {
    std::lock_guard lk(mu_);
    q_.push_back(v);
    ++unsignalled_;
  }

  // Whether a record is queued (a pop then does not block, unless another thread takes it).
  bool queued() {
    std::lock_guard lk(mu_);
    return !q_.empty();
  }

  // Blocks (unless the fd is O_NONBLOCK) until an event is there. 0 or -1 with errno.
  int pop(T& out) {
    {
      std::lock_guard lk(mu_);
      if (unsignalled_ > 0) {  // push_for_self's: nothing to read for it
        --unsignalled_;
        out = q_.front();
        q_.pop_front();
        return 0;
      }
    }
    uint64_t v;
    const ssize_t n = util::cancellation_point([&] { return read(fd_, &v, sizeof v); });
    if (n != sizeof v) {
      if (n >= 0) errno = EIO;
      return -1;
    }
    std::lock_guard lk(mu_);
    if (q_.empty()) {
      errno = EAGAIN;
      return -1;
    }
    out = q_.front();
    q_.pop_front();
    return 0;
  }

  // Removes queued records matching pred (and their counts). Returns them.
  template <typename Pred>
  std::deque<T> take_if(Pred pred) {
    std::deque<T> out;
    std::lock_guard lk(mu_);
    for (auto it = q_.begin(); it != q_.end();) {
      if (pred(*it)) {
        out.push_back(*it);
        it = q_.erase(it);
        if (unsignalled_ > 0) {  // the records outnumber the counter by this many
          --unsignalled_;
          continue;
        }
        uint64_t v;
        // Non-blocking in effect: the counter is at least the queue length.
        ssize_t r = read(fd_, &v, sizeof v);
        (void)r;
      } else {
        ++it;
      }
    }
    return out;
  }

  std::deque<T> drain() {
    std::lock_guard lk(mu_);
    std::deque<T> out;
    out.swap(q_);
    unsignalled_ = 0;
    return out;
  }

 private:
  std::atomic<int> fd_{-1};
  std::mutex mu_;
  std::deque<T> q_;
  size_t unsignalled_ = 0;  // records with no count on the eventfd (push_for_self)
};

}  // namespace sv::engine
