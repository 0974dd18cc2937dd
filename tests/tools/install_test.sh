#!/usr/bin/env bash
# softverbs installed as a system library, as a user would install it:
#   1. a Release build with CMake's default generator and no tests (-DBUILD_TESTING=OFF: no
#      GoogleTest needed), then `cmake --install` into a scratch prefix;
#   2. the layout: RDS library, header, tools and launchers in the standard places, the ABI
#      libraries only in <libdir>/softverbs (never where the loader would find them for
#      programs that want rdma-core's);
#   3. a consumer project (tests/install) found through find_package(softverbs) and, again,
#      through pkg-config (softverbs-rds, softverbs-verbs): built and run;
#   4. softverbs-run: an unmodified Debian binary (ibv_devinfo) and, with --rds, our rds-ping;
#   5. with --deb: the Debian package (cpack -G DEB), its contents, dpkg -i beside rdma-core,
#      the demo run from the installed files (/usr/bin/softverbs-demo), dpkg -P.
# Usage: install_test.sh <source dir> [--deb]
set -u
SRC=$(cd "$1" && pwd)
DEB=0
[ "${2:-}" = "--deb" ] && DEB=1
W=$(mktemp -d /tmp/sv-install-test.XXXXXX)
P=$W/prefix
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$W"
}
trap cleanup EXIT
pass=0
fail=0
failed=()
check() {  # check NAME COMMAND...: passes when the command does
  local name=$1
  shift
  if "$@" >"$W/out.log" 2>&1; then
    pass=$((pass + 1))
    echo "PASS $name"
  else
    fail=$((fail + 1))
    failed+=("$name")
    echo "FAIL $name"
    tail -20 "$W/out.log" | sed 's/^/  | /'
  fi
}
finish() {
  echo
  [ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
  echo "$pass passed, $fail failed"
  [ $fail -eq 0 ]
  exit
}

export SOFTVERBS_NETDEV=lo SOFTVERBS_RDS_DIR=$W/rds
mkdir -p "$SOFTVERBS_RDS_DIR"
unset LD_LIBRARY_PATH LD_PRELOAD

build() {
  # As the README says, with the default prefix: the package must still use Debian's
  # multiarch libdir. The build must print no warning (GCC 12, Release: -O2 finds more).
  cmake -S "$SRC" -B "$W/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF &&
    cmake --build "$W/build" -j "$(nproc)" >"$W/build.log" 2>&1 || { cat "$W/build.log"; return 1; }
  if grep -E "warning:" "$W/build.log"; then return 1; fi
  cmake --install "$W/build" --prefix "$P"
}
check "Release build, default generator, BUILD_TESTING=OFF, no warnings, cmake --install" build
# The same with clang (its warnings differ: -Wdeprecated-enum-enum-conversion in verbs.h's
# ibv_reg_mr macro, for one); only built, not installed.
clang_build() {
  command -v clang++ >/dev/null || { echo "no clang++"; return 1; }
  CC=clang CXX=clang++ cmake -S "$SRC" -B "$W/build-clang" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_TESTING=OFF >/dev/null &&
    cmake --build "$W/build-clang" -j "$(nproc)" >"$W/build-clang.log" 2>&1 ||
    { cat "$W/build-clang.log"; return 1; }
  if grep -E "warning:" "$W/build-clang.log"; then return 1; fi
  rm -rf "$W/build-clang"
}
check "Release build with clang, no warnings" clang_build
[ $fail -eq 0 ] || finish
LIBDIR=$(cd "$P" && ls -d lib*/ | head -1)
LIBDIR=$P/${LIBDIR%/}
[ -d "$LIBDIR/x86_64-linux-gnu" ] && LIBDIR=$LIBDIR/x86_64-linux-gnu

layout() {
  local f
  for f in "$LIBDIR/libsvrds.so" "$LIBDIR/libsvrds_preload.so" \
    "$P/include/softverbs/rds.h" "$P/bin/rds-ping" "$P/bin/rds-info" "$P/bin/rds-stress" \
    "$P/bin/blockserver" "$P/bin/softverbs-run" "$P/bin/softverbs-demo" \
    "$LIBDIR/softverbs/libibverbs.so.1" "$LIBDIR/softverbs/librdmacm.so.1" \
    "$LIBDIR/cmake/softverbs/softverbsConfig.cmake" \
    "$LIBDIR/pkgconfig/softverbs-rds.pc" "$LIBDIR/pkgconfig/softverbs-verbs.pc"; do
    [ -e "$f" ] || { echo "missing ${f#$P/}"; return 1; }
  done
  # No provider stubs: Debian's libmlx5/libefa serve (cmake/abi.cmake).
  if ls "$LIBDIR/softverbs" | grep -E '^lib(mlx5|efa)\.'; then
    echo "provider stubs installed"
    return 1
  fi
  # Nothing that would shadow rdma-core where the loader looks.
  if ls "$LIBDIR" | grep -E '^lib(ibverbs|rdmacm|mlx5|efa)\.'; then
    echo "ABI libraries outside the private directory"
    return 1
  fi
  # Every installed ELF resolves its libraries from the prefix alone.
  for f in "$P"/bin/* "$LIBDIR"/*.so "$LIBDIR"/softverbs/*.so.1; do
    [ "$(head -c4 "$f" | tail -c3)" = ELF ] || continue
    if ldd "$f" | grep -q "not found"; then
      echo "$f:"
      ldd "$f"
      return 1
    fi
  done
  # libsvrds uses softverbs' verbs, not the system's, without LD_LIBRARY_PATH.
  ldd "$LIBDIR/libsvrds.so" | grep -E "libibverbs.so.1 => $LIBDIR/softverbs/"
}
check "install layout (standard places, ABI libraries private, RUNPATHs resolve)" layout

consumer_cmake() {
  cmake -S "$SRC/tests/install" -B "$W/consumer" -DCMAKE_PREFIX_PATH="$P" &&
    cmake --build "$W/consumer" &&
    "$W/consumer/rds_consumer" | tee /dev/stderr | grep -q "rds_consumer ok" &&
    "$W/consumer/verbs_consumer" | grep -q "verbs_consumer ok: softverbs0"
}
check "consumer via find_package(softverbs): RDS exchange and verbs device" consumer_cmake

consumer_pkgconfig() {
  export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
  cc -o "$W/rds_pc" "$SRC/tests/install/rds_consumer.c" $(pkg-config --cflags --libs softverbs-rds) \
    -Wl,-rpath,"$LIBDIR" &&
    "$W/rds_pc" | grep -q "rds_consumer ok" &&
    cc -o "$W/verbs_pc" "$SRC/tests/install/verbs_consumer.c" \
      $(pkg-config --cflags --libs softverbs-verbs) &&
    "$W/verbs_pc" | grep -q "verbs_consumer ok: softverbs0" &&
    ldd "$W/verbs_pc" | grep -E "libibverbs.so.1 => $LIBDIR/(pkgconfig/\.\./)?softverbs/"
}
check "consumer via pkg-config (softverbs-rds, softverbs-verbs)" consumer_pkgconfig

launcher() {
  "$P/bin/softverbs-run" --help | grep -q "^usage: softverbs-run" || return 1
  "$P/bin/softverbs-run" -h | grep -q "^usage: softverbs-run" || return 1
  "$P/bin/softverbs-demo" --help | grep -q "^usage: softverbs-demo" || return 1
  "$P/bin/softverbs-stat" --help | grep -q "^usage: softverbs-stat" || return 1
  "$P/bin/softverbs-run" ibv_devinfo | grep -q "hca_id:.*softverbs0" || return 1
  # Without the launcher, ibv_devinfo is rdma-core's and never sees softverbs0.
  ! ibv_devinfo 2>/dev/null | grep -q softverbs0 || return 1
  "$P/bin/blockserver" serve --addr 127.0.0.2 --port 18820 --file "$W/blocks.img" --blocks 16 \
    >"$W/bs.log" 2>&1 &
  local spid=$!
  pids+=($spid)
  sleep 0.5
  "$P/bin/softverbs-run" --rds "$P/bin/rds-ping" -c 2 -i 0.2 127.0.0.2 | grep -Ec "^ *[0-9]+: [0-9]+ usec" |
    grep -q 2
  local rc=$?
  kill $spid
  return $rc
}
check "softverbs-run: ibv_devinfo sees softverbs0; --rds: rds-ping answered" launcher

if [ $DEB = 1 ]; then
  deb() {
    (cd "$W/build" && cpack -G DEB) || return 1
    local pkg
    pkg=$(ls "$W"/build/softverbs_*.deb) || return 1
    dpkg-deb -I "$pkg"
    # Debian's multiarch libdir for every library, the private ABI directory included.
    dpkg-deb -c "$pkg" >"$W/deb.list"
    grep -Eq " \./usr/lib/x86_64-linux-gnu/softverbs/libibverbs\.so\.1( -> |$)" "$W/deb.list" || return 1
    grep -q " ./usr/lib/x86_64-linux-gnu/libsvrds.so" "$W/deb.list" || return 1
    if grep -E " \./usr/lib/[^/]+\.so" "$W/deb.list"; then echo "library outside multiarch"; return 1; fi
    dpkg -i "$pkg" || return 1
    dpkg -L softverbs | sort -r >"$W/deb.files"
    # Beside rdma-core: its libibverbs stays the one the loader finds.
    local rc=0
    if dpkg -s libibverbs1 >/dev/null 2>&1; then
      ldconfig -p | grep -E "libibverbs.so.1 .*softverbs" && rc=1
    fi
    # Bounded: a hang fails this check, and the demo prints the stuck step's log, instead of
    # running into ctest's timeout with nothing said.
    [ $rc = 0 ] && timeout -k 5 600 /usr/bin/softverbs-demo | tee "$W/demo.log" | tail -5
    grep -q "demo complete" "$W/demo.log" && grep -q "rdma-ping-9" "$W/demo.log" || rc=1
    dpkg -P softverbs || rc=1
    # Purged cleanly: none of its files or directories of its own is left.
    local f
    while read -r f; do
      case "$f" in /usr/lib/x86_64-linux-gnu/softverbs* | /usr/include/softverbs* | /usr/lib/x86_64-linux-gnu/cmake/softverbs* | /usr/bin/softverbs-* | /usr/bin/rds-* | /usr/lib/x86_64-linux-gnu/libsvrds*)
        [ -e "$f" ] && { echo "left after purge: $f"; rc=1; } ;;
      esac
    done <"$W/deb.files"
    return $rc
  }
  check "Debian package: built, installed beside rdma-core, demo from installed files" deb
fi
finish
