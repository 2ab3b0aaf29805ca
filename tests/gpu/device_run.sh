#!/usr/bin/env bash
# Apache License 2.0 (see LICENSE)
# Everything the collection checks on a real GPU host, in one device session:
#   1. tests/gpu/device_check.sh  (issue 3: gpu_facts / gpu_footprint against the real nvidia-smi)
#   2. host layout captures       (issue 7: numactl -H, lscpu, sysfs numa_node/local_cpulist, topo -m, -q -x)
#   3. tests/gpu/plan_on_device.yml (gpu_plan on the real facts, a process pinned as the unit pins it)
#   4. tests/gpu/plan_contract_on_device.yml (issue 17: the vllm_preflight role's plan and its
#      footprint arguments on the real GPU)
# ONLY=4 runs step 4 alone.
# Usage with the device tool, from the repo root (make the wheels first: tests/gpu/make_wheelhouse.sh):
#   run(command="bash tests/gpu/device_run.sh", carry=[".cache/device-wheels"])
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/.cache/device-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/inferops-devrun.XXXXXX)
python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q --no-index --find-links "$ROOT/.cache/device-wheels" ansible-core || exit 2
mkdir -p "$WORK/collections/ansible_collections/inferops" && ln -s "$ROOT" "$WORK/collections/ansible_collections/inferops/vllm"
export ANSIBLE_COLLECTIONS_PATH=$WORK/collections ANSIBLE_NOCOLOR=1 ANSIBLE_LOCALHOST_WARNING=0
rc=0
if [ "${ONLY:-}" != 4 ]; then
echo "######## 1. device_check"
SECONDS=0
OUT=$OUT/check ANSIBLE_BIN=$WORK/venv/bin/ansible bash "$ROOT/tests/gpu/device_check.sh" || rc=1
echo "device_check took ${SECONDS} s"

echo "######## 2. host layout"
L=$WORK/layout; mkdir -p "$L"
printf 'name\texit_code\tcommand\n' > "$L/commands.tsv"
cap() { local n=$1; shift; "$@" > "$L/$n" 2>&1; printf '%s\t%s\t%s\n' "$n" "$?" "$*" >> "$L/commands.tsv"; }
cap numactl_H.out numactl -H
cap lscpu.out lscpu
cap smi_topo.out nvidia-smi topo -m
cap smi_q_x.xml nvidia-smi -q -x
cap smi_L.out nvidia-smi -L
for bus in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader); do
  d=/sys/bus/pci/devices/$(echo "${bus:4}" | tr 'A-F' 'a-f')   # 00000000:18:00.0 -> 0000:18:00.0
  echo "$bus numa_node=$(cat "$d/numa_node" 2>&1) local_cpulist=$(cat "$d/local_cpulist" 2>&1)"
done > "$L/sysfs_gpus.out" 2>&1
printf 'sysfs_gpus.out\t0\tcat /sys/bus/pci/devices/<bus>/{numa_node,local_cpulist}\n' >> "$L/commands.tsv"
tar -C "$L" -czf "$OUT/layout.tar.gz" .
cat "$L/sysfs_gpus.out"; head -5 "$L/numactl_H.out"

echo "######## 3. plan on the real GPU"
SECONDS=0
"$WORK/venv/bin/ansible-playbook" "$ROOT/tests/gpu/plan_on_device.yml" \
  -e "python=$(command -v python3) holder=$ROOT/tests/gpu/hold_gpu_memory.py" > "$OUT/plan_on_device.log" 2>&1 || rc=1
echo "plan_on_device took ${SECONDS} s, rc so far $rc"
tail -60 "$OUT/plan_on_device.log"
fi

echo "######## 4. the plan contract on the real GPU"
SECONDS=0
"$WORK/venv/bin/ansible-playbook" "$ROOT/tests/gpu/plan_contract_on_device.yml" \
  -e "python=$(command -v python3) holder=$ROOT/tests/gpu/hold_gpu_memory.py" > "$OUT/plan_contract_on_device.log" 2>&1 || rc=1
echo "plan_contract_on_device took ${SECONDS} s, rc so far $rc"
tail -80 "$OUT/plan_contract_on_device.log"
exit $rc
