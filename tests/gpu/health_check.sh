#!/usr/bin/env bash
# Apache License 2.0 (see LICENSE)
# GPU health preflight on a real NVIDIA host (issue 14), in one device session:
#   1. captures of every form inferops.vllm.gpu_health reads (idle, and the health query under load)
#   2. the module through `ansible localhost -c local`, 5 times idle and once under load, timed
#      (the module's own `seconds` and the wall time of the whole ansible command)
#   3. the preflight's health entry point (tests/gpu/health_on_device.yml)
# Usage with the device tool, from the repo root (make the wheels first: tests/gpu/make_wheelhouse.sh):
#   run(command="bash tests/gpu/health_check.sh", carry=[".cache/device-wheels"])
# Environment: ROOT (the collection checkout, default this one), WHEELS, OUT, PYTHON, ANSIBLE_VENV (a
# venv with ansible-core to use instead of installing one). Dry run without a GPU (no load phase):
#   mkdir -p /tmp/smi && ln -sf $PWD/tests/gpusim/nvidia-smi /tmp/smi/ && GPUSIM_PROFILE=$PWD/tests/gpusim/profiles/h200-1gpu.json \
#   PATH=/tmp/smi:$PATH ANSIBLE_VENV=$PWD/.venv PYTHON=.venv/bin/python OUT=/tmp/h tests/gpu/health_check.sh
# Writes to $OUT: health_check.log, captures.tar.gz (captures/ with commands.tsv), module_*.json, summary.txt.
set -uo pipefail
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
OUT=${OUT:-$ROOT/.cache/health-out}
WHEELS=${WHEELS:-$ROOT/.cache/device-wheels}
PY=${PYTHON:-python3}
mkdir -p "$OUT/captures"
exec > >(tee "$OUT/health_check.log") 2>&1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/inferops-health.XXXXXX")
die() { echo "SETUP ERROR: $*"; exit 2; }

if [ -n "${ANSIBLE_VENV:-}" ]; then  # dry run: a venv that has ansible-core already
  ln -s "$ANSIBLE_VENV" "$WORK/venv"
else
  echo "== ansible-core from $WHEELS"
  if ! { "$PY" -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q --no-index --find-links "$WHEELS" ansible-core; }; then
    die "cannot install ansible-core from $WHEELS"
  fi
fi
mkdir -p "$WORK/collections/ansible_collections/inferops"
ln -s "$ROOT" "$WORK/collections/ansible_collections/inferops/vllm"
export ANSIBLE_COLLECTIONS_PATH=$WORK/collections ANSIBLE_NOCOLOR=1 ANSIBLE_LOCALHOST_WARNING=0 \
  ANSIBLE_INVENTORY_UNPARSED_WARNING=0 ANSIBLE_PYTHON_INTERPRETER=$WORK/venv/bin/python
"$WORK/venv/bin/ansible" --version | head -1
nvidia-smi -L

echo "== 1. captures"
C=$OUT/captures
printf 'name\texit_code\tcommand\n' > "$C/commands.tsv"
cap() { local n=$1; shift; "$@" > "$C/$n" 2>&1; printf '%s\t%s\t%s\n' "$n" "$?" "$*" >> "$C/commands.tsv"; }
FIELDS=$(PYTHONPATH=$WORK/collections "$PY" -c \
  'from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi as n; print(",".join(n.HEALTH_FIELDS))')
REMAP=$(PYTHONPATH=$WORK/collections "$PY" -c \
  'from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi as n; print(" ".join(n.QUERY_REMAPPED_ROWS_ARGS))')
cap query_health.out nvidia-smi --query-gpu="$FIELDS" --format=csv
# shellcheck disable=SC2086  # two arguments
cap remapped_rows.out nvidia-smi $REMAP
cap topo_p2p_r.out nvidia-smi topo -p2p r
cap query_bad_field.out nvidia-smi --query-gpu=index,clocks_event_reasons.nope --format=csv
cap remapped_rows_bad_field.out nvidia-smi --query-remapped-rows=gpu_uuid,remapped_rows.nope --format=csv
cap journalctl_k.out bash -c 'journalctl -k -b --no-pager -q -o short-monotonic | tail -3'
cap dmesg_tail.out bash -c 'dmesg | tail -3'
cap nvswitch_devices.out ls -A /proc/driver/nvidia-nvswitch/devices
cap ulimit_n.out bash -c 'ulimit -Sn; ulimit -Hn'
cap shm.out df -m /dev/shm
cap version.out nvidia-smi --version

ARGS='{"cuda_build": "13.0", "plan": {"instances": [{"name": "one", "gpus": [0], "tensor_parallel_size": 1}]}, "nofile_service_limit": 65536}'
module() {  # module NAME: one ad-hoc run, its JSON in $OUT/module_NAME.json, the wall time printed
  local t0 t1
  t0=$(date +%s.%N)
  "$WORK/venv/bin/ansible" localhost -c local -m inferops.vllm.gpu_health -a "$ARGS" > "$WORK/$1.txt" 2>&1
  t1=$(date +%s.%N)
  "$PY" - "$WORK/$1.txt" "$t0" "$t1" "$1" "$OUT/module_$1.json" <<'PYEOF' | tee -a "$OUT/summary.txt"
import json, re, sys
path, t0, t1, name, dest = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(path).read()
m = re.search(r"^localhost \| [A-Z]+ => ", text, re.M)
try:
    r = json.JSONDecoder().raw_decode(text[m.end():])[0]
except (AttributeError, ValueError):
    print("%s: no JSON result:\n%s" % (name, text[-2000:])); sys.exit(0)
json.dump(r, open(dest, "w"), indent=1)
h = r.get("ansible_facts", {}).get("gpu_health", {})
calls = ", ".join("%s %.3fs" % (c["command"].split("/")[-1][:40], c["seconds"]) for c in r.get("nvidia_smi_calls", []))
print("%-8s status=%s module=%.3fs ansible wall=%.2fs calls: %s" % (name, h.get("status", r.get("msg")), h.get("seconds", -1), float(t1) - float(t0), calls))
for c, v in sorted(h.get("checks", {}).items()):
    print("    %-12s %-4s %s" % (c, v["status"], (v["problems"] or v["messages"] or [m["message"] for m in v["gpus"].values()] or [""])[0][:150]))
PYEOF
}

echo "== 2. the module, idle"
for i in 1 2 3 4 5; do module "idle$i"; done
echo "== 2b. under load (torch matmul loop on GPU 0)"
"$PY" - > "$WORK/load.log" 2>&1 <<'PYEOF' &
import time, torch
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + 25
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
PYEOF
LOAD=$!
sleep 10
cap busy_query_health.out nvidia-smi --query-gpu="$FIELDS" --format=csv
module busy
wait "$LOAD"; echo "load exit $? ($(tail -1 "$WORK/load.log"))"

echo "== 3. the preflight's health entry point"
SECONDS=0
"$WORK/venv/bin/ansible-playbook" "$ROOT/tests/gpu/health_on_device.yml" > "$OUT/health_on_device.log" 2>&1
echo "health_on_device rc=$? in ${SECONDS} s" | tee -a "$OUT/summary.txt"
tail -25 "$OUT/health_on_device.log"
cat "$C/commands.tsv"
# The device tool brings back a limited number of files: the captures travel as one archive.
tar -C "$OUT" -czf "$OUT/captures.tar.gz" captures && rm -rf "$OUT/captures"
