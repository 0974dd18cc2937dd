/* softverbs RDS: Reliable Datagram Sockets with RDMA, in user space, over the verbs API.
 *
 * The calls mirror the BSD socket calls an AF_RDS program makes; semantics, structs,
 * options and cmsgs are those of <linux/rds.h> (upstream numbering). The descriptor is a
 * real fd: poll/epoll/select on it report POLLIN (data, RDMA notifications, congestion
 * updates) and POLLOUT (send space) as Linux RDS does. Unmodified programs get these
 * calls through the LD_PRELOAD shim instead. */
#ifndef SOFTVERBS_RDS_H
#define SOFTVERBS_RDS_H

#include <linux/rds.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

int svrds_socket(int domain, int type, int protocol);
int svrds_is_rds(int fd);
int svrds_bind(int fd, const struct sockaddr* addr, socklen_t len);
int svrds_connect(int fd, const struct sockaddr* addr, socklen_t len);
ssize_t svrds_sendmsg(int fd, const struct msghdr* msg, int flags);
ssize_t svrds_recvmsg(int fd, struct msghdr* msg, int flags);
ssize_t svrds_sendto(int fd, const void* buf, size_t len, int flags, const struct sockaddr* to,
                     socklen_t tolen);
ssize_t svrds_recvfrom(int fd, void* buf, size_t len, int flags, struct sockaddr* from,
                       socklen_t* fromlen);
int svrds_setsockopt(int fd, int level, int optname, const void* optval, socklen_t optlen);
int svrds_getsockopt(int fd, int level, int optname, void* optval, socklen_t* optlen);
int svrds_getsockname(int fd, struct sockaddr* addr, socklen_t* len);
int svrds_getpeername(int fd, struct sockaddr* addr, socklen_t* len);
int svrds_close(int fd);

/* Busy polling (like Linux SO_BUSY_POLL): does the stack's completion work on the calling
 * thread instead of waiting for its engine thread to be woken. Returns the number of
 * completions handled (0 if there were none or another thread held the stack). The
 * LD_PRELOAD shim calls it from poll() on RDS descriptors for up to
 * SOFTVERBS_RDS_BUSY_POLL_US microseconds (default 0: off). */
int svrds_busy_poll(void);
/* Readiness of RDS descriptors from the stack's own state, without a syscall: fills each
 * revents as poll() would (POLLIN, POLLOUT and their RDNORM/WRNORM/WRBAND twins) and
 * returns how many are ready, or -1 when it cannot tell (a descriptor that is not one of
 * this stack's RDS sockets): then ask poll() itself.
 * The shim's busy-poll loop uses it between passes. */
int svrds_poll_ready(struct pollfd* fds, nfds_t n);
/* Lazy readiness. The descriptor's POLLIN is a byte the stack keeps queued toward it, a send
 * and a receive per message. A process whose poll() is the shim's, which answers from the
 * stack's state, does not need it while no thread sleeps in the kernel on the descriptor, so
 * the shim says so (svrds_shim_attach; SOFTVERBS_RDS_LAZY_TOKEN=0 keeps the byte in step
 * always). The shim then tells the stack of every readiness call the stack cannot answer
 * for: a descriptor handed to epoll_ctl, select, pselect or ppoll is kept in step from then
 * on (svrds_expose), and a poll() that sleeps in the kernel on RDS descriptors brackets the
 * sleep with svrds_kernel_wait_begin/end (socks: n slots, filled by begin, read by end). */
void svrds_shim_attach(void);
int svrds_lazy_tokens(void); /* 1 when the above is in effect */
void svrds_expose(int fd);
void svrds_kernel_wait_begin(const struct pollfd* fds, nfds_t n, void** socks);
void svrds_kernel_wait_end(void** socks, nfds_t n);
/* The caller stops busy polling (it is about to block): on softverbs, the device's progress
 * thread, which stepped back from the stack's sockets while the caller spun, takes them
 * back at once instead of after its hold time. */
void svrds_busy_poll_stop(void);
/* The caller is about to block until an RDS descriptor is ready: it gets a descriptor to
 * wait on as well (poll/epoll, POLLIN), which is readable when bytes for the stack have
 * arrived; the caller then calls svrds_busy_poll() to take them in on its own thread, so one
 * thread wake-up brings a message instead of two (the device's, then the caller's). Returns
 * -1 when there is none (the stack is not up, another verbs provider, or
 * SOFTVERBS_RDS_WAIT_RX=0): the caller just blocks. The LD_PRELOAD shim's poll() does this
 * whenever it blocks on an RDS descriptor. */
int svrds_block_prepare(void);
/* The caller woke (whatever woke it) after a svrds_block_prepare that returned a descriptor;
 * every such call needs this one. */
void svrds_block_done(void);

#ifdef __cplusplus
}
#endif
#endif
