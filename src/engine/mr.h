// Memory regions and their keys (STags). A key is (random 16 bits << 16 | slot): the slot
// makes lookup one array index, the random half makes keys unguessable, and slots are
// recycled FIFO with fresh random bits so a deregistered key is not soon valid again.
// lkey == rkey == STag, as siw does (RFC 5040 §2.3: the STag names the region remotely).
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace sv {
template <class T>
class ForkLocal;
}

namespace sv::engine {

struct Pd {
  ibv_pd pd;                  // first
  std::atomic<int> users{0};  // MRs, QPs, SRQs, AHs: ibv_dealloc_pd is EBUSY while > 0
};

struct Mr {
  ibv_mr mr;  // first
  Pd* pd = nullptr;
  int access = 0;
  uint64_t iova = 0;  // remote addresses are relative to iova (ibv_reg_mr_iova2)
};

// Result of checking an access against a region.
enum class AccessResult : uint8_t {
  ok,
  invalid_key,    // no region with this key
  wrong_pd,       // region in another PD (RFC 5040: STag not associated)
  bounds,         // [addr, addr+len) outside the region
  access_rights,  // region lacks the needed IBV_ACCESS_* bit
};

class KeyTable {
 public:
  static KeyTable& get();
  // Assigns a key to mr (sets lkey/rkey). Returns false when the table is full.
  bool add(Mr* mr);
  void remove(Mr* mr);
  // Changes a registered region's PD and/or access in place, keys unchanged (rereg with
  // CHANGE_PD/CHANGE_ACCESS, as rxe does): no check sees a half-made change.
  void change(Mr* mr, Pd* pd, int access);
  // Resolves (key, addr, len) for an access needing `need` (IBV_ACCESS_* bits; 0 = local
  // read). `remote` chooses addressing by iova (remote TO) or by local virtual address.
  // On ok, *ptr is the local address. Caller holds a ReadGuard.
  AccessResult check(uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need, bool remote,
                     std::byte** ptr) const;

  // Placement into a region must not race its deregistration.
  std::shared_lock<std::shared_mutex> read_guard() const { return std::shared_lock(mu_); }

 private:
  friend class sv::ForkLocal<KeyTable>;
  KeyTable();
  static constexpr uint32_t kSlots = 1u << 16;
  mutable std::shared_mutex mu_;
  std::vector<Mr*> slot_;
  std::vector<uint32_t> key_;
  std::deque<uint32_t> free_;
  uint64_t rng_;
  uint32_t next_random();
};

}  // namespace sv::engine
