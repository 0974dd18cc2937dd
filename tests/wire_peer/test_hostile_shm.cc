// The shared-memory set-up and rings (issue 29, engine/shm_link.h) against a hand-built
// same-host peer: set-up messages out of order, offers of segments that are not what they
// claim (missing, unsealed, another nonce), rings whose control words lie, and, for the
// record, FPDUs the peer writes into a ring by hand placed as from TCP.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <thread>

#include "engine/shm_link.h"
#include "fake_peer.h"
#include "transport/shm_ring.h"

namespace wire_peer {
namespace {

using sv::transport::ShmConsumer;
using sv::transport::ShmHeader;
using sv::transport::ShmLayout;
using sv::transport::ShmProducer;
using sv::transport::ShmRingCtrl;

// Settings are read once per process: every test here runs with shared memory on.
const bool kShmOn = (setenv("SOFTVERBS_SHM", "1", 1), true);

constexpr size_t kRing = 64 * 1024;

std::vector<std::byte> ctrl_ulpdu(const ShmCtrl& c) {
  std::vector<std::byte> u(kDdpUntaggedHdrLen + kShmCtrlLen);
  encode_untagged(u.data(), RdmapOpcode::sv_shm, true, 0, kQnSvShm, 0, 0);
  encode_shm_ctrl(u.data() + kDdpUntaggedHdrLen, c);
  return u;
}

std::array<std::byte, 16> boot_id() {
  std::array<std::byte, 16> out{};
  FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re");
  char t[64] = {};
  const size_t n = f ? std::fread(t, 1, sizeof t - 1, f) : 0;
  if (f) std::fclose(f);
  size_t k = 0;
  for (size_t i = 0; i + 1 < n && k < 16; ++i) {
    auto hex = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
    if (!isxdigit(t[i]) || !isxdigit(t[i + 1])) continue;
    out[k++] = std::byte(static_cast<uint8_t>(hex(t[i]) << 4 | hex(t[i + 1])));
    ++i;
  }
  return out;
}

uint64_t netns() {
  struct stat st {};
  stat("/proc/self/ns/net", &st);
  return st.st_ino;
}

// A segment as an initiator makes it; `seal` false leaves it shrinkable.
struct Segment {
  int fd = -1;
  std::byte* base = nullptr;
  size_t len = ShmLayout::segment_bytes(kRing);
  uint64_t nonce = 0;
  explicit Segment(bool seal = true) {
    fd = memfd_create("test-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(len)), 0);
    if (seal) {
      EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    }
    base = static_cast<std::byte*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(base, MAP_FAILED);
    EXPECT_EQ(getrandom(&nonce, sizeof nonce, 0), static_cast<ssize_t>(sizeof nonce));
    auto* h = reinterpret_cast<ShmHeader*>(base);
    h->magic = ShmLayout::kMagic;
    h->nonce = nonce;
    h->ring_bytes = kRing;
  }
  ~Segment() {
    munmap(base, len);
    close(fd);
  }
  ShmCtrl offer() const {
    ShmCtrl c;
    c.type = ShmCtrl::Type::offer;
    c.ring_bytes = kRing;
    c.nonce = nonce;
    c.pid = static_cast<uint32_t>(getpid());
    c.fd = static_cast<uint32_t>(fd);
    c.boot_id = boot_id();
    c.netns = netns();
    return c;
  }
  ShmRingCtrl* ctrl(int ring) {
    return reinterpret_cast<ShmRingCtrl*>(base + ShmLayout::ctrl_offset(ring, kRing));
  }
  std::byte* data(int ring) { return base + ShmLayout::data_offset(ring, kRing); }
};

// Reads the next FPDU from the socket: its decoded header and ULPDU.
bool read_fpdu(FakePeer& p, DdpSegment& seg, std::vector<std::byte>& ulpdu) {
  std::byte len[2];
  if (!p.read_exact(len, 2)) return false;
  const uint16_t ul = load_be16(len);
  ulpdu.assign(ul + fpdu_pad(ul) + 4, std::byte{0});
  if (!p.read_exact(ulpdu.data(), ulpdu.size())) return false;
  return ddp_decode(ulpdu, ul, seg) == DdpError::ok;
}

// The QP's answer to an offer (type 0 if none came).
ShmCtrl answer_ctrl(FakePeer& p) {
  DdpSegment seg;
  std::vector<std::byte> u;
  for (int i = 0; i < 8; ++i) {
    if (!read_fpdu(p, seg, u)) break;
    ShmCtrl c;
    if (seg.opcode == RdmapOpcode::sv_shm && decode_shm_ctrl(u.data() + kDdpUntaggedHdrLen, c))
      return c;
  }
  ShmCtrl none;
  none.type = ShmCtrl::Type{};
  return none;
}
ShmCtrl::Type answer(FakePeer& p) {
  return answer_ctrl(p).type;
}

// The first Terminate the QP wrote into its ring (ring 1), waiting up to a second for it.
bool ring_terminate(Segment& seg, Terminate& t) {
  ShmConsumer rx(seg.ctrl(1), seg.data(1), kRing);
  std::vector<std::byte> got;
  size_t at = 0;
  for (int i = 0; i < 100; ++i) {
    std::byte b[4096];
    iovec v{b, sizeof b};
    const long n = rx.readv(&v, 1);
    if (n < 0) return false;
    got.insert(got.end(), b, b + n);
    while (at + 2 <= got.size() && at + fpdu_len(load_be16(got.data() + at)) <= got.size()) {
      const uint16_t ul = load_be16(got.data() + at);
      DdpSegment d;
      if (ddp_decode({got.data() + at + 2, ul}, ul, d) != DdpError::ok) return false;
      if (d.opcode == RdmapOpcode::terminate) {
        t = decode_terminate(got.data() + at + 2 + kDdpUntaggedHdrLen);
        return true;
      }
      at += fpdu_len(ul);
    }
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void open_stream(FakePeer& p) {
  std::vector<std::byte> w(kDdpTaggedHdrLen);
  encode_tagged(w.data(), RdmapOpcode::rdma_write, true, 0, 0);
  p.send_fpdu(w);
}

void expect_terminate(Local& l, FakePeer& p) {
  Terminate t;
  ASSERT_TRUE(p.read_terminate(t)) << "no Terminate came back";
  EXPECT_EQ(t.layer, TermLayer::rdmap);
  EXPECT_EQ(t.ecode, uint8_t(RdmapEcode::unexpected_opcode));
  EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
}

// A Send of `n` bytes from the peer reaches the QP's posted receive intact.
void expect_send_works(Local& l, FakePeer& p) {
  ibv_sge s{reinterpret_cast<uint64_t>(l.buf.data()), 64, l.mr->lkey};
  ibv_recv_wr r{};
  r.wr_id = 5;
  r.sg_list = &s;
  r.num_sge = 1;
  ibv_recv_wr* bad;
  ASSERT_EQ(ibv_post_recv(l.qp, &r, &bad), 0);
  std::vector<std::byte> u(kDdpUntaggedHdrLen + 16, std::byte{0x3c});
  encode_untagged(u.data(), RdmapOpcode::send, true, 0, kQnSend, 1, 0);
  p.send_fpdu(u);
  auto wc = l.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 16u);
  EXPECT_EQ(l.buf[0], 0x3c);
}

// With shared memory on, every FPDU toward a softverbs peer says so (kDdpSvShmCap): that is
// what an initiator waits for before it offers, so a build without it never gets an offer.
TEST(ShmSetup, TheQpsFpdusCarryTheCapabilityBit) {
  Local l;
  FakePeer p(l.qp->qp_num);
  open_stream(p);
  ASSERT_EQ(l.post_send(0, 8, false), 0);
  DdpSegment seg;
  std::vector<std::byte> u;
  ASSERT_TRUE(read_fpdu(p, seg, u));
  EXPECT_TRUE(seg.sv_shm_cap);
  EXPECT_NE(static_cast<uint8_t>(u[0]) & kDdpSvShmCap, 0);
}

// Set-up messages out of order, or of no known type: a broken peer, Terminated.
TEST(ShmSetup, AnAcceptOrSwitchWithNothingBeforeItOrAnUnknownTypeTerminates) {
  for (uint8_t type :
       {uint8_t(ShmCtrl::Type::accept), uint8_t(ShmCtrl::Type::switch_over), uint8_t(9)}) {
    SCOPED_TRACE(int(type));
    Local l;
    FakePeer p(l.qp->qp_num);
    open_stream(p);
    auto u = ctrl_ulpdu(ShmCtrl{});
    u[kDdpUntaggedHdrLen] = std::byte{type};
    p.send_fpdu(u);
    expect_terminate(l, p);
  }
}

// One offer per connection: a second, even of the same segment, is a broken peer.
TEST(ShmSetup, ASecondOfferTerminates) {
  Local l;
  FakePeer p(l.qp->qp_num);
  open_stream(p);
  Segment seg;
  p.send_fpdu(ctrl_ulpdu(seg.offer()));
  ASSERT_EQ(answer(p), ShmCtrl::Type::accept);
  p.send_fpdu(ctrl_ulpdu(seg.offer()));  // still on TCP: no switch was sent
  EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
  // The QP sends through its ring since its accept: the Terminate is there.
  Terminate t;
  ASSERT_TRUE(ring_terminate(seg, t)) << "no Terminate in the QP's ring";
  EXPECT_EQ(t.ecode, uint8_t(RdmapEcode::unexpected_opcode));
}

// Offers that do not hold up are declined, and the connection goes on over TCP.
TEST(ShmSetup, OffersOfSegmentsThatAreNotWhatTheyClaimAreDeclined) {
  struct Case {
    const char* name;
    void (*spoil)(ShmCtrl&, Segment&);
    bool seal;
  };
  const Case cases[] = {
      {"no such descriptor", [](ShmCtrl& c, Segment&) { c.fd = 1000000; }, true},
      {"no such process", [](ShmCtrl& c, Segment&) { c.pid = 0x7ffffff0; }, true},
      {"another nonce", [](ShmCtrl& c, Segment&) { c.nonce ^= 1; }, true},
      {"unsealed: the peer could shrink it under us", [](ShmCtrl&, Segment&) {}, false},
      {"another size", [](ShmCtrl& c, Segment&) { c.ring_bytes = 2 * kRing; }, true},
      {"a size out of range", [](ShmCtrl& c, Segment&) { c.ring_bytes = 1000; }, true},
      {"another boot id", [](ShmCtrl& c, Segment&) { c.boot_id[3] ^= std::byte{1}; }, true},
      {"another network namespace", [](ShmCtrl& c, Segment&) { c.netns ^= 1; }, true},
      {"a header that is not ours", [](ShmCtrl&, Segment& s) { std::memset(s.base, 0, 8); }, true},
      {"not a memfd (stdin)", [](ShmCtrl& c, Segment&) { c.fd = 0; }, true},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Local l;
    FakePeer p(l.qp->qp_num);
    open_stream(p);
    Segment seg(k.seal);
    ShmCtrl c = seg.offer();
    k.spoil(c, seg);
    p.send_fpdu(ctrl_ulpdu(c));
    EXPECT_EQ(answer(p), ShmCtrl::Type::decline);
    expect_send_works(l, p);
    EXPECT_EQ(l.state(), IBV_QPS_RTS);
  }
}

// Accepted: a sealed segment cannot be shrunk by its maker (so the QP's mapping never faults);
// FPDUs the peer writes into its ring are placed, and the QP's own go into the other ring.
TEST(ShmRing, FpdusWrittenByHandIntoTheRingArePlacedAndAnswered) {
  Local l;
  FakePeer p(l.qp->qp_num);
  open_stream(p);
  Segment seg;
  p.send_fpdu(ctrl_ulpdu(seg.offer()));
  ASSERT_EQ(answer(p), ShmCtrl::Type::accept);
  EXPECT_NE(ftruncate(seg.fd, 4096), 0) << "a sealed segment shrank";
  ShmCtrl sw;
  sw.type = ShmCtrl::Type::switch_over;
  p.send_fpdu(ctrl_ulpdu(sw));

  ibv_sge s{reinterpret_cast<uint64_t>(l.buf.data()), 64, l.mr->lkey};
  ibv_recv_wr r{};
  r.wr_id = 6;
  r.sg_list = &s;
  r.num_sge = 1;
  ibv_recv_wr* bad;
  ASSERT_EQ(ibv_post_recv(l.qp, &r, &bad), 0);
  // A Send FPDU, written into ring 0 as it would go on TCP, then one doorbell byte.
  std::vector<std::byte> f(fpdu_len(kDdpUntaggedHdrLen + 24), std::byte{0});
  store_be16(f.data(), kDdpUntaggedHdrLen + 24);
  encode_untagged(f.data() + 2, RdmapOpcode::send, true, 0, kQnSend, 1, 0);
  std::memset(f.data() + 2 + kDdpUntaggedHdrLen, 0x61, 24);
  ShmProducer tx(seg.ctrl(0), seg.data(0), kRing);
  iovec v{f.data(), f.size()};
  ASSERT_EQ(tx.writev(&v, 1), static_cast<long>(f.size()));
  ASSERT_EQ(write(p.fd, "b", 1), 1);
  auto wc = l.poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].byte_len, 24u);
  EXPECT_EQ(l.buf[23], 0x61);

  // The QP's Send comes out of ring 1, framed as on TCP.
  std::memset(l.buf.data(), 0x77, 40);
  ASSERT_EQ(l.post_send(7, 40, false), 0);
  ShmConsumer rx(seg.ctrl(1), seg.data(1), kRing);
  std::vector<std::byte> got;
  for (int i = 0; i < 500 && got.size() < 2; ++i) {
    std::byte b[4096];
    iovec rv{b, sizeof b};
    const long n = rx.readv(&rv, 1);
    ASSERT_GE(n, 0);
    got.insert(got.end(), b, b + n);
    if (got.size() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(got.size(), 2u) << "nothing came out of the QP's ring";
  // Possibly a Placement Ack first (IB's completion rule): find the Send.
  size_t at = 0;
  bool found = false;
  while (at + 2 <= got.size()) {
    const uint16_t ul = load_be16(got.data() + at);
    const size_t whole = fpdu_len(ul);
    for (int i = 0; i < 100 && got.size() < at + whole; ++i) {
      std::byte b[4096];
      iovec rv{b, sizeof b};
      const long n = rx.readv(&rv, 1);
      got.insert(got.end(), b, b + std::max<long>(n, 0));
      if (got.size() < at + whole) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(got.size(), at + whole);
    DdpSegment d;
    ASSERT_EQ(ddp_decode({got.data() + at + 2, ul}, ul, d), DdpError::ok);
    if (d.opcode == RdmapOpcode::send) {
      EXPECT_EQ(d.payload_len, 40u);
      EXPECT_EQ(got[at + 2 + kDdpUntaggedHdrLen], std::byte{0x77});
      found = true;
      break;
    }
    at += whole;
  }
  EXPECT_TRUE(found) << "no Send FPDU in the QP's ring";
}

// A peer that writes a tail more than a ring ahead: the QP fails (Terminate, ERR); the
// process goes on.
TEST(ShmRing, ACorruptRingFailsTheQpNotTheProcess) {
  for (uint64_t tail : {uint64_t{kRing + 1}, ~uint64_t{0}}) {
    SCOPED_TRACE(tail);
    Local l;
    FakePeer p(l.qp->qp_num);
    open_stream(p);
    Segment seg;
    p.send_fpdu(ctrl_ulpdu(seg.offer()));
    ASSERT_EQ(answer(p), ShmCtrl::Type::accept);
    ShmCtrl sw;
    sw.type = ShmCtrl::Type::switch_over;
    p.send_fpdu(ctrl_ulpdu(sw));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::atomic_ref<uint64_t>(seg.ctrl(0)->tail).store(tail);
    ASSERT_EQ(write(p.fd, "b", 1), 1);
    EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
  }
}

// ---- one copy: segments by reference (kDdpSvRef) -----------------------------------------
// The QP never reads from its own process, so the peer that offers here is a twin: a child
// forked after the segment and the data were made, which shares the segment's mapping (and its
// descriptor, which the QP opens through /proc/<twin>/fd) and holds a copy of the rest.
struct Twin {
  pid_t pid = fork();
  Twin() {
    if (pid != 0) return;
    // Async-signal-safe calls only (this process has other threads); gone with its parent,
    // even one that dies without running ~Twin (a sanitizer's halt_on_error).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) pause();
  }
  ~Twin() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

// Offers `seg` as process `pid` whose mapping of it starts at `base` (0: none named), and
// switches to the rings. Returns the QP's accept.
ShmCtrl switch_to_rings(FakePeer& p, Segment& seg, pid_t pid, const void* base) {
  ShmCtrl o = seg.offer();
  o.pid = static_cast<uint32_t>(pid);
  o.base_addr = reinterpret_cast<uintptr_t>(base);
  p.send_fpdu(ctrl_ulpdu(o));
  const ShmCtrl a = answer_ctrl(p);
  ShmCtrl sw;
  sw.type = ShmCtrl::Type::switch_over;
  p.send_fpdu(ctrl_ulpdu(sw));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the QP reads the switch
  return a;
}

// An RDMA Write by reference to (stag, to) of `len` bytes at `addr` in the peer, written into
// ring 0 with a doorbell.
void ring_write_ref(FakePeer& p, Segment& seg, uint32_t stag, uint64_t to, const void* addr,
                    uint32_t len) {
  std::vector<std::byte> f(fpdu_len(kDdpTaggedHdrLen + kSvRefLen), std::byte{0});
  store_be16(f.data(), kDdpTaggedHdrLen + kSvRefLen);
  encode_tagged_ref(f.data() + 2, RdmapOpcode::rdma_write, true, stag, to,
                    reinterpret_cast<uintptr_t>(addr), len);
  ShmProducer tx(seg.ctrl(0), seg.data(0), kRing);
  iovec v{f.data(), f.size()};
  ASSERT_EQ(tx.writev(&v, 1), static_cast<long>(f.size()));
  ASSERT_EQ(write(p.fd, "b", 1), 1);
}

// Only a peer the QP proved it can read may send it references: the accept says so, and a
// reference from any other peer, or over TCP, is an unknown opcode (Terminate). Proved means
// the QP's challenge came back through the named process's mapping: a peer that names the
// QP's own process (which would have it copy its own memory into a region the peer can read
// back), or one of its threads, or no mapping, gets no kPeerPull.
TEST(ShmRef, AReferenceFromAPeerTheQpCouldNotReadTerminates) {
  std::vector<char> src(8192, 0x5a);
  // Another thread of this process: process_vm_readv takes its id as it takes a pid.
  std::atomic<pid_t> tid{0};
  std::atomic<bool> done{false};
  std::thread other([&] {
    tid = gettid();
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  while (tid == 0) std::this_thread::yield();
  struct Case {
    const char* name;
    pid_t pid;
    bool base;
  };
  for (const Case k :
       {Case{"no mapping named", getpid(), false}, Case{"the QP's own process", getpid(), true},
        Case{"a thread of the QP's process", tid.load(), true}}) {
    SCOPED_TRACE(k.name);
    Local l;
    FakePeer p(l.qp->qp_num);
    open_stream(p);
    Segment seg;
    const ShmCtrl a = switch_to_rings(p, seg, k.pid, k.base ? seg.base : nullptr);
    ASSERT_EQ(a.type, ShmCtrl::Type::accept);
    EXPECT_EQ(a.flags & ShmCtrl::kPeerPull, 0);
    ring_write_ref(p, seg, l.mr->rkey, reinterpret_cast<uintptr_t>(l.buf.data()), src.data(),
                   static_cast<uint32_t>(src.size()));
    EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
    Terminate t;
    ASSERT_TRUE(ring_terminate(seg, t));
    EXPECT_EQ(t.ecode, uint8_t(RdmapEcode::unexpected_opcode));
    EXPECT_NE(l.buf[0], 0x5a);
  }
  done = true;
  other.join();
  {
    SCOPED_TRACE("over TCP");
    Local l;
    FakePeer p(l.qp->qp_num);
    open_stream(p);
    std::vector<std::byte> u(kDdpTaggedHdrLen + kSvRefLen);
    encode_tagged_ref(u.data(), RdmapOpcode::rdma_write, true, l.mr->rkey,
                      reinterpret_cast<uintptr_t>(l.buf.data()),
                      reinterpret_cast<uintptr_t>(src.data()), 8192);
    p.send_fpdu(u);
    expect_terminate(l, p);
    EXPECT_NE(l.buf[0], 0x5a);
  }
}

// A reference from a peer the QP proved it can read: checked exactly as data (STag, bounds),
// read only once it passes; one naming memory the peer does not have, whose QP revoked its
// references (its WRs went back to its application), or read from a process that no longer
// maps the segment (a reused pid), fails the QP, not the process.
TEST(ShmRef, AReferenceIsCheckedThenReadAndABadOneFailsOnlyTheQp) {
  std::vector<char> src(10000, 0x5a);
  void* hole = mmap(nullptr, 65536, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  struct Case {
    const char* name;
    bool bad_stag, past_end, unreadable, revoked, stranger = false;
  };
  for (const Case k :
       {Case{"good", false, false, false, false}, Case{"bad STag", true, false, false, false},
        Case{"past the region's end", false, true, false, false},
        Case{"memory the peer does not have", false, false, true, false},
        Case{"revoked", false, false, false, true},
        // The challenge is no longer where the pid maps the segment: as a reused pid.
        Case{"a stranger with the peer's pid", false, false, false, true, true}}) {
    SCOPED_TRACE(k.name);
    Local l;
    FakePeer p(l.qp->qp_num);
    open_stream(p);
    Segment seg;
    Twin twin;
    ASSERT_GT(twin.pid, 0);
    const ShmCtrl a = switch_to_rings(p, seg, twin.pid, seg.base);
    ASSERT_EQ(a.type, ShmCtrl::Type::accept);
    ASSERT_EQ(a.flags & ShmCtrl::kPeerPull, ShmCtrl::kPeerPull) << "the QP could not read the twin";
    if (k.stranger)
      std::atomic_ref<uint64_t>(reinterpret_cast<ShmHeader*>(seg.base)->challenge[1]).store(0);
    else if (k.revoked)
      std::atomic_ref<uint32_t>(seg.ctrl(0)->revoked).store(1);
    const uint64_t to = reinterpret_cast<uintptr_t>(l.buf.data()) +
                        (k.past_end ? l.buf.size() - src.size() + 1 : 100);
    ring_write_ref(p, seg, k.bad_stag ? l.mr->rkey ^ 0x100 : l.mr->rkey, to,
                   k.unreadable ? hole : src.data(), static_cast<uint32_t>(src.size()));
    if (!k.bad_stag && !k.past_end && !k.unreadable && !k.revoked) {
      for (int i = 0; i < 200 && l.buf[100 + src.size() - 1] != 0x5a; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(std::memcmp(l.buf.data() + 100, src.data(), src.size()), 0);
      EXPECT_EQ(l.buf[99], 0);
      EXPECT_EQ(l.buf[100 + src.size()], 0);
      EXPECT_EQ(l.state(), IBV_QPS_RTS);
      continue;
    }
    if (k.revoked) {
      // As a peer that went away (IB notices on its next send): the connection is gone.
      ASSERT_EQ(l.post_send(3, 8), 0);
      auto wc = l.poll(1);
      ASSERT_EQ(wc.size(), 1u);
      EXPECT_NE(wc[0].status, IBV_WC_SUCCESS);
    }
    EXPECT_TRUE(l.wait_state(IBV_QPS_ERR));
    if (!k.revoked) {
      Terminate t;
      ASSERT_TRUE(ring_terminate(seg, t)) << "no Terminate in the QP's ring";
      if (k.unreadable)
        EXPECT_EQ(t.layer, TermLayer::llp);
      else
        EXPECT_NE(t.layer, TermLayer::llp);
      EXPECT_EQ(std::count(l.buf.begin(), l.buf.end(), 0x5a), 0) << "placed anyway";
    }
  }
  munmap(hole, 65536);
}

}  // namespace
}  // namespace wire_peer
