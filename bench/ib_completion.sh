#!/usr/bin/env bash
# The cost of IB's completion rule (SOFTVERBS_IB_COMPLETION=1: Sends and Writes complete on
# the peer's Placement Ack) against RFC 5040's rule (the default: complete on transmit),
# measured in the same run with unmodified perftest on loopback.
# RFC 5040's rule is the anchor: each row prints both and their ratio (IB / RFC 5040; for
# latency lower is better). Not a test: nothing here passes or
# fails. This VM is noisy: modes alternate within each round, and each round prints its own
# row; compare rows, not single numbers.
# Usage: bench/ib_completion.sh [libdir] [rounds]   (default build/lib, 2)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIB=${1:-$ROOT/build/lib}
ROUNDS=${2:-2}
export LD_LIBRARY_PATH=$LIB SOFTVERBS_NETDEV=lo
A=127.0.0.1
# run <mode 0|1> <field> <tool> <args...>: field <field> of perftest's result line.
run() {
  local mode=$1 field=$2
  shift 2
  SOFTVERBS_IB_COMPLETION=$mode timeout 60 "$@" >/dev/null 2>&1 & local s=$!
  sleep 0.8
  SOFTVERBS_IB_COMPLETION=$mode timeout 60 "$@" $A 2>/dev/null |
    awk -v f="$field" '/^ *[0-9]+ +[0-9]+ +[0-9.]+/ {print $f; exit}'
  wait $s 2>/dev/null
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2fx", a / b; else print "n/a" }'; }
row() {  # row <label> <field> <tool> <args...>
  local label=$1 field=$2
  shift 2
  local d i
  d=$(run 0 "$field" "$@")
  i=$(run 1 "$field" "$@")
  printf '%-34s %12s %12s %8s\n' "$label" "${d:-n/a}" "${i:-n/a}" "$(ratio "${i:-0}" "${d:-0}")"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r"
  printf '%-34s %12s %12s %8s\n' measure rfc5040 ib_rule ratio
  row "ib_send_lat 8 B typical (us)" 5 ib_send_lat -n 20000
  row "ib_write_lat 8 B typical (us)" 5 ib_write_lat -n 20000
  row "ib_write_bw 1 MiB (MB/s)" 4 ib_write_bw -s 1048576 -n 2000
  row "ib_send_bw 8 B (Mpps)" 5 ib_send_bw -s 8 -n 100000
done
