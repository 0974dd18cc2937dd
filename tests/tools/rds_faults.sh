#!/usr/bin/env bash
# rds_faults.sh: RDS stays exactly-once and in order under SOFTVERBS_FAULT's link resets and
# stalls on both sides (docs/fault-injection.md). Two namespaces joined by a veth pair, one
# rds_flows each (tests/rds/rds_flows.cc: every flow checked with a hash chain), both under
#   reset:p=0.002;stall:ms=200,every=700;seed=S
# The run also requires that the faults fired: at least one reset and one stall per side, as
# each side's log says ("fault: qp N reset ...").
# Usage: rds_faults.sh <tests-bindir> [messages-per-side] [seed]
set -u
. "$(dirname "$0")/netns_pair.sh"
BIN=$(cd "$1" && pwd)
PER_SIDE=${2:-3000}
SEED=${3:-7}
# The stall fires on frames 100 and 101 of the first QP that gets that far: with resets
# at p=0.002 a QP seldom lives 700 frames, so "every=700" left some runs without a stall.
RULES="reset:p=0.002;stall:ms=200,after=100,count=2;seed=$SEED"
A=svfa_$$
B=svfb_$$
pids=()
LOG_A=/tmp/rds_faults_a_$$.log
LOG_B=/tmp/rds_faults_b_$$.log
DIR_A=/dev/shm/softverbs-rds-flt-a-$$
DIR_B=/dev/shm/softverbs-rds-flt-b-$$
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  netns_pair_del $A $B
  rm -f "$LOG_A" "$LOG_B"
  rm -rf "$DIR_A" "$DIR_B"
}
trap cleanup EXIT
netns_pair $A $B sfa$$ sfb$$ 10.79.0
echo "rules on both sides: SOFTVERBS_FAULT='$RULES'"

export SOFTVERBS_FAULT="$RULES" SOFTVERBS_LOG=warn
SOFTVERBS_RDS_DIR=$DIR_A ip netns exec $A timeout 300 "$BIN/rds_flows" --local 10.79.0.1 \
  --peer 10.79.0.2 --port 7300 --messages "$PER_SIDE" --seed 31 --timeout 280 >"$LOG_A" 2>&1 &
pa=$!
pids+=($pa)
SOFTVERBS_RDS_DIR=$DIR_B ip netns exec $B timeout 300 "$BIN/rds_flows" --local 10.79.0.2 \
  --peer 10.79.0.1 --port 7300 --messages "$PER_SIDE" --seed 32 --timeout 280 >"$LOG_B" 2>&1 &
pb=$!
pids+=($pb)
wait $pa
ra=$?
wait $pb
rb=$?
ok=1
for side in A B; do
  log=$LOG_A
  [ $side = B ] && log=$LOG_B
  resets=$(grep -c "fault: qp [0-9]* reset" "$log")
  stalls=$(grep -c "fault: qp [0-9]* stall" "$log")
  echo "side $side: $(grep "flows:" "$log" | tail -n 1) | faults fired: $resets resets, $stalls stalls"
  if [ "$resets" -lt 1 ] || [ "$stalls" -lt 1 ]; then
    echo "side $side: the rules did not fire (a run without faults proves nothing)"
    ok=0
  fi
done
if [ $ra -ne 0 ] || [ $rb -ne 0 ]; then
  ok=0
  for log in "$LOG_A" "$LOG_B"; do
    echo "== $log"
    # A sanitizer report is long and its second stack is the useful one: print it whole.
    if grep -q "^WARNING: ThreadSanitizer\|^==[0-9]*==ERROR: \|runtime error:" "$log"; then
      sed -n '/^==================$/,/^SUMMARY: /p;/^==[0-9]*==ERROR/,/^SUMMARY: /p;/runtime error:/p' "$log" | head -n 400
    fi
    grep -v "fault: qp" "$log" | tail -n 20
  done
fi
if [ $ok = 1 ]; then
  echo "1 passed, 0 failed"
  exit 0
fi
echo "0 passed, 1 failed"
exit 1
