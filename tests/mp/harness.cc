#include "harness.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>
#include <thread>
#include <type_traits>

extern char** environ;

namespace mp {

std::vector<std::string> g_child_env;

// ---- patterns ------------------------------------------------------------------------------

uint8_t pattern_byte(uint32_t seed, uint64_t idx) {
  uint64_t x = idx * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(seed) * 0xD1B54A32D192ED03ull);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

void fill_pattern(void* p, size_t len, uint32_t seed, uint64_t start) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < len; ++i) b[i] = pattern_byte(seed, start + i);
}

int64_t check_pattern(const void* p, size_t len, uint32_t seed, uint64_t start) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < len; ++i)
    if (b[i] != pattern_byte(seed, start + i)) return static_cast<int64_t>(i);
  return -1;
}

// ---- builders ------------------------------------------------------------------------------

SgeSpec sge(uint64_t offset, uint32_t length, uint32_t mr) {
  SgeSpec s;
  s.mr = mr;
  s.offset = offset;
  s.length = length;
  return s;
}

static void set_sges(SendSpec& s, std::initializer_list<SgeSpec> sges) {
  s.num_sge = 0;
  for (const SgeSpec& g : sges) {
    if (s.num_sge == kMaxSpecSge) break;
    s.sge[s.num_sge++] = g;
  }
}

SendSpec make_send(uint64_t wr_id, std::initializer_list<SgeSpec> sges, uint32_t flags) {
  SendSpec s;
  s.wr_id = wr_id;
  s.opcode = IBV_WR_SEND;
  s.flags = flags;
  set_sges(s, sges);
  return s;
}

SendSpec make_rdma(ibv_wr_opcode op, uint64_t wr_id, std::initializer_list<SgeSpec> sges,
                   uint64_t remote_addr, uint32_t rkey, uint32_t flags) {
  SendSpec s;
  s.wr_id = wr_id;
  s.opcode = op;
  s.flags = flags;
  set_sges(s, sges);
  s.remote_addr = remote_addr;
  s.rkey = rkey;
  return s;
}

SendSpec make_atomic(ibv_wr_opcode op, uint64_t wr_id, SgeSpec local, uint64_t remote_addr,
                     uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  SendSpec s;
  s.wr_id = wr_id;
  s.opcode = op;
  s.flags = IBV_SEND_SIGNALED;
  s.num_sge = 1;
  s.sge[0] = local;
  s.remote_addr = remote_addr;
  s.rkey = rkey;
  s.compare_add = compare_add;
  s.swap = swap;
  return s;
}

bool published_qp(pid_t pid, uint32_t qpn, sv::wire::QpStatsView& out) {
  const std::string path =
      "/dev/shm/softverbs-stats-" + std::to_string(geteuid()) + "/" + std::to_string(pid);
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  sv::wire::StatsView v;
  if (sv::wire::decode_stats({reinterpret_cast<const std::byte*>(s.data()), s.size()}, v) !=
      sv::wire::StatsError::ok)
    return false;
  for (const auto& q : v.qps)
    if (q.qpn == qpn) {
      out = q;
      return true;
    }
  return false;
}

uint64_t qp_counter(pid_t pid, uint32_t qpn, sv::wire::Ctr c) {
  sv::wire::QpStatsView q;
  return published_qp(pid, qpn, q) ? q.ctr[static_cast<size_t>(c)] : ~0ull;
}

uint32_t transport_of(uint32_t qpn, pid_t pid) {
  sv::wire::QpStatsView q;
  return published_qp(pid, qpn, q) ? q.transport : ~0u;
}

uint32_t wait_transport(uint32_t qpn, uint32_t want) {
  uint32_t t = transport_of(qpn);
  for (int i = 0; i < 200 && t != want; ++i) {
    std::this_thread::sleep_for(Ms(10));
    t = transport_of(qpn);
  }
  return t;
}

void spin_receive(Peer& local, RemotePeer& remote, uint64_t rounds) {
  for (uint64_t round = 0; round < rounds; ++round) {
    ASSERT_EQ(local.post_recv(round, {sge(round * 64, 64)}), 0);
    ASSERT_EQ(remote.post_send(make_send(round, {sge(0, 32)})), 0);
    ibv_wc wc{};
    int n = 0;
    for (auto end = Clock::now() + kWait; n == 0 && Clock::now() < end;)
      n = ibv_poll_cq(local.rcq, 1, &wc);
    ASSERT_EQ(n, 1) << "round " << round;
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << "round " << round;
  }
}

std::vector<ibv_wc> poll_cq(ibv_cq* cq, size_t n, Ms timeout) {
  std::vector<ibv_wc> out;
  out.reserve(n);
  const auto end = Clock::now() + timeout;
  unsigned idle = 0;
  while (out.size() < n) {
    ibv_wc wc[16];
    const int want = static_cast<int>(std::min<size_t>(16, n - out.size()));
    const int k = ibv_poll_cq(cq, want, wc);
    if (k < 0) break;
    if (k > 0) {
      out.insert(out.end(), wc, wc + k);
      idle = 0;
      continue;
    }
    if (Clock::now() >= end) break;
    // Back off: the machine is small and the peer process needs the CPU.
    if (++idle < 64)
      sched_yield();
    else
      usleep(100);
  }
  return out;
}

void expect_error_then_flush(const std::vector<ibv_wc>& wcs, uint64_t first_id, size_t max_ok,
                             ibv_wc_status err) {
  for (size_t i = 0; i < wcs.size(); ++i)
    EXPECT_EQ(wcs[i].wr_id, first_id + i) << "completion " << i << " out of posting order";
  size_t k = 0;
  while (k < wcs.size() && wcs[k].status == IBV_WC_SUCCESS) ++k;
  EXPECT_LE(k, max_ok) << "WRs behind the failing one succeeded";
  ASSERT_LT(k, wcs.size()) << "no error completion at all";
  EXPECT_EQ(wcs[k].status, err) << wc_str(wcs[k]);
  for (size_t i = k + 1; i < wcs.size(); ++i)
    EXPECT_EQ(wcs[i].status, IBV_WC_WR_FLUSH_ERR) << wc_str(wcs[i]);
}

std::string wc_str(const ibv_wc& wc) {
  char b[200];
  std::snprintf(b, sizeof b, "wc{wr_id=%llu status=%s(%d) opcode=%d byte_len=%u flags=%#x}",
                static_cast<unsigned long long>(wc.wr_id), ibv_wc_status_str(wc.status),
                static_cast<int>(wc.status), static_cast<int>(wc.opcode), wc.byte_len, wc.wc_flags);
  return b;
}

::testing::AssertionResult wc_is(const ibv_wc& wc, uint64_t wr_id, ibv_wc_status status,
                                 int opcode) {
  if (wc.wr_id == wr_id && wc.status == status &&
      (opcode < 0 || static_cast<int>(wc.opcode) == opcode))
    return ::testing::AssertionSuccess();
  auto r = ::testing::AssertionFailure()
           << wc_str(wc) << ", expected wr_id=" << wr_id << " status=" << ibv_wc_status_str(status);
  if (opcode >= 0) r << " opcode=" << opcode;
  return r;
}

// ---- Peer ----------------------------------------------------------------------------------

std::unique_ptr<Peer> Peer::create(const PeerConfig& cfg, std::string* err) {
  std::unique_ptr<Peer> p(new Peer());
  p->cfg_ = cfg;
  auto fail = [&](const char* what) {
    *err = std::string(what) + ": " + std::strerror(errno);
    return std::unique_ptr<Peer>();
  };
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) {
    if (list) ibv_free_device_list(list);
    return fail("ibv_get_device_list");
  }
  p->ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!p->ctx) return fail("ibv_open_device");
  if (ibv_query_gid(p->ctx, 1, 0, &p->gid)) return fail("ibv_query_gid");
  if (!(p->pd = ibv_alloc_pd(p->ctx))) return fail("ibv_alloc_pd");
  if (cfg.with_channel && !(p->channel = ibv_create_comp_channel(p->ctx)))
    return fail("ibv_create_comp_channel");
  if (!(p->scq = ibv_create_cq(p->ctx, cfg.send_cqe, p.get(), nullptr, 0)))
    return fail("ibv_create_cq(send)");
  if (cfg.recv_cq_ex_flags) {
    ibv_cq_init_attr_ex ca{};
    ca.cqe = static_cast<uint32_t>(cfg.recv_cqe);
    ca.cq_context = p.get();
    ca.channel = p->channel;
    ca.wc_flags = cfg.recv_cq_ex_flags;
    ibv_cq_ex* cx = ibv_create_cq_ex(p->ctx, &ca);
    if (!cx) return fail("ibv_create_cq_ex(recv)");
    p->rcq = ibv_cq_ex_to_cq(cx);
  } else if (!(p->rcq = ibv_create_cq(p->ctx, cfg.recv_cqe, p.get(), p->channel, 0))) {
    return fail("ibv_create_cq(recv)");
  }
  if (cfg.srq == 2 && !(p->srq_pd = ibv_alloc_pd(p->ctx))) return fail("ibv_alloc_pd(srq)");
  MrInfo m = p->add_mr(cfg.buf_size, cfg.mr_access);
  if (m.err) {
    errno = m.err;
    return fail("ibv_reg_mr");
  }
  ibv_qp_init_attr ia{};
  ia.qp_context = p.get();
  ia.send_cq = p->scq;
  ia.recv_cq = p->rcq;
  ia.cap.max_send_wr = cfg.max_send_wr;
  ia.cap.max_recv_wr = cfg.max_recv_wr;
  ia.cap.max_send_sge = cfg.max_send_sge;
  ia.cap.max_recv_sge = cfg.max_recv_sge;
  ia.cap.max_inline_data = cfg.max_inline_data;
  ia.qp_type = cfg.qp_type;
  ia.sq_sig_all = cfg.sq_sig_all;
  if (cfg.srq) {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = cfg.max_recv_wr;
    sa.attr.max_sge = cfg.max_recv_sge;
    if (!(p->srq = ibv_create_srq(p->srq_pd ? p->srq_pd : p->pd, &sa)))
      return fail("ibv_create_srq");
    ia.srq = p->srq;
  }
  if (cfg.send_ops_flags) {
    ibv_qp_init_attr_ex ix{};
    std::memcpy(&ix, &ia, sizeof ia);  // ibv_qp_init_attr_ex begins with ibv_qp_init_attr
    ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ix.pd = p->pd;
    ix.send_ops_flags = cfg.send_ops_flags;
    if (!(p->qp = ibv_create_qp_ex(p->ctx, &ix))) return fail("ibv_create_qp_ex");
    ia.cap = ix.cap;
  } else if (!(p->qp = ibv_create_qp(p->pd, &ia))) {
    return fail("ibv_create_qp");
  }
  p->cap = ia.cap;
  return p;
}

Peer::~Peer() {
  if (qp) ibv_destroy_qp(qp);
  if (srq) ibv_destroy_srq(srq);
  if (scq) ibv_destroy_cq(scq);
  if (rcq) ibv_destroy_cq(rcq);
  if (channel) ibv_destroy_comp_channel(channel);
  for (auto& r : regions) {
    if (r.mr) ibv_dereg_mr(r.mr);
    if (r.base) munmap(r.base, r.len);
  }
  if (pd) ibv_dealloc_pd(pd);
  if (srq_pd) ibv_dealloc_pd(srq_pd);
  if (ctx) ibv_close_device(ctx);
}

PeerInfo Peer::info() const {
  PeerInfo i;
  i.qpn = qp->qp_num;
  i.gid = gid;
  i.addr = reinterpret_cast<uint64_t>(regions[0].base);
  i.len = regions[0].len;
  i.rkey = regions[0].mr->rkey;
  return i;
}

int Peer::modify_init() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags = cfg_.qp_access;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int Peer::modify_rtr(const PeerInfo& r) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = r.qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = cfg_.max_dest_rd_atomic;
  a.min_rnr_timer = cfg_.min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = r.gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  const int rc_only =
      cfg_.qp_type == IBV_QPT_RC ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0;
  return ibv_modify_qp(
      qp, &a,
      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | rc_only);
}

int Peer::modify_rts() {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  a.timeout = cfg_.timeout;
  a.retry_cnt = cfg_.retry_cnt;
  a.rnr_retry = cfg_.rnr_retry;
  a.max_rd_atomic = cfg_.max_rd_atomic;
  const int rc_only = cfg_.qp_type == IBV_QPT_RC ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                                       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC
                                                 : 0;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | rc_only);
}

int Peer::connect(const PeerInfo& remote) {
  if (state() == IBV_QPS_RESET)
    if (int e = modify_init()) return e;
  if (int e = modify_rtr(remote)) return e;
  return modify_rts();
}

MrInfo Peer::add_mr(uint64_t len, int access) {
  MrInfo m;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    m.err = errno;
    return m;
  }
  // PeerConfig::srq == 2: the main buffer belongs to the SRQ's PD.
  ibv_mr* mr = ibv_reg_mr(regions.empty() && srq_pd ? srq_pd : pd, p, len, access);
  if (!mr) {
    m.err = errno ? errno : EINVAL;
    munmap(p, len);
    return m;
  }
  regions.push_back(Region{static_cast<uint8_t*>(p), len, mr});
  m.addr = reinterpret_cast<uint64_t>(p);
  m.len = len;
  m.lkey = mr->lkey;
  m.rkey = mr->rkey;
  m.index = static_cast<int32_t>(regions.size() - 1);
  return m;
}

uint8_t* Peer::ptr(uint32_t mr, uint64_t off) const {
  return regions.at(mr).base + off;
}

ibv_sge Peer::to_sge(const SgeSpec& s) const {
  const Region& r = regions.at(s.mr);
  ibv_sge g;
  g.addr = reinterpret_cast<uint64_t>(r.base + s.offset);
  g.length = s.length;
  g.lkey = s.lkey_override ? s.lkey_override : r.mr->lkey;
  return g;
}

void Peer::build_wr(const SendSpec& s, ibv_send_wr* wr, ibv_sge* sg) const {
  const uint32_t n = std::min(s.num_sge, kMaxSpecSge);
  for (uint32_t i = 0; i < n; ++i) sg[i] = to_sge(s.sge[i]);
  *wr = ibv_send_wr{};
  wr->wr_id = s.wr_id;
  wr->sg_list = n ? sg : nullptr;
  wr->num_sge = static_cast<int>(n);
  wr->opcode = s.opcode;
  wr->send_flags = s.flags;
  switch (s.opcode) {
    case IBV_WR_SEND_WITH_IMM:
      wr->imm_data = s.imm_or_inv;
      break;
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      wr->imm_data = s.imm_or_inv;
      wr->wr.rdma.remote_addr = s.remote_addr;
      wr->wr.rdma.rkey = s.rkey;
      break;
    case IBV_WR_SEND_WITH_INV:
      wr->invalidate_rkey = s.imm_or_inv;
      break;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_READ:
      wr->wr.rdma.remote_addr = s.remote_addr;
      wr->wr.rdma.rkey = s.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      wr->wr.atomic.remote_addr = s.remote_addr;
      wr->wr.atomic.rkey = s.rkey;
      wr->wr.atomic.compare_add = s.compare_add;
      wr->wr.atomic.swap = s.swap;
      break;
    default:
      break;
  }
}

int Peer::post_send(const SendSpec& s) {
  ibv_sge sg[kMaxSpecSge];
  ibv_send_wr wr;
  build_wr(s, &wr, sg);
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

int Peer::post_send_chain(const std::vector<SendSpec>& specs, ptrdiff_t* bad_index) {
  std::vector<ibv_send_wr> wrs(specs.size());
  std::vector<ibv_sge> sg(specs.size() * kMaxSpecSge);
  for (size_t i = 0; i < specs.size(); ++i) {
    build_wr(specs[i], &wrs[i], &sg[i * kMaxSpecSge]);
    wrs[i].next = i + 1 < specs.size() ? &wrs[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  const int rc = ibv_post_send(qp, wrs.empty() ? nullptr : wrs.data(), &bad);
  if (bad_index) *bad_index = bad ? bad - wrs.data() : -1;
  return rc;
}

int Peer::post_recv(uint64_t wr_id, const SgeSpec* sges, uint32_t n) {
  ibv_sge sg[kMaxSpecSge];
  n = std::min(n, kMaxSpecSge);
  for (uint32_t i = 0; i < n; ++i) sg[i] = to_sge(sges[i]);
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = n ? sg : nullptr;
  wr.num_sge = static_cast<int>(n);
  ibv_recv_wr* bad = nullptr;
  return srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
}

std::vector<ibv_wc> Peer::poll(CqSel which, size_t n, Ms timeout) {
  return poll_cq(which == CqSel::send ? scq : rcq, n, timeout);
}

void Peer::fill(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start) {
  fill_pattern(ptr(mr, off), len, seed, start);
}

int64_t Peer::check(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start) {
  return check_pattern(ptr(mr, off), len, seed, start);
}

ibv_qp_state Peer::state() const {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia)) return static_cast<ibv_qp_state>(-1);
  return a.qp_state;
}

int Peer::wait_async(Ms timeout, ibv_async_event* out) {
  const auto end = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<Ms>(end - Clock::now()).count();
    pollfd p{ctx->async_fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    ibv_async_event ev{};
    if (ibv_get_async_event(ctx, &ev) != 0) {
      if (errno == EAGAIN) continue;
      return -1;
    }
    *out = ev;
    ibv_ack_async_event(&ev);
    return ev.event_type;
  }
}

// ---- RPC between the processes ----------------------------------------------------------

namespace {

enum Op : uint32_t {
  kSetup = 1,
  kConnect,
  kAddMr,
  kPostSend,
  kPostSendChain,
  kPostRecv,
  kPoll,
  kFill,
  kCheck,
  kRead,
  kWrite,
  kState,
  kWaitAsync,
  kExit,
  kConnectPostExit,
};

struct MsgHdr {
  uint32_t op;
  int32_t rc;
  uint32_t len;
  uint32_t pad;
};

struct SetupResp {
  PeerInfo info;
  ibv_qp_cap cap;
  char err[200];
};
struct AddMrReq {
  uint64_t len;
  int32_t access;
};
struct PostRecvReq {
  uint64_t wr_id;
  uint32_t n;
  SgeSpec sge[kMaxSpecSge];
};
struct PollReq {
  uint32_t which;
  uint32_t n;
  uint32_t timeout_ms;
};
struct RegionReq {  // fill, check, read, write
  uint32_t mr;
  uint32_t seed;
  uint64_t off;
  uint64_t len;
  uint64_t start;
};
struct AsyncResp {
  int32_t type;
  int32_t own_qp;
};

constexpr size_t kMaxMsg = 128 * 1024;
constexpr int kChildFd = 100;

static_assert(std::is_trivially_copyable_v<PeerConfig>);
static_assert(std::is_trivially_copyable_v<SendSpec>);
static_assert(std::is_trivially_copyable_v<PeerInfo>);

bool send_msg(int fd, uint32_t op, int32_t rc, const void* p, size_t len) {
  std::vector<uint8_t> b(sizeof(MsgHdr) + len);
  MsgHdr h{op, rc, static_cast<uint32_t>(len), 0};
  std::memcpy(b.data(), &h, sizeof h);
  if (len) std::memcpy(b.data() + sizeof h, p, len);
  for (;;) {
    ssize_t n = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    return n == static_cast<ssize_t>(b.size());
  }
}

template <typename T>
bool payload_as(const std::vector<uint8_t>& b, T* out) {
  if (b.size() < sizeof(T)) return false;
  std::memcpy(out, b.data(), sizeof(T));
  return true;
}

bool region_ok(const Peer& p, uint32_t mr, uint64_t off, uint64_t len) {
  return mr < p.regions.size() && off <= p.regions[mr].len && len <= p.regions[mr].len - off;
}

// The child: serves requests until told to exit or the parent goes away.
int serve(int fd) {
  std::unique_ptr<Peer> peer;
  std::vector<uint8_t> in(kMaxMsg);
  for (;;) {
    ssize_t n = recv(fd, in.data(), in.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < static_cast<ssize_t>(sizeof(MsgHdr))) return 0;  // parent gone
    MsgHdr h;
    std::memcpy(&h, in.data(), sizeof h);
    std::vector<uint8_t> req(in.begin() + sizeof h, in.begin() + n);
    int32_t rc = 0;
    std::vector<uint8_t> out;
    auto reply = [&](const void* p, size_t len) {
      out.assign(static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + len);
    };
    if (!peer && h.op != kSetup && h.op != kExit) {
      send_msg(fd, h.op, -EPROTO, nullptr, 0);
      continue;
    }
    switch (h.op) {
      case kSetup: {
        PeerConfig cfg;
        SetupResp r{};
        std::string err;
        if (payload_as(req, &cfg)) peer = Peer::create(cfg, &err);
        if (peer) {
          r.info = peer->info();
          r.cap = peer->cap;
        } else {
          rc = -1;
          std::snprintf(r.err, sizeof r.err, "%s", err.c_str());
        }
        reply(&r, sizeof r);
        break;
      }
      case kConnect: {
        PeerInfo pi;
        rc = payload_as(req, &pi) ? peer->connect(pi) : -EPROTO;
        break;
      }
      case kAddMr: {
        AddMrReq a;
        MrInfo m;
        if (payload_as(req, &a)) m = peer->add_mr(a.len, a.access);
        reply(&m, sizeof m);
        break;
      }
      case kPostSend: {
        SendSpec s;
        rc = payload_as(req, &s) ? peer->post_send(s) : -EPROTO;
        break;
      }
      case kPostSendChain: {
        // An array of SendSpec; the reply is the index *bad_wr pointed at.
        std::vector<SendSpec> specs(req.size() / sizeof(SendSpec));
        if (!specs.empty()) std::memcpy(specs.data(), req.data(), specs.size() * sizeof(SendSpec));
        int64_t bad = -1;
        ptrdiff_t bi = -1;
        rc = specs.empty() ? -EPROTO : peer->post_send_chain(specs, &bi);
        bad = bi;
        reply(&bad, sizeof bad);
        break;
      }
      case kPostRecv: {
        PostRecvReq r;
        rc = payload_as(req, &r) ? peer->post_recv(r.wr_id, r.sge, r.n) : -EPROTO;
        break;
      }
      case kPoll: {
        PollReq p;
        if (!payload_as(req, &p)) {
          rc = -EPROTO;
          break;
        }
        const size_t cap_n = (kMaxMsg - sizeof(MsgHdr)) / sizeof(ibv_wc);
        auto wcs =
            peer->poll(static_cast<CqSel>(p.which), std::min<size_t>(p.n, cap_n), Ms(p.timeout_ms));
        reply(wcs.data(), wcs.size() * sizeof(ibv_wc));
        break;
      }
      case kFill:
      case kCheck:
      case kRead:
      case kWrite: {
        RegionReq r;
        if (!payload_as(req, &r) || !region_ok(*peer, r.mr, r.off, r.len)) {
          rc = -ERANGE;
          break;
        }
        if (h.op == kFill) {
          peer->fill(r.mr, r.off, r.len, r.seed, r.start);
        } else if (h.op == kCheck) {
          const int64_t bad = peer->check(r.mr, r.off, r.len, r.seed, r.start);
          reply(&bad, sizeof bad);
        } else if (h.op == kRead) {
          if (r.len > kMaxMsg - sizeof(MsgHdr)) {
            rc = -ERANGE;
            break;
          }
          reply(peer->ptr(r.mr, r.off), r.len);
        } else {
          if (req.size() != sizeof r + r.len) {
            rc = -EPROTO;
            break;
          }
          std::memcpy(peer->ptr(r.mr, r.off), req.data() + sizeof r, r.len);
        }
        break;
      }
      case kState:
        rc = static_cast<int32_t>(peer->state());
        break;
      case kWaitAsync: {
        uint32_t ms = 0;
        payload_as(req, &ms);
        ibv_async_event ev{};
        AsyncResp a{-1, 0};
        a.type = peer->wait_async(Ms(ms), &ev);
        if (a.type >= 0) a.own_qp = ev.element.qp == peer->qp;
        reply(&a, sizeof a);
        break;
      }
      case kExit:
        peer.reset();
        send_msg(fd, h.op, 0, nullptr, 0);
        return 0;
      case kConnectPostExit: {
        // A program that connects, posts and exits at once: no poll, no teardown.
        PeerInfo pi;
        std::vector<SendSpec> specs;
        if (req.size() > sizeof pi && (req.size() - sizeof pi) % sizeof(SendSpec) == 0) {
          std::memcpy(&pi, req.data(), sizeof pi);
          specs.resize((req.size() - sizeof pi) / sizeof(SendSpec));
          std::memcpy(specs.data(), req.data() + sizeof pi, specs.size() * sizeof(SendSpec));
        }
        rc = specs.empty() ? -EPROTO : peer->connect(pi);
        if (rc == 0) rc = peer->post_send_chain(specs);
        send_msg(fd, h.op, rc, nullptr, 0);
        std::exit(rc == 0 ? 0 : 1);
      }
      default:
        rc = -ENOSYS;
        break;
    }
    if (!send_msg(fd, h.op, rc, out.data(), out.size())) return 1;
  }
}

}  // namespace

int peer_main(const char* scenario, int argc, char** argv) {
  // Die with the parent: a test that crashes must not leave peers behind.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGPIPE, SIG_IGN);
  int fd = -1;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--fd=", 5) == 0) fd = std::atoi(argv[i] + 5);
  if (std::strcmp(scenario, "rpc") != 0 || fd < 0) {
    std::fprintf(stderr, "mp_verbs peer: unknown scenario '%s' or no --fd\n", scenario);
    return 2;
  }
  if (getppid() == 1) return 1;  // parent already gone
  return serve(fd);
}

// ---- RemotePeer ------------------------------------------------------------------------------

std::unique_ptr<RemotePeer> RemotePeer::spawn(const PeerConfig& cfg, std::string* err) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
    *err = std::string("socketpair: ") + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<RemotePeer> rp(new RemotePeer());
  rp->fd_ = sv[0];
  char exe[4096];
  const ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (el <= 0) {
    *err = "readlink /proc/self/exe failed";
    close(sv[1]);
    return nullptr;
  }
  exe[el] = 0;
  // dup2 onto a fixed number clears close-on-exec for the child only. (If the socket
  // already had that number, dup2 would be a no-op and keep the flag: move it first.)
  int child_end = sv[1];
  if (child_end == kChildFd) {
    child_end = fcntl(sv[1], F_DUPFD_CLOEXEC, kChildFd + 1);
    close(sv[1]);
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, child_end, kChildFd);
  char fdarg[32];
  std::snprintf(fdarg, sizeof fdarg, "--fd=%d", kChildFd);
  char peerarg[] = "--peer=rpc";
  char* args[] = {exe, peerarg, fdarg, nullptr};
  pid_t pid = -1;
  // Exec through the magic link, not the path: if the binary was rebuilt while we run, the
  // path names a different program but /proc/self/exe still is this one.
  // Our environment plus whatever a test asked the child to have (no setenv in this
  // process: its engine threads may be reading the environment).
  // A variable the test sets replaces ours (getenv takes the first of duplicates).
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view have(*e);
    const bool replaced =
        std::any_of(g_child_env.begin(), g_child_env.end(), [&](const std::string& x) {
          const size_t eq = x.find('=');
          return eq != std::string::npos &&
                 have.substr(0, eq + 1) == std::string_view(x).substr(0, eq + 1);
        });
    if (!replaced) env.push_back(*e);
  }
  for (std::string& x : g_child_env) env.push_back(x.data());
  env.push_back(nullptr);
  const int r = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, args, env.data());
  posix_spawn_file_actions_destroy(&fa);
  close(child_end);
  if (r != 0) {
    *err = std::string("posix_spawn: ") + std::strerror(r);
    return nullptr;
  }
  rp->pid_ = pid;
  std::vector<uint8_t> resp;
  int32_t rc = 0;
  if (!rp->call(kSetup, &cfg, sizeof cfg, &resp, &rc)) {
    *err = "peer did not answer setup";
    return nullptr;
  }
  SetupResp s{};
  if (!payload_as(resp, &s) || rc != 0) {
    *err = std::string("peer setup failed: ") + s.err;
    return nullptr;
  }
  rp->info_ = s.info;
  rp->cap_ = s.cap;
  return rp;
}

RemotePeer::~RemotePeer() {
  if (!dead_ && fd_ >= 0) {
    std::vector<uint8_t> resp;
    int32_t rc;
    call(kExit, nullptr, 0, &resp, &rc, kWait);
  }
  if (fd_ >= 0) close(fd_);
  if (pid_ > 0) {
    const auto end = Clock::now() + kWait;
    for (;;) {
      int st;
      const pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno != EINTR)) break;
      if (Clock::now() >= end) {
        ADD_FAILURE() << "peer process " << pid_ << " did not exit; killing it";
        kill(pid_, SIGKILL);
        waitpid(pid_, &st, 0);
        break;
      }
      usleep(1000);
    }
  }
}

bool RemotePeer::call(uint32_t op, const void* req, size_t req_len, std::vector<uint8_t>* resp,
                      int32_t* rc, Ms timeout) {
  if (dead_) {
    ADD_FAILURE() << "RPC " << op << " to a peer marked dead";
    return false;
  }
  if (!send_msg(fd_, op, 0, req, req_len)) {
    ADD_FAILURE() << "RPC " << op << ": send failed: " << std::strerror(errno);
    dead_ = true;
    return false;
  }
  const auto end = Clock::now() + timeout;
  std::vector<uint8_t> in(kMaxMsg);
  for (;;) {
    const auto left = std::chrono::duration_cast<Ms>(end - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ADD_FAILURE() << "RPC " << op << ": no answer from the peer within " << timeout.count()
                    << " ms";
      dead_ = true;
      return false;
    }
    const ssize_t n = recv(fd_, in.data(), in.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < static_cast<ssize_t>(sizeof(MsgHdr))) {
      ADD_FAILURE() << "RPC " << op << ": peer closed the channel (died?)";
      dead_ = true;
      return false;
    }
    MsgHdr h;
    std::memcpy(&h, in.data(), sizeof h);
    if (h.op != op || h.len != static_cast<size_t>(n) - sizeof h) {
      ADD_FAILURE() << "RPC " << op << ": bad reply";
      dead_ = true;
      return false;
    }
    *rc = h.rc;
    resp->assign(in.begin() + sizeof h, in.begin() + n);
    return true;
  }
}

int RemotePeer::connect_post_exit(const PeerInfo& remote, const std::vector<SendSpec>& specs) {
  std::vector<uint8_t> req(sizeof remote + specs.size() * sizeof(SendSpec));
  std::memcpy(req.data(), &remote, sizeof remote);
  if (!specs.empty())
    std::memcpy(req.data() + sizeof remote, specs.data(), specs.size() * sizeof(SendSpec));
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  const bool ok = call(kConnectPostExit, req.data(), req.size(), &resp, &rc);
  dead_ = true;  // it exits: the destructor only reaps it
  return ok ? rc : -1;
}

int RemotePeer::connect(const PeerInfo& remote) {
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (!call(kConnect, &remote, sizeof remote, &resp, &rc)) return -1;
  return rc;
}

MrInfo RemotePeer::add_mr(uint64_t len, int access) {
  AddMrReq a{len, access};
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  MrInfo m;
  m.err = EPROTO;
  if (call(kAddMr, &a, sizeof a, &resp, &rc)) payload_as(resp, &m);
  return m;
}

int RemotePeer::post_send(const SendSpec& s) {
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (!call(kPostSend, &s, sizeof s, &resp, &rc)) return -1;
  return rc;
}

int RemotePeer::post_send_chain(const std::vector<SendSpec>& specs, ptrdiff_t* bad_index) {
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (!call(kPostSendChain, specs.data(), specs.size() * sizeof(SendSpec), &resp, &rc)) return -1;
  int64_t bad = -1;
  payload_as(resp, &bad);
  if (bad_index) *bad_index = static_cast<ptrdiff_t>(bad);
  return rc;
}

int RemotePeer::post_recv(uint64_t wr_id, std::initializer_list<SgeSpec> sges) {
  PostRecvReq r{};
  r.wr_id = wr_id;
  for (const SgeSpec& g : sges)
    if (r.n < kMaxSpecSge) r.sge[r.n++] = g;
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (!call(kPostRecv, &r, sizeof r, &resp, &rc)) return -1;
  return rc;
}

std::vector<ibv_wc> RemotePeer::poll(CqSel which, size_t n, Ms timeout) {
  PollReq p{static_cast<uint32_t>(which), static_cast<uint32_t>(n),
            static_cast<uint32_t>(timeout.count())};
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  std::vector<ibv_wc> out;
  if (!call(kPoll, &p, sizeof p, &resp, &rc, timeout + kWait)) return out;
  out.resize(resp.size() / sizeof(ibv_wc));
  if (!out.empty()) std::memcpy(out.data(), resp.data(), out.size() * sizeof(ibv_wc));
  return out;
}

void RemotePeer::fill(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start) {
  RegionReq r{mr, seed, off, len, start};
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (call(kFill, &r, sizeof r, &resp, &rc) && rc != 0) ADD_FAILURE() << "peer fill failed: " << rc;
}

int64_t RemotePeer::check(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start) {
  RegionReq r{mr, seed, off, len, start};
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  int64_t bad = -2;
  if (call(kCheck, &r, sizeof r, &resp, &rc) && rc == 0) payload_as(resp, &bad);
  return bad;
}

std::vector<uint8_t> RemotePeer::read(uint32_t mr, uint64_t off, uint32_t len) {
  RegionReq r{mr, 0, off, len, 0};
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (!call(kRead, &r, sizeof r, &resp, &rc) || rc != 0) {
    ADD_FAILURE() << "peer read failed: " << rc;
    return {};
  }
  return resp;
}

void RemotePeer::write(uint32_t mr, uint64_t off, const void* data, uint32_t len) {
  RegionReq r{mr, 0, off, len, 0};
  std::vector<uint8_t> req(sizeof r + len);
  std::memcpy(req.data(), &r, sizeof r);
  std::memcpy(req.data() + sizeof r, data, len);
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (call(kWrite, req.data(), req.size(), &resp, &rc) && rc != 0)
    ADD_FAILURE() << "peer write failed: " << rc;
}

uint64_t RemotePeer::read_u64(uint32_t mr, uint64_t off) {
  auto b = read(mr, off, 8);
  uint64_t v = 0;
  if (b.size() == 8) std::memcpy(&v, b.data(), 8);
  return v;
}

void RemotePeer::write_u64(uint32_t mr, uint64_t off, uint64_t v) {
  write(mr, off, &v, 8);
}

int RemotePeer::state() {
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  if (!call(kState, nullptr, 0, &resp, &rc)) return -1;
  return rc;
}

int RemotePeer::wait_async(Ms timeout, bool* for_own_qp) {
  const uint32_t ms = static_cast<uint32_t>(timeout.count());
  std::vector<uint8_t> resp;
  int32_t rc = -1;
  AsyncResp a{-1, 0};
  if (call(kWaitAsync, &ms, sizeof ms, &resp, &rc, timeout + kWait)) payload_as(resp, &a);
  if (for_own_qp) *for_own_qp = a.own_qp != 0;
  return a.type;
}

// ---- fixtures ------------------------------------------------------------------------------

void XProc::Create(const PeerConfig& local_cfg, const PeerConfig& remote_cfg) {
  std::string err;
  remote = RemotePeer::spawn(remote_cfg, &err);
  ASSERT_TRUE(remote) << err;
  local = Peer::create(local_cfg, &err);
  ASSERT_TRUE(local) << err;
  li = local->info();
  ri = remote->info();
  ASSERT_NE(li.qpn, ri.qpn);
}

void XProc::Connect(const PeerConfig& local_cfg, const PeerConfig& remote_cfg) {
  ASSERT_NO_FATAL_FAILURE(Create(local_cfg, remote_cfg));
  ASSERT_EQ(remote->connect(li), 0);
  ASSERT_EQ(local->connect(ri), 0);
  ASSERT_EQ(local->state(), IBV_QPS_RTS);
  ASSERT_EQ(remote->state(), IBV_QPS_RTS);
}

void XProc::TearDown() {
  remote.reset();
  local.reset();
}

void InProc::Connect(const PeerConfig& a_cfg, const PeerConfig& b_cfg) {
  std::string err;
  a = Peer::create(a_cfg, &err);
  ASSERT_TRUE(a) << err;
  b = Peer::create(b_cfg, &err);
  ASSERT_TRUE(b) << err;
  ASSERT_EQ(a->modify_init(), 0);
  ASSERT_EQ(b->modify_init(), 0);
  ASSERT_EQ(a->modify_rtr(b->info()), 0);
  ASSERT_EQ(b->modify_rtr(a->info()), 0);
  ASSERT_EQ(a->modify_rts(), 0);
  ASSERT_EQ(b->modify_rts(), 0);
}

void InProc::TearDown() {
  a.reset();
  b.reset();
}

}  // namespace mp
