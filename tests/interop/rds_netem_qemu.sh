#!/usr/bin/env bash
# RDS reliability under REAL tc netem, in a QEMU guest (TCG) running the Debian 6.1 kernel.
#
#   tests/interop/rds_netem_qemu.sh [--messages N] [--build DIR] [--prepare-only]
#
# The scenario of tests/tools/rds_reliability.sh, for hosts whose kernel has no sch_netem
# (that script then falls back to nftables random drop): the guest (tests/interop/
# rds_netem_guest_init.sh is its /init) joins two network namespaces with veth, puts
#   tc qdisc add dev X root netem loss 1% duplicate 1% corrupt 0.1% delay 1ms reorder 25% 50%
# on both veth ends, runs one rds_flows per namespace (tests/rds/rds_flows.cc: 4 sockets a side,
# messages in a pseudo-random pattern, every flow checked for exactly-once, in-order delivery
# with a hash chain) and kills every TCP connection between them with ss -K every 0.2-0.5 s
# while they run. Passes when both rds_flows exit 0, netem was on both ends, resets happened
# and the guest kernel logged no BUG/Oops/WARNING. Prints the guest's tc -s qdisc / ip -s link
# (netem counts only its drops) and what TCP saw of the impairments (duplicates, checksum
# errors, out-of-order segments), then "N passed, M failed"; exits non-zero on any failure.
#
# Usage: run as root, one instance at a time (2-core host: one qemu). The default is the full
# run, 25 000 messages each way (50 000 in all); for a quick check pass fewer:
#   bash tests/interop/rds_netem_qemu.sh                     # full run
#   RDS_NETEM_MSGS=2000 bash tests/interop/rds_netem_qemu.sh # quick check
#   bash tests/interop/rds_netem_qemu.sh --build /tmp/other/build   # another build tree
# A passing full run takes about a minute on a 2-core host (guest boot ~10 s, traffic ~40-50 s
# under TCG). When one side fails, the guest stops the other 20 s later (it cannot finish
# without its peer); when one side succeeds, the other gets 120 s more.
# It reuses the Debian kernel that tests/interop/siw_interop.sh caches under
# /var/tmp/softverbs-siw (kernel-<ver>/), and downloads it (apt-get download) when absent.
# The binaries (build/tests/rds_flows and build/lib/lib*.so*) are copied into the run
# directory first, so a concurrent rebuild of build/ does not disturb a run. The guest has no
# network device: it reports on its serial console (runs/<time>/console.log).
# Everything is bounded: qemu runs under timeout so that the script ends within
# RDS_NETEM_LIMIT seconds (default 1500) even if the guest hangs.
#
# Environment:
#   RDS_NETEM_MSGS     messages per side (default 25000; --messages overrides)
#   RDS_NETEM_WORK     cache and run logs (default /var/tmp/softverbs-rds-netem; runs/<time>/)
#   SIW_WORK           where siw_interop.sh caches the kernel (default /var/tmp/softverbs-siw)
#   RDS_NETEM_KPKG     kernel image package (default: what linux-image-amd64 depends on)
#   RDS_NETEM_LIMIT    wall-clock limit of the whole script in seconds (default 1500)
#   RDS_NETEM_DEBUG=1  SOFTVERBS_DEBUG=1 for both rds_flows (connection diagnostics)
#   RDS_NETEM_NETEM    the netem parameters (default as above)
#   RDS_NETEM_QEMU_NICE nice value for qemu (default 0)
#   RDS_NETEM_RESETS   ss -K from both namespaces in turn (both, default), from A only (A, as
#                      rds_reliability.sh does) or none (diagnosis only: the check then fails)
#   RDS_NETEM_BUILD    the build directory (default build/; --build overrides)
set -u
set -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${RDS_NETEM_BUILD:-$REPO/build}
MSGS=${RDS_NETEM_MSGS:-25000}
PREPARE_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --messages) MSGS=$2; shift 2 ;;
    --messages=*) MSGS=${1#--messages=}; shift ;;
    --build) BUILD=$2; shift 2 ;;
    --build=*) BUILD=${1#--build=}; shift ;;
    --prepare-only) PREPARE_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ $MSGS =~ ^[0-9]+$ ]] && [ "$MSGS" -gt 0 ] || { echo "--messages must be a positive number" >&2; exit 2; }

W=${RDS_NETEM_WORK:-/var/tmp/softverbs-rds-netem}
SIWW=${SIW_WORK:-/var/tmp/softverbs-siw}
LIMIT=${RDS_NETEM_LIMIT:-1500}
NETEM=${RDS_NETEM_NETEM:-loss 1% duplicate 1% corrupt 0.1% delay 1ms reorder 25% 50%}
QEMU_NICE=${RDS_NETEM_QEMU_NICE:-0}
RESETS=${RDS_NETEM_RESETS:-both}
case "$RESETS" in both|A|none) ;; *) echo "RDS_NETEM_RESETS must be both, A or none" >&2; exit 2 ;; esac
T_BOOT=300   # the guest must report BOOT within this

T0=$(date +%s)
log() { echo "[rds-netem $(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[rds-netem] FATAL: $*" >&2; echo "0 passed, 1 failed"; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (apt-get, qemu)"
mkdir -p "$W" || die "cannot create $W"
exec 9>"$W/.lock"
flock -n 9 || die "another rds_netem_qemu.sh is using $W"

# ---------------------------------------------------------------------------------------------
# 1. Preparation: packages, the Debian kernel (shared with siw_interop.sh's cache when there)
# ---------------------------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed'; }
kernel_pkg() {
  if [ -n "${RDS_NETEM_KPKG:-}" ]; then echo "$RDS_NETEM_KPKG"; return; fi
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'
}
# has_kernel DIR KV: an unpacked kernel package with the modules this test needs.
has_kernel() {
  [ -e "$1/.done" ] && [ -e "$1/boot/vmlinuz-$2" ] &&
    [ -n "$(find "$1/lib/modules/$2" -name 'sch_netem.ko*' 2>/dev/null)" ]
}

prepare() {
  local pkgs=(qemu-system-x86 busybox-static cpio kmod iproute2 gzip) missing=() p
  for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get install -y --no-install-recommends "${missing[@]}" >"$W/apt.log" 2>&1 || {
      apt-get update >>"$W/apt.log" 2>&1
      apt-get install -y --no-install-recommends "${missing[@]}" >>"$W/apt.log" 2>&1
    } || die "apt-get install failed (see $W/apt.log)"
  fi
  # The kernel: siw_interop.sh's cache first (any version there with sch_netem), else ours.
  K='' KV=''
  local d v
  if [ -z "${RDS_NETEM_KPKG:-}" ]; then
    for d in "$SIWW"/kernel-* "$W"/kernel-*; do
      v=${d##*/kernel-}
      has_kernel "$d" "$v" && { K=$d; KV=$v; }
    done
  fi
  if [ -z "$K" ]; then
    local KPKG
    KPKG=$(kernel_pkg)
    if [ -z "$KPKG" ]; then
      apt-get update >"$W/apt-update.log" 2>&1 || die "apt-get update failed (see $W/apt-update.log)"
      KPKG=$(kernel_pkg)
    fi
    [ -n "$KPKG" ] || die "cannot find the kernel package behind linux-image-amd64"
    KV=${KPKG#linux-image-}
    K=$W/kernel-$KV
    if ! has_kernel "$K" "$KV"; then
      mkdir -p "$W/debs"
      (cd "$W/debs" && { ls "${KPKG}_"*.deb >/dev/null 2>&1 || apt-get download "$KPKG" >>"$W/apt.log" 2>&1; }) ||
        die "apt-get download $KPKG failed (see $W/apt.log)"
      log "unpacking $KPKG"
      # The .deb has no modules.dep (depmod runs at install): make one for modprobe -d.
      rm -rf "$K" && dpkg-deb -x "$W/debs/${KPKG}_"*.deb "$K" && depmod -b "$K" "$KV" &&
        touch "$K/.done" || die "unpack $KPKG"
      has_kernel "$K" "$KV" || die "$KPKG has no sch_netem module"
    fi
  fi
  log "kernel $KV from $K"
}
prepare
[ $PREPARE_ONLY = 1 ] && { log "prepared under $W"; exit 0; }

# ---------------------------------------------------------------------------------------------
# 2. Snapshot of the binaries, initramfs
# ---------------------------------------------------------------------------------------------
RUN=$W/runs/$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN" || die "mkdir $RUN"
ls -1dt "$W"/runs/*/ 2>/dev/null | tail -n +6 | xargs -r rm -rf   # keep the last 5 runs
LIBDIR=$BUILD/lib
FLOWS=$(find "$BUILD" -name rds_flows -type f -perm -u+x 2>/dev/null | head -1)
[ -n "$FLOWS" ] || FLOWS=$BUILD/tests/rds_flows
# Take a copy only when rds_flows and the libraries exist and have been quiet for 10 s, and
# the copy resolves libsvrds/libibverbs/librdmacm from itself. (Another engineer may be
# rebuilding build/ right now.)
ST=$RUN/stage
snap_ok=0
for _ in $(seq 90); do
  if [ -x "$FLOWS" ] && [ -e "$LIBDIR/libsvrds.so" ] && [ -e "$LIBDIR/libibverbs.so.1" ] &&
     [ -e "$LIBDIR/librdmacm.so.1" ] &&
     [ -z "$(find -L "$LIBDIR" "$FLOWS" -maxdepth 1 \( -name 'lib*.so*' -o -name rds_flows \) \
              -newermt '-10 seconds' 2>/dev/null)" ]; then
    rm -rf "$ST" && mkdir -p "$ST/bin" "$ST/lib" &&
      cp "$FLOWS" "$ST/bin/" && cp -a "$LIBDIR"/lib*.so* "$ST/lib/" 2>/dev/null &&
      [ "$(LD_LIBRARY_PATH=$ST/lib ldd "$ST/bin/rds_flows" |
           grep -c "$ST/lib/lib\(svrds\|ibverbs\|rdmacm\)")" = 3 ] &&
      ! LD_LIBRARY_PATH=$ST/lib ldd "$ST/bin/rds_flows" | grep -q 'not found' &&
      { snap_ok=1; break; }
  fi
  sleep 2
done
[ $snap_ok = 1 ] || die "could not take a consistent snapshot of $FLOWS and $LIBDIR (being rebuilt?)"
log "binaries: $FLOWS + $LIBDIR, built $(date -r "$ST/lib/libsvrds.so" '+%F %T') (snapshot in $ST)"
log "run directory $RUN"

R=$RUN/rootfs
mkdir -p "$R"/{bin,sbin,proc,sys,dev,tmp,run,etc,usr/bin,usr/sbin,sv/bin,sv/lib,lib/modules/$KV} ||
  die "mkdir rootfs"
mkdir -p "$R/var" && ln -s ../run "$R/var/run" || die "var/run"
cp /usr/bin/busybox "$R/bin/" || die "busybox"
for a in $(/usr/bin/busybox --list); do
  case "$a" in busybox|ip|tc) ;; *) ln -sf busybox "$R/bin/$a" ;; esac
done
cp /usr/sbin/ip /usr/sbin/tc "$R/usr/sbin/" && cp /usr/bin/ss "$R/usr/bin/" || die "copy iproute2"
cp -a "$ST/bin/rds_flows" "$R/sv/bin/" && cp -a "$ST/lib/." "$R/sv/lib/" || die "copy softverbs"
for m in veth sch_netem tcp_diag inet_diag; do
  modprobe -d "$K" -S "$KV" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!s[$0]++' > "$RUN/modules.list"
: > "$R/etc/rn-modules"
while read -r f; do
  cp "$f" "$R/lib/modules/$KV/" || die "copy module $f"
  basename "$f" >> "$R/etc/rn-modules"
done < "$RUN/modules.list"
grep -q sch_netem "$R/etc/rn-modules" && grep -q veth "$R/etc/rn-modules" ||
  die "module closure lacks veth/sch_netem (see $RUN/modules.list)"
# Shared libraries: the system ones of every binary (the softverbs ones are in /sv/lib).
for f in /usr/sbin/ip /usr/sbin/tc /usr/bin/ss "$ST/bin/rds_flows"; do
  env LD_LIBRARY_PATH="$ST/lib" ldd "$f" | awk '/=>/ {print $3} /ld-linux/ {print $1}'
done | grep -v "^$ST/" | sort -u | while read -r f; do
  [ -e "$f" ] && mkdir -p "$R$(dirname "$f")" && cp -L "$f" "$R$(dirname "$f")/"
done
[ -e "$R/lib64/ld-linux-x86-64.so.2" ] || { mkdir -p "$R/lib64" &&
  cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"; } || die "copy ld.so"
# Guest timeouts: rds_flows gets what is left of the limit after boot and reporting.
TMO=$(( LIMIT - ($(date +%s) - T0) - 150 ))
[ $TMO -ge 60 ] || die "RDS_NETEM_LIMIT=$LIMIT leaves no time for the run"
{ printf 'MSGS=%s\nTMO=%s\nSOCKETS=4\nDEBUG=%s\nRESETS=%s\n' "$MSGS" "$TMO" \
    "${RDS_NETEM_DEBUG:-0}" "$RESETS"
  printf "NETEM='%s'\n" "$NETEM"; } > "$R/etc/rn.conf"
install -m 755 "$HERE/rds_netem_guest_init.sh" "$R/init" || die "init"
INITRD=$RUN/initramfs.cpio.gz
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$INITRD") || die "cpio"
rm -rf "$R"
log "initramfs ready ($(du -h "$INITRD" | cut -f1)); guest rds_flows timeout ${TMO}s"

# ---------------------------------------------------------------------------------------------
# 3. Boot and run
# ---------------------------------------------------------------------------------------------
CONSOLE=$RUN/console.log
: > "$CONSOLE"
QPID=
cleanup() {
  [ -n "$QPID" ] || return
  kill "$QPID" 2>/dev/null
  for _ in $(seq 30); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$QPID" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 3' INT TERM
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
    sleep 0.5
  done
}

T_QEMU=$(( LIMIT - ($(date +%s) - T0) - 20 ))
log "booting guest: kernel $KV, TCG, -smp 2, 1 GiB; $MSGS messages per side; qemu limit ${T_QEMU}s"
TBOOT=$(date +%s)
timeout -k 10 "$T_QEMU" nice -n "$QEMU_NICE" qemu-system-x86_64 -accel tcg -cpu max -m 1024 -smp 2 \
  -nodefaults -display none -no-reboot -monitor none -serial "file:$CONSOLE" \
  -kernel "$K/boot/vmlinuz-$KV" -initrd "$INITRD" \
  -append "console=ttyS0 loglevel=4 panic=-1" >"$RUN/qemu.log" 2>&1 &
QPID=$!

if ! m=$(wait_marker '^@@RN BOOT (ok|fail)' $T_BOOT) || [[ $m != *"BOOT ok"* ]]; then
  con | tail -40
  die "guest did not boot (console: $CONSOLE, qemu: $RUN/qemu.log)"
fi
TUP=$(( $(date +%s) - TBOOT ))
log "guest up after ${TUP}s (wall): ${m#@@RN }"
con | sed -n 's/^@@OUT setup| /  qdisc /p'
TRUN0=$(date +%s)
# Progress until DONE (or qemu ends: poweroff, crash or timeout).
shown=0
while kill -0 "$QPID" 2>/dev/null && ! con | grep -aq '^@@RN DONE'; do
  mapfile -t ticks < <(con | grep -a '^@@RN \(TICK\|ENDED\|RESULT\)')
  while [ $shown -lt ${#ticks[@]} ]; do log "guest: ${ticks[$shown]#@@RN }"; shown=$((shown + 1)); done
  sleep 2
done
TRUN=$(( $(date +%s) - TRUN0 ))
for _ in $(seq 100); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$QPID" 2>/dev/null; then cleanup; fi
wait "$QPID" 2>/dev/null
qrc=$?
QPID=

# ---------------------------------------------------------------------------------------------
# 4. Results
# ---------------------------------------------------------------------------------------------
con | sed -n 's/^@@OUT A| //p' > "$RUN/side_a.log"
con | sed -n 's/^@@OUT B| //p' > "$RUN/side_b.log"
con | sed -n 's/^@@TC \([AB]\)| /\1: /p' > "$RUN/tc.log"
con | sed -n 's/^@@CNT \([AB]\)| /\1 /p' > "$RUN/counters.log"
cnt() { awk -v s="$1" -v k="$2" '$1 == s { split($2, a, "="); if (a[1] == k) {print a[2]; f = 1} }
                                  END { if (!f) print "?" }' "$RUN/counters.log"; }
done_line=$(con | grep -a -m1 '^@@RN DONE')
stats=$(con | grep -a -m1 '^@@RN STATS' | sed 's/^@@RN STATS //')
killed=$(sed -n 's/.*sockets_killed=\([0-9]*\).*/\1/p' <<<"$stats")
# Kernel trouble: printed on the console as it happens (loglevel 4) and from dmesg at the end.
kern=$( { con | grep -av '^@@' | grep -aE 'kernel BUG at|Oops:|general protection fault|BUG: |WARNING: CPU:'
          con | sed -n 's/^@@KERN| //p'; } | head -3)

RES_NAMES=() RES_VAL=() RES_NOTE=()
check() { RES_NAMES+=("$1"); RES_VAL+=("$2"); RES_NOTE+=("$3"); }
ra=$(con | sed -n 's/^@@RN RESULT A rc=\(.*\)$/\1/p' | head -1)
rb=$(con | sed -n 's/^@@RN RESULT B rc=\(.*\)$/\1/p' | head -1)
netem_on=$(con | grep -ac '^@@OUT setup| [AB]: qdisc netem')
[ "$netem_on" = 2 ] && check "netem on both veth ends" PASS "$NETEM" ||
  check "netem on both veth ends" FAIL "$netem_on/2 qdiscs are netem"
for s in A B; do
  r=$ra; f=$RUN/side_a.log
  [ $s = B ] && { r=$rb; f=$RUN/side_b.log; }
  if [ "$r" = 0 ] && grep -q ': OK$' "$f"; then
    check "side $s: exactly-once, in-order" PASS "$(grep ': OK$' "$f" | tail -1)"
  else
    check "side $s: exactly-once, in-order" FAIL "rc=${r:-none}: $(tail -1 "$f" 2>/dev/null)"
  fi
done
if [ -n "${killed:-}" ] && [ "$killed" -gt 0 ]; then
  check "forced resets during the run" PASS "$stats"
else
  check "forced resets during the run" FAIL "${stats:-no STATS line}"
fi
if [ -z "$kern" ] && [ -n "$done_line" ]; then
  check "guest kernel clean, guest finished" PASS "$done_line"
else
  check "guest kernel clean, guest finished" FAIL "${kern:-guest did not finish (qemu rc=$qrc)}"
fi

echo
echo "=== RDS reliability under tc netem in a QEMU guest (kernel $KV, TCG, 2 vCPUs) ==="
echo "netem (both veth ends): $NETEM"
echo "messages: $MSGS per side, $((2 * MSGS)) in all; 4 sockets per side"
echo "boot ${TUP}s (wall, to BOOT ok); run ${TRUN}s (START to DONE); total $(( $(date +%s) - T0 ))s"
echo "side A: $(tail -1 "$RUN/side_a.log" 2>/dev/null)"
echo "side B: $(tail -1 "$RUN/side_b.log" 2>/dev/null)"
echo
echo "--- guest tc -s qdisc / ip -s link (after the run)"
sed 's/^/  /' "$RUN/tc.log"
echo "--- what TCP saw in each namespace (receiver side of the other's netem)"
printf '  %-4s %10s %10s %9s %11s %10s %10s %9s %9s\n' ns OutSegs InSegs Retrans DupRcvd \
  CsumErrs HdrErrs OFOQueue EstResets
for s in A B; do
  dup=$(( $(cnt $s TcpExt.TCPDSACKOldSent | tr -c -d 0-9) + $(cnt $s TcpExt.TCPDSACKOfoSent | tr -c -d 0-9) ))
  printf '  %-4s %10s %10s %9s %11s %10s %10s %9s %9s\n' "$s" "$(cnt $s Tcp.OutSegs)" \
    "$(cnt $s Tcp.InSegs)" "$(cnt $s Tcp.RetransSegs)" "$dup" "$(cnt $s Tcp.InCsumErrors)" \
    "$(cnt $s Ip.InHdrErrors)" "$(cnt $s TcpExt.TCPOFOQueue)" "$(cnt $s Tcp.EstabResets)"
done
echo "  (DupRcvd = duplicate segments answered with a D-SACK; CsumErrs/HdrErrs = corrupted"
echo "   segments caught by TCP/IP checksums; OFOQueue = segments that arrived out of order;"
echo "   veth hands TSO super-packets over whole, so InSegs counts those, OutSegs wire segments;"
echo "   full counters in $RUN/counters.log)"
echo
pass=0 fail=0
for i in "${!RES_NAMES[@]}"; do
  printf '%-36s %-5s %s\n' "${RES_NAMES[$i]}" "${RES_VAL[$i]}" "${RES_NOTE[$i]}"
  if [ "${RES_VAL[$i]}" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
if [ $fail != 0 ]; then
  echo "--- last lines of the console ($CONSOLE)"
  con | grep -av '^@@\(CNT\|TC\)' | tail -25 | sed 's/^/  /'
fi
log "logs: $RUN"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
