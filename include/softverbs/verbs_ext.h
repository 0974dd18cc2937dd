/* softverbs extensions to the verbs API. Not part of rdma-core: resolve them with
 * dlsym(RTLD_DEFAULT, ...) so that the same program still runs on the system's libibverbs.
 */
#ifndef SOFTVERBS_VERBS_EXT_H
#define SOFTVERBS_VERBS_EXT_H

#include <infiniband/verbs.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A completion handler, as a kernel consumer gives ib_create_cq (comp_handler): when an
 * armed CQ's notification is raised by the device's progress thread, handler(cq, arg) runs
 * on that thread, once the event that raised it has been processed and with no device lock
 * held, instead of an event being queued on the CQ's completion channel. That saves the
 * thread hand-off of ibv_get_cq_event on the receive path.
 *
 * The handler must not block. It polls the CQ, re-arms it with ibv_req_notify_cq and polls
 * again, as a channel consumer would. Returning false declines: the event goes to the
 * channel as it would without a handler (e.g. when the consumer's own lock is taken).
 * Notifications raised on other threads (an application thread whose ibv_poll_cq drives
 * the receive path) go to the channel, so a CQ with a handler still needs one; except that
 * a completion made inside an ibv_poll_cq of this same CQ raises none: that poll returns it,
 * and the CQ stays armed for the next one. A handler-driven consumer therefore polls until
 * the CQ is empty, as it would anyway.
 *
 * handler == NULL removes it. Returns 0, or EINVAL for a CQ without a completion channel.
 */
int softverbs_cq_set_comp_handler(struct ibv_cq* cq, bool (*handler)(struct ibv_cq* cq, void* arg),
                                  void* arg);

/* Busy polling (Linux NAPI busy poll): on = 1 says the calling thread is spinning on cq and
 * drives its QPs' receive path with ibv_poll_cq, so the device's progress thread steps back
 * from their sockets for SOFTVERBS_BUSY_POLL_US (default 200) microseconds after the last such
 * call; on = 0 hands them back at once (call it before blocking). An empty ibv_poll_cq on an
 * unarmed CQ says on = 1 by itself, and ibv_req_notify_cq from that thread says on = 0: this call
 * is for consumers whose CQ stays armed while they spin (one with a completion handler). Returns 0,
 * or EINVAL for an invalid CQ. */
int softverbs_cq_busy_poll(struct ibv_cq* cq, int on);

/* Blocking with the receive path (NAPI busy poll under a blocking epoll_wait): a descriptor
 * that is readable when bytes have arrived for one of cq's QPs that only the receive path an
 * ibv_poll_cq of cq runs can take in. A thread that would otherwise block until the progress
 * thread delivered a completion to it (through the completion channel, or a handler that
 * wakes it) calls softverbs_cq_block(cq, 1), blocks on this descriptor too, calls
 * softverbs_cq_block(cq, 0) once woken, whatever woke it, and polls cq: the bytes wake it, not
 * the progress thread and then it. The descriptor belongs to the CQ (do not close it) and is
 * meant for poll/epoll only. Returns it, or -1 with errno EINVAL for an invalid CQ (or the
 * errno of epoll_create1). */
int softverbs_cq_wait_fd(struct ibv_cq* cq);

/* on = 1: the calling thread is about to block on softverbs_cq_wait_fd(cq); until it calls
 * on = 0 (every on = 1 needs one), the progress thread leaves cq's QPs' bytes to it, however
 * long it sleeps. on = 0 then starts a busy poller's hold (softverbs_cq_busy_poll(cq, 1)).
 * Returns 0, or EINVAL for an invalid CQ or value. */
int softverbs_cq_block(struct ibv_cq* cq, int on);

/* Posting without waking anyone: from on = 1 to on = 0, completions that the calling thread
 * makes on cq (a post that completes at once: a Send that TCP took, under RFC 5040's rule, or
 * a flush on a QP in error) raise no notification, though the CQ stays armed; on = 0 returns
 * how many of them the CQ may still hold (at most as many as there were, and none once the
 * CQ is empty: the caller may have polled them already), and the caller polls cq for them. For a
 * consumer that posts under its own lock and can take the completions right after, where an event
 * would wake another of its threads only to wait for that lock (a kernel ULP posting from its CQ
 * handler). One CQ per thread at a time. on = 1 returns 0, or -1 with errno EINVAL (invalid
 * CQ or value) or EBUSY (another CQ is quiet on this thread); on = 0 returns the count, or -1
 * with errno EINVAL if cq was not quiet on this thread. */
int softverbs_cq_quiet(struct ibv_cq* cq, int on);

/* InfiniBand's completion rule for one RC QP: on = 1 asks softverbs peers, when the QP's
 * connection is set up (call it before rdma_connect, rdma_accept or the move to RTR), to
 * acknowledge what they place, so the QP's Sends and Writes complete once the peer has
 * placed them and a remote error completes the WR that caused it; on = 0 keeps RFC 5040's
 * rule (complete once TCP has them), whatever SOFTVERBS_IB_COMPLETION says; on = -1 follows
 * SOFTVERBS_IB_COMPLETION again (the default). A plain iWARP peer (siw) has no such acks:
 * toward it the rule stays RFC 5040's. Returns 0, or EINVAL for an invalid QP or value. */
int softverbs_qp_set_ib_completion(struct ibv_qp* qp, int on);

/* The rule a connected RC QP's Sends and Writes follow: 1 when they complete once the peer
 * has placed them (both sides softverbs, and this QP asked), so a Write's success means its
 * bytes are in the peer's memory; 0 when they complete once TCP has them (RFC 5040's rule:
 * not asked, a plain iWARP peer such as siw, or not connected yet). -1 with errno EINVAL
 * for an invalid QP. */
int softverbs_qp_ib_completion(struct ibv_qp* qp);

/* Injects a fault on a connected RC or UC QP now, for a program that wants it at a chosen
 * moment (SOFTVERBS_FAULT chooses frames by rule; docs/fault-injection.md):
 *   "reset"       an abortive close of the connection (a TCP RST), as a pulled cable: the
 *                 QP's outstanding WRs fail (IBV_WC_RETRY_EXC_ERR, then flushes), the peer's
 *                 QP fails too;
 *   "stall:ms=N"  nothing is sent or read on the connection for N ms (1 to 3600000);
 *   "corrupt"     one bit of the next outgoing FPDU's MPA CRC flips: the peer Terminates.
 * Each is counted (fault_reset, fault_stall, fault_corrupt in softverbs-stat). Returns 0;
 * EINVAL for an invalid QP or fault; EOPNOTSUPP for a UD QP, or "corrupt" on a connection
 * without MPA CRC (SOFTVERBS_MPA_CRC=1 turns it on); ENOTCONN if the QP has no connection. */
int softverbs_qp_inject_fault(struct ibv_qp* qp, const char* fault);

/* Gives the memory of an idle receive pool back to the system: the pages wholly inside the
 * buffers posted to srq and not yet taken by a QP are released (madvise MADV_DONTNEED), for a
 * consumer whose pool grew for a burst and then went quiet. The buffers stay posted; a page
 * comes back, zero-filled for private anonymous memory, when a message is placed in it. Only
 * buffers whose lkey names a region of the SRQ's PD with local write access are touched, and
 * a page that is partly outside every posted buffer is kept. A posted buffer is the device's
 * until its completion (ibv_post_srq_recv(3)), and a completion defines only its first
 * byte_len bytes: what else the buffer held before it was posted is not kept. A posted buffer
 * must therefore not overlap memory a QP may be placing into (another receive already taken).
 * The SRQ's QPs wait for their next receive while the pages go: a call for quiet times.
 * Returns the bytes advised away (pages that were not resident count too), or -1 with errno
 * EINVAL for an invalid SRQ. */
long softverbs_srq_trim(struct ibv_srq* srq);

#ifdef __cplusplus
}
#endif

#endif
