// Congestion (rds-api.md §3): receiver rcvbuf exceeded -> the sender gets ENOBUFS; with
// RDS_CONG_MONITOR the relief arrives as POLLIN + RDS_CMSG_CONG_UPDATE with the port's bit.
#include <linux/rds.h>

#include <cstdlib>
#include <cstring>

#include "rds_test_util.h"

using namespace rdstest;

namespace {
// Sends 1000-byte messages from tx to dport (non-blocking, waiting for POLLOUT on EAGAIN)
// until one is refused with ENOBUFS: true then, false after 5 s or another error. *accepted
// counts the messages taken before.
bool send_until_enobufs(int tx, uint16_t dport, int* accepted = nullptr) {
  std::vector<char> m(1000, 'c');
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    if (send_to(tx, dport, m.data(), m.size(), MSG_DONTWAIT) == 1000) {
      if (accepted) ++*accepted;
      continue;
    }
    if (errno == ENOBUFS) return true;
    if (errno != EAGAIN) {
      ADD_FAILURE() << "send: " << strerror(errno);
      return false;
    }
    wait_for(tx, POLLOUT, 100);
  }
  return false;
}
}  // namespace

TEST(RdsCong, CongestedPortIsEnobufsAndReliefIsNotified) {
  int tx = bound_socket(port(40)), rx = bound_socket(port(41));
  int small = 4096, big = 1 << 20, one = 1;
  ASSERT_EQ(svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CONG_MONITOR, &one, sizeof one), 0);
  std::vector<char> m(1000, 'c');
  int accepted = 0;
  ASSERT_TRUE(send_until_enobufs(tx, port(41), &accepted)) << "after " << accepted << " messages";
  EXPECT_GE(accepted, 4) << "rcvbuf is a soft limit: the first messages exceed it";
  // The receiver drains: its port leaves the map and the monitor reports it.
  std::vector<char> buf(2000);
  int drained = 0;
  while (recv_one(rx, buf) == 1000 && wait_for(rx, POLLIN, 200)) ++drained;
  EXPECT_GE(drained, 4);
  ASSERT_TRUE(wait_for(tx, POLLIN) & POLLIN) << "congestion relief must wake the sender";
  uint64_t mask = 0;
  ASSERT_TRUE(get_cong_update(tx, mask, 0)) << "an RDS_CMSG_CONG_UPDATE is queued";
  EXPECT_TRUE(mask & RDS_CONG_MONITOR_MASK(port(41)));
  EXPECT_EQ(send_to(tx, port(41), m.data(), m.size(), MSG_DONTWAIT), 1000);
  svrds_close(tx);
  svrds_close(rx);
}

// The congestion map has one bit per port, and sockets on two addresses may hold the same
// port: the bit stays set while either is congested. Closing the other one, which never was,
// must not clear it (a receive or a close syncs the bit with every open socket on the port).
TEST(RdsCong, ClosingAnUncongestedSocketOnASharedPortKeepsTheBit) {
  int tx = bound_socket(port(46)), rx = bound_socket(port(47));
  int other = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  sockaddr_in a2 = addr(port(47), "127.0.0.2");
  ASSERT_EQ(svrds_bind(other, reinterpret_cast<sockaddr*>(&a2), sizeof a2), 0) << strerror(errno);
  int small = 4096, big = 1 << 20, one = 1;
  ASSERT_EQ(svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CONG_MONITOR, &one, sizeof one), 0);
  ASSERT_TRUE(send_until_enobufs(tx, port(47)));
  ASSERT_EQ(svrds_close(other), 0);
  // A map that cleared the bit would reach the monitoring sender as POLLIN within this.
  EXPECT_FALSE(wait_for(tx, POLLIN, 500) & POLLIN) << "the port's congestion was relieved";
  std::vector<char> m(1000, 'c');
  EXPECT_EQ(send_to(tx, port(47), m.data(), m.size(), MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, ENOBUFS);
  svrds_close(tx);
  svrds_close(rx);
}

// An RDMA send refused for congestion (ENOBUFS) lets go of the registration of its local
// buffers: each refused retry kept one pinned until ibv_reg_mr failed for good. With the
// device's regions capped (SOFTVERBS_MAX_MR, read when this process opens it), many more
// refused sends than regions keep failing with ENOBUFS, never with the registration's error.
TEST(RdsCong, ACongestionRefusedRdmaSendKeepsNoRegistration) {
  setenv("SOFTVERBS_MAX_MR", "128", 1);  // before the stack opens the device
  int tx = bound_socket(port(44)), rx = bound_socket(port(45));
  int small = 4096, big = 1 << 20;
  ASSERT_EQ(svrds_setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  ASSERT_EQ(svrds_setsockopt(tx, SOL_SOCKET, SO_SNDBUF, &big, sizeof big), 0);
  ASSERT_TRUE(send_until_enobufs(tx, port(45))) << "the receiver's port never became congested";
  std::vector<char> local(4096, 'l');
  std::vector<rds_iovec> lv{{reinterpret_cast<uint64_t>(local.data()), local.size()}};
  for (int i = 0; i < 400; ++i) {
    errno = 0;
    ASSERT_EQ(send_rdma(tx, port(45), 0x1234, true, lv, 0, local.size(), i, "w", RDS_RDMA_NOTIFY_ME,
                        MSG_DONTWAIT),
              -1);
    ASSERT_EQ(errno, ENOBUFS) << "refused send " << i << ": " << strerror(errno);
  }
  svrds_close(tx);
  svrds_close(rx);
}

TEST(RdsCancel, CancelSentToValidatesItsArgument) {
  int tx = bound_socket(port(42));
  // A full address is required; an address shorter than sockaddr_in is EINVAL.
  int rx = bound_socket(port(43));
  sockaddr_in d = addr(port(43));
  ASSERT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CANCEL_SENT_TO, &d, sizeof d), 0);
  EXPECT_EQ(svrds_setsockopt(tx, SOL_RDS, RDS_CANCEL_SENT_TO, &d, 4), -1);
  EXPECT_EQ(errno, EINVAL);
  svrds_close(tx);
  svrds_close(rx);
}
