#!/usr/bin/env bash
# Interoperability of softverbs with Linux kernel siw (SoftiWARP) running in a QEMU guest.
#
#   tests/interop/siw_interop.sh [--crc both|on|off] [--lib DIR] [--no-capture] [--prepare-only]
#
# 1. Prepares (and caches under $SIW_WORK, default /var/tmp/softverbs-siw) everything the guest
#    needs: Debian packages, the Debian kernel image + matching linux-source, siw.ko built out
#    of tree (Debian does not ship it), an initramfs with busybox, the module closure and the
#    rdma userland (rping, ib_write_bw, ib_send_lat, rstream, riostream, libsiw). Re-runs reuse
#    all of it; the initramfs is rebuilt only when tests/interop/guest_init.sh (its /init)
#    changes.
# 2. Boots ONE guest (TCG, -smp 1, slirp networking: nothing leaves this host). Its /init runs a
#    fixed sequence of siw roles (guest_init.sh); this script plays the matching softverbs role
#    for each, with LD_LIBRARY_PATH pointing at a snapshot of the softverbs libraries.
#      siw server: guest listens on 10.0.2.15:P, hostfwd 127.0.0.1:P -> guest; softverbs
#                  connects to 127.0.0.1:P.
#      siw client: softverbs listens on the host (127.0.0.1:P for rping; perftest 4.5-0.17
#                  servers always bind 0.0.0.0:P), the guest connects to 10.0.2.2:P, which
#                  slirp turns into host 127.0.0.1:P.
#    Sync: the guest announces phases on ttyS0 (console log), the host answers "go/skip/abort
#    <phase>" on ttyS1 (a pipe chardev).
# 3. Cases, each with MPA CRC off and on (SOFTVERBS_MPA_CRC=1 makes softverbs ask for CRC as
#    initiator and set C in its Reply as responder; siw accepts it either way):
#      rping -v -V -C 10, ib_write_bw -R, ib_send_lat -R, each softverbs->siw and siw->softverbs;
#      rsockets (rdma-core's rsocket in the guest, softverbs' librdmacm rsocket on the host, both
#      in iWARP MSG_SEND mode): rstream -S 4096 -C 1000 non-blocking with data verification
#      (rstream, -T v), blocking (rstream_b, -T b), with rpoll on the server (rstream_a, -T a),
#      and riostream -S 4096 -C 1000 -T v (riomap/riowrite), each in both directions (so each
#      rsocket implementation plays each role). A custom size makes rstream/riostream run one
#      phase with rsockets' default inline size (their default all-phases mode sets RDMA_INLINE=0
#      for the bandwidth phases, which rdma-core v44 rsockets cannot do on iWARP).
#    A case passes when both sides exit 0, rping validated all 10 pings on both sides, perftest
#    printed its result line, rstream/riostream printed their "custom 4k ..." line with a
#    positive Gb/sec on BOTH sides and no rsocket call error, and softverbs' connection log shows
#    the expected CRC setting.
# 4. Captures lo for all but the ib_write_bw cases (tcpdump) and checks with tshark that the
#    streams decode as iwarp_mpa + iwarp_ddp_rdmap, with no Terminate and nothing malformed,
#    that every MPA Reply's C flag is as expected, and that with CRC on every FPDU's CRC is good.
# 5. Prints a summary table and "N passed, M failed"; exits non-zero on any failure.
#
# Robustness. Every wait is bounded; every process we start is killed by PID. A phase that hangs
# or crashes the guest kernel gets the guest replaced by a fresh one resuming at the next phase.
# Two known non-softverbs problems are handled and reported, not hidden:
#  - Two Linux siw races (known_flake below): the case is retried (at most twice) on a fresh
#    guest and the note says so. For the accept race the guest reports it at once and we stop
#    our client.
#  - Debian perftest 4.5-0.17 crashes in its connect-retry path when the server listens late:
#    perftest clients talking to the guest get perftest_connect_delay.so preloaded.
# A known rsockets close race is reported (FAIL, with a note), not retried: the rstream/riostream
# server sends last and closes as soon as its sends complete, which on software iWARP (siw and
# softverbs alike) means "handed to the kernel TCP socket". If the slow client's next credit
# update reaches the closed socket, Linux aborts it (RST, TCPAbortOnData) and drops the unsent
# tail; the client then waits until its timeout. It hits both directions (first seen here).
# Guest tools still running 5 s before their timeout get their per-thread kernel state dumped
# into the guest log ("hang:" lines).
# Host crashes leave a core and a gdb backtrace in the run directory.
#
# Environment:
#   SIW_WORK               cache and run logs (default /var/tmp/softverbs-siw; runs/<time>/)
#   SIW_PORT_BASE          default 17300; uses base+1..base+14 (and +21..+34 for the 2nd pass)
#   SIW_ONLY=<regex>       run only matching cases, e.g. 'write_bw.sv2siw.off' (one guest still)
#   SIW_HOST_WRAP=<cmd>    prefix for every softverbs process, e.g.
#                          "gdb -q -batch -ex run -ex bt --args"
#   SIW_KPKG               kernel image package (default: what linux-image-amd64 depends on)
#   SIW_DBG=0              no siw dynamic debug in the guest (also disables race detection)
#   SIW_WARM=0             skip the guest's siw<->siw warm-up rping
#   SIW_PERFTEST_DELAY_MS  default 1000, 0 = no preload (see perftest_connect_delay.c)
#   SIW_QEMU_NICE          nice value for qemu (default -10)
# Must run as root (apt-get, hostfwd on lo, tcpdump).
set -u
set -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CRC_MODE=both
LIBDIR=$REPO/build/lib
CAPTURE=1
PREPARE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --crc) CRC_MODE=$2; shift 2 ;;
    --crc=*) CRC_MODE=${1#--crc=}; shift ;;
    --lib) LIBDIR=$2; shift 2 ;;
    --lib=*) LIBDIR=${1#--lib=}; shift ;;
    --no-capture) CAPTURE=0; shift ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$CRC_MODE" in
  both) CRCS=(off on) ;;
  on|off) CRCS=("$CRC_MODE") ;;
  *) echo "--crc must be both, on or off" >&2; exit 2 ;;
esac

W=${SIW_WORK:-/var/tmp/softverbs-siw}
BASE=${SIW_PORT_BASE:-17300}
GUEST_DBG=${SIW_DBG:-1}
GUEST_WARM=${SIW_WARM:-1}
PT_DELAY_MS=${SIW_PERFTEST_DELAY_MS:-1000}
QEMU_NICE=${SIW_QEMU_NICE:--10}
# Keep in step with guest_init.sh.
BW_ARGS="-s 65536 -D 3 -F --report_gbits"
LAT_ARGS="-s 64 -n 1000 -F"
RPING_ARGS="-v -V -C 10"
RS_ARGS="-S 4096 -C 1000"
T_TOOL=120         # every host-side tool runs under timeout
T_BOOT=300         # first guest phase must appear within this
T_QEMU=1500        # hard limit for the whole guest

T0=$(date +%s)
log() { echo "[siw-interop $(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[siw-interop] FATAL: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (apt-get, tcpdump)"
mkdir -p "$W" || die "cannot create $W"
exec 9>"$W/.lock"
flock -n 9 || die "another siw_interop.sh is using $W"

# ---------------------------------------------------------------------------------------------
# 1. Preparation (cached)
# ---------------------------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'; }

kernel_pkg() {
  if [ -n "${SIW_KPKG:-}" ]; then echo "$SIW_KPKG"; return; fi
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}

prepare() {
  KPKG=$(kernel_pkg)
  if [ -z "$KPKG" ]; then
    apt-get update >"$W/apt-update.log" 2>&1 || die "apt-get update failed (see $W/apt-update.log)"
    KPKG=$(kernel_pkg)
  fi
  [ -n "$KPKG" ] || die "cannot find the kernel package behind linux-image-amd64"
  KV=${KPKG#linux-image-}                                            # 6.1.0-56-amd64
  KVER=$(apt-cache show "$KPKG" | awk '/^Version:/{print $2; exit}')  # 6.1.192-2
  KMM=$(echo "$KV" | cut -d. -f1,2)                                  # 6.1
  local pkgs=(qemu-system-x86 busybox-static rdmacm-utils ibverbs-utils ibverbs-providers perftest
              cpio kmod iproute2 gzip xz-utils make gcc librdmacm-dev "linux-headers-$KV")
  [ $CAPTURE = 1 ] && pkgs+=(tcpdump tshark)
  local missing=() p
  for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get install -y --no-install-recommends "${missing[@]}" >"$W/apt.log" 2>&1 || {
      apt-get update >>"$W/apt.log" 2>&1
      apt-get install -y --no-install-recommends "${missing[@]}" >>"$W/apt.log" 2>&1
    } || die "apt-get install failed (see $W/apt.log)"
  fi
  log "packages ready; kernel $KV ($KVER)"

  mkdir -p "$W/debs"
  (cd "$W/debs" &&
    { ls "${KPKG}_"*.deb >/dev/null 2>&1 || apt-get download "$KPKG" >>"$W/apt.log" 2>&1; } &&
    { ls "linux-source-${KMM}_${KVER}_"*.deb >/dev/null 2>&1 ||
      apt-get download "linux-source-$KMM=$KVER" >>"$W/apt.log" 2>&1; }) ||
    die "apt-get download of $KPKG / linux-source-$KMM=$KVER failed"

  K=$W/kernel-$KV
  if [ ! -e "$K/.done" ]; then
    log "unpacking $KPKG"
    rm -rf "$K" && dpkg-deb -x "$W/debs/${KPKG}_"*.deb "$K" && touch "$K/.done" || die "unpack $KPKG"
  fi
  local S=$W/siw-src-$KVER
  if [ ! -e "$S/.done" ]; then
    log "extracting drivers/infiniband/sw/siw from linux-source-$KMM $KVER"
    rm -rf "$S" && mkdir -p "$S" &&
      dpkg-deb --fsys-tarfile "$W/debs/linux-source-${KMM}_${KVER}_"*.deb |
      tar -xO "./usr/src/linux-source-$KMM.tar.xz" |
      tar -xJ -C "$S" --strip-components=5 "linux-source-$KMM/drivers/infiniband/sw/siw" &&
      touch "$S/.done" || die "extracting siw source"
  fi
  local M=$W/siwmod-$KV
  if [ ! -e "$K/lib/modules/$KV/extra/siw.ko" ]; then
    log "building siw.ko out of tree"
    rm -rf "$M" && mkdir -p "$M" && cp "$S"/* "$M"/ || die "copy siw source"
    make -C "/usr/src/linux-headers-$KV" M="$M" CONFIG_RDMA_SIW=m modules >"$M/build.log" 2>&1 ||
      { tail -20 "$M/build.log"; die "siw.ko build failed"; }
    mkdir -p "$K/lib/modules/$KV/extra" && cp "$M/siw.ko" "$K/lib/modules/$KV/extra/" &&
      depmod -b "$K" "$KV" || die "depmod"
  fi
  log "kernel + siw.ko ready"

  SHIM=$W/perftest_connect_delay.so
  if [ ! -e "$SHIM" ] || [ "$HERE/perftest_connect_delay.c" -nt "$SHIM" ]; then
    gcc -shared -fPIC -O2 -Wall -o "$SHIM" "$HERE/perftest_connect_delay.c" -ldl ||
      die "building $SHIM"
  fi

  # Initramfs, keyed on its inputs.
  BINS=(/usr/bin/rdma /usr/bin/rping /usr/bin/ibv_devices /usr/bin/ibv_devinfo /usr/bin/ib_write_bw
        /usr/bin/ib_send_lat /usr/bin/rstream /usr/bin/riostream)
  # siw dynamic debug (guest svdbg=1): the connection manager and QP state machine in full,
  # and only the error lines of the data path (per-FPDU lines would swamp a TCG guest).
  local pat
  { printf 'file %s +p\n' siw_cm.c siw_qp.c
    for pat in 'rx error' 'TERM reports' 'target mem check' 'rresp len' 'receive space short' \
               "too many sge"; do
      grep -n "siw_dbg.*$pat" "$S/siw_qp_rx.c" | cut -d: -f1 |
        while read -r f; do echo "file siw_qp_rx.c line $f-$((f + 2)) +p"; done
    done
    for pat in 'processing failed' 'read.response failed' 'SQ task failed'; do
      grep -n "siw_dbg.*$pat" "$S/siw_qp_tx.c" | cut -d: -f1 |
        while read -r f; do echo "file siw_qp_tx.c line $f-$((f + 2)) +p"; done
    done
  } > "$W/sv-dyndbg"
  local key
  key=$( { echo "$KV"; cat "$HERE/guest_init.sh" "$W/sv-dyndbg"; ls -l "${BINS[@]}" /usr/bin/busybox; } |
         sha256sum | cut -c1-16)
  INITRD=$W/initramfs-$KV.cpio.gz
  if [ ! -e "$INITRD" ] || [ "$(cat "$W/initramfs.key" 2>/dev/null)" != "$key" ]; then
    log "building initramfs"
    local R=$W/rootfs
    rm -rf "$R"
    mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,run,etc/libibverbs.d,usr/bin,lib/modules/$KV} \
      "$R/usr/lib/x86_64-linux-gnu/libibverbs" || die "mkdir rootfs"
    cp /usr/bin/busybox "$R/bin/" || die "busybox"
    local a
    for a in $(/usr/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$R/bin/$a"; done
    local m f
    for m in virtio_pci virtio_net crc32c_generic crc32c_intel siw iw_cm rdma_cm rdma_ucm ib_uverbs; do
      modprobe -d "$K" -S "$KV" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
    done | awk '!s[$0]++' > "$W/modules.list"
    : > "$R/etc/sv-modules"
    while read -r f; do
      cp "$f" "$R/lib/modules/$KV/" || die "copy module $f"
      basename "$f" >> "$R/etc/sv-modules"
    done < "$W/modules.list"
    cp "${BINS[@]}" "$R/usr/bin/" || die "copy rdma userland"
    cp /usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so "$R/usr/lib/x86_64-linux-gnu/libibverbs/" &&
      cp /etc/libibverbs.d/siw.driver "$R/etc/libibverbs.d/" || die "copy libsiw"
    for f in "${BINS[@]}" "$R"/usr/lib/x86_64-linux-gnu/libibverbs/*.so; do
      env -u LD_LIBRARY_PATH ldd "$f" | awk '/=>/ {print $3} /ld-linux/ {print $1}'
    done | sort -u | while read -r f; do
      [ -e "$f" ] && mkdir -p "$R$(dirname "$f")" && cp -L "$f" "$R$(dirname "$f")/"
    done
    cp -L /lib/x86_64-linux-gnu/libgcc_s.so.1 "$R/lib/x86_64-linux-gnu/"   # pthread_exit in rping
    [ -e "$R/lib64/ld-linux-x86-64.so.2" ] || { mkdir -p "$R/lib64" &&
      cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"; }
    cp "$W/sv-dyndbg" "$R/etc/sv-dyndbg"
    install -m 755 "$HERE/guest_init.sh" "$R/init"
    (cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$INITRD.tmp") &&
      mv "$INITRD.tmp" "$INITRD" && echo "$key" > "$W/initramfs.key" || die "cpio"
  fi
  log "initramfs ready ($(du -h "$INITRD" | cut -f1))"
}

prepare
[ $PREPARE_ONLY = 1 ] && { log "prepared under $W"; exit 0; }

# ---------------------------------------------------------------------------------------------
# 2. Run
# ---------------------------------------------------------------------------------------------
[ -e "$LIBDIR/libibverbs.so.1" ] && [ -e "$LIBDIR/librdmacm.so.1" ] ||
  die "no softverbs libraries in $LIBDIR (build with ninja -C $REPO/build)"
RUN=$W/runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN/lib" || die "mkdir $RUN"
ls -1dt "$W"/runs/*/ 2>/dev/null | tail -n +6 | xargs -r rm -rf   # keep the last 5 runs
# Snapshot the libraries: the build tree may be rebuilt while we run. Take a copy only when the
# tree has been quiet for 5 s and the copy resolves for rping (both libraries from the snapshot).
snap_ok=0
for _ in $(seq 60); do
  if [ -z "$(find -L "$LIBDIR" -maxdepth 1 -name 'lib*.so*' -newermt '-5 seconds' 2>/dev/null)" ]; then
    rm -rf "${RUN:?}/lib" && mkdir -p "$RUN/lib" && cp -a "$LIBDIR"/lib*.so* "$RUN/lib/" 2>/dev/null &&
      [ "$(LD_LIBRARY_PATH=$RUN/lib ldd /usr/bin/rping | grep -c "$RUN/lib/lib\(ibverbs\|rdmacm\)")" = 2 ] &&
      { snap_ok=1; break; }
  fi
  sleep 2
done
[ $snap_ok = 1 ] || die "could not take a consistent snapshot of $LIBDIR (being rebuilt?)"
log "softverbs libraries: $LIBDIR (snapshot in $RUN/lib); logs in $RUN"
# Host-side processes run in $RUN with core dumps on (core_pattern permitting), so a crash of a
# softverbs process leaves $RUN/<case>.core and a backtrace in $RUN/<case>.bt.
cd "$RUN" || die "cd $RUN"
ulimit -c unlimited 2>/dev/null

# The case table, in the order of the guest's fixed sequence (guest_init.sh). Pass i (one per
# CRC setting) uses ports BASE+20*i + 1..14; odd = siw server (hostfwd 127.0.0.1:P -> guest:P),
# even = softverbs server on the host (the guest connects to 10.0.2.2:P).
CRCLIST=$(IFS=,; echo "${CRCS[*]}")
CASES=()     # name|tool|crc|port|kind   kind: srv = siw server, cli = siw client
HOSTFWD=
CAPPORTS=()  # captured: all but ib_write_bw (~100 MB a case); rsockets ~8 MB a case
for i in "${!CRCS[@]}"; do
  c=${CRCS[$i]}
  k=0
  for t in rping ib_write_bw ib_send_lat rstream rstream_b rstream_a riostream; do
    for kind in srv cli; do
      k=$((k + 1))
      P=$((BASE + 20 * i + k))
      [ $kind = srv ] && d=sv2siw || d=siw2sv
      CASES+=("${t#ib_}.$d.$c|$t|$c|$P|$kind")
      [ $kind = srv ] && HOSTFWD+=",hostfwd=tcp:127.0.0.1:$P-10.0.2.15:$P"
      [ $t = ib_write_bw ] || CAPPORTS+=("$P")
      [ -z "$(ss -Hltn "( sport = :$P )" 2>/dev/null)" ] ||
        die "port $P is in use on this host (set SIW_PORT_BASE)"
    done
  done
done

PIDS=()   # everything we started, killed by PID on exit
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 3' INT TERM

if [ $CAPTURE = 1 ] && command -v tcpdump >/dev/null; then
  filt="tcp and ($(printf 'port %s or ' "${CAPPORTS[@]}" | sed 's/ or $//'))"
  # A large buffer: a dropped packet makes the FPDU decode of the rest of its stream useless.
  timeout $T_QEMU tcpdump -i lo -n -U -B 65536 -w "$RUN/lo.pcap" "$filt" 2>"$RUN/tcpdump.log" &
  PIDS+=($!)
  for _ in $(seq 50); do grep -q 'listening on' "$RUN/tcpdump.log" && break; sleep 0.1; done
  grep -q 'listening on' "$RUN/tcpdump.log" || { log "tcpdump did not start; no capture"; CAPTURE=0; }
else
  CAPTURE=0
fi

con() { { tr -d '\r' < "$CONSOLE"; } 2>/dev/null; }
# wait_marker REGEX TIMEOUT: prints the first console line matching REGEX.
wait_marker() {
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
guest_out() { con | sed -n "s/^@@OUT $1| //p"; }
guest_dmesg() { con | sed -n "s/^@@DMESG $1| //p"; }
guest_logs() {  # guest_logs NAME: the guest's tool output and dmesg for the phase
  guest_out "$1" > "$RUN/$1.guest.log"
  guest_dmesg "$1" > "$RUN/$1.dmesg.log"
}
# Kernel trouble on the guest console (printed at loglevel <= 4) since the last call.
KERR_SEEN=0
guest_kernel_errors() {
  local all n
  all=$(con | grep -a -E 'kernel BUG at|Oops:|general protection fault|BUG: |WARNING: CPU:|watchdog: BUG')
  n=$(printf '%s' "$all" | grep -c .)
  [ "$n" -gt "$KERR_SEEN" ] && printf '%s\n' "$all" | tail -n +$((KERR_SEEN + 1)) | head -1 | sed 's/^\[[ 0-9.]*\] //'
  KERR_SEEN=$n
}
host_env() {  # host_env CRC [delay]: the environment of every softverbs process
  local e=(env -u LD_PRELOAD -u SOFTVERBS_MPA_CRC LD_LIBRARY_PATH="$RUN/lib" SOFTVERBS_NETDEV=lo
           SOFTVERBS_DEBUG=1)
  [ "$1" = on ] && e+=(SOFTVERBS_MPA_CRC=1)
  # perftest client against the guest's siw server: see perftest_connect_delay.c.
  [ "${2:-}" = delay ] && [ "$PT_DELAY_MS" != 0 ] &&
    e+=(LD_PRELOAD="$SHIM" SV_RESOLVE_DELAY_MS="$PT_DELAY_MS")
  printf '%s\n' "${e[@]}"
  # shellcheck disable=SC2086
  [ -n "${SIW_HOST_WRAP:-}" ] && printf '%s\n' $SIW_HOST_WRAP
}
tool_timeout() {   # guest_init.sh: same for clients
  case "$1" in rping) echo 30 ;; r*stream*) echo 60 ;; *) echo $T_TOOL ;; esac
}

# boot_guest SKIP: boots a guest whose sequence starts at phase SKIP (0-based).
BOOTS=0
boot_guest() {
  BOOTS=$((BOOTS + 1))
  CONSOLE=$RUN/console.$BOOTS.log
  local ctlp=$RUN/ctl.$BOOTS
  mkfifo "$ctlp.in" "$ctlp.out" || die "mkfifo"
  log "booting guest #$BOOTS: kernel $KV, TCG, -smp 1, svcrc=$CRCLIST$( [ "$1" -gt 0 ] && echo ", resuming at phase $1")"
  TBOOT=$(date +%s)
  # Raised priority: a vCPU preempted by host load (e.g. a parallel build) stretches siw's race
  # windows (known_flake) from microseconds to milliseconds.
  timeout $T_QEMU nice -n "$QEMU_NICE" qemu-system-x86_64 -accel tcg -cpu max -m 1024 -smp 1 -nodefaults -display none \
    -no-reboot -monitor none \
    -serial "file:$CONSOLE" -chardev "pipe,id=ctl,path=$ctlp" -serial chardev:ctl \
    -kernel "$K/boot/vmlinuz-$KV" -initrd "$INITRD" \
    -append "console=ttyS0 loglevel=4 panic=-1 svcrc=$CRCLIST svbase=$BASE svdbg=$GUEST_DBG svwarm=$GUEST_WARM svskip=$1" \
    -netdev "user,id=n0${HOSTFWD}" -device virtio-net-pci,netdev=n0 \
    >"$RUN/qemu.$BOOTS.log" 2>&1 &
  QPID=$!
  PIDS+=("$QPID")
  exec 7<>"$ctlp.in"   # O_RDWR: never blocks, even if qemu failed to start
  exec 8<>"$ctlp.out"
  KERR_SEEN=0
  local m
  if ! m=$(wait_marker '^@@SV BOOT (ok|fail)' $T_BOOT) || [[ $m != *"BOOT ok"* ]]; then
    con | tail -40
    log "guest did not boot (console: $CONSOLE, qemu: $RUN/qemu.$BOOTS.log)"
    return 1
  fi
  log "guest up after $(( $(date +%s) - TBOOT ))s: $m"
}
stop_guest() {
  kill "$QPID" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$QPID" 2>/dev/null
  wait "$QPID" 2>/dev/null
  exec 7>&- 8>&-
}


selected() { [[ $1 =~ ${SIW_ONLY:-.} ]]; }
# Per-case results.
NAMES=() DIRS=() CRCCOL=() RESULTS=() NUMS=() NOTES=() PORTS=()
record() {  # name dir crc result numbers note port
  local res=$4 note=$6 kerr
  kerr=$(guest_kernel_errors)
  if [ -n "$kerr" ]; then res=FAIL; note="${note:+$note; }guest kernel: $kerr"; fi
  NAMES+=("$1"); DIRS+=("$2"); CRCCOL+=("$3"); RESULTS+=("$res"); NUMS+=("$5"); NOTES+=("$note"); PORTS+=("$7")
  log "$res $1 ${5:+[$5]} ${note:+($note)}"
}

# perf_numbers TOOL FILE: the result line of a perftest report. perftest derives its clock from
# a TSC-vs-gettimeofday fit; when that fails (r^2 < 0.9, a loaded TCG guest) it reports 0.
perf_numbers() {
  grep -q 'Correlation coefficient r^2' "$2" && printf 'TSC fit failed, rates n/a: '
  case "$1" in
    ib_write_bw) awk '/^[ \t]*65536[ \t]+[0-9]+[ \t]+[0-9.]+[ \t]+[0-9.]+/ {printf "%s Gb/s avg, %s iters", $4, $2; exit}' "$2" ;;
    ib_send_lat) awk '/^[ \t]*64[ \t]+[0-9]+[ \t]+[0-9.]+[ \t]+[0-9.]+[ \t]+[0-9.]+[ \t]+[0-9.]+/ {printf "typ %s us, avg %s us", $5, $6; exit}' "$2" ;;
  esac
}
# rs_numbers FILE: rstream/riostream's result line for the custom size ("name bytes xfers iters
# total time Gb/sec usec/xfer"), as "G Gb/s U us/xfer", only when Gb/sec is positive.
rs_numbers() {
  awk '$1 == "custom" && $2 == "4k" && $6 ~ /^[0-9.]+s$/ && $7 + 0 > 0 {
         printf "%s Gb/s %s us/xfer", $7, $8; exit }' "$1"
}

# check_case NAME TOOL CRC HOSTRC GUESTRC KIND -> sets RES, NOTE, NUMS_NOW
check_case() {
  local name=$1 tool=$2 crc=$3 hrc=$4 grc=$5 kind=$6
  local hlog=$RUN/$1.host.log glog=$RUN/$1.guest.log notes=() want n core exe
  [ "$hrc" = 0 ] || notes+=("softverbs rc=$hrc")
  core=$(ls -t "$RUN"/core* 2>/dev/null | head -1)
  if [ -n "$core" ]; then
    mv "$core" "$RUN/$name.core"
    exe=$(file "$RUN/$name.core" 2>/dev/null | sed -n "s/.*execfn: '\([^']*\)'.*/\1/p")
    [ -n "$exe" ] || exe=$(command -v "$tool")
    if command -v gdb >/dev/null; then
      gdb -q -batch -ex "set solib-search-path $RUN/lib" -ex bt -ex 'thread apply all bt 8' \
        "$exe" "$RUN/$name.core" >"$RUN/$name.bt" 2>&1
      notes+=("crashed: $(grep -m1 '^#0' "$RUN/$name.bt" | cut -c1-120)")
    else
      notes+=("crashed: core in $RUN/$name.core")
    fi
  fi
  [ "$grc" = 0 ] || notes+=("siw rc=$grc")
  if [ "$tool" = rping ]; then
    # rping -v prints one line per validated iteration: "ping data: ..." on the client,
    # "server ping data: ..." on the server; -V makes a mismatch an error.
    local hpat='^ping data: rdma-ping-' gpat='^server ping data: rdma-ping-'
    [ "$kind" = cli ] && { hpat='^server ping data: rdma-ping-'; gpat='^ping data: rdma-ping-'; }
    n=$(grep -c "$hpat" "$hlog"); [ "$n" = 10 ] || notes+=("softverbs saw $n/10 pings")
    n=$(grep -c "$gpat" "$glog"); [ "$n" = 10 ] || notes+=("siw saw $n/10 pings")
    grep -qi 'mismatch' "$hlog" "$glog" && notes+=("data mismatch")
  elif [[ $tool == r*stream* ]]; then
    # Both ends time the same exchange and print the line; any perror() of an rsocket call
    # (rconnect, raccept, rsend, rrecv, rpoll, riomap, riowrite ...) fails the case.
    local hn gn
    hn=$(rs_numbers "$hlog"); gn=$(rs_numbers "$glog")
    [ -n "$hn" ] || notes+=("softverbs printed no result line")
    [ -n "$gn" ] || notes+=("siw printed no result line")
    NUMS_NOW="sv ${hn:-?}; siw ${gn:-?}"
    local perr='^(rsocket|rbind|rlisten|raccept|rconnect|async rconnect|rsend|rrecv|rpoll|riomap|riowrite|rsetsockopt|rgetsockopt|getaddrinfo)'
    grep -Eq "$perr" "$hlog" && notes+=("softverbs: $(grep -Em1 "$perr" "$hlog" | cut -c1-60)")
    grep -Eq "$perr" "$glog" && notes+=("siw: $(grep -Em1 "$perr" "$glog" | cut -c1-60)")
    # The server sends last and closes first. When it closes with data still in its kernel
    # TCP send queue and the client's next credit update arrives, Linux aborts the connection
    # (TCPAbortOnData: RST, queued data dropped) and the client waits forever for the tail.
    # Seen with either implementation as the closing server; the capture then shows the
    # server's stream ending early, without the DISCONNECT message.
    local slog=$glog clog=$hlog cli_rc=$hrc
    [ "$kind" = cli ] && { slog=$hlog; clog=$glog; cli_rc=$grc; }
    if [ -n "$(rs_numbers "$slog")" ] && [ -z "$(rs_numbers "$clog")" ] &&
       { [ "$cli_rc" = 124 ] || [ "$cli_rc" = 143 ]; }; then
      notes+=("client timed out waiting for data: close race, the server's close dropped its unsent tail")
    fi
  else
    local clog=$hlog; [ "$kind" = cli ] && clog=$glog   # the client prints the numbers
    NUMS_NOW=$(perf_numbers "$tool" "$clog")
    [ -n "$NUMS_NOW" ] || notes+=("no perftest result line")
  fi
  want=0; [ "$crc" = on ] && want=1
  local conns bad
  # "softverbs: info: qp N connected ..." (the level tag appeared with SOFTVERBS_LOG levels).
  local cre='softverbs: \(info: \)\{0,1\}qp [0-9]* connected'
  conns=$(grep -c "$cre" "$hlog")
  bad=$(grep "$cre" "$hlog" | grep -vc "crc $want ")
  if [ "$conns" = 0 ]; then notes+=("no softverbs connection logged")
  elif [ "$bad" != 0 ]; then notes+=("CRC not $crc on $bad/$conns connections"); fi
  # siw's own view (dynamic debug, siw_qp.c): "enter RTS: crc=y|n" for each of its QPs.
  local siwrts yn=n
  [ "$crc" = on ] && yn=y
  siwrts=$(grep -o 'crc=[yn]' <(grep 'enter RTS: crc=' "$RUN/$name.dmesg.log" 2>/dev/null) | sort |
           uniq -c | awk '{printf "%s%s x%s", s, $2, $1; s = ", "}')
  if [ -n "$siwrts" ]; then
    [[ $siwrts == "crc=$yn x"* && $siwrts != *,* ]] || notes+=("siw QPs: $siwrts")
    SIWCRC="siw $siwrts"
  else
    SIWCRC=
  fi
  local re='softverbs: .*\(Terminate\|CRC error\|bad segment\|bad MPA\|connect failed\)'
  grep -q "$re" "$hlog" && notes+=("$(grep -m1 "$re" "$hlog" | cut -c1-80)")
  if [ ${#notes[@]} = 0 ]; then RES=PASS; NOTE=$SIWCRC; else RES=FAIL; NOTE=$(IFS=';'; echo "${notes[*]}"); fi
}

# host_cmd TOOL PORT KIND: the softverbs side's command line (array CMD).
host_cmd() {
  local t=$1 p=$2 kind=$3
  # shellcheck disable=SC2206
  case "$t.$kind" in
    rping.srv) CMD=(rping -c -a 127.0.0.1 -p "$p" $RPING_ARGS) ;;
    rping.cli) CMD=(rping -s -a 127.0.0.1 -p "$p" $RPING_ARGS) ;;
    ib_write_bw.srv) CMD=(ib_write_bw -R -p "$p" $BW_ARGS 127.0.0.1) ;;
    ib_write_bw.cli) CMD=(ib_write_bw -R -p "$p" $BW_ARGS) ;;      # perftest binds 0.0.0.0
    ib_send_lat.srv) CMD=(ib_send_lat -R -p "$p" $LAT_ARGS 127.0.0.1) ;;
    ib_send_lat.cli) CMD=(ib_send_lat -R -p "$p" $LAT_ARGS) ;;
    # rstream_b = rstream -T b, rstream_a = rstream -T a; server binds with -b, client -s.
    r*stream*.srv) CMD=("${t%%_*}" -s 127.0.0.1 -p "$p" $RS_ARGS) ;;
    r*stream*.cli) CMD=("${t%%_*}" -b 127.0.0.1 -p "$p" $RS_ARGS) ;;
  esac
  # Keep in step with guest_init.sh. -T v: both ends check the data they receive.
  # -T a only on the server: an rpoll client fails by design in this mode (rstream's do_poll()
  # treats POLLIN|POLLHUP as an error, and rsockets report POLLHUP as soon as the server's
  # DISCONNECT is processed, even with the last data still unread; rdma-core does the same).
  case "$t.$kind" in
    rstream.*|riostream.*) CMD+=(-T v) ;;
    rstream_b.*) CMD+=(-T b) ;;
    rstream_a.cli) CMD+=(-T a) ;;
  esac
}

# run_case INDEX: plays the softverbs side of CASES[INDEX]. Returns 1 when the guest is out of
# step (it never reached the phase, or the phase did not end): the caller reboots the guest.
run_case() {
  local name tool crc port kind dir m hrc=x grc=x spid ok=0 to
  IFS='|' read -r name tool crc port kind <<<"${CASES[$1]}"
  [ "$kind" = srv ] && dir="softverbs -> siw" || dir="siw -> softverbs"
  local hlog=$RUN/$name.host.log
  NUMS_NOW=
  to=$(tool_timeout "$tool")
  host_cmd "$tool" "$port" "$kind"
  if [ "$kind" = srv ] && [[ $tool == ib_* ]]; then
    mapfile -t E < <(host_env "$crc" delay)
  else
    mapfile -t E < <(host_env "$crc")
  fi
  if [ "$kind" = srv ]; then
    # siw listens in the guest; softverbs connects through hostfwd.
    if ! m=$(wait_marker "^@@SV (READY|NOTREADY) $name( |\$)" 180); then
      record "$name" "$dir" "$crc" FAIL "" "guest never reached this phase" "$port"; return 1
    fi
    if ! selected "$name"; then
      ctl "abort $name"
      wait_marker "^@@SV END $name " 60 >/dev/null || return 1
      return 0
    fi
    if [[ $m == *NOTREADY* ]]; then
      wait_marker "^@@SV END $name " $((to + 10)) >/dev/null
      guest_logs "$name"
      record "$name" "$dir" "$crc" FAIL "" "siw server did not listen: $(tail -1 "$RUN/$name.guest.log")" "$port"
      return 0
    fi
    timeout "$to" "${E[@]}" "${CMD[@]}" >"$hlog" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    while kill -0 $spid 2>/dev/null; do
      if con | grep -aq "^@@SV RACE $name\$"; then
        # The guest saw the siw accept race: our client would wait for its whole timeout.
        echo "[siw_interop: guest reports the siw accept race; client stopped]" >>"$hlog"
        kill $spid 2>/dev/null
        break
      fi
      sleep 0.5
    done
    wait $spid
    hrc=$?
    if ! m=$(wait_marker "^@@SV END $name " 20); then
      ctl "abort $name"   # the guest dumps dmesg and socket queues, then kills its server
      if ! m=$(wait_marker "^@@SV END $name " 30); then
        guest_logs "$name"
        record "$name" "$dir" "$crc" FAIL "" "softverbs rc=$hrc; guest phase did not end" "$port"
        return 1
      fi
    fi
  else
    # softverbs listens on the host; the guest's siw client connects to 10.0.2.2 = 127.0.0.1.
    if ! wait_marker "^@@SV WAIT $name\$" 180 >/dev/null; then
      record "$name" "$dir" "$crc" FAIL "" "guest never reached this phase" "$port"; return 1
    fi
    if ! selected "$name"; then
      for _ in 1 2 3; do
        ctl "skip $name"
        wait_marker "^@@SV END $name " 10 >/dev/null && return 0
      done
      return 1
    fi
    timeout "$to" "${E[@]}" "${CMD[@]}" >"$hlog" 2>&1 &
    spid=$!
    PIDS+=("$spid")
    for _ in $(seq 100); do
      [ -n "$(ss -Hltn "( sport = :$port )" 2>/dev/null)" ] && { ok=1; break; }
      kill -0 $spid 2>/dev/null || break
      sleep 0.1
    done
    if [ $ok = 0 ]; then
      kill $spid 2>/dev/null; wait $spid 2>/dev/null
      for _ in 1 2 3; do
        ctl "skip $name"
        wait_marker "^@@SV END $name " 10 >/dev/null && break
      done || return 1
      record "$name" "$dir" "$crc" FAIL "" "softverbs server did not listen: $(tail -1 "$hlog")" "$port"
      return 0
    fi
    # Repeat "go" until the guest starts (a control line can be lost; the guest ignores extras).
    local gos=1
    ctl "go $name"
    until wait_marker "^@@SV BEGIN $name " 3 >/dev/null; do
      gos=$((gos + 1))
      if [ $gos -gt 10 ] || ! kill -0 "$QPID" 2>/dev/null; then break; fi
      ctl "go $name"
    done
    [ $gos = 1 ] || echo "[siw_interop: sent 'go' $gos times]" >>"$hlog"
    if ! m=$(wait_marker "^@@SV END $name " $((to + 20))); then
      kill $spid 2>/dev/null; wait $spid 2>/dev/null
      guest_logs "$name"
      record "$name" "$dir" "$crc" FAIL "" "guest phase did not end" "$port"
      return 1
    fi
    # The guest client is done; give the server a moment to see the disconnect and exit.
    for _ in $(seq 150); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $spid 2>/dev/null; then
      kill $spid 2>/dev/null
      echo "[siw_interop: softverbs server still running 15 s after the siw client ended; killed]" >>"$hlog"
    fi
    wait $spid
    hrc=$?
  fi
  grc=$(sed -n 's/.* rc=\([^ ]*\).*/\1/p' <<<"$m")
  guest_logs "$name"
  check_case "$name" "$tool" "$crc" "$hrc" "$grc" "$kind"
  [[ $m == *ABORTED* ]] || grep -q "^@@SV ABORTED $name" <(con) && NOTE="${NOTE:+$NOTE; }siw side aborted"
  record "$name" "$dir" "$crc" "$RES" "$NUMS_NOW" "$NOTE" "$port"
  return 0
}

# known_flake NAME: prints the name of a known siw-side race if the failed case shows one.
#  - "siw accept race" (siw_cm.c siw_accept): siw sends its MPA Reply while the socket still has
#    the CM upcall ("siw_cm_llp_data_ready: cep state: 7" = SIW_EPSTATE_RDMA_MODE ignores data)
#    and installs the RTR upcall only afterwards; our first FPDUs arrived in that window and siw
#    never looked at them: no ESTABLISHED (reason=3). The guest also says "RACE <phase>".
#  - "siw teardown race" (siw_qp_tx.c siw_qp_sq_proc_tx): perftest's last handshake SEND from
#    siw reached us, our side answered/closed at once, and the close was processed inside siw's
#    still-running transmit of that SEND: c_tx->tx_suspend -> the WQE fails with -ECONNABORTED
#    ("wqe type 3 processing failed: -103"), so siw's perftest reports "Failed to close
#    connection" after a complete test. Only seen when the TCG guest is starved by host load.
known_flake() {
  local d=$RUN/$1.dmesg.log g=$RUN/$1.guest.log
  if con | grep -aq "^@@SV RACE $1\$" ||
     awk '/send mpa reply/ {r = 1; f = 0; next} r && /reason=3/ {r = 0; f = 0}
          r && /siw_cm_llp_data_ready: cep state: 7/ {f = 1} END {exit !f}' "$d" 2>/dev/null; then
    echo "siw accept race"
  elif grep -q 'Failed to close connection between server and client' "$g" 2>/dev/null &&
       grep -q 'wqe type 3 processing failed: -103' "$d" 2>/dev/null &&
       grep -qE '^[ \t]*(64|65536)[ \t]+[0-9]+[ \t]+[0-9.]' "$g" "$RUN/$1.host.log"; then
    echo "siw teardown race"
  else
    return 1
  fi
}
pop_record() {
  unset 'NAMES[-1]' 'DIRS[-1]' 'CRCCOL[-1]' 'RESULTS[-1]' 'NUMS[-1]' 'NOTES[-1]' 'PORTS[-1]'
}

# Main loop: one guest for the whole sequence. If the guest falls out of step (a hung or crashed
# phase), a fresh guest resumes at the next phase. A case that fails with a known siw race
# (known_flake) is retried on a fresh guest, at most twice; its note says so and keeps the logs
# of the failed tries ($name.tryN.*).
TGUEST0=$(date +%s)
idx=0
tries=0      # failed tries of case idx so far
flakes=
boot_guest 0 || die "guest did not boot"
while [ $idx -lt ${#CASES[@]} ]; do
  run_case $idx
  rc=$?
  name=${CASES[$idx]%%|*}
  last=$(( ${#NAMES[@]} - 1 ))
  if [ $last -ge 0 ] && [ "${NAMES[$last]}" = "$name" ]; then
    if [ "${RESULTS[$last]}" = FAIL ] && [ $tries -lt 2 ] && flake=$(known_flake "$name") &&
       [ $BOOTS -lt 10 ]; then
      tries=$((tries + 1))
      flakes+="${flakes:+, }$flake"
      log "$name hit the $flake (a Linux siw race, see known_flake); retrying on a fresh guest"
      for f in "$RUN/$name".*; do
        [[ $f == *.try[0-9].* ]] || mv "$f" "${f/$name./$name.try$tries.}"
      done
      pop_record
      stop_guest
      boot_guest $idx || break
      continue
    fi
    [ $tries = 0 ] ||
      NOTES[$last]="${NOTES[$last]:+${NOTES[$last]}; }retried $tries time(s) after: $flakes (logs $name.try*.*)"
  fi
  tries=0
  flakes=
  if [ $rc != 0 ]; then
    stop_guest
    [ $BOOTS -lt 10 ] || { log "too many guest restarts; giving up"; break; }
    [ $((idx + 1)) -lt ${#CASES[@]} ] || break
    boot_guest $((idx + 1)) || break
  fi
  idx=$((idx + 1))
done
wait_marker '^@@SV DONE' 30 >/dev/null
for _ in $(seq 100); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
stop_guest
TGUEST=$(( $(date +%s) - TGUEST0 ))

# ---------------------------------------------------------------------------------------------
# 4. Capture check: MPA handshake + DDP/RDMAP decode per captured case
# ---------------------------------------------------------------------------------------------

cap_check() {  # cap_check INDEX: appends to the case's note, may turn PASS into FAIL
  local i=$1 port=${PORTS[$1]} crc=${CRCCOL[$1]} f=$RUN/${NAMES[$1]}.tshark
  # iwarp_mpa is a heuristic TCP dissector (not "Decode As"-able); it finds the MPA Request and
  # then decodes the FPDUs of the stream, checking each CRC when the handshake turned CRC on.
  # rpcordma is off: its heuristic takes perftest's small Send payloads for RPC-over-RDMA.
  tshark --disable-protocol rpcordma -r "$RUN/lo.pcap" -Y "tcp.port==$port && (iwarp_mpa || iwarp_ddp_rdmap || _ws.malformed)" \
    -T fields -E separator='|' -e frame.number -e iwarp_mpa.key.req -e iwarp_mpa.key.rep \
    -e iwarp_mpa.crc_flag -e iwarp_mpa.rev -e iwarp_rdma.opcode -e _ws.malformed \
    >"$f" 2>"$f.err"
  tshark --disable-protocol rpcordma -r "$RUN/lo.pcap" -Y "tcp.port==$port && iwarp_mpa.crc_check" -V 2>>"$f.err" |
    grep -o '(Good CRC32)\|(Bad CRC32' | sort | uniq -c >"$f.crc"
  local req rep cflag ddp bad good badcrc ops want=0 lost
  # Segments the capture missed (tcpdump drops under host load): after such a gap tshark loses
  # the FPDU framing, so "bad CRC" and "malformed" there are artefacts, not wire errors.
  lost=$(tshark -r "$RUN/lo.pcap" -Y "tcp.port==$port && tcp.analysis.lost_segment" -T fields \
           -e frame.number 2>/dev/null | grep -c .)
  [ "$crc" = on ] && want=1
  req=$(awk -F'|' '$2 != "" {n++} END {print n+0}' "$f")
  rep=$(awk -F'|' '$3 != "" {n++} END {print n+0}' "$f")
  cflag=$(awk -F'|' '$3 != "" {print $4}' "$f" | sort -u | paste -sd/)   # C bits of the Replies
  ddp=$(awk -F'|' '$6 != "" {n += split($6, a, ",")} END {print n+0}' "$f")
  bad=$(awk -F'|' '$7 != "" {n++} END {print n+0}' "$f")
  good=$(awk '/Good/ {print $1}' "$f.crc"); good=${good:-0}
  badcrc=$(awk '/Bad/ {print $1}' "$f.crc"); badcrc=${badcrc:-0}
  ops=$(awk -F'|' '$6 != "" {m = split($6, a, ","); for (k = 1; k <= m; k++) c[a[k]]++}
        END {for (o in c) printf " %s:%d", o, c[o]}' "$f" |
        sed 's/0x00:/Write:/; s/0x01:/ReadReq:/; s/0x02:/ReadResp:/; s/0x03:/Send:/; s/0x07:/Term:/; s/^ //')
  local msg="wire: MPA req/rep $req/$rep, Reply C=${cflag:-?}, $ddp FPDUs ($ops)"
  [ $want = 1 ] && msg+=", CRC good $good bad $badcrc"
  [ "$bad" = 0 ] || msg+=", $bad malformed"
  [ "$lost" = 0 ] || msg+=" (capture missed $lost segment(s): CRC/malformed counts after the gap not checked)"
  # Who reset the TCP connection, if anyone: the softverbs end is port P for a siw client
  # (softverbs listens on P), and the ephemeral port for a siw server (hostfwd listens on P).
  local rst_sv rst_siw svport=dstport
  [[ ${DIRS[$i]} == siw* ]] && svport=srcport
  rst_sv=$(tshark -r "$RUN/lo.pcap" -Y "tcp.$svport==$port && tcp.flags.reset==1" -T fields \
             -e frame.number 2>/dev/null | grep -c .)
  rst_siw=$(tshark -r "$RUN/lo.pcap" -Y "tcp.port==$port && !(tcp.$svport==$port) && tcp.flags.reset==1" \
              -T fields -e frame.number 2>/dev/null | grep -c .)
  [ "$rst_sv" = 0 ] || msg+=", TCP RST from softverbs"
  [ "$rst_siw" = 0 ] || msg+=", TCP RST from siw side"
  echo "$msg" > "$f.summary"
  local ok=1
  [ "$req" -ge 1 ] && [ "$rep" -ge 1 ] && [ "$ddp" -ge 1 ] || ok=0
  [ "$bad" = 0 ] || [ "$lost" != 0 ] || ok=0
  [ "${cflag:-x}" = "$want" ] || ok=0
  [[ $ops == *Term:* ]] && ok=0
  if [ $want = 1 ]; then
    [ "$good" -ge 1 ] || ok=0
    [ "$badcrc" = 0 ] || [ "$lost" != 0 ] || ok=0
  fi
  if [ $ok = 1 ]; then
    NOTES[$i]="${NOTES[$i]:+${NOTES[$i]}; }$msg"
  else
    NOTES[$i]="${NOTES[$i]:+${NOTES[$i]}; }WIRE CHECK FAILED: $msg"
    RESULTS[$i]=FAIL
  fi
}
if [ $CAPTURE = 1 ]; then
  sleep 0.5
  for i in "${!NAMES[@]}"; do
    [[ " ${CAPPORTS[*]} " == *" ${PORTS[$i]} "* ]] || continue
    [ "${RESULTS[$i]}" = PASS ] || [ "${RESULTS[$i]}" = FAIL ] || continue
    cap_check "$i"
  done
fi

# ---------------------------------------------------------------------------------------------
# 5. Summary
# ---------------------------------------------------------------------------------------------
pass=0 fail=0
echo
printf '%-18s %-18s %-4s %-6s %-28s %s\n' case direction crc result numbers notes
printf '%-18s %-18s %-4s %-6s %-28s %s\n' ---- --------- --- ------ ------- -----
for i in "${!NAMES[@]}"; do
  printf '%-18s %-18s %-4s %-6s %-28s %s\n' "${NAMES[$i]%.*}" "${DIRS[$i]}" "${CRCCOL[$i]}" \
    "${RESULTS[$i]}" "${NUMS[$i]:--}" "${NOTES[$i]}"
  if [ "${RESULTS[$i]}" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
expected=0
for cs in "${CASES[@]}"; do selected "${cs%%|*}" && expected=$((expected + 1)); done
notrun=$(( expected - ${#NAMES[@]} ))
[ $notrun -gt 0 ] && { echo "($notrun selected cases not run)"; fail=$((fail + notrun)); }
echo
log "guest wall time ${TGUEST}s ($BOOTS boot(s) + all cases); total $(( $(date +%s) - T0 ))s; logs: $RUN"
for i in "${!NAMES[@]}"; do
  [ "${RESULTS[$i]}" = PASS ] && continue
  echo "--- ${NAMES[$i]}: last lines (host | guest | guest dmesg)"
  tail -5 "$RUN/${NAMES[$i]}.host.log" 2>/dev/null | sed 's/^/  softverbs| /'
  tail -5 "$RUN/${NAMES[$i]}.guest.log" 2>/dev/null | sed 's/^/  siw      | /'
  tail -8 "$RUN/${NAMES[$i]}.dmesg.log" 2>/dev/null | sed 's/^/  dmesg    | /'
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
