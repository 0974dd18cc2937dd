// Every SOFTVERBS_* environment variable, in one table: its kind, default and range, and
// the one strict parser each reader uses. Header-only, because libsvrds reads its RDS
// settings without the engine (it can run on rdma-core's libibverbs).
//
// Readers never warn: a value that does not parse, or is out of range, reads as the
// default. The warning is check_settings()'s (engine/settings.cc), once per process when
// the device is first used, on stderr whatever SOFTVERBS_LOG says, so a typo is never
// silent and never repeated. docs/configuration.md documents this table.
#pragma once
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <string_view>

namespace sv::settings {

enum class Kind : uint8_t {
  uint,       // decimal digits only, within [lo, hi]
  flag,       // 0 or 1
  real,       // a positive decimal number
  text,       // any non-empty value (a path)
  netdevs,    // comma-separated interface names (engine/settings.cc checks they exist)
  log_level,  // none|error|warn|info|debug or 0-4 (engine/log.cc)
};

struct Setting {
  const char* name;
  Kind kind;
  uint64_t dflt;  // uint and flag
  uint64_t lo, hi;
  double real_dflt;
};

// The ceiling of every µs setting: a minute (tests hold ownership or batches for seconds).
inline constexpr uint64_t kUsMax = 60000000;

// clang-format off
inline constexpr Setting kAll[] = {
    // The device (engine/device.cc): interfaces, and limits that may only be lowered,
    // as a provider's module parameters.
    {"SOFTVERBS_NETDEV", Kind::netdevs, 0, 0, 0, 0},
    {"SOFTVERBS_MAX_QP", Kind::uint, 65024, 1, 65024, 0},  // QPN space (device.h kMaxQp)
    {"SOFTVERBS_MAX_CQ", Kind::uint, 65535, 1, 65535, 0},
    {"SOFTVERBS_MAX_PD", Kind::uint, 65535, 1, 65535, 0},
    {"SOFTVERBS_MAX_MR", Kind::uint, 65535, 1, 65535, 0},  // regions and windows share the
    {"SOFTVERBS_MAX_MW", Kind::uint, 65535, 1, 65535, 0},  // 65535 keys of the key table
    {"SOFTVERBS_MAX_SRQ", Kind::uint, 65535, 1, 65535, 0},
    {"SOFTVERBS_MAX_AH", Kind::uint, 65535, 1, 65535, 0},
    // The wire (engine/iw_cm.cc, rdmacm/cma.cc).
    {"SOFTVERBS_MPA_CRC", Kind::flag, 0, 0, 1, 0},
    {"SOFTVERBS_MPA_TIMEOUT_MS", Kind::uint, 10000, 1, 3600000, 0},
    {"SOFTVERBS_REFUSED_RETRY_US", Kind::uint, 3000, 0, kUsMax, 0},
    {"SOFTVERBS_RFC7306", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_IB_COMPLETION", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_SHM", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_SHM_RING", Kind::uint, 256 * 1024, 4096, 16u << 20, 0},
    {"SOFTVERBS_SHM_PULL_MIN", Kind::uint, 4096, 0, 1u << 31, 0},  // 0: never pull
    {"SOFTVERBS_PROT_ERR_BURST", Kind::real, 0, 0, 0, 32},
    {"SOFTVERBS_PROT_ERR_PER_SEC", Kind::real, 0, 0, 0, 4},
    // The data path (engine/qp.cc, engine/busy_poll.cc). SNDBUF 0: the kernel's autotuning.
    {"SOFTVERBS_SNDBUF", Kind::uint, 0, 0, 1u << 30, 0},
    {"SOFTVERBS_TX_BATCH_US", Kind::uint, 10, 0, kUsMax, 0},
    {"SOFTVERBS_BUSY_POLL_US", Kind::uint, 50, 0, kUsMax, 0},
    {"SOFTVERBS_ACK_HOLD_US", Kind::uint, 50, 0, kUsMax, 0},
    {"SOFTVERBS_SPIN_YIELD_US", Kind::uint, 100, 0, kUsMax, 0},
    // engine/qp_trim.cc. 0: idle connections keep their stream buffers.
    {"SOFTVERBS_IDLE_TRIM_MS", Kind::uint, 1000, 0, 3600000, 0},
    // Diagnostics (engine/log.cc, engine/stats.cc, verbs/sysfs.cc).
    {"SOFTVERBS_LOG", Kind::log_level, 0, 0, 0, 0},
    {"SOFTVERBS_DEBUG", Kind::flag, 0, 0, 1, 0},
    {"SOFTVERBS_STATS", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_STATS_DIR", Kind::text, 0, 0, 0, 0},
    {"SOFTVERBS_STATS_QPS", Kind::uint, 1024, 1, 65535, 0},
    {"SOFTVERBS_SYSFS", Kind::text, 0, 0, 0, 0},
    // Fault injection (engine/fault.cc; its grammar: wire/fault_spec.h).
    {"SOFTVERBS_FAULT", Kind::text, 0, 0, 0, 0},
    // RDS (src/rds, src/rds_preload). IDLE_MS 0: never close an idle connection.
    {"SOFTVERBS_RDS_DIR", Kind::text, 0, 0, 0, 0},
    {"SOFTVERBS_RDS_IDLE_MS", Kind::uint, 30000, 0, 86400000, 0},
    {"SOFTVERBS_RDS_BUSY_POLL_US", Kind::uint, 0, 0, kUsMax, 0},
    {"SOFTVERBS_RDS_WAIT_RX", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_RDS_LAZY_TOKEN", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_RDS_CQ_HANDLER", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_RDS_FENCE", Kind::flag, 1, 0, 1, 0},
    {"SOFTVERBS_RDS_CONFIRM_READ", Kind::flag, 0, 0, 1, 0},
    {"SOFTVERBS_RDS_SRQ", Kind::flag, 1, 0, 1, 0},
    // RDS regions: 0 zero-based, 1 by virtual address, 2 by virtual address on a device that
    // ignores the iova (Linux siw), else zero-based (rdma.cc).
    {"SOFTVERBS_RDS_MR_VA", Kind::uint, 2, 0, 2, 0},
    {"SOFTVERBS_RDS_TEST_LATE_ESTABLISHED", Kind::flag, 0, 0, 1, 0},
    {"SOFTVERBS_RDS_TEST_POST_WINDOW_MS", Kind::uint, 0, 0, 10000, 0},
    {"SOFTVERBS_RDS_TEST_SRQ_BUFS", Kind::uint, 0, 0, 1024, 0},
    {"SOFTVERBS_RDS_TEST_SRQ_GROW", Kind::flag, 1, 0, 1, 0},
};
// clang-format on

// The index of `name` in kAll, or std::size(kAll). Indexes, not pointers: GCC does not take
// a pointer's comparison with null as a constant when UBSan instruments it.
constexpr size_t index_of(std::string_view name) {
  size_t i = 0;
  while (i < std::size(kAll) && name != kAll[i].name) ++i;
  return i;
}
// A setting by name, for constant expressions (a name missing from the table does not
// compile: the index is out of the array).
constexpr const Setting& get(std::string_view name) {
  return kAll[index_of(name)];
}
// By name at run time (engine/settings.cc): null if `name` is no setting.
inline const Setting* find(std::string_view name) {
  const size_t i = index_of(name);
  return i < std::size(kAll) ? &kAll[i] : nullptr;
}

// The whole of `s` as a decimal number within [lo, hi]: no sign, no space, no suffix
// ("12abc" is not 12), no overflow.
inline std::optional<uint64_t> parse_uint(const char* s, uint64_t lo, uint64_t hi) {
  if (!s || !*s) return std::nullopt;
  uint64_t v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') return std::nullopt;
    const uint64_t d = static_cast<uint64_t>(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

inline std::optional<bool> parse_flag(const char* s) {
  if (!s) return std::nullopt;
  if (std::strcmp(s, "0") == 0) return false;
  if (std::strcmp(s, "1") == 0) return true;
  return std::nullopt;
}

inline std::optional<double> parse_real(const char* s) {
  if (!s || !*s) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (*end || errno || !(v > 0) || v > 1e12) return std::nullopt;
  return v;
}

// The value of a uint setting: its default when unset, empty or invalid.
inline uint64_t uint_value(const Setting& s) {
  return parse_uint(std::getenv(s.name), s.lo, s.hi).value_or(s.dflt);
}
inline bool flag_value(const Setting& s) {
  return parse_flag(std::getenv(s.name)).value_or(s.dflt != 0);
}
inline double real_value(const Setting& s) {
  return parse_real(std::getenv(s.name)).value_or(s.real_dflt);
}
// Set and non-empty (text and netdevs settings), else null.
inline const char* text_value(const Setting& s) {
  const char* e = std::getenv(s.name);
  return e && *e ? e : nullptr;
}

// By name, for readers: a name missing from the table does not compile.
#define SV_SETTING(name)                                                            \
  ([]() -> const ::sv::settings::Setting& {                                         \
    static_assert(::sv::settings::index_of(name) < std::size(::sv::settings::kAll), \
                  name " unknown");                                                 \
    return ::sv::settings::kAll[::sv::settings::index_of(name)];                    \
  }())

}  // namespace sv::settings
