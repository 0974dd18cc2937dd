#!/usr/bin/env bash
# rds-stress (with and without -D RDMA, verified; the option exchanges rds-tools speaks) and
# rds-ping between two processes on loopback addresses 127.0.0.1 (active) and 127.0.0.2
# (passive).
# Usage: rds_tools.sh <bindir>
set -u
BIN=$(cd "$1" && pwd)
export SOFTVERBS_NETDEV=lo
pass=0
fail=0
TMP=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
PORT=$((5000 + $$ % 2000 * 10))
verdict() {  # verdict OK NAME LOG: a PASS, or a FAIL with the log
  if [ "$1" = 1 ]; then
    pass=$((pass + 1))
    echo "PASS $2"
  else
    fail=$((fail + 1))
    echo "FAIL $2"
    cat "$3"
  fi
}

stress() {  # stress NAME ARGS...
  local name=$1
  shift
  timeout 60 "$BIN/rds-stress" -r 127.0.0.2 -p $PORT >"$TMP/p.log" 2>&1 &
  local pp=$!
  pids+=($pp)
  sleep 0.5
  timeout 60 "$BIN/rds-stress" -s 127.0.0.2 -r 127.0.0.1 -p $PORT -T 2 "$@" >"$TMP/a.log" 2>&1
  local arc=$?
  wait $pp
  local prc=$?
  PORT=$((PORT + 100))
  if [ $arc -eq 0 ] && [ $prc -eq 0 ] && grep -q "(average)" "$TMP/a.log"; then
    pass=$((pass + 1))
    echo "PASS rds-stress $name: $(grep '(average)' "$TMP/a.log")"
  else
    fail=$((fail + 1))
    echo "FAIL rds-stress $name (active rc=$arc passive rc=$prc)"
    tail -n 5 "$TMP/a.log"; tail -n 5 "$TMP/p.log"
  fi
}

stress "-d 4 -t 2 -v" -d 4 -t 2 -v
stress "-D 64K (alternate read/write) -v" -D 64K -d 2 -v
stress "-D 1M -M 1 (read) -v" -D 1M -M 1 -v
stress "-D 256K -M 2 (write) -I 3 -t 2 -v" -D 256K -M 2 -I 3 -t 2 -v
stress "-D 64K --rdma-use-get-mr 1 --rdma-use-once 1 -v" -D 64K --rdma-use-get-mr 1 --rdma-use-once 1 -v
stress "-D 64K --rdma-use-get-mr 1 --rdma-cache-mrs 1 -v" -D 64K --rdma-use-get-mr 1 --rdma-use-once 0 \
  --rdma-cache-mrs 1 -v
stress "-o (only the active side requests) -d 8 -v" -o -d 8 -v
# Fenced Writes answered at once, 8 in flight: messages acked before their op settles.
stress "-D 4K -M 2 -d 8 -v (fenced Writes, pipelined)" -D 4K -M 2 -d 8 -v
# The option exchanges of rds-tools' passive sides: V1 (default), V2 with a version string,
# and 2.3.x's JSON options after V2 (tests/tools/oracle_rds_tools.sh runs Oracle's tools).
stress "--control v2 -D 64K -v" --control v2 -D 64K -v
stress "--control json:2.3.0 -D 64K -M 2 -v" --control json:2.3.0 -D 64K -M 2 -v
# Busy polling (poll() in the shim does the stack's completion work on the app thread).
export SOFTVERBS_RDS_BUSY_POLL_US=50
stress "-d 4 -t 2 -D 64K -v, busy-polling" -d 4 -t 2 -D 64K -v
# A busy-polled ping-pong over shared memory: once the pollers spin, the peers stop ringing
# each other's doorbells (a send and a recv per message on the TCP socket beside the rings),
# and stay so after a poll that slept (every run begins with one: nothing to take yet).
# Counted by softverbs-stat over one second of the run: a bell per 20 Sends at most (it was
# one per 3 to 10 after the first sleep, before qp_busy_bell_taken_locked re-quieted).
bells() {  # the rds-stress QPs' Sends and doorbells: "sends bells"
  "$BIN/softverbs-stat" -q -c rds-stress stat 2>&1 | awk '
    {for (i = 1; i < NF; i++) {if ($i == "sent_sends") s += $(i + 1); if ($i == "shm_bells") b += $(i + 1)}}
    END {print s + 0, b + 0}'
}
SOFTVERBS_SHM=1 timeout 60 "$BIN/rds-stress" -r 127.0.0.2 -p $PORT >"$TMP/p.log" 2>&1 &
pp=$!
pids+=($pp)
sleep 0.5
SOFTVERBS_SHM=1 timeout 60 "$BIN/rds-stress" -s 127.0.0.2 -r 127.0.0.1 -p $PORT -T 4 -q 64 -a 64 \
  -d 1 -t 1 >"$TMP/a.log" 2>&1 &
ap=$!
pids+=($ap)
sleep 2
read -r s0 b0 < <(bells)
sleep 1
read -r s1 b1 < <(bells)
wait $ap
wait $pp
PORT=$((PORT + 100))
ok=0
sends=$((s1 - s0)) rung=$((b1 - b0))
[ "$sends" -gt 1000 ] && [ $((rung * 20)) -le "$sends" ] && ok=1
verdict $ok "busy-polled ping-pong over shared memory: $rung doorbells for $sends Sends in 1 s" \
  "$TMP/a.log"
unset SOFTVERBS_RDS_BUSY_POLL_US

# rds-ping: a passive rds-stress holds 127.0.0.2, so its process answers port 0 there.
timeout 30 "$BIN/rds-stress" -r 127.0.0.2 -p $PORT >"$TMP/p.log" 2>&1 &
pp=$!
pids+=($pp)
timeout 30 "$BIN/rds-stress" -s 127.0.0.2 -r 127.0.0.1 -p $PORT -T 4 >"$TMP/a.log" 2>&1 &
pids+=($!)
sleep 2.5
ok=0
timeout 20 "$BIN/rds-ping" -c 5 -i 0.2 127.0.0.2 >"$TMP/ping.log" 2>&1 &&
  [ "$(grep -cE '^ *[0-9]+: [0-9]+ usec$' "$TMP/ping.log")" -eq 5 ] &&
  grep -q '^5 sent, 5 received, 0% loss' "$TMP/ping.log" &&
  grep -Eq '^rtt min/avg/max = [0-9]+/[0-9]+/[0-9]+ usec$' "$TMP/ping.log" && ok=1
verdict $ok "rds-ping: $(grep -E '^[0-9]+ sent' "$TMP/ping.log")" "$TMP/ping.log"
# RDS logs through SOFTVERBS_LOG: at info, the connection coming up.
ok=0
SOFTVERBS_LOG=info timeout 20 "$BIN/rds-ping" -c 1 -i 0.2 127.0.0.2 >"$TMP/pinglog.log" 2>&1
grep -q "^softverbs: info: rds: connection 127\.0\.0\.1 -> 127\.0\.0\.2 up$" "$TMP/pinglog.log" && ok=1
verdict $ok "RDS logs its connections at SOFTVERBS_LOG=info" "$TMP/pinglog.log"
# rds-ping where nothing answers (no RDS socket bound at 127.0.0.9): as iputils ping, a
# summary that says so, and exit 1.
ok=0
timeout 20 "$BIN/rds-ping" -c 3 -i 0.2 127.0.0.9 >"$TMP/ping0.log" 2>&1
prc=$?
[ $prc = 1 ] && grep -Eq '^3 sent, 0 received(, \+[0-9]+ errors)?, 100% loss' "$TMP/ping0.log" && ok=1
verdict $ok "rds-ping, nothing answers: exit $prc, $(grep -E '^[0-9]+ sent' "$TMP/ping0.log")" \
  "$TMP/ping0.log"
# Every tool: -h and --help print usage on stdout and exit 0; an unknown option exits 2.
for tool in rds-ping rds-info rds-stress blockserver; do
  for h in -h --help; do
    out=$("$BIN/$tool" $h 2>/dev/null)
    rc=$?
    if [ $rc = 0 ] && echo "$out" | grep -q "^usage: $tool"; then
      pass=$((pass + 1))
    else
      fail=$((fail + 1))
      echo "FAIL $tool $h: rc=$rc, stdout: $out"
    fi
  done
  "$BIN/$tool" --no-such-option >/dev/null 2>&1
  rc=$?
  if [ $rc = 2 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $tool --no-such-option: rc=$rc"; fi
done
# rds-info while the pair runs: its RC connections both ways (-I), the connection table (-n)
# and the sockets (-k), each socket with its own inode.
"$BIN/rds-info" -I >"$TMP/info_I.log" 2>&1
"$BIN/rds-info" -n >"$TMP/info_n.log" 2>&1
"$BIN/rds-info" -k >"$TMP/info_k.log" 2>&1
inodes=$(awk '$1 ~ /^127\.0\.0\.[12]$/ {print $7}' "$TMP/info_k.log" | sort)
if grep -Eq '127\.0\.0\.1 +127\.0\.0\.2 +0000:0000:0000:0000:0000:ffff:7f00:0001' "$TMP/info_I.log" &&
   grep -Eq '127\.0\.0\.2 +127\.0\.0\.1 ' "$TMP/info_I.log" &&
   grep -Eq '127\.0\.0\.1 +127\.0\.0\.2 .*C$' "$TMP/info_n.log" &&
   [ -n "$inodes" ] && [ "$(echo "$inodes" | uniq -d)" = "" ]; then
  pass=$((pass + 1))
  echo "PASS rds-info -I -n -k: $(grep -c '^ *127' "$TMP/info_I.log") IB connections, $(echo "$inodes" | wc -l) sockets"
else
  fail=$((fail + 1))
  echo "FAIL rds-info"
  cat "$TMP/info_I.log" "$TMP/info_n.log" "$TMP/info_k.log"
fi
wait

# The zero-copy block server example: reads by RDMA WRITE + immediate reply, writes by RDMA
# READ + PULLED + DURABLE, every block verified end to end by the client.
"$BIN/blockserver" serve --addr 127.0.0.2 --port $((PORT + 7)) --file "$TMP/blocks.img" \
  --blocks 64 >"$TMP/bs.log" 2>&1 &
bs=$!
pids+=($bs)
sleep 0.5
if timeout 60 "$BIN/blockserver" client --server 127.0.0.2 --port $((PORT + 7)) \
     --addr 127.0.0.1 --ops 300 --blocks 64 >"$TMP/bc.log" 2>&1; then
  pass=$((pass + 1))
  echo "PASS blockserver: $(tail -n 1 "$TMP/bc.log")"
else
  fail=$((fail + 1))
  echo "FAIL blockserver"
  cat "$TMP/bc.log" "$TMP/bs.log"
fi
kill $bs 2>/dev/null
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
