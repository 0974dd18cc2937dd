#!/usr/bin/env bash
# Same-host transport between two users (issue 29): root and a second user (nobody, via
# setpriv) run rping -V (every buffer the server reads and writes back is checked by the
# client) with buffers of 65,000 bytes (rping's largest), large enough to go by reference
# where one side may read the other's memory. The permissions decide the transport, never
# the data:
#  1. root serves, nobody connects and offers its segment: root does not map another user's
#     segment (engine/qp_shm.cc), declines, and the connection stays on TCP;
#  2. nobody serves, root offers: nobody may not open root's segment, and declines;
#  3. nobody serves and connects: one user, so shared memory; one copy as far as the
#     kernel's ptrace check allows (Yama's ptrace_scope 1 allows it toward descendants only,
#     and rping's client is not the server's), else the ring.
# Usage: shm_multiuser.sh <libdir>
set -u
LIB=$1
if [ "$(id -u)" -ne 0 ] || ! id nobody >/dev/null 2>&1 || ! command -v setpriv >/dev/null ||
  ! command -v rping >/dev/null; then
  echo "SKIP: needs root, a 'nobody' user, setpriv and rping"
  exit 77  # SKIP_RETURN_CODE: reported as skipped, never as passed
fi
# The libraries where nobody can read them: the build tree's parents may not be searchable.
T=$(mktemp -d /tmp/sv-shm-multiuser.XXXXXX)
chmod 755 "$T"
cp -a "$LIB"/lib*.so* "$T/"
chmod -R a+rX "$T"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/check_lib.sh"
ENV=(env LD_LIBRARY_PATH=$T SOFTVERBS_NETDEV=lo SOFTVERBS_SHM=1 SOFTVERBS_LOG=info)
# run_as WHO CMD...: replaces the calling (sub)shell with CMD, as root or as nobody.
run_as() {
  local who=$1
  shift
  if [ "$who" = root ]; then
    exec "${ENV[@]}" "$@"
  else
    exec setpriv --reuid=nobody --regid=nogroup --clear-groups "${ENV[@]}" "$@"
  fi
}
P=$((20000 + $$ % 5000))
COUNT=200
# pair TAG SERVER_AS CLIENT_AS PORT: rping -V between the two, each bounded by timeout;
# outputs in $T/TAG.{s,c}, exit codes in $T/TAG.rc ("server client").
pair() {
  local tag=$1 srv=$2 cli=$3 port=$4
  (run_as "$srv" timeout 60 rping -s -a 127.0.0.1 -p "$port" -S 65000 -C $COUNT -V) \
    >"$T/$tag.s" 2>&1 &
  local s=$!
  pids+=($s)
  for _ in $(seq 100); do  # until it listens (rdma_cm's listener is a TCP socket here)
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  (run_as "$cli" timeout 60 rping -c -a 127.0.0.1 -p "$port" -S 65000 -C $COUNT -V -v) \
    >"$T/$tag.c" 2>&1
  local c=$?
  wait "$s"
  echo "$? $c" >"$T/$tag.rc"
}
has() { grep -q -- "$2" "$T/$1"; echo $?; }
logs() { grep -h "softverbs:" "$T/$1.s" "$T/$1.c" | head -6; }  # never rping's -v data

# stays_tcp TAG SERVER CLIENT PORT DECLINE: rping -V between root and nobody; the server
# declines the client's offer (DECLINE: why) and both stay on TCP.
stays_tcp() {
  local tag=$1 srv=$2 cli=$3 port=$4 why=$5 s c n
  pair "$tag" "$srv" "$cli" "$port"
  read -r s c <"$T/$tag.rc"
  check "$srv server, $cli client: both exit 0" $([ "$s" = 0 ] && [ "$c" = 0 ]; echo $?) "server $s client $c; $(logs "$tag")"
  n=$(grep -c "ping data: rdma-ping-" "$T/$tag.c")
  check "all $COUNT pings validated" $([ "$n" = "$COUNT" ]; echo $?) "$n of $COUNT"
  check "$srv declines $cli's segment: $why" "$(has "$tag.s" "declines the peer's shared memory: $why")" "$(logs "$tag")"
  check "$cli stays on TCP" "$(has "$tag.c" "the peer declined shared memory: staying on TCP")" "$(logs "$tag")"
  check "nothing goes through shared memory" $(! grep -q "through shared memory" "$T/$tag.s" "$T/$tag.c"; echo $?) "$(logs "$tag")"
}
# 1. root serves, nobody offers: root maps only its own uid's segments.
stays_tcp one root nobody "$P" "another user's"
# 2. nobody serves, root offers: the kernel does not let nobody open root's.
stays_tcp two nobody root $((P + 1)) "no permission"

# 3. nobody and nobody.
pair three nobody nobody $((P + 2))
read -r s c <"$T/three.rc"
check "one user: both exit 0" $([ "$s" = 0 ] && [ "$c" = 0 ]; echo $?) "server $s client $c; $(logs three)"
n=$(grep -c "ping data: rdma-ping-" "$T/three.c")
check "all $COUNT pings validated" $([ "$n" = "$COUNT" ]; echo $?) "$n of $COUNT"
for side in s c; do
  check "one user: $side sends through shared memory" "$(has three.$side "sends through shared memory")" "$(logs three)"
  check "one user: $side decided one copy" "$(has three.$side "reads the peer's memory\|cannot read the peer's memory")" "$(logs three)"
done
grep -h "the peer's memory" "$T/three.s" "$T/three.c" | sed 's/^/  /'

summary
