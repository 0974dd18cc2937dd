// Formats of what RDS processes share on a host (another user may write them: parse them
// as untrusted bytes). Pure functions, fuzzed by fuzz/fuzz_rds.cc.
//   registry name: the abstract unix socket "@softverbs-rds/<realm>/<ip>_<port>" (bind.cc)
//   registry entry: "<rdma_cm port> <generation>", of the owner's process name
//     "@softverbs-rds/<realm>/pid/<pid>=<rdma_cm port>_<generation>"
//   info snapshot <dir>/info/<pid>: repeated [i32 id][i32 record size][u32 bytes][records]:
//     the RDS_INFO_* tables, and kInfoMeta (who wrote it)
//   retired sum <dir>/info/retired.<uid>: RDS_INFO_COUNTERS (the counters of that user's
//     processes that ended) and kInfoFolded (the generations whose counters it holds)
#pragma once
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sv::wire {

inline std::string registry_entry_format(uint16_t cm_port, uint64_t gen) {
  return std::to_string(cm_port) + " " + std::to_string(gen) + "\n";
}

// False unless the whole entry is "<1..65535> <u64>" with an optional newline.
inline bool registry_entry_parse(std::string_view s, uint16_t& cm_port, uint64_t& gen) {
  if (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  const auto sp = s.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 == s.size()) return false;
  unsigned port = 0;
  auto r = std::from_chars(s.data(), s.data() + sp, port);
  if (r.ec != std::errc() || r.ptr != s.data() + sp || port == 0 || port > 65535) return false;
  uint64_t g = 0;
  r = std::from_chars(s.data() + sp + 1, s.data() + s.size(), g);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size()) return false;
  cm_port = static_cast<uint16_t>(port);
  gen = g;
  return true;
}

// The registry's realm: "host", or for a private registry (SOFTVERBS_RDS_DIR, any path) a
// short fixed-length name: its FNV-1a hash in hex.
inline std::string registry_realm(const char* dir) {
  if (!dir || !*dir) return "host";
  uint64_t h = 1469598103934665603ull;
  for (const char* p = dir; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string r(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) r[static_cast<size_t>(i)] = kHex[h & 15];
  return r;
}

// The abstract socket name (without its leading NUL) of (ip, port) in a realm, and the
// prefix of every name on ip.
inline std::string registry_name_prefix(std::string_view realm, std::string_view ip) {
  std::string n = "softverbs-rds/";
  n.append(realm).append("/").append(ip).append("_");
  return n;
}
inline std::string registry_name(std::string_view realm, std::string_view ip, uint16_t port) {
  return registry_name_prefix(realm, ip) + std::to_string(port);
}

// The name a process holds for as long as it has a port: "<realm>/pid/<pid>=<cm_port>_<gen>"
// under the registry's prefix. A querier that learned the owner's pid from the port's socket
// (SO_PEERCRED) finds the owner's entry here, by listing the names of that uid (sock_diag), and
// believes a name only if the socket holding it is that pid's too.
inline std::string registry_proc_prefix(std::string_view realm, int pid) {
  std::string n = "softverbs-rds/";
  n.append(realm).append("/pid/").append(std::to_string(pid)).append("=");
  return n;
}
inline std::string registry_proc_name(std::string_view realm, int pid, uint16_t cm_port,
                                      uint64_t gen) {
  return registry_proc_prefix(realm, pid) + std::to_string(cm_port) + "_" + std::to_string(gen);
}
// The entry of a process name with the given prefix: false unless name is
// "<prefix><1..65535>_<u64>".
inline bool registry_proc_parse(std::string_view name, std::string_view prefix, uint16_t& cm_port,
                                uint64_t& gen) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return false;
  std::string entry(name.substr(prefix.size()));
  const auto us = entry.find('_');
  if (us == std::string::npos || entry.find(' ') != std::string::npos) return false;
  entry[us] = ' ';
  return registry_entry_parse(entry, cm_port, gen);
}

// The live table: how a querier checks its cached answer with two loads instead of a system
// call per send. The owner of ports keeps one sealed memfd (no shrinking, no new writable
// mapping), and sends it (SCM_RIGHTS) with a hello to each querier its registry thread takes
// in for a port. The table holds:
//  - at kLiveLockOffset, a robust process-shared mutex that the owner's registry thread locks
//    and never unlocks: its first word is the locker's thread id, and when that thread ends
//    (the process exits, is killed or execs) the kernel sets FUTEX_OWNER_DIED in it
//    (the robust futex list), before it closes the process's sockets;
//  - from kLiveSlotsOffset, one 64-bit word per port the owner holds: the port's token while
//    it holds it, 0 once it let go (stored before it closes the port's name).
// A hello is [u32 magic][u16 version][u16 0][u32 slot][u32 tid][u64 token], little-endian as
// the table's words are native (one host).
inline constexpr uint32_t kRegistryHelloMagic = 0x4c525653;  // "SVRL"
inline constexpr uint16_t kRegistryHelloVersion = 1;
inline constexpr size_t kRegistryHelloLen = 24;
inline constexpr size_t kLiveLockOffset = 64;
inline constexpr size_t kLiveSlotsOffset = 128;
inline constexpr uint32_t kLiveSlots = 16384;
inline constexpr size_t kLiveTableBytes = kLiveSlotsOffset + size_t{kLiveSlots} * 8;
inline constexpr uint32_t kFutexTidMask = 0x3fffffff;
inline constexpr uint32_t kFutexOwnerDied = 0x40000000;

struct RegistryHello {
  uint32_t slot = 0;
  uint32_t tid = 0;    // the owner's registry thread, which holds the table's lock
  uint64_t token = 0;  // the slot's word while the owner holds the port
};

inline void registry_hello_encode(const RegistryHello& h, std::byte out[kRegistryHelloLen]) {
  const uint16_t zero = 0;
  std::memcpy(out, &kRegistryHelloMagic, 4);
  std::memcpy(out + 4, &kRegistryHelloVersion, 2);
  std::memcpy(out + 6, &zero, 2);
  std::memcpy(out + 8, &h.slot, 4);
  std::memcpy(out + 12, &h.tid, 4);
  std::memcpy(out + 16, &h.token, 8);
}

// False unless d is exactly one hello of this version naming a slot of the table, a thread
// id the kernel could write, and a token (never 0: 0 is a port let go).
inline bool registry_hello_decode(const std::byte* d, size_t n, RegistryHello& h) {
  if (n != kRegistryHelloLen) return false;
  uint32_t magic;
  uint16_t version, zero;
  std::memcpy(&magic, d, 4);
  std::memcpy(&version, d + 4, 2);
  std::memcpy(&zero, d + 6, 2);
  RegistryHello r;
  std::memcpy(&r.slot, d + 8, 4);
  std::memcpy(&r.tid, d + 12, 4);
  std::memcpy(&r.token, d + 16, 8);
  if (magic != kRegistryHelloMagic || version != kRegistryHelloVersion || zero != 0 ||
      r.slot >= kLiveSlots || r.tid == 0 || (r.tid & ~kFutexTidMask) != 0 || r.token == 0)
    return false;
  h = r;
  return true;
}

// Whether the table's lock word and the hello's slot word say the owner still holds the port:
// its registry thread alive and locking, and the slot still the port's.
inline bool registry_live(uint32_t lock_word, uint64_t slot_word, const RegistryHello& h) {
  return (lock_word & kFutexOwnerDied) == 0 && (lock_word & kFutexTidMask) == h.tid &&
         slot_word == h.token;
}

// The port of a registry name with the given prefix (a listed abstract name, its '@' or NUL
// the NUL already dropped), or 0 if name is not "<prefix><1..65535>".
inline uint16_t registry_name_port(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return 0;
  const std::string_view digits = name.substr(prefix.size());
  unsigned port = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size() || port > 65535) return 0;
  return static_cast<uint16_t>(port);
}

// Tables of our own in the info files (RDS_INFO_* ids are positive).
inline constexpr int32_t kInfoMeta = -1;    // one InfoMeta
inline constexpr int32_t kInfoFolded = -2;  // u64 generations, oldest first
inline constexpr size_t kInfoFoldedMax = 4096;

// Who wrote a snapshot: the process' RDS generation, and what tells whether that process
// still runs: its start time (/proc/<pid>/stat, clock ticks since boot: a reused pid has
// another) in its pid namespace (the inode of /proc/self/ns/pid).
struct InfoMeta {
  uint64_t gen = 0;
  uint64_t start = 0;
  uint64_t pidns = 0;
};

inline void info_blob_append(std::string& blob, int32_t id, int32_t each, const char* data,
                             uint32_t bytes) {
  blob.append(reinterpret_cast<const char*>(&id), 4);
  blob.append(reinterpret_cast<const char*>(&each), 4);
  blob.append(reinterpret_cast<const char*>(&bytes), 4);
  blob.append(data, bytes);
}

// Appends the records of table `id` to out, if they have the size we expect (`each`) and
// whole records; false (nothing appended for the bad part) on a malformed blob.
inline bool info_blob_records(std::string_view blob, int32_t id, int32_t each,
                              std::vector<char>& out) {
  size_t off = 0;
  while (off < blob.size()) {
    if (blob.size() - off < 12) return false;
    int32_t bid, beach;
    uint32_t n;
    std::memcpy(&bid, blob.data() + off, 4);
    std::memcpy(&beach, blob.data() + off + 4, 4);
    std::memcpy(&n, blob.data() + off + 8, 4);
    off += 12;
    if (n > blob.size() - off) return false;
    if (bid == id) {
      if (beach != each || each <= 0 || n % static_cast<uint32_t>(each) != 0) return false;
      out.insert(out.end(), blob.data() + off, blob.data() + off + n);
    }
    off += n;
  }
  return true;
}

// The writer of a snapshot, if it says (exactly one InfoMeta record).
inline bool info_meta_parse(std::string_view blob, InfoMeta& m) {
  std::vector<char> r;
  if (!info_blob_records(blob, kInfoMeta, sizeof m, r) || r.size() != sizeof m) return false;
  std::memcpy(&m, r.data(), sizeof m);
  return true;
}

// A retired sum: its counter records (each `counter_size` bytes) and the generations folded
// into it (at most kInfoFoldedMax: a longer list is malformed).
inline bool info_retired_parse(std::string_view blob, int32_t counters_id, int32_t counter_size,
                               std::vector<char>& counters, std::vector<uint64_t>& folded) {
  std::vector<char> gens;
  if (!info_blob_records(blob, counters_id, counter_size, counters) ||
      !info_blob_records(blob, kInfoFolded, 8, gens) || gens.size() / 8 > kInfoFoldedMax)
    return false;
  folded.resize(gens.size() / 8);
  if (!gens.empty()) std::memcpy(folded.data(), gens.data(), gens.size());
  return true;
}

}  // namespace sv::wire
