// Multi-process verbs test harness.
//
// A Peer is what one application owns: a device context, a PD, a send CQ and a receive CQ
// (the latter optionally on a completion channel), one RC QP and registered buffers (MR 0
// is the main buffer; more can be added). A RemotePeer is a Peer living in another process:
// this test binary re-executed (/proc/self/exe --peer=rpc --fd=N) and driven over a
// SOCK_SEQPACKET socketpair inherited at spawn time. Both ends use only the public verbs API.
//
// Connecting is what an application does out of band: exchange (QPN, GID, buffer address,
// rkey), then RESET -> INIT -> RTR -> RTS with the masks rdma-core requires.
//
// Every wait has a deadline (kWait unless a test says otherwise) and exceeding it fails the
// test; deadlines are hang guards, never pass criteria.
#pragma once
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "wire/stats_file.h"

namespace mp {

using Clock = std::chrono::steady_clock;
using Ms = std::chrono::milliseconds;

// Sanitizer builds run the data path several times slower: same checks, longer patience.
#ifdef SV_TEST_SLOW
inline constexpr Ms kWait{30000};
#else
inline constexpr Ms kWait{5000};
#endif

inline constexpr int kAllMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
inline constexpr int kAllQpAccess =
    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
inline constexpr uint32_t kMaxSpecSge = 4;

// ---- data patterns ----------------------------------------------------------------------
// Byte `idx` of the stream named `seed`. Position-dependent and non-periodic, so shifted,
// truncated, duplicated or stale data all show up as mismatches.
uint8_t pattern_byte(uint32_t seed, uint64_t idx);
void fill_pattern(void* p, size_t len, uint32_t seed, uint64_t start = 0);
// Index of the first byte differing from pattern(seed, start + i), or -1 if all match.
int64_t check_pattern(const void* p, size_t len, uint32_t seed, uint64_t start = 0);

// ---- descriptions exchanged between the processes (trivially copyable) -------------------
struct PeerConfig {
  uint64_t buf_size = 4u << 20;
  int send_cqe = 512;
  int recv_cqe = 512;
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  uint32_t max_send_sge = 4;
  uint32_t max_recv_sge = 4;
  uint32_t max_inline_data = 0;
  int mr_access = kAllMrAccess;
  int qp_access = kAllQpAccess;
  int sq_sig_all = 0;
  uint8_t max_rd_atomic = 16;       // ORD (RTS)
  uint8_t max_dest_rd_atomic = 16;  // IRD (RTR)
  uint8_t rnr_retry = 7;
  uint8_t retry_cnt = 7;
  uint8_t timeout = 14;
  uint8_t min_rnr_timer = 12;
  bool with_channel = false;  // receive CQ on a completion channel
  // Non-zero: the receive CQ is an extended CQ (ibv_create_cq_ex) with these wc_flags.
  uint64_t recv_cq_ex_flags = 0;
  // Non-zero: the QP is made by ibv_create_qp_ex with these send_ops_flags (ibv_wr_* API).
  uint64_t send_ops_flags = 0;
  // Receives through a shared receive queue: 0 none; 1 an SRQ on the QP's PD; 2 an SRQ on a
  // PD of its own, which also holds the main buffer's MR (later MRs are on the QP's PD).
  uint8_t srq = 0;
  // IBV_QPT_RC or IBV_QPT_UC; UC's RTR and RTS leave out RC's IRD/ORD, RNR and retry fields.
  ibv_qp_type qp_type = IBV_QPT_RC;
};

// What the other side needs to know to connect and to address our main buffer.
struct PeerInfo {
  uint32_t qpn = 0;
  ibv_gid gid{};
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t rkey = 0;
};

struct MrInfo {
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  int32_t index = -1;
  int32_t err = 0;  // errno of a failed registration
};

// A local scatter/gather element named by (MR index, offset) so either process can say it.
struct SgeSpec {
  uint32_t mr = 0;
  uint32_t lkey_override = 0;  // nonzero: use this lkey (bad-key tests)
  uint64_t offset = 0;
  uint32_t length = 0;
};

struct SendSpec {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  uint32_t flags = IBV_SEND_SIGNALED;
  uint32_t num_sge = 0;
  SgeSpec sge[kMaxSpecSge]{};
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint32_t imm_or_inv = 0;  // imm_data as given (already big-endian) or invalidate_rkey
  uint64_t compare_add = 0;
  uint64_t swap = 0;
};

enum class CqSel : uint32_t { send = 0, recv = 1 };

SgeSpec sge(uint64_t offset, uint32_t length, uint32_t mr = 0);
SendSpec make_send(uint64_t wr_id, std::initializer_list<SgeSpec> sges,
                   uint32_t flags = IBV_SEND_SIGNALED);
SendSpec make_rdma(ibv_wr_opcode op, uint64_t wr_id, std::initializer_list<SgeSpec> sges,
                   uint64_t remote_addr, uint32_t rkey, uint32_t flags = IBV_SEND_SIGNALED);
SendSpec make_atomic(ibv_wr_opcode op, uint64_t wr_id, SgeSpec local, uint64_t remote_addr,
                     uint32_t rkey, uint64_t compare_add, uint64_t swap = 0);

// Polls until n completions arrived or the timeout passed; returns what arrived.
std::vector<ibv_wc> poll_cq(ibv_cq* cq, size_t n, Ms timeout);
std::string wc_str(const ibv_wc& wc);

// Checks one completion: wr_id and status always, opcode unless -1 (the opcode of an
// error completion is undefined in verbs).
::testing::AssertionResult wc_is(const ibv_wc& wc, uint64_t wr_id, ibv_wc_status status,
                                 int opcode = -1);

// Completions of WRs posted with consecutive wr_ids from first_id, in posting order: at most
// max_ok successes, then one `err`, then IBV_WC_WR_FLUSH_ERR. (iWARP completes a Send or
// Write on transmit, so a remote error may surface on the WR behind its cause.)
void expect_error_then_flush(const std::vector<ibv_wc>& wcs, uint64_t first_id, size_t max_ok,
                             ibv_wc_status err);

// ---- a peer in this process ---------------------------------------------------------------
class Peer {
 public:
  static std::unique_ptr<Peer> create(const PeerConfig& cfg, std::string* err);
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  PeerInfo info() const;
  int modify_init();
  int modify_rtr(const PeerInfo& remote);
  int modify_rts();
  int connect(const PeerInfo& remote);  // INIT, RTR, RTS; 0 or the failing call's errno

  MrInfo add_mr(uint64_t len, int access);
  uint8_t* ptr(uint32_t mr, uint64_t off) const;
  ibv_sge to_sge(const SgeSpec& s) const;
  int post_send(const SendSpec& s);
  // Posts the specs as one linked list in a single ibv_post_send. *bad_index is the index
  // of the WR *bad_wr pointed at, or -1 if it was left null.
  int post_send_chain(const std::vector<SendSpec>& specs, ptrdiff_t* bad_index = nullptr);
  int post_recv(uint64_t wr_id, const SgeSpec* sges, uint32_t n);
  int post_recv(uint64_t wr_id, std::initializer_list<SgeSpec> sges) {
    return post_recv(wr_id, sges.begin(), static_cast<uint32_t>(sges.size()));
  }
  std::vector<ibv_wc> poll(CqSel which, size_t n, Ms timeout = kWait);
  void fill(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start = 0);
  int64_t check(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start = 0);
  ibv_qp_state state() const;
  // Waits for one async event; returns its type (event acked, copy in *out) or -1.
  int wait_async(Ms timeout, ibv_async_event* out);

  const PeerConfig& config() const { return cfg_; }

  // The verbs objects, public so tests can call verbs on them directly. A test that
  // destroys one sets the pointer to nullptr.
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_srq* srq = nullptr;    // PeerConfig::srq
  ibv_pd* srq_pd = nullptr;  // PeerConfig::srq == 2
  ibv_qp_cap cap{};          // as returned by ibv_create_qp
  ibv_gid gid{};

  struct Region {
    uint8_t* base = nullptr;
    size_t len = 0;
    ibv_mr* mr = nullptr;
  };
  std::vector<Region> regions;  // [0] is the main buffer

 private:
  Peer() = default;
  void build_wr(const SendSpec& s, ibv_send_wr* wr, ibv_sge* sg) const;
  PeerConfig cfg_;
};

// ---- a peer in a child process ------------------------------------------------------------
class RemotePeer {
 public:
  // Spawns the child and builds its Peer. Null (with *err) on failure.
  static std::unique_ptr<RemotePeer> spawn(const PeerConfig& cfg, std::string* err);
  // Asks the child to tear down and exit; SIGKILLs it if it does not within kWait.
  ~RemotePeer();
  RemotePeer(const RemotePeer&) = delete;
  RemotePeer& operator=(const RemotePeer&) = delete;

  const PeerInfo& info() const { return info_; }
  const ibv_qp_cap& cap() const { return cap_; }
  pid_t pid() const { return pid_; }

  // Each call is one request/response; an RPC failure (child died, timeout) is reported
  // with ADD_FAILURE and the call returns an error value.
  int connect(const PeerInfo& remote);
  // The child connects, posts specs as one chain and calls exit() at once (after replying).
  int connect_post_exit(const PeerInfo& remote, const std::vector<SendSpec>& specs);
  MrInfo add_mr(uint64_t len, int access);
  int post_send(const SendSpec& s);
  // Posts the specs as one linked list in a single ibv_post_send. *bad_index is the index
  // of the WR *bad_wr pointed at, or -1 if it was left null.
  int post_send_chain(const std::vector<SendSpec>& specs, ptrdiff_t* bad_index = nullptr);
  int post_recv(uint64_t wr_id, std::initializer_list<SgeSpec> sges);
  std::vector<ibv_wc> poll(CqSel which, size_t n, Ms timeout = kWait);
  void fill(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start = 0);
  int64_t check(uint32_t mr, uint64_t off, uint64_t len, uint32_t seed, uint64_t start = 0);
  std::vector<uint8_t> read(uint32_t mr, uint64_t off, uint32_t len);
  void write(uint32_t mr, uint64_t off, const void* data, uint32_t len);
  uint64_t read_u64(uint32_t mr, uint64_t off);
  void write_u64(uint32_t mr, uint64_t off, uint64_t v);
  int state();  // ibv_qp_state, or -1
  // Waits in the child for one async event; its type, or -1. *for_own_qp tells whether
  // element.qp was the child's QP.
  int wait_async(Ms timeout, bool* for_own_qp = nullptr);

  // For the peer-death test: the child is gone, do not talk to it again.
  void mark_dead() { dead_ = true; }

 private:
  RemotePeer() = default;
  bool call(uint32_t op, const void* req, size_t req_len, std::vector<uint8_t>* resp, int32_t* rc,
            Ms timeout = Ms(15000));
  int fd_ = -1;
  pid_t pid_ = -1;
  bool dead_ = false;
  PeerInfo info_;
  ibv_qp_cap cap_{};
};

// Reads the QP state until it is `want` or the deadline passes; returns the last state.
// (A completion with an error may be polled an instant before the QP reads back as ERR:
// rxe, too, writes the CQE before moving the QP to the error state.)
template <typename P>
int wait_state(P& p, int want) {
  const auto end = Clock::now() + kWait;
  int st = p.state();
  while (st != want && Clock::now() < end) {
    std::this_thread::sleep_for(Ms(1));
    st = p.state();
  }
  return st;
}

// The QP as process `pid` publishes it in its statistics file (softverbs-stat qp's source);
// false if it is not there.
bool published_qp(pid_t pid, uint32_t qpn, sv::wire::QpStatsView& out);
// One of its counters; ~0 if the QP is not published.
uint64_t qp_counter(pid_t pid, uint32_t qpn, sv::wire::Ctr c);
// Its transport (sv::wire::kTransportShm or 0); ~0 if the QP is not published.
uint32_t transport_of(uint32_t qpn, pid_t pid = getpid());
// That of a QP of this process once it is `want`, or what it is after 2 s: the shared-memory
// set-up messages follow the first FPDUs, and the published statistics follow the switch.
uint32_t wait_transport(uint32_t qpn, uint32_t want);

// `rounds` Sends of 32 B from remote, each received by local spinning on ibv_poll_cq (no
// back-off: a busy poller, as busy-poll ownership sees one). Receives use wr_id = round.
void spin_receive(Peer& local, RemotePeer& remote, uint64_t rounds);

// Entry point of the re-executed binary (--peer=<scenario>).
int peer_main(const char* scenario, int argc, char** argv);

// ---- fixtures ----------------------------------------------------------------------------
// Extra "NAME=value" entries for the environment of children spawned from now on.
extern std::vector<std::string> g_child_env;

// Cross-process: `local` in this process, `remote` in a child, connected.
class XProc : public ::testing::Test {
 protected:
  // Use as ASSERT_NO_FATAL_FAILURE(Connect(...)). Create makes both peers (QPs in RESET)
  // and fills li/ri; Connect does that and takes both QPs to RTS.
  void Create(const PeerConfig& local_cfg = PeerConfig{},
              const PeerConfig& remote_cfg = PeerConfig{});
  void Connect(const PeerConfig& local_cfg = PeerConfig{},
               const PeerConfig& remote_cfg = PeerConfig{});
  void TearDown() override;

  std::unique_ptr<Peer> local;
  std::unique_ptr<RemotePeer> remote;
  PeerInfo li, ri;
};

// XProc with both processes asking, explicitly, for IB's completion rule
// (SOFTVERBS_IB_COMPLETION=1, opt-in), or for RFC 5040's (=0, the default: complete on
// transmit, as toward a plain iWARP peer).
template <char Rule>
class CompletionRule : public XProc {
 protected:
  void SetUp() override {
    const char v[2] = {Rule, 0};
    setenv("SOFTVERBS_IB_COMPLETION", v, 1);
    g_child_env = {std::string("SOFTVERBS_IB_COMPLETION=") + Rule};
  }
  void TearDown() override {
    unsetenv("SOFTVERBS_IB_COMPLETION");
    g_child_env.clear();
    XProc::TearDown();
  }
};
using IbCompletion = CompletionRule<'1'>;
using Rfc5040Completion = CompletionRule<'0'>;

// Two QPs in this process, connected over loopback TCP.
class InProc : public ::testing::Test {
 protected:
  void Connect(const PeerConfig& a_cfg = PeerConfig{}, const PeerConfig& b_cfg = PeerConfig{});
  void TearDown() override;

  std::unique_ptr<Peer> a, b;
};

}  // namespace mp
