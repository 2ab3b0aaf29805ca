"""Benchmark the fleet-wide steps of a run over N stand-in hosts: controller CPU per host at 8, 64 and 128 hosts.

Each stand-in host is a local-connection inventory host whose ``nvidia-smi`` is the GPU simulator
(``tests/gpusim``, profile ``hgx-8x-h200``): the real ``ansible-playbook`` runs, for every host,

* the preflight role (inventory checks, GPU facts, health, host checks, the plan; two single-host instances
  per host: stand-in hosts on one machine share its network facts, so they cannot plan an instance that
  spans hosts - each rank needs its own address - and the multi-node fleet view is not measured here);
* the read-only first stage of the weights role (which snapshots, who fetches what from whom: fan-out on);
* the service role's rank judge (``tasks_from: ranks``: every host's report of its multi-node ranks).

It prints, for each N, the CPU seconds (user + system) in total and per host, split in two: the controller's
(``ansible-playbook`` and its workers: templating, the plan, the fleet-wide steps) and the hosts' (the modules and
what they run, here on this machine through the local connection; on a real fleet they run on the hosts). The
interpreter of the stand-in hosts is a shell wrapper that writes its children's CPU time (``times``) to a file
per module call; the controller's figure is the total less those. A step that reads every host's variables on
every host grows the per-host figure with N (O(N^2) in total); a flat per-host figure means the run is linear in
the fleet.

Usage: .venv/bin/python tests/benchmarks/bench_preflight_fleet.py [--hosts 8 64 128] [--forks 16]
       [--collection DIR] [--keep] [--calibrate]

``--calibrate`` also prints what one skipped task costs per host on this machine (Ansible's floor for any task
line), to read the controller's figure against: the machine's speed changes it as much as the collection does.

``--collection DIR`` runs another copy of the collection (DIR holds ``ansible_collections/inferops/vllm``),
e.g. the committed one before a change::

    mkdir -p /tmp/before/ansible_collections/inferops/vllm
    git archive <commit> | tar -x -C /tmp/before/ansible_collections/inferops/vllm
    .venv/bin/python tests/benchmarks/bench_preflight_fleet.py --collection /tmp/before
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUSIM = os.path.join(ROOT, "tests", "gpusim")
SHA = "0123456789abcdef0123456789abcdef01234567"
PLAYBOOK = """- name: The fleet-wide steps of a run, on stand-in hosts
  hosts: vllm_nodes
  gather_facts: false
  roles:
    - role: inferops.vllm.vllm_preflight
  tasks:
    - name: The first (read-only) stage of the weights role
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_weights
        tasks_from: validate
    - name: The rank judge of the service role
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_service
        tasks_from: ranks
"""


WRAPPER = """#!/bin/sh
# the stand-in host's interpreter: runs the module, then writes its CPU time (the children's line of times)
"%s" "$@"
rc=$?
times > "%s/$$"
exit $rc
"""


def host_cpu(times_dir):
    """Seconds of CPU the module calls used (the sum of the wrappers' children lines), and how many calls."""
    total, calls = 0.0, 0
    for name in os.listdir(times_dir):
        with open(os.path.join(times_dir, name)) as handle:
            lines = handle.read().split("\n")
        if len(lines) < 2:
            continue
        for part in lines[1].split():
            minutes, seconds = part.rstrip("s").split("m")
            total += int(minutes) * 60 + float(seconds)
        calls += 1
    return total, calls


def inventory(count, smi, python):
    hosts = {}
    for i in range(count):
        name = f"node-{i:03d}"
        instances = [{"name": "chat", "model": "m", "tensor_parallel_size": 4},
                     {"name": "big", "model": "big", "tensor_parallel_size": 4}]
        hosts[name] = {"ansible_connection": "local", "ansible_python_interpreter": python,
                       "vllm_instances": instances}
    return {"all": {"children": {"vllm_nodes": {
        "hosts": hosts,
        "vars": {
            "vllm_preflight_nvidia_smi": smi, "vllm_preflight_min_free_gib": 0,
            "vllm_weights_fanout": True,
            "vllm_models": {
                "m": {"repo_id": "org/m", "revision": SHA, "num_attention_heads": 32, "num_key_value_heads": 8},
                "big": {"repo_id": "org/big", "revision": SHA, "num_attention_heads": 64, "num_key_value_heads": 8},
            },
        }}}}}


CALIBRATION = """- name: Ansible's own cost of a task per host on this machine (a play of skipped tasks)
  hosts: vllm_nodes
  gather_facts: false
  tasks:
%s
"""


def calibrate(count, collection, forks, workdir, tasks=20):
    """CPU seconds of one skipped task on one host, on these stand-in hosts: the floor of any task here."""
    cpus = []
    for n in (0, tasks):
        body = "\n".join(f"    - name: Task {i}\n      ansible.builtin.debug:\n        msg: x\n      when: false"
                         for i in range(n)) or "    []"
        play = os.path.join(workdir, f"calibrate-{n}.yml")
        with open(play, "w") as handle:
            handle.write((CALIBRATION % body).replace("  tasks:\n    []", "  tasks: []"))
        cpus.append(run(count, collection, forks, workdir, playbook=play)[0])
    return (cpus[1] - cpus[0]) / (tasks * count)


def run(count, collection, forks, workdir, playbook=None):
    smi = os.path.join(workdir, "nvidia-smi")
    with open(smi, "w") as handle:
        handle.write(f"#!/bin/sh\nGPUSIM_PROFILE=hgx-8x-h200 exec {sys.executable} {os.path.join(GPUSIM, 'nvidia-smi')} "
                     "\"$@\"\n")
    os.chmod(smi, 0o755)
    times_dir = os.path.join(workdir, f"times-{count}")
    shutil.rmtree(times_dir, ignore_errors=True)
    os.makedirs(times_dir)
    python = os.path.join(workdir, f"python-{count}")
    with open(python, "w") as handle:
        handle.write(WRAPPER % (sys.executable, times_dir))
    os.chmod(python, 0o755)
    inv = os.path.join(workdir, f"inventory-{count}.json")
    with open(inv, "w") as handle:
        json.dump(inventory(count, smi, python), handle)
    play = playbook or os.path.join(workdir, "play.yml")
    if playbook is None:
        with open(play, "w") as handle:
            handle.write(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collection, ANSIBLE_FORKS=str(forks), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_HOST_KEY_CHECKING="0",
               ANSIBLE_DISPLAY_OK_HOSTS="0", ANSIBLE_DISPLAY_SKIPPED_HOSTS="0")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", inv, play],
                          capture_output=True, text=True, env=env, cwd=workdir, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout[-6000:] + proc.stderr[-3000:])
        raise SystemExit(f"the run over {count} hosts failed (rc {proc.returncode})")
    on_hosts, calls = host_cpu(times_dir)
    return cpu, wall, on_hosts, calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8, 64, 128])
    ap.add_argument("--forks", type=int, default=16)
    ap.add_argument("--collection", default=os.path.join(ROOT, ".build"))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--calibrate", action="store_true",
                    help="also measure Ansible's cost of one skipped task per host here (the floor of any task)")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-fleet-")
    try:
        print(f"collection {args.collection}, forks {args.forks}, load {os.getloadavg()[0]:.1f}")
        print(f"{'hosts':>5} {'CPU s':>7} {'CPU s/host':>10} {'controller s/host':>17} {'hosts s/host':>12} "
              f"{'calls/host':>10} {'wall s':>7} {'wall s/host':>11}")
        for count in args.hosts:
            cpu, wall, on_hosts, calls = run(count, args.collection, args.forks, workdir)
            print(f"{count:>5} {cpu:>7.1f} {cpu / count:>10.2f} {(cpu - on_hosts) / count:>17.2f} "
                  f"{on_hosts / count:>12.2f} {calls / count:>10.1f} {wall:>7.1f} {wall / count:>11.2f}", flush=True)
        if args.calibrate:
            floor = calibrate(args.hosts[0], args.collection, args.forks, workdir)
            print(f"one skipped task costs {floor * 1000:.0f} ms of controller CPU per host here ({args.hosts[0]} hosts)")
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
