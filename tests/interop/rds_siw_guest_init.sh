#!/bin/sh
# /init of the RDS-on-siw guest (busybox sh in the initramfs rds_siw_guest.sh builds).
#
# Our RDS library and tools over the guest's OWN rdma-core (Debian's libibverbs/librdmacm and
# libsiw, in /usr/lib) and kernel siw: only libsvrds.so and libsvrds_preload.so come from the
# softverbs build (/sv/lib), never its libibverbs/librdmacm. siw0 sits on eth0 (a tap into a
# network namespace on the host: we are 10.77.0.2 and 10.77.0.3, the host side is 10.77.0.1).
# Two processes in the guest talk to each other from 10.77.0.3 to 10.77.0.2 (TCP over lo,
# both addresses on siw0's eth0; siw on lo would be a second device).
#
# A FIXED sequence of phases; keep it in step with PHASES in rds_siw_guest.sh. Reports on the
# serial console (ttyS0):
#   @@RS BOOT ok|fail, BEGIN <phase>, END <phase> rc=N, DONE
#   @@OUT <phase>| ...   what the guest's processes printed (one block per process)
# Local phases (both ends in the guest) run on their own. Cross phases (one end on the host,
# softverbs) synchronise over ttyS1 (a pipe on the host):
#   guest serves:  WAIT <phase> / host "go <phase>" / guest starts its server, READY <phase> /
#                  host runs its client, then "stop <phase>" / guest ends its server, END
#   host serves:   WAIT <phase> / host starts its server, "go <phase>" / guest runs its client,
#                  END
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /run /dev/shm
mount -t tmpfs tmp /tmp
mount -t tmpfs shm /dev/shm

up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "@@RS $*"; }
bye() { say "DONE t=$(up)"; sync; poweroff -f; sleep 5; }

say "INIT t=$(up) kernel=$(uname -r) cpus=$(nproc)"
KV=$(uname -r)
while read -r m; do
  [ -n "$m" ] || continue
  insmod "/lib/modules/$KV/$m" 2>/tmp/insmod.err || say "WARN insmod $m: $(cat /tmp/insmod.err)"
done < /etc/sv-modules

# Local phases: servers on G2, clients on G1. Our RDS reports a message's source as the
# connection's peer IP, which the kernel picks (the primary address, G1) whatever address
# the sending socket is bound to: a server answering a client bound to G2 would answer
# 10.77.0.2 and the answer is dropped (reproducible on softverbs alone: client bound to
# 127.0.0.3, server on 127.0.0.2). Clients on G1 keep the tools out of that bug.
G1=10.77.0.2   # primary address: active/client end in the guest; the guest end across
G2=10.77.0.3   # secondary address: passive/server end in the guest
H=10.77.0.1    # the host namespace (softverbs)
ip link set lo up
ip link set eth0 up
ip addr add $G1/24 dev eth0
ip addr add $G2/24 dev eth0
i=0
while ! rdma link add siw0 type siw netdev eth0 2>/tmp/rdma.err; do
  i=$((i + 1))
  [ $i -lt 10 ] || { say "BOOT fail: rdma link add: $(cat /tmp/rdma.err)"; bye; }
  sleep 0.5
done
if ! ibv_devinfo -d siw0 > /tmp/devinfo 2>&1; then
  sed 's/^/@@OUT boot| /' /tmp/devinfo
  say "BOOT fail: ibv_devinfo -d siw0"
  bye
fi
{ ibv_devices; grep -E 'transport|state|fw_ver' /tmp/devinfo; rdma link show; } 2>&1 | sed 's/^/@@OUT boot| /'
i=0
while ! ping -c 1 -W 1 $H >/dev/null 2>&1; do
  i=$((i + 1))
  [ $i -lt 30 ] || { say "BOOT fail: $H not reachable"; bye; }
done

# Our RDS over the system rdma-core: /sv/lib holds ONLY libsvrds*.so.
export LD_LIBRARY_PATH=/sv/lib:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
export SOFTVERBS_RDS_DIR=/dev/shm/softverbs-rds
PRE=/sv/lib/libsvrds_preload.so
B=/sv/bin
GDB=0
ONLY=.
FROM=
for kv in $(cat /proc/cmdline); do
  case "$kv" in rsfrom=*) FROM=${kv#rsfrom=} ;; esac
done
SIWDBG=0
# shellcheck disable=SC1091
[ -e /etc/rs.conf ] && . /etc/rs.conf
if [ "$SIWDBG" = 1 ]; then   # siw's connection manager and QP state machine into dmesg
  mount -t debugfs none /sys/kernel/debug 2>/dev/null
  while read -r l; do echo "$l" > /sys/kernel/debug/dynamic_debug/control 2>/dev/null; done < /etc/sv-dyndbg
fi
if [ "$GDB" = 1 ]; then
  # Every RDS process under gdb: a crash prints its backtrace into the phase's output.
  mkdir -p /sv/gdb
  for f in $B/*; do
    n=${f##*/}
    mv "$f" "/sv/gdb/$n"
    { echo '#!/bin/sh'
      echo 'p=$LD_PRELOAD; unset LD_PRELOAD'
      echo "exec gdb -q -batch -ex 'set pagination off' -ex \"set environment LD_PRELOAD=\$p\" -ex run -ex bt -ex 'thread apply all bt 12' --args /sv/gdb/$n \"\$@\""
    } > "$f"
    chmod 755 "$f"
  done
fi
stty -F /dev/ttyS1 raw -echo clocal 2>/dev/null
exec 3</dev/ttyS1
say "BOOT ok t=$(up) siw0 on eth0 $G1 $G2"

# sel PHASE: whether the phase is selected (ONLY=<regex> in /etc/rs.conf, RDS_SIW_ONLY)
sel() {
  if [ -n "$FROM" ]; then   # a fresh guest resuming after a kernel BUG: skip to FROM
    [ "$1" = "$FROM" ] || return 1
    FROM=
  fi
  echo "$1" | grep -qE "$ONLY"
}
# begin PHASE: announces a local phase, or says it is skipped (then returns 1)
begin() {
  if sel "$1"; then say "BEGIN $1 t=$(up)"; return 0; fi
  say "END $1 rc=skipped t=$(up)"
  return 1
}
# out PHASE FILE LABEL: one process' output on the console
out() { sed "s/^/@@OUT $1| [$3] /" "$2"; }
finish() {  # finish PHASE RC
  dmesg -c 2>/dev/null | grep -E '[sS]iw|rdma|iw_cm|BUG|WARNING|Oops' | tail -n 400 | sed "s/^/@@OUT $1| [dmesg] /"
  say "END $1 rc=$2 t=$(up)"
}
# await WHAT PHASE SECS: waits for the host's "<WHAT> <phase>" on ttyS1
await() {
  n=0
  while [ $n -lt "$3" ]; do
    cmd=
    read -t 1 -r cmd <&3
    [ "$cmd" = "$1 $2" ] && return 0
    [ -n "$cmd" ] && say "CTL ignored '$cmd' in $2"
    n=$((n + 1))
  done
  return 1
}
# bg PHASE LABEL SECS CMD...: runs CMD in the background; its pid in $BGPID
bg() {
  ph=$1 lb=$2 t=$3
  shift 3
  timeout "$t" "$@" > "/tmp/$ph.$lb" 2>&1 &
  BGPID=$!
}
# reap PID SECS: waits up to SECS for PID, then kills it; its exit code in $RC (kill: 143)
reap() {
  n=0
  while kill -0 "$1" 2>/dev/null && [ $n -lt $(( $2 * 10 )) ]; do sleep 0.1; n=$((n + 1)); done
  kill "$1" 2>/dev/null
  wait "$1"
  RC=$?
}

# ---- phase 1: which libraries our RDS loads here -------------------------------------------
ph=env
if begin $ph; then
# (no ldd in busybox: the dynamic loader lists what it would load)
{ echo "ldd rds-stress:"; /lib64/ld-linux-x86-64.so.2 --list $B/rds-stress
  echo "ldd libsvrds.so:"; /lib64/ld-linux-x86-64.so.2 --list /sv/lib/libsvrds.so
  echo "ls /sv/lib:"; ls /sv/lib; } > /tmp/$ph.ldd 2>&1
LD_DEBUG=libs LD_PRELOAD=$PRE timeout 20 $B/rds_siw_probe target $G1 7399 1 > /tmp/$ph.debug 2>&1
rc=$?
grep -E 'calling init: |rds_siw_probe|target' /tmp/$ph.debug | sed 's/^ *[0-9]*: *//' > /tmp/$ph.inits
out $ph /tmp/$ph.ldd ldd
out $ph /tmp/$ph.inits ld.so
finish $ph $rc
fi

# ---- local phases: two processes in the guest, siw <-> siw ---------------------------------
# First with Linux's default RLIMIT_MEMLOCK (8 MiB). siw pins registered memory against it
# (siw_umem_get: no CAP_IPC_LOCK exemption), and an RDS connection registers 2 x 64 x 64 KiB
# of buffers: the second registration fails (ENOMEM), no connection comes up. The processes
# must fail cleanly (no crash, bounded), the initiator with "no cookies".
ph=memlock_default.local
if begin $ph; then
ulimit -l 8192
bg $ph target 60 env LD_PRELOAD=$PRE $B/rds_siw_probe target $G2 7390 35
tp=$BGPID
sleep 1
timeout 60 env LD_PRELOAD=$PRE $B/rds_siw_probe initiator $G1 7391 $G2 7390 > /tmp/$ph.initiator 2>&1
irc=$?
reap $tp 10
out $ph /tmp/$ph.initiator initiator
out $ph /tmp/$ph.target target
finish $ph "$irc/$RC"
fi
# From here on: unlimited, as RDMA applications are run (limits.conf "memlock unlimited").
ulimit -l unlimited
say "memlock: $(ulimit -l)"

# stress PHASE PORT ARGS...: passive on G2, active from G1 (as tests/tools/rds_tools.sh)
stress() {
  ph=$1 p=$2
  shift 2
  begin "$ph" || return
  bg $ph passive 150 $B/rds-stress -r $G2 -p "$p"
  pp=$BGPID
  sleep 1
  timeout 120 $B/rds-stress -s $G2 -r $G1 -p "$p" -T 3 "$@" > /tmp/$ph.active 2>&1
  arc=$?
  reap $pp 30
  out $ph /tmp/$ph.active active
  out $ph /tmp/$ph.passive passive
  finish $ph "$arc/$RC"
}
stress stress.local 7400 -d 4 -t 2 -v
stress stress_rdma.local 7500 -D 64K -d 2 -v
stress stress_rdma_write.local 7600 -D 64K -M 2 -v

ph=ping.local
if begin $ph; then
bg $ph passive 60 $B/rds-stress -r $G2 -p 7700
pp=$BGPID
sleep 1
bg $ph active 60 $B/rds-stress -s $G2 -r $G1 -p 7700 -T 8
ap=$BGPID
sleep 2
timeout 40 $B/rds-ping -c 5 -i 1 $G2 > /tmp/$ph.ping 2>&1
prc=$?
reap $ap 30
reap $pp 30
out $ph /tmp/$ph.ping rds-ping
finish $ph $prc
fi

ph=blockserver.local
if begin $ph; then
bg $ph server 150 $B/blockserver serve --addr $G2 --port 7807 --file /tmp/blocks.img --blocks 64
sp=$BGPID
sleep 1
timeout 120 $B/blockserver client --server $G2 --port 7807 --addr $G1 --ops 300 --blocks 64 > /tmp/$ph.client 2>&1
crc=$?
reap $sp 0
out $ph /tmp/$ph.client client
out $ph /tmp/$ph.server server
finish $ph $crc
fi

ph=probe.local
if begin $ph; then
bg $ph target 150 env LD_PRELOAD=$PRE $B/rds_siw_probe target $G2 7900 140
tp=$BGPID
sleep 1
timeout 140 env LD_PRELOAD=$PRE $B/rds_siw_probe initiator $G1 7901 $G2 7900 > /tmp/$ph.initiator 2>&1
irc=$?
# The TCP sockets with their queues (tx_queue:rx_queue, hex): bytes siw never read show here.
grep -v ' 0A ' /proc/net/tcp > /tmp/$ph.tcp
out $ph /tmp/$ph.tcp tcp
# RDS's own view while the target still runs: counters and connections (rds-info).
timeout 20 $B/rds-info -c -n > /tmp/$ph.info 2>&1
out $ph /tmp/$ph.info rds-info
reap $tp 10
out $ph /tmp/$ph.initiator initiator
out $ph /tmp/$ph.target target
finish $ph "$irc/$RC"
fi

# ---- cross phases: guest (siw) <-> host (softverbs) ----------------------------------------
# srv PHASE SECS CMD...: we serve, the host's client runs against us
srv() {
  ph=$1 t=$2
  shift 2
  sel "$ph" || { say "END $ph rc=skipped t=$(up)"; return; }
  say "WAIT $ph"
  if ! await go "$ph" 300; then say "END $ph rc=nogo t=$(up)"; return; fi
  say "BEGIN $ph role=guest-server t=$(up)"
  bg "$ph" server "$t" "$@"
  sp=$BGPID
  sleep 1
  say "READY $ph"
  await stop "$ph" "$t"
  reap $sp 20
  out "$ph" "/tmp/$ph.server" server
  finish "$ph" $RC
}
# cli PHASE SECS CMD...: the host serves, we run the client
cli() {
  ph=$1 t=$2
  shift 2
  sel "$ph" || { say "END $ph rc=skipped t=$(up)"; return; }
  say "WAIT $ph"
  if ! await go "$ph" 300; then say "END $ph rc=nogo t=$(up)"; return; fi
  say "BEGIN $ph role=guest-client t=$(up)"
  timeout "$t" "$@" > "/tmp/$ph.client" 2>&1
  rc=$?
  out "$ph" "/tmp/$ph.client" client
  finish "$ph" $rc
}
srv stress_rdma.siw_passive 150 $B/rds-stress -r $G1 -p 8000
cli stress_rdma.siw_active 120 $B/rds-stress -s $H -r $G1 -p 8100 -T 3 -D 64K -d 2 -v
cli stress.siw_active 120 $B/rds-stress -s $H -r $G1 -p 8200 -T 3 -d 4 -t 2 -v
srv ping.host_to_siw 60 env LD_PRELOAD=$PRE $B/rds_siw_probe target $G1 8300 50
cli ping.siw_to_host 40 $B/rds-ping -c 5 -i 1 $H
srv blockserver.siw_server 150 $B/blockserver serve --addr $G1 --port 8407 --file /tmp/b2.img --blocks 64
cli blockserver.siw_client 120 $B/blockserver client --server $H --port 8507 --addr $G1 --ops 300 --blocks 64
cli probe.siw_initiator 140 env LD_PRELOAD=$PRE $B/rds_siw_probe initiator $G1 8701 $H 8700
# Last: it has crashed the guest kernel (iw_cm BUG, see rds_siw_guest.sh).
srv probe.siw_target 150 env LD_PRELOAD=$PRE $B/rds_siw_probe target $G1 8600 140
bye
