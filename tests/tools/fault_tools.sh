#!/usr/bin/env bash
# fault_tools.sh: unmodified rdma-core and perftest programs under SOFTVERBS_FAULT
# (docs/fault-injection.md), on loopback, the fault on the client's side:
#   rping -V, corrupt:every=200,count=1, over TCP and through shared memory: both sides end
#     within 15 s, the server having caught the CRC error, and neither reports mismatched
#     data (-V checks every buffer read back);
#   ib_write_bw -R, reset:after=2000,count=1: both sides end within 15 s (a reset is an
#     error, never a hang);
#   ibv_rc_pingpong, stall:ms=300,every=150,count=2: both sides succeed (a stall loses
#     nothing);
#   udaddy, drop:count=1: its first rdma_cm UD set-up message (SIDR REQ) is lost and
#     retried, and both sides succeed.
# Each case also requires the fault to have fired (the client's "fault: qp" log line).
# Usage: fault_tools.sh <libdir>
set -u
LIBDIR=$(cd "$1" && pwd)
export LD_LIBRARY_PATH=$LIBDIR SOFTVERBS_NETDEV=lo SOFTVERBS_LOG=warn
PRE=""
[ -n "${SV_PRELOAD:-}" ] && PRE="env LD_PRELOAD=$SV_PRELOAD"
unset LD_PRELOAD
TMP=$(mktemp -d)
spid=""
trap '[ -n "$spid" ] && kill $spid 2>/dev/null; rm -rf "$TMP"' EXIT
pass=0
fail=0

# case NAME PORT FAULT WANT "server cmd" "client cmd" [client regex] [server regex]; WANT:
# ends (neither hangs) or ok (both exit 0); the regexes, if given, must match each side's
# output (rping exits 0 after a failed completion: its output says what it saw).
case_run() {
  local name=$1 port=$2 fault=$3 want=$4 scmd=$5 ccmd=$6 cre=${7:-} sre=${8:-} i
  timeout 15 bash -c "$PRE $scmd" >"$TMP/s.log" 2>&1 &
  spid=$!
  for i in $(seq 100); do
    ss -Hltun 2>/dev/null | grep -q ":$port " && break  # TCP, or UDP for udaddy
    sleep 0.1
  done
  SOFTVERBS_FAULT=$fault timeout 15 bash -c "$PRE $ccmd" >"$TMP/c.log" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  spid=""
  local why=""
  grep -q "fault: qp" "$TMP/c.log" || why="the fault did not fire"
  if [ $crc -eq 124 ] || [ $src -eq 124 ]; then why="hung (client $crc, server $src)"; fi
  if [ $want = ok ] && { [ $crc -ne 0 ] || [ $src -ne 0 ]; }; then
    why="${why:-expected success, exits $crc/$src}"
  fi
  if [ -n "$cre" ] && ! grep -Eq "$cre" "$TMP/c.log"; then why="${why:-client output lacks /$cre/}"; fi
  if [ -n "$sre" ] && ! grep -Eq "$sre" "$TMP/s.log"; then why="${why:-server output lacks /$sre/}"; fi
  if grep -Eqi "mismatch|miscompare" "$TMP/c.log" "$TMP/s.log"; then why="reported mismatched data"; fi
  if [ -z "$why" ]; then
    echo "PASS $name (client $crc, server $src): $(grep -m1 "fault: qp" "$TMP/c.log")"
    pass=$((pass + 1))
  else
    echo "FAIL $name: $why"
    echo "-- client"; tail -n 15 "$TMP/c.log"
    echo "-- server"; tail -n 15 "$TMP/s.log"
    fail=$((fail + 1))
  fi
}

# The server catches the CRC and Terminates, over TCP and through shared memory (the same
# FPDUs, the same CRC). Which WR fails with it depends on what the 200th frame is: a Send of
# the client's fails the client's WR, but a Placement Ack or a Read Response (one frame by
# reference on shared memory) fails the server's Read or nothing the client waits on, and the
# acks' timing moves that from run to run. So only the catch, and both ends, are required.
case_run rping_corrupt 7174 'corrupt:every=200,count=1' ends \
  "env SOFTVERBS_SHM=0 rping -s -a 127.0.0.1 -p 7174 -V -C 1000" \
  "env SOFTVERBS_SHM=0 rping -c -a 127.0.0.1 -p 7174 -V -C 1000" \
  "" "MPA CRC error"
case_run rping_corrupt_shm 7175 'corrupt:every=200,count=1' ends \
  "env SOFTVERBS_SHM=1 rping -s -a 127.0.0.1 -p 7175 -V -C 1000" \
  "env SOFTVERBS_SHM=1 rping -c -a 127.0.0.1 -p 7175 -V -C 1000" \
  "" "MPA CRC error"
case_run write_bw_reset 18515 'reset:after=2000,count=1' ends \
  "ib_write_bw -R -D 5 -p 18515" "ib_write_bw -R -D 5 -p 18515 127.0.0.1"
case_run rc_pingpong_stall 18516 'stall:ms=300,every=150,count=2' ok \
  "ibv_rc_pingpong -g 0 -p 18516 -n 500" "ibv_rc_pingpong -g 0 -p 18516 -n 500 127.0.0.1"
# udaddy sets up over RDMA_PS_UDP (SIDR messages): the rule loses its first REQ,
# rdma_cm retries it, and all four connections and their datagrams get through.
case_run udaddy_sidr_drop 7174 'drop:count=1' ok \
  "udaddy -c 4 -C 20" "udaddy -s 127.0.0.1 -c 4 -C 20" "fault: qp 0 drop tx frame 1"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
