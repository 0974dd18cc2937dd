#!/bin/sh
# /init of the siw interop guest (busybox sh inside the initramfs that siw_interop.sh builds).
#
# Loads siw, creates siw0 on eth0 (slirp: we are 10.0.2.15, the host's loopback is 10.0.2.2),
# then runs a FIXED sequence of siw-side roles, the mirror image of the host-side sequence in
# siw_interop.sh (keep the two in step). Every phase is announced on the serial console (ttyS0)
# with "@@SV <WHAT> <phase> ..." lines; the host reads them from the console log.
#   server phase: BEGIN, READY (listener visible in /proc/net/tcp), ..., END rc=N
#   client phase: WAIT, then blocks until the host writes "go <phase>" (or "skip <phase>")
#                 on the control port ttyS1, BEGIN, ..., END rc=N
# A server phase also obeys "abort <phase>" on ttyS1 (the host's client failed early), and
# says "RACE <phase>" when siw's log shows the siw accept race (race_seen below).
# Tool output and siw's dmesg for the phase follow as "@@OUT <phase>| ..." and
# "@@DMESG <phase>| ..." just before END.
#
# Kernel command line: svcrc=off,on  (one pass of the sequence per value; siw itself needs no
# setting: it accepts CRC whenever the peer asks for it)
#                      svbase=17300  (ports: pass i uses svbase+20*i+1 ... +14)
#                      svdbg=1       (siw dynamic debug into dmesg, lines from /etc/sv-dyndbg)
#                      svskip=N      (start at phase N, 0-based: the host restarted us after a
#                                     phase hung or the kernel crashed)
#                      svwarm=1      (siw<->siw rping warm-up before the first phase)
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp /run
mount -t tmpfs tmp /tmp

up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "@@SV $*"; }
bye() { say "DONE t=$(up)"; sync; poweroff -f; sleep 5; }

CRCS=off,on
BASE=17300
DBG=1
SKIP=0
WARM=1
for kv in $(cat /proc/cmdline); do
  case "$kv" in
    svcrc=*) CRCS=${kv#svcrc=} ;;
    svbase=*) BASE=${kv#svbase=} ;;
    svdbg=*) DBG=${kv#svdbg=} ;;
    svskip=*) SKIP=${kv#svskip=} ;;
    svwarm=*) WARM=${kv#svwarm=} ;;
  esac
done

# Same perftest arguments as the host side (siw_interop.sh: BW_ARGS / LAT_ARGS / RS_ARGS).
BW_ARGS="-s 65536 -D 3 -F --report_gbits"
LAT_ARGS="-s 64 -n 1000 -F"
RPING_ARGS="-v -V -C 10"
RS_ARGS="-S 4096 -C 1000"
# Every guest tool runs under timeout. Clients: as long as the host's tool (rping 30 s, perftest
# 120 s, rstream/riostream 60 s). Servers: 30 s longer, so that when the host's client gives up,
# its "abort" reaches us first and we can dump siw's state before killing the server.
tool_timeout() {  # tool_timeout srv|cli TOOL
  t=120
  [ "$2" = rping ] && t=30
  case "$2" in r*stream) t=60 ;; esac
  [ "$1" = srv ] && t=$((t + 30))
  echo $t
}
PH=0         # phase counter, for svskip
skip_phase() { PH=$((PH + 1)); [ $PH -le "$SKIP" ]; }

say "INIT t=$(up) kernel=$(uname -r) crcs=$CRCS base=$BASE skip=$SKIP"

# Modules, in the dependency order the host computed (modprobe --show-depends).
KV=$(uname -r)
while read -r m; do
  [ -n "$m" ] || continue
  insmod "/lib/modules/$KV/$m" 2>/tmp/insmod.err || say "WARN insmod $m: $(cat /tmp/insmod.err)"
done < /etc/sv-modules
if [ "$DBG" = 1 ]; then
  mount -t debugfs none /sys/kernel/debug 2>/dev/null
  while read -r l; do
    echo "$l" > /sys/kernel/debug/dynamic_debug/control 2>/dev/null || say "WARN dyndbg '$l'"
  done < /etc/sv-dyndbg
fi

ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
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
grep -E 'transport|state|fw_ver' /tmp/devinfo | sed 's/^/@@OUT boot| /'
dmesg -c | grep -iE 'siw|rdma|iw_cm' | sed 's/^/@@DMESG boot| /'

# Warm-up: one siw<->siw rping inside the guest, so TCG has translated siw's connection and data
# paths before the first real phase. (A cold siw_accept is slow enough under TCG that the peer's
# first FPDUs can land before siw switches the socket to its RTR upcall; see siw_interop.sh.)
if [ "$WARM" = 1 ]; then
  timeout 30 rping -s -a 10.0.2.15 -p 7999 -C 2 -V > /tmp/warm.s 2>&1 &
  wpid=$!
  i=0
  while [ $i -lt 50 ] && ! grep -q ':1F3F 00000000:0000 0A' /proc/net/tcp; do sleep 0.1; i=$((i + 1)); done
  timeout 30 rping -c -a 10.0.2.15 -p 7999 -C 2 -V > /tmp/warm.c 2>&1
  wrc=$?
  wait $wpid
  say "WARMUP siw<->siw rping rc=$wrc/$? t=$(up)"
  dmesg -c > /dev/null 2>&1
fi

# Control port from the host: raw, no echo (nothing must flow back).
stty -F /dev/ttyS1 raw -echo clocal 2>/dev/null
exec 3</dev/ttyS1
say "BOOT ok t=$(up) siw0 on eth0 10.0.2.15"

listening() {
  h=$(printf ':%04X' "$1")
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null |
    awk -v h="$h" '$4 == "0A" && substr($2, length($2) - 4) == h { f = 1 } END { exit !f }'
}

# hang_dump PID: where a tool that is about to hit its timeout is stuck, per thread: state,
# kernel wait channel, current syscall and kernel stack (appended to the phase's output).
hang_dump() {
  echo "[guest: still running 5 s before its timeout; per-thread state]"
  for t in /proc/$1/task/*; do
    echo "hang: tid ${t##*/} state $(cut -d' ' -f3 "$t/stat" 2>/dev/null) utime+stime $(cut -d' ' -f14,15 "$t/stat" 2>/dev/null) wchan $(cat "$t/wchan" 2>/dev/null) syscall $(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
    sed 's/^/hang:     /' "$t/stack" 2>/dev/null
  done
  echo "hang: tcp (tx_queue:rx_queue in hex)"
  sed 's/^/hang: /' /proc/net/tcp
}
# run_tool TIMEOUT CMD...: runs CMD under timeout into /tmp/out, dumping its state 5 s before
# the timeout (hang_dump); returns its exit status.
run_tool() {
  tt=$1
  shift
  timeout "$tt" "$@" > /tmp/out 2>&1 &   # busybox timeout execs CMD in this pid
  tpid=$!
  tend=$(( $(date +%s) + tt - 5 ))
  tdump=0
  while kill -0 $tpid 2>/dev/null; do
    if [ $tdump = 0 ] && [ "$(date +%s)" -ge $tend ]; then
      hang_dump $tpid >> /tmp/hang 2>&1
      tdump=1
    fi
    sleep 0.2
  done
  wait $tpid
}

finish() {
  [ -s /tmp/hang ] && cat /tmp/hang >> /tmp/out
  rm -f /tmp/hang
  sed "s/^/@@OUT $1| /" /tmp/out
  dmesg -c 2>/dev/null | sed "s/^/@@DMESG $1| /"
  say "END $1 rc=$2 t=$(up)"
}

# The Linux siw responder race (siw_cm.c, siw_accept): siw sends its MPA Reply while the socket
# still has the CM upcall, which ignores data in SIW_EPSTATE_RDMA_MODE (7), and installs the RTR
# upcall only afterwards. If the initiator's first FPDUs land in between, siw never looks at them
# (no ESTABLISHED, reason=3) until the next socket event. Needs svdbg=1 (the siw_cm.c lines).
race_seen() {
  dmesg | awk '/send mpa reply/ {r = 1; f = 0; next}
               r && /reason=3/ {r = 0; f = 0}
               r && /siw_cm_llp_data_ready: cep state: 7/ {f = 1}
               END {exit !f}'
}

# srv_phase NAME PORT CMD...: siw listens, the host's softverbs client connects. If the siw
# accept race shows for 2 s, we say "RACE <phase>"; the host then stops its client, whose close
# makes siw process the stuck data and end the connection cleanly.
srv_phase() {
  name=$1 port=$2
  shift 2
  skip_phase && return
  dmesg -c > /dev/null 2>&1
  say "BEGIN $name role=siw-server port=$port t=$(up)"
  tt=$(tool_timeout srv "$1")
  timeout "$tt" "$@" > /tmp/out 2>&1 &
  pid=$!
  tend=$(( $(date +%s) + tt - 5 ))
  tdump=0
  i=0
  while ! listening "$port" && kill -0 $pid 2>/dev/null && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  if listening "$port"; then say "READY $name t=$(up)"; else say "NOTREADY $name"; fi
  n=0
  raced=0
  killed=
  while kill -0 $pid 2>/dev/null; do
    if [ $raced = 0 ] && race_seen; then
      n=$((n + 1))
      if [ $n -ge 2 ]; then
        # Evidence: the connection's rx_queue (bytes siw never read) is not empty.
        raced=1
        say "RACE $name"
        sed "s/^/@@DMESG $name| tcp at race: /" /proc/net/tcp
      fi
    elif [ $raced = 0 ]; then
      n=0
    else
      raced=$((raced + 1))   # the host stops its client; if our server does not end, we stop it
    fi
    if [ $tdump = 0 ] && [ "$(date +%s)" -ge $tend ]; then
      hang_dump $pid >> /tmp/hang 2>&1
      tdump=1
    fi
    cmd=
    read -t 1 -r cmd <&3
    if [ -z "$killed" ] && { [ "$cmd" = "abort $name" ] || [ $raced -ge 8 ]; }; then
      # Diagnostics first (killing a server stuck mid-handshake can oops iw_cm):
      # siw's log and the TCP sockets with their queues (tx_queue:rx_queue, hex).
      say "ABORTED $name"
      dmesg -c 2>/dev/null | sed "s/^/@@DMESG $name| /"
      sed "s/^/@@DMESG $name| tcp: /" /proc/net/tcp
      [ $tdump = 0 ] && hang_dump $pid >> /tmp/hang 2>&1
      kill $pid 2>/dev/null
      killed=1
    fi
  done
  wait $pid
  finish "$name" $?
}

# cli_phase NAME CMD...: the host's softverbs server listens on 127.0.0.1 (= our 10.0.2.2).
cli_phase() {
  name=$1
  shift
  skip_phase && return
  dmesg -c > /dev/null 2>&1
  say "WAIT $name"
  go=
  while read -t 300 -r cmd <&3; do
    case "$cmd" in
      "go $name") go=1; break ;;
      "skip $name") go=0; break ;;
      *) say "CTL ignored '$cmd' in $name" ;;
    esac
  done
  if [ "$go" != 1 ]; then
    say "END $name rc=skipped t=$(up)"
    return
  fi
  say "BEGIN $name role=siw-client t=$(up)"
  run_tool "$(tool_timeout cli "$1")" "$@"
  finish "$name" $?
}

pass=0
for c in $(echo "$CRCS" | tr ',' ' '); do
  p=$((BASE + 20 * pass))
  srv_phase "rping.sv2siw.$c" $((p + 1)) rping -s -a 10.0.2.15 -p $((p + 1)) $RPING_ARGS
  cli_phase "rping.siw2sv.$c" rping -c -a 10.0.2.2 -p $((p + 2)) $RPING_ARGS
  srv_phase "write_bw.sv2siw.$c" $((p + 3)) ib_write_bw -R -d siw0 -p $((p + 3)) $BW_ARGS
  cli_phase "write_bw.siw2sv.$c" ib_write_bw -R -d siw0 -p $((p + 4)) $BW_ARGS 10.0.2.2
  srv_phase "send_lat.sv2siw.$c" $((p + 5)) ib_send_lat -R -d siw0 -p $((p + 5)) $LAT_ARGS
  cli_phase "send_lat.siw2sv.$c" ib_send_lat -R -d siw0 -p $((p + 6)) $LAT_ARGS 10.0.2.2
  # rsockets (rdma-core librdmacm on siw): the server binds with -b, the client connects with -s.
  # -T a (rpoll) only on the server side: see host_cmd in siw_interop.sh.
  srv_phase "rstream.sv2siw.$c" $((p + 7)) rstream -b 10.0.2.15 -p $((p + 7)) $RS_ARGS -T v
  cli_phase "rstream.siw2sv.$c" rstream -s 10.0.2.2 -p $((p + 8)) $RS_ARGS -T v
  srv_phase "rstream_b.sv2siw.$c" $((p + 9)) rstream -b 10.0.2.15 -p $((p + 9)) $RS_ARGS -T b
  cli_phase "rstream_b.siw2sv.$c" rstream -s 10.0.2.2 -p $((p + 10)) $RS_ARGS -T b
  srv_phase "rstream_a.sv2siw.$c" $((p + 11)) rstream -b 10.0.2.15 -p $((p + 11)) $RS_ARGS -T a
  cli_phase "rstream_a.siw2sv.$c" rstream -s 10.0.2.2 -p $((p + 12)) $RS_ARGS
  srv_phase "riostream.sv2siw.$c" $((p + 13)) riostream -b 10.0.2.15 -p $((p + 13)) $RS_ARGS -T v
  cli_phase "riostream.siw2sv.$c" riostream -s 10.0.2.2 -p $((p + 14)) $RS_ARGS -T v
  pass=$((pass + 1))
done
bye
