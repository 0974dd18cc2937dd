/* rds_bind_probe IP PORT [HOLD_MS]: binds an RDS socket to IP:PORT (through libsvrds), prints
 * "bound" or "error <errno name>", and keeps the socket for HOLD_MS before exiting. A plain
 * program for the multi-user registry test (tests/tools/rds_multiuser.sh), run as several
 * users. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/rds.h>
#include <softverbs/rds.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: rds_bind_probe IP PORT [HOLD_MS]\n");
    return 2;
  }
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(argv[2]));
  if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) return 2;
  const int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd < 0 || svrds_bind(fd, (struct sockaddr*)&a, sizeof a) != 0) {
    printf("error %s\n", strerrorname_np(errno));
    fflush(stdout);
    return 1;
  }
  printf("bound\n");
  fflush(stdout);
  if (argc > 3) usleep((useconds_t)atoi(argv[3]) * 1000);
  svrds_close(fd);
  return 0;
}
