#!/usr/bin/env bash
# What the watchdog's passes cost on a served host: busy CPU-seconds of the whole machine (/proc/stat)
# for SECONDS with inferops-vllm-watchdog.timer running at its interval, then with it stopped (a pass in
# progress finished first), then the timer started again. Run it as root on the host, for a Molecule
# host: podman exec -i <container> bash -s [SECONDS] < tests/benchmarks/bench_watchdog_cost.sh
# (in a container /proc/stat is the machine's: keep the machine otherwise quiet). Prints figures only.
set -euo pipefail
seconds=${1:-60}
busy() {  # busy jiffies of all CPUs so far (user nice system irq softirq steal)
  read -r _ user nice system _idle _iowait irq softirq steal _ < /proc/stat
  echo $(( user + nice + system + irq + softirq + steal ))
}
hz=$(getconf CLK_TCK)
measure() {
  local a b
  a=$(busy); sleep "$seconds"; b=$(busy)
  awk -v j=$(( b - a )) -v hz="$hz" -v s="$seconds" 'BEGIN { printf "%.1f CPU-s busy in %d s", j / hz, s }'
}
interval=$(systemctl show --property=TimersMonotonic --value inferops-vllm-watchdog.timer | grep -o 'OnUnitInactiveUSec=[^ ;]*' || true)
systemctl start inferops-vllm-watchdog.timer
sleep 5
echo "timer running ($interval): $(measure)"
systemctl stop inferops-vllm-watchdog.timer
while systemctl -q is-active inferops-vllm-watchdog.service; do sleep 1; done
sleep 5
echo "timer stopped: $(measure)"
systemctl start inferops-vllm-watchdog.timer
