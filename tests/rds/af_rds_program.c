/* A plain AF_RDS program: only <linux/rds.h> and the socket API, nothing of softverbs.
 * Run unmodified under LD_PRELOAD=libsvrds_preload.so. Exits 0 and prints "PASS" when
 * datagrams, poll(), RDS_GET_MR + RDMA WRITE with its notification, and the errno of a
 * misuse all behave as with Linux RDS. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/rds.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CHECK(c)                                                                     \
  do {                                                                               \
    if (!(c)) {                                                                      \
      fprintf(stderr, "FAIL %s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

static struct sockaddr_in addr(int port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int main(void) {
  int base = 30000 + getpid() % 10000;
  int a = socket(AF_RDS, SOCK_SEQPACKET, 0), b = socket(AF_RDS, SOCK_SEQPACKET, 0);
  CHECK(a >= 0 && b >= 0);
  struct sockaddr_in sa = addr(base), sb = addr(base + 1);
  CHECK(bind(a, (struct sockaddr*)&sa, sizeof sa) == 0);
  CHECK(bind(b, (struct sockaddr*)&sb, sizeof sb) == 0);
  CHECK(listen(a, 1) == -1 && errno == EOPNOTSUPP);

  /* datagram a -> b, seen by poll */
  const char msg[] = "hello over AF_RDS";
  CHECK(sendto(a, msg, sizeof msg, 0, (struct sockaddr*)&sb, sizeof sb) == sizeof msg);
  struct pollfd p = {b, POLLIN, 0};
  CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN));
  char buf[64];
  struct sockaddr_in from;
  socklen_t fl = sizeof from;
  CHECK(recvfrom(b, buf, sizeof buf, 0, (struct sockaddr*)&from, &fl) == sizeof msg);
  CHECK(strcmp(buf, msg) == 0 && ntohs(from.sin_port) == base);

  /* b registers memory; a RDMA-WRITEs into it with a notified message */
  static char target[4096], src[4096];
  memset(src, 'R', sizeof src);
  uint64_t cookie = 0;
  struct rds_get_mr_args mr = {
      {(uint64_t)(uintptr_t)target, sizeof target}, (uint64_t)(uintptr_t)&cookie, 0};
  CHECK(setsockopt(b, SOL_RDS, RDS_GET_MR, &mr, sizeof mr) == 0 && cookie != 0);
  struct rds_iovec local = {(uint64_t)(uintptr_t)src, sizeof src};
  struct rds_rdma_args ra;
  memset(&ra, 0, sizeof ra);
  ra.cookie = cookie;
  ra.remote_vec.addr = 0;
  ra.remote_vec.bytes = sizeof target;
  ra.local_vec_addr = (uint64_t)(uintptr_t)&local;
  ra.nr_local = 1;
  ra.flags = RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME;
  ra.user_token = 1234;
  char ctl[CMSG_SPACE(sizeof ra)];
  memset(ctl, 0, sizeof ctl);
  struct iovec iv = {(void*)"done", 4};
  struct msghdr m;
  memset(&m, 0, sizeof m);
  m.msg_name = &sb;
  m.msg_namelen = sizeof sb;
  m.msg_iov = &iv;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_RDS;
  cm->cmsg_type = RDS_CMSG_RDMA_ARGS;
  cm->cmsg_len = CMSG_LEN(sizeof ra);
  memcpy(CMSG_DATA(cm), &ra, sizeof ra);
  CHECK(sendmsg(a, &m, 0) == 4);
  p.fd = b;
  CHECK(poll(&p, 1, 5000) == 1);
  CHECK(recv(b, buf, sizeof buf, 0) == 4);
  CHECK(target[0] == 'R' && target[4095] == 'R'); /* data landed before the message */
  p.fd = a;
  CHECK(poll(&p, 1, 5000) == 1);
  char nctl[CMSG_SPACE(sizeof(struct rds_rdma_notify))];
  struct msghdr nm;
  memset(&nm, 0, sizeof nm);
  nm.msg_control = nctl;
  nm.msg_controllen = sizeof nctl;
  CHECK(recvmsg(a, &nm, 0) == 0);
  cm = CMSG_FIRSTHDR(&nm);
  CHECK(cm && cm->cmsg_level == SOL_RDS && cm->cmsg_type == RDS_CMSG_RDMA_STATUS);
  struct rds_rdma_notify note;
  memcpy(&note, CMSG_DATA(cm), sizeof note);
  CHECK(note.user_token == 1234 && note.status == RDS_RDMA_SUCCESS);

  /* misuse: unknown option */
  int one = 1;
  CHECK(setsockopt(a, SOL_RDS, 4242, &one, sizeof one) == -1 && errno == ENOPROTOOPT);
  CHECK(close(a) == 0 && close(b) == 0);
  printf("PASS\n");
  return 0;
}
