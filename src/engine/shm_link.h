// Shared-memory transport of one RC connection between softverbs peers on one host
// (issue 29; qp_shm.cc). The TCP connection is made and its MPA handshake done as always;
// then, in order on that stream, the initiator offers a segment (wire::ShmCtrl), the
// responder accepts or declines, and the initiator confirms with a switch. From its accept
// (responder) or switch (initiator) on, each side writes its FPDUs into its ring instead of
// the socket, and reads the peer's from the peer's ring after the peer's accept or switch:
// the same FPDUs, the same parser, the same checks (STag, bounds, rights, IRD/ORD, the
// completion rule) as on TCP. The socket stays for liveness (EOF, reset, the peer's death)
// and carries only doorbell bytes (transport/shm_ring.h).
//
// The segment is a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) the responder
// opens as /proc/<pid>/fd/<fd>: it proves both processes share a host and a PID namespace
// (with the nonce in its header), the kernel refuses other users (ptrace access mode), and
// the seals mean the peer can never shrink it under our mapping (SIGBUS). Anything that
// fails leaves the connection on TCP.
#pragma once
#include <cstddef>
#include <cstdint>

#include "transport/shm_ring.h"

namespace sv::engine {

struct ShmLink {
  int memfd = -1;  // initiator: open until the responder has answered
  void* base = nullptr;
  size_t len = 0;
  uint64_t nonce = 0;
  uint32_t ring_bytes = 0;
  bool initiator = false;
  // One copy for large Writes and Read Responses (kDdpSvRef): the receiver reads the data
  // from the sender's memory (process_vm_readv) instead of both copying it through a ring.
  // Set during the set-up, before either side moves to the rings; fixed after it.
  uint32_t peer_pid = 0;    // the peer process, as its offer or accept names it
  uint64_t peer_base = 0;   // where its mapping of the segment starts
  uint64_t challenge = 0;   // what we wrote into the header, read back through it with data
  bool we_pull = false;     // we read our challenge through its mapping: we take its references
  bool peer_pulls = false;  // the peer read its own through ours: we send it references
  // The peer keeps its count of our messages it placed in the segment (ShmRingCtrl::placed):
  // during an RNR stall our WRs complete on it (a softverbs build before it did not).
  bool peer_publishes_placed = false;
  transport::ShmProducer tx;
  transport::ShmConsumer rx;

  ShmLink() = default;
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;
  ~ShmLink();
  void close_memfd();
};

}  // namespace sv::engine
