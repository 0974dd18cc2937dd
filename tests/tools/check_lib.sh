# Sourced by the tool tests: named checks, counted, and the summary that is the exit status.
# check NAME RESULT DETAIL: RESULT 0 is a pass; DETAIL is printed on a failure.
pass=0
fail=0
check() {
  if [ "$2" -eq 0 ]; then
    pass=$((pass + 1)); echo "PASS $1"
  else
    fail=$((fail + 1)); echo "FAIL $1: $3"
  fi
}
# The summary line; returns non-zero if anything failed (call it last).
summary() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
