#!/usr/bin/env bash
# rsockets over softverbs against the kernel's TCP, measured in the same run. Not a test:
# nothing here passes or fails.
#   1. iperf3 -t 5 (one stream) plain TCP, then the same binaries under Debian's
#      librspreload.so (socket() becomes rsocket() over softverbs): Gbit/s and the ratio.
#   2. rstream -S 64 -C 1 -I 20000 -T b (blocking ping-pong of 64 B) "usec/xfer" (half a round
#      trip) against a TCP ping-pong of 64 B (sockperf ping-pong's avg-latency, also half a
#      round trip).
#   3. rstream -S 1048576 -C 200 (200 transfers of 1 MiB one way, then 200 back): Gb/sec
#      against iperf3's plain TCP figure of step 1.
# Usage: bench/rsockets_compare.sh [build-dir] [runs]   (default build, 2 runs). Loopback only.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
RUNS=${2:-2}
PRE=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
for b in iperf3 rstream sockperf; do
  command -v $b >/dev/null || {
    echo "missing $b: apt-get install iperf3 rdmacm-utils sockperf" >&2
    exit 1
  }
done
SV=(env LD_LIBRARY_PATH="$B/lib" SOFTVERBS_NETDEV=lo SOFTVERBS_SHM="${SOFTVERBS_SHM:-0}")
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done' EXIT

iperf() {  # iperf [prefix...]: receiver Gbit/s of a 5 s single-stream run
  local port=$((5400 + RANDOM % 200))
  "$@" iperf3 -s -1 -p $port >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.5
  "$@" iperf3 -c 127.0.0.1 -p $port -t 5 -f g 2>/dev/null |
    awk '/receiver/ {for (i = 1; i <= NF; i++) if ($(i + 1) == "Gbits/sec") print $i}'
  wait
}
rstream_field() {  # rstream_field FIELD ARGS...: a column of rstream's result line
  local f=$1 port=$((7600 + RANDOM % 200))
  shift
  "${SV[@]}" rstream -b 127.0.0.1 -p $port "$@" >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.5
  "${SV[@]}" rstream -s 127.0.0.1 -p $port "$@" 2>/dev/null | awk -v f=$f '/^custom/ {print $f}'
  wait
}
sockperf_lat() {  # average one-way latency (us) of a 64 B TCP ping-pong
  local port=$((11200 + RANDOM % 200))
  sockperf server --tcp -i 127.0.0.1 -p $port >/dev/null 2>&1 &
  local s=$!
  pids+=($s)
  sleep 0.5
  sockperf ping-pong --tcp -i 127.0.0.1 -p $port -m 64 -t 5 2>/dev/null |
    awk '/avg-latency/ {for (i = 1; i <= NF; i++) if ($i ~ /avg-latency=/) {sub("avg-latency=", "", $i); print $i}}'
  kill $s 2>/dev/null
  wait 2>/dev/null
}

for r in $(seq "$RUNS"); do
  tcp=$(iperf)
  rs=$(iperf env LD_PRELOAD=$PRE LD_LIBRARY_PATH="$B/lib" SOFTVERBS_NETDEV=lo SOFTVERBS_SHM="${SOFTVERBS_SHM:-0}")
  lat_rs=$(rstream_field 8 -S 64 -C 1 -I 20000 -T b)
  lat_tcp=$(sockperf_lat)
  bw_rs=$(rstream_field 7 -S 1048576 -C 200)
  echo "run $r"
  awk -v a="$rs" -v b="$tcp" 'BEGIN {printf "  iperf3 1 stream: rsockets %s Gbit/s, TCP %s Gbit/s: %.2fx\n", a, b, a / b}'
  awk -v a="$lat_rs" -v b="$lat_tcp" 'BEGIN {printf "  64 B ping-pong one-way: rstream %s us, sockperf TCP %s us: %.2fx (lower is better)\n", a, b, a / b}'
  awk -v a="$bw_rs" -v b="$tcp" 'BEGIN {printf "  1 MiB stream: rstream %s Gbit/s vs TCP iperf3 %s Gbit/s: %.2fx\n", a, b, a / b}'
done
