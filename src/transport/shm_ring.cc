#include "transport/shm_ring.h"

#include <algorithm>
#include <cstring>

namespace sv::transport {
namespace {

template <typename T>
std::atomic_ref<T> ref(T& v) {
  return std::atomic_ref<T>(v);
}

bool pow2(size_t v) {
  return v && (v & (v - 1)) == 0;
}

// The rings are shared with another process: their atomics must be lock-free (a lock would
// live in each process, guarding nothing).
static_assert(std::atomic_ref<uint64_t>::is_always_lock_free);
static_assert(std::atomic_ref<uint32_t>::is_always_lock_free);

}  // namespace

size_t ShmLayout::segment_bytes(size_t ring_bytes) {
  if (!pow2(ring_bytes) || ring_bytes < kMinRing || ring_bytes > kMaxRing) return 0;
  return data_offset(1, ring_bytes) + ring_bytes;
}

// [header page][ctrl 0, page][data 0][ctrl 1, page][data 1]: page-aligned, so a ring's data
// can be given back (punched) by pages without touching its control words.
size_t ShmLayout::ctrl_offset(int ring, size_t ring_bytes) {
  return kHeaderBytes + static_cast<size_t>(ring) * (4096 + ring_bytes);
}

size_t ShmLayout::data_offset(int ring, size_t ring_bytes) {
  return ctrl_offset(ring, ring_bytes) + 4096;
}

ShmProducer::ShmProducer(ShmRingCtrl* ctrl, std::byte* data, size_t cap)
    : c_(ctrl),
      data_(data),
      cap_(cap),
      tail_(ref(ctrl->tail).load(std::memory_order_relaxed)),
      head_seen_(tail_ - cap_) {}  // no room known: the first write reads the head

long ShmProducer::writev(const iovec* iov, size_t n) {
  size_t want = 0;
  for (size_t i = 0; i < n; ++i) want += iov[i].iov_len;
  size_t room = cap_ - static_cast<size_t>(tail_ - head_seen_);
  if (room < want) {
    // Acquire: the consumer copied the bytes out before it published its head.
    const uint64_t head = ref(c_->head).load(std::memory_order_acquire);
    const uint64_t used = tail_ - head;
    if (used > cap_) return -1;  // the peer's head is behind what was ever free, or ahead of us
    head_seen_ = head;
    room = cap_ - used;
  }
  size_t done = 0;
  for (size_t i = 0; i < n && room; ++i) {
    const auto* src = static_cast<const std::byte*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, room);
    room -= len;
    while (len) {
      const size_t at = (tail_ + done) & (cap_ - 1);
      const size_t take = std::min(len, cap_ - at);
      std::memcpy(data_ + at, src, take);
      src += take;
      len -= take;
      done += take;
    }
  }
  if (done) {
    tail_ += done;
    // seq_cst, as every flag below: the bells are Dekker pairs (our store, then their flag;
    // their flag, then our index), and GCC's ThreadSanitizer has no fences.
    ref(c_->tail).store(tail_, std::memory_order_seq_cst);
  }
  return static_cast<long>(done);
}

bool ShmProducer::bell_due() {
  // Dekker with set_want_bell: our tail store, then their flag; their flag, then our tail.
  if (ref(c_->want_bell).load(std::memory_order_seq_cst) == 0) return false;
  if (ref(c_->bell_pending).load(std::memory_order_seq_cst) != 0) return false;
  return ref(c_->bell_pending).exchange(1, std::memory_order_seq_cst) == 0;
}

bool ShmProducer::wait_for_space() {
  ref(c_->want_space).store(1, std::memory_order_seq_cst);
  const uint64_t head = ref(c_->head).load(std::memory_order_seq_cst);
  const uint64_t used = tail_ - head;
  return used < cap_;  // (a corrupt head: writev says so)
}

bool ShmProducer::has_room() const {
  const uint64_t head = ref(c_->head).load(std::memory_order_seq_cst);
  return tail_ - head < cap_;
}

bool ShmProducer::drained() const {
  return ref(c_->head).load(std::memory_order_acquire) == tail_;
}

uint32_t ShmProducer::peer_placed() const {
  return ref(c_->placed).load(std::memory_order_acquire);
}

void ShmProducer::revoke() {
  if (!c_) return;  // never attached to a ring
  ref(c_->revoked).store(1, std::memory_order_seq_cst);
}

ShmConsumer::ShmConsumer(ShmRingCtrl* ctrl, std::byte* data, size_t cap)
    : c_(ctrl), data_(data), cap_(cap), head_(ref(ctrl->head).load(std::memory_order_relaxed)) {}

long ShmConsumer::available() const {
  const uint64_t tail = ref(c_->tail).load(std::memory_order_seq_cst);
  const uint64_t avail = tail - head_;
  if (avail > cap_) return -1;  // more than a ring ahead, or behind us: not a producer's doing
  return static_cast<long>(avail);
}

long ShmConsumer::readv(const iovec* iov, size_t n) {
  const long a = available();
  if (a <= 0) return a;
  size_t left = static_cast<size_t>(a);
  size_t done = 0;
  for (size_t i = 0; i < n && left; ++i) {
    auto* dst = static_cast<std::byte*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, left);
    left -= len;
    while (len) {
      const size_t at = (head_ + done) & (cap_ - 1);
      const size_t take = std::min(len, cap_ - at);
      std::memcpy(dst, data_ + at, take);
      dst += take;
      len -= take;
      done += take;
    }
  }
  if (done) {
    head_ += done;
    // Release: the bytes are copied out before the producer may reuse their room.
    ref(c_->head).store(head_, std::memory_order_seq_cst);
  }
  return static_cast<long>(done);
}

void ShmConsumer::set_want_bell(bool on) {
  ref(c_->want_bell).store(on ? 1 : 0, std::memory_order_seq_cst);
}

void ShmConsumer::bell_taken() {
  ref(c_->bell_pending).store(0, std::memory_order_seq_cst);
}

bool ShmConsumer::bell_pending() const {
  return ref(c_->bell_pending).load(std::memory_order_relaxed) != 0;
}

bool ShmConsumer::space_bell_due() {
  if (ref(c_->want_space).load(std::memory_order_seq_cst) == 0) return false;
  return ref(c_->want_space).exchange(0, std::memory_order_seq_cst) != 0;
}

void ShmConsumer::publish_placed(uint32_t n) {
  ref(c_->placed).store(n, std::memory_order_release);
}

bool ShmConsumer::revoked() const {
  // A read-modify-write, not a load: the bytes it guards were read by the kernel before it
  // (process_vm_readv), and an acquire load orders nothing before itself on a weakly ordered
  // CPU. A seq_cst RMW is a full barrier there (and TSan, unlike with a fence, follows it).
  return ref(c_->revoked).fetch_or(0, std::memory_order_seq_cst) != 0;
}

}  // namespace sv::transport
