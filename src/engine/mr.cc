#include "engine/mr.h"

#include <sys/random.h>

#include "util/fork_local.h"

namespace sv::engine {

namespace {
// Never destroyed: engine threads may outlive main. A forked child starts with an empty table:
// its parent's regions are not its own (util/fork_local.h).
ForkLocal<KeyTable> g_keys;
}  // namespace

KeyTable& KeyTable::get() {
  return g_keys.get();
}

KeyTable::KeyTable() : slot_(kSlots, nullptr), key_(kSlots, 0) {
  for (uint32_t i = 1; i < kSlots; ++i) free_.push_back(i);  // slot 0 unused: key 0 invalid
  if (getrandom(&rng_, sizeof rng_, 0) != sizeof rng_) rng_ = 0x9E3779B97F4A7C15ull;
  rng_ |= 1;
}

uint32_t KeyTable::next_random() {
  // xorshift64*: keys need to be unpredictable to a remote peer, not cryptographic.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return static_cast<uint32_t>((rng_ * 0x2545F4914F6CDD1Dull) >> 32);
}

bool KeyTable::add(Mr* mr) {
  std::unique_lock lk(mu_);
  if (free_.empty()) return false;
  // A random free slot, not the next in line: with 16 random bits over 16 bits of slot, a
  // guess must hit both, so with n regions one costs 2^32 / n tries on average (2^20 at
  // 4096 regions) instead of 2^16. Freed slots still go to the back.
  const size_t pick = next_random() % free_.size();
  std::swap(free_[pick], free_.front());
  const uint32_t slot = free_.front();
  free_.pop_front();
  uint32_t hi;
  do hi = next_random() & 0xFFFF0000u;
  while (hi == 0);
  const uint32_t key = hi | slot;
  slot_[slot] = mr;
  key_[slot] = key;
  mr->mr.lkey = key;
  mr->mr.rkey = key;
  return true;
}

void KeyTable::change(Mr* mr, Pd* pd, int access) {
  std::unique_lock lk(mu_);
  mr->pd = pd;
  mr->access = access;
}

void KeyTable::remove(Mr* mr) {
  std::unique_lock lk(mu_);
  const uint32_t slot = mr->mr.lkey & 0xFFFF;
  if (slot_[slot] != mr) return;
  slot_[slot] = nullptr;
  key_[slot] = 0;
  free_.push_back(slot);
}

AccessResult KeyTable::check(uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need,
                             bool remote, std::byte** ptr) const {
  const uint32_t slot = key & 0xFFFF;
  const Mr* mr = slot_[slot];
  if (!mr || key_[slot] != key) return AccessResult::invalid_key;
  if (mr->pd != pd) return AccessResult::wrong_pd;
  if ((mr->access & need) != need) return AccessResult::access_rights;
  const uint64_t base = remote ? mr->iova : reinterpret_cast<uint64_t>(mr->mr.addr);
  const uint64_t size = mr->mr.length;
  if (addr < base || addr - base > size || len > size - (addr - base)) return AccessResult::bounds;
  *ptr = static_cast<std::byte*>(mr->mr.addr) + (addr - base);
  return AccessResult::ok;
}

}  // namespace sv::engine
