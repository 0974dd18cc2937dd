// Memory regions, memory windows and their keys (STags). A key is
// (random 8 bits << 24 | slot << 8 | key 8 bits): the slot makes lookup one array index, the
// random bits make keys unguessable, and slots are recycled FIFO with fresh random bits so a
// deregistered key is not soon valid again. The low byte is the IB "key" part a consumer may
// choose when it rebinds a type 2 window (ibv_inc_rkey, IB spec 10.6.7.2.6: the index is
// the upper 24 bits); for regions it is random too.
// lkey == rkey == STag for regions, as siw does (RFC 5040 §2.3: the STag names the region
// remotely); a window has an rkey only.
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "util/raw_array.h"

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
  uint64_t iova = 0;       // remote addresses are relative to iova (ibv_reg_mr_iova2)
  uint32_t bound_mws = 0;  // windows bound to it (KeyTable's lock): no dereg while > 0
};

// A memory window (IB spec 10.6.7): a remote-access view of part of a region, bound and
// unbound by work requests on a QP. Type 1 is always valid and bound by ibv_bind_mw (a
// zero length unbinds it); type 2 (2B) is free until a Bind WR makes it valid for the QP
// that bound it only, and free again after LOCAL_INV, a peer's Send with Invalidate or
// deallocation. Fields past `mw` are guarded by KeyTable's lock.
struct Mw {
  ibv_mw mw;  // first; mw.rkey is the application's copy, the table holds the live key
  Pd* pd = nullptr;
  uint32_t slot = 0;
  bool valid = false;        // type 2: bound (IB "valid"), else "free"
  Mr* mr = nullptr;          // the region it views; null when unbound
  const void* qp = nullptr;  // type 2: the only QP that may use it (IB type 2B)
  int access = 0;            // IBV_ACCESS_REMOTE_* (+ ZERO_BASED)
  uint64_t addr = 0;         // start, in the region's iova space
  uint64_t length = 0;
};

struct BindArgs {
  uint32_t mw_rkey = 0;   // names the window (its key byte is not compared)
  uint32_t new_rkey = 0;  // its low 8 bits become the window's key
  uint32_t mr_lkey = 0;   // the region (0 with length 0: unbind a type 1 window)
  uint64_t addr = 0;
  uint64_t length = 0;
  int access = 0;
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
  // Forgets mr's key. False (nothing changed) while windows are bound to it (IB spec
  // 10.6.7.2.6: a region with bound windows cannot be deregistered; rxe: EINVAL).
  [[nodiscard]] bool remove(Mr* mr);
  bool has_windows(const Mr* mr) const;
  bool add(Mw* mw);
  void remove(Mw* mw);  // unbinds it first
  // Executes a Bind Memory Window WR posted on qp (in `pd`); false when rxe's checks refuse
  // it (IB spec C10-72..75, o10-36.2.2, o10-37.2.30/40). The window's key byte becomes
  // new_rkey's. ibv_mw.rkey is not written here: for type 1 ibv_bind_mw sets it at post
  // (as rdma-core's providers do); for type 2 the application keeps the key it chose.
  bool bind(const void* qp, const Pd* pd, const BindArgs& a);
  // Invalidates the valid type 2 window named by rkey in pd: LOCAL_INV (qp null), or a
  // peer's Send with Invalidate arriving on qp, which must be the window's QP (type 2B).
  // Regions and type 1 windows cannot be invalidated (o10-37.2.26; user regions are not
  // fast-register regions, rxe refuses them too).
  bool invalidate(const void* qp, const Pd* pd, uint32_t rkey);
  // A QP is going away: type 2 windows bound to it become free.
  void qp_gone(const void* qp);
  // Changes a registered region's PD and/or access in place, keys unchanged (rereg with
  // CHANGE_PD/CHANGE_ACCESS, as rxe does): no check sees a half-made change.
  void change(Mr* mr, Pd* pd, int access);
  // Resolves (key, addr, len) for an access needing `need` (IBV_ACCESS_* bits; 0 = local
  // read). `remote` chooses addressing by iova (remote TO) or by local virtual address.
  // On ok, *ptr is the local address. Caller holds a ReadGuard. A remote access may name a
  // window; `qp` is the QP it arrived on (a type 2 window serves only the QP that bound it).
  AccessResult check(uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need, bool remote,
                     std::byte** ptr, const void* qp = nullptr) const;

  // check() of a local access (an lkey: remote false), the caller holding no ReadGuard. A
  // thread remembers the last region that passed here; while no region was removed or
  // changed since (gen_) and the process has not forked, an access to it by the same PD with
  // rights and a range it covers passes without the table's lock, which every post and
  // receive took (two locked instructions on a line all threads share; without them an 8 B
  // Send stream over shared memory ran 1.2x faster).
  AccessResult check_local(uint32_t key, const Pd* pd, uint64_t addr, uint64_t len, int need,
                           std::byte** ptr);
  // Whether every non-empty SGE of a local gather or scatter list passes check() for `need`
  // in pd. One SGE (the common case) uses check_local; several take the lock once, as the
  // remembered pass is one region. The _locked form: the caller holds a ReadGuard.
  bool local_sgl_ok(const ibv_sge* sge, uint32_t n, const Pd* pd, int need);
  bool local_sgl_ok_locked(const ibv_sge* sge, uint32_t n, const Pd* pd, int need) const;

  // Placement into a region must not race its deregistration.
  std::shared_lock<std::shared_mutex> read_guard() const { return std::shared_lock(mu_); }

 private:
  friend class sv::ForkLocal<KeyTable>;
  KeyTable();
  static constexpr uint32_t kSlots = 1u << 16;
  static uint32_t slot_of(uint32_t key) { return (key >> 8) & (kSlots - 1); }
  struct Entry {
    Mr* mr = nullptr;
    Mw* mw = nullptr;
    uint32_t key = 0;
  };
  bool take_slot(uint32_t* key);
  void give_slot(uint32_t slot);
  AccessResult check_mw(const Mw* mw, const Pd* pd, uint64_t addr, uint64_t len, int need,
                        std::byte** ptr, const void* qp) const;
  void unbind_locked(Mw* mw);
  mutable std::shared_mutex mu_;
  std::atomic<uint64_t> gen_{0};         // under mu_: +1 at each remove(Mr*) and change()
  util::ZeroArray<Entry> slot_{kSlots};  // resident only where used
  uint32_t type2_bound_ = 0;             // qp_gone scans only when some are
  std::vector<uint64_t> used_ = std::vector<uint64_t>(kSlots / 64);  // slot taken (bit)
  uint32_t n_used_ = 1;                                              // slot 0: key 0 is invalid
  uint64_t rng_;
  uint32_t next_random();
};

}  // namespace sv::engine
