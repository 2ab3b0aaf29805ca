#!/usr/bin/env bash
# Apache License 2.0 (see LICENSE)
# gpu_facts and gpu_footprint on a real NVIDIA GPU, through `ansible localhost -c local` (issue 3).
#
#   tests/gpu/device_check.sh [device_check.py options: --gpu N --gib G --delay S ...]
#
# Needs: nvidia-smi, python3 with torch (holds --gib GiB on --gpu), and ansible-core wheels in
# .cache/device-wheels (make them with tests/gpu/make_wheelhouse.sh where PyPI is reachable; the GPU
# machine has no network). With the `device` tool, from the repo root:
#   run(command="bash tests/gpu/device_check.sh", carry=[".cache/device-wheels"], timeout_s=600)
# It installs ansible-core into a venv under a fresh temp dir (not under $OUT), links the checkout as
# ansible_collections/inferops/vllm there, and writes to $OUT (default .cache/device-check-out):
#   device_check.log  this script's output
#   results.json      every module result with its timing, the checks, the raw nvidia-smi timings
#   summary.md        the same, readable: calls, messages, checks
#   captures.tar.gz   real outputs of every nvidia-smi command form module_utils/nvidia_smi.py uses
#                     (idle, busy, after), with commands.tsv as in tests/fixtures/nvidia-smi/
# Exit 0 when every expected pass/fail held, 1 when one did not, 2 on setup errors, 3 when the GPU
# was busy at the start. Environment knobs: PYTHON (default python3), WHEELS, OUT, ANSIBLE_BIN (use
# this ansible instead of installing one). Dry run without a GPU: ANSIBLE_BIN=.venv/bin/ansible
#   tests/gpu/device_check.sh --nvidia-smi tests/gpusim/nvidia-smi --simulate-holder tests/gpusim/gpusim-hold
# (with GPUSIM_PROFILE=h200-1gpu).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/.cache/device-check-out}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-$ROOT/.cache/device-wheels}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/inferops-devcheck.XXXXXX")
mkdir -p "$OUT"
exec > >(tee "$OUT/device_check.log") 2>&1

die() { echo "SETUP ERROR: $*"; exit 2; }

echo "== host"
uname -srm
"$PY" --version || die "no $PY"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' \
  || echo "(torch not importable: only a --simulate-holder dry run can work)"
command -v nvidia-smi && nvidia-smi -L

if [ -n "${ANSIBLE_BIN:-}" ]; then
  ANSIBLE=$ANSIBLE_BIN
else
  echo "== ansible-core from $WHEELS into $WORK/venv"
  [ -d "$WHEELS" ] || die "$WHEELS missing: run tests/gpu/make_wheelhouse.sh and carry .cache/device-wheels"
  if "$PY" -m venv "$WORK/venv" && [ -x "$WORK/venv/bin/pip" ]; then
    "$WORK/venv/bin/python" -m pip install -q --no-index --find-links "$WHEELS" ansible-core \
      || die "pip install from $WHEELS failed"
  else
    # a Python without ensurepip: make the venv bare and install into it with the outer pip
    rm -rf "$WORK/venv"
    "$PY" -m venv --without-pip "$WORK/venv" || die "cannot create a venv"
    "$PY" -m pip --python "$WORK/venv/bin/python" install -q --no-index --find-links "$WHEELS" ansible-core \
      || die "pip install from $WHEELS failed"
  fi
  ANSIBLE=$WORK/venv/bin/ansible
fi
"$ANSIBLE" --version > "$WORK/ansible-version.txt" 2>&1 || die "ansible does not run: $(cat "$WORK/ansible-version.txt")"
head -1 "$WORK/ansible-version.txt"

mkdir -p "$WORK/collections/ansible_collections/inferops"
ln -s "$ROOT" "$WORK/collections/ansible_collections/inferops/vllm"

PYTHON_ABS=$(command -v "$PY")
"$PY" "$ROOT/tests/gpu/device_check.py" --ansible "$ANSIBLE" --python "$PYTHON_ABS" \
  --work "$WORK" --out "$OUT" "$@"
rc=$?
echo "== device_check exit $rc (work dir $WORK)"
exit $rc
