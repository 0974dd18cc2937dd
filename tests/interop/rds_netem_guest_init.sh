#!/bin/sh
# /init of the RDS-under-tc-netem guest (busybox sh in the initramfs rds_netem_qemu.sh builds).
#
# The scenario of tests/tools/rds_reliability.sh, with real tc netem: two network namespaces
# joined by veth, "tc qdisc add dev X root netem $NETEM" on both veth ends, one rds_flows per
# namespace sending $MSGS messages each way, and forced TCP resets (ss -K, alternately from
# either namespace) every 0.2-0.5 s while they run. Settings come from /etc/rn.conf (written
# by the host script). Everything is reported on the serial console (ttyS0):
#   @@RN INIT/BOOT ok|fail/START/TICK/RESULT <side> rc=N/STATS/DONE   progress and results
#   @@OUT <side>| ...        rds_flows' output (side A = 10.78.0.1, side B = 10.78.0.2)
#   @@TC <side>| ...         tc -s qdisc and ip -s link of that side's veth, after the run
#   @@CNT <side>| key=value  TCP/IP counters of that namespace (/proc/net/snmp, netstat)
#   @@KERN| ...              kernel warnings (BUG, Oops, WARNING) from dmesg
export PATH=/usr/sbin:/usr/bin:/bin:/sbin
# Debian's static busybox runs its own applets before looking at PATH: the real iproute2.
ip() { /usr/sbin/ip "$@"; }
tc() { /usr/sbin/tc "$@"; }
ss() { /usr/bin/ss "$@"; }
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/shm /tmp /run
mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mkdir -p /run/netns

up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "@@RN $*"; }
bye() { say "DONE t=$(up)"; sync; poweroff -f; sleep 5; }

MSGS=25000
TMO=1200
SOCKETS=4
DEBUG=0
RESETS=both
NETEM="loss 1% duplicate 1% corrupt 0.1% delay 1ms reorder 25% 50%"
# shellcheck disable=SC1091
. /etc/rn.conf

say "INIT t=$(up) kernel=$(uname -r) cpus=$(nproc) mem=$(awk '/MemTotal/ {print $2 "kB"}' /proc/meminfo)"
KV=$(uname -r)
while read -r m; do
  [ -n "$m" ] || continue
  insmod "/lib/modules/$KV/$m" 2>/tmp/insmod.err || say "WARN insmod $m: $(cat /tmp/insmod.err)"
done < /etc/rn-modules

A=rna
B=rnb
fail() { say "BOOT fail: $*"; sed 's/^/@@OUT setup| /' /tmp/setup.err 2>/dev/null; bye; }
{ ip link set lo up &&
  ip netns add $A && ip netns add $B &&
  ip link add va type veth peer name vb &&
  ip link set va netns $A && ip link set vb netns $B &&
  ip -n $A addr add 10.78.0.1/24 dev va && ip -n $B addr add 10.78.0.2/24 dev vb &&
  ip -n $A link set lo up && ip -n $B link set lo up &&
  ip -n $A link set va up && ip -n $B link set vb up; } 2>/tmp/setup.err || fail "netns/veth setup"
# shellcheck disable=SC2086
ip netns exec $A tc qdisc add dev va root netem $NETEM 2>/tmp/setup.err || fail "tc netem on va"
# shellcheck disable=SC2086
ip netns exec $B tc qdisc add dev vb root netem $NETEM 2>/tmp/setup.err || fail "tc netem on vb"
ip netns exec $A tc qdisc show dev va | sed 's/^/@@OUT setup| A: /'
ip netns exec $B tc qdisc show dev vb | sed 's/^/@@OUT setup| B: /'
i=0
while ! ip netns exec $A ping -c 1 -W 1 10.78.0.2 >/dev/null 2>&1; do
  i=$((i + 1))
  [ $i -lt 20 ] || fail "10.78.0.2 not reachable from $A"
done
NSA=/run/netns/$A
NSB=/run/netns/$B
nsenter --net=$NSA ss -Htn >/dev/null 2>/tmp/setup.err || fail "ss in $A: $(cat /tmp/setup.err)"
say "BOOT ok t=$(up) netem: $NETEM"

export LD_LIBRARY_PATH=/sv/lib
# Each side its own registry, as on two hosts: they find each other through the peer
# host's RDS directory (rdma_cm port 18635), as tests/tools/rds_reliability.sh does.
[ "$DEBUG" = 1 ] && export SOFTVERBS_DEBUG=1
T0=$(up)
say "START t=$T0 messages=$MSGS per side, $SOCKETS sockets per side, timeout ${TMO}s"
# side a|b NETNS LOCAL PEER SEED: one rds_flows; its pid in /tmp/<side>.pid, exit code in .rc
side() {
  ( SOFTVERBS_RDS_DIR=/dev/shm/softverbs-rds-$1 /usr/sbin/ip netns exec "$2" timeout $((TMO + 30)) /sv/bin/rds_flows --local "$3" --peer "$4" \
      --port 7100 --sockets "$SOCKETS" --messages "$MSGS" --seed "$5" --timeout "$TMO" \
      >"/tmp/$1.log" 2>&1 &
    echo $! > "/tmp/$1.pid"
    wait $!
    echo $? > "/tmp/$1.rc" ) &
}
side a $A 10.78.0.1 10.78.0.2 11
side b $B 10.78.0.2 10.78.0.1 22

# Forced connection resets while they run: every 0.2-0.5 s, ss -K on every TCP connection
# between the two, from A and from B in turn ($RESETS = both), from A only (A, like
# tests/tools/rds_reliability.sh) or not at all (none). Counts rounds and killed sockets.
# When one side has failed, the other cannot complete: it is stopped 20 s later. When one
# side has succeeded, the other gets 120 s to finish.
rounds=0
killed=0
next_tick=$(( ${T0%.*} + 30 ))
first_end=
grace=0
while [ ! -e /tmp/a.rc ] || [ ! -e /tmp/b.rc ]; do
  # shellcheck disable=SC3028 # busybox ash has $RANDOM
  sleep 0.$((2 + RANDOM % 4))
  k=0
  if [ "$RESETS" = none ]; then
    :
  elif [ $((rounds % 2)) = 0 ] || [ "$RESETS" = A ]; then
    k=$(nsenter --net=$NSA ss -HtK dst 10.78.0.2 2>/dev/null | wc -l)
  else
    k=$(nsenter --net=$NSB ss -HtK dst 10.78.0.1 2>/dev/null | wc -l)
  fi
  rounds=$((rounds + 1))
  killed=$((killed + k))
  now=$(up)
  if [ "${now%.*}" -ge "$next_tick" ]; then
    say "TICK t=$now reset rounds=$rounds sockets killed=$killed"
    next_tick=$(( ${now%.*} + 30 ))
  fi
  for s in a b; do
    [ -e /tmp/$s.rc ] && [ -z "$first_end" ] || continue
    first_end=${now%.*}
    grace=120
    [ "$(cat /tmp/$s.rc)" = 0 ] || grace=20
    say "ENDED $s rc=$(cat /tmp/$s.rc) t=$now: $(tail -n 1 /tmp/$s.log)"
  done
  if [ -n "$first_end" ] && [ "${now%.*}" -ge $((first_end + grace)) ]; then
    for s in a b; do
      [ -e /tmp/$s.rc ] && continue
      echo "[stopped ${grace}s after the other side ended]" >> /tmp/$s.log
      kill "$(cat /tmp/$s.pid)" 2>/dev/null
    done
    first_end=999999999
  fi
done
T1=$(up)
ELAPSED=$(awk -v a="$T0" -v b="$T1" 'BEGIN {printf "%.1f", b - a}')

for s in A B; do
  f=/tmp/$(echo $s | tr AB ab)
  say "RESULT $s rc=$(cat $f.rc)"
  n=300; [ "$DEBUG" = 1 ] && n=4000
  tail -n $n $f.log | sed "s/^/@@OUT $s| /"
done
counters() {  # counters NETNS: "Proto.Field=value" for /proc/net/snmp and /proc/net/netstat
  ip netns exec "$1" cat /proc/net/snmp /proc/net/netstat |
    awk '{ p = substr($1, 1, length($1) - 1)
           if (seen[p]) { for (i = 2; i <= NF; i++) print p "." h[p, i] "=" $i; seen[p] = 0 }
           else { seen[p] = 1; for (i = 2; i <= NF; i++) h[p, i] = $i } }'
}
ip netns exec $A tc -s qdisc show dev va | sed 's/^/@@TC A| /'
ip netns exec $A ip -s link show dev va | sed 's/^/@@TC A| /'
ip netns exec $B tc -s qdisc show dev vb | sed 's/^/@@TC B| /'
ip netns exec $B ip -s link show dev vb | sed 's/^/@@TC B| /'
counters $A | sed 's/^/@@CNT A| /'
counters $B | sed 's/^/@@CNT B| /'
dmesg | grep -E 'BUG|Oops|WARNING|general protection|Call Trace' | sed 's/^/@@KERN| /'
say "STATS elapsed=${ELAPSED}s reset_rounds=$rounds sockets_killed=$killed"
bye
