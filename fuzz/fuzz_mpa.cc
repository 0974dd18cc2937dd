// libFuzzer target for the passive side of the MPA handshake (engine/iw_cm.cc Endpoint, RFC
// 5044 §7.1, RFC 6581): what a connecting peer sends before its first FPDU, read from a
// socket in whatever pieces it arrives, its private data decoded as the out-of-band
// OobHeader, then answered with a Reply (accept) or a rejecting Reply.
//
// Input: byte 0 (bit 0: accept, else reject; bit 1: we want CRC; bit 2: p2p) then the
// bytes the peer writes, ended with EOF. Everything runs on the engine's progress thread,
// as a listener's accept would.
//
// Beyond "no crash, no sanitizer report" it traps when:
//  - on_done is not called exactly once (an endpoint left behind, or finished twice);
//  - a Request is reported that is not a prefix of what the peer sent, or is not one;
//  - our Reply does not decode, has another revision than the Request, grants an ORD above
//    the initiator's IRD (RFC 6581 §5), or an accept and a reject disagree with the choice;
//  - an OobHeader decodes from data that does not start with its magic, or re-encodes to
//    other bytes.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/iw_cm.h"
#include "engine/progress.h"
#include "fuzz_check.h"
#include "wire/be.h"
#include "wire/mpa.h"

using namespace sv::engine;
namespace wire = sv::wire;

namespace {

struct Run {
  bool accept = false;
  uint8_t cfg = 0;
  int requests = 0;
  int dones = 0;
  int err = 0;
  wire::MpaFrame req{};
  std::vector<std::byte> req_bytes;
};

void check_oob(const std::vector<std::byte>& pd) {
  OobHeader h;
  if (!OobHeader::decode(pd, h)) return;
  FUZZ_CHECK(pd.size() >= 12 && wire::load_be32(pd.data()) == OobHeader::kMagic);
  // Re-encoded, the header is the input's first 16 bytes; an older initiator's 12-byte one
  // (no flags word) reads as flags 0.
  const auto back = h.encode();
  const size_t n = pd.size() >= back.size() ? back.size() : 12;
  FUZZ_CHECK(std::memcmp(back.data(), pd.data(), n) == 0);
  if (pd.size() < back.size()) FUZZ_CHECK(h.flags == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Run run;
  run.cfg = data[0];
  run.accept = run.cfg & 1;
  const auto* in = reinterpret_cast<const std::byte*>(data + 1);
  const size_t n = size - 1;
  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  const int big = 1 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);

  Progress::get().run_sync([&] {
    auto on_request = [&run](Endpoint* ep) {
      ++run.requests;
      run.req = ep->request();
      run.req_bytes = ep->request_bytes();
      check_oob(ep->outcome().peer_pdata);
      if (run.accept) {
        MpaOffer o;
        o.crc = run.cfg & 2;
        o.ird = 8;
        o.ord = 16;
        o.p2p = run.cfg & 4;
        o.pdata.assign(4, std::byte{0x5A});
        ep->accept(std::move(o));
      } else {
        ep->reject(std::vector<std::byte>(3, std::byte{0xA5}));
      }
    };
    auto on_done = [&run](Endpoint* ep, int err) {
      ++run.dones;
      run.err = err;
      ep->dispose();
    };
    Endpoint* ep = Endpoint::passive(sv[0], on_request, on_done);
    size_t off = 0;
    while (off < n) {
      const ssize_t k = send(sv[1], in + off, n - off, MSG_NOSIGNAL);
      FUZZ_CHECK(k > 0);
      off += static_cast<size_t>(k);
    }
    shutdown(sv[1], SHUT_WR);
    // The listener's progress thread would be woken for this; here we call it in.
    for (int i = 0; i < 4 && run.requests == 0 && run.dones == 0; ++i) ep->on_event(EPOLLIN);
  });
  // accept/reject post their work: it has run once this returns (the queue is FIFO).
  Progress::get().run_sync([] {});

  FUZZ_CHECK(run.dones == 1);
  FUZZ_CHECK(run.requests <= 1);
  if (run.requests == 0) {
    FUZZ_CHECK(run.err != 0);
    close(sv[1]);
    return 0;
  }
  // The Request is exactly the peer's first bytes and decodes as one.
  FUZZ_CHECK(run.req_bytes.size() <= n &&
             std::memcmp(run.req_bytes.data(), in, run.req_bytes.size()) == 0);
  wire::MpaFrame again;
  FUZZ_CHECK(wire::mpa_decode(run.req_bytes, wire::MpaKind::request, wire::kMpaRfcMaxPrivData,
                              again) == wire::MpaError::ok);

  // Our answer, if any (a Request with markers is refused whatever we chose, as siw does).
  std::vector<std::byte> reply(wire::kMpaHeaderLen + wire::kMpaRfcMaxPrivData + 64);
  const ssize_t got = recv(sv[1], reply.data(), reply.size(), MSG_DONTWAIT);
  close(sv[1]);
  if (got <= 0) {
    FUZZ_CHECK(run.err != 0);  // nothing written only when the connection failed
    return 0;
  }
  reply.resize(static_cast<size_t>(got));
  wire::MpaFrame rep;
  FUZZ_CHECK(wire::mpa_decode(reply, wire::MpaKind::reply, wire::kMpaRfcMaxPrivData, rep) ==
             wire::MpaError::ok);
  FUZZ_CHECK(rep.rev == run.req.rev);
  if (run.req.markers || !run.accept) {
    FUZZ_CHECK(rep.reject && run.err != 0);
    return 0;
  }
  FUZZ_CHECK(!rep.reject && run.err == 0);
  if (run.req.rev == 2 && run.req.enhanced) FUZZ_CHECK(rep.v2.ord <= run.req.v2.ird);
  return 0;
}
