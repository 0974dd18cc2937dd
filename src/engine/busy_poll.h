// Busy-poll ownership, as Linux NAPI busy polling: an application thread that spins on a CQ
// runs the receive path of the CQ's QPs itself (ibv_poll_cq on an empty CQ), so while it
// does, the progress thread steps back from those sockets instead of racing it for rx_mu
// and for the CPU. Without this, every frame wakes the progress thread too (EPOLLIN), and on
// a small machine the wake-up pre-empts the very thread that would have read the frame.
//
// A CQ is busy-polled once an application thread has found it empty kSpinPolls times in a
// row while it was unarmed (a spin: a consumer that drains its CQ stops at the first empty
// poll, and one that arms is about to block), or after softverbs_cq_busy_poll(cq, 1), for a
// hold time after the last such poll (SOFTVERBS_BUSY_POLL_US, default 50; 0 turns ownership
// off). Arming the CQ from the polling thread, softverbs_cq_busy_poll(cq, 0), or the hold
// time passing hands the sockets back. A QP steps back when the progress thread sees
// EPOLLIN while its send or receive CQ is busy-polled: its EPOLLIN interest is dropped until
// then. The cost of a wrong guess is bounded: a spinner that leaves the CQ to wait elsewhere
// (spinning on memory for an RDMA Write) gets its data at most kMaxRecheckNs (or 4 hold
// times, if longer) late.
#pragma once
#include <cstdint>

#include "engine/cq.h"
#include "util/clock.h"

namespace sv::engine {

struct Qp;

uint64_t busy_poll_hold_ns();  // 0: ownership off
inline constexpr uint32_t kSpinPolls = 8;
// Empty polls further apart than this are no spin, however many come in a row: rsockets'
// riowrite polls its CQ once per call, between waits on memory for the peer's riowrite, and
// counted as a spinner it kept the receive path from the progress thread for a hold time
// per message (1 ms a 64 B riostream round trip under IB's completion rule, not 20 us).
inline constexpr uint64_t kSpinGapNs = 10'000;
// An application thread polls cq and will come back: extend its ownership.
void cq_busy_poll_mark(Cq* cq, uint64_t now);
inline void cq_busy_poll_mark(Cq* cq) {
  cq_busy_poll_mark(cq, mono_ns());
}
// Another thread owns cq's receive path now: an empty poll leaves it to that thread (its
// completions land in the CQ all the same) rather than racing it for the bytes.
// now: mono_ns(), read once per empty poll (a clock read is a tenth of a spin's pass).
bool cq_owned_elsewhere(const Cq* cq, uint64_t now);
// An application thread's ibv_poll_cq found cq empty (mark once it spins) or not.
// True if it yielded the CPU (the clock must be read again: `now` is old).
bool cq_busy_poll_empty(Cq* cq, uint64_t now);
// The empty poll's receive pass is over: the gap to the next one is the application's own
// (a sanitizer's slow receive pass is no pause of the spinner's).
// now: the time the pass ended (the poll's own `now` if it took nothing: it was short).
void cq_busy_poll_empty_done(Cq* cq, uint64_t now);
// This thread's last poll of cq was empty too, moments ago: it spins, it is not answering.
bool cq_spinning(const Cq* cq, uint64_t now);
// A poll that finds completions does not extend the hold: an application that polls only
// for completions it knows are there (ib_write_lat, after a post) and then waits elsewhere
// (on memory, for the peer's Write) is no spinner, and would wait for the recheck.
inline void cq_busy_poll_found(Cq* cq) {
  if (cq->empty_polls.load(std::memory_order_relaxed))
    cq->empty_polls.store(0, std::memory_order_relaxed);
}
// The application stops polling cq (it said so): sockets go back at once.
void cq_busy_poll_end(Cq* cq);
// An application thread armed cq: if it is the thread that polls it, it is about to block on
// the channel, and the sockets go back at once (an arm from any other thread leaves them).
void cq_busy_poll_armed(Cq* cq);
// Progress thread, EPOLLIN for qp: true if a poller owns it (the QP stepped back; the caller
// leaves the socket to the poller and updates the QP's interest).
bool qp_busy_step_back(Qp* qp);
// Caller holds rx_mu, and took a bell off the QP's socket: if it is the thread that spins on
// one of the QP's CQs, the progress thread has not stepped back (it never saw the bell the
// poller took first), and the peer will ring for every message until it does: ask it, once.
void qp_busy_bell_taken_locked(Qp* qp);
// Caller holds rx_mu: the QP is a poller's, so its ring's producer need not ring (unless a
// thread sleeps on the CQ's wait set). Once the step-back could not (Qp::rx_quiet_due).
void qp_busy_quiet_locked(Qp* qp);

// Blocking ownership. A thread that blocks until a CQ has work for it (RDS's poll()) waits on
// the CQ's wait set beside its own descriptors: the bytes that make the work then wake it,
// not the progress thread, which would have to wake it in turn. One wake-up per message
// instead of two, as a blocking epoll_wait with NAPI busy polling runs the device's receive
// on the sleeper's thread. From cq_block_begin to cq_block_end the thread owns the receive
// path however long it sleeps, and the progress thread sets no timer for it; woken, it runs
// the receive path with ibv_poll_cq, and ownership decays as a spinner's does.
// While a thread sleeps on the wait set, the progress thread looks whether the socket can go
// back this often (doubling while the same sleep lasts); so a thread that wakes and then
// stops polling without arming has its sockets taken back within this much (plus the hold).
inline constexpr uint64_t kBlockRecheckNs = 1'000'000;
// While a spinner keeps polling, the progress thread's look at whether it stopped backs off
// to this (or 4 hold times, if longer).
inline constexpr uint64_t kMaxRecheckNs = 2'000'000;
// The CQ's wait set (created on first use, progress thread); -1 and errno on failure.
int cq_wait_fd(Cq* cq);
// Makes the CQ's wait set readable (its kick eventfd), so a thread blocked on it wakes.
void cq_kick(Cq* cq);
// The calling thread is about to block on the CQ's wait set; it woke (for whatever reason).
// drain_kick: empty the kick eventfd (softverbs_cq_block's sleeper sees only the wait set, so
// a kick left in it would wake its next sleep at once). false: the caller polls the kick's
// descriptor itself and reads it only when poll says it fired (channel_block: exact, and no
// read at all for a message the socket brought).
void cq_block_begin(Cq* cq, bool drain_kick = true);
void cq_block_end(Cq* cq, bool drain_kick = true);
// Blocking ownership through a completion channel (issue 31): a thread that blocks in
// ibv_get_cq_event with nothing queued sleeps on the channel's descriptor and on the wait
// sets of the channel's CQs at once, as if it had called softverbs_cq_block on each; the
// peer's bytes wake it, it runs the receive path itself, and the completion's notification
// lands on the channel it is about to read. One wake-up per message instead of two (the
// progress thread's, then the waiter's): what a blocking TCP recv costs. Not for a channel
// whose descriptor is non-blocking, or with an event already queued (a program that polls the
// descriptor itself: it sleeps elsewhere, so the progress thread must keep receiving), nor
// for CQs with a completion handler (RDS: its handler runs on the progress thread).
// Nor with a UD QP on a CQ (its socket is in no wait set). Returns 0: the caller's read then
// finds an event, or sleeps as before (ownership did not apply, or a restartable signal came);
// -1 with errno EINTR for a signal whose handler may want it.
int channel_block(CompChannel* ch);
// The calling thread last slept on cq in ibv_get_cq_event (channel_block).
bool cq_channel_sleeper_is_me(const Cq* cq);
// A CQ created on ch, or being destroyed (waits until no thread in channel_block holds it).
void channel_cq_add(CompChannel* ch, Cq* cq);
void channel_cq_remove(CompChannel* ch, Cq* cq);

// Progress thread: puts qp's socket in its CQs' wait sets while it can receive (connected,
// a receive buffer posted, not in error), takes it out otherwise. A readable socket the
// receive path cannot consume must not be in a set: its sleeper would spin.
void qp_wait_sync(Qp* qp);
// Progress thread: takes qp's socket out of the wait sets (before it is closed or shut down).
void qp_wait_drop(Qp* qp);

}  // namespace sv::engine
