#!/usr/bin/env bash
# Same-host speed (issue 29): softverbs with the shared-memory transport (SOFTVERBS_SHM=1)
# and without it (TCP), through unmodified perftest, against UCX's shared-memory transports
# measured in the same run (posix for active messages, cma for put/get). Prints each figure
# and its ratio to the anchor, with the issue's goal. Not a test: nothing passes or fails.
# Usage: bench/shm_compare.sh [libdir] [outdir]   (default build/lib). One host, loopback only.
# With outdir, also writes shm.csv and shm.png (gnuplot): each figure as speed relative to its
# anchor (anchor latency / ours, or our rate / the anchor's: higher is better, 1 = as fast),
# for both transports, beside the goal.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIB=${1:-$ROOT/build/lib}
OUT=${2:-}
for p in ucx-utils perftest gnuplot-nox; do
  dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q "ok installed" ||
    { apt-get install -y -qq --no-install-recommends ucx-utils perftest gnuplot-nox >/dev/null; break; }
done
A=127.0.0.1
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT

# ucx <field> <args...>: one UCT test between two processes; the "Final:" line's field
# (from the end: 0 = last). Latency tests report typical (median) one-way latency in us.
ucx() {
  local f=$1; shift
  ucx_perftest -p 13399 "$@" >/dev/null 2>&1 & pids+=($!); sleep 0.7
  ucx_perftest -p 13399 "$@" $A 2>/dev/null | awk -v f="$f" '/Final:/{print $(NF-f)}'
  wait "${pids[-1]}" 2>/dev/null
}
# UCT Final columns: ... | typical avg overall (latency, us) | avg overall (BW MB/s) | avg overall (msg/s)
UCX_AM_LAT=$(ucx 6 -d memory -x posix -t am_lat -s 8 -n 200000)
UCX_AM_RATE=$(ucx 0 -d memory -x posix -t am_bw -s 8 -n 2000000)
UCX_PUT_BW=$(ucx 2 -d memory -x cma -t put_bw -D zcopy -s 1048576 -n 4000)
UCX_GET_BW=$(ucx 2 -d memory -x cma -t get -D zcopy -s 1048576 -n 4000)

export LD_LIBRARY_PATH=$LIB SOFTVERBS_NETDEV=lo
pt() {  # pt <tool> <args...>: the client's perftest result line
  "$@" >/dev/null 2>&1 & local s=$!; pids+=($s); sleep 0.8
  "$@" $A 2>/dev/null | grep -E "^ *[0-9]+ +[0-9]+" | tail -1
  wait $s 2>/dev/null
}
run() {  # run <shm 0|1>: sets SLAT WLAT RATE WBW RBW
  export SOFTVERBS_SHM=$1
  SLAT=$(pt ib_send_lat -s 8 -n 20000 | awk '{print $5}')      # t_typical, us (round trip / 2)
  WLAT=$(pt ib_write_lat -s 8 -n 20000 | awk '{print $5}')
  RATE=$(pt ib_send_bw -s 8 -D 3 | awk '{print $5}')           # Mpps
  WBW=$(pt ib_write_bw -s 1048576 -D 3 | awk '{print $4}')     # MB/s
  RBW=$(pt ib_read_bw -s 1048576 -D 3 | awk '{print $4}')
}
run 0; T_SLAT=$SLAT T_WLAT=$WLAT T_RATE=$RATE T_WBW=$WBW T_RBW=$RBW
run 1
unset SOFTVERBS_SHM

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b>0 && a>0) printf "%.2fx", a/b; else print "n/a" }'; }
mpps() { awk -v m="$1" 'BEGIN{ printf "%.2f", m / 1e6 }'; }
UCX_AM_MPPS=$(mpps "${UCX_AM_RATE:-0}")
printf '%-40s %10s %10s %10s  %-12s %s\n' "measure" "shm" "tcp" "anchor" "shm/anchor" "goal"
row() { printf '%-40s %10s %10s %10s  %-12s %s\n' "$1" "$2" "$3" "$4" "$(ratio "$2" "$4")" "$5"; }
row "SEND 8 B latency (us, typical)" "$SLAT" "$T_SLAT" "$UCX_AM_LAT" "<= 2.0x UCX posix am_lat"
row "WRITE 8 B latency (us, typical)" "$WLAT" "$T_WLAT" "$UCX_AM_LAT" "<= 2.0x UCX posix am_lat"
row "SEND 8 B message rate (Mpps)" "$RATE" "$T_RATE" "$UCX_AM_MPPS" ">= 0.5x UCX posix am_bw"
row "WRITE 1 MiB (MB/s)" "$WBW" "$T_WBW" "$UCX_PUT_BW" ">= 1.0x UCX cma put_bw"
row "READ 1 MiB (MB/s)" "$RBW" "$T_RBW" "$UCX_GET_BW" ">= 1.0x UCX cma get"
echo
echo "shm against tcp (softverbs' two transports, same run):"
printf '  SEND lat %s, WRITE lat %s, rate %s, WRITE bw %s, READ bw %s\n' \
  "$(ratio "$SLAT" "$T_SLAT")" "$(ratio "$WLAT" "$T_WLAT")" "$(ratio "$RATE" "$T_RATE")" \
  "$(ratio "$WBW" "$T_WBW")" "$(ratio "$RBW" "$T_RBW")"

[ -n "$OUT" ] || exit 0
mkdir -p "$OUT"
# speed <ours> <anchor> <lat|rate>: relative speed, higher is better (0 when not measured).
speed() {
  awk -v a="$1" -v b="$2" -v k="$3" 'BEGIN{ if (a>0 && b>0) printf "%.3f", (k=="lat") ? b/a : a/b; else print 0 }'
}
{
  echo "measure,shm,tcp,goal,shm_value,tcp_value,anchor_value"
  echo "SEND 8 B lat.,$(speed "$SLAT" "$UCX_AM_LAT" lat),$(speed "$T_SLAT" "$UCX_AM_LAT" lat),0.5,$SLAT,$T_SLAT,$UCX_AM_LAT"
  echo "WRITE 8 B lat.,$(speed "$WLAT" "$UCX_AM_LAT" lat),$(speed "$T_WLAT" "$UCX_AM_LAT" lat),0.5,$WLAT,$T_WLAT,$UCX_AM_LAT"
  echo "SEND 8 B rate,$(speed "$RATE" "$UCX_AM_MPPS" rate),$(speed "$T_RATE" "$UCX_AM_MPPS" rate),0.5,$RATE,$T_RATE,$UCX_AM_MPPS"
  echo "WRITE 1 MiB,$(speed "$WBW" "$UCX_PUT_BW" rate),$(speed "$T_WBW" "$UCX_PUT_BW" rate),1.0,$WBW,$T_WBW,$UCX_PUT_BW"
  echo "READ 1 MiB,$(speed "$RBW" "$UCX_GET_BW" rate),$(speed "$T_RBW" "$UCX_GET_BW" rate),1.0,$RBW,$T_RBW,$UCX_GET_BW"
} >"$OUT/shm.csv"
gnuplot -e "out='$OUT'; day='$(date -u +%Y-%m-%d)'" "$ROOT/bench/plot_shm.gp"
echo "wrote $OUT/shm.csv and $OUT/shm.png"
