#!/usr/bin/env bash
# RDS across "hosts" with nothing set up: two network namespaces joined by veth, each with
# its own RDS registry (SOFTVERBS_RDS_DIR), so sockets on one side find the other side's
# owner processes only through that host's directory (rdma_cm port 18635, src/rds/directory.cc).
#   1. Host B runs two RDS processes; the first holds the directory. rds-stress from host A
#      reaches the SECOND one (the directory redirects), with -D RDMA, verified.
#   2. rds-ping from A to B's address: port 0 is answered.
#   3. The directory holder exits; the other process takes the directory over, and a new
#      rds-stress from A (a fresh process, so nothing cached) reaches it again.
# Usage: rds_directory.sh <bindir>
set -u
. "$(dirname "$0")/netns_pair.sh"
BIN=$(cd "$1" && pwd)
A=svda_$$
B=svdb_$$
TMP=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  netns_pair_del $A $B
  rm -rf "$TMP"
}
trap cleanup EXIT
netns_pair $A $B sda$$ sdb$$ 10.79.0
inA() { SOFTVERBS_RDS_DIR=$TMP/regA ip netns exec $A "$@"; }
inB() { SOFTVERBS_RDS_DIR=$TMP/regB ip netns exec $B "$@"; }
pass=0
fail=0
check() {  # check NAME CONDITION-RESULT
  if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "PASS $1"; else fail=$((fail + 1)); echo "FAIL $1"; fi
}

# Host B: the directory holder (first RDS process) and the process we will talk to.
inB timeout 60 "$BIN/rds-stress" -r 10.79.0.2 -p 6100 >"$TMP/holder.log" 2>&1 &
holder=$!
pids+=($holder)
sleep 1.5  # the holder claims port 18635 first
inB timeout 60 "$BIN/rds-stress" -r 10.79.0.2 -p 6200 >"$TMP/p1.log" 2>&1 &
p1=$!
pids+=($p1)
sleep 0.5
inA timeout 60 "$BIN/rds-stress" -s 10.79.0.2 -r 10.79.0.1 -p 6200 -T 3 -D 64K -v >"$TMP/a1.log" 2>&1
rc=$?
wait $p1
rcp=$?
[ $rc -eq 0 ] && [ $rcp -eq 0 ] && grep -q "(average)" "$TMP/a1.log"
check "rds-stress -D 64K -v from host A to host B's second process (directory redirect): $(grep '(average)' "$TMP/a1.log")" $?

# rds-ping to B's address: the first process bound there (the holder) answers port 0.
inA timeout 20 "$BIN/rds-ping" -c 3 -i 0.2 10.79.0.2 >"$TMP/ping.log" 2>&1
[ "$(grep -c 'usec' "$TMP/ping.log")" -eq 3 ]
check "rds-ping host A -> host B: $(grep usec "$TMP/ping.log" | tail -1)" $?

# The holder exits; a new process on B must take the directory over.
kill $holder 2>/dev/null
wait $holder 2>/dev/null
inB timeout 60 "$BIN/rds-stress" -r 10.79.0.2 -p 6300 >"$TMP/p2.log" 2>&1 &
p2=$!
pids+=($p2)
sleep 2  # one directory claim period
inA timeout 60 "$BIN/rds-stress" -s 10.79.0.2 -r 10.79.0.1 -p 6300 -T 2 >"$TMP/a2.log" 2>&1
rc=$?
wait $p2
rcp=$?
[ $rc -eq 0 ] && [ $rcp -eq 0 ] && grep -q "(average)" "$TMP/a2.log"
check "after the directory holder exited, host A still reaches host B: $(grep '(average)' "$TMP/a2.log")" $?
[ $fail -eq 0 ] || for f in "$TMP"/*.log; do echo "== $f"; tail -n 5 "$f"; done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
