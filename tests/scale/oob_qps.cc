// N RC QPs between two processes, connected out of band as ibv_rc_pingpong connects one:
// each side creates its QPs, the QPNs cross a socketpair, each side moves its QPs to RTR
// with the peer's GID and QPN, then RTS. Every QP then carries `msgs` Sends each way.
// Exit 0 only when every Send and every receive completes successfully; 1 when every one
// completes but some with an error; 3 when some never complete (a hang, within -t); 4 when
// an idle QP costs more than -M KiB of RSS (-i).
//
//   oob_qps [-n QPS] [-m MSGS] [-s BYTES] [-t TIMEOUT_S] [-T ACK_TIMEOUT] [-l]
//           [-i IDLE_MS [-M MAX_KIB]]
//
// Prints one summary line per side: QPs, set-up time and rate (create to the first
// completion of every QP), failures, and RSS per QP. The default suite runs it with
// 1,000 QPs (the number the hostile-peer bounds once refused); scripts/scale.sh with 10,000.
#include <infiniband/verbs.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "util/proc.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Opts {
  int qps = 1000;
  int msgs = 3;
  int size = 64;          // bytes a message slot; Sends carry 16 B at 64, else the whole slot
  int idle_ms = 0;        // -i: then wait this long with every QP idle and measure again
  long idle_max_kib = 0;  // -M: exit 4 if an idle QP costs more (KiB of RSS)
  int timeout_s = 120;
  int ack_timeout = 14;
  bool keep_fd_limit = false;  // ibv_rc_pingpong's: 4.096 us * 2^14, 67 ms
};

long rss_kib() {
  return sv::proc_self_kib("status", "VmRSS");
}

bool write_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const char*>(p);
  while (n) {
    // The other side may have died: a failure to report, not a SIGPIPE that hides it.
    const ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n) {
    const ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// What one side tells the other: its GID, then its QPNs in order.
struct Hello {
  ibv_gid gid;
  uint32_t count;
};

int fail(const char* who, const char* what) {
  std::fprintf(stderr, "oob_qps %s: %s: %s\n", who, what, std::strerror(errno));
  return 2;
}

int run_side(const char* who, int sock, const Opts& o) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) return fail(who, "no device");
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) return fail(who, "ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  // One buffer: each QP's receives and its send share a slot of `size` bytes a message. It
  // is the program's own memory: written before the baseline, so RSS per QP is softverbs'.
  const size_t slot = static_cast<size_t>(o.size);
  std::vector<char> buf(static_cast<size_t>(o.qps) * (o.msgs + 1) * slot, 'x');
  const long rss0 = rss_kib();
  const auto t0 = Clock::now();

  // One CQ per 256 QPs keeps each CQ well inside max_cqe.
  constexpr int kQpsPerCq = 256;
  const int per_qp = 2 * o.msgs;
  std::vector<ibv_cq*> cqs;
  for (int i = 0; i < o.qps; i += kQpsPerCq) {
    ibv_cq* cq = ibv_create_cq(ctx, kQpsPerCq * per_qp, nullptr, nullptr, 0);
    if (!cq) return fail(who, "ibv_create_cq");
    cqs.push_back(cq);
  }
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (!mr) return fail(who, "ibv_reg_mr");

  std::vector<ibv_qp*> qps(o.qps);
  std::vector<uint32_t> mine(o.qps), theirs(o.qps);
  for (int i = 0; i < o.qps; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cqs[i / kQpsPerCq];
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = static_cast<uint32_t>(o.msgs);
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qps[i] = ibv_create_qp(pd, &ia);
    if (!qps[i]) {
      std::fprintf(stderr, "oob_qps %s: ibv_create_qp %d: %s\n", who, i, std::strerror(errno));
      return 2;
    }
    mine[i] = qps[i]->qp_num;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = 0;
    if (ibv_modify_qp(qps[i], &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return fail(who, "modify INIT");
    char* base = buf.data() + static_cast<size_t>(i) * (o.msgs + 1) * slot;
    for (int m = 0; m < o.msgs; ++m) {
      ibv_sge s{reinterpret_cast<uintptr_t>(base + (m + 1) * slot), static_cast<uint32_t>(slot),
                mr->lkey};
      ibv_recv_wr wr{};
      ibv_recv_wr* bad = nullptr;
      wr.wr_id = static_cast<uint64_t>(i);
      wr.sg_list = &s;
      wr.num_sge = 1;
      if (ibv_post_recv(qps[i], &wr, &bad)) return fail(who, "ibv_post_recv");
    }
  }
  const double create_s = std::chrono::duration<double>(Clock::now() - t0).count();
  Hello me{};
  if (ibv_query_gid(ctx, 1, 0, &me.gid)) return fail(who, "ibv_query_gid");
  me.count = static_cast<uint32_t>(o.qps);
  Hello peer{};
  if (!write_all(sock, &me, sizeof me) ||
      !write_all(sock, mine.data(), mine.size() * sizeof(uint32_t)) ||
      !read_all(sock, &peer, sizeof peer) || peer.count != me.count ||
      !read_all(sock, theirs.data(), theirs.size() * sizeof(uint32_t)))
    return fail(who, "QPN exchange");

  for (int i = 0; i < o.qps; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = theirs[i];
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qps[i], &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return fail(who, "modify RTR");
    a.qp_state = IBV_QPS_RTS;
    a.timeout = static_cast<uint8_t>(o.ack_timeout);
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qps[i], &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
      return fail(who, "modify RTS");
  }
  const double rts_s = std::chrono::duration<double>(Clock::now() - t0).count();
  // Both sides' receives are posted before either sends (ibv_rc_pingpong's order).
  char x = 1;
  if (!write_all(sock, &x, 1) || !read_all(sock, &x, 1)) return fail(who, "barrier");

  for (int i = 0; i < o.qps; ++i) {
    char* base = buf.data() + static_cast<size_t>(i) * (o.msgs + 1) * slot;
    std::snprintf(base, slot, "%s qp %d", who, i);
    for (int m = 0; m < o.msgs; ++m) {
      ibv_sge s{reinterpret_cast<uintptr_t>(base), static_cast<uint32_t>(o.size == 64 ? 16 : slot),
                mr->lkey};
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = static_cast<uint64_t>(i);
      wr.sg_list = &s;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (ibv_post_send(qps[i], &wr, &bad)) return fail(who, "ibv_post_send");
    }
  }

  const long want = static_cast<long>(o.qps) * per_qp;
  long ok = 0, bad = 0;
  std::vector<char> first(o.qps, 0);
  int connected = 0;
  double setup_s = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  ibv_wc wc[64];
  while (ok + bad < want && Clock::now() < deadline) {
    int got = 0;
    for (ibv_cq* cq : cqs) {
      const int k = ibv_poll_cq(cq, 64, wc);
      if (k < 0) return fail(who, "ibv_poll_cq");
      got += k;
      for (int j = 0; j < k; ++j) {
        if (wc[j].status != IBV_WC_SUCCESS) {
          if (bad++ < 5)
            std::fprintf(stderr, "oob_qps %s: qp %lu: %s\n", who,
                         static_cast<unsigned long>(wc[j].wr_id), ibv_wc_status_str(wc[j].status));
          continue;
        }
        ++ok;
        if (!first[wc[j].wr_id]) {
          first[wc[j].wr_id] = 1;
          if (++connected == o.qps)
            setup_s = std::chrono::duration<double>(Clock::now() - t0).count();
        }
      }
    }
    if (!got) usleep(200);
  }
  const long rss = rss_kib() - rss0;
  std::printf(
      "oob_qps %s: qps %d completions %ld/%ld failed %ld missing %ld set-up %.2f s (%.0f QPs/s) "
      "RSS %ld KiB/QP (created %.2f s, RTS %.2f s)\n",
      who, o.qps, ok, want, bad, want - ok - bad, setup_s, setup_s > 0 ? o.qps / setup_s : 0.0,
      rss / o.qps, create_s, rts_s);
  std::fflush(stdout);
  // Neither side tears down before the other has all its completions.
  if (!write_all(sock, &x, 1) || !read_all(sock, &x, 1)) return fail(who, "final barrier");
  long idle_kib = 0;
  if (o.idle_ms > 0) {
    // Every QP connected, nothing in flight: what an idle connected QP costs.
    usleep(static_cast<useconds_t>(o.idle_ms) * 1000);
    idle_kib = (rss_kib() - rss0) / o.qps;
    std::printf("oob_qps %s: idle %d ms: RSS %ld KiB/QP\n", who, o.idle_ms, idle_kib);
    std::fflush(stdout);
    if (!write_all(sock, &x, 1) || !read_all(sock, &x, 1)) return fail(who, "idle barrier");
  }
  for (ibv_qp* q : qps) ibv_destroy_qp(q);
  ibv_dereg_mr(mr);
  for (ibv_cq* cq : cqs) ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  if (ok + bad < want) return 3;
  if (ok != want) return 1;
  return o.idle_max_kib > 0 && idle_kib > o.idle_max_kib ? 4 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int c; (c = getopt(argc, argv, "n:m:s:t:T:li:M:")) != -1;) {
    switch (c) {
      case 'n':
        o.qps = std::atoi(optarg);
        break;
      case 'm':
        o.msgs = std::atoi(optarg);
        break;
      case 's':
        o.size = std::atoi(optarg);
        break;
      case 't':
        o.timeout_s = std::atoi(optarg);
        break;
      case 'T':
        o.ack_timeout = std::atoi(optarg);
        break;
      case 'l':
        o.keep_fd_limit = true;
        break;
      case 'i':
        o.idle_ms = std::atoi(optarg);
        break;
      case 'M':
        o.idle_max_kib = std::atol(optarg);
        break;
      default:
        std::fprintf(stderr,
                     "usage: %s [-n QPS] [-m MSGS] [-s BYTES] [-t TIMEOUT_S] [-T ACK_TIMEOUT] [-l] "
                     "[-i IDLE_MS [-M MAX_KIB]]\n",
                     argv[0]);
        return 2;
    }
  }
  if (o.qps < 1 || o.msgs < 1 || o.timeout_s < 1 || o.size < 64 || o.size > (1 << 24)) {
    std::fprintf(stderr, "oob_qps: -n, -m and -t must be positive, -s 64 B to 16 MiB\n");
    return 2;
  }
  // Each connected QP holds one descriptor: ask for enough, as a scale user would (-l:
  // leave the limit alone, to see what happens at it).
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  const rlim_t need = static_cast<rlim_t>(o.qps) + 256;
  if (r.rlim_cur < need && !o.keep_fd_limit) {
    r.rlim_cur = std::min(need, r.rlim_max);
    setrlimit(RLIMIT_NOFILE, &r);
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return fail("main", "socketpair");
  const pid_t child = fork();
  if (child == 0) {
    close(sv[0]);
    _exit(run_side("child", sv[1], o));
  }
  close(sv[1]);
  const int rc = run_side("parent", sv[0], o);
  close(sv[0]);
  int st = 0;
  waitpid(child, &st, 0);
  const int crc = WIFEXITED(st) ? WEXITSTATUS(st) : 3;
  return rc ? rc : crc;
}
