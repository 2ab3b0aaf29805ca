#!/usr/bin/env bash
# The lines of a test log that say what failed, short enough for the tail that CI shows.
# usage: failing-lines.sh LOG WHAT
# pytest's short summary (FAILED/ERROR node - message), its assertion lines (E ...), Ansible's fatal tasks and
# recaps with failures (not Molecule's polls): the last 16 of them, each cut at 300 characters.
# Molecule draws a border (`  │ `) before each line of a command's output when its output has colour (CI's terminal
# does, env -i has none): the colour and the border are taken off first, so the same lines are found either way.
set -u
log=$1 what=$2
echo "######## $what failed: its failing lines (whole log: $log)"
sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^ *│ \{0,1\}//' "$log" \
  | grep -E '^(FAILED|ERROR) |^E  |fatal: \[|failed=[1-9]|Verifier tests failed|Action failed|ERROR[^:]*:' \
  | grep -v 'FAILED - RETRYING' | tail -n 16 | cut -c1-300
exit 0
