#!/usr/bin/env bash
# run_short.sh <fuzz target> <corpus dir> <seconds>: a short libFuzzer run on a scratch copy
# of the committed corpus (libFuzzer adds inputs to the directory it is given). Fails on any
# crash or sanitizer report; prints libFuzzer's last status line.
set -u
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cp -r "$2" "$T/corpus"
"$1" -max_total_time="$3" -print_final_stats=1 -artifact_prefix="$T/" "$T/corpus" >"$T/log" 2>&1
rc=$?
grep -E "^#[0-9]+.*(DONE|pulse)" "$T/log" | tail -n 1
grep -E "stat::number_of_executed_units" "$T/log"
if [ $rc -ne 0 ]; then
  tail -n 40 "$T/log"
  ls "$T"/crash-* "$T"/leak-* 2>/dev/null && xxd "$T"/crash-* 2>/dev/null | head -20
fi
exit $rc
