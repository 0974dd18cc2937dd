#!/usr/bin/env bash
# The demo: builds softverbs and moves real data through it on localhost with unmodified
# Debian programs (rdma-core's rping and ibv_rc_pingpong, perftest), via LD_LIBRARY_PATH.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/install-deps.sh
bash scripts/build.sh build >/dev/null
export LD_LIBRARY_PATH=$ROOT/build/lib
export SOFTVERBS_NETDEV=${SOFTVERBS_NETDEV:-lo}   # GIDs from loopback only
ADDR=127.0.0.1
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

step() { echo; echo "== $*"; }

step "the device, as ibv_devinfo sees it"
ibv_devinfo | sed -n '1,25p'

step "rping: rdma_cm connect, SEND + RDMA READ + RDMA WRITE, 10 validated iterations"
rping -s -a $ADDR -p 7174 -C 10 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
rping -c -a $ADDR -p 7174 -C 10 -v | tail -3

step "ibv_rc_pingpong: out-of-band QP set-up (GID + QPN), 4 KiB SEND/RECV ping-pong"
ibv_rc_pingpong -g 0 -n 1000 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
ibv_rc_pingpong -g 0 -n 1000 $ADDR | tail -2

step "ib_write_bw -R: RDMA WRITE bandwidth over rdma_cm, 1 MiB messages"
ib_write_bw -R -s 1048576 -D 2 >/dev/null 2>&1 &
pids+=($!)
sleep 0.7
ib_write_bw -R -s 1048576 -D 2 $ADDR | grep -E "^ *#bytes|^ *[0-9]+ "

step "ib_read_lat: RDMA READ latency, 8 bytes"
ib_read_lat -n 2000 -s 8 >/dev/null 2>&1 &
pids+=($!)
sleep 0.7
ib_read_lat -n 2000 -s 8 $ADDR | grep -E "^ *#bytes|^ *[0-9]+ "
wait

step "RDS: the seeds' zero-copy block server (RDMA WRITE + immediate reply; RDMA READ + durable)"
rm -f /tmp/softverbs-demo-blocks.img
build/bin/blockserver serve --addr 127.0.0.2 --port 18700 --file /tmp/softverbs-demo-blocks.img \
  --blocks 128 &
bs=$!
sleep 0.5
build/bin/blockserver client --server 127.0.0.2 --port 18700 --addr 127.0.0.1 --ops 400 --blocks 128

step "RDS: rds-ping (the block server's stack answers port 0 of 127.0.0.2)"
build/bin/rds-ping -c 3 -i 0.2 127.0.0.2
kill $bs

step "RDS: rds-stress with 1 MiB RDMA, verified (3 s)"
build/bin/rds-stress -r 127.0.0.2 -p 4000 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
build/bin/rds-stress -s 127.0.0.2 -r 127.0.0.1 -p 4000 -T 3 -D 1M -v | tail -n 2
wait
echo
echo "demo complete"
