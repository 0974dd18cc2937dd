#!/usr/bin/env bash
# Bandwidth against message size (8 B .. 4 MiB) for softverbs' RDMA WRITE, READ and SEND
# (unmodified perftest, -a) beside the same run's anchors on the same loopback: qperf tcp_bw
# and UCX's tcp transport (ucx_perftest ucp_put_bw); and latency percentiles of SEND/WRITE
# 8 B beside sockperf's busy-poll TCP ping-pong. Writes CSV and PNG (gnuplot) to <outdir>.
# Not a test: nothing here passes or fails.
# Usage: bench/sweep.sh [libdir] [outdir]   (defaults: build/lib, bench/out)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIB=${1:-$ROOT/build/lib}
OUT=${2:-$ROOT/bench/out}
mkdir -p "$OUT"
for p in qperf sockperf ucx-utils gnuplot-nox perftest; do
  dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q "ok installed" ||
    { apt-get install -y -qq --no-install-recommends qperf sockperf ucx-utils gnuplot-nox perftest >/dev/null; break; }
done
A=127.0.0.1
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done' EXIT
sizes() { local s=8; while [ $s -le 4194304 ]; do echo $s; s=$((s * 2)); done; }

# --- anchors -------------------------------------------------------------------------------
qperf >/dev/null 2>&1 & pids+=($!); sleep 0.5
qperf -t 1 -oo msg_size:8:4M:*2 $A tcp_bw 2>/dev/null |
  awk 'BEGIN{s=8} /^ *bw/{v=$3; u=$4; if (u=="GB/sec") v*=1000; else if (u=="KB/sec") v/=1000;
       print s, v; s*=2}' > "$OUT/.qperf"   # one "bw =" per size, in order
kill ${pids[-1]} 2>/dev/null
: > "$OUT/.ucx"
for s in $(sizes); do
  n=$(( (1 << 30) / s )); [ $n -gt 100000 ] && n=100000; [ $n -lt 200 ] && n=200
  UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest -t ucp_put_bw -s $s -n $n >/dev/null 2>&1 & pids+=($!); sleep 0.5
  v=$(UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest $A -t ucp_put_bw -s $s -n $n 2>/dev/null |
      awk '/Final:/{printf "%.2f", $(NF-2) * 1.048576}')
  wait ${pids[-1]} 2>/dev/null
  echo "$s ${v:-0}" >> "$OUT/.ucx"
done
taskset -c 1 sockperf server --tcp -i $A -p 11112 --nonblocked >/dev/null 2>&1 & pids+=($!); sleep 0.5
taskset -c 0 sockperf ping-pong --tcp -i $A -p 11112 --nonblocked -m 14 -t 3 2>/dev/null |
  awk '/percentile 50.000/{p50=$NF} /percentile 99.000/{p99=$NF} /percentile 99.900/{p999=$NF}
       /<MIN>/{mn=$NF} END{print mn, p50, p99, p999}' > "$OUT/.sockperf"
kill ${pids[-1]} 2>/dev/null

# --- softverbs through unmodified perftest -----------------------------------------------
export LD_LIBRARY_PATH=$LIB SOFTVERBS_NETDEV=lo
# The TCP path, as between hosts: same-host peers would otherwise use shared memory
# (bench/shm_compare.sh measures that). SOFTVERBS_SHM=1 in the caller's environment wins.
export SOFTVERBS_SHM=${SOFTVERBS_SHM:-0}
pt() {  # pt <tool> <args...>: perftest's result lines
  "$@" >/dev/null 2>&1 & local s=$!; pids+=($s); sleep 0.8
  "$@" $A 2>/dev/null | grep -E "^ *[0-9]+ +[0-9]+"
  wait $s 2>/dev/null
}
for t in write read send; do
  pt ib_${t}_bw -a -n 500 | awk '$1 >= 8 && $1 <= 4194304 {print $1, $4}' > "$OUT/.$t"
done
# t_min, t_typical, 99%, 99.9% (us): one way, half the round trip, as sockperf reports too
SL=$(pt ib_send_lat -s 8 -n 20000 | awk '{print $3, $5, $8, $9}')
WL=$(pt ib_write_lat -s 8 -n 20000 | awk '{print $3, $5, $8, $9}')

# --- CSV and plots -------------------------------------------------------------------------
{
  echo "size_bytes,write_MBps,read_MBps,send_MBps,qperf_tcp_bw_MBps,ucx_tcp_put_bw_MBps"
  join <(sort -k1,1 "$OUT/.write") <(sort -k1,1 "$OUT/.read") |
    join - <(sort -k1,1 "$OUT/.send") | join - <(sort -k1,1 "$OUT/.qperf") |
    join - <(sort -k1,1 "$OUT/.ucx") | sort -n | tr ' ' ','
} > "$OUT/bw.csv"
read -r smin s50 s99 s999 < "$OUT/.sockperf"
{
  echo "measure,min_us,typical_us,p99_us,p99.9_us"
  echo "softverbs SEND 8 B,${SL// /,}"
  echo "softverbs WRITE 8 B,${WL// /,}"
  echo "TCP busy-poll 14 B (sockperf),$smin,$s50,$s99,$s999"
} > "$OUT/lat.csv"
rm -f "$OUT"/.qperf "$OUT"/.ucx "$OUT"/.write "$OUT"/.read "$OUT"/.send "$OUT"/.sockperf
gnuplot -e "out='$OUT'; day='$(date -u +%Y-%m-%d)'" "$ROOT/bench/plot.gp"
echo "wrote $OUT/bw.csv $OUT/bw.png $OUT/lat.csv $OUT/lat.png"
cat "$OUT/bw.csv" "$OUT/lat.csv"
