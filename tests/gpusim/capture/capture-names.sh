#!/usr/bin/env bash
# Second capture: how nvidia-smi prints process names (argv[0]) that are long or
# rewritten (as vLLM's setproctitle does). Usage: capture-names.sh OUTDIR
set -u
OUT=${1:?outdir}; mkdir -p "$OUT"
PY=$(python3 -c 'import sys;print(sys.executable)')
REAL=$(readlink -f "$PY")
SP=$(python3 -c 'import site;print(site.getsitepackages()[0])')
HOLD='import sys,time,torch
x=torch.empty(int(sys.argv[1])*2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize(); print("ready", flush=True); time.sleep(3600)'
LONG=/opt/inferops/vllm/0.11.0-cu128-abcdefghijklmnopqrstuvwxyz/bin/python3.12
start() { # start LOG ARGV0 MIB
  ( PYTHONPATH=$SP exec -a "$2" "$REAL" -c "$HOLD" "$3" > "$OUT/$1" 2>&1 ) &
}
start h1.log "$LONG" 1024
start h2.log "VLLM::EngineCore" 2048
start h3.log "python" 3072
for _ in $(seq 1 240); do [ "$(grep -l ready "$OUT"/h*.log 2>/dev/null | wc -l)" = 3 ] && break; sleep 0.5; done
sleep 2
nvidia-smi > "$OUT/names_smi.out"; echo "rc=$?" >> "$OUT/rc.txt"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/names_apps.out"
nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader,nounits > "$OUT/names_mem.out"
for p in $(pgrep -f 'time.sleep\(3600\)'); do echo "$p $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-80) | $(cat "/proc/$p/comm")"; done > "$OUT/names_ps.txt"
pkill -f 'time.sleep\(3600\)'; wait
