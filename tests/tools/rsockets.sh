#!/usr/bin/env bash
# rsockets over softverbs with unmodified Debian 12 programs, server and client on loopback:
#   rstream    all eight latency/bandwidth phases, non-blocking (default), rpoll (-T a) and
#              blocking MSG_WAITALL (-T b); both sides must print every phase; -T b and
#              -T a again, one size, under RFC 5040's completion rule
#   riostream  riomap/riowrite, every phase with data verification (-T v); one size with rpoll
#   rcopy      a 3 MB file copied and compared byte for byte
#   iperf3     two parallel streams under librspreload.so (Debian's LD_PRELOAD library, which
#              turns socket() into rsocket()): both ends report the transfer, and
#              softverbs-stat shows iperf3's QPs moving the bytes while it runs
# Each case checks the programs' output, not only their exit codes.
# Usage: rsockets.sh <libdir> <bindir> [filter-regex]
# SV_PRELOAD: a sanitizer runtime to load into the programs (first in LD_PRELOAD); SV_QUICK=1
# runs one transfer size per rstream/riostream mode (for the slower sanitizer builds).
set -u
LIBDIR=$(cd "$1" && pwd)
BINDIR=$(cd "$2" && pwd)
FILTER=${3:-.}
export LD_LIBRARY_PATH=$LIBDIR
export SOFTVERBS_NETDEV=lo
SAN=${SV_PRELOAD:-}
unset LD_PRELOAD
RSPRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
for b in rstream riostream rcopy iperf3; do
  command -v $b >/dev/null || {
    echo "missing $b: apt-get install rdmacm-utils iperf3" >&2
    exit 1
  }
done
[ -e $RSPRELOAD ] || {
  echo "missing $RSPRELOAD (librdmacm1)" >&2
  exit 1
}
TMP=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
pass=0
fail=0
failed=()

result() {  # result NAME OK LOG...
  local name=$1 ok=$2
  shift 2
  if [ "$ok" = 1 ]; then
    pass=$((pass + 1))
    echo "PASS $name"
  else
    fail=$((fail + 1))
    failed+=("$name")
    echo "FAIL $name"
    for f in "$@"; do
      # A sanitizer report whole (its second stack is what tells the race), else the tail.
      if grep -q "Sanitizer" "$f"; then
        sed -n '/WARNING\|ERROR: /,$p' "$f" | head -150
      else
        grep -Ev "^[0-9a-z]+_(lat|bw) " "$f" | tail -12
      fi | sed "s#^#  $(basename "$f" .log)| #"
    done
  fi
}

# A prefix that loads the sanitizer runtime into the programs if asked (a command prefix, not
# a function: a backgrounded function would be a subshell, and $! not the program's timeout).
RUN=(env)
[ -n "$SAN" ] && RUN=(env LD_PRELOAD="$SAN")

wait_port() {
  for _ in $(seq 100); do
    ss -Hltn "sport = :$1" | grep -q . && return 0
    sleep 0.1
  done
  return 1
}

# The result lines rstream/riostream print: one per phase, with its time per transfer. Not
# a positive Gb/sec: rstream prints two decimals, and a 64-byte phase slower than ~100 us a
# transfer (blocking calls on a loaded 2-core machine) shows 0.00 though it completed.
phases() {
  if [ "${SV_QUICK:-0}" = 1 ] || [ "${QUICK:-0}" = 1 ]; then echo custom; else echo 64_lat 4k_lat 64k_lat 1m_lat 64_bw 4k_bw 64k_bw 1m_bw; fi
}
has_phases() {
  local log=$1 p
  for p in $(phases); do
    grep -Eq "^$p +[0-9]+[kmg]? +[0-9]+[kmg]? +[0-9]+[kmg]? +[0-9.]+[kmg]? +[0-9.]+s +[0-9.]+ +0*[1-9][0-9]*\.[0-9]+|^$p .* 0\.[0-9]*[1-9][0-9]*$" "$log" || return 1
  done
}

# tool NAME PROGRAM PORT OPTIONS...: server, then client, on 127.0.0.1.
run_stream_tool() {
  local name=$1 prog=$2 port=$3
  shift 3
  [[ $name =~ $FILTER ]] || return 0
  local s=$TMP/server.log c=$TMP/client.log ok=1 size=()
  [ "${SV_QUICK:-0}" = 1 ] || [ "${QUICK:-0}" = 1 ] && size=(-S 65536 -C 2000)
  "${RUN[@]}" timeout 180 $prog -b 127.0.0.1 -p $port "${size[@]}" "$@" >"$s" 2>&1 &
  local spid=$!
  pids+=($spid)
  wait_port $port || ok=0
  "${RUN[@]}" timeout 170 $prog -s 127.0.0.1 -p $port "${size[@]}" "$@" >"$c" 2>&1 || ok=0
  wait $spid || ok=0
  has_phases "$s" && has_phases "$c" || ok=0
  grep -Eq "rpoll|rsend|rrecv|riowrite|riomap|rconnect|raccept|ERROR|Sanitizer" "$s" "$c" && ok=0
  result "$name" $ok "$s" "$c"
}

run_rcopy() {
  [[ rcopy =~ $FILTER ]] || return 0
  local s=$TMP/rcopy_server.log c=$TMP/rcopy_client.log ok=1 port=7481
  head -c 3000001 /dev/urandom >"$TMP/src.bin"
  "${RUN[@]}" timeout 60 rcopy -p $port >"$s" 2>&1 &
  local spid=$!
  pids+=($spid)
  wait_port $port || ok=0
  "${RUN[@]}" timeout 50 rcopy "$TMP/src.bin" "127.0.0.1:$TMP/dst.bin" -p $port >"$c" 2>&1 || ok=0
  # The server serves until stopped; it is done with this file when it says so (its client
  # may finish first: it does not wait for the server's close).
  for _ in $(seq 100); do
    grep -q "closing...done" "$s" && break
    sleep 0.1
  done
  kill $spid 2>/dev/null
  cmp -s "$TMP/src.bin" "$TMP/dst.bin" || ok=0
  grep -q "3000001 bytes" "$c" && grep -q "transferring...3000001 bytes...closing...done" "$s" || ok=0
  result "rcopy 3 MB, compared" $ok "$s" "$c"
}

run_iperf3() {
  [[ iperf3 =~ $FILTER ]] || return 0
  local s=$TMP/iperf3_server.log c=$TMP/iperf3_client.log st=$TMP/stat.log ok=1 port=5291
  local pre=$RSPRELOAD
  [ -n "$SAN" ] && pre="$SAN:$RSPRELOAD"
  LD_PRELOAD=$pre timeout 60 iperf3 -s -1 -p $port >"$s" 2>&1 &
  local spid=$!
  pids+=($spid)
  wait_port $port || ok=0
  LD_PRELOAD=$pre timeout 50 iperf3 -c 127.0.0.1 -p $port -t 3 -P 2 >"$c" 2>&1 &
  local cpid=$!
  # Mid-run: both iperf3 processes hold softverbs QPs (control + two streams each).
  sleep 1.5
  "$BINDIR/softverbs-stat" >"$st" 2>&1
  wait $cpid || ok=0
  wait $spid || ok=0
  [ "$(grep -Ec 'comm iperf3 qps 3 .*rcvd_bytes [1-9]' "$st")" -ge 1 ] || ok=0
  grep -Eq '^\[SUM\] +0\.00-3\.[0-9]+ +sec +[0-9.]+ [MG]Bytes +[0-9.]+ [MG]bits/sec +[0-9]+ +sender' "$c" || ok=0
  grep -Eq '^\[SUM\] +0\.00-3\.[0-9]+ +sec +[0-9.]+ [MG]Bytes +[0-9.]+ [MG]bits/sec +receiver' "$s" || ok=0
  result "iperf3 -P 2 under librspreload" $ok "$s" "$c" "$st"
}

run_stream_tool "rstream (non-blocking)" rstream 7471
run_stream_tool "rstream -T a (rpoll)" rstream 7472 -T a
run_stream_tool "rstream -T b (blocking)" rstream 7473 -T b
# The runs above use IB's completion rule, the default between softverbs peers: Sends and
# Writes complete on the peer's Placement Ack, from the progress thread, while the program
# may be between arming its CQ and sleeping (rsockets' blocking calls and rpoll used to take
# the event raised there and sleep with completions in the CQ: 2 runs in 3 hung in -T b).
# RFC 5040's rule (SOFTVERBS_IB_COMPLETION=0), one transfer size each (QUICK): the same
# calls, with completions raised on the posting thread instead.
RUN+=(SOFTVERBS_IB_COMPLETION=0)
QUICK=1 run_stream_tool "rstream -T b (blocking), RFC 5040 completion rule" rstream 7476 -T b
QUICK=1 run_stream_tool "rstream -T a (rpoll), RFC 5040 completion rule" rstream 7477 -T a
unset 'RUN[-1]'
run_stream_tool "riostream -T v (verify)" riostream 7474 -T v
# One transfer size: riostream's 64 B phases take 30 s here (its receiver spins on memory,
# so every transfer waits for our progress thread to place it); -T v above runs them all.
QUICK=1 run_stream_tool "riostream -T a (rpoll)" riostream 7475 -T a
run_rcopy
run_iperf3

echo
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
