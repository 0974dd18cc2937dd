// Device limits (engine/device.h): what ibv_query_device reports is what creation enforces,
// ENOMEM one past it (as the kernel's object pools), and reachable. SOFTVERBS_MAX_* lower a
// limit, like a provider's module parameters; they are read once per process, and CTest runs
// each case in a process of its own.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include <gtest/gtest.h>

namespace {

struct Dev {
  ibv_context* ctx = nullptr;
  ibv_device_attr attr{};
  Dev() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    EXPECT_EQ(ibv_query_device(ctx, &attr), 0);
  }
  ~Dev() { ibv_close_device(ctx); }
};

TEST(DeviceLimits, ReportedLimitsAreReachableAndEnforced) {
  setenv("SOFTVERBS_MAX_QP", "3", 1);
  setenv("SOFTVERBS_MAX_CQ", "2", 1);
  setenv("SOFTVERBS_MAX_PD", "2", 1);
  setenv("SOFTVERBS_MAX_MR", "4", 1);
  setenv("SOFTVERBS_MAX_SRQ", "2", 1);
  Dev d;
  EXPECT_EQ(d.attr.max_qp, 3);
  EXPECT_EQ(d.attr.max_cq, 2);
  EXPECT_EQ(d.attr.max_pd, 2);
  EXPECT_EQ(d.attr.max_mr, 4);
  EXPECT_EQ(d.attr.max_srq, 2);

  ibv_pd* pd = ibv_alloc_pd(d.ctx);
  ibv_pd* pd2 = ibv_alloc_pd(d.ctx);
  ASSERT_TRUE(pd && pd2);
  errno = 0;
  EXPECT_EQ(ibv_alloc_pd(d.ctx), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ASSERT_EQ(ibv_dealloc_pd(pd2), 0);
  pd2 = ibv_alloc_pd(d.ctx);  // a freed one can be had again
  ASSERT_NE(pd2, nullptr);

  ibv_cq* cq = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ibv_cq* cq2 = ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(cq && cq2);
  errno = 0;
  EXPECT_EQ(ibv_create_cq(d.ctx, 16, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, ENOMEM);

  static char buf[4 * 4096];
  std::vector<ibv_mr*> mrs;
  for (int i = 0; i < 4; ++i) {
    mrs.push_back(ibv_reg_mr(pd, buf + i * 4096, 4096, IBV_ACCESS_LOCAL_WRITE));
    ASSERT_NE(mrs.back(), nullptr);
  }
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, ENOMEM);

  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ibv_srq* srq2 = ibv_create_srq(pd, &sa);
  ASSERT_TRUE(srq && srq2);
  errno = 0;
  EXPECT_EQ(ibv_create_srq(pd, &sa), nullptr);
  EXPECT_EQ(errno, ENOMEM);

  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.cap = {4, 4, 1, 1, 0};
  qa.qp_type = IBV_QPT_RC;
  std::vector<ibv_qp*> qps;
  for (int i = 0; i < 3; ++i) {
    ibv_qp_init_attr a = qa;
    qps.push_back(ibv_create_qp(pd, &a));
    ASSERT_NE(qps.back(), nullptr);
  }
  ibv_qp_init_attr a = qa;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &a), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ASSERT_EQ(ibv_destroy_qp(qps.back()), 0);
  a = qa;
  qps.back() = ibv_create_qp(pd, &a);
  EXPECT_NE(qps.back(), nullptr);

  for (ibv_qp* q : qps)
    if (q) ibv_destroy_qp(q);
  ibv_destroy_srq(srq);
  ibv_destroy_srq(srq2);
  for (ibv_mr* m : mrs) ibv_dereg_mr(m);
  ibv_destroy_cq(cq);
  ibv_destroy_cq(cq2);
  ibv_dealloc_pd(pd);
  ibv_dealloc_pd(pd2);
}

// The default QP limit is what QPN allocation can give (256 listeners x 254 QPNs), and the
// environment can only lower a limit.
TEST(DeviceLimits, DefaultsAreWhatCreationCanGiveAndCannotBeRaised) {
  setenv("SOFTVERBS_MAX_QP", "1000000", 1);
  Dev d;
  EXPECT_EQ(d.attr.max_qp, 256 * 254);
  EXPECT_EQ(d.attr.max_pd, 65535);
}

}  // namespace
