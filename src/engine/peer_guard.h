// Repeated protection errors from one peer address. Guessing an STag costs the guesser its
// connection (Terminate, QP error, RFC 5040 §7), but it can reconnect at once, and each try
// costs us an accept, an MPA handshake and a QP set-up. So each peer address (not port: a
// guesser reconnects from new ports) has a token bucket: kBurst protection errors, then one
// every 1/rate seconds; while its bucket is empty its new connections are refused at
// accept, before any handshake. With random 20-bit key slots (mr.h) a guess then costs days.
//
// SOFTVERBS_PROT_ERR_BURST and SOFTVERBS_PROT_ERR_PER_SEC override the defaults (32, 4/s).
// On a shared host all local processes share 127.0.0.1: one that keeps guessing slows
// other local peers' connections too (docs/security.md, "Guessing keys").
#pragma once
#include <array>
#include <cstdint>

#include "transport/tcp.h"

namespace sv::engine::peer_guard {

// A peer's address alone (no port: a peer reconnects from new ports), IPv4 as its
// IPv4-mapped IPv6 form so both spellings are one peer.
using AddrKey = std::array<uint8_t, 16>;
AddrKey addr_key(const transport::SockAddr& a);

// A QP of ours ended on a protection error caused by this peer (remote access error).
void protection_error(const transport::SockAddr& peer);
// May this peer connect now? False while its bucket is empty (the caller refuses it).
bool admit(const transport::SockAddr& peer);

}  // namespace sv::engine::peer_guard
