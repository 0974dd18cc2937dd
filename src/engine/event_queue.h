// An event file: an eventfd in semaphore mode plus a queue of records. Each queued record
// adds 1 to the counter, each read takes exactly 1, so the fd behaves like the kernel's
// uverbs/rdma_cm event files: read blocks or gives EAGAIN under O_NONBLOCK, poll/epoll see
// POLLIN while events are pending, and closing it does not wake a thread blocked in read
// with a spurious EOF (a pipe would: rping's CM thread exits on that).
#pragma once
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
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
    // Not a cancellation point (write(2) is one): a thread cancelled here would leave its
    // record with no count, which no read could ever take.
    const uint64_t one = 1;
    const long r = syscall(SYS_write, fd_.load(), &one, sizeof one);
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
  // on_take(record) runs under the queue's lock as the record is taken: a count of what was
  // handed out (the kernel's comp_events_reported, bumped as ib_uverbs_event_read dequeues)
  // that take_if, under the same lock, then reads exactly.
  template <typename OnTake = void (*)(const T&)>
  int pop(
      T& out, OnTake on_take = [](const T&) {}) {
    std::unique_lock lk(mu_);
    for (;;) {
      if (unsignalled_ > 0) {  // push_for_self's: nothing to read for it
        --unsignalled_;
        return take_front(out, on_take);
      }
      // Counted while the read runs unlocked (take_if's fallback, below). A cancel in the read
      // leaves it counted: take_if is then only the more careful, and the queue, which
      // rdma_destroy_event_channel may have freed by then, is not touched on the way out.
      ++reading_;
      lk.unlock();
      uint64_t v;
      const ssize_t n = util::cancellation_point([&] { return read(fd_, &v, sizeof v); });
      const int e = errno;
      lk.lock();
      --reading_;
      if (n != sizeof v) {
        // A debt left to this read (take_if's) is paid now if its count is there, or the
        // descriptor would say readable with nothing queued.
        if (owed_ > 0 && nowait_supported() && take_count_nowait()) --owed_;
        errno = n >= 0 ? EIO : e;
        return -1;
      }
      if (owed_ > 0) {  // the count of a record take_if removed: not ours, read again
        --owed_;
        continue;
      }
      if (q_.empty()) {  // drained (a destroy under us)
        errno = EAGAIN;
        return -1;
      }
      return take_front(out, on_take);
    }
  }

  // Removes queued records matching pred (and their counts). Returns them.
  template <typename Pred>
  std::deque<T> take_if(Pred pred) {
    std::deque<T> out;
    std::lock_guard lk(mu_);
    for (auto it = q_.begin(); it != q_.end();) {
      if (!pred(*it)) {
        ++it;
        continue;
      }
      // Counts on the eventfd, plus those readers in flight took, plus those pushes are about
      // to write (push writes after it lets go of mu_).
      const size_t counted = q_.size() - unsignalled_ + owed_;
      out.push_back(*it);
      it = q_.erase(it);
      if (unsignalled_ > 0) {  // the records outnumber the counter by this many
        --unsignalled_;
      } else if (!take_count(counted)) {
        // Its count is not there now: a reader in its unlocked read took it, or its push has
        // not written it yet. A blocking read here, under mu_, could wait for ever (the reader
        // needs mu_ to take its record); so it is owed, and the next read to return pays it.
        ++owed_;
      }
    }
    return out;
  }

  std::deque<T> drain() {
    std::lock_guard lk(mu_);
    std::deque<T> out;
    owed_ += q_.size() - unsignalled_;  // their counts stay on the eventfd
    out.swap(q_);
    unsignalled_ = 0;
    return out;
  }

 private:
  std::atomic<int> fd_{-1};
  std::mutex mu_;
  std::deque<T> q_;
  size_t unsignalled_ = 0;  // records with no count on the eventfd (push_for_self)
  size_t owed_ = 0;         // counts on the eventfd whose records take_if or drain removed

  size_t reading_ = 0;  // pops in their unlocked read (take_count's fallback)

  // One count, never blocking whatever the descriptor's O_NONBLOCK (the application's to set):
  // RWF_NOWAIT, which eventfd honours since Linux 5.13. Before, EOPNOTSUPP and nothing read.
  bool take_count_nowait() {
    uint64_t v;
    iovec io{&v, sizeof v};
    return preadv2(fd_, &io, 1, -1, RWF_NOWAIT) == static_cast<ssize_t>(sizeof v);
  }
  static bool nowait_supported() {
    static const bool ok = [] {
      const int fd = eventfd(0, EFD_CLOEXEC);
      if (fd < 0) return false;
      uint64_t v;
      iovec io{&v, sizeof v};
      const bool r = preadv2(fd, &io, 1, -1, RWF_NOWAIT) < 0 && errno == EAGAIN;
      ::close(fd);
      return r;
    }();
    return ok;
  }
  // take_if's count for a record it removed (`counted` as it computed it). Without RWF_NOWAIT
  // (older kernels, or a seccomp profile without preadv2), a plain read only when the readers
  // in flight cannot have taken the last count: at worst it waits for a push's write, which
  // needs no lock. A failed read (O_NONBLOCK, a signal) is false: the count is owed.
  bool take_count(size_t counted) {
    if (nowait_supported()) return take_count_nowait();
    if (counted <= reading_) return false;
    uint64_t v;
    return read(fd_, &v, sizeof v) == static_cast<ssize_t>(sizeof v);
  }

  template <typename OnTake>
  int take_front(T& out, OnTake& on_take) {
    out = q_.front();
    q_.pop_front();
    on_take(out);
    return 0;
  }
};

}  // namespace sv::engine
