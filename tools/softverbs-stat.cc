// softverbs-stat: what ibstat, ibv_devinfo and `rdma resource|statistic` show for a kernel
// device, for softverbs, whose QPs live inside the processes that use them.
//
//   softverbs-stat [-h] [-p PID] [-c COMM] [-q] [dev|qp|stat]...  (default: dev qp stat)
//     dev   devices, ports and GID tables
//     qp    every live QP of every softverbs process of this user: QPN, state, peer
//     stat  counters per process (destroyed QPs included), or per QP with -q; completions
//           by status, errors first among them, each one snake_case key (wc_wr_flush_err)
//   -p and -c keep one process, or the processes of one command name (as `pgrep -x`); a
//   filter that matches no softverbs process is an error (exit 1), as `ps -p` of a stranger.
//
// Processes publish their QPs and counters in /dev/shm/softverbs-stats-<uid>/<pid>
// (SOFTVERBS_STATS_DIR; format and limits in src/wire/stats_file.h). A file whose process is
// gone (pid not running, or running with another start time) is skipped.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "util/proc.h"
#include "wire/stats_file.h"

namespace {

using sv::wire::Ctr;
using sv::wire::kCtrCount;
using sv::wire::kWcStatusCount;
using sv::wire::QpStatsView;
using sv::wire::StatsView;

const char* port_state(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    default:
      return "NOP";
  }
}

// The statistics file's order is ibv_wc_status's; wc_status_name relies on it.
static_assert(IBV_WC_TM_RNDV_INCOMPLETE + 1 == sv::wire::kWcStatusCount);

std::string gid_text(const ibv_gid& g) {
  char b[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, g.raw, b, sizeof b);
  return b;
}

int show_devices() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    std::perror("ibv_get_device_list");
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    ibv_device_attr da{};
    if (!ctx || ibv_query_device(ctx, &da) != 0) {
      std::fprintf(stderr, "%s: cannot open\n", ibv_get_device_name(list[i]));
      if (ctx) ibv_close_device(ctx);
      continue;
    }
    const uint64_t g = be64toh(da.node_guid);
    std::printf("%d: %s: node_type %s fw %s node_guid %04x:%04x:%04x:%04x max_qp %d\n", i,
                ibv_get_device_name(list[i]), ibv_node_type_str(list[i]->node_type), da.fw_ver,
                unsigned(g >> 48 & 0xffff), unsigned(g >> 32 & 0xffff), unsigned(g >> 16 & 0xffff),
                unsigned(g & 0xffff), da.max_qp);
    for (uint8_t p = 1; p <= da.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (ibv_query_port(ctx, p, &pa) != 0) continue;
      std::printf("    port %u: state %s link_layer %s active_mtu %d\n", p, port_state(pa.state),
                  pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
                  128 << pa.active_mtu);
      for (int k = 0; k < pa.gid_tbl_len; ++k) {
        ibv_gid gid;
        if (ibv_query_gid(ctx, p, k, &gid) == 0)
          std::printf("        gid %d: %s\n", k, gid_text(gid).c_str());
      }
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return 0;
}

std::string stats_dir() {
  const char* d = std::getenv("SOFTVERBS_STATS_DIR");
  return d && *d ? d : "/dev/shm/softverbs-stats-" + std::to_string(geteuid());
}

// Reads one statistics file: bounded, never following a symlink.
bool load(const std::string& path, std::vector<std::byte>& buf) {
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
      static_cast<uint64_t>(st.st_size) > sv::wire::kStatsMaxFile) {
    close(fd);
    return false;
  }
  buf.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = read(fd, buf.data() + got, buf.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  buf.resize(got);
  return true;
}

struct Filter {
  long pid = 0;      // 0: any
  std::string comm;  // empty: any
  bool any() const { return pid == 0 && comm.empty(); }
};

// Every live process's statistics that the filter keeps, by pid.
std::vector<StatsView> processes(const Filter& f) {
  std::vector<StatsView> out;
  const std::string dir = stats_dir();
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  std::vector<std::byte> buf;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || (f.pid && pid != f.pid)) continue;
    if (!load(dir + "/" + e->d_name, buf)) continue;
    StatsView v;
    const auto err = sv::wire::decode_stats(buf, v);
    if (err != sv::wire::StatsError::ok) {
      std::fprintf(stderr, "%s/%s: %s\n", dir.c_str(), e->d_name, sv::wire::to_string(err));
      continue;
    }
    // The file names its writer; a pid now running something else is not it.
    if (v.pid != static_cast<uint32_t>(pid) || sv::proc_start_time(static_cast<pid_t>(pid)) == 0 ||
        sv::proc_start_time(static_cast<pid_t>(pid)) != v.start_time)
      continue;
    if (!f.comm.empty() && v.comm != f.comm) continue;
    out.push_back(std::move(v));
  }
  closedir(d);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.pid < b.pid; });
  return out;
}

std::string peer_text(const QpStatsView& q) {
  if (q.family != AF_INET && q.family != AF_INET6) return "-";
  char b[INET6_ADDRSTRLEN];
  inet_ntop(q.family, q.addr.data(), b, sizeof b);
  // Built by appends: GCC 12's -Wrestrict misfires on a chain of operator+ here.
  std::string s;
  if (q.family == AF_INET6) s += '[';
  s += b;
  if (q.family == AF_INET6) s += ']';
  s += ':';
  s += std::to_string(ntohs(q.port));
  return s;
}

void show_qps(const std::vector<StatsView>& ps) {
  for (const auto& p : ps)
    for (const auto& q : p.qps)
      std::printf(
          "link softverbs0/1 lqpn %u rqpn %u type %s state %s peer %s transport %s pid %u comm "
          "%s\n",
          q.qpn, q.dest_qpn,
          q.qp_type == IBV_QPT_RC   ? "RC"
          : q.qp_type == IBV_QPT_UC ? "UC"
          : q.qp_type == IBV_QPT_UD ? "UD"
                                    : "UNKNOWN",
          sv::wire::qp_state_name(q.state), peer_text(q).c_str(),
          q.transport == sv::wire::kTransportShm ? "shm"
          : q.qp_type == IBV_QPT_UD              ? "udp"
                                                 : "tcp",
          p.pid, p.comm.c_str());
}

void print_counters(const QpStatsView& q) {
  for (size_t i = 0; i < kCtrCount; ++i)
    std::printf(" %s %llu", sv::wire::ctr_name(static_cast<Ctr>(i)),
                static_cast<unsigned long long>(q.ctr[i]));
  // Completions: errors first, each by its status name; then the successes.
  uint64_t errors = 0;
  for (size_t s = 1; s < kWcStatusCount; ++s) errors += q.wc[s];
  std::printf(" wc_errors %llu", static_cast<unsigned long long>(errors));
  for (size_t s = 1; s < kWcStatusCount; ++s)
    if (q.wc[s])
      std::printf(" %s %llu", sv::wire::wc_status_name(s),
                  static_cast<unsigned long long>(q.wc[s]));
  std::printf(" %s %llu\n", sv::wire::wc_status_name(0), static_cast<unsigned long long>(q.wc[0]));
}

void show_stats(const std::vector<StatsView>& ps, bool per_qp) {
  for (const auto& p : ps) {
    if (per_qp) {
      for (const auto& q : p.qps) {
        std::printf("link softverbs0/1 lqpn %u pid %u comm %s", q.qpn, p.pid, p.comm.c_str());
        print_counters(q);
      }
      continue;
    }
    QpStatsView total = p.retired;
    for (const auto& q : p.qps) {
      for (size_t i = 0; i < kCtrCount; ++i) total.ctr[i] += q.ctr[i];
      for (size_t i = 0; i < kWcStatusCount; ++i) total.wc[i] += q.wc[i];
    }
    std::printf("link softverbs0/1 pid %u comm %s qps %zu", p.pid, p.comm.c_str(), p.qps.size());
    print_counters(total);
  }
}

constexpr const char kUsage[] =
    "usage: softverbs-stat [-h] [-p PID] [-c COMM] [-q] [dev|qp|stat]...\n"
    "  dev      devices, ports and GID tables\n"
    "  qp       live QPs of this user's softverbs processes: QPN, type, state, peer\n"
    "  stat     counters per process (destroyed QPs included); completions by status\n"
    "           (wc_success, wc_wr_flush_err, ...)\n"
    "  -p PID   only process PID (exit 1 if it is not a softverbs process)\n"
    "  -c COMM  only processes whose command name is COMM, as pgrep -x (exit 1 if none)\n"
    "  -q       stat per QP instead of per process\n"
    "  -h       this help\n"
    "With no command: dev qp stat. Statistics are read from $SOFTVERBS_STATS_DIR\n"
    "(default /dev/shm/softverbs-stats-<uid>).\n";

int usage(FILE* to, int rc) {
  std::fputs(kUsage, to);
  return rc;
}

// Why a filter found nothing: the process is not running, or publishes no statistics.
int no_match(const Filter& f) {
  if (f.pid) {
    if (kill(static_cast<pid_t>(f.pid), 0) != 0 && errno == ESRCH)
      std::fprintf(stderr, "softverbs-stat: no process %ld\n", f.pid);
    else
      std::fprintf(stderr,
                   "softverbs-stat: process %ld is not a softverbs process of this user "
                   "(no statistics in %s; SOFTVERBS_STATS=0 also hides one)\n",
                   f.pid, stats_dir().c_str());
  } else {
    std::fprintf(stderr, "softverbs-stat: no softverbs process named '%s' (statistics in %s)\n",
                 f.comm.c_str(), stats_dir().c_str());
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Filter filter;
  bool per_qp = false;
  static const option longopts[] = {{"help", no_argument, nullptr, 'h'}, {}};
  for (int o; (o = getopt_long(argc, argv, "p:c:qh", longopts, nullptr)) != -1;) {
    switch (o) {
      case 'p': {
        char* end = nullptr;
        errno = 0;
        filter.pid = std::strtol(optarg, &end, 10);
        if (filter.pid <= 0 || *end || errno) {
          std::fprintf(stderr, "softverbs-stat: -p %s: not a process id\n", optarg);
          return usage(stderr, 2);
        }
        break;
      }
      case 'c':
        filter.comm = optarg;
        break;
      case 'q':
        per_qp = true;
        break;
      case 'h':
        return usage(stdout, 0);
      default:
        return usage(stderr, 2);
    }
  }
  std::vector<std::string> what(argv + optind, argv + argc);
  if (what.empty()) what = {"dev", "qp", "stat"};
  for (const auto& w : what)
    if (w != "dev" && w != "qp" && w != "stat") {
      std::fprintf(stderr, "softverbs-stat: unknown command '%s'\n", w.c_str());
      return usage(stderr, 2);
    }
  int rc = 0;
  for (const auto& w : what) {
    if (w == "dev") {
      rc |= show_devices();
      continue;
    }
    const auto ps = processes(filter);
    if (ps.empty() && !filter.any()) return no_match(filter);
    if (w == "qp")
      show_qps(ps);
    else
      show_stats(ps, per_qp);
  }
  return rc;
}
