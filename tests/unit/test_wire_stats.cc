// The statistics file format (wire/stats_file.h): what a writer lays out decodes back, and
// every way a file written by another process can be wrong is refused without reading past
// its end. Also /proc start times (util/proc.h), which tell a live writer from a reused pid.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "util/proc.h"
#include "wire/stats_file.h"

namespace sv::wire {
namespace {

std::vector<std::byte> make_file(uint32_t nslots) {
  std::vector<std::byte> f(kStatsHeaderLen + size_t{nslots} * kSlotSize);
  encode_stats_header(std::span<std::byte, kStatsHeaderLen>(f.data(), kStatsHeaderLen), nslots,
                      4242, 777, "a-very-long-program-name");
  return f;
}

std::byte* slot(std::vector<std::byte>& f, uint32_t i) {
  return f.data() + kStatsHeaderLen + size_t{i} * kSlotSize;
}

void put32(std::byte* p, uint32_t v) {
  std::memcpy(p, &v, 4);
}
void put64(std::byte* p, uint64_t v) {
  std::memcpy(p, &v, 8);
}

TEST(StatsFile, WhatTheWriterLaysOutDecodes) {
  auto f = make_file(4);
  put64(slot(f, 0) + kSlotCounters + 8 * size_t(Ctr::sent_writes), 9);  // destroyed QPs
  std::byte* s = slot(f, 2);                                            // slot 1 stays free
  put32(s + kSlotQpn, 0x1234);
  put32(s + kSlotState, 3);
  put32(s + kSlotType, 2);
  put32(s + kSlotDestQpn, 0x99);
  const uint16_t fam = AF_INET, port = htons(4791);
  std::memcpy(s + kSlotFamily, &fam, 2);
  std::memcpy(s + kSlotPort, &port, 2);
  const uint8_t ip[4] = {127, 0, 0, 2};
  std::memcpy(s + kSlotAddr, ip, 4);
  put64(s + kSlotCounters + 8 * size_t(Ctr::rcvd_bytes), 1u << 20);
  put64(s + kSlotCounters + 8 * (kCtrCount + 10), 1);  // IBV_WC_REM_ACCESS_ERR

  StatsView v;
  ASSERT_EQ(decode_stats(f, v), StatsError::ok);
  EXPECT_EQ(v.pid, 4242u);
  EXPECT_EQ(v.start_time, 777u);
  EXPECT_EQ(v.comm, "a-very-long-pro");  // at most 15 bytes, as /proc/<pid>/comm
  EXPECT_EQ(v.retired.ctr[size_t(Ctr::sent_writes)], 9u);
  ASSERT_EQ(v.qps.size(), 1u);
  const auto& q = v.qps[0];
  EXPECT_EQ(q.qpn, 0x1234u);
  EXPECT_EQ(q.state, 3u);
  EXPECT_EQ(q.qp_type, 2u);
  EXPECT_EQ(q.dest_qpn, 0x99u);
  EXPECT_EQ(q.family, AF_INET);
  EXPECT_EQ(q.port, port);
  EXPECT_EQ(q.addr[3], 2);
  EXPECT_EQ(q.ctr[size_t(Ctr::rcvd_bytes)], 1u << 20);
  EXPECT_EQ(q.wc[10], 1u);
}

TEST(StatsFile, EveryCounterHasAName) {
  for (size_t i = 0; i < kCtrCount; ++i)
    EXPECT_STRNE(ctr_name(static_cast<Ctr>(i)), "?") << "counter " << i;
}

// softverbs-stat prints "key value" pairs: each completion status has one snake_case key,
// its ibv_wc_status name without IBV_ (ibv_wc_status_str's texts have spaces).
TEST(StatsFile, EveryCompletionStatusHasOneSnakeCaseKey) {
  std::set<std::string> seen;
  for (size_t s = 0; s < kWcStatusCount; ++s) {
    const std::string k = wc_status_name(s);
    EXPECT_EQ(k.rfind("wc_", 0), 0u) << k;
    for (char c : k) EXPECT_TRUE(std::islower(static_cast<unsigned char>(c)) || c == '_') << k;
    EXPECT_TRUE(seen.insert(k).second) << "duplicate " << k;
  }
  EXPECT_STREQ(wc_status_name(IBV_WC_SUCCESS), "wc_success");
  EXPECT_STREQ(wc_status_name(IBV_WC_WR_FLUSH_ERR), "wc_wr_flush_err");
  EXPECT_STREQ(wc_status_name(IBV_WC_REM_ACCESS_ERR), "wc_rem_access_err");
  EXPECT_STREQ(wc_status_name(IBV_WC_RNR_RETRY_EXC_ERR), "wc_rnr_retry_exc_err");
  EXPECT_STREQ(wc_status_name(IBV_WC_TM_RNDV_INCOMPLETE), "wc_tm_rndv_incomplete");
  EXPECT_STREQ(wc_status_name(kWcStatusCount), "wc_unknown");
}

TEST(StatsFile, ShortOrForeignFilesAreRefused) {
  auto f = make_file(2);
  StatsView v;
  EXPECT_EQ(decode_stats(std::span(f).first(kStatsHeaderLen - 1), v), StatsError::short_file);
  EXPECT_EQ(decode_stats(std::span(f).first(f.size() - 1), v), StatsError::short_file);
  auto bad = f;
  bad[0] = std::byte{'X'};
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_magic);
  bad = f;
  put32(bad.data() + kHdrVersion, 2);
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_version);
}

// Geometry that would make a reader allocate without bound or read outside the file.
TEST(StatsFile, HostileGeometryIsRefused) {
  auto f = make_file(2);
  StatsView v;
  auto bad = f;
  put32(bad.data() + kHdrNslots, 0);
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_geometry);
  bad = f;
  put32(bad.data() + kHdrNslots, kStatsMaxSlots + 1);
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_geometry);
  bad = f;
  put32(bad.data() + kHdrNslots, 0xFFFFFFFF);
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_geometry);
  bad = f;
  put32(bad.data() + kHdrSlotSize, 8);  // smaller than its own counters
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_geometry);
  bad = f;
  put32(bad.data() + kHdrNcounters, kStatsMaxCounters + 1);
  EXPECT_EQ(decode_stats(bad, v), StatsError::bad_geometry);
  bad = f;
  put32(bad.data() + kHdrHeaderLen, 0xFFFFFFF0);  // header past the end
  EXPECT_EQ(decode_stats(bad, v), StatsError::short_file);
  bad = f;
  put32(bad.data() + kHdrSlotSize, 0x7FFFFFFF);  // slots past the end
  EXPECT_EQ(decode_stats(bad, v), StatsError::short_file);
  EXPECT_TRUE(v.qps.empty());
}

// A newer writer with more counters: the ones this reader knows still decode.
TEST(StatsFile, MoreCountersThanTheReaderKnowsStillDecode) {
  const uint32_t nctr = kCtrCount + 3, nwc = kWcStatusCount;
  const uint32_t slot_size = kSlotCounters + 8 * (nctr + nwc);
  std::vector<std::byte> f(kStatsHeaderLen + 2 * size_t{slot_size});
  encode_stats_header(std::span<std::byte, kStatsHeaderLen>(f.data(), kStatsHeaderLen), 2, 1, 1,
                      "x");
  put32(f.data() + kHdrSlotSize, slot_size);
  put32(f.data() + kHdrNcounters, nctr);
  std::byte* s = f.data() + kStatsHeaderLen + slot_size;
  put32(s + kSlotQpn, 7);
  put64(s + kSlotCounters + 8 * size_t(Ctr::sent_pkts), 5);
  put64(s + kSlotCounters + 8 * size_t{nctr}, 11);  // wc[0], after all nctr counters
  StatsView v;
  ASSERT_EQ(decode_stats(f, v), StatsError::ok);
  ASSERT_EQ(v.qps.size(), 1u);
  EXPECT_EQ(v.qps[0].ctr[size_t(Ctr::sent_pkts)], 5u);
  EXPECT_EQ(v.qps[0].wc[0], 11u);
}

TEST(ProcStartTime, MatchesField22OfProcSelfStat) {
  std::ifstream in("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) rest >> field;  // fields 3..22 after the comm
  EXPECT_EQ(sv::proc_start_time(getpid()), std::stoull(field));
  EXPECT_EQ(sv::proc_start_time(0x7FFFFFF0), 0u);  // no such process
}

}  // namespace
}  // namespace sv::wire
