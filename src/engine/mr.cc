#include "engine/mr.h"

#include <sys/random.h>

#include "util/fork_local.h"

namespace sv::engine {

namespace {
// Never destroyed: engine threads may outlive main. A forked child starts with an empty table:
// its parent's regions are not its own (util/fork_local.h).
ForkLocal<KeyTable> g_keys;

// The last region a thread's local access passed (KeyTable::check_local).
struct LocalPass {
  const KeyTable* table = nullptr;
  unsigned forks = 0;
  uint64_t gen = 0;
  uint32_t key = 0;  // 0: nothing remembered (key 0 is invalid)
  const Pd* pd = nullptr;
  int access = 0;
  uint64_t base = 0;  // the region's virtual address and length
  uint64_t size = 0;
};
thread_local LocalPass tl_pass;

constexpr int kMwRemote =
    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
}  // namespace

KeyTable& KeyTable::get() {
  return g_keys.get();
}

KeyTable::KeyTable() {
  used_[0] = 1;  // slot 0 unused: key 0 is invalid
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

bool KeyTable::take_slot(uint32_t* key) {
  if (n_used_ == kSlots) return false;
  // A random free slot, not the next in line: with 16 random bits over 16 bits of slot, a
  // guess must hit both, so with n regions one costs 2^32 / n tries on average (2^20 at
  // 4096 regions) instead of 2^16. From a random start, the first free slot.
  uint32_t slot = next_random() & (kSlots - 1);
  while (used_[slot / 64] == ~uint64_t{0}) slot = (slot / 64 + 1) % (kSlots / 64) * 64;
  while (used_[slot / 64] & (uint64_t{1} << (slot % 64))) slot = (slot + 1) & (kSlots - 1);
  used_[slot / 64] |= uint64_t{1} << (slot % 64);
  ++n_used_;
  uint32_t r;
  do r = next_random() & 0xFF0000FFu;
  while (r == 0);
  *key = r | (slot << 8);
  slot_[slot].key = *key;
  return true;
}

void KeyTable::give_slot(uint32_t slot) {
  slot_[slot] = Entry{};
  used_[slot / 64] &= ~(uint64_t{1} << (slot % 64));
  --n_used_;
}

bool KeyTable::add(Mr* mr) {
  std::unique_lock lk(mu_);
  uint32_t key;
  if (!take_slot(&key)) return false;
  slot_[slot_of(key)].mr = mr;
  mr->mr.lkey = key;
  mr->mr.rkey = key;
  return true;
}

void KeyTable::change(Mr* mr, Pd* pd, int access) {
  std::unique_lock lk(mu_);
  mr->pd = pd;
  mr->access = access;
  gen_.fetch_add(1, std::memory_order_release);
}

bool KeyTable::remove(Mr* mr) {
  std::unique_lock lk(mu_);
  const uint32_t slot = slot_of(mr->mr.lkey);
  if (slot_[slot].mr != mr) return true;
  if (mr->bound_mws) return false;
  give_slot(slot);
  gen_.fetch_add(1, std::memory_order_release);
  return true;
}

bool KeyTable::has_windows(const Mr* mr) const {
  std::shared_lock lk(mu_);
  return mr->bound_mws != 0;
}

bool KeyTable::add(Mw* mw) {
  std::unique_lock lk(mu_);
  uint32_t key;
  if (!take_slot(&key)) return false;
  mw->slot = slot_of(key);
  slot_[mw->slot].mw = mw;
  mw->mw.rkey = key;
  // o10-37.2.x: a type 2 window starts free; a type 1 window is valid, bound to nothing.
  mw->valid = mw->mw.type == IBV_MW_TYPE_1;
  return true;
}

void KeyTable::unbind_locked(Mw* mw) {
  if (mw->mr) --mw->mr->bound_mws;
  if (mw->mw.type == IBV_MW_TYPE_2 && mw->valid) --type2_bound_;
  mw->mr = nullptr;
  mw->qp = nullptr;
  mw->access = 0;
  mw->addr = mw->length = 0;
  mw->valid = mw->mw.type == IBV_MW_TYPE_1;
}

void KeyTable::remove(Mw* mw) {
  std::unique_lock lk(mu_);
  if (slot_[mw->slot].mw != mw) return;
  unbind_locked(mw);
  give_slot(mw->slot);
}

bool KeyTable::bind(const void* qp, const Pd* pd, const BindArgs& a) {
  std::unique_lock lk(mu_);
  Entry& we = slot_[slot_of(a.mw_rkey)];
  Mw* mw = we.mw;
  // The index part names the window; the key byte is what this bind changes (rxe compares
  // it too, which makes a second type 2 bind fail unless the application copied the new
  // key into ibv_mw.rkey: we do not require that).
  if (!mw || (we.key & ~0xFFu) != (a.mw_rkey & ~0xFFu)) return false;
  // The index part of the new key is the window's (ibv_inc_rkey changes the low byte only).
  if ((a.new_rkey & ~0xFFu) != (a.mw_rkey & ~0xFFu)) return false;
  Mr* mr = nullptr;
  if (a.length) {
    const Entry& re = slot_[slot_of(a.mr_lkey)];
    if (!re.mr || re.key != a.mr_lkey) return false;
    mr = re.mr;
  }
  const bool type1 = mw->mw.type == IBV_MW_TYPE_1;
  if (type1) {
    if (a.access & IBV_ACCESS_ZERO_BASED) return false;  // o10-36.2.2
  } else {
    if (mw->valid) return false;  // o10-37.2.30: bind a free window only
    if (!mr) return false;        // o10-37.2.40: no zero-length type 2 bind
  }
  if (mw->pd != pd) return false;  // C10-72: the window is in the QP's PD
  if (mr) {
    if (mr->pd != mw->pd) return false;                    // window and region share a PD
    if (mr->access & IBV_ACCESS_ZERO_BASED) return false;  // rxe: not on zero-based regions
    if (!(mr->access & IBV_ACCESS_MW_BIND)) return false;  // C10-73
    // C10-74: a writable window needs a locally writable region.
    if ((a.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(mr->access & IBV_ACCESS_LOCAL_WRITE))
      return false;
    // C10-75: inside the region.
    if (a.access & IBV_ACCESS_ZERO_BASED) {
      if (a.length > mr->mr.length) return false;
    } else if (a.addr < mr->iova || a.addr - mr->iova > mr->mr.length ||
               a.length > mr->mr.length - (a.addr - mr->iova)) {
      return false;
    }
  }
  unbind_locked(mw);
  we.key = (we.key & ~0xFFu) | (a.new_rkey & 0xFFu);
  mw->valid = true;
  mw->access = a.access & (kMwRemote | IBV_ACCESS_ZERO_BASED);
  mw->addr = a.addr;
  mw->length = a.length;
  if (mr) {
    mw->mr = mr;
    ++mr->bound_mws;
  }
  if (!type1) {
    mw->qp = qp;
    ++type2_bound_;
  }
  return true;
}

bool KeyTable::invalidate(const void* qp, const Pd* pd, uint32_t rkey) {
  std::unique_lock lk(mu_);
  const Entry& e = slot_[slot_of(rkey)];
  Mw* mw = e.mw;
  if (!mw || e.key != rkey) return false;
  if (mw->mw.type != IBV_MW_TYPE_2 || !mw->valid) return false;
  if (mw->pd != pd) return false;
  if (qp && mw->qp != qp) return false;
  unbind_locked(mw);
  return true;
}

void KeyTable::qp_gone(const void* qp) {
  std::unique_lock lk(mu_);
  if (!type2_bound_) return;
  for (Entry& e : slot_)
    if (e.mw && e.mw->mw.type == IBV_MW_TYPE_2 && e.mw->valid && e.mw->qp == qp)
      unbind_locked(e.mw);
}

AccessResult KeyTable::check_mw(const Mw* mw, const Pd* pd, uint64_t addr, uint64_t len, int need,
                                std::byte** ptr, const void* qp) const {
  if (!mw->valid || !mw->mr) return AccessResult::invalid_key;
  if (mw->pd != pd) return AccessResult::wrong_pd;
  // IB type 2B: only the QP that bound the window may use it (RFC 5040: "STag not
  // associated with RDMAP Stream").
  if (mw->mw.type == IBV_MW_TYPE_2 && mw->qp != qp) return AccessResult::wrong_pd;
  if ((mw->access & need) != need) return AccessResult::access_rights;
  const uint64_t base = (mw->access & IBV_ACCESS_ZERO_BASED) ? 0 : mw->addr;
  if (addr < base || addr - base > mw->length || len > mw->length - (addr - base))
    return AccessResult::bounds;
  const uint64_t iova = mw->addr + (addr - base);
  *ptr = static_cast<std::byte*>(mw->mr->mr.addr) + (iova - mw->mr->iova);
  return AccessResult::ok;
}

AccessResult KeyTable::check(uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need,
                             bool remote, std::byte** ptr, const void* qp) const {
  const Entry& e = slot_[slot_of(key)];
  if (e.key != key || key == 0) return AccessResult::invalid_key;
  if (e.mw) {
    // A window has no lkey: it names memory for a peer only.
    if (!remote) return AccessResult::invalid_key;
    return check_mw(e.mw, pd, addr, len, need, ptr, qp);
  }
  const Mr* mr = e.mr;
  if (!mr) return AccessResult::invalid_key;
  if (mr->pd != pd) return AccessResult::wrong_pd;
  if ((mr->access & need) != need) return AccessResult::access_rights;
  const uint64_t base = remote ? mr->iova : reinterpret_cast<uint64_t>(mr->mr.addr);
  const uint64_t size = mr->mr.length;
  if (addr < base || addr - base > size || len > size - (addr - base)) return AccessResult::bounds;
  *ptr = static_cast<std::byte*>(mr->mr.addr) + (addr - base);
  return AccessResult::ok;
}

AccessResult KeyTable::check_local(uint32_t key, const Pd* pd, uint64_t addr, uint64_t len,
                                   int need, std::byte** ptr) {
  LocalPass& c = tl_pass;
  // Acquire: a remove or change seen here happened before; one not seen is concurrent with
  // this check, as it would be with the lock (the caller copies after letting it go).
  if (key != 0 && c.key == key && c.table == this && c.pd == pd && (c.access & need) == need &&
      addr >= c.base && addr - c.base <= c.size && len <= c.size - (addr - c.base) &&
      c.gen == gen_.load(std::memory_order_acquire) && c.forks == fork_generation()) {
    *ptr = reinterpret_cast<std::byte*>(addr);
    return AccessResult::ok;
  }
  std::shared_lock lk(mu_);
  const AccessResult r = check(key, pd, addr, len, need, false, ptr);
  if (r == AccessResult::ok) {
    const Mr* mr = slot_[slot_of(key)].mr;
    c = {this,   fork_generation(), gen_.load(std::memory_order_relaxed),    key,
         mr->pd, mr->access,        reinterpret_cast<uint64_t>(mr->mr.addr), mr->mr.length};
  }
  return r;
}

bool KeyTable::local_sgl_ok(const ibv_sge* sge, uint32_t n, const Pd* pd, int need) {
  if (n == 1) {
    std::byte* p;
    return !sge[0].length ||
           check_local(sge[0].lkey, pd, sge[0].addr, sge[0].length, need, &p) == AccessResult::ok;
  }
  if (n == 0) return true;
  std::shared_lock lk(mu_);
  return local_sgl_ok_locked(sge, n, pd, need);
}

bool KeyTable::local_sgl_ok_locked(const ibv_sge* sge, uint32_t n, const Pd* pd, int need) const {
  for (uint32_t i = 0; i < n; ++i) {
    std::byte* p;
    if (sge[i].length &&
        check(sge[i].lkey, pd, sge[i].addr, sge[i].length, need, false, &p) != AccessResult::ok)
      return false;
  }
  return true;
}

}  // namespace sv::engine
