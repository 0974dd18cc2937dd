// SOFTVERBS_FAULT and softverbs_qp_inject_fault (engine/fault.h) through the public verbs
// API. The fault plan is read once per process, so each case runs this binary again as a
// helper (--ud, --rc, --open) with its own SOFTVERBS_FAULT and reads what it printed:
//   recv: the numbers the receiving QP got, in order;
//   wc:   the sender's and receiver's first completion statuses that were not success;
//   the helper's own counters, as `softverbs-stat -p PID stat` prints them (the real tool).
// Every wait in a helper has a deadline: a hang is a failure (exit 3), never a pass.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <softverbs/verbs_ext.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
#ifdef SV_TEST_SLOW
constexpr auto kWait = std::chrono::seconds(60);
#else
constexpr auto kWait = std::chrono::seconds(15);
#endif
constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kEnd = 0xFFFFFFFFu;  // the UD helper's end marker

// ---- helpers (run in a child process) ------------------------------------------------------

struct Dev {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_gid gid{};
  std::vector<uint32_t> buf = std::vector<uint32_t>(1 << 16);
  ibv_mr* mr = nullptr;
  bool open() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n == 0) return false;
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (!ctx) return false;
    pd = ibv_alloc_pd(ctx);
    mr = ibv_reg_mr(pd, buf.data(), buf.size() * 4,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    return pd && mr && ibv_query_gid(ctx, 1, 0, &gid) == 0;
  }
};

// The receiver's slots start at this word; one 64-byte (16-word) slot per receive.
constexpr size_t kRecvBase = 4096;
constexpr size_t kSlotWords = 16;

ibv_qp* make_qp(Dev& d, ibv_qp_type type, ibv_cq* cq, uint32_t depth) {
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = type;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = depth;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = 16;
  return ibv_create_qp(d.pd, &ia);
}

bool post_recvs(Dev& d, ibv_qp* qp, uint32_t n, size_t grh) {
  for (uint32_t i = 0; i < n; ++i) {
    ibv_sge s{reinterpret_cast<uintptr_t>(&d.buf[kRecvBase + i * kSlotWords]),
              static_cast<uint32_t>(grh + 16), d.mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = i;
    wr.sg_list = &s;
    wr.num_sge = 1;
    if (ibv_post_recv(qp, &wr, &bad)) return false;
  }
  return true;
}

// Polls cq until one completion of `qp_num` arrives or the deadline passes.
bool wait_wc(ibv_cq* cq, ibv_wc& wc, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return false;
    if (n == 1) return true;
    std::this_thread::yield();
  }
  return false;
}

void print_stats() {
  std::fflush(stdout);
  const std::string cmd = std::string(SV_STAT_BIN) + " -p " + std::to_string(getpid()) + " stat";
  if (std::system(cmd.c_str()) != 0) std::printf("softverbs-stat failed\n");
  std::fflush(stdout);
}

// --ud N [all]: N numbered datagrams from QP a to QP b, each sent after the last one
// completed; then end markers every 20 ms until b has one (markers may be dropped too) and,
// with `all`, until b has every number (delayed ones come after the marker).
int run_ud(uint32_t n, bool all) {
  Dev d;
  if (!d.open()) return 2;
  ibv_cq* acq = ibv_create_cq(d.ctx, 1024, nullptr, nullptr, 0);
  ibv_cq* bcq = ibv_create_cq(d.ctx, 1024, nullptr, nullptr, 0);
  ibv_qp* a = make_qp(d, IBV_QPT_UD, acq, 512);
  ibv_qp* b = make_qp(d, IBV_QPT_UD, bcq, 512);
  if (!a || !b) return 2;
  for (ibv_qp* q : {a, b}) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qkey = kQkey;
    if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
      return 2;
    at.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(q, &at, IBV_QP_STATE)) return 2;
    at.qp_state = IBV_QPS_RTS;
    if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_SQ_PSN)) return 2;
  }
  if (!post_recvs(d, b, 500, 40)) return 2;
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.grh.dgid = d.gid;
  aa.grh.hop_limit = 1;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(d.pd, &aa);
  if (!ah) return 2;
  const auto deadline = Clock::now() + kWait;
  std::vector<uint32_t> got;
  bool ended = false;
  auto drain = [&] {
    ibv_wc wc;
    while (ibv_poll_cq(bcq, 1, &wc) == 1) {
      if (wc.status != IBV_WC_SUCCESS) return false;
      const uint32_t v = d.buf[kRecvBase + wc.wr_id * kSlotWords + 10];  // after the GRH
      if (v == kEnd)
        ended = true;
      else
        got.push_back(v);
    }
    return true;
  };
  auto send = [&](uint32_t v) {
    ibv_sge s{reinterpret_cast<uintptr_t>(&v), 4, 0};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = b->qp_num;
    wr.wr.ud.remote_qkey = kQkey;
    if (ibv_post_send(a, &wr, &bad)) return false;
    ibv_wc wc;
    return wait_wc(acq, wc, deadline) && wc.status == IBV_WC_SUCCESS;
  };
  for (uint32_t i = 1; i <= n; ++i)
    if (!send(i) || !drain()) return 3;
  for (int m = 0; !ended; ++m) {
    if (m == 400 || Clock::now() > deadline || !send(kEnd)) return 3;
    const auto until = Clock::now() + std::chrono::milliseconds(20);
    while (!ended && Clock::now() < until) {
      if (!drain()) return 3;
      std::this_thread::yield();
    }
  }
  auto have_all = [&] {
    std::vector<bool> seen(n + 1);
    for (uint32_t v : got)
      if (v <= n) seen[v] = true;
    for (uint32_t i = 1; i <= n; ++i)
      if (!seen[i]) return false;
    return true;
  };
  while (all && !have_all()) {
    if (Clock::now() > deadline || !drain()) return 3;
    std::this_thread::yield();
  }
  std::printf("recv:");
  for (uint32_t v : got) std::printf(" %u", v);
  std::printf("\n");
  print_stats();
  return 0;
}

// The Write-with-immediate target: word kWriteBase + i receives i.
constexpr size_t kWriteBase = 32768;

// --rc N [inject|-] [send|wimm]: N numbered messages from RC QP a to RC QP b (connected out
// of band in this process), each after the last one completed: Sends carrying i, or RDMA
// Writes with immediate putting i in b's word kWriteBase + i with immediate data i. With
// `inject`, after the 20th the helper calls softverbs_qp_inject_fault(a, inject) and prints
// what it returned. It prints how many of a's completed successfully (`ok:`), the wall time
// (`ms:`), and for wimm how many received immediates found their Write's data missing.
int run_rc(uint32_t n, const char* inject, bool wimm) {
  Dev d;
  if (!d.open()) return 2;
  ibv_cq* acq = ibv_create_cq(d.ctx, 1024, nullptr, nullptr, 0);
  ibv_cq* bcq = ibv_create_cq(d.ctx, 1024, nullptr, nullptr, 0);
  ibv_qp* a = make_qp(d, IBV_QPT_RC, acq, 512);
  ibv_qp* b = make_qp(d, IBV_QPT_RC, bcq, 512);
  if (!a || !b) return 2;
  for (ibv_qp* q : {a, b}) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return 2;
  }
  if (!post_recvs(d, b, 500, 0)) return 2;
  for (ibv_qp* q : {a, b}) {
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = q == a ? b->qp_num : a->qp_num;
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 12;
    at.ah_attr.is_global = 1;
    at.ah_attr.grh.dgid = d.gid;
    at.ah_attr.grh.hop_limit = 1;
    at.ah_attr.port_num = 1;
    if (ibv_modify_qp(q, &at,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return 2;
    at.qp_state = IBV_QPS_RTS;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 1;
    if (ibv_modify_qp(q, &at,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
      return 2;
  }
  const auto t0 = Clock::now();
  const auto deadline = t0 + kWait;
  std::vector<uint32_t> got;
  int a_err = 0, b_err = 0;
  uint32_t a_ok = 0, missing_data = 0;
  auto drain_b = [&] {
    ibv_wc wc;
    while (ibv_poll_cq(bcq, 1, &wc) == 1) {
      if (wc.status != IBV_WC_SUCCESS) {
        if (!b_err) b_err = wc.status;
        continue;
      }
      if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        const uint32_t v = ntohl(wc.imm_data);
        got.push_back(v);
        if (v >= 1024 || d.buf[kWriteBase + v] != v) ++missing_data;
      } else {
        got.push_back(d.buf[kRecvBase + wc.wr_id * kSlotWords]);
      }
    }
  };
  for (uint32_t i = 1; i <= n && !a_err; ++i) {
    d.buf[i % 1024] = i;
    ibv_sge s{reinterpret_cast<uintptr_t>(&d.buf[i % 1024]), 4, d.mr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    if (wimm) {
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(i);
      wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&d.buf[kWriteBase + i % 1024]);
      wr.wr.rdma.rkey = d.mr->rkey;
    }
    wr.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(a, &wr, &bad)) {
      a_err = -1;
      break;
    }
    ibv_wc wc;
    if (!wait_wc(acq, wc, deadline)) return 3;
    if (wc.status != IBV_WC_SUCCESS)
      a_err = wc.status;
    else
      ++a_ok;
    drain_b();
    if (inject && std::strcmp(inject, "-") != 0 && i == 20)
      std::printf("inject: %d\n", softverbs_qp_inject_fault(a, inject));
  }
  // After an error the receiver fails too if it was told (a Terminate): give it a second.
  // One that was not (a reset with only receives posted) stays up, as an IB responder with
  // no traffic to send never learns that its peer is gone.
  const auto settle = Clock::now() + std::chrono::seconds(1);
  while (a_err && !b_err && Clock::now() < settle) {
    drain_b();
    std::this_thread::yield();
  }
  drain_b();
  std::printf("recv:");
  for (uint32_t v : got) std::printf(" %u", v);
  std::printf(
      "\nwc: %d %d\nok: %u\nmissing_data: %u\nms: %lld\n", a_err, b_err, a_ok, missing_data,
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()));
  ibv_qp* ud = make_qp(d, IBV_QPT_UD, acq, 4);
  std::printf("inject_ud: %d\n", ud ? softverbs_qp_inject_fault(ud, "reset") : -1);
  print_stats();
  return 0;
}

// --open: what ibv_open_device says.
int run_open() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) return 2;
  errno = 0;
  ibv_context* ctx = ibv_open_device(list[0]);
  std::printf("open: %s errno %d\n", ctx ? "ok" : "failed", ctx ? 0 : errno);
  if (ctx) ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}

// ---- the tests ---------------------------------------------------------------------------

struct Outcome {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
  std::vector<uint32_t> recv;
  int a_err = 0, b_err = 0;
  std::map<std::string, uint64_t> stat;  // softverbs-stat's key/value lines
  int inject = 1000, inject_ud = 1000;
  long ok = -1, missing_data = -1, ms = -1;
  // A counter the helper's softverbs-stat printed; a missing one fails the test.
  uint64_t ctr(const std::string& k) const {
    auto it = stat.find(k);
    if (it == stat.end()) {
      ADD_FAILURE() << "softverbs-stat printed no " << k << ":\n" << out;
      return 0;
    }
    return it->second;
  }
};

std::string slurp(const std::string& path) {
  std::string s;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char b[4096];
    size_t k;
    while ((k = std::fread(b, 1, sizeof b, f)) > 0) s.append(b, k);
    std::fclose(f);
  }
  return s;
}

Outcome helper(const std::string& args, const std::string& fault,
               const std::string& more_env = "") {
  char dir[] = "/tmp/sv-fault-XXXXXX";
  if (!mkdtemp(dir)) return {};
  const std::string d = dir;
  const std::string cmd =
      "env SOFTVERBS_NETDEV=lo SOFTVERBS_FAULT='" + fault + "' SOFTVERBS_LOG=warn " + more_env +
      " /proc/" + std::to_string(getpid()) + "/exe " + args + " >" + d + "/out 2>" + d + "/err";
  Outcome r;
  const int st = std::system(cmd.c_str());
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  r.out = slurp(d + "/out");
  r.err = slurp(d + "/err");
  std::remove((d + "/out").c_str());
  std::remove((d + "/err").c_str());
  rmdir(dir);
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string key;
    l >> key;
    if (key == "recv:") {
      uint32_t v;
      while (l >> v) r.recv.push_back(v);
    } else if (key == "wc:") {
      l >> r.a_err >> r.b_err;
    } else if (key == "inject:") {
      l >> r.inject;
    } else if (key == "inject_ud:") {
      l >> r.inject_ud;
    } else if (key == "ok:") {
      l >> r.ok;
    } else if (key == "missing_data:") {
      l >> r.missing_data;
    } else if (key == "ms:") {
      l >> r.ms;
    } else if (key == "link") {
      // softverbs-stat's stat line: "link DEV/PORT" then KEY VALUE pairs.
      std::string k, v;
      l >> k;
      while (l >> k >> v) {
        char* end = nullptr;
        const uint64_t n = std::strtoull(v.c_str(), &end, 10);
        if (end && *end == 0) r.stat[k] = n;
      }
    }
  }
  return r;
}

size_t count(const std::vector<uint32_t>& v, uint32_t x) {
  size_t n = 0;
  for (uint32_t y : v) n += y == x;
  return n;
}

TEST(Fault, AMalformedSpecFailsTheDeviceOpenWithEinvalAndNamesTheToken) {
  const Outcome r = helper("--open", "reset:every=12abc");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("open: failed errno 22"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("SOFTVERBS_FAULT"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("every=12abc"), std::string::npos) << r.err;
  // And a well-formed one opens.
  const Outcome ok = helper("--open", "reset:every=12");
  EXPECT_NE(ok.out.find("open: ok"), std::string::npos) << ok.out << ok.err;
}

TEST(Fault, UdDropIsDeterministicForASeed) {
  const Outcome x = helper("--ud 200", "drop:p=0.3;seed=7");
  const Outcome y = helper("--ud 200", "drop:p=0.3;seed=7");
  const Outcome z = helper("--ud 200", "drop:p=0.3;seed=8");
  ASSERT_EQ(x.status, 0) << x.err;
  ASSERT_EQ(y.status, 0) << y.err;
  ASSERT_EQ(z.status, 0) << z.err;
  // Roughly 30% lost (binomial, 200 draws: 60 +- 6.5; the bounds are 5 sigma).
  EXPECT_GT(x.recv.size(), 107u);
  EXPECT_LT(x.recv.size(), 173u);
  EXPECT_EQ(x.recv, y.recv) << "the same seed and traffic must drop the same datagrams";
  EXPECT_NE(x.recv, z.recv) << "another seed drops others";
  // Every loss is a counted firing (end markers may have been dropped too).
  EXPECT_GE(x.ctr("fault_drop"), 200 - x.recv.size());
  EXPECT_NE(x.err.find("fault: qp"), std::string::npos) << "each firing is logged";
}

TEST(Fault, UdDupSendsEveryNthDatagramTwice) {
  const Outcome r = helper("--ud 200", "dup:every=4");
  ASSERT_EQ(r.status, 0) << r.err;
  for (uint32_t i = 1; i <= 200; ++i) EXPECT_EQ(count(r.recv, i), i % 4 == 0 ? 2u : 1u) << i;
  EXPECT_GE(r.ctr("fault_dup"), 50u);
}

TEST(Fault, UdDelayLosesNothing) {
  const Outcome r = helper("--ud 100 all", "delay:ms=300,every=10");
  ASSERT_EQ(r.status, 0) << r.err;
  for (uint32_t i = 1; i <= 100; ++i) EXPECT_EQ(count(r.recv, i), 1u) << i;
  EXPECT_GE(r.ctr("fault_delay"), 10u);
  // Late: datagram 10 left 300 ms after 11 could (a delay that did nothing keeps the order).
  const auto pos = [&](uint32_t v) { return std::find(r.recv.begin(), r.recv.end(), v); };
  EXPECT_GT(pos(10), pos(11));
}

TEST(Fault, UdReceiveSideDropAndPeerSelector) {
  const Outcome rx = helper("--ud 100", "drop:dir=rx,every=2");
  ASSERT_EQ(rx.status, 0) << rx.err;
  for (uint32_t i = 1; i <= 100; ++i) EXPECT_EQ(count(rx.recv, i), i % 2 ? 1u : 0u) << i;
  EXPECT_EQ(rx.ctr("fault_drop"), 50u);
  // A rule for another peer fires on nothing; one for this peer does.
  const Outcome other = helper("--ud 50", "drop:peer=10.9.9.9");
  ASSERT_EQ(other.status, 0) << other.err;
  EXPECT_EQ(other.recv.size(), 50u);
  EXPECT_EQ(other.ctr("fault_drop"), 0u);
  const Outcome self = helper("--ud 50", "drop:peer=127.0.0.1,every=5,after=11");
  ASSERT_EQ(self.status, 0) << self.err;
  for (uint32_t i = 1; i <= 50; ++i)
    EXPECT_EQ(count(self.recv, i), i >= 11 && (i - 10) % 5 == 0 ? 0u : 1u) << i;
}

TEST(Fault, RcResetFailsTheOutstandingWorkAndNothingHangs) {
  const Outcome r = helper("--rc 200", "reset:after=40,count=1");
  ASSERT_EQ(r.status, 0) << r.err;  // 3 would be a hang
  EXPECT_EQ(r.ctr("fault_reset"), 1u);
  EXPECT_EQ(r.a_err, IBV_WC_RETRY_EXC_ERR);  // a pulled cable: retries run out
  EXPECT_LT(r.recv.size(), 200u);
  for (size_t i = 0; i < r.recv.size(); ++i) EXPECT_EQ(r.recv[i], i + 1);  // in order, no gap
}

// What a reset cut never completes as a success. With IB's completion rule (the default
// between softverbs peers) a success means the peer placed it: every one is received. With
// RFC 5040's (SOFTVERBS_IB_COMPLETION=0) a success means TCP had it, and the receiver's
// kernel drops what it had not read when the RST comes; but the message whose frame the
// reset cut never reached TCP. Only a sends frames then (no Placement Acks), so the cut is
// a's frame 40: message 39 or 40 (39 when the peer-to-peer RTR, RFC 6581 §4, went first
// from a: the initiator is chosen by QPN), or for a Write with immediate (two frames)
// message 20's Write or immediate.
TEST(Fault, RcResetCompletesNothingItCut) {
  for (const char* op : {"send", "wimm"}) {
    SCOPED_TRACE(op);
    const bool send = std::string(op) == "send";
    const Outcome ib = helper(std::string("--rc 100 - ") + op, "reset:after=40,count=1");
    ASSERT_EQ(ib.status, 0) << ib.err;
    EXPECT_EQ(ib.ctr("fault_reset"), 1u);
    EXPECT_NE(ib.a_err, 0);
    EXPECT_LE(ib.ok, static_cast<long>(ib.recv.size())) << "a success the peer never placed";
    EXPECT_EQ(ib.missing_data, 0) << "an immediate without its Write's data";
    for (size_t i = 0; i < ib.recv.size(); ++i) EXPECT_EQ(ib.recv[i], i + 1);

    const Outcome rfc = helper(std::string("--rc 100 - ") + op, "reset:after=40,count=1",
                               "SOFTVERBS_IB_COMPLETION=0");
    ASSERT_EQ(rfc.status, 0) << rfc.err;
    EXPECT_EQ(rfc.ctr("fault_reset"), 1u);
    EXPECT_EQ(rfc.a_err, IBV_WC_RETRY_EXC_ERR);
    if (send) {
      EXPECT_TRUE(rfc.ok == 38 || rfc.ok == 39) << rfc.ok << ": the cut message completed";
    } else {
      EXPECT_EQ(rfc.ok, 19) << "the cut message completed";
    }
    EXPECT_LE(static_cast<long>(rfc.recv.size()), rfc.ok);
    EXPECT_EQ(rfc.missing_data, 0) << "an immediate without its Write's data";
    for (size_t i = 0; i < rfc.recv.size(); ++i) EXPECT_EQ(rfc.recv[i], i + 1);
  }
}

TEST(Fault, RcCorruptIsCaughtByTheCrcAndNeverDeliveredAsData) {
  const Outcome r = helper("--rc 200", "corrupt:every=30,count=1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.ctr("fault_corrupt"), 1u);
  EXPECT_NE(r.err.find("MPA CRC error"), std::string::npos) << r.err;
  EXPECT_GE(r.ctr("sent_terminates"), 1u);
  EXPECT_NE(r.a_err, 0);
  EXPECT_NE(r.b_err, 0);
  for (size_t i = 0; i < r.recv.size(); ++i) EXPECT_EQ(r.recv[i], i + 1);
  // On the receive side too.
  const Outcome rx = helper("--rc 100", "corrupt:dir=rx,after=10,count=1");
  ASSERT_EQ(rx.status, 0) << rx.err;
  EXPECT_EQ(rx.ctr("fault_corrupt"), 1u);
  EXPECT_NE(rx.a_err, 0);
}

TEST(Fault, RcStallDelaysButLosesNothing) {
  const Outcome r =
      helper("--rc 200", "stall:ms=200,after=30,count=1;stall:ms=100,dir=rx,after=60,count=1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.ctr("fault_stall"), 2u);
  EXPECT_EQ(r.a_err, 0);
  EXPECT_EQ(r.b_err, 0);
  ASSERT_EQ(r.recv.size(), 200u);
  for (size_t i = 0; i < r.recv.size(); ++i) EXPECT_EQ(r.recv[i], i + 1);
  // A lower bound, not a speed: the run cannot be shorter than the stalls it went through.
  EXPECT_GE(r.ms, 300);
}

TEST(Fault, InjectedResetAndStallAndTheirErrors) {
  const Outcome reset = helper("--rc 100 reset", "");
  ASSERT_EQ(reset.status, 0) << reset.err;
  EXPECT_EQ(reset.inject, 0);
  EXPECT_EQ(reset.ctr("fault_reset"), 1u);
  EXPECT_EQ(reset.a_err, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(reset.inject_ud, EOPNOTSUPP);
  const Outcome stall = helper("--rc 60 stall:ms=100", "");
  ASSERT_EQ(stall.status, 0) << stall.err;
  EXPECT_EQ(stall.inject, 0);
  EXPECT_EQ(stall.a_err, 0);
  EXPECT_EQ(stall.recv.size(), 60u);
  EXPECT_EQ(stall.ctr("fault_stall"), 1u);
  EXPECT_GE(stall.ms, 100);
  const Outcome bogus = helper("--rc 30 stall:ms=100,every=2", "");
  EXPECT_EQ(bogus.inject, EINVAL);
  EXPECT_EQ(bogus.a_err, 0);
  // corrupt needs a CRC to catch it: refused without one, applied with one.
  const Outcome nocrc = helper("--rc 30 corrupt", "");
  EXPECT_EQ(nocrc.inject, EOPNOTSUPP);
  EXPECT_EQ(nocrc.a_err, 0);
  const Outcome crc = helper("--rc 60 corrupt", "", "SOFTVERBS_MPA_CRC=1");
  ASSERT_EQ(crc.status, 0) << crc.err;
  EXPECT_EQ(crc.inject, 0);
  EXPECT_EQ(crc.ctr("fault_corrupt"), 1u);
  EXPECT_NE(crc.a_err, 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--open") == 0) return run_open();
  if (argc >= 3 && std::strcmp(argv[1], "--ud") == 0)
    return run_ud(static_cast<uint32_t>(std::atoi(argv[2])),
                  argc >= 4 && std::strcmp(argv[3], "all") == 0);
  if (argc >= 3 && std::strcmp(argv[1], "--rc") == 0)
    return run_rc(static_cast<uint32_t>(std::atoi(argv[2])), argc >= 4 ? argv[3] : nullptr,
                  argc >= 5 && std::strcmp(argv[4], "wimm") == 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
