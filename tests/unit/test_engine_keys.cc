// Keys (STags) and access checks of the engine's key table (engine/mr.h), without verbs:
// every byte of a region is checked for bounds, PD and access rights; keys are
// unguessable-ish and not soon reused.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "engine/mr.h"

using namespace sv::engine;

namespace {

struct Region {
  Pd pd;
  Mr mr;
  std::vector<std::byte> mem = std::vector<std::byte>(4096);
  // In its own PD, or in `in`'s.
  Region(int access, uint64_t iova, Pd* in = nullptr) {
    mr.pd = in ? in : &pd;
    mr.access = access;
    mr.iova = iova;
    mr.mr.addr = mem.data();
    mr.mr.length = mem.size();
    EXPECT_TRUE(KeyTable::get().add(&mr));
  }
  ~Region() { EXPECT_TRUE(KeyTable::get().remove(&mr)); }
};

AccessResult check(const Region&, uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need,
                   bool remote, std::byte** p, const void* qp = nullptr) {
  auto& kt = KeyTable::get();
  auto g = kt.read_guard();
  return kt.check(key, pd, addr, len, need, remote, p, qp);
}

}  // namespace

TEST(KeyTable, RemoteAccessIsRelativeToIovaAndBounded) {
  Region r(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 0x10000);
  std::byte* p = nullptr;
  const uint32_t k = r.mr.mr.rkey;
  EXPECT_EQ(check(r, k, &r.pd, 0x10000, 4096, IBV_ACCESS_REMOTE_WRITE, true, &p), AccessResult::ok);
  EXPECT_EQ(p, r.mem.data());
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 4095, 1, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::ok);
  EXPECT_EQ(p, r.mem.data() + 4095);
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 4095, 2, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::bounds);
  EXPECT_EQ(check(r, k, &r.pd, 0xFFFF, 1, IBV_ACCESS_REMOTE_WRITE, true, &p), AccessResult::bounds);
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 4096, 0, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::ok)
      << "an empty range at the end is inside";
  EXPECT_EQ(check(r, k, &r.pd, ~0ull - 2, 8, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::bounds)
      << "wrap-around must not pass";
}

TEST(KeyTable, AccessRightsPdAndKeyAreEnforced) {
  Region r(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0);
  Pd other;
  std::byte* p = nullptr;
  const uint32_t k = r.mr.mr.rkey;
  EXPECT_EQ(check(r, k, &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p), AccessResult::ok);
  EXPECT_EQ(check(r, k, &r.pd, 0, 8, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::access_rights);
  EXPECT_EQ(check(r, k, &r.pd, 0, 8, IBV_ACCESS_REMOTE_ATOMIC, true, &p),
            AccessResult::access_rights);
  EXPECT_EQ(check(r, k, &other, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p), AccessResult::wrong_pd);
  EXPECT_EQ(check(r, k ^ 0x01000000, &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p),
            AccessResult::invalid_key)
      << "same slot, other random bits";
  EXPECT_EQ(check(r, k ^ 0x1, &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p),
            AccessResult::invalid_key)
      << "same slot, other key byte";
  EXPECT_EQ(check(r, 0, &r.pd, 0, 8, 0, true, &p), AccessResult::invalid_key);
  // Local addressing uses the virtual address, not the iova.
  const auto va = reinterpret_cast<uint64_t>(r.mem.data());
  EXPECT_EQ(check(r, k, &r.pd, va + 10, 10, 0, false, &p), AccessResult::ok);
  EXPECT_EQ(p, r.mem.data() + 10);
}

TEST(KeyTable, KeysAreUniqueAndNotSoonReused) {
  std::set<uint32_t> seen;
  uint32_t first = 0;
  {
    Region r(0, 0);
    first = r.mr.mr.lkey;
    EXPECT_EQ(r.mr.mr.lkey, r.mr.mr.rkey);
    EXPECT_NE(first & 0xFF0000FFu, 0u) << "the random bits are never all zero";
  }
  std::vector<std::unique_ptr<Region>> live;
  for (int i = 0; i < 200; ++i) {
    live.push_back(std::make_unique<Region>(0, 0));
    EXPECT_TRUE(seen.insert(live.back()->mr.mr.lkey).second) << "duplicate key";
    EXPECT_NE(live.back()->mr.mr.lkey, first) << "a deregistered key came back at once";
  }
  // After deregistration the old key no longer resolves.
  std::byte* p;
  const uint32_t gone = live.front()->mr.mr.lkey;
  const Pd* pd = &live.front()->pd;
  live.erase(live.begin());
  auto& kt = KeyTable::get();
  auto g = kt.read_guard();
  EXPECT_EQ(kt.check(gone, pd, 0, 1, 0, true, &p), AccessResult::invalid_key);
}

TEST(KeyTable, SlotsAreNotHandedOutInOrder) {
  // An attacker who knows slots go out 1, 2, 3... needs only the 16 random bits; random slots
  // make a guess cost 2^32 / (regions) tries. 4096 regions: their slots are not a run.
  std::vector<std::unique_ptr<Region>> rs;
  std::set<uint32_t> slots;
  int consecutive = 0;
  uint32_t prev = 0;
  for (int i = 0; i < 4096; ++i) {
    rs.push_back(std::make_unique<Region>(IBV_ACCESS_REMOTE_READ, 0));
    const uint32_t slot = (rs.back()->mr.mr.rkey >> 8) & 0xFFFF;
    slots.insert(slot);
    if (slot == prev + 1) ++consecutive;
    prev = slot;
  }
  EXPECT_EQ(slots.size(), 4096u);
  EXPECT_LT(consecutive, 64) << "slots are handed out in order";
  EXPECT_GT(*slots.rbegin(), 8192u) << "slots crowd the start of the table";
}

// ---- memory windows ------------------------------------------------------------------------

namespace {

struct Window {
  Mw mw;
  explicit Window(Pd* pd, ibv_mw_type type) {
    mw.pd = pd;
    mw.mw.type = type;
    EXPECT_TRUE(KeyTable::get().add(&mw));
  }
  ~Window() { KeyTable::get().remove(&mw); }
  uint32_t key(uint8_t b) const { return (mw.mw.rkey & ~0xFFu) | b; }
};

BindArgs bind_args(const Window& w, uint8_t key_byte, const Region& r, uint64_t addr, uint64_t len,
                   int access) {
  BindArgs a;
  a.mw_rkey = w.mw.mw.rkey;
  a.new_rkey = w.key(key_byte);
  a.mr_lkey = r.mr.mr.lkey;
  a.addr = addr;
  a.length = len;
  a.access = access;
  return a;
}

constexpr int kBindable = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
char kQp1, kQp2;  // two QP identities (only their addresses matter)

}  // namespace

TEST(KeyTable, Type1WindowGivesAccessToItsRangeOnlyThroughItsNewKey) {
  Region r(kBindable, 0x10000);
  Window w(&r.pd, IBV_MW_TYPE_1);
  auto& kt = KeyTable::get();
  std::byte* p = nullptr;
  // Key bytes other than the window's own (random): a bind to the key it has would leave the
  // old key working, and the test would fail 1 run in 256.
  const uint8_t own = static_cast<uint8_t>(w.mw.mw.rkey & 0xFF);
  const uint8_t kb1 = own == 0x42 ? 0x52 : 0x42, kb2 = own == 0x43 ? 0x53 : 0x43;
  // Bound to 1 KiB in the middle of the region, remote write only.
  ASSERT_TRUE(
      kt.bind(&kQp1, &r.pd, bind_args(w, kb1, r, 0x10000 + 1024, 1024, IBV_ACCESS_REMOTE_WRITE)));
  const uint32_t k = w.key(kb1);
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 1024, 1024, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::ok);
  EXPECT_EQ(p, r.mem.data() + 1024);
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 1023, 2, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::bounds);
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 2047, 2, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::bounds);
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 1024, 8, IBV_ACCESS_REMOTE_READ, true, &p),
            AccessResult::access_rights);
  // Type 1: any QP of the PD may use it; another PD may not.
  Pd other;
  EXPECT_EQ(check(r, k, &r.pd, 0x10000 + 1024, 8, IBV_ACCESS_REMOTE_WRITE, true, &p, &kQp2),
            AccessResult::ok);
  EXPECT_EQ(check(r, k, &other, 0x10000 + 1024, 8, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::wrong_pd);
  // The key it had before the bind, and local use of a window key, are refused.
  EXPECT_EQ(check(r, w.mw.mw.rkey, &r.pd, 0x10000 + 1024, 8, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::invalid_key);
  EXPECT_EQ(check(r, k, &r.pd, reinterpret_cast<uint64_t>(r.mem.data()) + 1024, 8, 0, false, &p),
            AccessResult::invalid_key);
  // A zero-length bind unbinds it: the key stops working.
  BindArgs unbind;
  unbind.mw_rkey = k;
  unbind.new_rkey = w.key(kb2);
  ASSERT_TRUE(kt.bind(&kQp1, &r.pd, unbind));
  EXPECT_EQ(check(r, w.key(kb2), &r.pd, 0x10000 + 1024, 1, IBV_ACCESS_REMOTE_WRITE, true, &p),
            AccessResult::invalid_key);
  EXPECT_FALSE(kt.invalidate(nullptr, &r.pd, w.key(kb2))) << "type 1 is never invalidated";
}

TEST(KeyTable, BindRefusesWhatTheSpecForbids) {
  auto& kt = KeyTable::get();
  Region r(kBindable, 0x10000);
  Region no_bind(IBV_ACCESS_LOCAL_WRITE, 0, &r.pd);
  Region read_only(IBV_ACCESS_MW_BIND, 0, &r.pd);
  Region elsewhere(kBindable, 0);  // in a PD of its own
  Window w1(&r.pd, IBV_MW_TYPE_1);
  Window w2(&r.pd, IBV_MW_TYPE_2);
  const int rw = IBV_ACCESS_REMOTE_WRITE;
  // C10-73: the region needs MW_BIND.
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, no_bind, 0, 16, rw)));
  // C10-74: a writable window needs a locally writable region; a readable one does not.
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, read_only, 0, 16, rw)));
  // C10-72: the QP's PD is the window's; and the region is in the window's PD.
  EXPECT_FALSE(kt.bind(&kQp1, &elsewhere.pd, bind_args(w1, 1, r, 0x10000, 16, rw)));
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, elsewhere, 0, 16, rw)));
  // C10-75: inside the region.
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, r, 0x10000 + 4000, 97, rw)));
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, r, 0xFFFF, 16, rw)));
  // o10-36.2.2: a type 1 window is not zero based.
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, r, 0, 16, rw | IBV_ACCESS_ZERO_BASED)));
  // o10-37.2.40: a type 2 window is not bound with length 0.
  BindArgs empty = bind_args(w2, 1, r, 0x10000, 0, rw);
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, empty));
  // The new key must keep the window's index.
  BindArgs moved = bind_args(w2, 1, r, 0x10000, 16, rw);
  moved.new_rkey ^= 0x100;
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, moved));
  // A region key that is not live.
  BindArgs stale = bind_args(w2, 1, r, 0x10000, 16, rw);
  stale.mr_lkey ^= 0x01000000;
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, stale));
  // None of that bound anything; the read-only bind is allowed.
  std::byte* p;
  EXPECT_FALSE(kt.has_windows(&read_only.mr));
  ASSERT_TRUE(kt.bind(&kQp1, &r.pd, bind_args(w1, 1, read_only, 0, 16, IBV_ACCESS_REMOTE_READ)));
  EXPECT_TRUE(kt.has_windows(&read_only.mr));
  EXPECT_FALSE(kt.has_windows(&r.mr));
  EXPECT_EQ(check(r, w2.key(1), &r.pd, 0x10000, 1, rw, true, &p, &kQp1), AccessResult::invalid_key);
  // o10-37.2.30: a valid type 2 window is not bound again before it is invalidated.
  ASSERT_TRUE(kt.bind(&kQp1, &r.pd, bind_args(w2, 1, r, 0x10000, 16, rw)));
  EXPECT_FALSE(kt.bind(&kQp1, &r.pd, bind_args(w2, 2, r, 0x10000, 16, rw)));
}

TEST(KeyTable, Type2WindowServesItsQpUntilInvalidated) {
  auto& kt = KeyTable::get();
  Region r(kBindable | IBV_ACCESS_REMOTE_READ, 0);
  Window w(&r.pd, IBV_MW_TYPE_2);
  std::byte* p = nullptr;
  const int acc = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ZERO_BASED;
  ASSERT_TRUE(kt.bind(&kQp1, &r.pd, bind_args(w, 7, r, 512, 256, acc)));
  const uint32_t k = w.key(7);
  // Zero based: offsets from 0 address the window's start.
  EXPECT_EQ(check(r, k, &r.pd, 0, 256, IBV_ACCESS_REMOTE_READ, true, &p, &kQp1), AccessResult::ok);
  EXPECT_EQ(p, r.mem.data() + 512);
  EXPECT_EQ(check(r, k, &r.pd, 1, 256, IBV_ACCESS_REMOTE_READ, true, &p, &kQp1),
            AccessResult::bounds);
  // Type 2B: another QP of the same PD may not use it.
  EXPECT_EQ(check(r, k, &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p, &kQp2),
            AccessResult::wrong_pd);
  // While bound, the region cannot go.
  EXPECT_TRUE(kt.has_windows(&r.mr));
  EXPECT_FALSE(kt.remove(&r.mr));
  // A Send with Invalidate from another QP, a stale key or another PD does not invalidate.
  Pd other;
  EXPECT_FALSE(kt.invalidate(&kQp2, &r.pd, k));
  EXPECT_FALSE(kt.invalidate(&kQp1, &r.pd, w.key(8)));
  EXPECT_FALSE(kt.invalidate(nullptr, &other, k));
  EXPECT_FALSE(kt.invalidate(nullptr, &r.pd, r.mr.mr.rkey)) << "a user region is not invalidated";
  EXPECT_TRUE(kt.invalidate(&kQp1, &r.pd, k));
  EXPECT_EQ(check(r, k, &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p, &kQp1),
            AccessResult::invalid_key);
  EXPECT_FALSE(kt.invalidate(nullptr, &r.pd, k)) << "already free";
  EXPECT_FALSE(kt.has_windows(&r.mr));
  // Free again: it can be bound again, with the next key.
  ASSERT_TRUE(kt.bind(&kQp1, &r.pd, bind_args(w, 8, r, 0, 64, IBV_ACCESS_REMOTE_READ)));
  // Its QP going away frees it.
  kt.qp_gone(&kQp1);
  EXPECT_EQ(check(r, w.key(8), &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p, &kQp1),
            AccessResult::invalid_key);
  EXPECT_FALSE(kt.has_windows(&r.mr));
}

TEST(KeyTable, RemovingABoundWindowReleasesItsRegion) {
  auto& kt = KeyTable::get();
  Region r(kBindable, 0);
  uint32_t k;
  {
    Window w(&r.pd, IBV_MW_TYPE_1);
    ASSERT_TRUE(kt.bind(&kQp1, &r.pd, bind_args(w, 3, r, 0, 64, IBV_ACCESS_REMOTE_WRITE)));
    k = w.key(3);
    EXPECT_TRUE(kt.has_windows(&r.mr));
  }
  EXPECT_FALSE(kt.has_windows(&r.mr));
  std::byte* p;
  EXPECT_EQ(check(r, k, &r.pd, 0, 8, IBV_ACCESS_REMOTE_WRITE, true, &p), AccessResult::invalid_key);
}

// check_local remembers a thread's last pass: what it lets through without the lock must be
// exactly what check() lets through, before and after the region changes or goes.
TEST(KeyTable, ARememberedLocalPassHoldsOnlyWhileItsRegionStands) {
  auto& kt = KeyTable::get();
  auto local = [&](uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need) {
    std::byte* p = nullptr;
    const AccessResult r = kt.check_local(key, pd, addr, len, need, &p);
    if (r == AccessResult::ok) {
      EXPECT_EQ(p, reinterpret_cast<std::byte*>(addr));
    }
    return r;
  };
  auto r = std::make_unique<Region>(IBV_ACCESS_LOCAL_WRITE, 0);
  const uint32_t k = r->mr.mr.lkey;
  const auto a = reinterpret_cast<uint64_t>(r->mem.data());
  ASSERT_EQ(local(k, &r->pd, a, 4096, IBV_ACCESS_LOCAL_WRITE), AccessResult::ok);  // remembered
  // What the pass does not cover is checked in full.
  EXPECT_EQ(local(k, &r->pd, a + 1, 4096, 0), AccessResult::bounds);
  EXPECT_EQ(local(k, &r->pd, a - 1, 1, 0), AccessResult::bounds);
  EXPECT_EQ(local(k, &r->pd, ~0ull - 2, 8, 0), AccessResult::bounds);
  Pd other;
  EXPECT_EQ(local(k, &other, a, 8, 0), AccessResult::wrong_pd);
  EXPECT_EQ(local(k ^ 0xff, &r->pd, a, 8, 0), AccessResult::invalid_key);
  EXPECT_EQ(local(k, &r->pd, a + 4088, 8, IBV_ACCESS_LOCAL_WRITE), AccessResult::ok);
  // Access taken away (rereg): the next check sees it.
  kt.change(&r->mr, &r->pd, 0);
  EXPECT_EQ(local(k, &r->pd, a, 8, IBV_ACCESS_LOCAL_WRITE), AccessResult::access_rights);
  EXPECT_EQ(local(k, &r->pd, a, 8, 0), AccessResult::ok);
  // Moved to another PD.
  kt.change(&r->mr, &other, 0);
  EXPECT_EQ(local(k, &r->pd, a, 8, 0), AccessResult::wrong_pd);
  kt.change(&r->mr, &r->pd, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(local(k, &r->pd, a, 8, IBV_ACCESS_LOCAL_WRITE), AccessResult::ok);
  // Deregistered: its key names nothing, though this thread passed it a moment ago (the
  // same PD pointer, only compared: the pass would match it).
  const Pd* pd1 = &r->pd;
  r.reset();
  EXPECT_EQ(local(k, pd1, a, 8, 0), AccessResult::invalid_key);
  // A pass on another thread is that thread's: removing a region there is seen here.
  auto r2 = std::make_unique<Region>(IBV_ACCESS_LOCAL_WRITE, 0);
  const uint32_t k2 = r2->mr.mr.lkey;
  const auto a2 = reinterpret_cast<uint64_t>(r2->mem.data());
  const Pd* pd2 = &r2->pd;
  ASSERT_EQ(local(k2, pd2, a2, 8, 0), AccessResult::ok);
  std::thread([&] { r2.reset(); }).join();
  EXPECT_EQ(local(k2, pd2, a2, 8, 0), AccessResult::invalid_key);
}
