#!/usr/bin/env bash
# abi_exports.sh <libdir>
#
# Checks that the replacement libraries in <libdir> (libibverbs.so.1, librdmacm.so.1) can stand
# in for the system rdma-core libraries, with Debian's own provider libraries (libmlx5.so.1,
# libefa.so.1 from ibverbs-providers) loading against them:
#
#  (a) exports: every default-version export (symbol@@VERSION) of the system libibverbs.so.1 and
#      librdmacm.so.1 is exported by ours with the same default version; version nodes that exist
#      in both have the same parent; ours exports nothing else in those nodes and no unversioned
#      symbols (a leak); the SONAME matches; and every libibverbs symbol the system libmlx5.so.1
#      and libefa.so.1 import (IBVERBS_PRIVATE_34 internals included) is one ours defines.
#  (b) loading: for each rdma-core / perftest tool, `LD_LIBRARY_PATH=<libdir> ldd` resolves
#      libibverbs/librdmacm into <libdir>, and running the tool with a harmless argument under
#      LD_BIND_NOW=1 (timeout 5) prints no loader error and initializes no system copy of them.
#  (c) provider users: UCX's libuct_ib, libfabric and pyverbs' mlx5dv/efadv modules dlopen with
#      RTLD_NOW beside our libraries, and the direct-verbs calls answer "not supported" for our
#      device (mlx5dv_is_supported false, efadv_query_device EOPNOTSUPP), as on any non-mlx5,
#      non-EFA device.
#
# Prints one PASS/FAIL/SKIP line per check, then "N passed, M failed". Exits 1 on any failure,
# 2 on bad usage. A tool that is not installed is skipped, not failed.
#
# Environment: SV_SYSTEM_LIBDIR overrides where the system libraries are looked up.

set -u
export LC_ALL=C

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 <directory holding our libibverbs.so.1 librdmacm.so.1>" >&2
  exit 2
fi
for tool in objdump readelf ldd timeout realpath; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "$0: required tool '$tool' not found" >&2
    exit 2
  fi
done

libdir=$(realpath "$1")

sysdir=${SV_SYSTEM_LIBDIR:-}
if [ -z "$sysdir" ]; then
  sys_ibverbs=$(/sbin/ldconfig -p 2>/dev/null | awk '$1 == "libibverbs.so.1" && /x86-64/ {print $NF; exit}')
  if [ -n "$sys_ibverbs" ]; then
    sysdir=$(dirname "$(realpath "$sys_ibverbs")")
  else
    sysdir=/usr/lib/x86_64-linux-gnu
  fi
fi
sysdir=$(realpath "$sysdir")
if [ "$sysdir" = "$libdir" ]; then
  echo "$0: <libdir> is the system library directory ($sysdir)" >&2
  exit 2
fi

tools=(ibv_devinfo ibv_rc_pingpong ibv_devices ibv_asyncwatch rping ucmatose
  ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat)
replaced_libs=(libibverbs.so.1 librdmacm.so.1)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

passed=0
failed=0
skipped=0
pass() {
  passed=$((passed + 1))
  echo "PASS $*"
}
fail() {
  failed=$((failed + 1))
  echo "FAIL $*"
}
skip() {
  skipped=$((skipped + 1))
  echo "SKIP $*"
}
detail() { sed 's/^/       /'; }

# "VERSION symbol" for each defined dynamic symbol. Default versions (@@) print bare, hidden
# versions keep objdump's parentheses, e.g. "(IBVERBS_1.0) ibv_get_device_list", and
# unversioned ones print as "Base symbol". Version-definition symbols (*ABS*) are skipped.
defined_syms() {
  objdump -T "$1" | awk 'NF >= 6 && $0 !~ /\*UND\*/ && $0 !~ /\*ABS\*/ && $(NF - 1) != "" {
    print $(NF - 1), $NF }' | sort -u
}

# "VERSION symbol" for every default-version export.
default_syms() { defined_syms "$1" | awk '$1 !~ /^\(/ && $1 != "Base"'; }

# "NODE PARENT" for each version definition (PARENT is "-" for a root); the BASE entry is skipped.
verdefs() {
  readelf -V "$1" | awk '
    /Version definition section/ { on = 1; next }
    /Version needs section/ { on = 0 }
    on && /Name:/ { if ($0 ~ /Flags: BASE/) { skip = 1; next } skip = 0; n = $NF; order[++k] = n; par[n] = "-" }
    on && /Parent 1:/ && !skip { par[n] = $NF }
    END { for (i = 1; i <= k; i++) print order[i], par[order[i]] }'
}

soname() { readelf -d "$1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }

# "VERSION symbol" imported from versions matching $1 (an awk regex) by the given binaries.
imported_syms() {
  local pattern=$1
  shift
  for bin in "$@"; do objdump -T "$bin"; done | awk -v pat="$pattern" '
    /\*UND\*/ { v = $(NF - 1); gsub(/[()]/, "", v); if (v ~ pat) print v, $NF }' | sort -u
}

# check_exports <lib soname> <file with expected "VERSION symbol" lines> <description>
check_exports() {
  local lib=$1 expected=$2 what=$3
  local ours=$libdir/$lib sys=$sysdir/$lib
  if [ ! -e "$ours" ]; then
    fail "$lib: not found in $libdir"
    return
  fi
  if [ ! -e "$sys" ]; then
    skip "$lib: system copy $sys not installed, nothing to compare against"
    return
  fi

  local so
  so=$(soname "$ours")
  if [ "$so" = "$lib" ]; then pass "$lib: SONAME $so"; else fail "$lib: SONAME is '$so', want $lib"; fi

  default_syms "$ours" >"$tmp/ours.def"
  local missing
  missing=$(comm -23 "$expected" "$tmp/ours.def")
  if [ -z "$missing" ]; then
    pass "$lib: exports all $(wc -l <"$expected") $what with the same default version"
  else
    fail "$lib: $(printf '%s\n' "$missing" | wc -l) of $(wc -l <"$expected") $what missing or under another version (want symbol@@VERSION):"
    printf '%s\n' "$missing" | awk '{print $2 "@@" $1}' | detail
  fi

  # Version nodes: every node ours defines that the system also defines has the same parent; for
  # every node the expected symbols need, ours defines it.
  verdefs "$sys" >"$tmp/sys.vd"
  verdefs "$ours" >"$tmp/ours.vd"
  local bad
  bad=$(awk 'FILENAME == ARGV[1] { p[$1] = $2; next } ($1 in p) && p[$1] != $2 {
      print $1 ": parent " $2 ", system has " p[$1] }' "$tmp/sys.vd" "$tmp/ours.vd")
  bad+=$(awk 'FILENAME == ARGV[1] { have[$1] = 1; next } !($1 in have) && !seen[$1]++ {
      print "\n" $1 ": not defined" }' "$tmp/ours.vd" "$expected")
  if [ -z "$bad" ]; then
    pass "$lib: version nodes and parent chain match the system library"
  else
    fail "$lib: version node mismatch:"
    printf '%s\n' "$bad" | sed '/^$/d' | detail
  fi

  # Nothing extra: in nodes the system library also defines, ours exports only what it exports
  # (default or hidden), and ours has no unversioned exports. Nodes of our own are allowed.
  defined_syms "$sys" | sed 's/[()]//g' | sort -u >"$tmp/sys.all"
  local extra
  extra=$(defined_syms "$ours" | sed 's/[()]//g' | awk -v vd="$tmp/sys.vd" '
      BEGIN { while ((getline line < vd) > 0) { split(line, f, " "); node[f[1]] = 1 } }
      $1 == "Base" || ($1 in node)' | sort -u | comm -23 - "$tmp/sys.all")
  if [ -z "$extra" ]; then
    pass "$lib: no exports beyond the system library's"
  else
    fail "$lib: exports that the system library does not have (leaked or misplaced):"
    printf '%s\n' "$extra" | awk '{print $2 "@" $1}' | detail
  fi
}

echo "== exports: ours in $libdir vs system in $sysdir"

for lib in libibverbs.so.1 librdmacm.so.1; do
  if [ -e "$sysdir/$lib" ]; then default_syms "$sysdir/$lib" >"$tmp/$lib.expected"; else : >"$tmp/$lib.expected"; fi
  check_exports "$lib" "$tmp/$lib.expected" "default-version exports"
done

# The system's provider libraries load against ours: each libibverbs import they make is
# defined by ours under the version it asks for (default or not).
defined_syms "$libdir/libibverbs.so.1" | sed 's/[()]//g' | sort -u >"$tmp/ours.all"
for lib in libmlx5.so.1 libefa.so.1; do
  if [ ! -e "$sysdir/$lib" ]; then
    fail "$lib: not installed in $sysdir (ibverbs-providers)"
    continue
  fi
  imported_syms '^IBVERBS_' "$sysdir/$lib" >"$tmp/$lib.imports"
  missing=$(comm -23 "$tmp/$lib.imports" "$tmp/ours.all")
  if [ -s "$tmp/$lib.imports" ] && [ -z "$missing" ]; then
    pass "$lib (system): all $(wc -l <"$tmp/$lib.imports") of its libibverbs imports are defined by ours"
  else
    fail "$lib (system): libibverbs imports ours does not define:"
    printf '%s\n' "$missing" | awk '{print $2 "@" $1}' | detail
  fi
done

echo "== loading: LD_LIBRARY_PATH=$libdir"

tool_args() {
  case $1 in
    ibv_devices) ;;           # takes no options; lists devices and exits
    rping | ucmatose) echo -h ;; # getopt without long options: prints usage and exits
    *) echo --help ;;
  esac
}

loader_errors='symbol lookup error|undefined symbol|version `[^'"'"']*'"'"' not found|version .* not found|error while loading shared libraries|cannot open shared object'

for t in "${tools[@]}"; do
  bin=$(command -v "$t" || true)
  if [ -z "$bin" ]; then
    skip "$t: not installed"
    continue
  fi

  # ldd: each of the replaced libraries the tool pulls in resolves into libdir.
  ldd_out=$(LD_LIBRARY_PATH=$libdir ldd "$bin" 2>&1)
  bad=""
  seen=0
  for lib in "${replaced_libs[@]}"; do
    path=$(printf '%s\n' "$ldd_out" | awk -v l="$lib" '$1 == l && $2 == "=>" {print $3; exit}')
    [ -z "$path" ] && continue
    seen=$((seen + 1))
    if [ "$path" = "not" ]; then
      bad+="$lib => not found"$'\n'
    elif [ "$(realpath "$(dirname "$path")")" != "$libdir" ]; then
      bad+="$lib => $path"$'\n'
    fi
  done
  if printf '%s\n' "$ldd_out" | grep -q 'not found'; then
    bad+=$(printf '%s\n' "$ldd_out" | grep 'not found')$'\n'
  fi
  if [ $seen -eq 0 ]; then
    bad+="none of ${replaced_libs[*]} in ldd output"$'\n'
  fi
  if [ -z "$bad" ]; then
    pass "$t: ldd resolves $seen replaced librar$([ $seen -eq 1 ] && echo y || echo ies) into libdir"
  else
    fail "$t: ldd:"
    printf '%s' "$bad" | detail
  fi

  args=$(tool_args "$t")
  cmdline="$t${args:+ $args}"

  # Run it: BIND_NOW resolution of every import, with the loader's library trace on the side.
  # shellcheck disable=SC2086  # args is zero or one word
  LD_LIBRARY_PATH=$libdir LD_BIND_NOW=1 LD_DEBUG=libs LD_DEBUG_OUTPUT=$tmp/ld.$t \
    timeout 5 "$bin" $args </dev/null >/dev/null 2>"$tmp/stderr.$t"
  errs=$(grep -E "$loader_errors" "$tmp/stderr.$t")
  foreign=$(cat "$tmp"/ld."$t".* 2>/dev/null | sed -n 's/.*calling init: //p' | sort -u |
    while read -r obj; do
      case ${obj##*/} in
        libibverbs.so.1 | librdmacm.so.1)
          [ "$(realpath "$(dirname "$obj")")" != "$libdir" ] && echo "system copy initialized: $obj" ;;
      esac
    done)
  if [ -z "$errs" ] && [ -z "$foreign" ]; then
    pass "$t: loads under LD_BIND_NOW=1 ($cmdline)"
  else
    fail "$t: load failed ($cmdline):"
    printf '%s\n' "$errs" "$foreign" | sed '/^$/d' | detail
  fi
done

echo "== provider users: LD_LIBRARY_PATH=$libdir"

# Debian's python3 (pyverbs is built for it), not whatever python3 comes first in PATH.
py=/usr/bin/python3
if [ ! -x "$py" ] || ! "$py" -c 'import pyverbs' 2>/dev/null; then
  fail "pyverbs: /usr/bin/python3 with python3-pyverbs is not installed"
else
  out=$(SOFTVERBS_NETDEV=lo LD_LIBRARY_PATH=$libdir timeout 20 "$py" - "$sysdir" 2>&1 <<'PY'
import ctypes, errno, os, sys
sysdir = sys.argv[1]
for lib in [sysdir + "/ucx/libuct_ib.so.0", sysdir + "/libfabric.so.1"]:
    if not os.path.exists(lib):
        print("FAIL " + lib + ": not installed")
        continue
    try:
        ctypes.CDLL(lib, mode=os.RTLD_NOW)
        print("PASS dlopen RTLD_NOW " + os.path.basename(lib))
    except OSError as e:
        print("FAIL dlopen " + str(e))
import pyverbs.device as d
from pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
import pyverbs.providers.mlx5.mlx5dv as mlx5dv
import pyverbs.providers.efa.efadv as efadv
print("PASS pyverbs imports mlx5dv and efadv")
name = d.get_device_list()[0].name.decode()
try:
    mlx5dv.Mlx5Context(mlx5dv.Mlx5DVContextAttr(), name=name)
    print("FAIL mlx5dv opened " + name + " as an mlx5 device")
except PyverbsUserError as e:
    print("PASS mlx5dv on " + name + ": " + str(e))
try:
    efadv.EfaContext(name=name).query_efa_device()
    print("FAIL efadv_query_device answered for " + name)
except PyverbsRDMAError as e:
    ok = e.error_code == errno.EOPNOTSUPP
    print(("PASS" if ok else "FAIL") + " efadv_query_device on " + name + ": " + os.strerror(e.error_code))
PY
)
  if ! printf '%s\n' "$out" | grep -q '^PASS efadv'; then
    fail "provider users: the check did not finish:"
    printf '%s\n' "$out" | grep -v '^PASS' | detail
  fi
  while IFS= read -r line; do
    case $line in
      PASS\ *) pass "${line#PASS }" ;;
      FAIL\ *) fail "${line#FAIL }" ;;
    esac
  done <<<"$out"
fi

[ $skipped -gt 0 ] && echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
