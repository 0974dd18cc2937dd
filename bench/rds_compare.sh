#!/usr/bin/env bash
# RDS over softverbs against raw verbs on softverbs, measured in the same run (the RDS
# performance goals, docs/benchmarks.md). Not a test: nothing here passes or fails.
#   1. request/ack round trip: rds-stress -q 64 -a 64 -d 1 -t 1 ("rtt us", average) versus a
#      raw verbs SEND round trip, 2 x ib_send_lat -s 112 t_avg (112 B = 64 B + the 48-byte
#      RDS header, what RDS puts on the wire). Goals: within 2.0x blocking, 1.2x
#      busy-polling. ib_send_lat busy-polls its CQ, so the RDS figure is also given with
#      busy polling (SOFTVERBS_RDS_BUSY_POLL_US).
#   2. RDMA: rds-stress -D 1M -M 2 -t 1 (write-only RDMA, every request) at depth 1 and 4,
#      "mbi K/s" (RDMA data written into this side per second) versus ib_write_bw -s 1M.
#      rds-stress is symmetric (both sides issue requests), so the per-direction figure is
#      also compared with ib_write_bw -b (bidirectional, per direction). Goal: >= 0.9x.
#   3. rds-ping's median round trip to an idle RDS process, versus the same raw round trip.
#   Issue 31's goals between hosts are printed too: blocking request/ack RTT <= 1.1x a
#   blocking TCP round trip (sockperf ping-pong without busy polling, 112 B), busy-polled
#   <= 1.2x 2 x ib_send_lat 112 B, RDMA per direction >= 0.95x ib_write_bw -b per direction.
# Usage: bench/rds_compare.sh [--netns] [build-dir] [outdir]   (default build; with outdir,
# also writes rds_rtt.csv, rds_rdma.csv and rds.png there: RDS beside raw verbs, gnuplot).
# Loopback by default: the passive side binds 127.0.0.2, the active side 127.0.0.1. --netns
# (root): the passive side in one network namespace (10.83.1.2), the active side in another
# (10.83.1.1), joined by a veth pair, each with its own RDS registry, as two hosts.
set -uo pipefail
NETNS=0
if [ "${1:-}" = "--netns" ]; then NETNS=1; shift; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:-$ROOT/build}" && pwd)  # absolute: the block server runs from a scratch dir
BIN=$B/bin
export LD_LIBRARY_PATH=$B/lib
# The TCP path, as between hosts (shared memory otherwise, on one host); the caller's wins.
export SOFTVERBS_SHM=${SOFTVERBS_SHM:-0}
RDS_DIR=/dev/shm/softverbs-rds-bench-$$
# SRV/CLI: what runs a passive or an active process where it belongs; P/A: their addresses.
P=127.0.0.2 A=127.0.0.1
SRV=(env SOFTVERBS_NETDEV=lo SOFTVERBS_RDS_DIR=$RDS_DIR)
CLI=(env SOFTVERBS_NETDEV=lo SOFTVERBS_RDS_DIR=$RDS_DIR)
if [ "$NETNS" = 1 ]; then
  . "$ROOT/bench/netns.sh"
  netns_up 1
  P=$SADDR A=$CADDR
  SRV=(ip netns exec $NS_S env SOFTVERBS_NETDEV=$VS SOFTVERBS_RDS_DIR=$RDS_DIR-s)
  CLI=(ip netns exec $NS_C env SOFTVERBS_NETDEV=$VC SOFTVERBS_RDS_DIR=$RDS_DIR-c)
else
  netns_del() { return 0; }
fi
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null; done; rm -rf "$RDS_DIR" "$RDS_DIR"-s "$RDS_DIR"-c; netns_del' EXIT

pt() {  # pt <tool> <args...>: the perftest result line
  "${SRV[@]}" "$@" >/dev/null 2>&1 &
  local s=$!
  pids+=($s)
  sleep 0.8
  "${CLI[@]}" "$@" $P 2>/dev/null | grep -E "^ *[0-9]+ +[0-9]+" | tail -1
  wait $s 2>/dev/null
}
stress() {  # stress <args...>: the active side's "(average)" line
  local port=$((4800 + RANDOM % 100))
  timeout 40 "${SRV[@]}" "$BIN/rds-stress" -r $P -p $port >/dev/null 2>&1 &
  local s=$!
  pids+=($s)
  sleep 0.5
  timeout 40 "${CLI[@]}" "$BIN/rds-stress" -s $P -r $A -p $port -T 5 "$@" 2>/dev/null | grep '(average)'
  wait $s 2>/dev/null
}

# Anchor for the blocking RTT: a blocking TCP round trip (qperf tcp_lat, 112 B), i.e. what
# one thread wake-up per one-way costs on this machine. RDS pays two (device thread, then
# the application), a verbs busy-poller none.
for pkg in qperf sockperf; do
  dpkg-query -W -f='${Status}' $pkg 2>/dev/null | grep -q "ok installed" ||
    apt-get install -y -qq --no-install-recommends $pkg >/dev/null
done
"${SRV[@]}" qperf >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
TCP_RTT=$("${CLI[@]}" qperf -t 3 -m 112 $P tcp_lat | awk '/latency/{v=$3; if ($4=="ms") v*=1000; printf "%.2f", 2*v}')
kill "${pids[-1]}" 2>/dev/null
# Issue 31's anchor: blocking sockperf ping-pong, 112 B (avg-latency is half the round trip).
"${SRV[@]}" sockperf server --tcp -i $P -p 11113 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
BLK_RTT=$("${CLI[@]}" sockperf ping-pong --tcp -i $P -p 11113 -m 112 -t 3 2>/dev/null |
          grep -Eo 'avg-latency=[0-9.]+' | cut -d= -f2 | awk '{printf "%.2f", 2*$1}')
kill "${pids[-1]}" 2>/dev/null
SEND_LAT=$(pt ib_send_lat -s 112 -n 20000 | awk '{print $6}')
SEND_RTT=$(awk -v l="${SEND_LAT:-0}" 'BEGIN{printf "%.2f", 2*l}')
WBW=$(pt ib_write_bw -s 1048576 -D 3 | awk '{print $4}')
WBW_BI=$(pt ib_write_bw -b -s 1048576 -D 3 | awk '{printf "%.0f", $4/2}')
RDS_RTT=$(stress -q 64 -a 64 -d 1 -t 1 | awk '{print $8}')
RDS_RTT_BP=$(SOFTVERBS_RDS_BUSY_POLL_US=200 stress -q 64 -a 64 -d 1 -t 1 | awk '{print $8}')
# The same blocking round trip without the blocked poll() taking its messages in itself
# (SOFTVERBS_RDS_WAIT_RX=0): the progress thread receives and wakes the application.
RDS_RTT_2W=$(SOFTVERBS_RDS_WAIT_RX=0 stress -q 64 -a 64 -d 1 -t 1 | awk '{print $8}')
# rds-ping against an idle RDS process (the block server holds $P's port 0): median
# round trip over 300 pings, one at a time, blocking on both sides.
BS_DIR=$(mktemp -d)
(cd "$BS_DIR" && exec timeout 60 "${SRV[@]}" "$BIN/blockserver" serve --addr $P --port 18777 \
   --file "$BS_DIR/b.img" >/dev/null 2>&1) &
pids+=($!)
sleep 1
PING_RTT=$(timeout 30 "${CLI[@]}" "$BIN/rds-ping" -I $A -c 300 -i 0.003 $P |
           awk '/^ *[0-9]+: [0-9]+ usec/{print $2}' | sort -n |
           awk '{a[NR]=$1} END{if (NR) print a[int(NR/2)+1]}')
kill "${pids[-1]}" 2>/dev/null
wait "${pids[-1]}" 2>/dev/null
rm -rf "$BS_DIR"
RDS_D1=$(stress -q 1024 -a 256 -D 1048576 -M 2 -d 1 -t 1 | awk '{printf "%.0f", $5*1.024/1000}')
RDS_D4=$(stress -q 1024 -a 256 -D 1048576 -M 2 -d 4 -t 1 | awk '{printf "%.0f", $5*1.024/1000}')

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b>0 && a>0) printf "%.2fx", a/b; else print "n/a" }'; }
echo
printf '%-58s %10s %10s %s\n' "measure" "RDS" "raw verbs" "ratio (goal)"
printf '%-58s %10s %10s %s\n' "request/ack RTT us (rds-stress -q 64 -a 64 vs 2x send_lat)" \
  "$RDS_RTT" "$SEND_RTT" "$(ratio "$RDS_RTT" "$SEND_RTT") (<=2.0x blocking)"
printf '%-58s %10s %10s %s\n' "  same, vs a blocking TCP round trip (qperf tcp_lat x2)" \
  "$RDS_RTT" "$TCP_RTT" "$(ratio "$RDS_RTT" "$TCP_RTT")"
printf '%-58s %10s %10s %s\n' "  same, vs blocking sockperf ping-pong 112 B (RTT)" \
  "$RDS_RTT" "$BLK_RTT" "$(ratio "$RDS_RTT" "$BLK_RTT") (<=1.1x, issue 31)"
printf '%-58s %10s %10s %s\n' "  same, vs SOFTVERBS_RDS_WAIT_RX=0 (2 wake-ups/one-way)" \
  "$RDS_RTT" "$RDS_RTT_2W" "$(ratio "$RDS_RTT" "$RDS_RTT_2W")"
printf '%-58s %10s %10s %s\n' "  same, busy-polling (SOFTVERBS_RDS_BUSY_POLL_US=200)" \
  "$RDS_RTT_BP" "$SEND_RTT" "$(ratio "$RDS_RTT_BP" "$SEND_RTT") (<=1.2x)"
printf '%-58s %10s %10s %s\n' "rds-ping RTT us, median (vs 2x send_lat)" \
  "$PING_RTT" "$SEND_RTT" "$(ratio "$PING_RTT" "$SEND_RTT") (<=2x)"
printf '%-58s %10s %10s %s\n' "  same, vs a blocking TCP round trip (qperf tcp_lat x2)" \
  "$PING_RTT" "$TCP_RTT" "$(ratio "$PING_RTT" "$TCP_RTT")"
printf '%-58s %10s %10s %s\n' "RDMA -D 1M -M 2 -d 1 MB/s per direction vs ib_write_bw" \
  "$RDS_D1" "$WBW" "$(ratio "$RDS_D1" "$WBW") (>=0.9x)"
printf '%-58s %10s %10s %s\n' "RDMA -D 1M -M 2 -d 4 MB/s per direction vs ib_write_bw" \
  "$RDS_D4" "$WBW" "$(ratio "$RDS_D4" "$WBW") (>=0.9x)"
printf '%-58s %10s %10s %s\n' "RDMA -D 1M -M 2 -d 4 MB/s per direction vs write_bw -b" \
  "$RDS_D4" "$WBW_BI" "$(ratio "$RDS_D4" "$WBW_BI") (>=0.95x, issue 31)"

# Plots: RDS beside the raw verbs (and TCP) anchors of this run.
if [ $# -ge 2 ]; then
  OUT=$2
  mkdir -p "$OUT"
  {
    echo "measure,RDS,raw verbs (2x ib_send_lat),blocking TCP (2x qperf tcp_lat)"
    echo "blocking,$RDS_RTT,$SEND_RTT,$TCP_RTT"
    echo "busy-poll,$RDS_RTT_BP,$SEND_RTT,$TCP_RTT"
    echo "rds-ping,$PING_RTT,$SEND_RTT,$TCP_RTT"
  } > "$OUT/rds_rtt.csv"
  {
    echo "measure,RDS per direction,ib_write_bw,ib_write_bw -b per direction"
    echo "depth 1,$RDS_D1,$WBW,$WBW_BI"
    echo "depth 4,$RDS_D4,$WBW,$WBW_BI"
  } > "$OUT/rds_rdma.csv"
  dpkg-query -W -f='${Status}' gnuplot-nox 2>/dev/null | grep -q "ok installed" ||
    apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null
  gnuplot -e "out='$OUT'; day='$(date -u +%Y-%m-%d)'" "$ROOT/bench/plot_rds.gp"
  echo "wrote $OUT/rds_rtt.csv $OUT/rds_rdma.csv $OUT/rds.png"
fi
