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
exit $rc
