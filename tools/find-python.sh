#!/usr/bin/env bash
# Print the controller Python for the project venv: the newest CPython >= 3.12 on this machine
# (ansible-core 2.20+ needs it), from PATH or pyenv; else the system python3 (ansible-core 2.19 line).
set -u
candidates=(python3.14 python3.13 python3.12)
for v in /root/.pyenv/versions/3.1[2-9]*/bin/python3 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
  [ -x "$v" ] && candidates+=("$v")
done
best="" bestver=0
for c in "${candidates[@]}"; do
  p=$(command -v "$c" 2>/dev/null) || continue
  ver=$("$p" -c 'import sys; print(sys.version_info[0]*100+sys.version_info[1])' 2>/dev/null) || continue
  "$p" -c 'import venv, ensurepip' 2>/dev/null || continue
  if [ "$ver" -ge 312 ] && [ "$ver" -gt "$bestver" ]; then best=$p bestver=$ver; fi
done
if [ -n "$best" ]; then echo "$best"; else command -v python3; fi
