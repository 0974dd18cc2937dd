// Keys (STags) and access checks of the engine's key table (engine/mr.h), without verbs:
// every byte of a region is checked for bounds, PD and access rights; keys are
// unguessable-ish and not soon reused.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

#include "engine/mr.h"

using namespace sv::engine;

namespace {

struct Region {
  Pd pd;
  Mr mr;
  std::vector<std::byte> mem = std::vector<std::byte>(4096);
  Region(int access, uint64_t iova) {
    mr.pd = &pd;
    mr.access = access;
    mr.iova = iova;
    mr.mr.addr = mem.data();
    mr.mr.length = mem.size();
    EXPECT_TRUE(KeyTable::get().add(&mr));
  }
  ~Region() { KeyTable::get().remove(&mr); }
};

AccessResult check(const Region&, uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need,
                   bool remote, std::byte** p) {
  auto& kt = KeyTable::get();
  auto g = kt.read_guard();
  return kt.check(key, pd, addr, len, need, remote, p);
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
  EXPECT_EQ(check(r, k ^ 0x10000, &r.pd, 0, 8, IBV_ACCESS_REMOTE_READ, true, &p),
            AccessResult::invalid_key)
      << "same slot, other random half";
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
    EXPECT_NE(first & 0xFFFF0000u, 0u) << "the random half is never zero";
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
    const uint32_t slot = rs.back()->mr.mr.rkey & 0xFFFF;
    slots.insert(slot);
    if (slot == prev + 1) ++consecutive;
    prev = slot;
  }
  EXPECT_EQ(slots.size(), 4096u);
  EXPECT_LT(consecutive, 64) << "slots are handed out in order";
  EXPECT_GT(*slots.rbegin(), 8192u) << "slots crowd the start of the table";
}
