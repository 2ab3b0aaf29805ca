"""Benchmark "fetch once, fan out" (roles/vllm_weights) against N independent downloads, on loopback.

A script that prints figures, not a test. Publishes a tiny Llama plus random shards (default
4 x 128 MiB) on the loopback Hub (tests/hubserver/hubserver.py, its own process), then for N
simulated hosts (directories, default 3):

1. independent: N hf_snapshot module processes download from the Hub at the same time;
2. fan-out: one module process downloads from the Hub into host 1's models directory, then
   roles/vllm_weights/files/hub_mirror.py (its own process) serves that directory and the N-1
   other hosts download from it at the same time, as the role does (verify=sha256 everywhere).

Prints, for both: bytes the Hub sent (its request counters), bytes the mirror sent, wall time, and
checks that every host ends with the same files. All hosts share this machine's CPUs and disk, so
times compare the two schemes on one box; Hub bytes are exact whatever the box.

Usage: .venv/bin/python tests/benchmarks/bench_fanout.py [--hosts 3] [--shards 4] [--shard-mib 128]
       [--workdir DIR] [--keep] [--json FILE]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, ".build")
sys.path[:0] = [os.path.join(ROOT, "tests", "hubserver"), os.path.join(ROOT, "tests", "models")]

from hubserver import publish_repo  # noqa: E402
from make_tiny_model import make_model  # noqa: E402

MiB = 1 << 20
REPO = "bench/fanout"
MIRROR = os.path.join(ROOT, "roles", "vllm_weights", "files", "hub_mirror.py")


def serve(argv):
    """Start a server process that prints its port on the first line; returns (process, port)."""
    proc = subprocess.Popen([sys.executable] + argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return proc, int(proc.stdout.readline())


def stop(*procs):
    """Terminate the server processes started with serve() (None: never started) and reap them."""
    for p in procs:
        if p is not None:
            p.terminate()
            p.wait()


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def start_module(params, workdir, name):
    args = os.path.join(workdir, "args-%s.json" % name)
    with open(args, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": params}, f)
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "plugins", "modules", "hf_snapshot.py"), args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=BUILD))


def wait_all(procs):
    out = []
    for p in procs:
        stdout, _err = p.communicate()
        res = json.loads(stdout)
        if res.get("failed"):
            raise SystemExit("module failed: %s" % res.get("msg"))
        out.append(res)
    return out


def params(endpoint, sha, dest):
    return {"repo_id": REPO, "revision": sha, "dest": dest, "endpoint": endpoint, "verify": "sha256",
            "disk_margin_mib": 1, "retries": 1}


def model_files(top):
    out = []
    for root, dirs, names in os.walk(top):
        dirs[:] = [d for d in dirs if d != ".cache"]
        out += [os.path.relpath(os.path.join(root, n), top) for n in names if not n.startswith(".inferops")]
    return sorted(out)


def tree_digest(top, names):
    h = hashlib.sha256()
    for rel in names:
        h.update(rel.encode())
        with open(os.path.join(top, rel), "rb") as f:
            for chunk in iter(lambda: f.read(MiB), b""):
                h.update(chunk)
    return h.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=128)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="bench-fanout-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    hub = mirror = None
    try:
        src = os.path.join(work, "src")
        make_model(src, seed=0, bulk_shards=args.shards, bulk_shard_mib=args.shard_mib)
        sha = publish_repo(src, os.path.join(work, "hub"), REPO)
        hub, hub_port = serve([os.path.join(ROOT, "tests", "hubserver", "hubserver.py"),
                               "--root", os.path.join(work, "hub"), "--port", "0"])
        hub_url = "http://127.0.0.1:%d" % hub_port
        figures = {"hosts": args.hosts, "load_before": os.getloadavg()[0]}

        def dest(scheme, i):
            return os.path.join(work, scheme, "host%d" % i, "models", REPO, sha)

        # 1. independent downloads
        urllib.request.urlopen(urllib.request.Request(hub_url + "/_admin/reset", method="POST"), timeout=10).read()
        t0 = time.perf_counter()
        results = wait_all([start_module(params(hub_url, sha, dest("independent", i)), work, "i%d" % i)
                            for i in range(args.hosts)])
        independent_s = time.perf_counter() - t0
        model_bytes = results[0]["total_bytes"]
        figures["model_bytes"] = model_bytes
        figures["independent"] = {"seconds": round(independent_s, 2),
                                  "hub_bytes": get_json(hub_url + "/_admin/stats")["bytes_sent"]}

        # 2. fetch once, fan out
        urllib.request.urlopen(urllib.request.Request(hub_url + "/_admin/reset", method="POST"), timeout=10).read()
        t0 = time.perf_counter()
        wait_all([start_module(params(hub_url, sha, dest("fanout", 0)), work, "f0")])
        first_s = time.perf_counter() - t0
        mirror, mirror_port = serve([MIRROR, "--root", os.path.join(work, "fanout", "host0", "models"),
                                     "--port", "0", "--quiet"])
        mirror_url = "http://127.0.0.1:%d" % mirror_port
        wait_all([start_module(params(mirror_url, sha, dest("fanout", i)), work, "f%d" % i)
                  for i in range(1, args.hosts)])
        fanout_s = time.perf_counter() - t0
        figures["fanout"] = {"seconds": round(fanout_s, 2), "first_host_seconds": round(first_s, 2),
                             "hub_bytes": get_json(hub_url + "/_admin/stats")["bytes_sent"],
                             "mirror_bytes": get_json(mirror_url + "/_mirror/stats")["bytes_sent"]}
        figures["load_after"] = os.getloadavg()[0]

        names = model_files(dest("fanout", 0))
        digests = {(tuple(model_files(dest(s, i))), tree_digest(dest(s, i), names))
                   for s in ("independent", "fanout") for i in range(args.hosts)}
        figures["identical"] = digests == {(tuple(names), tree_digest(src, names))}
        if not figures["identical"]:
            raise SystemExit("hosts ended with different files")

        ind, fan = figures["independent"], figures["fanout"]
        print("model: %.1f MiB (%d shards of %d MiB + tiny Llama), %d hosts, verify=sha256, load %.1f -> %.1f"
              % (model_bytes / MiB, args.shards, args.shard_mib, args.hosts, figures["load_before"],
                 figures["load_after"]))
        print("%-34s %12s %14s %10s" % ("", "Hub bytes", "x model size", "seconds"))
        row = "%-34s %12d %14.2f %10.2f"
        print(row % ("independent downloads", ind["hub_bytes"], ind["hub_bytes"] / model_bytes, ind["seconds"]))
        print(row % ("fetch once, fan out (mirror)", fan["hub_bytes"], fan["hub_bytes"] / model_bytes,
                     fan["seconds"]))
        print("  of which: first host from the Hub %.2f s; mirror sent %d bytes (%.2f x model size)"
              % (fan["first_host_seconds"], fan["mirror_bytes"], fan["mirror_bytes"] / model_bytes))
        print("every host holds exactly the published files: %s" % figures["identical"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
    finally:
        stop(mirror, hub)
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
