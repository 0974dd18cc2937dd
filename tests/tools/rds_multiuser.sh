#!/usr/bin/env bash
# The RDS host registry on a multi-user host: root and a second user (nobody, via setpriv).
# Ports live in the abstract unix namespace (src/rds/bind.cc); the info/ snapshots in a
# shared folder. Checks:
#  1. a registry folder the other user created first (0700, its own) denies root nothing:
#     root binds, and root's message reaches root's socket;
#  2. the other user can bind a port nobody holds, and cannot take root's live port;
#  3. names the other user binds to lie about root's process (its pid with another
#     rdma_cm port), and connections to them, are not believed and push nothing out: root's
#     messages still reach root's socket;
#  4. a port whose holder was killed (SIGKILL) is free at once, with nothing to clean;
#  5. a symlink planted as root's info/ snapshot temp file is never followed, and the
#     snapshot is written.
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
  for p in "${pids[@]}"; do pkill -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  rm -rf "$T" "$REG"
}
trap cleanup EXIT
. "$(dirname "$0")/check_lib.sh"
as_root() { LD_LIBRARY_PATH=$T "$T/probe" "$@"; }
as_nobody() {
  setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env LD_LIBRARY_PATH=$T SOFTVERBS_NETDEV=lo SOFTVERBS_RDS_DIR=$REG "$T/probe" "$@"
}
P=$((30000 + $$ % 5000))
nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
# bg OUT ARGS...: the probe as root in the background, its output in $T/OUT; waits (bounded)
# for its first line.
bg() {
  local out=$T/$1
  shift
  (LD_LIBRARY_PATH=$T exec "$T/probe" "$@" >"$out") &
  pids+=($!)  # the probe's own pid
  for _ in $(seq 50); do [ -s "$out" ] && break; sleep 0.1; done
}
# message TAG RECV_PORT SEND_PORT: root receives on RECV_PORT what another root process sends
# from SEND_PORT; prints what the receiver printed last.
message() {
  bg "recv.$1" recv 127.0.0.1 "$2" 5000
  as_root send 127.0.0.1 "$3" "$2" "hello-$1" >/dev/null
  wait "${pids[-1]}"
  tail -1 "$T/recv.$1"
}

# 1. The folder exists first, the other user's, 0700, with something planted in it.
mkdir "$REG" && chown nobody "$REG" && chmod 700 "$REG"
nobody ln -s /etc/passwd "$REG/info" 2>/dev/null
out=$(message one "$P" $((P + 1)))
check "a folder the other user made first denies root nothing" $([ "$out" = "got hello-one" ]; echo $?) "receiver: $out"
rm -rf "$REG"

# 2. First come, first served, as Linux RDS ports.
out=$(as_nobody 127.0.0.1 $((P + 2)))
check "the other user can bind a free port" $([ "$out" = bound ]; echo $?) "$out"
bg hold 127.0.0.1 $((P + 3)) 3000
out=$(as_nobody 127.0.0.1 $((P + 3)))
check "the other user cannot take root's live port" $([ "$out" = "error EADDRINUSE" ]; echo $?) "$out"

# 3. Lies about root's process: once root's receiver holds its port, the other user binds
#    names that claim to be that process (its pid) with other rdma_cm ports. The kernel lists
#    names in hash order: the liar binds until 80 of its names come before the real one (a
#    lookup that believed the first name, or counted another user's names among its 64
#    candidates, would miss it), and prints how many. A receiver whose name lists too early
#    for that is replaced (a new pid, a new name), up to 5 times.
liar() {  # liar NAME-PREFIX: prints how many of its names list ahead of the real one
  nobody /usr/bin/python3 -c '
import socket, sys, time
prefix = sys.argv[1][1:]
held, ahead = [], 0
for i in range(1, 1025):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind("\0" + prefix + "%d_%d" % (i, i)); s.listen(128); held.append(s)
    except OSError:
        continue
    if i % 16 == 0:
        # Listeners only (flags __SO_ACCEPTCON), as the lookup asks sock_diag for: the
        # connections accepted on a name are listed under it too, in other hash buckets.
        names = [l.split()[-1] for l in open("/proc/net/unix")
                 if prefix in l and l.split()[3] == "00010000"]
        real = [k for k, n in enumerate(names) if not n.endswith("_%s" % n.split("=")[1].split("_")[0])]
        ahead = real[0] if real else 0
        if ahead >= 80:  # more than the 64 candidates of a lookup, all ahead of the real one
            break
# Connections to its own lying names are listed under them too: 100 more lines each.
conns = []
for s in held[:8]:
    for _ in range(100):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(s.getsockname()); conns.append(c)
print(ahead, flush=True)
time.sleep(8)' "$1"
}
for attempt in $(seq 1 10); do  # where the kernel lists the names is chance: retry
  bg recv.three recv 127.0.0.1 $((P + 4)) 15000
  receiver=${pids[-1]}
  name=$(grep -o "@softverbs-rds/[^/]*/pid/$receiver=" /proc/net/unix | head -1)
  lied=$T/liar.$attempt  # one file each: a late liar of an earlier attempt writes its own
  liar "$name" >"$lied" &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$lied" ] && break; sleep 0.1; done
  [ "$(cat "$lied")" -ge 80 ] 2>/dev/null && break
  # The subshell, and the liar under it (setpriv runs python in its place).
  { pkill -P "${pids[-1]}"; kill "$receiver" "${pids[-1]}"; wait "$receiver" "${pids[-1]}"; } 2>/dev/null
done
as_root send 127.0.0.1 $((P + 5)) $((P + 4)) hello-three >/dev/null
wait "$receiver"
out=$(tail -1 "$T/recv.three")
check "names that lie about root's process are not believed" $([ -n "$name" ] && [ "$(cat "$lied")" -ge 80 ] && [ "$out" = "got hello-three" ]; echo $?) "name '$name', $(cat "$lied") lying names listed ahead of it (attempt $attempt), receiver: $out"

# 4. A killed holder's port is free at once.
bg killed 127.0.0.1 $((P + 6)) 30000
k=${pids[-1]}
{ kill -9 $k; wait $k; } 2>/dev/null
wait $k 2>/dev/null
out=$(as_nobody 127.0.0.1 $((P + 6)))
check "a killed holder's port is free at once" $([ "$(cat "$T/killed")" = bound ] && [ "$out" = bound ]; echo $?) "holder: $(cat "$T/killed"), then: $out"

# 5. info/ snapshots: a symlink planted as the holder's temp file is never followed, and the
#    snapshot is written all the same (folders root made, shared 1777).
rm -rf "$REG"
mkdir -p "$REG/info"
chmod 1777 "$REG" "$REG/info"
victim=$T/victim
echo secret >"$victim"
chmod 644 "$victim"
bg snap 127.0.0.1 $((P + 7)) 2500
nobody ln -sf "$victim" "$REG/info/${pids[-1]}.tmp" || echo "could not plant the snapshot symlink"
sleep 1.2  # two publication periods
snap=no
[ -f "$REG/info/${pids[-1]}" ] && [ ! -L "$REG/info/${pids[-1]}" ] && snap=yes
check "a symlinked info snapshot is not followed" $([ "$(cat "$victim")" = secret ] && [ $snap = yes ]; echo $?) "victim: $(cat "$victim"), root's snapshot written: $snap"
wait
summary
