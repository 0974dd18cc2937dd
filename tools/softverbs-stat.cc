// softverbs-stat: what ibstat, ibv_devinfo and `rdma resource|statistic` show for a kernel
// device, for softverbs, whose QPs live inside the processes that use them.
//
//   softverbs-stat [-p PID] [-q] [dev|qp|stat]...     (default: dev qp stat)
//     dev   devices, ports and GID tables
//     qp    every live QP of every softverbs process of this user: QPN, state, peer
//     stat  counters per process (destroyed QPs included), or per QP with -q; completions
//           by status (wc_<STATUS>), errors first among them
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

const char* qp_state(uint32_t s) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return s < sizeof names / sizeof names[0] ? names[s] : "UNKNOWN";
}

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

// Every live process's statistics, by pid.
std::vector<StatsView> processes(long only_pid) {
  std::vector<StatsView> out;
  const std::string dir = stats_dir();
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  std::vector<std::byte> buf;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0' || (only_pid && pid != only_pid)) continue;
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
  return (q.family == AF_INET6 ? "[" + std::string(b) + "]" : std::string(b)) + ":" +
         std::to_string(ntohs(q.port));
}

void show_qps(const std::vector<StatsView>& ps) {
  for (const auto& p : ps)
    for (const auto& q : p.qps)
      std::printf("link softverbs0/1 lqpn %u rqpn %u type %s state %s peer %s pid %u comm %s\n",
                  q.qpn, q.dest_qpn,
                  q.qp_type == IBV_QPT_RC   ? "RC"
                  : q.qp_type == IBV_QPT_UD ? "UD"
                                            : "UNKNOWN",
                  qp_state(q.state), peer_text(q).c_str(), p.pid, p.comm.c_str());
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
      std::printf(" wc_%s %llu", ibv_wc_status_str(static_cast<ibv_wc_status>(s)),
                  static_cast<unsigned long long>(q.wc[s]));
  std::printf(" wc_success %llu\n", static_cast<unsigned long long>(q.wc[0]));
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

int usage() {
  std::fprintf(stderr, "usage: softverbs-stat [-p pid] [-q] [dev|qp|stat]...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long pid = 0;
  bool per_qp = false;
  for (int o; (o = getopt(argc, argv, "p:qh")) != -1;) {
    switch (o) {
      case 'p': {
        char* end = nullptr;
        pid = std::strtol(optarg, &end, 10);
        if (pid <= 0 || *end) return usage();
        break;
      }
      case 'q':
        per_qp = true;
        break;
      default:
        return usage();
    }
  }
  std::vector<std::string> what(argv + optind, argv + argc);
  if (what.empty()) what = {"dev", "qp", "stat"};
  for (const auto& w : what)
    if (w != "dev" && w != "qp" && w != "stat") return usage();
  int rc = 0;
  for (const auto& w : what) {
    if (w == "dev") {
      rc |= show_devices();
    } else if (w == "qp") {
      show_qps(processes(pid));
    } else {
      show_stats(processes(pid), per_qp);
    }
  }
  return rc;
}
