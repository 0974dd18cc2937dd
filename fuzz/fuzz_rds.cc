// libFuzzer target for what RDS parses from peers and from other users' files: the RDS
// header (checksum, extensions), RDMA channel fences, directory lookups' private data, reassembly
// of fragments into messages and the congestion map (src/wire/rds_rx.h), the connection private
// data, registry entries and names, and info/ snapshots (src/wire/rds_hdr.h, src/wire/rds_files.h).
// The first byte picks the parser.
//
// Beyond "no crash, no ASan/UBSan report", it traps on broken invariants:
//  - a header re-encoded from what decoded has a good checksum and decodes to the same
//    fields; one bit flipped in it (outside h_csum) fails the checksum;
//  - private data that decodes re-encodes to bytes that decode the same, and a fence that
//    decodes re-encodes to its own bytes;
//  - a registry entry that parses formats back to the same text (modulo its newline), a
//    registry hello that decodes re-encodes to its bytes and is believed only with its own
//    thread and token in the table's words, and
//    a registry socket name yields a port only when it has the prefix asked for, and a
//    sock_diag answer never more names than asked for;
//  - records taken from a snapshot are whole records, never more bytes than it has;
//  - reassembly never holds more than the message size it was told (itself bounded by the
//    limit), delivers each message whole with exactly the bytes of its fragments, never a
//    sequence twice or out of order, and never believes an ack beyond what was sent;
//  - a congestion update frees only ports that were congested.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "wire/rds_files.h"
#include "wire/rds_hdr.h"
#include "wire/rds_rx.h"
#include "wire/unix_diag.h"

using namespace sv::wire;

namespace {

bool same_header(const RdsHeader& a, const RdsHeader& b) {
  return a.sequence == b.sequence && a.ack == b.ack && a.len == b.len && a.sport == b.sport &&
         a.dport == b.dport && a.flags == b.flags && a.credit == b.credit &&
         a.ext_rdma_rkey == b.ext_rdma_rkey && a.ext_rdma_dest == b.ext_rdma_dest &&
         a.ext_fenced == b.ext_fenced && a.ext_mr_base_req == b.ext_mr_base_req &&
         a.ext_mr_base == b.ext_mr_base;
}

void header(const std::byte* d, size_t n) {
  if (n < kRdsHeaderLen) return;
  (void)rds_csum_ok(d);
  RdsHeader h;
  (void)rds_decode(d, h);
  std::byte out[kRdsHeaderLen];
  rds_encode(h, out);
  FUZZ_CHECK(rds_csum_ok(out));
  RdsHeader again;
  FUZZ_CHECK(rds_decode(out, again));
  // Whatever set of extensions decoded fits the 16 bytes again: the encoder writes each once,
  // in a fixed order, and the decoder took each from those same 16 bytes.
  FUZZ_CHECK(same_header(h, again));
  if (n > kRdsHeaderLen) {
    const size_t bit = static_cast<uint8_t>(d[kRdsHeaderLen]) % (kRdsHeaderLen * 8);
    if (bit / 8 != kRdsCsumOffset && bit / 8 != kRdsCsumOffset + 1) {
      out[bit / 8] ^= std::byte(1u << (bit % 8));
      FUZZ_CHECK(!rds_csum_ok(out));
    }
  }
}

// A fence from a peer's RDMA channel: one that decodes re-encodes to the same bytes.
void fence(const std::byte* d, size_t n) {
  RdsFence f;
  if (!rds_fence_decode(d, n, f)) return;
  FUZZ_CHECK(n == kRdsFenceLen && f.sequence != 0);
  std::byte out[kRdsFenceLen];
  rds_fence_encode(f, out);
  FUZZ_CHECK(std::memcmp(out, d, kRdsFenceLen) == 0);
}

// The same bytes as connection private data and as a fence (both rdma_cm/RDMA channel control).
void conn_priv(const std::byte* d, size_t n) {
  fence(d, n);
  RdsConnPriv p;
  if (!rds_conn_priv_decode(d, n, p)) return;
  std::byte out[kRdsConnPrivLen];
  rds_conn_priv_encode(p, out);
  RdsConnPriv q;
  FUZZ_CHECK(rds_conn_priv_decode(out, sizeof out, q));
  FUZZ_CHECK(p.ip == q.ip && p.cm_port == q.cm_port && p.kind == q.kind && p.flags == q.flags &&
             p.ack_seq == q.ack_seq && p.gen == q.gen);
}

void registry_entry(const std::byte* d, size_t n) {
  const std::string_view s(reinterpret_cast<const char*>(d), n);
  uint16_t port = 0;
  uint64_t gen = 0;
  if (!registry_entry_parse(s, port, gen)) return;
  FUZZ_CHECK(port != 0);
  const std::string back = registry_entry_format(port, gen);
  uint16_t p2 = 0;
  uint64_t g2 = 0;
  FUZZ_CHECK(registry_entry_parse(back, p2, g2) && p2 == port && g2 == gen);
}

// A /proc/net/unix path: a port only for "<prefix><number>", and it names the same socket.
void registry_path(const std::string_view s) {
  const std::string prefix = registry_name_prefix("host", "127.0.0.1");
  const uint16_t port = registry_name_port(s, prefix);
  if (!port) return;
  FUZZ_CHECK(s.substr(0, prefix.size()) == prefix);
  FUZZ_CHECK(registry_name_port(registry_name("host", "127.0.0.1", port), prefix) == port);
}

// A sock_diag answer: never more names than asked for, none longer than a unix name, and
// the parser never reads past the buffer (ASan). Copied so that the headers are aligned.
void unix_diag(const std::byte* d, size_t n) {
  std::vector<std::byte> buf(d, d + n);
  std::vector<UnixSocketName> out;
  parse_unix_diag(buf.data(), buf.size(), out, 8);
  FUZZ_CHECK(out.size() <= 8);
  for (const auto& s : out) FUZZ_CHECK(!s.name.empty() && s.name.size() <= 108);
}

// A process name: an entry only for "<prefix><port>_<gen>", and it names the same entry.
// A registry hello from a port's owner (another process, maybe another user's): one that
// decodes names a slot of the table, a thread id and a token, and re-encodes to its own bytes;
// the table's words taken from the bytes that follow it say "held" only for that thread, alive,
// and that token.
void registry_hello(const std::byte* d, size_t n) {
  RegistryHello h;
  if (!registry_hello_decode(d, std::min(n, kRegistryHelloLen), h)) return;
  FUZZ_CHECK(h.slot < kLiveSlots && h.tid != 0 && h.token != 0);
  std::byte out[kRegistryHelloLen];
  registry_hello_encode(h, out);
  FUZZ_CHECK(std::memcmp(out, d, kRegistryHelloLen) == 0);
  if (n < kRegistryHelloLen + 12) return;
  uint32_t lock;
  uint64_t slot;
  std::memcpy(&lock, d + kRegistryHelloLen, 4);
  std::memcpy(&slot, d + kRegistryHelloLen + 4, 8);
  if (registry_live(lock, slot, h))
    FUZZ_CHECK(!(lock & kFutexOwnerDied) && (lock & kFutexTidMask) == h.tid && slot == h.token);
}

void registry_proc(const std::string_view s) {
  const std::string prefix = registry_proc_prefix("host", 42);
  uint16_t cm = 0;
  uint64_t gen = 0;
  if (!registry_proc_parse(s, prefix, cm, gen)) return;
  FUZZ_CHECK(cm != 0 && s.substr(0, prefix.size()) == prefix);
  uint16_t cm2 = 0;
  uint64_t gen2 = 0;
  FUZZ_CHECK(registry_proc_parse(registry_proc_name("host", 42, cm, gen), prefix, cm2, gen2) &&
             cm2 == cm && gen2 == gen);
}

void snapshot(const std::byte* d, size_t n) {
  if (n < 5) return;
  int32_t id, each;
  std::memcpy(&id, d, 4);
  each = static_cast<uint8_t>(d[4]) % 64;
  const std::string_view blob(reinterpret_cast<const char*>(d + 5), n - 5);
  std::vector<char> out;
  const bool ok = info_blob_records(blob, id, each, out);
  FUZZ_CHECK(out.size() <= blob.size());
  if (!out.empty()) FUZZ_CHECK(each > 0 && out.size() % static_cast<size_t>(each) == 0);
  (void)ok;
  InfoMeta m;
  (void)info_meta_parse(blob, m);
  std::vector<char> counters;
  std::vector<uint64_t> folded;
  if (info_retired_parse(blob, id, each ? each : 1, counters, folded) && id != kInfoFolded)
    FUZZ_CHECK(folded.size() <= kInfoFoldedMax &&
               counters.size() + folded.size() * 8 <= blob.size());
}

void dir_priv(const std::byte* d, size_t n) {
  RdsDirPriv p;
  if (!rds_dir_priv_decode(d, n, p)) {
    FUZZ_CHECK(n < kRdsDirPrivLen || load_be32(d) != kRdsDirMagic);
    return;
  }
  std::byte out[kRdsDirPrivLen];
  rds_dir_priv_encode(p, out);
  RdsDirPriv q;
  FUZZ_CHECK(rds_dir_priv_decode(out, sizeof out, q));
  FUZZ_CHECK(p.ip == q.ip && p.port == q.port && p.cm_port == q.cm_port && p.gen == q.gen);
}

// Input: max_len exponent, next_tx_seq (be64), then fragments as be16 length + bytes.
void reassembly(const std::byte* d, size_t n) {
  if (n < 9) return;
  const RdsRxLimits lim{load_be64(d + 1), 1u << (static_cast<uint8_t>(d[0]) % 21), 1ull << 32};
  RdsRx rx;
  std::vector<std::byte> acc;  // the current message's chunks, as fed
  uint64_t last_delivered = 0;
  size_t at = 9;
  while (at + 2 <= n) {
    size_t len = load_be16(d + at) % (kRdsHeaderLen + 4097);
    at += 2;
    len = std::min(len, n - at);
    const std::byte* f = d + at;
    at += len;
    const bool starts = !rx.in_msg;
    const uint64_t next_before = rx.next_seq;
    RdsHeader h;
    const RdsFrag v = rds_rx_frag(rx, f, len, lim, h);
    FUZZ_CHECK(rx.next_seq >= next_before);
    if (v == RdsFrag::bad_ack) FUZZ_CHECK(h.ack >= lim.next_tx_seq);
    if (v > RdsFrag::bad_csum) FUZZ_CHECK(v == RdsFrag::bad_ack || h.ack < lim.next_tx_seq);
    if (rds_frag_fatal(v)) break;  // the connection drops
    if (v == RdsFrag::cong_map || v == RdsFrag::ack_only) continue;
    if (starts) acc.clear();
    acc.insert(acc.end(), f + kRdsHeaderLen, f + len);
    FUZZ_CHECK(rx.cur.len <= lim.max_len);
    if (v == RdsFrag::more) {
      FUZZ_CHECK(rx.in_msg && rx.have < rx.cur.len && rx.data.size() == rx.cur.len);
      FUZZ_CHECK(acc.size() == rx.have);
      continue;
    }
    FUZZ_CHECK(!rx.in_msg && rx.data.size() == rx.cur.len && acc.size() == rx.cur.len);
    FUZZ_CHECK(std::equal(acc.begin(), acc.end(), rx.data.begin()));
    if (v == RdsFrag::duplicate) {
      FUZZ_CHECK(rx.cur.sequence < next_before);
    } else {
      FUZZ_CHECK(v == RdsFrag::message && rx.cur.sequence >= next_before);
      FUZZ_CHECK(rx.cur.sequence > last_delivered && rx.next_seq == rx.cur.sequence + 1);
      FUZZ_CHECK(rx.cur.sequence - next_before < lim.window);
      last_delivered = rx.cur.sequence;
    }
    rx.data = {};
  }
}

// Input: the map we hold (its length picks "none yet" when short), then the update.
void cong_map(const std::byte* d, size_t n) {
  std::vector<uint8_t> have;
  if (n >= kRdsCongMapBytes)
    have.assign(reinterpret_cast<const uint8_t*>(d),
                reinterpret_cast<const uint8_t*>(d) + kRdsCongMapBytes);
  const std::vector<uint8_t> before = have;
  const std::byte* upd = n >= kRdsCongMapBytes ? d + kRdsCongMapBytes : d;
  const size_t ulen = n >= kRdsCongMapBytes ? n - kRdsCongMapBytes : n;
  const uint64_t freed = rds_cong_update(have, upd, ulen);
  if (ulen != kRdsCongMapBytes) {
    FUZZ_CHECK(freed == 0 && have == before);
    return;
  }
  FUZZ_CHECK(std::memcmp(have.data(), upd, kRdsCongMapBytes) == 0);
  // Every freed group has a port that was congested in `before` and is free now.
  for (unsigned g = 0; g < 64; ++g) {
    if (!(freed & (1ull << g))) continue;
    bool found = false;
    for (size_t port = g; port < kRdsCongMapBytes * 8 && !found; port += 64) {
      const bool was = !before.empty() && (before[port / 8] & (1u << (port % 8)));
      found = was && !(have[port / 8] & (1u << (port % 8)));
    }
    FUZZ_CHECK(found);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto* d = reinterpret_cast<const std::byte*>(data + 1);
  const size_t n = size - 1;
  switch (data[0] % 7) {
    case 0:
      header(d, n);
      break;
    case 1:
      conn_priv(d, n);
      break;
    case 2:
      registry_entry(d, n);
      registry_hello(d, n);
      registry_path(std::string_view(reinterpret_cast<const char*>(d), n));
      registry_proc(std::string_view(reinterpret_cast<const char*>(d), n));
      unix_diag(d, n);
      break;
    case 3:
      snapshot(d, n);
      break;
    case 4:
      reassembly(d, n);
      break;
    case 5:
      cong_map(d, n);
      break;
    default:
      dir_priv(d, n);
      break;
  }
  return 0;
}
