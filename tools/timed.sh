#!/usr/bin/env bash
# Run named stages in order, print how long each took, stop at the first failure.
# usage: timed.sh NAME "COMMAND" [NAME "COMMAND" ...]
set -u
summary=() total_start=$(date +%s) rc=0
while [ $# -ge 2 ]; do
  name=$1 cmd=$2; shift 2
  start=$(date +%s)
  echo "######## stage $name: $cmd"
  bash -c "$cmd"; rc=$?
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then summary+=("$(printf '%-10s %5ss  ok' "$name" "$secs")")
  else summary+=("$(printf '%-10s %5ss  FAILED (exit %s)' "$name" "$secs" "$rc")"); break; fi
done
echo "######## stage timings"
printf '%s\n' "${summary[@]}"
printf '%-10s %5ss\n' total "$(( $(date +%s) - total_start ))"
# a failed stage's failing lines, last (CI shows only the tail): the newest *.failed file it left in .cache/logs
if [ $rc -ne 0 ]; then
  newest=$(find "$(dirname "$0")/../.cache/logs" -maxdepth 1 -name '*.failed' -newermt "@$total_start" -printf '%T@ %p\n' \
    2>/dev/null | sort -rn | head -n 1 | cut -d' ' -f2-)
  [ -n "$newest" ] && cat "$newest"
fi
exit $rc
