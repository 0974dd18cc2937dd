// LD_PRELOAD shim used by siw_interop.sh for perftest -R *clients* that talk to a siw server
// in the TCG guest. Not part of softverbs; it only delays a call, it changes no data.
//
// Why: perftest -R first connects a "comm" QP, exchanges parameters over it, then the server
// starts listening for the test QP while the client connects to it right away. Against a slow
// server (TCG guest) the client wins the race, its connect fails, and the retry path of Debian's
// perftest 4.5-0.17 (rdma_cm_client_connection -> rdma_cm_destroy_cma, then a retry through the
// freed ctx->cma_master.nodes) is a use-after-free that crashes the client. Upstream fixed the
// retry in perftest commit 3d9d8d0 ("Fix crashes and logical flaws in RDMA CM connection
// retry"). Until Debian has it, we delay every rdma_resolve_addr() after the first (the comm
// QP's) by SV_RESOLVE_DELAY_MS (default 1000), which lets the guest's server listen first.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <time.h>

int rdma_resolve_addr(struct rdma_cm_id* id, struct sockaddr* src, struct sockaddr* dst,
                      int timeout_ms) {
  static int calls;
  typedef int (*fn_t)(struct rdma_cm_id*, struct sockaddr*, struct sockaddr*, int);
  fn_t next = (fn_t)dlsym(RTLD_NEXT, "rdma_resolve_addr");
  if (!next) return -1;
  if (calls++ > 0) {
    const char* e = getenv("SV_RESOLVE_DELAY_MS");
    long ms = e ? atol(e) : 1000;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&ts, &ts) != 0) {
    }
  }
  return next(id, src, dst, timeout_ms);
}
