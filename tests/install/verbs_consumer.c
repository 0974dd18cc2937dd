/* Links softverbs' libibverbs explicitly (pkg-config softverbs-verbs) and checks that the
 * device it sees is softverbs0 with an active port 1. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list || n != 1 || strcmp(ibv_get_device_name(list[0]), "softverbs0") != 0) {
    fprintf(stderr, "expected one device, softverbs0\n");
    return 1;
  }
  struct ibv_context* ctx = ibv_open_device(list[0]);
  struct ibv_port_attr pa;
  if (!ctx || ibv_query_port(ctx, 1, &pa) != 0 || pa.state != IBV_PORT_ACTIVE) {
    fprintf(stderr, "port 1 not active\n");
    return 1;
  }
  printf("verbs_consumer ok: %s port 1 active\n", ibv_get_device_name(list[0]));
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
