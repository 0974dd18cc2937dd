// librdmacm.so.1 entry points that softverbs does not support.
//
// softverbs replaces librdmacm.so.1, and the rdma-core tools are linked BIND_NOW, so every symbol
// in src/rdmacm/librdmacm.map has to be defined even if it is never called.
// Everything here fails with -1 and errno = ENOSYS; each group says why it is unsupported.

#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstddef>

#ifndef SV_EXPORT
#define SV_EXPORT __attribute__((visibility("default")))
#endif

namespace {

constexpr int kNotImplemented = ENOSYS;

int fail_minus1() {
  errno = kNotImplemented;
  return -1;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------------------------
// Multicast (RDMACM_1.0, 1.1): joining a group needs an SA/IGMP multicast fabric and UD QP
// attachment, which the softverbs connection manager does not model.
// ---------------------------------------------------------------------------------------------

SV_EXPORT int rdma_join_multicast(rdma_cm_id* /*id*/, sockaddr* /*addr*/, void* /*context*/) {
  return fail_minus1();
}

SV_EXPORT int rdma_join_multicast_ex(rdma_cm_id* /*id*/, rdma_cm_join_mc_attr_ex* /*mc_join_attr*/,
                                     void* /*context*/) {
  return fail_minus1();
}

SV_EXPORT int rdma_leave_multicast(rdma_cm_id* /*id*/, sockaddr* /*addr*/) {
  return fail_minus1();
}

}  // extern "C"
