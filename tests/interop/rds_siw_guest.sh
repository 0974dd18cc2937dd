#!/usr/bin/env bash
# Our RDS library and tools on a REAL provider: Linux kernel siw + Debian's rdma-core, in the
# QEMU guest of tests/interop/siw_interop.sh, and across to softverbs on the host.
#
#   tests/interop/rds_siw_guest.sh [--build DIR] [--prepare-only]
#
# 1. Preparation is siw_interop.sh's (run with --prepare-only, cached under $SIW_WORK): the
#    Debian kernel and siw.ko built out of tree. This script adds an initramfs of its own
#    (per run) with busybox, Debian's libibverbs/librdmacm/libsiw and, from the softverbs
#    build, ONLY libsvrds.so, libsvrds_preload.so, rds-stress, rds-ping, rds-info, blockserver
#    and rds_siw_probe (tests/interop/rds_siw_probe.c). Its /init is rds_siw_guest_init.sh.
# 2. Network: a namespace we create (rdssiw-<pid>) holds qemu's tap device (10.77.0.1); the
#    guest is 10.77.0.2 and 10.77.0.3 on eth0, where siw0 sits. Host-side processes run in
#    that namespace on softverbs (SOFTVERBS_NETDEV=lo,<tap>); nothing leaves the namespace.
# 3. Phases (the guest's fixed sequence; the host plays the other end of the cross ones):
#      env                   ldd + LD_DEBUG in the guest: libsvrds on Debian's libibverbs,
#                            librdmacm and the libsiw provider
#      *.local               two processes in the guest, siw <-> siw: rds-stress, rds-stress -D
#                            (alternate read/write, and write), rds-ping, the block server,
#                            and rds_siw_probe (RDMA write/read, ATOMIC_FADD, ATOMIC_CSWP)
#      *.siw_* / *host_to_*  guest (siw) <-> host (softverbs): the same tools both ways
#    Every probe op must end with a status (RDS_CMSG_RDMA_STATUS) or a sendmsg errno, never
#    hang, and the connection must carry a message afterwards. What siw cannot do:
#      - atomics: siw's atomic_cap is IBV_ATOMIC_NONE, so our RDS on siw refuses them at
#        sendmsg (EOPNOTSUPP, errno 95, as Linux RDS on a transport without atomics), and our
#        RDS on softverbs toward siw does the same once siw's private data said so (before
#        that, the op fails alone with OTHER_ERROR; the RDMA channel stays up).
#      - immediate data: our RDS never uses it (plain SENDs and RDMA only).
#      - iova: Linux siw ignores the iova of ibv_reg_mr_iova2 (siw_reg_user_mr keeps the user
#        address as the MR base), so our RDS on siw registers its regions at their virtual
#        address and says so (private data flag VaMrs); the initiator, softverbs or siw, asks
#        for a region's base before each op (docs/rds.md). RDMA INTO siw memory must succeed:
#        rds-stress -D, the block server and the probe's Write and Read.
#    Known siw problems, reported as XFAIL when the phase fails cleanly because of them:
#      - accept race (siw_interop.sh known_flake): a siw responder may leave the initiator's
#        first FPDUs unread until the next segment arrives: the first messages stall.
#    Not hidden: the last phase (softverbs RDMA/atomics into siw, each failure tearing the RDMA
#    channel down and reconnecting) has crashed the guest kernel: "kernel BUG at
#    drivers/infiniband/core/iwcm.c:969" (cm_close_handler: a CLOSE for a cm_id that is not
#    ESTABLISHED), which then shows as FAIL with the BUG line.
#    A phase passes when the result is what the case table below expects.
# 4. Prints a summary table and "N passed, M failed"; exits non-zero on any failure.
#
# Environment:
#   SIW_WORK            siw_interop.sh's cache (default /var/tmp/softverbs-siw); runs go to
#                       $SIW_WORK/rds-runs/<time>/ (the last 5 are kept)
#   RDS_SIW_QEMU_NICE   nice value for qemu (default 5)
#   RDS_SIW_LIMIT       wall-clock limit for qemu in seconds (default 1200)
#   RDS_SIW_ONLY=<re>   run only the phases matching the regex (e.g. 'probe'; one guest still)
#   RDS_SIW_GDB=1       gdb in the guest, every guest RDS process under it (crash backtraces)
#   RDS_SIW_DEBUG=1     SOFTVERBS_DEBUG=1 for the host's softverbs processes
#   RDS_SIW_SIWDBG=1    siw dynamic debug in the guest (siw_interop.sh's selection) into the logs
# Must run as root (network namespace, tap, apt-get through siw_interop.sh).
set -u
set -o pipefail
shopt -s extglob

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=$REPO/build
PREPARE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --build=*) BUILD=${1#--build=}; shift ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
W=${SIW_WORK:-/var/tmp/softverbs-siw}
QEMU_NICE=${RDS_SIW_QEMU_NICE:-5}
T_QEMU=${RDS_SIW_LIMIT:-1200}
T_BOOT=300
TAP=rdssiw0
NS=rdssiw-$$
HOSTIP=10.77.0.1
G1=10.77.0.2

T0=$(date +%s)
log() { echo "[rds-siw $(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[rds-siw] FATAL: $*" >&2; echo "0 passed, 1 failed"; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root"

# ---------------------------------------------------------------------------------------------
# 1. Preparation: siw_interop.sh's cache, then our initramfs
# ---------------------------------------------------------------------------------------------
SIW_WORK=$W bash "$HERE/siw_interop.sh" --prepare-only --no-capture >"/tmp/rds-siw-prep.$$" 2>&1 ||
  { cat "/tmp/rds-siw-prep.$$"; rm -f "/tmp/rds-siw-prep.$$"; die "siw_interop.sh --prepare-only failed"; }
rm -f "/tmp/rds-siw-prep.$$"
K='' KV=''
for d in "$W"/kernel-*; do
  v=${d##*/kernel-}
  [ -e "$d/lib/modules/$v/extra/siw.ko" ] && [ -e "$d/boot/vmlinuz-$v" ] && { K=$d; KV=$v; }
done
[ -n "$K" ] || die "no kernel with siw.ko under $W (siw_interop.sh --prepare-only)"
log "kernel $KV with siw.ko from $K"
[ $PREPARE_ONLY = 1 ] && { log "prepared under $W"; exit 0; }

mkdir -p "$W/rds-runs" || die "mkdir"
exec 9>"$W/rds-runs/.lock"
flock -n 9 || die "another rds_siw_guest.sh is running"
RUN=$W/rds-runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN" || die "mkdir $RUN"
ls -1dt "$W"/rds-runs/*/ 2>/dev/null | tail -n +6 | xargs -r rm -rf
log "run directory $RUN"

# Snapshot of the build (it may be rebuilt while we run): once quiet for 10 s.
ST=$RUN/stage
BINS=(rds-stress rds-ping rds-info blockserver)
snap_ok=0
for _ in $(seq 60); do
  if [ -e "$BUILD/lib/libsvrds.so" ] && [ -x "$BUILD/tests/rds_siw_probe" ] &&
     [ -z "$(find -L "$BUILD/lib" "$BUILD/bin" "$BUILD/tests/rds_siw_probe" -maxdepth 1 \
              -newermt '-10 seconds' \( -name 'lib*.so*' -o -type f \) 2>/dev/null)" ]; then
    rm -rf "$ST" && mkdir -p "$ST/bin" "$ST/lib" &&
      cp -a "$BUILD"/lib/lib*.so* "$ST/lib/" && cp "$BUILD/tests/rds_siw_probe" "$ST/bin/" &&
      for b in "${BINS[@]}"; do cp "$BUILD/bin/$b" "$ST/bin/" || exit 1; done &&
      [ "$(LD_LIBRARY_PATH=$ST/lib ldd "$ST/bin/rds-stress" | grep -c "$ST/lib/lib\(svrds\|ibverbs\|rdmacm\)\.so")" = 3 ] &&
      { snap_ok=1; break; }
  fi
  sleep 2
done
[ $snap_ok = 1 ] || die "could not take a consistent snapshot of $BUILD"
log "binaries from $BUILD (libsvrds built $(date -r "$ST/lib/libsvrds.so" '+%F %T'))"

# What libsvrds needs from rdma-core: standard, versioned symbols only (no softverbs extras).
nm -D --undefined-only "$ST/lib/libsvrds.so" | awk '/ (ibv|rdma)_/ {print $2}' > "$RUN/libsvrds.imports"
R=$RUN/rootfs
mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,run,etc/libibverbs.d,usr/bin,sv/bin,sv/lib,lib/modules/$KV} \
  "$R/usr/lib/x86_64-linux-gnu/libibverbs" || die "mkdir rootfs"
cp /usr/bin/busybox "$R/bin/" || die "busybox"
for a in $(/usr/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$R/bin/$a"; done
SYSBINS=(/usr/bin/rdma /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/rping)
cp "${SYSBINS[@]}" "$R/usr/bin/" || die "copy rdma userland"
cp /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so "$R/usr/lib/x86_64-linux-gnu/libibverbs/" &&
  cp /etc/libibverbs.d/siw.driver "$R/etc/libibverbs.d/" || die "copy libsiw"
cp "$ST/lib/libsvrds.so" "$ST/lib/libsvrds_preload.so" "$R/sv/lib/" && cp "$ST"/bin/* "$R/sv/bin/" ||
  die "copy softverbs RDS"
# System libraries: the closure of rdma-core's tools, libsiw and what our binaries need
# besides libsvrds (resolved without our build's libibverbs/librdmacm).
for f in "${SYSBINS[@]}" /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so "$R"/sv/bin/* \
         "$R"/sv/lib/*; do
  env -u LD_LIBRARY_PATH LD_LIBRARY_PATH="$R/sv/lib:/usr/lib/x86_64-linux-gnu" ldd "$f" 2>/dev/null |
    awk '/=>/ {print $3} /ld-linux/ {print $1}'
done | grep -v -e "^$R/" -e "^$ST/" -e "^$BUILD/" | sort -u | while read -r f; do
  [ -e "$f" ] && mkdir -p "$R$(dirname "$f")" && cp -L "$f" "$R$(dirname "$f")/"
done
for f in /usr/lib/x86_64-linux-gnu/libibverbs.so.1 /usr/lib/x86_64-linux-gnu/librdmacm.so.1 \
         /lib/x86_64-linux-gnu/libgcc_s.so.1; do
  mkdir -p "$R$(dirname "$f")" && cp -L "$f" "$R$(dirname "$f")/" || die "copy $f"
done
[ -e "$R/lib64/ld-linux-x86-64.so.2" ] || { mkdir -p "$R/lib64" &&
  cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"; } || die "ld.so"
for m in virtio_pci virtio_net crc32c_generic crc32c_intel siw iw_cm rdma_cm rdma_ucm ib_uverbs; do
  modprobe -d "$K" -S "$KV" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!s[$0]++' > "$RUN/modules.list"
: > "$R/etc/sv-modules"
while read -r f; do
  cp "$f" "$R/lib/modules/$KV/" || die "copy module $f"
  basename "$f" >> "$R/etc/sv-modules"
done < "$RUN/modules.list"
# RDS_SIW_GDB=1: gdb in the guest; the guest's RDS processes run under it and print a
# backtrace when they crash (debugging only: about 60 MB more initramfs).
if [ "${RDS_SIW_GDB:-0}" = 1 ]; then
  cp /usr/bin/gdb "$R/usr/bin/" || die "gdb"
  env -u LD_LIBRARY_PATH ldd /usr/bin/gdb | awk '/=>/ {print $3}' | while read -r f; do
    [ -e "$R$f" ] || { mkdir -p "$R$(dirname "$f")" && cp -L "$f" "$R$(dirname "$f")/"; }
  done
  mkdir -p "$R/usr/lib" "$R/usr/share" &&
    tar -C / -cf - --exclude=test --exclude=__pycache__ --exclude=idlelib --exclude=tkinter \
      --exclude=ensurepip --exclude=lib2to3 --exclude=dist-packages --exclude=site-packages \
      usr/lib/python3.11 usr/share/gdb | tar -C "$R" -xf - || die "gdb's python"
  echo 'GDB=1' > "$R/etc/rs.conf"
fi
if [ "${RDS_SIW_SIWDBG:-0}" = 1 ] && [ -e "$W/sv-dyndbg" ]; then
  cp "$W/sv-dyndbg" "$R/etc/sv-dyndbg" && echo 'SIWDBG=1' >> "$R/etc/rs.conf"
fi
[ -n "${RDS_SIW_ONLY:-}" ] && printf "ONLY='%s'\n" "$RDS_SIW_ONLY" >> "$R/etc/rs.conf"
install -m 755 "$HERE/rds_siw_guest_init.sh" "$R/init" || die "init"
INITRD=$RUN/initramfs.cpio.gz
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$INITRD") || die "cpio"
rm -rf "$R"
log "initramfs ready ($(du -h "$INITRD" | cut -f1))"

# ---------------------------------------------------------------------------------------------
# 2. Namespace + guest
# ---------------------------------------------------------------------------------------------
PIDS=()
QPID=
forget() {  # forget PID: reaped, so never killed by PID later (the number may be reused)
  local p keep=()
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}
cleanup() {
  local p
  for p in "${PIDS[@]}"; do stop_bg "$p"; done
  sleep 0.3
  for p in "${PIDS[@]}"; do
    pkill -KILL -P "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
  ip netns del "$NS" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 3' INT TERM
ip netns add "$NS" || die "ip netns add $NS"
ip -n "$NS" link set lo up
mkdir -p "$RUN/rdsdir"
# hx CMD...: a host-side (softverbs) process in the namespace. Without the lock's descriptor:
# a process that outlived its phase must not keep the next run out.
hx() {
  ip netns exec "$NS" env -u LD_PRELOAD LD_LIBRARY_PATH="$ST/lib" SOFTVERBS_NETDEV="lo,$TAP" \
    SOFTVERBS_DEBUG="${RDS_SIW_DEBUG:-0}" \
    SOFTVERBS_RDS_DIR="$RUN/rdsdir" "$@" 9>&-
}
# stop_bg PID: a background hx job. Its PID is the subshell running hx; the process itself
# (timeout, and the tool under it) is that subshell's child, which kill PID would leave behind.
stop_bg() {
  kill -0 "$1" 2>/dev/null || return 0  # gone: its number may be another process' by now
  pkill -TERM -P "$1" 2>/dev/null
  kill "$1" 2>/dev/null
}
con() { { tr -d '\r' < "$CONSOLE"; } 2>/dev/null; }
wait_marker() {  # wait_marker REGEX TIMEOUT: prints the first console line matching REGEX
  local re=$1 end=$((SECONDS + $2)) line
  while :; do
    line=$(con | grep -a -m1 -E "$re") && { echo "$line"; return 0; }
    if ! kill -0 "$QPID" 2>/dev/null; then
      line=$(con | grep -a -m1 -E "$re") && { echo "$line"; return 0; }
      return 1
    fi
    [ $SECONDS -lt $end ] || return 1
    sleep 0.25
  done
}
ctl() { echo "$*" >&7; }
kernel_trouble() {  # the guest kernel's first BUG/Oops line since this boot, if any
  con | grep -a -m1 -E 'kernel BUG at|Oops:|general protection fault|BUG: ' | sed 's/^.*\] //'
}
# boot_guest [FROM]: boots a guest (a fresh one after a guest kernel BUG) whose sequence
# starts at phase FROM (the phases before it say "skipped"). Console per boot.
BOOTS=0
boot_guest() {
  BOOTS=$((BOOTS + 1))
  CONSOLE=$RUN/console.$BOOTS.log
  local ctlp=$RUN/ctl.$BOOTS m
  mkfifo "$ctlp.in" "$ctlp.out" || die "mkfifo"
  : > "$CONSOLE"
  log "booting guest #$BOOTS: kernel $KV, TCG, -smp 2, nice $QEMU_NICE, tap $TAP in namespace $NS${1:+, from phase $1}"
  TBOOT=$(date +%s)
  ip netns exec "$NS" timeout -k 10 "$T_QEMU" nice -n "$QEMU_NICE" qemu-system-x86_64 -accel tcg \
    -cpu max -m 1024 -smp 2 -nodefaults -display none -no-reboot -monitor none \
    -serial "file:$CONSOLE" -chardev "pipe,id=ctl,path=$ctlp" -serial chardev:ctl \
    -kernel "$K/boot/vmlinuz-$KV" -initrd "$INITRD" \
    -append "console=ttyS0 loglevel=4 panic=-1${1:+ rsfrom=$1}" \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no" -device virtio-net-pci,netdev=n0 \
    >"$RUN/qemu.$BOOTS.log" 2>&1 9>&- &
  QPID=$!
  PIDS+=("$QPID")
  exec 7<>"$ctlp.in"
  exec 8<>"$ctlp.out"
  for _ in $(seq 100); do ip -n "$NS" link show "$TAP" >/dev/null 2>&1 && break; sleep 0.1; done
  ip -n "$NS" addr add "$HOSTIP/24" dev "$TAP" && ip -n "$NS" link set "$TAP" up ||
    die "tap $TAP did not appear in $NS (see $RUN/qemu.$BOOTS.log)"
  if ! m=$(wait_marker '^@@RS BOOT (ok|fail)' $T_BOOT) || [[ $m != *"BOOT ok"* ]]; then
    con | tail -40
    die "guest did not boot (console: $CONSOLE, qemu: $RUN/qemu.$BOOTS.log)"
  fi
  log "guest up after $(( $(date +%s) - TBOOT ))s: ${m#@@RS }"
}
stop_guest() {
  kill "$QPID" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$QPID" 2>/dev/null
  wait "$QPID" 2>/dev/null
  forget "$QPID"
  exec 7>&- 8>&-
}
boot_guest

# ---------------------------------------------------------------------------------------------
# 3. Phases
# ---------------------------------------------------------------------------------------------
# name|kind|description. kind: local (guest only), srv (guest serves, host client), cli (host
# serves, guest client). Keep in step with rds_siw_guest_init.sh.
PHASES=(
  "env|local|libsvrds on Debian rdma-core + libsiw"
  "memlock_default.local|local|8 MiB RLIMIT_MEMLOCK: clean failure, siw<->siw"
  "stress.local|local|rds-stress -d 4 -t 2 -v, siw<->siw"
  "stress_rdma.local|local|rds-stress -D 64K (read/write), siw<->siw"
  "stress_rdma_write.local|local|rds-stress -D 64K -M 2 (write), siw<->siw"
  "ping.local|local|rds-ping -c 5, siw<->siw"
  "blockserver.local|local|block server, siw<->siw"
  "probe.local|local|RDMA + atomics, siw -> siw"
  "stress_rdma.siw_passive|srv|rds-stress -D 64K, host active -> siw passive"
  "stress_rdma.siw_active|cli|rds-stress -D 64K, siw active -> host passive"
  "stress.siw_active|cli|rds-stress -d 4 -t 2 -v, siw active -> host passive"
  "ping.host_to_siw|srv|rds-ping host -> siw"
  "ping.siw_to_host|cli|rds-ping siw -> host"
  "blockserver.siw_server|srv|block server on siw, client on host"
  "blockserver.siw_client|cli|block server on host, client on siw"
  "probe.siw_initiator|cli|RDMA + atomics, siw -> host (softverbs)"
  "probe.siw_target|srv|RDMA + atomics, host (softverbs) -> siw"
)
# host_cmd NAME: the host side's command (array HC) and, for cli phases, whether it is a server
host_cmd() {
  case "$1" in
    stress_rdma.siw_passive) HC=(rds-stress -s "$G1" -r "$HOSTIP" -p 8000 -T 3 -D 64K -d 2 -v) ;;
    stress_rdma.siw_active) HC=(rds-stress -r "$HOSTIP" -p 8100) ;;
    stress.siw_active) HC=(rds-stress -r "$HOSTIP" -p 8200) ;;
    ping.host_to_siw) HC=(rds-ping -c 5 -i 1 "$G1") ;;
    ping.siw_to_host) HC=(env LD_PRELOAD="$ST/lib/libsvrds_preload.so" rds_siw_probe target "$HOSTIP" 8350 50) ;;
    blockserver.siw_server) HC=(blockserver client --server "$G1" --port 8407 --addr "$HOSTIP" --ops 300 --blocks 64) ;;
    blockserver.siw_client) HC=(blockserver serve --addr "$HOSTIP" --port 8507 --file "$RUN/blocks.img" --blocks 64) ;;
    probe.siw_target) HC=(env LD_PRELOAD="$ST/lib/libsvrds_preload.so" rds_siw_probe initiator "$HOSTIP" 8601 "$G1" 8600) ;;
    probe.siw_initiator) HC=(env LD_PRELOAD="$ST/lib/libsvrds_preload.so" rds_siw_probe target "$HOSTIP" 8700 140) ;;
  esac
  if [ "${HC[0]}" = env ]; then HC[2]=$ST/bin/${HC[2]}; else HC[0]=$ST/bin/${HC[0]}; fi
}

selected() { [[ $1 =~ ${RDS_SIW_ONLY:-.} ]]; }
NAMES=() RESULTS=() NOTES=() DESCS=()
record() { NAMES+=("$1"); DESCS+=("$2"); RESULTS+=("$3"); NOTES+=("$4"); log "$3 $1${4:+ ($4)}"; }
gout() { con | sed -n "s/^@@OUT $1| \[$2\] //p"; }   # gout PHASE LABEL

run_phase() {  # run_phase INDEX
  local name kind desc m hp hrc=- to=150
  IFS='|' read -r name kind desc <<<"${PHASES[$1]}"
  if ! selected "$name"; then
    wait_marker "^@@RS END $name rc=skipped" 400 >/dev/null || return 1
    return 2
  fi
  case "$kind" in
    local)
      m=$(wait_marker "^@@RS END $name " 400) || return 1
      ;;
    srv)
      wait_marker "^@@RS WAIT $name\$" 400 >/dev/null || return 1
      ctl "go $name"
      wait_marker "^@@RS READY $name\$" 60 >/dev/null || return 1
      host_cmd "$name"
      hx timeout 120 "${HC[@]}" >"$RUN/$name.host.log" 2>&1
      hrc=$?
      ctl "stop $name"
      m=$(wait_marker "^@@RS END $name " $to) || return 1
      ;;
    cli)
      wait_marker "^@@RS WAIT $name\$" 400 >/dev/null || return 1
      host_cmd "$name"
      hx timeout 150 "${HC[@]}" >"$RUN/$name.host.log" 2>&1 &
      hp=$!
      PIDS+=("$hp")
      sleep 1
      ctl "go $name"
      m=$(wait_marker "^@@RS END $name " $to) || { stop_bg "$hp"; wait "$hp"; forget "$hp"; return 1; }
      # A host server that does not end by itself after the guest's client is stopped.
      for _ in $(seq 200); do kill -0 "$hp" 2>/dev/null || break; sleep 0.1; done
      stop_bg "$hp"
      wait "$hp"
      hrc=$?
      forget "$hp"
      ;;
  esac
  GRC=$(sed -n 's/.* rc=\([^ ]*\).*/\1/p' <<<"$m")
  HRC=$hrc
  con | sed -n "s/^@@OUT $name| //p" > "$RUN/$name.guest.log"
  return 0
}


# ---------------------------------------------------------------------------------------------
# 4. Judging
# ---------------------------------------------------------------------------------------------
# op_status LOG OP: "SUCCESS", "OTHER_ERROR", ..., "errno=N", "HANG" or "missing"
op_status() {
  local l
  l=$(grep -m1 "^\(\[[a-z]*\] \)\{0,1\}OP $2 " "$1") || { echo missing; return; }
  case "$l" in
    *HANG*) echo HANG ;;
    *sendmsg\ errno=*) sed 's/.*sendmsg \(errno=[0-9]*\).*/\1/' <<<"$l" ;;
    *) sed 's/.*status=[0-9]* (\([A-Z_]*\)).*/\1/' <<<"$l" ;;
  esac
}
# judge_probe LOG EXPECTED: EXPECTED = "write=X read=X fadd=X cswp=X"
judge_probe() {
  local log=$1 want got=() bad=() op st w
  for want in $2; do
    op=${want%%=*} w=${want#*=}
    st=$(op_status "$log" "$op")
    got+=("$op=$st")
    # shellcheck disable=SC2053  # a glob on purpose: "*" takes any status
    [[ $st == $w ]] || bad+=("$op: $st, expected $w")
  done
  grep -q 'CHECK answered' "$log" || bad+=("no message after the ops")
  grep -q 'data=MISMATCH' "$log" && bad+=("read data mismatch")
  NOTE="${got[*]}"
  [ ${#bad[@]} = 0 ] || NOTE="$NOTE; $(IFS=';'; echo "${bad[*]}")"
  [ ${#bad[@]} = 0 ]
}
avg() { grep -m1 '(average)' "$1" | sed 's/  */ /g; s/^ //' | cut -c1-60; }
# Known siw problems a phase may hit (then XFAIL, counted apart, when the failure is clean):
RACE="siw accept race: siw holds our first FPDUs until the next segment (siw_interop.sh)"
# rdma_failed LOG...: rds-stress reported failed RDMA ops (a clean, bounded failure)
rdma_failed() { grep -qhE 'RDMA operations failed|RDMA to .* failed, status' "$@" 2>/dev/null; }
judge() {  # judge NAME KIND (GRC, HRC from run_phase)
  local name=$1 g=$RUN/$1.guest.log h=$RUN/$1.host.log res=FAIL n
  NOTE=
  case "$name" in
    env)
      local ibv rcm siw own
      ibv=$(grep -m1 'libibverbs.so.1 =>' "$g" | awk '{print $4}')
      rcm=$(grep -m1 'librdmacm.so.1 =>' "$g" | awk '{print $4}')
      siw=$(grep -m1 'calling init: .*libsiw' "$g" | sed 's/.*calling init: //')
      own=$(grep -c '^\[ldd\] lib\(ibverbs\|rdmacm\)' "$g")
      NOTE="libibverbs $ibv, librdmacm $rcm, provider ${siw:-none}; imports: $(wc -l < "$RUN/libsvrds.imports") ibv_/rdma_ symbols, all standard"
      [[ $ibv == /usr/lib/x86_64-linux-gnu/* || $ibv == /lib/x86_64-linux-gnu/* ]] &&
        [[ $rcm == /usr/lib/x86_64-linux-gnu/* || $rcm == /lib/x86_64-linux-gnu/* ]] &&
        [ -n "$siw" ] && [ "$own" = 0 ] && [ "$GRC" = 3 ] && res=PASS   # 3: target timed out
      # Every import must exist in Debian's libraries (a softverbs-only symbol would not).
      local miss
      nm -D --defined-only /usr/lib/x86_64-linux-gnu/libibverbs.so.1 \
        /usr/lib/x86_64-linux-gnu/librdmacm.so.1 > "$RUN/rdma-core.exports"
      miss=$(while read -r s; do
               grep -qE " ${s%%@*}@@?${s#*@}\$" "$RUN/rdma-core.exports" || echo "$s"
             done < "$RUN/libsvrds.imports" | paste -sd' ')
      [ -z "$miss" ] || { res=FAIL; NOTE="$NOTE; not in Debian rdma-core: $miss"; }
      ;;
    memlock_default.local)
      NOTE="rc $GRC (initiator/target); $(grep -m1 '^\[initiator\]' "$g" | cut -c1-60)"
      [[ $GRC == 1/* ]] && grep -q '^\[initiator\] no cookies' "$g" &&
        ! grep -qi 'segfault\|Segmentation' "$g" && res=PASS
      ;;
    stress*.local)
      grep '^\[active\]' "$g" | sed 's/^\[active\] //' > "$RUN/$name.active"
      NOTE="rc $GRC; $(avg "$RUN/$name.active")"
      [ "$GRC" = 0/0 ] && grep -q '(average)' "$RUN/$name.active" && res=PASS
      [ $res != PASS ] && rdma_failed "$g" &&
        NOTE="$NOTE; rds-stress: $(grep -m1 -o '[0-9]* RDMA operations failed' "$g")"
      ;;
    stress*.siw_passive)
      NOTE="host rc $HRC, guest rc $GRC; $(avg "$h")"
      [ "$HRC" = 0 ] && [ "$GRC" = 0 ] && grep -q '(average)' "$h" && res=PASS
      [ $res != PASS ] && rdma_failed "$g" "$h" && NOTE="$NOTE; rds-stress: RDMA operations failed"
      ;;
    stress*.siw_active)
      NOTE="guest rc $GRC, host rc $HRC; $(avg "$g")"
      [ "$GRC" = 0 ] && [ "$HRC" = 0 ] && grep -q '(average)' "$g" && res=PASS
      [ $res != PASS ] && rdma_failed "$g" "$h" && NOTE="$NOTE; rds-stress: RDMA operations failed"
      ;;
    ping.local|ping.siw_to_host)   # replies only: "   N: T usec", not the rtt summary
      n=$(grep -cE '\] +[0-9]+: [0-9]+ usec' "$g")
      NOTE="$n/5 replies, rc $GRC; $(grep '\[\(rds-ping\|client\)\]' "$g" | tail -1 | cut -c1-60)"
      [ "$n" = 5 ] && [ "$GRC" = 0 ] && res=PASS
      [ $res != PASS ] && [ "$n" = 4 ] && ! grep -qE '\] +0: ' "$g" && { res=XFAIL; NOTE="$NOTE; first ping lost: $RACE"; }
      ;;
    ping.host_to_siw)
      n=$(grep -cE '^ *[0-9]+: [0-9]+ usec' "$h")
      NOTE="$n/5 replies, rc $HRC; $(tail -1 "$h" | cut -c1-60)"
      [ "$n" = 5 ] && [ "$HRC" = 0 ] && res=PASS
      [ $res != PASS ] && [ "$n" = 4 ] && ! grep -q '^ *0:' "$h" && { res=XFAIL; NOTE="$NOTE; first ping lost: $RACE"; }
      ;;
    blockserver.local|blockserver.siw_client)   # the server RDMAs into siw memory
      NOTE="client rc $GRC; $(grep '^\[client\]' "$g" | tail -1 | cut -c1-70)"
      [ "$GRC" = 0 ] && res=PASS
      ;;
    blockserver.siw_server)
      NOTE="host client rc $HRC; $(tail -1 "$h" | cut -c1-70)"
      [ "$HRC" = 0 ] && res=PASS
      [ $res != PASS ] && grep -q 'no reply from the server' "$h" &&
        { res=XFAIL; NOTE="$NOTE; $RACE (the server's accept stalls past the client's 10 s)"; }
      ;;
    probe.local)
      grep '^\[initiator\]' "$g" | sed 's/^\[initiator\] //' > "$RUN/$name.initiator"
      judge_probe "$RUN/$name.initiator" "write=SUCCESS read=SUCCESS fadd=errno=95 cswp=errno=95" && res=PASS
      ;;
    probe.siw_target)
      judge_probe "$h" "write=SUCCESS read=SUCCESS fadd=@(OTHER_ERROR|errno=95) cswp=errno=95" && res=PASS
      ;;
    probe.siw_initiator)
      grep '^\[client\]' "$g" | sed 's/^\[client\] //' > "$RUN/$name.initiator"
      judge_probe "$RUN/$name.initiator" "write=SUCCESS read=SUCCESS fadd=errno=95 cswp=errno=95" && res=PASS
      ;;
  esac
  local kern
  kern=$(grep -m1 -E '\[dmesg\].*(BUG|WARNING|Oops)' "$g")
  [ -z "$kern" ] || { res=FAIL; NOTE="$NOTE; guest kernel: $kern"; }
  record "$name" "$desc" "$res" "$NOTE"
}

# ---------------------------------------------------------------------------------------------
# 5. Run and summary
# ---------------------------------------------------------------------------------------------
TG0=$(date +%s)
for i in "${!PHASES[@]}"; do
  IFS='|' read -r name kind desc <<<"${PHASES[$i]}"
  run_phase "$i"
  prc=$?
  [ $prc = 2 ] && continue   # not selected
  if [ $prc != 0 ]; then
    kern=$(kernel_trouble)
    record "$name" "$desc" FAIL "guest out of step (phase did not start or end in time)${kern:+; guest kernel: $kern}"
    con | sed -n "s/^@@OUT $name| //p" > "$RUN/$name.guest.log"
  else
    judge "$name" "$kind"
    kern=$(kernel_trouble)
  fi
  # A guest whose kernel hit a BUG (or that fell out of step) is replaced by a fresh one
  # for the next phase: the phases after it should not inherit a broken iw_cm.
  if { [ $prc != 0 ] || [ -n "$kern" ]; } && [ $((i + 1)) -lt ${#PHASES[@]} ] && [ $BOOTS -lt 4 ]; then
    stop_guest
    boot_guest "${PHASES[$((i + 1))]%%|*}"
  fi
done
wait_marker '^@@RS DONE' 60 >/dev/null
TG=$(( $(date +%s) - TG0 ))
for _ in $(seq 100); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
stop_guest

pass=0 fail=0 xfail=0
echo
echo "=== RDS on kernel siw + Debian rdma-core (guest, kernel $KV, TCG) and softverbs (host) ==="
printf '%-26s %-50s %-5s %s\n' phase what result notes
printf '%-26s %-50s %-5s %s\n' ----- ---- ------ -----
for i in "${!NAMES[@]}"; do
  printf '%-26s %-50s %-5s %s\n' "${NAMES[$i]}" "${DESCS[$i]}" "${RESULTS[$i]}" "${NOTES[$i]}"
  case "${RESULTS[$i]}" in
    PASS) pass=$((pass + 1)) ;;
    XFAIL) xfail=$((xfail + 1)) ;;
    *) fail=$((fail + 1)) ;;
  esac
done
expected=0
for ph in "${PHASES[@]}"; do selected "${ph%%|*}" && expected=$((expected + 1)); done
notrun=$(( expected - ${#NAMES[@]} ))
[ $notrun -gt 0 ] && { echo "($notrun phases not run)"; fail=$((fail + notrun)); }
echo
log "guest wall time ${TG}s after boot, $BOOTS boot(s); total $(( $(date +%s) - T0 ))s; logs: $RUN"
for i in "${!NAMES[@]}"; do
  [ "${RESULTS[$i]}" = FAIL ] || continue
  echo "--- ${NAMES[$i]}: last lines (guest | host)"
  tail -8 "$RUN/${NAMES[$i]}.guest.log" 2>/dev/null | sed 's/^/  guest| /'
  tail -5 "$RUN/${NAMES[$i]}.host.log" 2>/dev/null | sed 's/^/  host | /'
done
echo "XFAIL = a known siw limitation, failing cleanly (a status or a bounded error, no hang):"
echo "  race: $RACE"
echo "$pass passed, $fail failed ($xfail expected failures, XFAIL)"
[ $fail = 0 ]
