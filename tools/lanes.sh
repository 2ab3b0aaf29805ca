#!/usr/bin/env bash
# Run named lanes at the same time, print how long each took, fail if any failed.
# usage: lanes.sh NAME "COMMAND" [NAME "COMMAND" ...]
# The first lane writes to this terminal as it goes; the others write to .cache/logs/lane-NAME.log,
# which is printed whole when that lane ends (so no two lanes' lines interleave). make test runs the
# static checks and the unit tests beside the Molecule scenarios that serve no vLLM for long (see the
# Makefile's test target).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
logs=$root/.cache/logs
mkdir -p "$logs"
# run CMD, then write its wall time to FILE; exit with CMD's status
timed() { local start rc; start=$(date +%s); bash -c "$1"; rc=$?; echo $(( $(date +%s) - start )) > "$2"; return $rc; }
names=() pids=() first=1
while [ $# -ge 2 ]; do
  name=$1 cmd=$2; shift 2
  names+=("$name")
  rm -f "$logs/lane-$name.secs"
  if [ $first -eq 1 ]; then
    # also kept in its log, so that a failure can be summed up at the end (CI shows only the tail)
    timed "$cmd" "$logs/lane-$name.secs" > >(tee "$logs/lane-$name.log") 2>&1 &
    first=0
  else
    echo "######## lane $name: $cmd (output: .cache/logs/lane-$name.log, printed when it ends)"
    timed "$cmd" "$logs/lane-$name.secs" > "$logs/lane-$name.log" 2>&1 &
  fi
  pids+=($!)
done
summary=() rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; code=$?
  secs=$(cat "$logs/lane-${names[$i]}.secs" 2>/dev/null || echo '?')
  if [ "$i" -gt 0 ]; then
    echo "######## lane ${names[$i]}: its output"
    cat "$logs/lane-${names[$i]}.log"
  fi
  if [ $code -eq 0 ]; then summary+=("$(printf 'lane %-16s %5ss  ok' "${names[$i]}" "$secs")")
  else summary+=("$(printf 'lane %-16s %5ss  FAILED (exit %s)' "${names[$i]}" "$secs" "$code")"); rc=$code; fi
done
# what failed, at the end of the output where CI's tail shows it: the failing lines of each failed lane's log
for i in "${!names[@]}"; do
  case "${summary[$i]}" in *FAILED*)
    "$root/tools/failing-lines.sh" "$logs/lane-${names[$i]}.log" "lane ${names[$i]}" | tee "$logs/lane-${names[$i]}.failed"
    ;;
  esac
done
echo "######## lane timings"
printf '%s\n' "${summary[@]}"
exit $rc
