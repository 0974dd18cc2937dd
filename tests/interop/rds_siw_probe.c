/* RDMA and atomic ops over RDS between two processes, for providers that lack some of them
 * (tests/interop/rds_siw_guest.sh: Linux siw has no atomics and ignores a registration's
 * iova). A plain AF_RDS program (<linux/rds.h> + sockets), run under
 * LD_PRELOAD=libsvrds_preload.so.
 *
 *   rds_siw_probe target    ADDR PORT [SECS]            registers a 64 KiB buffer and an 8-byte
 *                                                        word, hands out their cookies, answers
 *   rds_siw_probe initiator ADDR PORT TADDR TPORT       runs the ops against the target
 *
 * The initiator runs, one at a time and each with RDS_RDMA_NOTIFY_ME: RDMA WRITE 64 KiB,
 * RDMA READ 64 KiB (checked against what was written when the write succeeded),
 * RDS_CMSG_ATOMIC_FADD, RDS_CMSG_ATOMIC_CSWP, then a plain request/answer ("check") to show
 * that the connection outlived any failed op. It prints one line per op:
 *   OP <name> status=<n> (<NAME>) ms=<t> [extra]     the op's RDS_CMSG_RDMA_STATUS
 *   OP <name> sendmsg errno=<e> (<text>)             the op was refused at sendmsg
 *   OP <name> HANG                                   no status within 20 s
 * and exits 0 when every op ended one way or the other and the final exchange worked, 1 on a
 * hang or a broken exchange. Which statuses are right is for the caller to judge. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/rds.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF (64 * 1024)
#define OP_WAIT_MS 20000

static char buf[BUF] __attribute__((aligned(4096)));      /* target: RDMA target */
static uint64_t word[512] __attribute__((aligned(4096))); /* target: atomic target = word[0] */
static char src[BUF] __attribute__((aligned(4096)));      /* initiator: write source */
static char dst[BUF] __attribute__((aligned(4096)));      /* initiator: read destination */
static uint64_t old_value __attribute__((aligned(8)));    /* initiator: atomic result */

struct cookies {
  uint64_t buf, word;
};
struct answer {
  uint64_t word;
  uint32_t buf_sum;
};

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static struct sockaddr_in sa(const char* ip, int port) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    fprintf(stderr, "bad address %s\n", ip);
    exit(2);
  }
  return a;
}

static int open_bound(const char* ip, int port) {
  int s = socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (s < 0) {
    perror("socket(AF_RDS)");
    exit(2);
  }
  struct sockaddr_in a = sa(ip, port);
  if (bind(s, (struct sockaddr*)&a, sizeof a)) {
    perror("bind");
    exit(2);
  }
  int one = 1;
  setsockopt(s, SOL_RDS, RDS_RECVERR, &one, sizeof one);
  return s;
}

static uint32_t sum(const char* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ (unsigned char)p[i]) * 16777619u;
  return h;
}

static const char* status_name(int st) {
  switch (st) {
    case RDS_RDMA_SUCCESS:
      return "SUCCESS";
    case RDS_RDMA_REMOTE_ERROR:
      return "REMOTE_ERROR";
    case RDS_RDMA_CANCELED:
      return "CANCELED";
    case RDS_RDMA_DROPPED:
      return "DROPPED";
    case RDS_RDMA_OTHER_ERROR:
      return "OTHER_ERROR";
    default:
      return "?";
  }
}

/* Receives one datagram or notification within ms; returns its length (0 for a bare
 * notification), -1 on timeout. *status is set (else -1) when an RDMA status came with it. */
static int recv_one(int s, void* data, size_t len, struct sockaddr_in* from, int* status, int ms) {
  *status = -1;
  struct pollfd p = {s, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return -1;
  char ctl[256];
  struct iovec iv = {data, len};
  struct msghdr m;
  memset(&m, 0, sizeof m);
  m.msg_name = from;
  m.msg_namelen = from ? sizeof *from : 0;
  m.msg_iov = &iv;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  int n = (int)recvmsg(s, &m, 0);
  if (n < 0) return -1;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_RDS && c->cmsg_type == RDS_CMSG_RDMA_STATUS) {
      struct rds_rdma_notify nt;
      memcpy(&nt, CMSG_DATA(c), sizeof nt);
      *status = nt.status;
    }
  }
  return n;
}

static int target(const char* ip, int port, int secs) {
  int s = open_bound(ip, port);
  struct cookies ck = {0, 0};
  struct rds_get_mr_args mb = {
      {(uint64_t)(uintptr_t)buf, sizeof buf}, (uint64_t)(uintptr_t)&ck.buf, 0};
  struct rds_get_mr_args mw = {{(uint64_t)(uintptr_t)word, 8}, (uint64_t)(uintptr_t)&ck.word, 0};
  if (setsockopt(s, SOL_RDS, RDS_GET_MR, &mb, sizeof mb) ||
      setsockopt(s, SOL_RDS, RDS_GET_MR, &mw, sizeof mw)) {
    perror("RDS_GET_MR");
    return 2;
  }
  word[0] = 1000;
  printf("target %s:%d ready\n", ip, port);
  fflush(stdout);
  const double end = now_ms() + secs * 1e3;
  while (now_ms() < end) {
    char in[64];
    struct sockaddr_in from;
    int st;
    int n = recv_one(s, in, sizeof in - 1, &from, &st, 500);
    if (n <= 0) continue;
    in[n] = 0;
    printf("target got '%s'\n", in);
    fflush(stdout);
    if (!strcmp(in, "hello")) {
      if (sendto(s, &ck, sizeof ck, 0, (struct sockaddr*)&from, sizeof from) < 0)
        printf("target: sendto cookies: %s\n", strerror(errno));
    } else if (!strcmp(in, "check")) {
      struct answer a = {word[0], sum(buf, sizeof buf)};
      if (sendto(s, &a, sizeof a, 0, (struct sockaddr*)&from, sizeof from) < 0)
        printf("target: sendto answer: %s\n", strerror(errno));
    } else if (!strcmp(in, "bye")) {
      printf("target done: word=%llu\n", (unsigned long long)word[0]);
      return 0;
    }
  }
  printf("target: no 'bye' within %d s\n", secs);
  return 3;
}

/* Sends "op <name>" with one control message of the given type; waits for the status. */
static int run_op(int s, struct sockaddr_in* t, const char* name, int type, const void* arg,
                  size_t arglen, int* status_out) {
  char ctl[CMSG_SPACE(sizeof(struct rds_atomic_args)) + CMSG_SPACE(sizeof(struct rds_rdma_args))];
  memset(ctl, 0, sizeof ctl);
  char payload[32];
  snprintf(payload, sizeof payload, "op %s", name);
  struct iovec iv = {payload, strlen(payload)};
  struct msghdr m;
  memset(&m, 0, sizeof m);
  m.msg_name = t;
  m.msg_namelen = sizeof *t;
  m.msg_iov = &iv;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = CMSG_SPACE(arglen);
  struct cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_RDS;
  c->cmsg_type = type;
  c->cmsg_len = CMSG_LEN(arglen);
  memcpy(CMSG_DATA(c), arg, arglen);
  const double t0 = now_ms();
  *status_out = -1;
  if (sendmsg(s, &m, 0) < 0) {
    int e = errno;
    printf("OP %s sendmsg errno=%d (%s)\n", name, e, strerror(e));
    fflush(stdout);
    return 0;
  }
  for (;;) {
    char in[64];
    int st;
    int left = OP_WAIT_MS - (int)(now_ms() - t0);
    int n = left > 0 ? recv_one(s, in, sizeof in, NULL, &st, left) : -1;
    if (n < 0) {
      printf("OP %s HANG (no status within %d ms)\n", name, OP_WAIT_MS);
      fflush(stdout);
      return 1;
    }
    if (st >= 0) {
      *status_out = st;
      printf("OP %s status=%d (%s) ms=%.1f", name, st, status_name(st), now_ms() - t0);
      return 0; /* the caller ends the line */
    }
  }
}

static int initiator(const char* ip, int port, const char* tip, int tport) {
  int s = open_bound(ip, port);
  struct sockaddr_in t = sa(tip, tport);
  struct cookies ck;
  int st, n = -1;
  const double t0 = now_ms();
  for (int i = 0; i < 3 && n != (int)sizeof ck; ++i) {
    if (sendto(s, "hello", 5, 0, (struct sockaddr*)&t, sizeof t) != 5) {
      perror("sendto hello");
      return 1;
    }
    n = recv_one(s, &ck, sizeof ck, NULL, &st, 10000);
  }
  if (n != (int)sizeof ck) {
    printf("no cookies from %s:%d\n", tip, tport);
    return 1;
  }
  printf("cookies after %.0f ms: buf=%#llx word=%#llx\n", now_ms() - t0, (unsigned long long)ck.buf,
         (unsigned long long)ck.word);
  int hang = 0, wrote = 0;

  for (size_t i = 0; i < sizeof src; ++i) src[i] = (char)('A' + (i * 7 + i / 4096) % 26);
  struct rds_iovec lw = {(uint64_t)(uintptr_t)src, sizeof src};
  struct rds_rdma_args ra;
  memset(&ra, 0, sizeof ra);
  ra.cookie = ck.buf;
  ra.remote_vec.addr = 0;
  ra.remote_vec.bytes = sizeof src;
  ra.local_vec_addr = (uint64_t)(uintptr_t)&lw;
  ra.nr_local = 1;
  ra.flags = RDS_RDMA_READWRITE | RDS_RDMA_NOTIFY_ME;
  ra.user_token = 1;
  hang |= run_op(s, &t, "write", RDS_CMSG_RDMA_ARGS, &ra, sizeof ra, &st);
  if (st >= 0) printf("\n");
  wrote = st == RDS_RDMA_SUCCESS;

  struct rds_iovec lr = {(uint64_t)(uintptr_t)dst, sizeof dst};
  ra.local_vec_addr = (uint64_t)(uintptr_t)&lr;
  ra.flags = RDS_RDMA_NOTIFY_ME | RDS_RDMA_FENCE;
  ra.user_token = 2;
  hang |= run_op(s, &t, "read", RDS_CMSG_RDMA_ARGS, &ra, sizeof ra, &st);
  if (st >= 0) {
    if (st == RDS_RDMA_SUCCESS && wrote)
      printf(" data=%s", memcmp(src, dst, sizeof src) ? "MISMATCH" : "ok");
    printf("\n");
  }

  struct rds_atomic_args aa;
  memset(&aa, 0, sizeof aa);
  aa.cookie = ck.word;
  aa.local_addr = (uint64_t)(uintptr_t)&old_value;
  aa.remote_addr = 0;
  aa.fadd.add = 5;
  aa.flags = RDS_RDMA_NOTIFY_ME;
  aa.user_token = 3;
  old_value = 77;
  hang |= run_op(s, &t, "fadd", RDS_CMSG_ATOMIC_FADD, &aa, sizeof aa, &st);
  if (st >= 0) printf(" old=%llu\n", (unsigned long long)old_value);

  memset(&aa, 0, sizeof aa);
  aa.cookie = ck.word;
  aa.local_addr = (uint64_t)(uintptr_t)&old_value;
  aa.cswp.compare = 1005;
  aa.cswp.swap = 4242;
  aa.flags = RDS_RDMA_NOTIFY_ME;
  aa.user_token = 4;
  old_value = 77;
  hang |= run_op(s, &t, "cswp", RDS_CMSG_ATOMIC_CSWP, &aa, sizeof aa, &st);
  if (st >= 0) printf(" old=%llu\n", (unsigned long long)old_value);

  /* The connection must have survived whatever failed. */
  struct answer a;
  n = -1;
  if (sendto(s, "check", 5, 0, (struct sockaddr*)&t, sizeof t) == 5) {
    const double t1 = now_ms();
    while (n != (int)sizeof a && now_ms() - t1 < OP_WAIT_MS)
      n = recv_one(s, &a, sizeof a, NULL, &st, OP_WAIT_MS);
  }
  if (n != (int)sizeof a) {
    printf("CHECK no answer after the ops\n");
    hang = 1;
  } else {
    printf("CHECK answered: target word=%llu target buffer %s\n", (unsigned long long)a.word,
           a.buf_sum == sum(src, sizeof src) ? "holds the written data"
                                             : "does not hold the written data");
  }
  sendto(s, "bye", 3, 0, (struct sockaddr*)&t, sizeof t);
  usleep(300 * 1000); /* let the stack deliver and ack "bye" */
  printf("initiator %s\n", hang ? "FAILED (hang or lost connection)" : "done");
  return hang;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 4 && !strcmp(argv[1], "target"))
    return target(argv[2], atoi(argv[3]), argc > 4 ? atoi(argv[4]) : 120);
  if (argc == 6 && !strcmp(argv[1], "initiator"))
    return initiator(argv[2], atoi(argv[3]), argv[4], atoi(argv[5]));
  fprintf(stderr,
          "usage: %s target ADDR PORT [SECS] | initiator ADDR PORT TARGET_ADDR TARGET_PORT\n",
          argv[0]);
  return 2;
}
