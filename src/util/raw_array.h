// A fixed-size array of trivial elements that is not zero-filled. A connection's receive
// buffer and transmit arenas are large (hundreds of KiB) but an idle or lightly used
// connection touches only their first pages: left uninitialised, the rest never becomes
// resident, so an idle QP costs kilobytes, not the whole buffer (issue 28 item 3), and
// setting up thousands of QPs does not fault in and clear memory nobody reads.
#pragma once
#include <cstddef>
#include <memory>
#include <type_traits>

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

}  // namespace sv::util
