#!/usr/bin/env bash
# The RDS host registry on a multi-user host: root and a second user (nobody, via setpriv)
# share one registry directory. Checks, each of which failed before the registry was made
# safe for a multi-user host:
#  1. a directory root creates under umask 077 is 01777, so the other user can bind;
#  2. a symlink the other user plants where root's entry goes is never followed: the file
#     it points to is untouched and root's bind still succeeds;
#  3. an entry the other user pre-created 0666 is not trusted: root's bind replaces it
#     with its own 0644 file, which the other user cannot write;
#  4. the other user cannot remove root's live entry;
#  5. a symlink planted as root's info/ snapshot temp file is never followed.
# Usage: rds_multiuser.sh <rds_bind_probe> <libdir>
set -u
PROBE=$1
LIB=$2
if [ "$(id -u)" -ne 0 ] || ! id nobody >/dev/null 2>&1 || ! command -v setpriv >/dev/null; then
  echo "needs root, a 'nobody' user and setpriv"
  exit 1
fi
export SOFTVERBS_NETDEV=lo
# A world-readable copy of the probe and the libraries: the build tree's parents may not be
# searchable by nobody.
T=$(mktemp -d /tmp/sv-multiuser.XXXXXX)
chmod 755 "$T"
cp "$PROBE" "$T/probe"
cp -a "$LIB"/lib*.so* "$T/"
chmod -R a+rX "$T"
REG=/dev/shm/sv-multiuser-$$
export SOFTVERBS_RDS_DIR=$REG
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$T" "$REG"
}
trap cleanup EXIT
pass=0
fail=0
check() {  # check NAME CONDITION-RESULT(0/1) DETAIL
  if [ "$2" -eq 0 ]; then
    pass=$((pass + 1)); echo "PASS $1"
  else
    fail=$((fail + 1)); echo "FAIL $1: $3"
  fi
}
as_root() { LD_LIBRARY_PATH=$T "$T/probe" "$@"; }
as_nobody() {
  setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env LD_LIBRARY_PATH=$T SOFTVERBS_NETDEV=lo SOFTVERBS_RDS_DIR=$REG "$T/probe" "$@"
}
P=$((30000 + $$ % 5000))

# 1. umask 077 must not cut the shared directory's mode.
out=$( (umask 077; as_root 127.0.0.1 $P) )
mode=$(stat -c %a "$REG" 2>/dev/null)
check "root creates the registry 1777 under umask 077" $([ "$out" = bound ] && [ "$mode" = 1777 ]; echo $?) "bind: $out, mode $mode"
out=$(as_nobody 127.0.0.1 $((P + 1)))
check "the other user can bind" $([ "$out" = bound ]; echo $?) "$out"

# The rest tests each property on its own: the shared directories as they should be.
chmod 1777 "$REG"
mkdir -p "$REG/info"
chmod 1777 "$REG/info"
nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }

# 2. A planted symlink is never followed.
victim=$T/victim
echo secret >"$victim"
chmod 644 "$victim"
nobody ln -s "$victim" "$REG/127.0.0.1_$((P + 2))" || echo "could not plant the symlink"
out=$(as_root 127.0.0.1 $((P + 2)))
check "a symlinked entry is not followed" $([ "$(cat "$victim")" = secret ] && [ ! -L "$REG/127.0.0.1_$((P + 2))" ] && [ "$out" = bound ]; echo $?) "bind: $out, victim: $(cat "$victim")"

# 3. An entry pre-created 0666 by the other user is replaced by root's own.
nobody sh -c "umask 0; echo '1 1' > $REG/127.0.0.1_$((P + 3))" || echo "could not plant the entry"
as_root 127.0.0.1 $((P + 3)) 3000 >"$T/hold.out" &
pids+=($!)
for _ in $(seq 50); do [ -s "$T/hold.out" ] && break; sleep 0.1; done
owner=$(stat -c '%U %a' "$REG/127.0.0.1_$((P + 3))")
if nobody sh -c "echo '9 9' > $REG/127.0.0.1_$((P + 3))" 2>/dev/null; then wrote=1; else wrote=0; fi
check "a pre-created 0666 entry becomes root's 0644" $([ "$(cat "$T/hold.out")" = bound ] && [ "$owner" = "root 644" ] && [ $wrote = 0 ]; echo $?) "bind: $(cat "$T/hold.out"), owner/mode: $owner, other user wrote: $wrote"

# 4. The other user cannot remove root's live entry (sticky directory).
nobody rm -f "$REG/127.0.0.1_$((P + 3))" 2>/dev/null
check "the other user cannot remove a live entry" $([ -f "$REG/127.0.0.1_$((P + 3))" ]; echo $?) "entry gone"
out=$(as_nobody 127.0.0.1 $((P + 3)))
check "the other user cannot take root's port" $([ "$out" = "error EADDRINUSE" ]; echo $?) "$out"

# 5. info/ snapshots: a symlink planted as the holder's temp file is never followed.
holder=${pids[0]}
# The probe's pid is the one publishing (LD_LIBRARY_PATH runs it directly).
nobody ln -sf "$victim" "$REG/info/$holder.tmp" || echo "could not plant the snapshot symlink"
sleep 1.2  # two publication periods
check "a symlinked info snapshot is not followed" $([ "$(cat "$victim")" = secret ]; echo $?) "victim: $(cat "$victim")"
wait
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
