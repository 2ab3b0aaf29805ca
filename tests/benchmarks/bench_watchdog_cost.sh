#!/usr/bin/env bash
# What the watchdog's passes cost on a served host: busy CPU-seconds of the whole machine (/proc/stat)
# for SECONDS with inferops-vllm-watchdog.timer firing every INTERVAL seconds (a runtime drop-in, removed
# after; without INTERVAL, the timer's own), then with the timer stopped (a pass in progress finished
# first); the timer is started again at the end. Run it as root on the host, for a Molecule host:
#   podman exec -i <container> bash -s 60 5 < tests/benchmarks/bench_watchdog_cost.sh
# (in a container /proc/stat is the machine's: keep the machine otherwise quiet). Prints figures only.
set -euo pipefail
seconds=${1:-60}
interval=${2:-}
timer=inferops-vllm-watchdog.timer
dropin=/run/systemd/system/$timer.d
busy() {  # busy jiffies of all CPUs so far (user nice system irq softirq steal)
  local _cpu user nice system _idle _iowait irq softirq steal _rest
  read -r _cpu user nice system _idle _iowait irq softirq steal _rest < /proc/stat
  echo $(( user + nice + system + irq + softirq + steal ))
}
hz=$(getconf CLK_TCK)
measure() {
  local a b
  a=$(busy); sleep "$seconds"; b=$(busy)
  awk -v j=$(( b - a )) -v hz="$hz" -v s="$seconds" 'BEGIN { printf "%.1f CPU-s busy in %d s", j / hz, s }'
}
cleanup() { rm -rf "$dropin"; systemctl daemon-reload; systemctl start "$timer"; }
trap cleanup EXIT
if [ -n "$interval" ]; then
  # one empty assignment resets every trigger of the timer (a second would drop OnActiveSec again)
  mkdir -p "$dropin"
  printf '[Timer]\nOnActiveSec=\nOnActiveSec=%s\nOnUnitInactiveSec=%s\n' "$interval" "$interval" > "$dropin/bench.conf"
  systemctl daemon-reload
fi
systemctl restart "$timer"
sleep 5
echo "timer every ${interval:-(its own interval)} s: $(measure)"
systemctl stop "$timer"
while systemctl -q is-active inferops-vllm-watchdog.service; do sleep 1; done
sleep 5
echo "timer stopped: $(measure)"
