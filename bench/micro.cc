// Micro-benchmarks of the per-byte and per-segment work on the data path (Google Benchmark):
// the MPA CRC, DDP/RDMAP header framing and parsing, the RDS header, and the STag lookup that
// every placement does, and an SRQ post among many QPs. Throughput figures (bytes/s, items/s) come
// with the hardware CRC beside the portable one, so each run carries its own anchor. Not a test:
// nothing here fails.
//   build/bin/sv_micro_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "engine/mr.h"
#include "engine/qp.h"
#include "wire/crc32c.h"
#include "wire/ddp_rdmap.h"
#include "wire/rds_hdr.h"

namespace {

using sv::wire::RdmapOpcode;

void BM_Crc32c(benchmark::State& st) {
  std::vector<std::byte> buf(static_cast<size_t>(st.range(0)), std::byte{0x5a});
  for (auto _ : st) benchmark::DoNotOptimize(sv::wire::crc32c(buf.data(), buf.size()));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * st.range(0));
  st.SetLabel(sv::wire::crc32c_hw_available() ? "sse4.2" : "table");
}
BENCHMARK(BM_Crc32c)->Arg(64)->Arg(4096)->Arg(65536);

// The anchor: the portable slicing table.
void BM_Crc32cPortable(benchmark::State& st) {
  std::vector<std::byte> buf(static_cast<size_t>(st.range(0)), std::byte{0x5a});
  for (auto _ : st)
    benchmark::DoNotOptimize(
        sv::wire::crc32c_update_sw(sv::wire::kCrc32cInit, buf.data(), buf.size()));
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * st.range(0));
}
BENCHMARK(BM_Crc32cPortable)->Arg(64)->Arg(4096)->Arg(65536);

// One tagged (RDMA Write) and one untagged (Send) segment header: encode, then parse it back
// as iw_rx does (ddp_header_len, ddp_decode).
void BM_FpduHeaderRoundTrip(benchmark::State& st) {
  std::array<std::byte, 64> b{};
  uint32_t i = 0;
  for (auto _ : st) {
    const bool tagged = (++i & 1) != 0;
    const size_t hl =
        tagged ? sv::wire::encode_tagged(b.data(), RdmapOpcode::rdma_write, true, 0x1234u << 8,
                                         0x1000u + i)
               : sv::wire::encode_untagged(b.data(), RdmapOpcode::send, true, 0, 0, i, 0);
    sv::wire::DdpSegment seg;
    const size_t need = sv::wire::ddp_header_len(std::span<const std::byte, 2>(b.data(), 2));
    auto e = sv::wire::ddp_decode(std::span<const std::byte>(b.data(), need),
                                  static_cast<uint16_t>(hl + 1024), seg);
    benchmark::DoNotOptimize(e);
    benchmark::DoNotOptimize(seg);
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()));
}
BENCHMARK(BM_FpduHeaderRoundTrip);

// The 48-byte RDS header with an RDMA extension: encode (checksummed), verify, decode.
void BM_RdsHeaderRoundTrip(benchmark::State& st) {
  std::array<std::byte, sv::wire::kRdsHeaderLen> b{};
  sv::wire::RdsHeader h;
  h.len = 4096;
  h.sport = 4000;
  h.dport = 4001;
  h.ext_rdma_rkey = 0xabcd1234u;
  for (auto _ : st) {
    ++h.sequence;
    h.ack = h.sequence - 1;
    sv::wire::rds_encode(h, b.data());
    sv::wire::RdsHeader out;
    const bool ok = sv::wire::rds_csum_ok(b.data()) && sv::wire::rds_decode(b.data(), out);
    benchmark::DoNotOptimize(ok);
    benchmark::DoNotOptimize(out);
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()));
}
BENCHMARK(BM_RdsHeaderRoundTrip);

// STag -> region check, as every tagged placement and Read Response does, with `range`
// regions registered (the lookup is one array index whatever the count).
void BM_MrLookup(benchmark::State& st) {
  using namespace sv::engine;
  auto& kt = KeyTable::get();
  Pd pd{};
  const auto n = static_cast<size_t>(st.range(0));
  std::vector<Mr> mrs(n);
  static std::array<std::byte, 1 << 16> mem{};
  for (auto& m : mrs) {
    m.pd = &pd;
    m.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    m.iova = 0;
    m.mr.addr = mem.data();
    m.mr.length = mem.size();
    if (!kt.add(&m)) st.SkipWithError("key table full");
  }
  size_t i = 0;
  for (auto _ : st) {
    std::byte* p = nullptr;
    auto g = kt.read_guard();
    const auto r =
        kt.check(mrs[i++ % n].mr.rkey, &pd, 512, 4096, IBV_ACCESS_REMOTE_WRITE, true, &p);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(p);
  }
  for (auto& m : mrs) (void)kt.remove(&m);  // no windows bound
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()));
}
BENCHMARK(BM_MrLookup)->Arg(1)->Arg(1024)->Arg(16384);

// The lkey check of every post and receive: arg 1, KeyTable::check_local (a thread's last
// pass, remembered: no lock while no region goes or changes); arg 0, the anchor, the same
// check under the table's shared lock, as every check took before. With 2 threads both check
// at once (a poster and the progress thread), and the locked check's lock word bounces.
void BM_LocalKeyCheck(benchmark::State& st) {
  using namespace sv::engine;
  auto& kt = KeyTable::get();
  static Pd pd{};
  static Mr mr{};
  static std::array<std::byte, 1 << 16> mem{};
  if (st.thread_index() == 0) {
    mr.pd = &pd;
    mr.access = IBV_ACCESS_LOCAL_WRITE;
    mr.mr.addr = mem.data();
    mr.mr.length = mem.size();
    if (!kt.add(&mr)) st.SkipWithError("key table full");
  }
  const bool remembered = st.range(0) != 0;
  const auto addr = reinterpret_cast<uint64_t>(mem.data()) + 512;
  for (auto _ : st) {
    std::byte* p = nullptr;
    AccessResult r;
    if (remembered) {
      r = kt.check_local(mr.mr.lkey, &pd, addr, 8, IBV_ACCESS_LOCAL_WRITE, &p);
    } else {
      auto g = kt.read_guard();
      r = kt.check(mr.mr.lkey, &pd, addr, 8, IBV_ACCESS_LOCAL_WRITE, false, &p);
    }
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(p);
  }
  if (st.thread_index() == 0) (void)kt.remove(&mr);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()));
}
BENCHMARK(BM_LocalKeyCheck)->Arg(0)->Arg(1)->Threads(1)->Threads(2);

// A receive posted to an SRQ shared by `range` QPs, as RDS reposts one buffer per message to
// the SRQ all its connections share. Arg 1 (the anchor, what every post cost before): the SRQ
// marked as if a QP had stalled, so the post visits every QP to restart the stalled ones;
// arg 0: no QP stalled since the last post, the steady state, no visit (srq_mark_stalled).
void BM_SrqPost(benchmark::State& st) {
  using namespace sv::engine;
  const auto n = static_cast<size_t>(st.range(0));
  const bool visit = st.range(1) != 0;
  Srq srq;
  srq.max_wr = 64;
  srq.max_sge = 1;
  srq.ring.resize(srq.max_wr);
  srq.sge.resize(srq.max_wr);
  for (uint32_t i = 0; i < srq.max_wr; ++i) srq.ring[i].sge = &srq.sge[i];
  std::vector<std::unique_ptr<Qp>> qps;
  for (size_t i = 0; i < n; ++i) {
    qps.push_back(std::make_unique<Qp>());
    srq.qps.push_back(qps.back().get());
  }
  ibv_sge sge{0x1000, 4096, 1};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  for (auto _ : st) {
    if (visit) srq.maybe_stalled.store(true, std::memory_order_relaxed);
    ibv_recv_wr* bad = nullptr;
    benchmark::DoNotOptimize(srq_post_recv(&srq, &wr, &bad));
    srq.count = 0;  // taken at once, as the connections' receives take them
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()));
}
BENCHMARK(BM_SrqPost)->ArgsProduct({{1, 1024, 8192}, {0, 1}});

}  // namespace

BENCHMARK_MAIN();
