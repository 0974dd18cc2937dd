// librdmacm.so.1 entry points that softverbs does not support.
//
// softverbs replaces librdmacm.so.1, and the rdma-core tools are linked BIND_NOW, so every symbol
// in src/rdmacm/librdmacm.map has to be defined even if it is never called. rping and ucmatose,
// for example, import rpoll only because their shared helper code can poll through rsockets.
// Everything here fails with -1 and errno = ENOSYS; each group says why it is unsupported.

#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

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

ssize_t fail_ssize() {
  errno = kNotImplemented;
  return -1;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------------------------
// rsocket API (RDMACM_1.0): a socket-like byte stream carried over RC QPs. softverbs does not
// provide it; callers that depend on rsockets (rstream, rcopy, riostream, udpong) fail cleanly.
// rpoll and rselect fail too, since no rsocket descriptor can exist for them to watch.
// ---------------------------------------------------------------------------------------------

SV_EXPORT int rsocket(int /*domain*/, int /*type*/, int /*protocol*/) {
  return fail_minus1();
}

SV_EXPORT int rbind(int /*socket*/, const sockaddr* /*addr*/, socklen_t /*addrlen*/) {
  return fail_minus1();
}

SV_EXPORT int rlisten(int /*socket*/, int /*backlog*/) {
  return fail_minus1();
}

SV_EXPORT int raccept(int /*socket*/, sockaddr* /*addr*/, socklen_t* /*addrlen*/) {
  return fail_minus1();
}

SV_EXPORT int rconnect(int /*socket*/, const sockaddr* /*addr*/, socklen_t /*addrlen*/) {
  return fail_minus1();
}

SV_EXPORT int rshutdown(int /*socket*/, int /*how*/) {
  return fail_minus1();
}

SV_EXPORT int rclose(int /*socket*/) {
  return fail_minus1();
}

SV_EXPORT ssize_t rrecv(int /*socket*/, void* /*buf*/, size_t /*len*/, int /*flags*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rrecvfrom(int /*socket*/, void* /*buf*/, size_t /*len*/, int /*flags*/,
                            sockaddr* /*src_addr*/, socklen_t* /*addrlen*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rrecvmsg(int /*socket*/, msghdr* /*msg*/, int /*flags*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rsend(int /*socket*/, const void* /*buf*/, size_t /*len*/, int /*flags*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rsendto(int /*socket*/, const void* /*buf*/, size_t /*len*/, int /*flags*/,
                          const sockaddr* /*dest_addr*/, socklen_t /*addrlen*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rsendmsg(int /*socket*/, const msghdr* /*msg*/, int /*flags*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rread(int /*socket*/, void* /*buf*/, size_t /*count*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rreadv(int /*socket*/, const iovec* /*iov*/, int /*iovcnt*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rwrite(int /*socket*/, const void* /*buf*/, size_t /*count*/) {
  return fail_ssize();
}

SV_EXPORT ssize_t rwritev(int /*socket*/, const iovec* /*iov*/, int /*iovcnt*/) {
  return fail_ssize();
}

SV_EXPORT int rpoll(pollfd* /*fds*/, nfds_t /*nfds*/, int /*timeout*/) {
  return fail_minus1();
}

SV_EXPORT int rselect(int /*nfds*/, fd_set* /*readfds*/, fd_set* /*writefds*/,
                      fd_set* /*exceptfds*/, timeval* /*timeout*/) {
  return fail_minus1();
}

SV_EXPORT int rgetpeername(int /*socket*/, sockaddr* /*addr*/, socklen_t* /*addrlen*/) {
  return fail_minus1();
}

SV_EXPORT int rgetsockname(int /*socket*/, sockaddr* /*addr*/, socklen_t* /*addrlen*/) {
  return fail_minus1();
}

SV_EXPORT int rsetsockopt(int /*socket*/, int /*level*/, int /*optname*/, const void* /*optval*/,
                          socklen_t /*optlen*/) {
  return fail_minus1();
}

SV_EXPORT int rgetsockopt(int /*socket*/, int /*level*/, int /*optname*/, void* /*optval*/,
                          socklen_t* /*optlen*/) {
  return fail_minus1();
}

SV_EXPORT int rfcntl(int /*socket*/, int /*cmd*/, ...) {
  return fail_minus1();
}

SV_EXPORT off_t riomap(int /*socket*/, void* /*buf*/, size_t /*len*/, int /*prot*/, int /*flags*/,
                       off_t /*offset*/) {
  errno = kNotImplemented;
  return -1;
}

SV_EXPORT int riounmap(int /*socket*/, void* /*buf*/, size_t /*len*/) {
  return fail_minus1();
}

// riowrite returns size_t; like rdma-core, an error is (size_t)-1 with errno set.
SV_EXPORT size_t riowrite(int /*socket*/, const void* /*buf*/, size_t /*count*/, off_t /*offset*/,
                          int /*flags*/) {
  errno = kNotImplemented;
  return static_cast<size_t>(-1);
}

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
