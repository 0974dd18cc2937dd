#!/usr/bin/env bash
# Memory per RDS peer and per idle QP (issue 28 item 3), in one run. Not a test: it prints.
#   1. An RDS server's growth per peer process (bench/rds_peers.cc), once every connection
#      has been quiet for 3 s: peers that sent 100 messages of 1 KiB, and of 60,000 B (also
#      echoed back by the server, so its send slots are used), for 10 and 40 peers, and the
#      marginal cost of each of the 30 peers past the first 10.
#      Anchor, same run: the same with a ring of receive buffers per connection
#      (SOFTVERBS_RDS_SRQ=0, the layout before the shared receive pool). Goals: <= 256 KiB
#      per additional idle peer, <= 1 MiB for a process with one peer (tests/rds/
#      test_rds_memory.cc asserts the latter).
#   2. RSS per connected RC QP between two processes, after 16 Sends of 64 KiB each way:
#      at once, and after 1.5 s idle (tests/scale/oob_qps.cc). Anchor, same run: with idle
#      trimming off (SOFTVERBS_IDLE_TRIM_MS=0). Goal: <= 64 KiB per idle QP.
# Usage: bench/rds_memory.sh [build-dir]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:-$ROOT/build}" && pwd)
export LD_LIBRARY_PATH=$B/lib SOFTVERBS_NETDEV=lo
# The TCP path, as between hosts (shared memory otherwise, on one host); the caller's wins.
export SOFTVERBS_SHM=${SOFTVERBS_SHM:-0}
export SOFTVERBS_RDS_DIR=/dev/shm/softverbs-rds-bench-$$
trap 'rm -rf "$SOFTVERBS_RDS_DIR"' EXIT

per_peer() {  # per_peer <srq 0|1> <peers> <bytes> [-e]: KiB of RSS per peer
  SOFTVERBS_RDS_SRQ=$1 timeout 120 "$B/bin/rds_peers" -n "$2" -s "$3" -m 100 ${4:-} |
    awk '{for (i = 1; i <= NF; i++) if ($i == "RSS") print $(i + 1)}'
}
marginal() {  # marginal <kib/peer at 10> <kib/peer at 40>
  awk -v a="$1" -v b="$2" 'BEGIN{ if (a != "" && b != "") printf "%.0f", (40 * b - 10 * a) / 30; else print "n/a" }'
}

printf '%-52s %14s %14s\n' "RDS server, KiB of RSS per peer" "shared pool" "rings (anchor)"
for shape in "1024" "60000" "60000 -e"; do
  read -r bytes echo <<<"$shape"
  for srq in 1 0; do
    a=$(per_peer $srq 10 $bytes $echo)
    b=$(per_peer $srq 40 $bytes $echo)
    eval "A$srq=\$a B$srq=\$b M$srq=\$(marginal \"\$a\" \"\$b\")"
  done
  what="100 x $bytes B${echo:+, echoed}"
  printf '%-52s %14s %14s\n' "  $what: 10 peers, per peer" "$A1" "$A0"
  printf '%-52s %14s %14s\n' "  $what: 40 peers, per peer" "$B1" "$B0"
  printf '%-52s %14s %14s\n' "  $what: each peer past 10 (goal <= 256)" "$M1" "$M0"
done

qp() {  # qp <trim ms>: "KiB/QP at once" "KiB/QP idle"
  SOFTVERBS_IDLE_TRIM_MS=$1 timeout 120 "$B/tests/oob_qps" -n 200 -m 16 -s 65536 -t 60 -i 1500 |
    awk '/^oob_qps parent: qps/{for (i = 1; i <= NF; i++) if ($i == "RSS") a = $(i + 1)}
         /^oob_qps parent: idle/{for (i = 1; i <= NF; i++) if ($i == "RSS") b = $(i + 1)}
         END{print a, b}'
}
read -r T1 I1 < <(qp 200)
read -r T0 I0 < <(qp 0)
printf '%-52s %14s %14s\n' "RC QP, KiB of RSS per QP (200 QPs, 64 KiB Sends)" "idle trim" "no trim"
printf '%-52s %14s %14s\n' "  right after the traffic" "$T1" "$T0"
printf '%-52s %14s %14s\n' "  after 1.5 s idle (goal <= 64)" "$I1" "$I0"
