// Shared-memory transport between softverbs peers on one host (issue 29; shm_link.h tells
// the protocol). This file: the segment (create, open, check, map), the set-up messages,
// and the doorbells. The requester and the parser call in where they would write to or read
// from the socket.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>

#include "engine/app_memory.h"
#include "engine/busy_poll.h"
#include "engine/log.h"
#include "engine/qp.h"
#include "engine/shm_link.h"
#include "util/clock.h"
#include "util/settings.h"
#include "wire/ddp_rdmap.h"

namespace sv::engine {
namespace {

using transport::ShmHeader;
using transport::ShmLayout;
using transport::ShmRingCtrl;
using wire::ShmCtrl;

// A consumer that reads its ring without having been rung (a busy poller) still looks at the
// socket this often (coarse_ns(): one tick at most later): for the peer's EOF or death, and
// for a bell that came late. A look is a recv(): at 50 us, one system call per 25 messages
// of an 8 B ping-pong.
constexpr uint64_t kBellCheckNs = 1'000'000;

const std::array<std::byte, 16>& boot_id() {
  static const std::array<std::byte, 16> id = [] {
    std::array<std::byte, 16> out{};
    char text[64] = {};
    FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f) return out;
    const size_t n = std::fread(text, 1, sizeof text - 1, f);
    std::fclose(f);
    // 8-4-4-4-12 hex digits: 16 bytes.
    size_t k = 0;
    for (size_t i = 0; i + 1 < n && k < out.size(); ++i) {
      auto hex = [](char ch) -> int {
        if (ch >= '0' && ch <= '9') return ch - '0';
        if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
        return -1;
      };
      const int hi = hex(text[i]), lo = hex(text[i + 1]);
      if (hi < 0 || lo < 0) continue;
      out[k++] = static_cast<std::byte>(hi << 4 | lo);
      ++i;
    }
    return out;
  }();
  return id;
}

// Peers in different network namespaces are, to everything above, on different hosts (a veth
// pair between namespaces is how two hosts are tested on one): they stay on TCP.
uint64_t netns_id() {
  static const uint64_t id = [] {
    struct stat st {};
    return stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  }();
  return id;
}

void* map_segment(int fd, size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return nullptr;
  // A forked child has no use for the parent's connections (fork.md): it does not inherit
  // a writable view of the peer's rings.
  madvise(p, len, MADV_DONTFORK);
  return p;
}

// Wires tx/rx to the rings: ring 0 is the initiator's.
void attach_rings(ShmLink& l) {
  auto* b = static_cast<std::byte*>(l.base);
  const size_t rb = l.ring_bytes;
  const int mine = l.initiator ? 0 : 1;
  const int theirs = 1 - mine;
  l.tx =
      transport::ShmProducer(reinterpret_cast<ShmRingCtrl*>(b + ShmLayout::ctrl_offset(mine, rb)),
                             b + ShmLayout::data_offset(mine, rb), rb);
  l.rx =
      transport::ShmConsumer(reinterpret_cast<ShmRingCtrl*>(b + ShmLayout::ctrl_offset(theirs, rb)),
                             b + ShmLayout::data_offset(theirs, rb), rb);
  l.rx.set_want_bell(true);  // until a busy poller says otherwise, every arrival rings
}

// The initiator's segment: a sealed memfd with both rings, zeroed by the kernel.
std::unique_ptr<ShmLink> create_segment() {
  auto l = std::make_unique<ShmLink>();
  l->initiator = true;
  // A power of two (rounded down): ring offsets are masks.
  const uint64_t want = settings::uint_value(SV_SETTING("SOFTVERBS_SHM_RING"));
  l->ring_bytes = 1u << (63 - __builtin_clzll(want | 1));
  const size_t len = ShmLayout::segment_bytes(l->ring_bytes);
  if (len == 0) return nullptr;
  l->memfd = memfd_create("softverbs-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (l->memfd < 0) return nullptr;
  if (ftruncate(l->memfd, static_cast<off_t>(len)) != 0 ||
      fcntl(l->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return nullptr;
  if (!(l->base = map_segment(l->memfd, len))) return nullptr;
  l->len = len;
  if (getrandom(&l->nonce, sizeof l->nonce, 0) != sizeof l->nonce) return nullptr;
  auto* h = static_cast<ShmHeader*>(l->base);
  h->magic = ShmLayout::kMagic;
  h->nonce = l->nonce;
  h->ring_bytes = l->ring_bytes;
  attach_rings(*l);
  return l;
}

// The responder's side: opens the offered segment and checks everything about it. Null, and
// a reason, if it is not the segment offered on a host we share.
std::unique_ptr<ShmLink> open_segment(const ShmCtrl& o, const char** why) {
  *why = nullptr;
  if (o.boot_id != boot_id()) {
    *why = "another host (boot id)";
    return nullptr;
  }
  if (o.netns != netns_id()) {
    *why = "another network namespace";
    return nullptr;
  }
  const size_t len = ShmLayout::segment_bytes(o.ring_bytes);
  if (len == 0) {
    *why = "ring size out of range";
    return nullptr;
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/fd/%u", o.pid, o.fd);
  // O_PATH first: the name is the peer's choice, and opening a device, a FIFO or a file on
  // a FUSE mount for real could block or have effects. Only a regular file on tmpfs (where
  // memfds live) owned by our own uid is opened for read and write, through our own
  // descriptor: root does not map another user's segment.
  const int pfd = open(path, O_PATH | O_CLOEXEC);
  if (pfd < 0) {
    *why = errno == EACCES || errno == EPERM ? "no permission" : "not found";
    return nullptr;
  }
  struct stat st {};
  struct statfs sfs {};
  const bool plain = fstat(pfd, &st) == 0 && S_ISREG(st.st_mode) && fstatfs(pfd, &sfs) == 0 &&
                     sfs.f_type == TMPFS_MAGIC;
  if (!plain || st.st_uid != geteuid()) {
    ::close(pfd);
    *why = !plain ? "not a shared-memory file" : "another user's";
    return nullptr;
  }
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", pfd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  ::close(pfd);
  if (fd < 0) {
    *why = "no permission";
    return nullptr;
  }
  auto l = std::make_unique<ShmLink>();
  l->memfd = fd;  // closed once mapped
  const int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != len || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    *why = "not a sealed segment of the offered size";
    return nullptr;
  }
  if (!(l->base = map_segment(fd, len))) {
    *why = "mmap failed";
    return nullptr;
  }
  l->len = len;
  l->close_memfd();
  const auto* h = static_cast<const ShmHeader*>(l->base);
  if (h->magic != ShmLayout::kMagic || h->nonce != o.nonce || h->ring_bytes != o.ring_bytes) {
    *why = "its header does not match the offer";
    return nullptr;
  }
  l->nonce = o.nonce;
  l->ring_bytes = o.ring_bytes;
  l->initiator = false;
  attach_rings(*l);
  return l;
}

uint32_t pull_min() {
  static const auto v =
      static_cast<uint32_t>(settings::uint_value(SV_SETTING("SOFTVERBS_SHM_PULL_MIN")));
  return v;
}

// Can we read the peer's memory? process_vm_readv needs the kernel's ptrace access check to
// pass (same user and no Yama restriction, or CAP_SYS_PTRACE; a seccomp profile may forbid
// the call). Tried on a random challenge we write into the segment's header and read back
// through the peer's mapping at `base`: that proves `pid` maps this very segment, so it is
// the peer (the only other process that opened it), not a stranger the peer named to have us
// copy the stranger's memory. Never ourselves: a peer naming our own pid would have us copy
// our own memory into a region it can read back.
// On false, *why says what stopped it (an info line at set-up: which way one copy works is
// the first question when Writes between two users are slower than between one user's).
bool can_pull(ShmLink& l, uint32_t pid, uint64_t base, const char** why) {
  *why = "SOFTVERBS_SHM_PULL_MIN=0";
  if (pull_min() == 0) return false;
  *why = "the peer named no process or mapping, or ours";
  if (pid == 0 || base == 0 || pid == static_cast<uint32_t>(getpid())) return false;
  uint64_t challenge = 0;
  *why = "getrandom failed";
  if (getrandom(&challenge, sizeof challenge, 0) != sizeof challenge || challenge == 0)
    return false;
  auto* h = static_cast<ShmHeader*>(l.base);
  const int mine = l.initiator ? 0 : 1;
  std::atomic_ref<uint64_t>(h->challenge[mine]).store(challenge, std::memory_order_seq_cst);
  uint64_t v = 0;
  iovec local{&v, sizeof v};
  iovec remote{reinterpret_cast<void*>(base + offsetof(ShmHeader, challenge) + mine * sizeof v),
               sizeof v};
  const ssize_t got = process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
  if (got != static_cast<ssize_t>(sizeof v) || v != challenge) {
    // EPERM: another user without CAP_SYS_PTRACE, or Yama's ptrace_scope; ENOSYS: seccomp.
    *why = got < 0 ? std::strerror(errno) : "the challenge did not read back";
    return false;
  }
  // Nor a thread of ours (process_vm_readv takes a thread id too, and a thread of our own
  // group always passes the check), nor a process sharing our memory (CLONE_VM): a random
  // value of this stack frame, private to our address space, must not read back through pid.
  uint64_t canary = 0;
  if (getrandom(&canary, sizeof canary, 0) != sizeof canary) return false;
  v = ~canary;
  remote = iovec{&canary, sizeof canary};
  if (process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) ==
          static_cast<ssize_t>(sizeof v) &&
      v == canary) {
    *why = "the peer named a thread of ours or a process sharing our memory";
    return false;
  }
  // Each read of the peer's data reads the challenge back too (shm_pull): a pid the kernel
  // gave to another process meanwhile is never taken for the peer.
  l.peer_pid = pid;
  l.peer_base = base;
  l.challenge = challenge;
  return true;
}

// Whether we read the peer's memory for its large Writes and Read Responses (we tell it so).
bool decide_pull(Qp* qp, ShmLink& l, uint32_t pid, uint64_t base) {
  const char* why = nullptr;
  if (can_pull(l, pid, base, &why)) {
    SV_INFO("qp %u: reads the peer's memory: one copy from %u bytes", qp->qpn(), pull_min());
    return true;
  }
  SV_INFO("qp %u: cannot read the peer's memory (%s): its data comes through the ring", qp->qpn(),
          why);
  return false;
}

void ring_bell(Qp* qp) {
  const char b = 0;
  // A full socket already holds bells the consumer has not taken: this one is not needed.
  (void)::send(qp->conn.fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  stats::add(qp->stats, stats::Ctr::shm_bells);
}

}  // namespace

ShmLink::~ShmLink() {
  if (base) {
    // Whatever our segments by reference named in the ring may be reused once we are gone.
    tx.revoke();
    munmap(base, len);
  }
  close_memfd();
}

void ShmLink::close_memfd() {
  if (memfd >= 0) ::close(memfd);
  memfd = -1;
}

bool shm_wanted() {
  static const bool on = settings::flag_value(SV_SETTING("SOFTVERBS_SHM"));
  return on;
}

void shm_offer_locked(Qp* qp) {
  Conn& c = qp->conn;
  if (c.shm) return;
  auto l = create_segment();
  if (!l) {
    SV_INFO("qp %u: no shared-memory segment (%s): staying on TCP", qp->qpn(),
            std::strerror(errno));
    return;
  }
  c.shm = std::move(l);
  c.shm_tx_due = static_cast<uint8_t>(ShmCtrl::Type::offer);
  c.shm_wait_answer = true;
}

void shm_peer_capable(Qp* qp) {
  std::lock_guard lk(qp->tx_mu);
  qp->conn.shm_offer_on_cap = false;
  shm_offer_locked(qp);
  tx_run_locked(qp);
}

namespace {
// Bytes in the ring that a receive pass would take now. Not while RX waits for a receive
// buffer (RNR) or the QP is in error: a sleeper woken for them would find nothing to do,
// and be woken again at once.
bool bytes_to_take(const Qp* qp, const transport::ShmConsumer& rx) {
  return rx.available() > 0 && !qp->rx_stalled.load() && qp->state.load() != IBV_QPS_ERR &&
         qp->fault_held.load() == 0 && qp->conn_up();
}
}  // namespace

void shm_quiet_locked(Qp* qp) {
  if (!qp->rx_ring.load() || !qp->conn.shm) return;
  qp->conn.shm->rx.set_want_bell(false);
}

bool shm_ring_on_locked(Qp* qp) {
  if (!qp->rx_ring.load() || !qp->conn.shm) return false;
  transport::ShmConsumer& rx = qp->conn.shm->rx;
  rx.set_want_bell(true);  // seq_cst: bytes written before the producer saw it are there now
  return bytes_to_take(qp, rx);
}

bool shm_wake_locked_out(Qp* qp) {
  if (!qp->rx_ring.load()) return false;
  std::lock_guard lk(qp->rx_mu);
  return shm_ring_on_locked(qp);
}

void shm_tx_retry_later(Qp* qp) {
  if (qp->shm_tx_timer.exchange(true)) return;
  Progress::get().post_after(std::chrono::milliseconds(1), [ref = QpRef(qp)] {
    Qp* q = ref.get();
    q->shm_tx_timer.store(false);
    if (!ref.live()) return;
    tx_kick(q);
    if (q->tx_blocked && q->tx_ring.load() && !q->rx_ring.load() && !q->shm_gone.load())
      shm_tx_retry_later(q);
  });
}

void shm_encode_ctrl(Qp* qp, uint8_t type, std::byte* out) {
  const Conn& c = qp->conn;
  ShmCtrl m;
  m.type = static_cast<ShmCtrl::Type>(type);
  if (c.shm && m.type != ShmCtrl::Type::decline) {
    m.pid = static_cast<uint32_t>(getpid());
    m.base_addr = reinterpret_cast<uintptr_t>(c.shm->base);
    m.flags = ShmCtrl::kPublishesPlaced;
    if (c.shm->we_pull) m.flags |= ShmCtrl::kPeerPull;
  }
  if (m.type == ShmCtrl::Type::offer && c.shm) {
    m.ring_bytes = c.shm->ring_bytes;
    m.nonce = c.shm->nonce;
    m.fd = static_cast<uint32_t>(c.shm->memfd);
    m.boot_id = boot_id();
    m.netns = netns_id();
  }
  wire::encode_shm_ctrl(out, m);
}

void shm_tx_switched_locked(Qp* qp) {
  Conn& c = qp->conn;
  qp->tx_ring.store(true);
  c.shm_placed = c.wait_acks && c.shm->peer_publishes_placed;
  stats::set_transport(qp->stats, wire::kTransportShm);
  SV_INFO("qp %u: sends through shared memory", qp->qpn());
  // A consumer that took bytes while our socket still carried FPDUs could not ring for room.
  if (c.shm->rx.space_bell_due()) ring_bell(qp);
}

bool shm_on_ctrl(Qp* qp, const char** err) {
  Conn& c = qp->conn;
  *err = nullptr;
  ShmCtrl m;
  if (!c.peer_sv || !wire::decode_shm_ctrl(&c.hdr[2 + wire::kDdpUntaggedHdrLen], m)) {
    *err = "unexpected";
    return false;
  }
  std::lock_guard lk(qp->tx_mu);
  switch (m.type) {
    case ShmCtrl::Type::offer: {
      // Once per connection, to the responder, which has not offered itself.
      if (!c.shm_passive) {
        *err = "an offer to the initiator";
        return false;
      }
      if (c.shm || c.shm_tx_due || c.shm_wait_switch || qp->tx_ring.load()) {
        *err = "a second offer";
        return false;
      }
      const char* why = nullptr;
      std::unique_ptr<ShmLink> l;
      if (shm_wanted())
        l = open_segment(m, &why);
      else
        why = "SOFTVERBS_SHM=0";
      if (!l) {
        SV_INFO("qp %u: declines the peer's shared memory: %s", qp->qpn(), why);
        c.shm_tx_due = static_cast<uint8_t>(ShmCtrl::Type::decline);
      } else {
        l->we_pull = decide_pull(qp, *l, m.pid, m.base_addr);
        l->peer_publishes_placed = m.flags & ShmCtrl::kPublishesPlaced;
        l->rx.publish_placed(c.units_rx);  // then at each receive pass's end (iw_rx.cc)
        c.shm = std::move(l);
        c.shm_tx_due = static_cast<uint8_t>(ShmCtrl::Type::accept);
        c.shm_wait_switch = true;
      }
      tx_run_locked(qp);
      return true;
    }
    case ShmCtrl::Type::accept:
    case ShmCtrl::Type::decline:
      if (!c.shm_wait_answer) {
        *err = "an answer to no offer";
        return false;
      }
      c.shm_wait_answer = false;
      c.shm->close_memfd();  // mapped by both, or by nobody else
      if (m.type == ShmCtrl::Type::decline) {
        SV_INFO("qp %u: the peer declined shared memory: staying on TCP", qp->qpn());
        c.shm.reset();
        return true;
      }
      c.shm->peer_pulls = m.flags & ShmCtrl::kPeerPull;
      c.shm->peer_publishes_placed = m.flags & ShmCtrl::kPublishesPlaced;
      c.shm->we_pull = decide_pull(qp, *c.shm, m.pid, m.base_addr);
      c.shm->rx.publish_placed(c.units_rx);  // then at each receive pass's end (iw_rx.cc)
      // Everything the peer sends after this message is in its ring.
      c.rx_switch_after_seg = true;
      c.shm_tx_due = static_cast<uint8_t>(ShmCtrl::Type::switch_over);
      tx_run_locked(qp);
      return true;
    case ShmCtrl::Type::switch_over:
      if (!c.shm_wait_switch) {
        *err = "a switch with no accept";
        return false;
      }
      c.shm_wait_switch = false;
      c.shm->peer_pulls = m.flags & ShmCtrl::kPeerPull;
      c.rx_switch_after_seg = true;
      return true;
  }
  *err = "unexpected";
  return false;
}

void shm_rx_switch_locked(Qp* qp) {
  Conn& c = qp->conn;
  c.rx_switch_after_seg = false;
  qp->rx_ring.store(true);
  // What the socket still had after the switch message is doorbells: dropped, so the bell
  // they announced is taken (bell_pending cleared) before the ring is read. Otherwise the
  // flag stays set with no byte left to wake anyone, and the producer never rings again.
  c.rx_begin = c.rx_end = 0;
  c.shm->rx.bell_taken();
  c.bell_check_ns = 0;
  c.bell_wait_since = 0;
  SV_INFO("qp %u: receives through shared memory", qp->qpn());
}

bool shm_take_bells_locked(Qp* qp) {
  Conn& c = qp->conn;
  const uint64_t now = coarse_ns();
  c.bell_check_ns = now;
  char buf[256];
  bool alive = true, took = false;
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      took = true;
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    alive = false;  // EOF, reset, or a socket shut down under us
    break;
  }
  // Only a bell taken off the socket is cleared. The producer sets bell_pending before its
  // send(): a look in between finds the flag and no byte, and a clear there would leave the
  // byte, when it lands, in the socket with its bytes already read, the wait set readable
  // with nothing to take until the next kBellCheckNs look (a sleeper spinning meanwhile;
  // WaitFdWakesTheBlockerWhoseOwnPollReceives under load). Left pending, the next empty
  // read looks again and takes it; the producer rings no more meanwhile, as its byte is due.
  // Unless its send failed (ring_bell does not look: ENOBUFS under memory pressure): a flag
  // still without its byte a kBellCheckNs later is cleared, or the producer would never
  // ring again.
  if (took || !alive) {
    c.shm->rx.bell_taken();
    c.bell_wait_since = 0;
  } else if (c.shm->rx.bell_pending()) {
    if (!c.bell_wait_since) {
      c.bell_wait_since = now;
    } else if (now - c.bell_wait_since >= kBellCheckNs) {
      c.shm->rx.bell_taken();
      c.bell_wait_since = 0;
    }
  }
  if (!alive) qp->shm_gone.store(true);
  // Bells come for data and for room alike: whoever takes one kicks a TX waiting for room
  // (its own re-look after setting tx_blocked covers a bell taken before that; qp_requester).
  // rx_mu -> tx_mu is the lock order.
  if ((took || !alive) && qp->tx_ring.load() && qp->tx_blocked.load()) {
    std::lock_guard lk(qp->tx_mu);
    tx_run_locked(qp);
  }
  return alive;
}

ssize_t shm_rx_read(Qp* qp, iovec* iov, size_t n, bool app) {
  Conn& c = qp->conn;
  transport::ShmConsumer& rx = c.shm->rx;
  // Application memory (a payload placed straight from the ring, as recvmsg places it from
  // the socket) is DMA to TSan; rxbuf is not.
  auto readv = [&] {
    if (!app) return rx.readv(iov, n);
    DmaScope dma;
    return rx.readv(iov, n);
  };
  long got = readv();
  if (got == 0 && !qp->shm_gone.load()) {
    const bool rung = rx.bell_pending();
    if (rung || coarse_ns() - c.bell_check_ns >= kBellCheckNs) {
      shm_take_bells_locked(qp);
      if (rung) qp_busy_bell_taken_locked(qp);
      got = readv();  // a bell means bytes may be there now
    }
  }
  if (got < 0) {
    SV_WARN("qp %u: the peer's shared-memory ring is corrupt", qp->qpn());
    errno = EPROTO;
    return -1;
  }
  if (got == 0) {
    if (qp->shm_gone.load()) return 0;  // everything it wrote before it went is taken: EOF
    errno = EAGAIN;
    return -1;
  }
  // Our head store (readv, seq_cst) before this seq_cst load, against the TX thread's store
  // of tx_ring before its own look at want_space (shm_tx_switched_locked).
  if (qp->tx_ring.load() && rx.space_bell_due()) ring_bell(qp);
  return got;
}

ssize_t shm_tx_write(Qp* qp, const iovec* iov, size_t n) {
  Conn& c = qp->conn;
  transport::ShmProducer& tx = c.shm->tx;
  for (int tries = 0; tries < 2; ++tries) {
    long w;
    {
      DmaScope dma;  // large payloads are framed straight from application memory
      w = tx.writev(iov, n);
    }
    if (w < 0) {
      SV_WARN("qp %u: the peer corrupted our shared-memory ring", qp->qpn());
      errno = EPROTO;
      return -1;
    }
    if (w > 0) {
      if (tx.bell_due()) ring_bell(qp);
      return w;
    }
    if (!tx.wait_for_space()) break;  // full: the consumer rings when it has taken bytes
  }
  // Full for good: the consumer is gone (its socket ended), as sendmsg says EPIPE.
  errno = qp->shm_gone.load() ? EPIPE : EAGAIN;
  return -1;
}

namespace {
// The oldest WR is sent and waits for the peer to place it.
bool head_waits_for_peer(const Qp* qp) {
  if (!qp->sq_count) return false;
  const SendWqe& w = qp->sq[qp->sq_head & (qp->cap.max_send_wr - 1)];
  return w.state == WqeState::sent && w.status == IBV_WC_SUCCESS;
}
}  // namespace

void shm_watch_placed_locked(Qp* qp) {
  if (!qp->conn.acks_unseen || !qp->conn.shm_placed || !head_waits_for_peer(qp)) return;
  if (qp->shm_placed_timer.exchange(true)) return;
  Progress::get().post_after(std::chrono::milliseconds(1), [ref = QpRef(qp)] {
    Qp* q = ref.get();
    q->shm_placed_timer.store(false);
    if (!ref.live()) return;
    std::lock_guard lk(q->tx_mu);
    complete_sq_locked(q);
    shm_watch_placed_locked(q);
  });
}

bool shm_sends_refs(const Qp* qp, uint32_t len) {
  const uint32_t min = pull_min();
  return min && len >= min && qp->tx_ring.load(std::memory_order_relaxed) && qp->conn.shm &&
         qp->conn.shm->peer_pulls;
}

int shm_pull(Qp* qp, const iovec* dst, size_t n, uint64_t src, uint32_t len) {
  const ShmLink& l = *qp->conn.shm;
  // The data, then our challenge through the peer's mapping, in one call: the bytes came from
  // the process that maps this segment, not from one that took its pid after it exited.
  // The kernel moves at most MAX_RW_COUNT (2 GiB less a page) per call and may stop early at
  // a fault: then go on from where it stopped, and ask for the challenge on its own after.
  uint64_t seen = 0;
  iovec local[kMaxSge + 1];
  const size_t k = std::min(n, size_t{kMaxSge});
  std::copy(dst, dst + k, local);
  local[k] = iovec{&seen, sizeof seen};
  size_t first = 0;
  uint64_t done = 0;
  bool proved = false;
  while (done < len || !proved) {
    iovec remote[2] = {{reinterpret_cast<void*>(src + done), static_cast<size_t>(len - done)},
                       {reinterpret_cast<void*>(l.peer_base + offsetof(ShmHeader, challenge) +
                                                (l.initiator ? 0 : 1) * sizeof seen),
                        sizeof seen}};
    const bool data_left = done < len;
    ssize_t got;
    {
      DmaScope dma;  // the kernel writes the application's memory, as a NIC's DMA would
      got = process_vm_readv(static_cast<pid_t>(l.peer_pid), &local[first], k + 1 - first,
                             data_left ? remote : &remote[1], data_left ? 2 : 1, 0);
    }
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      // Revoked first: a peer that gave its buffers back may have unmapped them already.
      if (l.rx.revoked()) return ECONNRESET;
      const int err = got < 0 ? errno : EFAULT;
      SV_WARN("qp %u: reading %u bytes at %#" PRIx64 " of the peer failed: %s", qp->qpn(), len, src,
              std::strerror(err));
      return err;
    }
    const uint64_t data = std::min<uint64_t>(static_cast<uint64_t>(got), len - done);
    done += data;
    proved = static_cast<uint64_t>(got) > data;  // the challenge came too (all of it, or none)
    for (size_t left = static_cast<size_t>(data); left && first < k;) {
      const size_t take = std::min(left, local[first].iov_len);
      local[first].iov_base = static_cast<std::byte*>(local[first].iov_base) + take;
      local[first].iov_len -= take;
      left -= take;
      if (local[first].iov_len == 0) ++first;
    }
    if (done == len) first = k;  // only the challenge is left to read
  }
  if (seen != l.challenge) return ESRCH;  // another process has the peer's pid now
  // The peer's QP had not given the bytes back to its application when we read them
  // (ShmConsumer::revoked): they are what the WR that named them holds.
  if (l.rx.revoked()) return ECONNRESET;
  stats::add_serial(qp->stats, stats::Ctr::shm_pulls);
  // Came in, though not through the ring.
  stats::add_serial(qp->stats, stats::Ctr::rcvd_bytes, len);
  return 0;
}

}  // namespace sv::engine
