#!/usr/bin/env bash
# softverbs-stat against live unmodified programs: while an ib_send_bw pair runs on
# softverbs, `dev` lists softverbs0 with its port and GID 0, `qp` lists both QPs (RTS/RTR,
# peer on loopback, the right comm, each naming the other's QPN), and `stat` shows the
# client's sends and the server's receives moving. A file left by a process that is gone
# and a file that is not a statistics file are skipped (the second with a message), and
# nothing is left behind once the programs exit.
# Usage: stat_tool.sh <build dir>
set -u
B=$(cd "$1" && pwd)
STAT=$B/bin/softverbs-stat
export LD_LIBRARY_PATH=$B/lib SOFTVERBS_NETDEV=lo
export SOFTVERBS_STATS_DIR=$(mktemp -d /tmp/sv-stat-test.XXXXXX)
chmod 700 "$SOFTVERBS_STATS_DIR"
W=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$W" "$SOFTVERBS_STATS_DIR"
}
trap cleanup EXIT
pass=0
fail=0
check() {  # check NAME LOG REGEX...
  local name=$1 log=$2 re ok=1
  shift 2
  for re in "$@"; do grep -Eq -- "$re" "$log" || { ok=0; echo "  missing: $re"; }; done
  if [ $ok = 1 ]; then
    pass=$((pass + 1))
    echo "PASS $name"
  else
    fail=$((fail + 1))
    echo "FAIL $name"
    sed 's/^/  | /' "$log" | head -20
    # What the programs themselves said (a client that exited early explains a missing file).
    for f in "$W"/server.log "$W"/client.log "$W"/uds.log "$W"/udc.log; do
      [ -s "$f" ] && { echo "  ${f##*/}:"; tail -n 8 "$f" | sed 's/^/  | /'; }
    done
  fi
}

timeout 30 ib_send_bw -p 18640 -D 4 -s 4096 >"$W/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do ss -Hltn "sport = :18640" | grep -q . && break; sleep 0.1; done
timeout 30 ib_send_bw -p 18640 -D 4 -s 4096 127.0.0.1 >"$W/client.log" 2>&1 &
tpid=$!
pids+=($tpid)
sleep 2.5
cpid=$(pgrep -P $tpid -n)  # ib_send_bw itself, under timeout
# Debris (made now: a process starting up removes files of pids that are gone): a
# well-formed file of a pid that is not running, and garbage.
cp "$SOFTVERBS_STATS_DIR/$cpid" "$SOFTVERBS_STATS_DIR/2147483000" 2>/dev/null
head -c 100 /dev/urandom >"$SOFTVERBS_STATS_DIR/12345678"

"$STAT" dev >"$W/dev.log" 2>&1
check "dev: device, port, GID 0" "$W/dev.log" "^0: softverbs0: " "port 1: state ACTIVE link_layer Ethernet" \
  "gid 0: ::ffff:127\.0\.0\.1"

"$STAT" qp >"$W/qp.log" 2>"$W/qp.err"
n=$(grep -c "comm ib_send_bw" "$W/qp.log")
lq=($(sed -n 's/.* lqpn \([0-9]*\) rqpn \([0-9]*\) .*/\1 \2/p' "$W/qp.log"))
crossed=0
[ ${#lq[@]} = 4 ] && [ "${lq[0]}" = "${lq[3]}" ] && [ "${lq[1]}" = "${lq[2]}" ] && crossed=1
echo "qps $n crossed $crossed" >>"$W/qp.log"
check "qp: both QPs, live states, loopback peers, each other's QPN" "$W/qp.log" \
  "type RC state (RTS|RTR) peer 127\.0\.0\.1:[0-9]+ transport (tcp|shm) pid $cpid comm ib_send_bw" \
  "^qps 2 crossed 1$"
cat "$W/qp.err" >>"$W/qp.log"
check "debris: garbage named, a dead pid's file skipped" "$W/qp.log" \
  "12345678: not a softverbs statistics file"
if grep -q "pid 2147483000" "$W/qp.log"; then
  fail=$((fail + 1))
  echo "FAIL a dead process's file was listed"
fi

"$STAT" -p $cpid stat >"$W/stat1.log" 2>/dev/null
sleep 0.5
"$STAT" -p $cpid stat >"$W/stat2.log" 2>/dev/null
a=$(sed -n 's/.* sent_sends \([0-9]*\) .*/\1/p' "$W/stat1.log")
b=$(sed -n 's/.* sent_sends \([0-9]*\) .*/\1/p' "$W/stat2.log")
echo "moving $([ "${a:-0}" -gt 0 ] && [ "${b:-0}" -gt "${a:-0}" ] && echo yes || echo no)" >>"$W/stat2.log"
check "stat: the client's sends counted and moving" "$W/stat2.log" "pid $cpid comm ib_send_bw qps 1 " \
  " sent_bytes [1-9][0-9]* " " wc_errors 0 " "^moving yes$"
"$STAT" -q stat >"$W/statq.log" 2>/dev/null
check "stat -q: per QP, the server's receives" "$W/statq.log" \
  "lqpn [0-9]+ pid [0-9]+ comm ib_send_bw .* rcvd_sends [1-9]"
# Every line of stat is "link softverbs0/1" then key/value pairs, each key snake_case (a
# key/value parser takes it whole), each value a number but comm's.
bad=$(awk '{ for (i = 3; i < NF; i += 2) if ($i !~ /^[a-z0-9_]+$/ || ($i != "comm" && $(i+1) !~ /^[0-9]+$/)) print "bad pair: " $i " " $(i+1) }' \
  "$W/statq.log" "$W/stat2.log" | head -3)
echo "${bad:-pairs ok}" >"$W/pairs.log"
check "stat: key/value pairs, snake_case keys" "$W/pairs.log" "^pairs ok$"
# Filters: -c by command name (as pgrep -x); a filter that matches nothing is an error.
"$STAT" -c ib_send_bw qp >"$W/comm.log" 2>/dev/null
echo "rc $? lines $(grep -c . "$W/comm.log")" >>"$W/comm.log"
check "-c ib_send_bw: both QPs" "$W/comm.log" "^rc 0 lines 2$"
"$STAT" -c no_such_prog qp >"$W/comm0.log" 2>&1
echo "rc $?" >>"$W/comm0.log"
check "-c of a command nobody runs: exit 1, said" "$W/comm0.log" "no softverbs process named 'no_such_prog'" "^rc 1$"
"$STAT" -p 1 stat >"$W/p1.log" 2>&1
echo "rc $?" >>"$W/p1.log"
check "-p of a process that is not softverbs: exit 1, said" "$W/p1.log" \
  "process 1 is not a softverbs process" "^rc 1$"
"$STAT" -p 2147483000 qp >"$W/pgone.log" 2>&1
echo "rc $?" >>"$W/pgone.log"
check "-p of no process: exit 1, said" "$W/pgone.log" "no process 2147483000" "^rc 1$"
for h in -h --help; do
  "$STAT" $h >"$W/help.log" 2>/dev/null
  echo "rc $?" >>"$W/help.log"
  check "softverbs-stat $h: usage on stdout, exit 0" "$W/help.log" "^usage: softverbs-stat" "^rc 0$"
done
"$STAT" --bogus >"$W/bogus.log" 2>&1
echo "rc $?" >>"$W/bogus.log"
check "softverbs-stat --bogus: usage, exit 2" "$W/bogus.log" "usage: softverbs-stat" "^rc 2$"

wait $tpid
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()
left=$(ls "$SOFTVERBS_STATS_DIR" | grep -v -e 12345678 -e 2147483000 | wc -l)
echo "left $left" >"$W/left.log"
check "the programs' files are gone after they exit" "$W/left.log" "^left 0$"

# UD QPs: listed as UD, their datagrams counted (and nothing dropped between two live QPs).
timeout 30 ib_send_bw -c UD -p 18641 -D 3 -s 1024 >"$W/uds.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do ss -Hltn "sport = :18641" | grep -q . && break; sleep 0.1; done
timeout 30 ib_send_bw -c UD -p 18641 -D 3 -s 1024 127.0.0.1 >"$W/udc.log" 2>&1 &
tpid=$!
pids+=($tpid)
sleep 2.5
cpid=$(pgrep -P $tpid -n)
"$STAT" qp >"$W/udqp.log" 2>&1
"$STAT" -p $cpid stat >>"$W/udqp.log" 2>&1
check "UD: type UD in RTS, datagrams counted, none dropped" "$W/udqp.log" \
  "type UD state RTS peer - transport udp pid $cpid comm ib_send_bw" "pid $cpid .* sent_sends [1-9][0-9]* " \
  " ud_dropped 0 "
wait $tpid
for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
pids=()

echo
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
