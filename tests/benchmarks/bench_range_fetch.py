"""Benchmark one large file copied from the fan-out mirror: fetch + sha256 verify vs `cp` + hashlib.

Puts a tiny Llama plus one safetensors-like shard of ``--mib`` MiB (default 2048 = 2 GiB) of random
bytes into a models directory as a verified snapshot (the layout and ``.inferops-verified.json``
that ``hf_snapshot`` leaves on a fan-out source), serves it with ``roles/vllm_weights/files/hub_mirror.py``
on loopback (its own process, ``sendfile`` from the page cache), and times on the same disk, in
interleaved rounds so both see the same background load:

* ``cp --reflink=never`` of the shard, then a single-thread hashlib sha256 of the copy (1 MiB reads);
* the ``hf_snapshot`` module (its own process, as Ansible runs it) fetching the snapshot from the
  mirror into an empty directory with ``verify: sha256``: wall time of the process, and the module's
  own ``seconds``.

Nothing is synced in either case (both leave the same dirty pages to the kernel). Every figure is
the best of ``--repeat`` rounds; ``os.getloadavg()`` is printed with each round (the machine may be
shared).

``--collection DIR`` runs the module from another copy of the collection (DIR holds
``ansible_collections/inferops/vllm``), e.g. the committed one before a change; given twice or
more, every round runs each of them after the ``cp`` (interleaved: same background load)::

    mkdir -p /tmp/head/ansible_collections/inferops/vllm
    git archive HEAD | tar -x -C /tmp/head/ansible_collections/inferops/vllm
    .venv/bin/python tests/benchmarks/bench_range_fetch.py --collection /tmp/head --collection .build

Extra module options: ``--option KEY=JSON`` (repeatable), e.g. ``--option range_connections=4``.

Usage: .venv/bin/python tests/benchmarks/bench_range_fetch.py [--mib 2048] [--repeat 3] [--workdir DIR]
       [--collection DIR] [--option KEY=JSON ...] [--keep] [--json FILE]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, ".build")
sys.path[:0] = [os.path.join(ROOT, "tests", "models"), BUILD]

from make_tiny_model import make_model  # noqa: E402

from ansible_collections.inferops.vllm.plugins.module_utils import hf_snapshot as hs  # noqa: E402

MiB = 1 << 20
REPO = "bench/model"
SHARD = "bulk-00001-of-00001.safetensors"


def load():
    return [round(x, 2) for x in os.getloadavg()]


def sha256_file(path):
    h = hashlib.sha256()
    buf = bytearray(MiB)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def git_blob_sha1(path):
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_snapshot(models, mib):
    """<models>/bench/model/<sha>/ with the tiny model, one big shard and a manifest; returns (sha, dir)."""
    src = os.path.join(models, "..", "src")
    make_model(src, seed=0, bulk_shards=1, bulk_shard_mib=mib)
    sha = hashlib.sha1(b"bench-%d" % mib).hexdigest()
    snap = os.path.join(models, *REPO.split("/"), sha)
    shutil.copytree(src, snap)
    tree, files = {}, {}
    for name in sorted(os.listdir(snap)):
        full = os.path.join(snap, name)
        size = os.path.getsize(full)
        if name.endswith(".safetensors"):
            digest = sha256_file(full)
            pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (digest, size)
            tree[name] = {"size": size, "oid": hashlib.sha1(b"blob %d\0" % len(pointer) + pointer.encode()).hexdigest(),
                          "sha256": digest}
        else:
            tree[name] = {"size": size, "oid": git_blob_sha1(full), "sha256": None}
        files[name] = dict(hs.stat_key(os.stat(full)), verified="content")
    hs.write_json_atomic(os.path.join(snap, hs.MANIFEST_NAME), hs.build_manifest(REPO, sha, tree, files))
    return sha, snap


def run_module(params, workdir, collection):
    args = os.path.join(workdir, "args.json")
    with open(args, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": params}, f)
    module = os.path.join(collection, "ansible_collections", "inferops", "vllm", "plugins", "modules", "hf_snapshot.py")
    env = dict(os.environ, PYTHONPATH=collection)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, module, args], capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    try:
        res = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit("module output is not JSON: %s %s" % (proc.stdout[-2000:], proc.stderr[-2000:]))
    if res.get("failed"):
        raise SystemExit("module failed: %s" % res.get("msg"))
    return res, wall


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=2048, help="size of the big shard")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best one is reported")
    ap.add_argument("--workdir", help="scratch directory (default: a new one under /var/tmp)")
    ap.add_argument("--collection", action="append", default=[],
                    help="directory holding ansible_collections/inferops/vllm (repeatable; default: this checkout)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=JSON", help="extra module option")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--json", help="also write the figures to this file")
    a = ap.parse_args(argv)

    work = a.workdir or tempfile.mkdtemp(prefix="range_fetch_bench.", dir="/var/tmp")
    models = os.path.join(work, "models")
    os.makedirs(models, exist_ok=True)
    collections = [os.path.abspath(c) for c in (a.collection or [BUILD])]
    fig = {"host": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                    "collections": collections}, "rounds": []}
    mirror = None
    try:
        t0 = time.perf_counter()
        sha, snap = make_snapshot(models, a.mib)
        shard = os.path.join(snap, SHARD)
        size = os.path.getsize(shard)
        print("prepared %s: tiny model + %s (%d MiB) in %.1f s" % (snap, SHARD, size // MiB, time.perf_counter() - t0),
              flush=True)
        mirror = subprocess.Popen([sys.executable, os.path.join(ROOT, "roles", "vllm_weights", "files", "hub_mirror.py"),
                                   "--root", models, "--port", "0", "--quiet"], stdout=subprocess.PIPE, text=True)
        endpoint = "http://127.0.0.1:%d" % int(mirror.stdout.readline())
        params = {"repo_id": REPO, "revision": sha, "endpoint": endpoint, "verify": "sha256",
                  "allow_patterns": [SHARD], "disk_margin_mib": 64, "retries": 1, "retry_backoff": 0.5}
        for opt in a.option:
            k, _sep, v = opt.partition("=")
            params[k] = json.loads(v)
        expected = sha256_file(shard)  # also puts the source in the page cache, as on a fan-out source

        best = {}
        for rnd in range(a.repeat):
            dst = os.path.join(work, "cp-" + SHARD)
            l0 = load()
            t0 = time.perf_counter()
            subprocess.run(["cp", "--reflink=never", shard, dst], check=True)
            t1 = time.perf_counter()
            digest = sha256_file(dst)
            t2 = time.perf_counter()
            assert digest == expected
            os.remove(dst)
            cp = {"cp_s": round(t1 - t0, 3), "hash_s": round(t2 - t1, 3), "seconds": round(t2 - t0, 3), "load": l0}

            print("round %d: cp %.2f s + sha256 %.2f s = %.2f s (load %s)" % (
                rnd + 1, cp["cp_s"], cp["hash_s"], cp["seconds"], cp["load"]), flush=True)
            if "cp" not in best or cp["seconds"] < best["cp"]["seconds"]:
                best["cp"] = cp
            r = {"round": rnd + 1, "cp_hash": cp, "fetch": {}}
            for collection in collections:
                dest = os.path.join(work, "fetched")
                shutil.rmtree(dest, ignore_errors=True)
                l0 = load()
                res, wall = run_module(dict(params, dest=dest), work, collection)
                assert res["bytes_downloaded"] == size and res["verification"]["result"] == "ok", res
                assert sha256_file(os.path.join(dest, SHARD)) == expected
                shutil.rmtree(dest)
                fetch = {"seconds": round(wall, 3), "module_seconds": res["seconds"],
                         "download_seconds": res.get("download_seconds"), "transfer": res.get("transfer"),
                         "load": l0, "ratio": round(cp["seconds"] / wall, 3)}
                r["fetch"][collection] = fetch
                print("         %s: fetch+verify %.2f s (module %.2f s, %s) (load %s) | ratio %.2f" % (
                    collection, wall, res["seconds"], (res.get("transfer") or {}).get("method", "huggingface_hub"),
                    l0, fetch["ratio"]), flush=True)
                if collection not in best or wall < best[collection]["seconds"]:
                    best[collection] = fetch
            fig["rounds"].append(r)
    finally:
        if mirror is not None:
            mirror.terminate()
            mirror.wait()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    fig["best"] = best
    cps = best["cp"]["seconds"]
    print("\n%d MiB file from the mirror on loopback, %d CPUs, best of %d rounds, load average %s at the end"
          % (size // MiB, os.cpu_count(), a.repeat, load()))
    print("%-52s %8s %9s %6s" % ("", "seconds", "MiB/s", "ratio"))
    print("%-52s %8.2f %9.1f %6s   (cp %.2f + sha256 %.2f)" % ("cp + hashlib sha256", cps, size / cps / MiB, "1.00",
                                                               best["cp"]["cp_s"], best["cp"]["hash_s"]))
    for collection in collections:
        fs = best[collection]["seconds"]
        print("%-52s %8.2f %9.1f %6.2f   (module's own time %.2f s)" % (
            "fetch + sha256 verify, " + collection[-30:], fs, size / fs / MiB, cps / fs,
            best[collection]["module_seconds"]))
    print("ratio = cp+sha256 time / fetch+verify time (process wall, Python start included)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
