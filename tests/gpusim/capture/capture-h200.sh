#!/usr/bin/env bash
# Captures extra real nvidia-smi outputs on a 1-GPU host (used to build the
# simulator's fixtures in tests/fixtures/nvidia-smi/h200-1gpu-more/).
# Usage: capture-h200.sh OUTDIR   (needs nvidia-smi and python3 with torch)
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
TSV="$OUT/commands.tsv"
printf 'name\texit_code\tcommand\n' > "$TSV"
# cap NAME ARGS... : stdout -> NAME.out, stderr -> NAME.err (only if non-empty)
cap() {
  local name=$1; shift
  nvidia-smi "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  local rc=$?
  [ -s "$OUT/$name.err" ] || rm -f "$OUT/$name.err"
  printf '%s\t%s\t%s\n' "$name.out" "$rc" "nvidia-smi $*" >> "$TSV"
}
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
BUS=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)
ALL='index,count,name,gpu_name,serial,uuid,gpu_uuid,pci.bus_id,gpu_bus_id,pci.domain,pci.bus,pci.device,pci.device_id,pci.sub_device_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,display_mode,display_active,persistence_mode,accounting.mode,driver_model.current,vbios_version,fan.speed,pstate,memory.total,memory.reserved,memory.used,memory.free,compute_mode,compute_cap,utilization.gpu,utilization.memory,ecc.mode.current,ecc.errors.uncorrected.volatile.total,temperature.gpu,temperature.memory,power.management,power.draw,power.draw.average,power.draw.instant,power.limit,enforced.power.limit,power.default_limit,power.min_limit,power.max_limit,clocks.current.graphics,clocks.gr,clocks.current.sm,clocks.current.memory,clocks.max.graphics,clocks.max.memory,mig.mode.current,mig.mode.pending,driver_version'
APPS_ALL='timestamp,gpu_name,gpu_bus_id,gpu_serial,gpu_uuid,pid,process_name,name,used_gpu_memory,used_memory'
APPS='pid,process_name,gpu_uuid,gpu_bus_id,used_memory'
snap() {  # snap PREFIX
  local p=$1
  cap "${p}_smi" 
  cap "${p}_all_csv" --query-gpu="$ALL" --format=csv
  cap "${p}_all_nh" --query-gpu="$ALL" --format=csv,noheader
  cap "${p}_all_nu" --query-gpu="$ALL" --format=csv,nounits
  cap "${p}_all_nhnu" --query-gpu="$ALL" --format=csv,noheader,nounits
  cap "${p}_mem" --query-gpu=index,memory.used,memory.total,memory.free,memory.reserved --format=csv,noheader,nounits
  cap "${p}_apps" --query-compute-apps="$APPS" --format=csv
  cap "${p}_apps_nh" --query-compute-apps="$APPS" --format=csv,noheader
  cap "${p}_apps_nhnu" --query-compute-apps="$APPS" --format=csv,noheader,nounits
  cap "${p}_apps_all" --query-compute-apps="$APPS_ALL" --format=csv
  cap "${p}_apps_all_nu" --query-compute-apps="$APPS_ALL" --format=csv,nounits
  cap "${p}_apps_i0" -i 0 --query-compute-apps="$APPS" --format=csv
}
snap idle
cap i_index -i 0 --query-gpu=index,name --format=csv
cap i_uuid -i "$UUID" --query-gpu=index,name --format=csv
cap i_bus -i "$BUS" --query-gpu=index,name --format=csv
cap i_bus_short -i "${BUS#0000}" --query-gpu=index,name --format=csv
cap i_bus_nodomain -i "${BUS#00000000:}" --query-gpu=index,name --format=csv
cap i_bus_lower -i "$(echo "$BUS" | tr A-F a-f)" --query-gpu=index,name --format=csv
cap i_uuid_nogpu -i "${UUID#GPU-}" --query-gpu=index,name --format=csv
cap i_dup -i 0,0 --query-gpu=index,name --format=csv
cap i_0_1 -i 0,1 --query-gpu=index,name --format=csv
cap i_1_0 -i 1,0 --query-gpu=index,name --format=csv
cap i_1 -i 1 --query-gpu=index,name --format=csv
cap i_foo -i foo --query-gpu=index,name --format=csv
cap i_neg -i -1 --query-gpu=index,name --format=csv
cap i_long --id=0 --query-gpu=index,name --format=csv
cap i_eq -i=0 --query-gpu=index,name --format=csv
cap i_table -i 0
cap i_table_bad -i 1
cap i_L -L -i 0
cap i_L_bad -i 1 -L
cap i_apps_bad -i 1 --query-compute-apps="$APPS" --format=csv
cap i_topo topo -m -i 0
cap q_nofmt --query-gpu=index
cap q_fmt_only --format=csv
cap q_fmt_xml --query-gpu=index --format=xml
cap q_fmt_bad --query-gpu=index --format=csv,bogus
cap q_empty --query-gpu= --format=csv
cap q_dup --query-gpu=index,index --format=csv
cap q_space --query-gpu="index, name" --format=csv
cap q_case --query-gpu=INDEX,Name --format=csv
cap q_trailing --query-gpu=index, --format=csv
cap q_bad2 --query-gpu=bogus --format=csv,noheader
cap q_bad3 --query-gpu=index,bogus.a,bogus.b --format=csv
cap q_long_form --query-gpu index,name --format csv
cap q_u --query-gpu=index,name -u --format=csv
cap apps_bad --query-compute-apps=pid,bogus --format=csv
cap apps_nofmt --query-compute-apps=pid
cap version --version
cap bad_arg bogus
cap bad_opt --bogus
cap topo_matrix topo --matrix
cap topo_bad topo -x
cap topo_none topo
cap L_long --list-gpus
cap q_count --query-gpu=count,driver_version --format=csv,noheader
grep -c ^processor /proc/cpuinfo > "$OUT/env_nproc.txt"
python3 --version > "$OUT/env_python.txt" 2>&1
# ---- busy stages -----------------------------------------------------------
HOLD='import sys,time,torch
mib=int(sys.argv[1])
x=torch.empty(mib*2**20, dtype=torch.uint8, device="cuda") if mib else torch.zeros(1, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)'
wait_ready() { # wait for "ready" in file
  for _ in $(seq 1 240); do grep -q ready "$1" 2>/dev/null && return 0; sleep 0.5; done; return 1
}
PY=$(command -v python3)
"$PY" -c "$HOLD" 10240 > "$OUT/.h1" 2>&1 &
P1=$!
wait_ready "$OUT/.h1"; sleep 2
echo "$P1" > "$OUT/busy1_pids.txt"
tr '\0' ' ' < /proc/$P1/cmdline > "$OUT/busy1_cmdline.txt"; cat /proc/$P1/comm >> "$OUT/busy1_cmdline.txt"
snap busy1
# second: a context only, started through a symlink with another name, via exec -a
ln -sf "$PY" /tmp/myholder
( exec -a fancy-argv0 /tmp/myholder -c "$HOLD" 0 > "$OUT/.h2" 2>&1 ) &
P2=$!
wait_ready "$OUT/.h2"; sleep 2
# third: 5 GiB, comm renamed with prctl (like setproctitle's name part)
"$PY" -c 'import ctypes,sys; ctypes.CDLL(None).prctl(15, b"VLLM::Worker", 0,0,0); exec(sys.argv.pop(1))' "$HOLD" 5120 > "$OUT/.h3" 2>&1 &
P3=$!
wait_ready "$OUT/.h3"; sleep 2
echo "$P1 $P2 $P3" > "$OUT/busy3_pids.txt"
for p in $P2 $P3; do
  { tr '\0' ' ' < "/proc/$p/cmdline"; echo; cat "/proc/$p/comm"; } >> "$OUT/busy3_cmdline.txt"
done
snap busy3
kill $P1 $P2 $P3; wait
sleep 2
cap after_mem --query-gpu=index,memory.used,memory.total,memory.free,memory.reserved --format=csv,noheader,nounits
rm -f "$OUT"/.h*
