/* Stub libefa.so.1 for perftest.
 *
 * Debian's perftest binaries have DT_NEEDED on libefa.so.1 and import efadv_create_qp_ex and
 * efadv_query_device (EFA_1.1), under BIND_NOW. The real libefa is a provider for the system
 * libibverbs: it imports IBVERBS_PRIVATE_34 internals and registers itself from an ELF
 * constructor. This stub sits next to softverbs' libibverbs.so.1 on LD_LIBRARY_PATH so the real
 * one is never loaded. The whole efadv_* export set is small, so all six functions are stubbed,
 * with the same symbol versions (src/stubs/libefa.map). softverbs never reports an EFA device;
 * if these are called anyway, they fail the way rdma-core's efadv_* calls fail on a non-EFA
 * device: NULL with errno = EOPNOTSUPP, or EOPNOTSUPP returned as a positive errno.
 */

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/efadv.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* EFA_1.0 */
SV_EXPORT struct ibv_qp* efadv_create_driver_qp(struct ibv_pd* ibvpd, struct ibv_qp_init_attr* attr,
                                                uint32_t driver_qp_type) {
  (void)ibvpd;
  (void)attr;
  (void)driver_qp_type;
  errno = EOPNOTSUPP;
  return NULL;
}

/* EFA_1.1 */
SV_EXPORT struct ibv_qp* efadv_create_qp_ex(struct ibv_context* ibvctx,
                                            struct ibv_qp_init_attr_ex* attr_ex,
                                            struct efadv_qp_init_attr* efa_attr, uint32_t inlen) {
  (void)ibvctx;
  (void)attr_ex;
  (void)efa_attr;
  (void)inlen;
  errno = EOPNOTSUPP;
  return NULL;
}

SV_EXPORT int efadv_query_device(struct ibv_context* ibvctx, struct efadv_device_attr* attr,
                                 uint32_t inlen) {
  (void)ibvctx;
  (void)attr;
  (void)inlen;
  return EOPNOTSUPP;
}

SV_EXPORT int efadv_query_ah(struct ibv_ah* ibvah, struct efadv_ah_attr* attr, uint32_t inlen) {
  (void)ibvah;
  (void)attr;
  (void)inlen;
  return EOPNOTSUPP;
}

/* EFA_1.2 */
SV_EXPORT struct ibv_cq_ex* efadv_create_cq(struct ibv_context* ibvctx,
                                            struct ibv_cq_init_attr_ex* attr_ex,
                                            struct efadv_cq_init_attr* efa_attr, uint32_t inlen) {
  (void)ibvctx;
  (void)attr_ex;
  (void)efa_attr;
  (void)inlen;
  errno = EOPNOTSUPP;
  return NULL;
}

SV_EXPORT struct efadv_cq* efadv_cq_from_ibv_cq_ex(struct ibv_cq_ex* ibvcqx) {
  (void)ibvcqx;
  errno = EOPNOTSUPP;
  return NULL;
}
