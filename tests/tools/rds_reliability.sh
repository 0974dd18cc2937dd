#!/usr/bin/env bash
# RDS reliability across two hosts: network namespaces joined by veth, with packet loss,
# duplication, corruption and reordering (tc netem where the kernel has sch_netem;
# nftables random drop otherwise) and forced TCP connection resets (ss -K) during the
# run. 50 000 messages in a pseudo-random pattern between 4 sockets per side, every flow
# checked for exactly-once, in-order delivery with a hash chain (tests/rds/rds_flows.cc).
# Usage: rds_reliability.sh <tests-bindir> [messages-per-side]
set -u
. "$(dirname "$0")/netns_pair.sh"
BIN=$(cd "$1" && pwd)
PER_SIDE=${2:-25000}
A=svra_$$
B=svrb_$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  netns_pair_del $A $B
}
trap cleanup EXIT
netns_pair $A $B sva$$ svb$$ 10.78.0

impair="none"
if ip netns exec $A tc qdisc add dev sva$$ root netem loss 1% duplicate 1% corrupt 0.1% \
     delay 1ms reorder 25% 50% 2>/dev/null; then
  ip netns exec $B tc qdisc add dev svb$$ root netem loss 1% duplicate 1% corrupt 0.1% \
    delay 1ms reorder 25% 50%
  impair="tc netem loss 1% duplicate 1% corrupt 0.1% reorder 25%"
elif command -v nft >/dev/null; then
  # This kernel has no sch_netem: drop 1% of segments each way at random instead.
  for ns in $A $B; do
    ip netns exec $ns nft add table inet svloss
    ip netns exec $ns nft 'add chain inet svloss out { type filter hook output priority 0; }'
    ip netns exec $ns nft 'add rule inet svloss out ip daddr 10.78.0.0/24 numgen random mod 100 < 1 drop'
  done
  impair="nftables random drop 1% each way (no sch_netem in this kernel)"
fi
echo "impairment: $impair"

# Separate registries, as on two hosts: each side finds the other's sockets through the
# peer host's RDS directory (rdma_cm port 18635), not through shared files.
DIR_A=/dev/shm/softverbs-rds-rel-a-$$
DIR_B=/dev/shm/softverbs-rds-rel-b-$$
SOFTVERBS_RDS_DIR=$DIR_A ip netns exec $A timeout 300 "$BIN/rds_flows" --local 10.78.0.1 --peer 10.78.0.2 --port 7100 \
  --messages $PER_SIDE --seed 11 --timeout 280 >/tmp/rel_a_$$.log 2>&1 &
pa=$!
pids+=($pa)
SOFTVERBS_RDS_DIR=$DIR_B ip netns exec $B timeout 300 "$BIN/rds_flows" --local 10.78.0.2 --peer 10.78.0.1 --port 7100 \
  --messages $PER_SIDE --seed 22 --timeout 280 >/tmp/rel_b_$$.log 2>&1 &
pb=$!
pids+=($pb)
# Forced connection resets while they run.
resets=0
# From both sides in turn: each side's engine sees its connections die under it, and both
# race to reconnect.
( while kill -0 $pa 2>/dev/null || kill -0 $pb 2>/dev/null; do
    sleep 0.2
    ip netns exec $A ss -K dst 10.78.0.2 >/dev/null 2>&1
    sleep 0.2
    ip netns exec $B ss -K dst 10.78.0.1 >/dev/null 2>&1
  done ) &
pids+=($!)
wait $pa
ra=$?
wait $pb
rb=$?
echo "side A: $(tail -n 1 /tmp/rel_a_$$.log)"
echo "side B: $(tail -n 1 /tmp/rel_b_$$.log)"
# Each side must have found the other through its directory (separate registries).
lookups_ok=1
for log in /tmp/rel_a_$$.log /tmp/rel_b_$$.log; do
  n=$(tail -n 1 "$log" | sed -n 's/.* \([0-9]*\) directory lookups.*/\1/p')
  [ "${n:-0}" -gt 0 ] || { lookups_ok=0; echo "no directory lookup in $log"; }
done
if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then
  for log in /tmp/rel_a_$$.log /tmp/rel_b_$$.log; do
    echo "== $log"
    # A sanitizer report is long and its second stack is the useful one: print it whole.
    if grep -q "^WARNING: ThreadSanitizer\|^==[0-9]*==ERROR: \|runtime error:" "$log"; then
      sed -n '/^==================$/,/^SUMMARY: /p;/^==[0-9]*==ERROR/,/^SUMMARY: /p;/runtime error:/p' "$log" | head -n 400
    fi
    tail -n 20 "$log"
  done
fi
rm -f /tmp/rel_a_$$.log /tmp/rel_b_$$.log
rm -rf "$DIR_A" "$DIR_B"
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ $lookups_ok = 1 ]; then
  echo "1 passed, 0 failed"
  exit 0
fi
echo "0 passed, 1 failed"
exit 1
