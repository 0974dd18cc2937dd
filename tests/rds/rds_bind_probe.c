/* A plain RDS program for the multi-user registry test (tests/tools/rds_multiuser.sh), run as
 * several users, through libsvrds:
 *   rds_bind_probe IP PORT [HOLD_MS]   binds IP:PORT, prints "bound" or "error <errno name>",
 *                                      and keeps the socket for HOLD_MS before exiting;
 *   rds_bind_probe recv IP PORT MS     binds IP:PORT, prints "bound", then "got <text>" for
 *                                      the first message within MS, or "timeout";
 *   rds_bind_probe send IP PORT DPORT TEXT
 *                                      binds IP:PORT and sends TEXT to IP:DPORT: "sent" or
 *                                      "error <errno name>". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/rds.h>
#include <poll.h>
#include <softverbs/rds.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int bind_to(const char* ip, const char* port, struct sockaddr_in* a) {
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((unsigned short)atoi(port));
  if (inet_pton(AF_INET, ip, &a->sin_addr) != 1) return -1;
  const int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd < 0 || svrds_bind(fd, (struct sockaddr*)a, sizeof *a) != 0) {
    printf("error %s\n", strerrorname_np(errno));
    fflush(stdout);
    return -1;
  }
  return fd;
}

/* Whether the stack may still hold a message from ip:port (queued or not yet acked):
 * RDS_INFO_SEND_MESSAGES and RDS_INFO_RETRANS_MESSAGES, as rds-info -s and -t list them. A
 * list that cannot be read counts as holding one. */
static int holds_from(int fd, uint32_t ip, unsigned short port) {
  for (int opt = RDS_INFO_SEND_MESSAGES; opt <= RDS_INFO_RETRANS_MESSAGES; ++opt) {
    char buf[64 * 1024];
    socklen_t len = sizeof buf;
    const int each = svrds_getsockopt(fd, SOL_RDS, opt, buf, &len);
    if (each <= 0) return 1;
    for (size_t off = 0; off + sizeof(struct rds_info_message) <= len; off += (size_t)each) {
      struct rds_info_message m;
      memcpy(&m, buf + off, sizeof m);
      if (m.laddr == ip && m.lport == port) return 1;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  struct sockaddr_in a;
  if (argc == 5 && strcmp(argv[1], "recv") == 0) {
    const int fd = bind_to(argv[2], argv[3], &a);
    if (fd < 0) return 1;
    printf("bound\n");
    fflush(stdout);
    char buf[256];
    struct pollfd p = {fd, POLLIN, 0};
    ssize_t n = -1;
    if (poll(&p, 1, atoi(argv[4])) == 1) n = svrds_recvfrom(fd, buf, sizeof buf - 1, 0, NULL, NULL);
    if (n < 0) {
      printf("timeout\n");
      return 1;
    }
    buf[n] = 0;
    printf("got %s\n", buf);
    svrds_close(fd);
    return 0;
  }
  if (argc == 6 && strcmp(argv[1], "send") == 0) {
    const int fd = bind_to(argv[2], argv[3], &a);
    if (fd < 0) return 1;
    a.sin_port = htons((unsigned short)atoi(argv[4]));
    if (svrds_sendto(fd, argv[5], strlen(argv[5]), 0, (struct sockaddr*)&a, sizeof a) < 0) {
      printf("error %s\n", strerrorname_np(errno));
      return 1;
    }
    printf("sent\n");
    fflush(stdout);
    /* Closing cancels what the socket has not handed to the transport yet (rds(7), net/rds's
     * rds_send_drop_to): under load a fixed pause was not always enough, so the socket lives
     * until the peer has acked the message (at most 10 s). */
    const unsigned short me = htons((unsigned short)atoi(argv[3]));
    /* Three empty looks in a row, 10 ms apart: the two lists are read one after the other,
     * and a reset moves a message from the second back to the first meanwhile. */
    for (int i = 0, empty = 0; i < 1000 && empty < 3; ++i) {
      empty = holds_from(fd, a.sin_addr.s_addr, me) ? 0 : empty + 1;
      usleep(10 * 1000);
    }
    svrds_close(fd);
    return 0;
  }
  if (argc < 3) {
    fprintf(stderr,
            "usage: rds_bind_probe IP PORT [HOLD_MS] | recv IP PORT MS | "
            "send IP PORT DPORT TEXT\n");
    return 2;
  }
  const int fd = bind_to(argv[1], argv[2], &a);
  if (fd < 0) return 1;
  printf("bound\n");
  fflush(stdout);
  if (argc > 3) usleep((useconds_t)atoi(argv[3]) * 1000);
  svrds_close(fd);
  return 0;
}
