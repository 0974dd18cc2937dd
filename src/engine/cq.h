// Completion queues and completion channels. A channel is an EventQueue of ibv_cq
// pointers, so blocking, O_NONBLOCK/EAGAIN, EINTR and poll/epoll behave like the kernel's
// uverbs completion event file.
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "util/raw_array.h"

#include "engine/event_queue.h"

namespace sv::engine {

struct Context;
struct Qp;

struct Cq;
struct CompChannel {
  ibv_comp_channel ch;  // first; ch.fd is events.fd()
  EventQueue<ibv_cq*> events;
  // The handle's reference and each ibv_get_cq_event's: a thread still in one when the
  // channel is destroyed (woken by its last CQ's destruction) reads no freed memory.
  std::atomic<int> refs{1};
  // The CQs created on it, for a thread that blocks in ibv_get_cq_event to own their receive
  // paths while it sleeps (busy_poll.h channel_block). A CQ is destroyed only once no such
  // thread holds it (Cq::channel_sleepers, under mu; cv signals their going).
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Cq*> cqs;
};

// Drops a reference (CompChannel::refs); the last one frees the channel.
inline void channel_put(CompChannel* ch) {
  if (ch->refs.fetch_sub(1) == 1) delete ch;
}

// The CQ whose ibv_poll_cq this thread is running the receive path for (verbs.cc), if any.
extern thread_local Cq* tl_polling;
// The channel whose sleeper this thread is while it runs the receive pass it woke for
// (busy_poll.cc channel_block): notifications to it are for this thread to read next.
extern thread_local CompChannel* tl_channel_self;
// The CQ whose notifications this thread holds back (softverbs_cq_quiet), and how many
// completions it made on it meanwhile.
extern thread_local Cq* tl_quiet;
extern thread_local int tl_quiet_made;

struct Cq {
  ibv_cq_ex cqx;  // first: ibv_cq_ex begins with the ibv_cq members
  Context* ctx = nullptr;
  CompChannel* channel = nullptr;
  int cqe = 0;

  std::mutex mu;  // ring, arm state
  util::RawArray<ibv_wc> ring;
  uint32_t head = 0;
  // Written under mu; read without it only by poll's look for an empty ring (a spinner's
  // every pass would otherwise take and release mu twice).
  std::atomic<uint32_t> count{0};
  std::atomic<bool> armed{false};  // written under mu; read without it when posting
  bool solicited_only = false;
  bool overflowed = false;
  // softverbs_cq_set_comp_handler (include/softverbs/verbs_ext.h): a notification raised on
  // the progress thread calls this there, after the event that raised it, instead of queuing
  // a channel event (the kernel's ib_cq comp_handler). Guarded by mu.
  bool (*comp_handler)(ibv_cq*, void*) = nullptr;
  void* comp_arg = nullptr;

  // QPs attached to this CQ, so a busy-polling caller drives their receive path itself
  // instead of waiting for the progress thread (no thread hand-off on the fast path).
  std::mutex qps_mu;
  std::vector<Qp*> qps;
  std::atomic<int> nqps{0};
  std::atomic<int> nud{0};  // of them UD: their sockets are in no wait set (busy_poll.h)
  // Events ibv_get_cq_event returned for this CQ (uverbs' comp_events_reported): its destroy
  // waits until as many were acked. Counted under the channel queue's lock (EventQueue::pop).
  std::atomic<uint32_t> comp_events_reported{0};
  // A QP using this CQ has deferred WQEs (doorbell batching): polling or arming this CQ
  // flushes them first, so their completions, or the answers to them, can show up.
  std::atomic<bool> tx_deferred{false};
  // Busy-poll ownership (engine/busy_poll.h): an application thread spins on this CQ until
  // busy_until (CLOCK_MONOTONIC ns; 0: nobody). yielded: some QP of it stepped back from
  // the progress thread, so ending ownership must hand the sockets back.
  std::atomic<uint64_t> busy_until{0};
  std::atomic<uint32_t> empty_polls{0};   // application polls that found it empty, in a row
  std::atomic<uint64_t> empty_since{0};   // when that streak began (ns)
  std::atomic<uint64_t> last_empty{0};    // when the last of them ended (ns)
  std::atomic<uint32_t> yield_from{~0u};  // from this empty poll of the streak on, yield
  std::atomic<bool> yielded{false};
  // The thread that last marked ownership (busy_poll.cc's thread token): an arm from another
  // thread (a consumer's event thread re-arming as usual) says nothing about the poller.
  std::atomic<uintptr_t> busy_owner{0};
  // Threads blocked on the wait set right now (softverbs_cq_block): while there are any, the
  // receive path is theirs however long they sleep. A recheck that found them parks
  // (recheck_parked) and the last one to wake hands it back to the progress thread.
  std::atomic<int> blockers{0};
  std::atomic<bool> recheck_parked{false};
  std::atomic<uint64_t> block_gen{0};  // sleeps so far (blockers going from 0 to 1)
  // A ring of one of its QPs may have been told not to ring since the last blocker looked
  // (qp_busy_quiet_locked sets it first): only then does cq_block_begin visit every QP.
  std::atomic<bool> quiet_rings{false};
  std::atomic<uint64_t> block_since{0};  // when the current one began (mono ns)
  // Blocking ownership (busy_poll.h): an epoll set of the attached QPs' sockets while they can
  // receive, so a thread can block until this CQ's receive path has bytes to run and run it
  // itself (softverbs_cq_wait_fd). -1 until asked for; its members change on the progress
  // thread only.
  std::atomic<int> wait_epfd{-1};
  // In the wait set beside the sockets: an eventfd written when bytes wait in a shared-memory
  // ring whose producer was told not to ring (a spinner owned the QP, engine/qp_shm.cc), so a
  // thread that blocks finds the set readable. Drained by cq_block_begin.
  std::atomic<int> kick_fd{-1};
  // cq_kicks between their look at blockers and their write: the last blocker to wake waits
  // for them before its drain, or a kick that saw it asleep would land after it took
  // everything, and the set would stay readable with nothing to read.
  std::atomic<int> kickers{0};
  // Threads in ibv_get_cq_event that own this CQ's receive path right now (channel->mu).
  int channel_sleepers = 0;
  // The thread that last slept on it in ibv_get_cq_event: its arm does not hand the sockets
  // back, since it is about to sleep there again (busy_poll.h cq_busy_poll_armed).
  std::atomic<uintptr_t> channel_owner{0};

  // Extended CQ (ibv_create_cq_ex, verbs/cq_ex.cc): the completion times, per ring slot, when
  // its wc_flags ask for them (ns; CLOCK_MONOTONIC is the device's "HCA clock", CLOCK_REALTIME
  // the wall clock). Empty otherwise: no clock read.
  std::vector<uint64_t> ts, wall;
  // The completion start_poll/next_poll made current, read by the read_* ops. poll_mu is held
  // from a successful start_poll to end_poll, so pollers of one CQ take turns as with a
  // provider's CQ lock; mu is not, because the poller may post (and so complete) inside the
  // window, which takes mu.
  std::mutex poll_mu;
  ibv_wc cur{};
  uint64_t cur_ts = 0, cur_wall = 0;

  ibv_cq* ibcq() { return reinterpret_cast<ibv_cq*>(&cqx); }
  static Cq* from(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }

  // Adds a completion; returns false on overflow (caller raises IBV_EVENT_CQ_ERR). A
  // notification goes to the handler (deferred, progress thread only) or the channel.
  bool push(const ibv_wc& wc, bool solicited);
  // Runs the handler for a deferred notification; queues the channel event if it declines.
  void run_handler();
  int poll(int n, ibv_wc* out);
  // Moves the oldest completion (and its times) into cur; false if there is none. Needs
  // poll_mu (for cur); takes mu.
  bool pop_current();
  int arm(bool solicited);
  // Drops the completions of QP qpn still in the ring, keeping the others in order (a QP
  // moved to RESET: mlx4/mlx5 clean its CQEs so a reused QP does not poll stale flushes).
  // keep_recv keeps its receive completions: those of a QP on an SRQ, whose buffers belong
  // to the SRQ, not to the QP being reset. mlx5 (__mlx5_cq_clean) hands such a WQE back to
  // the SRQ; a CQE does not carry the SGL we would need to requeue it, so we keep the
  // completion instead, as rxe does (it never cleans a CQ): either way the buffer comes back.
  void clean(uint32_t qpn, bool keep_recv = false);
  void attach(Qp* qp);
  void detach(Qp* qp);

  // For the verbs layer, which takes no engine lock itself:
  // Runs the attached QPs' receive path on this thread (an empty ibv_poll_cq), as its
  // poller (tl_polling).
  // True if a QP took bytes (the pass may have been long).
  bool progress_qps();
  // Sends what doorbell batching holds on the attached QPs (a poll came up empty, or an arm).
  // with_acks false: a Placement Ack held for the application's answer stays held (an empty
  // poll just before the answer's post, as rsockets' riowrite makes, is no sign that none
  // is coming); posts held for a batch leave, and take any held ack with them.
  void flush_deferred_tx(bool with_acks = true);
  // softverbs_cq_set_comp_handler; a null handler also drops a deferred notification.
  void set_comp_handler(bool (*handler)(ibv_cq*, void*), void* arg);
  // Completions in the ring now.
  uint32_t pending();
  // ibv_resize_cq: EINVAL if the CQ holds more than cqe completions.
  int resize(int new_cqe);
  // ibv_start_poll .. ibv_end_poll (cq_ex.cc): pollers of one CQ take turns.
  void lock_poll() { poll_mu.lock(); }
  void unlock_poll() { poll_mu.unlock(); }
};

}  // namespace sv::engine
