#!/usr/bin/env bash
# Benchmarks softverbs against anchors measured in the same run on this machine:
# raw TCP (qperf tcp_bw/tcp_lat, sockperf busy-poll ping-pong) and UCX's tcp transport.
# Prints each figure and its ratio to the anchor. Not a test: nothing here passes or fails.
# Usage: bench/compare.sh [--netns] [libdir]   (default build/lib)
#   Loopback by default. --netns (root): the servers in one network namespace and the clients
#   in another, joined by a veth pair, as two hosts are (issue 31 measures between hosts):
#   the TCP path whatever SOFTVERBS_SHM says, and the kernel's loopback shortcuts are gone.
#   With perf installed, the event-driven row and the message rate also print the system
#   calls per message (both processes, every thread; perf's raw_syscalls:sys_enter).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NETNS=0
if [ "${1:-}" = "--netns" ]; then NETNS=1; shift; fi
LIB=${1:-$ROOT/build/lib}
for p in qperf sockperf ucx-utils time; do
  dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q "ok installed" ||
    { apt-get install -y -qq --no-install-recommends qperf sockperf ucx-utils time >/dev/null; break; }
done
T=$(mktemp -d)
timed() {  # timed <file> <cmd...>: GNU time writes "user sys maxrss_kB" (last line) to <file>
  local f=$1; shift
  /usr/bin/time -f "%U %S %M" -o "$f" "$@"
}
cpu_of() { tail -1 "$1" | awk '{print $1 + $2}'; }
rss_of() { tail -1 "$1" | awk '{print $3}'; }
# CPU seconds (both processes, user + system) per GB moved in <seconds> at <MB/s>.
per_gb() { awk -v c="$1" -v bw="$2" -v t="$3" 'BEGIN{ if (bw > 0) printf "%.2f", c / (bw * t / 1000); else print "n/a" }'; }
A=127.0.0.1
# SRV/CLI: what runs a server or a client where it belongs (and with which softverbs and UCX
# netdev); nothing on loopback.
SRV=(env SOFTVERBS_NETDEV=lo UCX_NET_DEVICES=lo)
CLI=(env SOFTVERBS_NETDEV=lo UCX_NET_DEVICES=lo)
if [ "$NETNS" = 1 ]; then
  . "$ROOT/bench/netns.sh"
  netns_up 0
  A=$SADDR
  SRV=(ip netns exec $NS_S env SOFTVERBS_NETDEV=$VS UCX_NET_DEVICES=$VS)
  CLI=(ip netns exec $NS_C env SOFTVERBS_NETDEV=$VC UCX_NET_DEVICES=$VC)
else
  netns_del() { return 0; }
fi
pids=()
# A server started through timed() is a shell, GNU time and the server: stop the server
# itself (the leaves of the tree), so time still writes its figures and nothing is left.
leaves() { local c; c=$(pgrep -P "$1"); if [ -z "$c" ]; then echo "$1"; else for x in $c; do leaves "$x"; done; fi; }
stop() { kill $(leaves "$1") 2>/dev/null; wait "$1" 2>/dev/null; }
trap 'for p in "${pids[@]}"; do stop $p; done; rm -rf "$T"; netns_del' EXIT
num() { grep -Eo '[0-9]+(\.[0-9]+)?' | head -1; }

# --- anchors -----------------------------------------------------------------------------
timed $T/qs "${SRV[@]}" qperf >/dev/null 2>&1 & pids+=($!); sleep 0.5
TCP_BW=$(timed $T/qc "${CLI[@]}" qperf -t 3 -m 1M $A tcp_bw | awk '/^ *bw/{v=$3; u=$4; if (u=="GB/sec") v*=1000; print v}')
stop ${pids[-1]}
TCP_CPU=$(per_gb "$(awk -v a="$(cpu_of $T/qs)" -v b="$(cpu_of $T/qc)" 'BEGIN{print a+b}')" "$TCP_BW" 3)
"${SRV[@]}" qperf >/dev/null 2>&1 & pids+=($!); sleep 0.5
TCP_LAT=$("${CLI[@]}" qperf -t 3 -m 8 $A tcp_lat | awk '/latency/{v=$3; if ($4=="ms") v*=1000; print v}')
stop ${pids[-1]}
# Raw TCP 8 B message rate: one send() per 8-byte message, a stream (qperf -v msg_rate).
"${SRV[@]}" qperf >/dev/null 2>&1 & pids+=($!); sleep 0.5
TCP_RATE=$("${CLI[@]}" qperf -v -t 3 -m 8 $A tcp_bw | awk '/msg_rate/{v=$3; if ($4=="K/sec") v/=1000; print v}')
stop ${pids[-1]}
taskset -c 1 "${SRV[@]}" sockperf server --tcp -i $A -p 11111 --nonblocked >/dev/null 2>&1 & pids+=($!); sleep 0.5
BP_LAT=$(taskset -c 0 "${CLI[@]}" sockperf ping-pong --tcp -i $A -p 11111 --nonblocked -m 14 -t 3 2>/dev/null |
         awk '/avg-latency/{print $0}' | grep -Eo 'avg-latency=[0-9.]+' | cut -d= -f2)
stop ${pids[-1]}
# Blocking TCP ping-pong (sockperf without --nonblocked): what an event-driven program's
# round trip is measured against (ib_send_lat -e, issue 31).
"${SRV[@]}" sockperf server --tcp -i $A -p 11112 >/dev/null 2>&1 & pids+=($!); sleep 0.5
BLK_LAT=$("${CLI[@]}" sockperf ping-pong --tcp -i $A -p 11112 -m 14 -t 3 2>/dev/null |
          grep -Eo 'avg-latency=[0-9.]+' | cut -d= -f2)
stop ${pids[-1]}
"${SRV[@]}" UCX_TLS=tcp ucx_perftest -t ucp_put_bw -s 1048576 -n 2000 >/dev/null 2>&1 & pids+=($!); sleep 1
UCX_BW=$("${CLI[@]}" UCX_TLS=tcp ucx_perftest $A -t ucp_put_bw -s 1048576 -n 2000 2>/dev/null |
         awk '/Final:/{print $(NF-2)}')
UCX_BW_MB=$(awk -v m="${UCX_BW:-0}" 'BEGIN{printf "%.0f", m*1.048576}')   # MiB/s -> MB/s
wait ${pids[-1]} 2>/dev/null

# --- softverbs through unmodified perftest -------------------------------------------
export LD_LIBRARY_PATH=$LIB
# The TCP path, as between hosts: same-host peers would otherwise use shared memory
# (bench/shm_compare.sh measures that). SOFTVERBS_SHM=1 in the caller's environment wins.
export SOFTVERBS_SHM=${SOFTVERBS_SHM:-0}
# pt <tool> <args...>: the perftest result line; CPU and max RSS in $T/ps, $T/pc. With
# COUNT=1 (and perf), the system calls both processes made in $T/ks, $T/kc.
HAVE_PERF=0
command -v perf >/dev/null && perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1 && HAVE_PERF=1
pt() {
  local ks=() kc=()
  if [ "${COUNT:-0}" = 1 ] && [ "$HAVE_PERF" = 1 ]; then
    ks=(perf stat -x, -e raw_syscalls:sys_enter -o $T/ks)
    kc=(perf stat -x, -e raw_syscalls:sys_enter -o $T/kc)
  fi
  timed $T/ps "${SRV[@]}" "${ks[@]}" "$@" >/dev/null 2>&1 & local s=$!; pids+=($s); sleep 0.8
  timed $T/pc "${CLI[@]}" "${kc[@]}" "$@" $A 2>/dev/null | grep -E "^ *[0-9]+ +[0-9]+" | tail -1
  wait $s 2>/dev/null
}
# System calls per message of the last COUNT=1 run, both processes: calls_per <messages>.
calls_per() {
  [ "$HAVE_PERF" = 1 ] || { echo n/a; return; }
  awk -F, -v n="$1" '/raw_syscalls/ {c += $1} END {if (n > 0 && c > 0) printf "%.1f", c / n; else print "n/a"}' \
    $T/ks $T/kc 2>/dev/null
}
pt_cpu() { awk -v a="$(cpu_of $T/ps)" -v b="$(cpu_of $T/pc)" 'BEGIN{print a+b}'; }
WBW=$(pt ib_write_bw -s 1048576 -D 3 | awk '{print $4}')
WBW_CPU=$(per_gb "$(pt_cpu)" "$WBW" 3)
WBW_R=$(pt ib_write_bw -R -s 1048576 -D 3 | awk '{print $4}')
RBW=$(pt ib_read_bw -s 1048576 -D 3 | awk '{print $4}')
RBW_CPU=$(per_gb "$(pt_cpu)" "$RBW" 3)
# Memory per QP: the server's peak RSS with 16 QPs against 1 (64 KiB messages).
pt ib_write_bw -q 1 -s 65536 -D 1 >/dev/null; RSS1=$(rss_of $T/ps)
pt ib_write_bw -q 16 -s 65536 -D 1 >/dev/null; RSS16=$(rss_of $T/ps)
QP_KB=$(awk -v a="${RSS1:-0}" -v b="${RSS16:-0}" 'BEGIN{printf "%.0f", (b - a) / 15}')
SLAT=$(pt ib_send_lat -s 8 -n 20000 | awk '{print $5}')
WLAT=$(pt ib_write_lat -s 8 -n 20000 | awk '{print $5}')
# Event-driven: each side sleeps in ibv_get_cq_event (the completion channel) per message.
ELAT=$(COUNT=1 pt ib_send_lat -e -s 8 -n 20000 | awk '{print $5}')
ELAT_CALLS=$(calls_per 20000)  # per round trip: one message each way
SBW8=$(pt ib_send_bw -s 8 -D 3 | awk '{print $5}')
# Its syscalls per message, from a run of a known count (-D gives no count).
COUNT=1 pt ib_send_bw -s 8 -n 1000000 >/dev/null
SBW8_CALLS=$(calls_per 1000000)
# The same with RFC 5040's completion rule (SOFTVERBS_IB_COMPLETION=0): under IB's, the
# default, perftest's window of 128 WRs, one signaled per 100, waits for the peer's
# placement rather than for TCP.
SBW8_RFC=$(SOFTVERBS_IB_COMPLETION=0 pt ib_send_bw -s 8 -D 3 | awk '{print $5}')

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b>0 && a>0) printf "%.2fx", a/b; else print "n/a" }'; }
echo
printf '%-46s %12s %12s %s\n' "measure" "softverbs" "anchor" "ratio (goal)"
printf '%-46s %12s %12s %s\n' "RDMA WRITE 1 MiB MB/s vs qperf tcp_bw 1M" "$WBW" "$TCP_BW" "$(ratio "$WBW" "$TCP_BW") (>=1.0x)"
printf '%-46s %12s %12s %s\n' "RDMA WRITE 1 MiB MB/s vs UCX tcp put_bw 1M" "$WBW" "$UCX_BW_MB" "$(ratio "$WBW" "$UCX_BW_MB") (>=1.2x)"
printf '%-46s %12s %12s %s\n' "RDMA WRITE 1 MiB (-R) MB/s vs qperf" "$WBW_R" "$TCP_BW" "$(ratio "$WBW_R" "$TCP_BW")"
printf '%-46s %12s %12s %s\n' "  same, vs WRITE out of band" "$WBW_R" "$WBW" "$(ratio "$WBW_R" "$WBW") (>=0.9x)"
printf '%-46s %12s %12s %s\n' "RDMA READ 1 MiB MB/s vs qperf tcp_bw 1M" "$RBW" "$TCP_BW" "$(ratio "$RBW" "$TCP_BW")"
printf '%-46s %12s %12s %s\n' "  same, vs WRITE 1 MiB" "$RBW" "$WBW" "$(ratio "$RBW" "$WBW") (>=0.9x)"
printf '%-46s %12s %12s %s\n' "SEND 8 B typical us vs sockperf busy-poll" "$SLAT" "$BP_LAT" "$(ratio "$SLAT" "$BP_LAT") (<=1.1x)"
printf '%-46s %12s %12s %s\n' "WRITE 8 B typical us vs sockperf busy-poll" "$WLAT" "$BP_LAT" "$(ratio "$WLAT" "$BP_LAT") (<=1.2x)"
printf '%-46s %12s %12s %s\n' "SEND 8 B typical us vs qperf tcp_lat (blocking)" "$SLAT" "$TCP_LAT" "$(ratio "$SLAT" "$TCP_LAT")"
printf '%-46s %12s %12s %s\n' "SEND 8 B -e (event) us vs sockperf blocking" "$ELAT" "$BLK_LAT" "$(ratio "$ELAT" "$BLK_LAT") (<=1.2x)"
printf '%-46s %12s %12s %s\n' "  same, syscalls per round trip (both sides)" "$ELAT_CALLS" "4" "(blocking TCP: send+recv each side)"
printf '%-46s %12s %12s %s\n' "SEND 8 B message rate Mpps (goal >= 1)" "$SBW8" "1" "$(ratio "$SBW8" 1)"
printf '%-46s %12s %12s %s\n' "  same, syscalls per message (both sides)" "$SBW8_CALLS" "" "(goal: well under 1)"
printf '%-46s %12s %12s %s\n' "  same, vs raw TCP 8 B message rate (qperf)" "$SBW8" "$TCP_RATE" "$(ratio "$SBW8" "$TCP_RATE") (>=0.8x)"
printf '%-46s %12s %12s %s\n' "  same, vs RFC 5040's rule (IB_COMPLETION=0)" "$SBW8" "$SBW8_RFC" "$(ratio "$SBW8" "$SBW8_RFC") (>=0.95x)"
printf '%-46s %12s %12s %s\n' "CPU s per GB, WRITE 1 MiB vs qperf tcp_bw" "$WBW_CPU" "$TCP_CPU" "$(ratio "$WBW_CPU" "$TCP_CPU") (perftest's client spins)"
printf '%-46s %12s %12s %s\n' "CPU s per GB, READ 1 MiB vs qperf tcp_bw" "$RBW_CPU" "$TCP_CPU" "$(ratio "$RBW_CPU" "$TCP_CPU")"
printf '%-46s %12s %12s %s\n' "memory per QP, kB (server RSS, 16 QPs vs 1)" "$QP_KB" "" ""
