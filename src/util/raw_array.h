// A fixed-size array of trivial elements that is not zero-filled. A connection's receive
// buffer and transmit arenas are large (hundreds of KiB), and so is a CQ's ring, but an
// idle or lightly used one touches only its first pages: left uninitialised, the rest
// never becomes resident, so an idle QP costs kilobytes, not the whole buffer (issue 28
// item 3), and setting up thousands of QPs does not fault in and clear memory nobody reads.
// Every element is written before it is read (a ring slot by its producer).
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <new>
#include <memory>
#include <type_traits>
#include <utility>

namespace sv::util {

template <typename T>
class RawArray {
  static_assert(std::is_trivially_default_constructible_v<T>);

 public:
  // Makes room for n elements with unspecified values; keeps the buffer if it already has
  // n (a reconnect reuses it).
  void allocate(size_t n) {
    if (n == n_) return;
    p_.reset(n ? new T[n] : nullptr);  // default-initialised: not written
    n_ = n;
  }
  void swap(RawArray& o) noexcept {
    p_.swap(o.p_);
    std::swap(n_, o.n_);
  }
  void release() {
    p_.reset();
    n_ = 0;
  }
  T* data() { return p_.get(); }
  const T* data() const { return p_.get(); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  std::unique_ptr<T[]> p_;
  size_t n_ = 0;
};

// A fixed-size array of all-zero elements whose pages become resident only when written:
// anonymous memory from mmap reads as zeroes without being touched. For tables indexed at
// random, such as the key table (64 Ki slots of which a process uses a few): a vector
// clears every byte, and 1.5 MiB of it was resident in every process with one region.
// T must be valid as all zero bytes (pointers null, numbers 0).
template <typename T>
class ZeroArray {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);

 public:
  explicit ZeroArray(size_t n) : n_(n) {
    void* p = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    p_ = static_cast<T*>(p);
  }
  ZeroArray(const ZeroArray&) = delete;
  ZeroArray& operator=(const ZeroArray&) = delete;
  ~ZeroArray() { munmap(p_, n_ * sizeof(T)); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace sv::util
