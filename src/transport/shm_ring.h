// A single-producer, single-consumer byte ring in memory shared by two processes on one host
// (issue 29): the FPDU stream of one direction of a connection, carried as TCP would carry it,
// without the kernel. Pure functions over memory: no system calls, no threads, so it can be
// unit-tested and fuzzed.
//
// The peer process can write any byte of the shared mapping at any time, control words
// included. So each side keeps its own index privately and only publishes it; the peer's
// index is read, checked (the producer can never be more than a ring ahead of the consumer),
// and a ring found inconsistent is reported as corrupt, never followed. Payload bytes are
// copied out before anyone parses them (the FPDU parser copies headers into its own buffer),
// so a peer rewriting them meanwhile changes only data it could have sent anyway.
//
// Doorbells: a consumer that sleeps (in epoll, on the connection's TCP socket) must be told
// that bytes arrived. `want_bell` is the consumer's "wake me"; `bell_pending` coalesces the
// wake-ups, so a burst costs one. The producer rings (sends a byte on the socket) only when
// both say so: written() returns true. The consumer clears bell_pending before it looks at
// the ring, so bytes written after its look bring a new bell. `want_space` is the reverse: a
// producer that found the ring full asks the consumer to ring it once it has taken bytes.
#pragma once
#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace sv::transport {

// Control words of one ring, each written by one side, on its own cache line.
struct alignas(64) ShmRingCtrl {
  alignas(64) uint64_t tail;        // producer: bytes written, ever
  alignas(64) uint64_t head;        // consumer: bytes taken, ever
  uint32_t placed;                  // consumer: the peer's messages it placed (its ack count)
  alignas(64) uint32_t want_bell;   // consumer: 1 = ring me when bytes arrive
  uint32_t bell_pending;            // producer sets, consumer clears: a bell is on its way
  alignas(64) uint32_t want_space;  // producer: 1 = ring me when room is made
  uint32_t revoked;                 // producer: 1 = what its segments by reference name may
                                    // have been reused (its QP failed or went away)
};
static_assert(sizeof(ShmRingCtrl) == 256);

// The layout of a connection's shared segment: a header page, then one ring per direction.
// Ring 0 carries the offering side's bytes (the TCP initiator's), ring 1 the other side's.
struct ShmLayout {
  static constexpr uint64_t kMagic = 0x315645524d485356ull;  // "SVSHMRE1" little-endian
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kMinRing = 4096;
  static constexpr size_t kMaxRing = 16u << 20;
  // Total bytes for two rings of ring_bytes (a power of two, kMinRing..kMaxRing); 0 if invalid.
  static size_t segment_bytes(size_t ring_bytes);
  static size_t ctrl_offset(int ring, size_t ring_bytes);
  static size_t data_offset(int ring, size_t ring_bytes);
};

// The header page's first words: what the offering side wrote, checked by the other side.
struct ShmHeader {
  uint64_t magic;
  uint64_t nonce;       // a random value also sent in the offer: proves the segment is the one
  uint64_t ring_bytes;  // data bytes per ring
  // A random value each side writes (0: the initiator, 1: the other) and then reads through
  // the peer's mapping with process_vm_readv: proves the peer's pid maps this very segment and
  // that the kernel lets us read its memory (engine/qp_shm.cc).
  uint64_t challenge[2];
};

class ShmProducer {
 public:
  ShmProducer() = default;
  ShmProducer(ShmRingCtrl* ctrl, std::byte* data, size_t cap);
  // Copies as much of iov[0..n) as fits; returns bytes written (0: full), or -1 if the peer
  // corrupted the ring (its head went backwards or past ours).
  long writev(const iovec* iov, size_t n);
  // After bytes were written: true if the consumer must be rung now (this call took the
  // bell: later writes do not ring until the consumer clears it).
  bool bell_due();
  // The ring was full: ask for a bell when room is made. Returns true if room appeared in
  // the meantime (the caller writes again rather than waits).
  bool wait_for_space();
  // Whether there is room now (a seq_cst load: a flag stored before it is visible to
  // whoever frees room and then looks at it).
  bool has_room() const;
  size_t capacity() const { return cap_; }
  uint64_t tail() const { return tail_; }
  std::byte* data() const { return data_; }
  // The consumer has taken everything we wrote: no byte of the data area is wanted (the
  // owner may give its pages back; the next writes refault them).
  bool drained() const;
  // The consumer's count of our messages it has placed (ShmConsumer::publish_placed), which
  // it may write at any time: a hint for our completer, never an index.
  uint32_t peer_placed() const;
  // What our segments by reference name may be reused from now on (seq_cst, before the WRs
  // that own it complete): the consumer checks after each read (ShmConsumer::revoked).
  void revoke();

 private:
  ShmRingCtrl* c_ = nullptr;
  std::byte* data_ = nullptr;
  size_t cap_ = 0;
  uint64_t tail_ = 0;
  // The consumer's head as we last read it (checked then): its line is written by the other
  // core at every read, so a write that fits in the room it left does not read it again.
  uint64_t head_seen_ = 0;
};

class ShmConsumer {
 public:
  ShmConsumer() = default;
  ShmConsumer(ShmRingCtrl* ctrl, std::byte* data, size_t cap);
  // Copies up to the iovecs' total of what is there; returns bytes taken (0: empty), or -1
  // if the peer corrupted the ring (its tail more than a ring ahead of our head, or behind).
  long readv(const iovec* iov, size_t n);
  // Bytes readable now; -1 if the ring is corrupt.
  long available() const;
  // Consumer side of the bells. set_want_bell(true) is a seq_cst store: a caller then looks
  // at the ring, and whatever the producer wrote before seeing the flag is there.
  void set_want_bell(bool on);
  // Clears bell_pending (a bell was taken off the socket); seq_cst as above.
  void bell_taken();
  bool bell_pending() const;
  // After bytes were taken: true if the producer asked to be rung for room (this call took it).
  bool space_bell_due();
  uint64_t head() const { return head_; }
  void publish_placed(uint32_t n);
  // Whether the producer revoked its references (seq_cst: after a read of what one names, a
  // false here means the read came before the producer's revoke, so before any reuse).
  bool revoked() const;

 private:
  ShmRingCtrl* c_ = nullptr;
  const std::byte* data_ = nullptr;
  size_t cap_ = 0;
  uint64_t head_ = 0;
};

}  // namespace sv::transport
