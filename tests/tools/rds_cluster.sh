#!/usr/bin/env bash
# RDS across a cluster (issue 28 item 6): H hosts, each a network namespace with one link
# to a switch (a bridge in a namespace of its own). Every host sends M messages to every
# other host, from and to 2 sockets on each (tests/rds/rds_flows.cc: every flow checked for
# exactly-once, in-order delivery with a hash chain; any send error fails the host), while
#  - TCP connections are reset (ss -K), on each host in turn, every 0.3 s;
#  - one host's link goes down for 1 s and up again, twice, on different hosts.
# The sends are paced over 6 s (rds_flows --spread), so the run spans both outages however
# fast the machine is (CI once finished 1500 messages per pair in 4 s, before the second).
# Each host has its own RDS registry, as separate machines do: they find each other's
# sockets through each host's RDS directory.
# Usage: rds_cluster.sh <tests-bindir> [hosts] [messages-per-pair]
set -u
BIN=$(cd "$1" && pwd)
H=${2:-6}
M=${3:-1500}
SW=svsw_$$
pids=()
hosts=()
for i in $(seq 1 "$H"); do hosts+=("svh${i}_$$"); done
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for ns in "${hosts[@]}" "$SW"; do ip netns del "$ns" 2>/dev/null; done
  rm -rf /dev/shm/softverbs-rds-cluster-$$-* /tmp/cluster_$$_*.log /tmp/cluster_$$.outages
}
trap cleanup EXIT
fail_setup() {
  echo "cannot build the cluster: $1"
  echo "0 passed, 1 failed"
  exit 1
}
ip netns add "$SW" || fail_setup "ip netns add"
ip -n "$SW" link add br0 type bridge || fail_setup "bridge"
ip -n "$SW" link set br0 up
ip -n "$SW" link set lo up
addr() { echo "10.79.0.$1"; }
for i in $(seq 1 "$H"); do
  ns=${hosts[$((i - 1))]}
  ip netns add "$ns" || fail_setup "ip netns add $ns"
  ip link add "svc$i$$" type veth peer name "svp$i$$" || fail_setup "veth"
  ip link set "svc$i$$" netns "$ns"
  ip link set "svp$i$$" netns "$SW"
  ip -n "$SW" link set "svp$i$$" master br0 up
  ip -n "$ns" addr add "$(addr "$i")/24" dev "svc$i$$"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "svc$i$$" up
done
# The bridge forwards once its ports are up (no STP): wait until host 1 reaches the last.
for _ in $(seq 50); do
  ip netns exec "${hosts[0]}" ping -c 1 -W 1 "$(addr "$H")" >/dev/null 2>&1 && break
  sleep 0.2
done

for i in $(seq 1 "$H"); do
  ns=${hosts[$((i - 1))]}
  peers=$(for j in $(seq 1 "$H"); do [ "$j" != "$i" ] && printf '%s,' "$(addr "$j")"; done)
  SOFTVERBS_RDS_DIR=/dev/shm/softverbs-rds-cluster-$$-$i ip netns exec "$ns" timeout 300 \
    "$BIN/rds_flows" --local "$(addr "$i")" --peer "${peers%,}" --port 7200 --sockets 2 \
    --messages "$M" --seed $((i * 7919)) --timeout 280 --spread 6 >/tmp/cluster_$$_$i.log 2>&1 &
  pids+=($!)
done
flows=("${pids[@]}")

alive() {
  for p in "${flows[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done
  return 1
}
# Connection resets, each host in turn.
(
  k=0
  while alive; do
    sleep 0.3
    ip netns exec "${hosts[$((k % H))]}" ss -K dst 10.79.0.0/24 >/dev/null 2>&1
    k=$((k + 1))
  done
) &
pids+=($!)
# Two link outages of 1 s: host 2's, then host H's.
(
  sleep 2
  for i in 2 "$H"; do
    alive || break
    ip -n "$SW" link set "svp$i$$" down
    sleep 1
    ip -n "$SW" link set "svp$i$$" up
    alive && echo "host $i" >>/tmp/cluster_$$.outages  # it ran through the outage
    sleep 2
  done
) &
pids+=($!)

bad=0
for i in $(seq 1 "$H"); do
  wait "${flows[$((i - 1))]}" || bad=$((bad + 1))
done
for i in $(seq 1 "$H"); do
  echo "host $i: $(tail -n 1 /tmp/cluster_$$_$i.log)"
done
if [ $bad -ne 0 ]; then
  for i in $(seq 1 "$H"); do
    log=/tmp/cluster_$$_$i.log
    tail -n 1 "$log" | grep -q ": OK$" && continue
    echo "== host $i"
    if grep -q "^WARNING: ThreadSanitizer\|^==[0-9]*==ERROR: \|runtime error:" "$log"; then
      sed -n '/^==================$/,/^SUMMARY: /p;/^==[0-9]*==ERROR/,/^SUMMARY: /p;/runtime error:/p' "$log" | head -n 400
    fi
    tail -n 20 "$log"
  done
  echo "0 passed, 1 failed ($bad of $H hosts failed)"
  exit 1
fi
# The faults must have happened while the hosts ran, or the run proved nothing.
outages=$(wc -l </tmp/cluster_$$.outages 2>/dev/null || echo 0)
resets=$(cat /tmp/cluster_$$_*.log | sed -n 's/.* \([0-9]*\) connection resets.*/\1/p' |
  awk '{s += $1} END {print s + 0}')
echo "faults: $outages link outages, $resets connection resets seen by the hosts"
if [ "$outages" -lt 2 ] || [ "$resets" -lt "$H" ]; then
  echo "0 passed, 1 failed (the run ended before its faults: raise rds_flows --spread)"
  exit 1
fi
echo "1 passed, 0 failed ($H hosts, $M messages each way between every pair)"
exit 0
