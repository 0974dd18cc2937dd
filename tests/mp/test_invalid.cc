// Invalid arguments and resource limits: the errno values rdma-core documents (create_*
// return NULL with errno; modify/destroy/post return the errno; post_* set *bad_wr).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "harness.h"

namespace mp {
namespace {

constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

// One device context, PD and CQ; no peer.
class LocalVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_TRUE(list != nullptr && n >= 1);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx, nullptr);
    ASSERT_EQ(ibv_query_device(ctx, &dev), 0);
    ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
    pd = ibv_alloc_pd(ctx);
    ASSERT_NE(pd, nullptr);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    buf = mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
  }
  void TearDown() override {
    for (auto it = qps.rbegin(); it != qps.rend(); ++it) ibv_destroy_qp(*it);
    for (ibv_mr* m : mrs) ibv_dereg_mr(m);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
    if (buf != MAP_FAILED) munmap(buf, kBuf);
  }

  ibv_qp_init_attr rc_attr() {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ia.qp_type = IBV_QPT_RC;
    return ia;
  }
  ibv_qp* make_qp() {
    ibv_qp_init_attr ia = rc_attr();
    ibv_qp* q = ibv_create_qp(pd, &ia);
    if (q) qps.push_back(q);
    return q;
  }
  ibv_qp_state state(ibv_qp* q) {
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    EXPECT_EQ(ibv_query_qp(q, &a, IBV_QP_STATE, &ia), 0);
    return a.qp_state;
  }
  static ibv_qp_attr init_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = kAllQpAccess;
    return a;
  }
  ibv_qp_attr rtr_attr(uint32_t dest_qpn) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    return a;
  }
  static ibv_qp_attr rts_attr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return a;
  }

  static constexpr size_t kBuf = 1 << 16;
  ibv_context* ctx = nullptr;
  ibv_device_attr dev{};
  ibv_gid gid{};
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  void* buf = MAP_FAILED;
  std::vector<ibv_qp*> qps;
  std::vector<ibv_mr*> mrs;
};

// Identity as rxe reports it: a non-zero vendor id (rdma-core's tests require one) that
// perftest does not know (not Chelsio 0x1425 or Intel 0x8086; part 0 is in no table), and the
// extended attributes' port count.
TEST_F(LocalVerbs, DeviceIdentityAndExtendedAttributes) {
  EXPECT_EQ(dev.vendor_id, 0xFFFFFFu);
  EXPECT_EQ(dev.vendor_part_id, 0u);
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx, nullptr, &ex), 0);
  EXPECT_EQ(ex.orig_attr.vendor_id, dev.vendor_id);
  EXPECT_EQ(ex.phys_port_cnt_ex, 1u);
  EXPECT_EQ(ex.device_cap_flags_ex, static_cast<uint64_t>(dev.device_cap_flags));
}

// An Ethernet port is addressed by GID: an AH without a GRH, or with a source GID index the
// port does not have, is EINVAL (the kernel's rdma_check_ah_attr); a global one is made.
// The context's cmd_fd is a real descriptor (programs dup() it to share a context, as
// rdma-core's shared-PD tests do); importing it is not supported, and says so.
TEST_F(LocalVerbs, CmdFdIsADescriptorAndImportIsNotSupported) {
  ASSERT_GE(ctx->cmd_fd, 0);
  const int dup_fd = dup(ctx->cmd_fd);
  ASSERT_GE(dup_fd, 0) << strerror(errno);
  errno = 0;
  EXPECT_EQ(ibv_import_device(dup_fd), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  close(dup_fd);
}

TEST_F(LocalVerbs, CreateAhNeedsAGrhOnAnEthernetPort) {
  ibv_ah_attr a{};
  a.port_num = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.is_global = 1;
  a.grh.dgid = gid;
  a.grh.hop_limit = 64;
  a.grh.sgid_index = 200;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.grh.sgid_index = 0;
  ibv_ah* ah = ibv_create_ah(pd, &a);
  ASSERT_NE(ah, nullptr) << strerror(errno);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

// Objects are found as the kernel finds them (uverbs looks each handle up): a garbled
// pointer or an object already destroyed names no object, ENOENT (Linux 6.1.141 on: every
// verb); an object of another context is EINVAL; nothing behind a bad one is touched.
TEST_F(LocalVerbs, GarbledDestroyedOrForeignObjects) {
  // A plausible-looking fake of each object: never dereferenced by a correct library.
  alignas(64) static char junk[4096];
  std::memset(junk, 0x5a, sizeof junk);
  auto* fake_qp = reinterpret_cast<ibv_qp*>(junk);
  auto* fake_cq = reinterpret_cast<ibv_cq*>(junk);
  auto* fake_pd = reinterpret_cast<ibv_pd*>(junk);
  auto* fake_mr = reinterpret_cast<ibv_mr*>(junk);
  auto* fake_srq = reinterpret_cast<ibv_srq*>(junk);
  EXPECT_EQ(ibv_destroy_qp(fake_qp), ENOENT);
  EXPECT_EQ(ibv_destroy_cq(fake_cq), ENOENT);
  EXPECT_EQ(ibv_dealloc_pd(fake_pd), ENOENT);
  EXPECT_EQ(ibv_dereg_mr(fake_mr), ENOENT);
  EXPECT_EQ(ibv_destroy_srq(fake_srq), ENOENT);
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  EXPECT_EQ(ibv_modify_qp(fake_qp, &qa, IBV_QP_STATE), ENOENT);
  EXPECT_EQ(ibv_query_qp(fake_qp, &qa, IBV_QP_STATE, &qi), ENOENT);
  EXPECT_EQ(ibv_resize_cq(fake_cq, 16), ENOENT);

  // Creation with a garbled PD or CQ.
  ibv_qp_init_attr ia = rc_attr();
  errno = 0;
  EXPECT_EQ(ibv_create_qp(fake_pd, &ia), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ia.send_cq = fake_cq;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &ia), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(fake_pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq(fake_pd, &sa), nullptr);
  EXPECT_EQ(errno, ENOENT);

  // Objects of another context: a QP may not mix them.
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_GE(n, 1);
  ibv_context* other = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(other, nullptr);
  ibv_cq* other_cq = ibv_create_cq(other, 16, nullptr, nullptr, 0);
  ASSERT_NE(other_cq, nullptr);
  ia = rc_attr();
  ia.recv_cq = other_cq;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &ia), nullptr) << "a QP over another context's CQ";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_destroy_cq(other_cq), 0);
  EXPECT_EQ(ibv_close_device(other), 0);

  // Destroyed objects are stale handles: a second destroy is ENOENT, not a double free.
  ibv_qp* qp = ibv_create_qp(pd, &(ia = rc_attr()));
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), ENOENT);
  ibv_mr* mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), ENOENT);
  for (char c : junk) ASSERT_EQ(c, 0x5a) << "a fake object was written to";
}

// A handle field the caller rewrote (rdma-core hands the kernel nothing else) names no
// object: each verb fails as uverbs fails it, and the object is left intact, so the caller
// can restore the handle and destroy it normally. One case per object type.
constexpr uint32_t kBogusHandle = 0xdead;

// Destroying `obj` with its handle garbled is ENOENT and leaves it; restored, it goes.
template <typename T, typename Destroy>
void expect_destroy_needs_its_handle(T* obj, Destroy destroy) {
  const uint32_t h = obj->handle;
  obj->handle = kBogusHandle;
  EXPECT_EQ(destroy(obj), ENOENT);
  obj->handle = h;
  EXPECT_EQ(destroy(obj), 0);
}

TEST_F(LocalVerbs, AGarbledPdHandleIsEnoentAndThePdSurvives) {
  ibv_pd* p = ibv_alloc_pd(ctx);
  ASSERT_NE(p, nullptr);
  const uint32_t h = p->handle;
  p->handle = kBogusHandle;
  EXPECT_EQ(ibv_dealloc_pd(p), ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(p, buf, 4096, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_qp_init_attr ia = rc_attr();
  errno = 0;
  EXPECT_EQ(ibv_create_qp(p, &ia), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_srq(p, &sa), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_alloc_mw(p, IBV_MW_TYPE_2), nullptr);
  EXPECT_EQ(errno, ENOENT);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.grh.dgid = gid;
  aa.port_num = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(p, &aa), nullptr);
  EXPECT_EQ(errno, ENOENT);
  p->handle = h;
  ibv_mr* m = ibv_reg_mr(p, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(m, nullptr) << "the PD works again";
  EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_dealloc_pd(p), 0);
}

TEST_F(LocalVerbs, AGarbledMrHandleIsEnoentAndTheMrSurvives) {
  ibv_mr* m = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(m, nullptr);
  const uint32_t h = m->handle;
  m->handle = kBogusHandle;
  EXPECT_EQ(ibv_dereg_mr(m), ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, ENOENT);
  m->handle = h;
  // A rereg that names a PD whose handle names nothing: the region is unchanged.
  ibv_pd* p = ibv_alloc_pd(ctx);
  ASSERT_NE(p, nullptr);
  const uint32_t ph = p->handle;
  p->handle = kBogusHandle;
  errno = 0;
  EXPECT_EQ(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, p, nullptr, 0, 0), IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(m->pd, pd);
  p->handle = ph;
  EXPECT_EQ(ibv_dereg_mr(m), 0);
  EXPECT_EQ(ibv_dealloc_pd(p), 0);
}

TEST_F(LocalVerbs, AGarbledMwHandleIsEnoentAndTheMwSurvives) {
  ibv_mw* w = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  ASSERT_NE(w, nullptr) << strerror(errno);
  expect_destroy_needs_its_handle(w, [](ibv_mw* m) { return ibv_dealloc_mw(m); });
}

// A thread remembers the checks that passed (handles.cc: RDS's busy poller checks its CQ ~19
// times per message), but only while the object stands, its handle unchanged, in this
// process: a garbled handle, a destroy by another thread and a fork each end the memory.
TEST_F(LocalVerbs, APassedCheckHoldsOnlyWhileTheObjectAndItsHandleStand) {
  ibv_cq* c = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ibv_resize_cq(c, 32), 0);
  const uint32_t h = c->handle;
  c->handle = kBogusHandle;
  EXPECT_EQ(ibv_resize_cq(c, 64), ENOENT) << "a pass outlived its handle";
  c->handle = h;
  EXPECT_EQ(ibv_resize_cq(c, 64), 0);
  const pid_t child = fork();
  if (child == 0) _exit(ibv_resize_cq(c, 32) == ENOENT ? 0 : 1);  // the parent's, not its own
  int status = -1;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a pass survived a fork";
  // Destroyed on another thread: never looked at again here (ASan: no read of the freed CQ).
  std::thread([&] { EXPECT_EQ(ibv_destroy_cq(c), 0); }).join();
  EXPECT_EQ(ibv_resize_cq(c, 32), ENOENT) << "a pass outlived its object";
}

TEST_F(LocalVerbs, AGarbledCqHandleIsEnoentAndTheCqSurvives) {
  for (bool extended : {false, true}) {
    SCOPED_TRACE(extended ? "ibv_create_cq_ex" : "ibv_create_cq");
    ibv_cq* c = nullptr;
    if (extended) {
      ibv_cq_init_attr_ex ca{};
      ca.cqe = 16;
      ibv_cq_ex* cx = ibv_create_cq_ex(ctx, &ca);
      ASSERT_NE(cx, nullptr);
      c = ibv_cq_ex_to_cq(cx);
    } else {
      c = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
      ASSERT_NE(c, nullptr);
    }
    const uint32_t h = c->handle;
    c->handle = kBogusHandle;
    EXPECT_EQ(ibv_destroy_cq(c), ENOENT);
    EXPECT_EQ(ibv_resize_cq(c, 32), ENOENT);
    ibv_qp_init_attr ia = rc_attr();
    ia.recv_cq = c;
    errno = 0;
    EXPECT_EQ(ibv_create_qp(pd, &ia), nullptr);
    EXPECT_EQ(errno, ENOENT);
    c->handle = h;
    EXPECT_EQ(ibv_resize_cq(c, 32), 0);
    EXPECT_EQ(ibv_destroy_cq(c), 0);
  }
}

TEST_F(LocalVerbs, AGarbledQpHandleIsEnoentAndTheQpSurvives) {
  ibv_qp_init_attr ia = rc_attr();
  ibv_qp* q = ibv_create_qp(pd, &ia);
  ASSERT_NE(q, nullptr);
  const uint32_t h = q->handle;
  q->handle = kBogusHandle;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  EXPECT_EQ(
      ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      ENOENT);
  ibv_qp_init_attr qi{};
  EXPECT_EQ(ibv_query_qp(q, &a, IBV_QP_STATE, &qi), ENOENT);
  EXPECT_EQ(ibv_destroy_qp(q), ENOENT);
  q->handle = h;
  EXPECT_EQ(ibv_query_qp(q, &a, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(a.qp_state, IBV_QPS_RESET) << "the failed modify changed nothing";
  EXPECT_EQ(ibv_destroy_qp(q), 0);
}

TEST_F(LocalVerbs, AGarbledSrqHandleIsEnoentAndTheSrqSurvives) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* s = ibv_create_srq(pd, &sa);
  ASSERT_NE(s, nullptr);
  const uint32_t h = s->handle;
  s->handle = kBogusHandle;
  ibv_srq_attr a{};
  EXPECT_EQ(ibv_query_srq(s, &a), ENOENT);
  a.srq_limit = 1;
  EXPECT_EQ(ibv_modify_srq(s, &a, IBV_SRQ_LIMIT), ENOENT);
  ibv_qp_init_attr ia = rc_attr();
  ia.srq = s;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &ia), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ibv_destroy_srq(s), ENOENT);
  s->handle = h;
  EXPECT_EQ(ibv_query_srq(s, &a), 0);
  EXPECT_EQ(a.srq_limit, 0u) << "the failed modify changed nothing";
  EXPECT_EQ(ibv_destroy_srq(s), 0);
}

TEST_F(LocalVerbs, AGarbledAhHandleIsEnoentAndTheAhSurvives) {
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.grh.dgid = gid;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd, &aa);
  ASSERT_NE(ah, nullptr) << strerror(errno);
  expect_destroy_needs_its_handle(ah, ibv_destroy_ah);
}

// A handle rewritten to name another live object: of another type, uverbs answers EINVAL;
// of the same type the kernel would act on that other object, which here would free memory
// the caller still holds through the other pointer: EINVAL too, and both objects survive.
TEST_F(LocalVerbs, AHandleThatNamesAnotherObjectIsEinval) {
  ibv_pd* p = ibv_alloc_pd(ctx);
  ASSERT_NE(p, nullptr);
  const uint32_t h = p->handle;
  p->handle = cq->handle;  // a CQ's
  EXPECT_EQ(ibv_dealloc_pd(p), EINVAL);
  p->handle = pd->handle;  // the fixture's PD
  EXPECT_EQ(ibv_dealloc_pd(p), EINVAL);
  p->handle = h;
  EXPECT_EQ(ibv_dealloc_pd(p), 0);
  ibv_mr* m = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(m, nullptr) << "the fixture's PD was not touched";
  EXPECT_EQ(ibv_dereg_mr(m), 0);
}

TEST_F(LocalVerbs, CreateCqRejectsBadSizesAndVectors) {
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx, 0, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx, -1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx, dev.max_cqe + 1, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx, 16, nullptr, nullptr, ctx->num_comp_vectors), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_cq* one = ibv_create_cq(ctx, 1, nullptr, nullptr, 0);
  ASSERT_NE(one, nullptr);
  EXPECT_GE(one->cqe, 1);
  EXPECT_EQ(ibv_destroy_cq(one), 0);
}

TEST_F(LocalVerbs, CreateQpRejectsOversizedCapsAndOtherTypes) {
  struct Case {
    const char* what;
    void (*mutate)(ibv_qp_init_attr&, const ibv_device_attr&);
    int err;
  };
  const Case cases[] = {
      {"max_send_wr > max_qp_wr",
       [](ibv_qp_init_attr& a, const ibv_device_attr& d) { a.cap.max_send_wr = d.max_qp_wr + 1; },
       EINVAL},
      {"max_recv_wr > max_qp_wr",
       [](ibv_qp_init_attr& a, const ibv_device_attr& d) { a.cap.max_recv_wr = d.max_qp_wr + 1; },
       EINVAL},
      {"max_send_sge > max_sge",
       [](ibv_qp_init_attr& a, const ibv_device_attr& d) { a.cap.max_send_sge = d.max_sge + 1; },
       EINVAL},
      {"max_recv_sge > max_sge",
       [](ibv_qp_init_attr& a, const ibv_device_attr& d) { a.cap.max_recv_sge = d.max_sge + 1; },
       EINVAL},
      {"max_inline_data 64 KiB",
       [](ibv_qp_init_attr& a, const ibv_device_attr&) { a.cap.max_inline_data = 65536; }, EINVAL},
      // RC, UC and UD (over UDP) only; other types are EOPNOTSUPP, as siw answers for all
      // but RC.
      {"RAW_PACKET",
       [](ibv_qp_init_attr& a, const ibv_device_attr&) { a.qp_type = IBV_QPT_RAW_PACKET; },
       EOPNOTSUPP},
      {"XRC_SEND",
       [](ibv_qp_init_attr& a, const ibv_device_attr&) { a.qp_type = IBV_QPT_XRC_SEND; },
       EOPNOTSUPP},
  };
  for (const Case& c : cases) {
    ibv_qp_init_attr ia = rc_attr();
    c.mutate(ia, dev);
    errno = 0;
    ibv_qp* q = ibv_create_qp(pd, &ia);
    EXPECT_EQ(q, nullptr) << c.what;
    if (q) qps.push_back(q);
    EXPECT_EQ(errno, c.err) << c.what;
  }
  // The limits themselves are accepted, and the caps returned cover what was asked for.
  ibv_qp_init_attr ia = rc_attr();
  ia.cap.max_send_wr = 100;
  ia.cap.max_send_sge = dev.max_sge;
  ia.cap.max_recv_sge = dev.max_sge;
  ia.cap.max_inline_data = 64;
  ibv_qp* q = ibv_create_qp(pd, &ia);
  ASSERT_NE(q, nullptr) << std::strerror(errno);
  qps.push_back(q);
  EXPECT_GE(ia.cap.max_send_wr, 100u);
  EXPECT_GE(ia.cap.max_send_sge, static_cast<uint32_t>(dev.max_sge));
  EXPECT_GE(ia.cap.max_inline_data, 64u);
}

TEST_F(LocalVerbs, RegMrAccessAndLength) {
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "REMOTE_WRITE needs LOCAL_WRITE";
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ), nullptr);
  EXPECT_EQ(errno, EINVAL) << "REMOTE_ATOMIC needs LOCAL_WRITE";
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "length 0";

  const int ok[] = {0, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_LOCAL_WRITE,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING,
                    kAllMrAccess | IBV_ACCESS_RELAXED_ORDERING};
  for (int access : ok) {
    ibv_mr* mr = ibv_reg_mr(pd, buf, 4096, access);
    EXPECT_NE(mr, nullptr) << "access " << std::hex << access << ": " << std::strerror(errno);
    if (!mr) continue;
    EXPECT_EQ(mr->addr, buf);
    EXPECT_EQ(mr->length, 4096u);
    EXPECT_EQ(mr->pd, pd);
    mrs.push_back(mr);
  }
}

TEST_F(LocalVerbs, MrKeysAreDistinctAndNotSoonReissued) {
  std::vector<ibv_mr*> first;
  std::set<uint32_t> lkeys, rkeys;
  for (int i = 0; i < 10; ++i) {
    ibv_mr* mr = ibv_reg_mr(pd, static_cast<char*>(buf) + i * 64, 64, kAllMrAccess);
    ASSERT_NE(mr, nullptr);
    first.push_back(mr);
    lkeys.insert(mr->lkey);
    rkeys.insert(mr->rkey);
  }
  EXPECT_EQ(lkeys.size(), 10u);
  EXPECT_EQ(rkeys.size(), 10u);
  const uint32_t gone_l = first[3]->lkey, gone_r = first[3]->rkey;
  ASSERT_EQ(ibv_dereg_mr(first[3]), 0);
  first[3] = nullptr;
  for (int i = 0; i < 100; ++i) {
    ibv_mr* mr = ibv_reg_mr(pd, buf, 64, kAllMrAccess);
    ASSERT_NE(mr, nullptr);
    mrs.push_back(mr);
    EXPECT_NE(mr->lkey, gone_l) << "deregistered lkey reissued after " << i << " registrations";
    EXPECT_NE(mr->rkey, gone_r) << "deregistered rkey reissued after " << i << " registrations";
    EXPECT_EQ(lkeys.count(mr->lkey), 0u);
    EXPECT_EQ(rkeys.count(mr->rkey), 0u);
  }
  for (ibv_mr* m : first)
    if (m) mrs.push_back(m);
}

TEST_F(LocalVerbs, ModifyQpRejectsInvalidTransitionsAndMasks) {
  ibv_qp* qp = make_qp();
  ASSERT_NE(qp, nullptr);
  // RTR needs a destination; a second QP of this process that stays in RESET serves (the
  // connection attempt waits for it and never fails the QP under test).
  ibv_qp* peer = make_qp();
  ASSERT_NE(peer, nullptr);
  ibv_qp_attr init = init_attr(), rtr = rtr_attr(peer->qp_num), rts = rts_attr();

  EXPECT_EQ(ibv_modify_qp(qp, &rtr, kRtrMask), EINVAL) << "RESET -> RTR";
  EXPECT_EQ(state(qp), IBV_QPS_RESET);
  EXPECT_EQ(ibv_modify_qp(qp, &rts, kRtsMask), EINVAL) << "RESET -> RTS";
  EXPECT_EQ(state(qp), IBV_QPS_RESET);
  for (int bit : {IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_ACCESS_FLAGS}) {
    EXPECT_EQ(ibv_modify_qp(qp, &init, kInitMask & ~bit), EINVAL) << "INIT without " << bit;
    EXPECT_EQ(state(qp), IBV_QPS_RESET);
  }
  for (int bit : {IBV_QP_SQ_PSN, IBV_QP_DEST_QPN, IBV_QP_AV, IBV_QP_TIMEOUT, IBV_QP_RQ_PSN}) {
    EXPECT_EQ(ibv_modify_qp(qp, &init, kInitMask | bit), EINVAL) << "INIT with " << bit;
    EXPECT_EQ(state(qp), IBV_QPS_RESET);
  }
  init.port_num = 2;
  EXPECT_EQ(ibv_modify_qp(qp, &init, kInitMask), EINVAL) << "port 2";
  EXPECT_EQ(state(qp), IBV_QPS_RESET);
  init.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &init, kInitMask), 0);
  EXPECT_EQ(state(qp), IBV_QPS_INIT);

  EXPECT_EQ(ibv_modify_qp(qp, &rts, kRtsMask), EINVAL) << "INIT -> RTS";
  EXPECT_EQ(state(qp), IBV_QPS_INIT);
  for (int bit : {IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_DEST_QPN, IBV_QP_RQ_PSN,
                  IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER}) {
    EXPECT_EQ(ibv_modify_qp(qp, &rtr, kRtrMask & ~bit), EINVAL) << "RTR without " << bit;
    EXPECT_EQ(state(qp), IBV_QPS_INIT);
  }
  for (int bit : {IBV_QP_SQ_PSN, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY,
                  IBV_QP_MAX_QP_RD_ATOMIC}) {
    EXPECT_EQ(ibv_modify_qp(qp, &rtr, kRtrMask | bit), EINVAL) << "RTR with " << bit;
    EXPECT_EQ(state(qp), IBV_QPS_INIT);
  }
  ASSERT_EQ(ibv_modify_qp(qp, &rtr, kRtrMask), 0);
  EXPECT_EQ(state(qp), IBV_QPS_RTR);

  for (int bit : {IBV_QP_SQ_PSN, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY,
                  IBV_QP_MAX_QP_RD_ATOMIC}) {
    EXPECT_EQ(ibv_modify_qp(qp, &rts, kRtsMask & ~bit), EINVAL) << "RTS without " << bit;
    EXPECT_EQ(state(qp), IBV_QPS_RTR);
  }
  for (int bit : {IBV_QP_DEST_QPN, IBV_QP_RQ_PSN, IBV_QP_PATH_MTU, IBV_QP_MAX_DEST_RD_ATOMIC,
                  IBV_QP_AV, IBV_QP_PORT}) {
    EXPECT_EQ(ibv_modify_qp(qp, &rts, kRtsMask | bit), EINVAL) << "RTS with " << bit;
    EXPECT_EQ(state(qp), IBV_QPS_RTR);
  }
  ASSERT_EQ(ibv_modify_qp(qp, &rts, kRtsMask), 0);
  EXPECT_EQ(state(qp), IBV_QPS_RTS);

  // RTS -> RTS: IBV_QP_STATE is optional (the kernel's qp_state_table requires nothing for
  // it); allowed attributes change, others are EINVAL and change nothing.
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  ASSERT_EQ(ibv_modify_qp(qp, &acc, IBV_QP_ACCESS_FLAGS), 0) << "RTS -> RTS, access only";
  ibv_qp_attr got{};
  ibv_qp_init_attr gi{};
  ASSERT_EQ(ibv_query_qp(qp, &got, IBV_QP_ACCESS_FLAGS, &gi), 0);
  EXPECT_EQ(got.qp_access_flags, static_cast<unsigned>(IBV_ACCESS_REMOTE_READ));
  acc.qp_state = IBV_QPS_RTS;
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  EXPECT_EQ(ibv_modify_qp(qp, &acc, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS), 0);
  acc.path_mtu = IBV_MTU_1024;
  EXPECT_EQ(ibv_modify_qp(qp, &acc, IBV_QP_PATH_MTU), EINVAL) << "RTS -> RTS, path MTU";
  EXPECT_EQ(state(qp), IBV_QPS_RTS);
}

TEST_F(LocalVerbs, PostInWrongStateIsEinvalWithBadWr) {
  ibv_qp* qp = make_qp();
  ASSERT_NE(qp, nullptr);
  ibv_qp* peer = make_qp();
  ASSERT_NE(peer, nullptr);
  ibv_mr* mr = ibv_reg_mr(pd, buf, 4096, kAllMrAccess);
  ASSERT_NE(mr, nullptr);
  mrs.push_back(mr);
  ibv_sge sg{reinterpret_cast<uint64_t>(buf), 8, mr->lkey};
  ibv_send_wr wr[2]{};
  for (int i = 0; i < 2; ++i) {
    wr[i].wr_id = i + 1;
    wr[i].sg_list = &sg;
    wr[i].num_sge = 1;
    wr[i].opcode = IBV_WR_SEND;
    wr[i].send_flags = IBV_SEND_SIGNALED;
  }
  wr[0].next = &wr[1];
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &sg;
  rwr.num_sge = 1;

  auto expect_send_refused = [&](const char* st) {
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(qp, wr, &bad), EINVAL) << st;
    EXPECT_EQ(bad, &wr[0]) << st;
  };
  expect_send_refused("RESET");
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), EINVAL) << "post_recv in RESET";
  EXPECT_EQ(rbad, &rwr);

  ibv_qp_attr init = init_attr();
  ASSERT_EQ(ibv_modify_qp(qp, &init, kInitMask), 0);
  expect_send_refused("INIT");
  rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, &rwr, &rbad), 0) << "post_recv is allowed from INIT on";

  ibv_qp_attr rtr = rtr_attr(peer->qp_num);
  ASSERT_EQ(ibv_modify_qp(qp, &rtr, kRtrMask), 0);
  expect_send_refused("RTR");
  EXPECT_EQ(state(qp), IBV_QPS_RTR);

  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0) << "a refused WR completed: " << wc_str(wc);
}

TEST_F(LocalVerbs, RqOverflowIsEnomemAtTheFirstWrThatDoesNotFit) {
  ibv_qp* qp = make_qp();
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(qp, &attr, IBV_QP_CAP, &init), 0);
  const uint32_t cap = init.cap.max_recv_wr;
  ASSERT_GE(cap, 16u);
  ASSERT_LE(cap, 1024u);
  ibv_qp_attr in = init_attr();
  ASSERT_EQ(ibv_modify_qp(qp, &in, kInitMask), 0);
  ibv_mr* mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  mrs.push_back(mr);
  ibv_sge sg{reinterpret_cast<uint64_t>(buf), 64, mr->lkey};
  std::vector<ibv_recv_wr> wr(cap + 1);
  for (uint32_t i = 0; i <= cap; ++i) {
    wr[i].wr_id = i;
    wr[i].sg_list = &sg;
    wr[i].num_sge = 1;
    wr[i].next = i < cap ? &wr[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(qp, wr.data(), &bad), ENOMEM);
  EXPECT_EQ(bad, &wr[cap]);
  // Exactly cap were queued: moving to ERR flushes them, in order.
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(qp, &e, IBV_QP_STATE), 0);
  auto wcs = poll_cq(cq, cap, kWait);
  ASSERT_EQ(wcs.size(), cap);
  for (uint32_t i = 0; i < cap; ++i) EXPECT_TRUE(wc_is(wcs[i], i, IBV_WC_WR_FLUSH_ERR));
  ibv_wc extra;
  EXPECT_EQ(ibv_poll_cq(cq, 1, &extra), 0) << "the refused WR was queued: " << wc_str(extra);
}

TEST_F(LocalVerbs, DestroyCqWithQpIsEbusy) {
  ibv_cq* c = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(c, nullptr);
  ibv_qp_init_attr ia = rc_attr();
  ia.send_cq = cq;
  ia.recv_cq = c;  // attached as receive CQ only
  ibv_qp* q = ibv_create_qp(pd, &ia);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(ibv_destroy_cq(c), EBUSY);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);
  ASSERT_EQ(ibv_destroy_qp(q), 0);
  EXPECT_EQ(ibv_destroy_cq(c), 0);
}

TEST_F(LocalVerbs, DestroyCompChannelWithCqIsEbusy) {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  ASSERT_NE(ch, nullptr);
  ibv_cq* c = ibv_create_cq(ctx, 16, nullptr, ch, 0);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), EBUSY);
  ASSERT_EQ(ibv_destroy_cq(c), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
}

// ibv_rereg_mr as rdma-core and the kernel answer it: input errors rdma-core itself catches
// are IBV_REREG_MR_ERR_INPUT, what the kernel refuses is IBV_REREG_MR_ERR_CMD, errno EINVAL
// either way and the region unchanged; CHANGE_ACCESS and CHANGE_PD keep both keys (rxe).
TEST_F(LocalVerbs, ReregMrErrorsAndKeys) {
  ibv_mr* mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  mrs.push_back(mr);
  const uint32_t lkey = mr->lkey, rkey = mr->rkey;
  auto rereg = [&](int flags, ibv_pd* p, int access) {
    errno = 0;
    return ibv_rereg_mr(mr, flags, p, nullptr, 0, access);
  };
  EXPECT_EQ(rereg(1 << 7, nullptr, 0), IBV_REREG_MR_ERR_INPUT) << "unknown flag";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_PD, pd, IBV_ACCESS_LOCAL_WRITE), IBV_REREG_MR_ERR_INPUT)
      << "access without CHANGE_ACCESS";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rereg(0, nullptr, 0), IBV_REREG_MR_ERR_CMD) << "nothing to change";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr, IBV_ACCESS_REMOTE_WRITE),
            IBV_REREG_MR_ERR_CMD)
      << "remote write without local write";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rereg(IBV_REREG_MR_CHANGE_PD, nullptr, 0), IBV_REREG_MR_ERR_CMD) << "no PD";
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(mr->lkey, lkey);

  ASSERT_EQ(rereg(IBV_REREG_MR_CHANGE_ACCESS, nullptr,
                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            0);
  EXPECT_EQ(mr->lkey, lkey);
  EXPECT_EQ(mr->rkey, rkey);
  ibv_pd* pd2 = ibv_alloc_pd(ctx);
  ASSERT_NE(pd2, nullptr);
  ASSERT_EQ(rereg(IBV_REREG_MR_CHANGE_PD, pd2, 0), 0);
  EXPECT_EQ(mr->pd, pd2);
  EXPECT_EQ(mr->rkey, rkey);
  EXPECT_EQ(ibv_dealloc_pd(pd2), EBUSY) << "the region now holds pd2";
  ASSERT_EQ(rereg(IBV_REREG_MR_CHANGE_PD, pd, 0), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  // A new translation is a new registration: new keys.
  ASSERT_EQ(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr,
                         static_cast<char*>(buf) + 4096, 4096, 0),
            0);
  EXPECT_NE(mr->rkey, rkey);
  EXPECT_EQ(mr->addr, static_cast<char*>(buf) + 4096);
}

// ibv_dealloc_pd(3): "may fail if any other resource is still associated with the PD";
// the kernel (uverbs_free_pd -> ib_destroy_usecnt) returns EBUSY, and errno is EBUSY too
// (rdma-core's command write() failed with it).
TEST_F(LocalVerbs, DeallocPdInUseIsEbusy) {
  ibv_pd* p = ibv_alloc_pd(ctx);
  ASSERT_NE(p, nullptr);
  ibv_mr* mr = ibv_reg_mr(p, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  errno = 0;
  const int rc = ibv_dealloc_pd(p);
  EXPECT_EQ(rc, EBUSY) << "PD with a registered MR was deallocated";
  EXPECT_EQ(errno, EBUSY);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  if (rc != 0) {
    EXPECT_EQ(ibv_dealloc_pd(p), 0);  // else it is already gone
  }
}

// ---- limits that need a connected QP --------------------------------------------------------

TEST_F(XProc, PostSendTooManySgeStopsAtTheOffendingWr) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const uint32_t max = local->cap.max_send_sge;
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_EQ(remote->post_recv(i, {sge(i * 4096, 4096)}), 0);
  local->fill(0, 0, 4096, 5);
  std::vector<ibv_sge> many(max + 1, local->to_sge(sge(0, 8)));
  ibv_sge one = local->to_sge(sge(0, 8)), two = local->to_sge(sge(0, 16));
  ibv_send_wr wr[3]{};
  wr[0].sg_list = &one;
  wr[0].num_sge = 1;
  wr[1].sg_list = &two;
  wr[1].num_sge = 1;
  wr[2].sg_list = many.data();
  wr[2].num_sge = static_cast<int>(max + 1);
  for (int i = 0; i < 3; ++i) {
    wr[i].wr_id = i + 1;
    wr[i].opcode = IBV_WR_SEND;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].next = i < 2 ? &wr[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(local->qp, wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr[2]);
  // WR 4 shows WR 3 never went out: the peer's third receive gets WR 4's 24 bytes.
  ASSERT_EQ(local->post_send(make_send(4, {sge(0, 24)})), 0);
  auto s = local->poll(CqSel::send, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_TRUE(wc_is(s[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_TRUE(wc_is(s[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND));
  EXPECT_TRUE(wc_is(s[2], 4, IBV_WC_SUCCESS, IBV_WC_SEND));
  auto r = remote->poll(CqSel::recv, 3);
  ASSERT_EQ(r.size(), 3u);
  const uint32_t lens[] = {8, 16, 24};
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(wc_is(r[i], i + 1, IBV_WC_SUCCESS, IBV_WC_RECV));
    EXPECT_EQ(r[i].byte_len, lens[i]);
  }
}

TEST_F(XProc, SqOverflowIsEnomemAtTheFirstWrThatDoesNotFit) {
  PeerConfig lc;
  lc.max_send_wr = 16;
  ASSERT_NO_FATAL_FAILURE(Connect(lc));
  const uint32_t cap = local->cap.max_send_wr;
  ASSERT_GE(cap, 16u);
  ASSERT_LE(cap, 256u);
  local->fill(0, 0, 8 * (cap + 1), 6);
  std::vector<SendSpec> chain;
  for (uint32_t i = 0; i <= cap; ++i)
    chain.push_back(make_rdma(IBV_WR_RDMA_WRITE, i, {sge(i * 8, 8)}, ri.addr + i * 8, ri.rkey));
  // One ibv_post_send: nothing can complete while it runs, so WR `cap` is one too many.
  ptrdiff_t bad = -2;
  EXPECT_EQ(local->post_send_chain(chain, &bad), ENOMEM);
  EXPECT_EQ(bad, static_cast<ptrdiff_t>(cap));
  auto s = local->poll(CqSel::send, cap);
  ASSERT_EQ(s.size(), cap);
  for (uint32_t i = 0; i < cap; ++i) EXPECT_TRUE(wc_is(s[i], i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  // Room again: the refused WR goes now.
  ASSERT_EQ(local->post_send(chain[cap]), 0);
  s = local->poll(CqSel::send, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(wc_is(s[0], cap, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE));
  // Placement check after a SEND that orders behind the WRITEs.
  ASSERT_EQ(remote->post_recv(99, {sge(2u << 20, 64)}), 0);
  ASSERT_EQ(local->post_send(make_send(99, {})), 0);
  ASSERT_EQ(remote->poll(CqSel::recv, 1).size(), 1u);
  EXPECT_EQ(remote->check(0, 0, 8 * (cap + 1), 6), -1);
}

}  // namespace

}  // namespace mp
