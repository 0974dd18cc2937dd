#!/usr/bin/env bash
# Scale runs (issue 28), on loopback, not in the default suite (tens of seconds, and two
# processes holding one descriptor per connected QP each):
#   1. N RC QPs between two processes connected out of band (tests/scale/oob_qps.cc), three
#      Sends each way on every QP;
#   2. N rdma_cm connections with rdma-core's own cmtime, unmodified.
# Prints one summary line per run and exits non-zero if any connection or message failed.
# Usage: scripts/scale.sh [BUILD_DIR] [N]      (defaults: build 10000)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:-$ROOT/build}" && pwd)
N=${2:-10000}
export SOFTVERBS_NETDEV=lo
# Each side holds one descriptor per connected QP, and one more per handshake in progress.
ulimit -n "$(ulimit -Hn)" 2>/dev/null
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((N + 512)) ]; then
  echo "scale: $N connections need $((N + 512)) descriptors; ulimit -Hn is $(ulimit -Hn)" >&2
  exit 2
fi
status=0

echo "=== $N RC QPs out of band (oob_qps)"
"$B/tests/oob_qps" -n "$N" -m 3 -t 300 || status=1

echo "=== $N rdma_cm connections (cmtime -c $N)"
if ! command -v cmtime >/dev/null; then
  echo "scale: cmtime not found (Debian package rdmacm-utils)" >&2
  exit 2
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PORT=$((20000 + RANDOM % 10000))
TO=$((60 + N / 20))  # seconds: a hang fails, it does not stall CI
LD_LIBRARY_PATH=$B/lib timeout "$TO" cmtime -p "$PORT" -c "$N" >"$TMP/s.log" 2>&1 &
spid=$!
for _ in $(seq 100); do
  ss -Hltn "sport = :$PORT" | grep -q . && break
  sleep 0.1
done
LD_LIBRARY_PATH=$B/lib timeout "$TO" cmtime -s 127.0.0.1 -p "$PORT" -c "$N" >"$TMP/c.log" 2>&1
crc=$?
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null
sed 's/^/  client: /' "$TMP/c.log" | head -40
if [ $crc -ne 0 ] || grep -Eqi "error|fail|unreachable|rejected" "$TMP/c.log"; then
  echo "cmtime: FAILED (exit $crc)"
  status=1
else
  echo "cmtime: $N connections, exit 0"
fi
exit $status
