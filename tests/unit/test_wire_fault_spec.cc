// SOFTVERBS_FAULT's grammar (wire/fault_spec.h): what it takes, and that every malformed
// spec is refused with the offending token named.
#include <gtest/gtest.h>

#include <string>

#include "wire/fault_spec.h"

namespace sv::wire {
namespace {

FaultPlan parse_ok(const std::string& s) {
  FaultPlan p;
  FaultSpecError e;
  EXPECT_TRUE(parse_fault_spec(s, p, e)) << s << ": " << e.token << ": " << e.why;
  return p;
}

FaultSpecError parse_bad(const std::string& s) {
  FaultPlan p;
  FaultSpecError e;
  EXPECT_FALSE(parse_fault_spec(s, p, e)) << s;
  return e;
}

TEST(WireFaultSpec, TheIssuesExampleParses) {
  const FaultPlan p = parse_ok("reset:p=0.002;stall:ms=200,every=700;seed=7");
  EXPECT_EQ(p.seed, 7u);
  ASSERT_EQ(p.rules.size(), 2u);
  EXPECT_EQ(p.rules[0].action, FaultAction::reset);
  EXPECT_TRUE(p.rules[0].has_p);
  // 0.002 * 2^64, exactly (integer arithmetic, no rounding through a double).
  EXPECT_EQ(p.rules[0].p_threshold,
            static_cast<uint64_t>((static_cast<unsigned __int128>(2) << 64) / 1000));
  EXPECT_EQ(p.rules[1].action, FaultAction::stall);
  EXPECT_EQ(p.rules[1].ms, 200u);
  EXPECT_EQ(p.rules[1].every, 700u);
  EXPECT_EQ(p.rules[1].dir, FaultDir::tx);
}

TEST(WireFaultSpec, EverySelectorParses) {
  const FaultPlan p = parse_ok(
      "corrupt:every=200,count=1,after=5,dir=rx,qpn=4660,peer=10.0.0.2;"
      "drop:p=1;dup:peer=::1;delay:ms=10,p=0");
  ASSERT_EQ(p.rules.size(), 4u);
  const FaultRule& c = p.rules[0];
  EXPECT_EQ(c.action, FaultAction::corrupt);
  EXPECT_EQ(c.every, 200u);
  EXPECT_EQ(c.count, 1u);
  EXPECT_EQ(c.after, 5u);
  EXPECT_EQ(c.dir, FaultDir::rx);
  EXPECT_TRUE(c.has_qpn);
  EXPECT_EQ(c.qpn, 4660u);
  EXPECT_TRUE(c.has_peer);
  EXPECT_EQ(c.peer_family, 4);
  EXPECT_EQ(c.peer[0], 10);
  EXPECT_EQ(c.peer[3], 2);
  EXPECT_FALSE(p.rules[1].has_p);  // p=1: always, no draw needed
  EXPECT_EQ(p.rules[2].peer_family, 6);
  EXPECT_EQ(p.rules[2].peer[15], 1);
  EXPECT_TRUE(p.rules[3].has_p);  // p=0: never
  EXPECT_EQ(p.rules[3].p_threshold, 0u);
}

TEST(WireFaultSpec, AnIpv4MappedPeerIsTheIpv4Peer) {
  const FaultPlan p = parse_ok("drop:peer=::ffff:10.0.0.2");
  ASSERT_EQ(p.rules.size(), 1u);
  EXPECT_EQ(p.rules[0].peer_family, 4);
  EXPECT_EQ(p.rules[0].peer[0], 10);
  EXPECT_EQ(p.rules[0].peer[3], 2);
  EXPECT_EQ(p.rules[0].peer[4], 0);
}

TEST(WireFaultSpec, EmptyItemsAndAnEmptySpecAreNoRules) {
  EXPECT_TRUE(parse_ok("").rules.empty());
  EXPECT_EQ(parse_ok("reset;;stall:ms=5;").rules.size(), 2u);
}

TEST(WireFaultSpec, MalformedSpecsNameTheirToken) {
  EXPECT_EQ(parse_bad("explode").token, "explode");
  EXPECT_EQ(parse_bad("reset:bogus=1").token, "bogus=1");
  EXPECT_EQ(parse_bad("reset:p=1.5").token, "p=1.5");
  EXPECT_EQ(parse_bad("reset:p=0.").token, "p=0.");
  EXPECT_EQ(parse_bad("reset:p=-0.1").token, "p=-0.1");
  EXPECT_EQ(parse_bad("reset:p=0.1234567890123456789").token, "p=0.1234567890123456789");
  EXPECT_EQ(parse_bad("reset:every=0").token, "every=0");
  EXPECT_EQ(parse_bad("reset:every=12abc").token, "every=12abc");
  EXPECT_EQ(parse_bad("reset:count=99999999999999999999999").token,
            "count=99999999999999999999999");
  EXPECT_EQ(parse_bad("reset:every=2,every=3").token, "every=3");
  EXPECT_EQ(parse_bad("reset:every").token, "every");
  EXPECT_EQ(parse_bad("reset:=3").token, "=3");
  EXPECT_EQ(parse_bad("reset:every=").token, "every=");
  EXPECT_EQ(parse_bad("reset:").token, "reset:");
  EXPECT_EQ(parse_bad("reset:every=2,").token, "reset:every=2,");
  EXPECT_EQ(parse_bad("reset:peer=10.0.0.300").token, "peer=10.0.0.300");
  EXPECT_EQ(parse_bad("reset:qpn=16777216").token, "qpn=16777216");
  EXPECT_EQ(parse_bad("reset:dir=up").token, "dir=up");
  EXPECT_EQ(parse_bad("stall").token, "stall");  // needs ms
  EXPECT_EQ(parse_bad("stall:ms=0").token, "ms=0");
  EXPECT_EQ(parse_bad("delay:ms=3600001").token, "ms=3600001");
  EXPECT_EQ(parse_bad("reset:ms=5").token, "reset:ms=5");  // ms only for stall and delay
  EXPECT_EQ(parse_bad("dup:dir=rx").token, "dup:dir=rx");  // datagrams: tx only
  EXPECT_EQ(parse_bad("delay:ms=5,dir=rx").token, "delay:ms=5,dir=rx");
  EXPECT_EQ(parse_bad("seed=x").token, "seed=x");
  EXPECT_EQ(parse_bad("seed=1;seed=2").token, "seed=2");
  EXPECT_EQ(parse_bad(" reset").token, " reset");  // no whitespace is guessed at
  EXPECT_FALSE(parse_bad("reset:p=2").why.empty());
}

TEST(WireFaultSpec, SizeAndRuleCountAreBounded) {
  std::string many;
  for (size_t i = 0; i < kMaxFaultRules; ++i) many += "reset;";
  EXPECT_EQ(parse_ok(many).rules.size(), kMaxFaultRules);
  EXPECT_EQ(parse_bad(many + "drop").token, "drop");
  EXPECT_FALSE(parse_bad(std::string(kMaxFaultSpecLen + 1, ';')).why.empty());
}

}  // namespace
}  // namespace sv::wire
