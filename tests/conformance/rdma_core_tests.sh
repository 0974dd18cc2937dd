#!/usr/bin/env bash
# rdma_core_tests.sh <rdma-core checkout> [libdir] [test names...]
#
# Runs rdma-core's own verbs tests (tests/run_tests.py, on Debian's python3-pyverbs) against
# softverbs: LD_LIBRARY_PATH=<libdir> (default build/lib), device softverbs0 on loopback.
# Not in the default suite: the tests are not packaged by Debian, so CI cannot have them;
# fetch rdma-core yourself and check out the tag matching python3-pyverbs (v44.0 on Debian 12).
# No softverbs setting but the interface: the tests assume IB's completion rule (a WRITE's
# completion means the data is there), softverbs' default. Prints unittest's summary and one
# line per test that did not pass; exits with unittest's status.
#
# The rdma_cm tests (test_rdmacm) look for the device's network interface in the kernel's
# sysfs themselves (/sys/class/infiniband/<dev>/device/net/), which has no softverbs0: no
# kernel module. As root they run in a mount namespace of their own whose /sys/class has
# that entry (softverbs0 -> lo, the interface they then use); elsewhere they skip ("doesn't
# have net interface"). Nothing outside the namespace sees it.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 1 ] || [ ! -f "$1/tests/run_tests.py" ]; then
  echo "usage: $0 <rdma-core checkout (with tests/run_tests.py)> [libdir] [tests...]" >&2
  exit 2
fi
SRC=$(cd "$1" && pwd)
LIB=$(cd "${2:-$ROOT/build/lib}" && pwd)
shift $(($# >= 2 ? 2 : 1))
bash "$ROOT/scripts/install-deps.sh" >/dev/null || exit 1
cd "$SRC/tests" || exit 2
run=(env SOFTVERBS_NETDEV=lo LD_LIBRARY_PATH="$LIB" timeout 1800 /usr/bin/python3 run_tests.py
  --dev softverbs0 -v "$@")
F=
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
  # /sys/class again, on a tmpfs: each class bound back in, and infiniband/ with this host's
  # own devices (if it has any; symbolic links, as in sysfs) plus softverbs0.
  F=$(mktemp -d)
  # shellcheck disable=SC2016  # expanded by the inner shell
  out=$(unshare -m --propagation private bash -c '
    set -e
    F=$1
    shift
    mount -t tmpfs softverbs-sysfs "$F"
    for d in /sys/class/*; do
      n=${d##*/}
      mkdir -p "$F/$n"
      if [ "$n" = infiniband ]; then
        for e in "$d"/*; do
          if [ -e "$e" ]; then ln -s "$(readlink -f "$e")" "$F/$n/${e##*/}"; fi
        done
      else
        mount --bind "$d" "$F/$n"
      fi
    done
    mkdir -p "$F/infiniband/softverbs0/device/net/lo"
    mount --bind "$F" /sys/class
    exec "$@"' sysfs "$F" "${run[@]}" 2>&1)
else
  out=$("${run[@]}" 2>&1)
fi
rc=$?
[ -n "$F" ] && rmdir "$F"
printf '%s\n' "$out" | grep -aE '\.\.\. (ERROR|FAIL)' | sed 's/^/not passed: /'
printf '%s\n' "$out" | grep -aE '^(Ran [0-9]+ tests|OK|FAILED)'
printf '%s\n' "$out" | grep -aoE "skipped ('[^']*'|\"[^\"]*\")" | sort | uniq -c | sort -rn | head -20 |
  sed 's/^/skip reason: /'
exit $rc
