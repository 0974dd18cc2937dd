/* A program outside the tree that uses an installed softverbs: two RDS sockets on loopback,
 * one message each way through libsvrds, payloads and source addresses checked. Built by
 * tests/tools/install_test.sh through find_package(softverbs) and through pkg-config. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <softverbs/rds.h>

static int fail(const char* what) {
  perror(what);
  return 1;
}

static int open_bound(const char* ip, unsigned short port, struct sockaddr_in* sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(port);
  inet_pton(AF_INET, ip, &sa->sin_addr);
  int fd = svrds_socket(AF_RDS, SOCK_SEQPACKET, 0);
  if (fd < 0 || svrds_bind(fd, (struct sockaddr*)sa, sizeof *sa) != 0) return -1;
  return fd;
}

static int exchange(int from, int to, const struct sockaddr_in* to_sa,
                    const struct sockaddr_in* from_sa, const char* text) {
  if (svrds_sendto(from, text, strlen(text), 0, (const struct sockaddr*)to_sa, sizeof *to_sa) !=
      (ssize_t)strlen(text))
    return fail("svrds_sendto");
  char buf[128];
  struct sockaddr_in src;
  socklen_t len = sizeof src;
  ssize_t n = svrds_recvfrom(to, buf, sizeof buf, 0, (struct sockaddr*)&src, &len);
  if (n < 0) return fail("svrds_recvfrom");
  if ((size_t)n != strlen(text) || memcmp(buf, text, n) != 0 ||
      src.sin_addr.s_addr != from_sa->sin_addr.s_addr || src.sin_port != from_sa->sin_port) {
    fprintf(stderr, "wrong message or source\n");
    return 1;
  }
  printf("received \"%.*s\" from %s:%u\n", (int)n, buf, inet_ntoa(src.sin_addr),
         ntohs(src.sin_port));
  return 0;
}

int main(void) {
  struct sockaddr_in a, b;
  int fa = open_bound("127.0.0.1", 18811, &a);
  int fb = open_bound("127.0.0.2", 18812, &b);
  if (fa < 0 || fb < 0) return fail("svrds_socket/bind");
  if (exchange(fa, fb, &b, &a, "ping over an installed softverbs") ||
      exchange(fb, fa, &a, &b, "pong"))
    return 1;
  svrds_close(fa);
  svrds_close(fb);
  printf("rds_consumer ok\n");
  return 0;
}
