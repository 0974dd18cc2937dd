#!/usr/bin/env bash
# Settings are checked when the device opens: an unmodified ibv_devinfo on softverbs, run
# with one bad SOFTVERBS_* value at a time, prints exactly one warning naming the variable,
# its value and what is used instead, whatever SOFTVERBS_LOG says, and the device then
# shows that value in use. Good values give no warning.
# Usage: settings_check.sh <lib dir>
set -u
export LD_LIBRARY_PATH=$(cd "$1" && pwd)
unset SOFTVERBS_NETDEV SOFTVERBS_LOG SOFTVERBS_DEBUG
pass=0
fail=0
# case NAME=VALUE WARNING_REGEX|- SHOWN_REGEX: WARNING_REGEX "-" means no warning at all.
case_() {
  local env=$1 warn=$2 shown=$3 out nwarn ok=1
  out=$(env "$env" SOFTVERBS_LOG=none ibv_devinfo -v 2>&1)
  nwarn=$(echo "$out" | grep -c "^softverbs: warning:")
  if [ "$warn" = - ]; then
    [ "$nwarn" = 0 ] || ok=0
  else
    [ "$nwarn" = 1 ] && echo "$out" | grep -Eq "^softverbs: warning: $warn$" || ok=0
  fi
  echo "$out" | grep -Eq "$shown" || ok=0
  if [ $ok = 1 ]; then
    pass=$((pass + 1))
    echo "PASS $env"
  else
    fail=$((fail + 1))
    echo "FAIL $env: want warning '$warn' and '$shown'; got:"
    echo "$out" | grep -E "softverbs:|max_qp:|max_cq:|GID" | sed 's/^/  | /'
  fi
}
Q='max_qp:[[:space:]]+'
case_ SOFTVERBS_MAX_QP=abc "SOFTVERBS_MAX_QP=abc is not an integer in 1\.\.65024; using 65024" "${Q}65024$"
case_ SOFTVERBS_MAX_QP=12abc "SOFTVERBS_MAX_QP=12abc is not an integer in 1\.\.65024; using 65024" "${Q}65024$"
case_ SOFTVERBS_MAX_QP=0 "SOFTVERBS_MAX_QP=0 is not an integer in 1\.\.65024; using 65024" "${Q}65024$"
case_ SOFTVERBS_MAX_QP=-5 "SOFTVERBS_MAX_QP=-5 is not an integer in 1\.\.65024; using 65024" "${Q}65024$"
case_ SOFTVERBS_MAX_QP=99999 "SOFTVERBS_MAX_QP=99999 is not an integer in 1\.\.65024; using 65024" "${Q}65024$"
case_ SOFTVERBS_MAX_QP=12 - "${Q}12$"
case_ SOFTVERBS_MAX_CQ=7 - "max_cq:[[:space:]]+7$"
case_ SOFTVERBS_NETDEV=doesnotexist \
  "SOFTVERBS_NETDEV=doesnotexist: no interface named doesnotexist on this host; using 127\.0\.0\.1 alone" \
  "GID\[  0\]:.*::ffff:127\.0\.0\.1"
case_ SOFTVERBS_NETDEV=lo,nope "SOFTVERBS_NETDEV=lo,nope: no interface named nope on this host; using lo" \
  "GID\[  0\]:.*::ffff:127\.0\.0\.1"
case_ SOFTVERBS_NETDEV=lo - "GID\[  0\]:.*::ffff:127\.0\.0\.1"
# SOFTVERBS_LOG itself: reported at open even though nothing else logs (env given last wins).
out=$(SOFTVERBS_LOG=bogus ibv_devinfo 2>&1)
if [ "$(echo "$out" | grep -c '^softverbs: warning: SOFTVERBS_LOG=bogus is not none|error|warn|info|debug (or 0-4); using error$')" = 1 ]; then
  pass=$((pass + 1)); echo "PASS SOFTVERBS_LOG=bogus"
else
  fail=$((fail + 1)); echo "FAIL SOFTVERBS_LOG=bogus:"; echo "$out" | head -5
fi
case_ SOFTVERBS_MPA_CRC=yes "SOFTVERBS_MPA_CRC=yes is not 0 or 1; using 0" "hca_id"
case_ SOFTVERBS_PROT_ERR_BURST=-1 "SOFTVERBS_PROT_ERR_BURST=-1 is not a positive number; using 32" "hca_id"
case_ SOFTVERBS_TX_BATCH_US=10us "SOFTVERBS_TX_BATCH_US=10us is not an integer in 0\.\.60000000; using 10" "hca_id"
case_ SOFTVERBS_MAXQP=1 "SOFTVERBS_MAXQP is not a softverbs setting \(docs/configuration\.md\); ignored" "${Q}65024$"
case_ SOFTVERBS_MAX_QP= - "${Q}65024$"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
