"""Benchmark the fan-out's shapes (roles/vllm_weights): T(N hosts) / T(1 host) with every host's sending rate capped.

A script that prints figures, not a test. One source host holds a verified snapshot (default 1 GiB: 4 shards of
256 MiB plus a tiny Llama, fetched once from the loopback Hub, tests/hubserver/hubserver.py); N copying hosts
(default 6) are directories, each with its own roles/vllm_weights/files/hub_mirror.py process (its "NIC", capped
with --max-rate, default 64 MiB/s, the same cap on every host) and its own hf_snapshot module process, with
verify=sha256 as the role runs them. Who copies from whom is the role's plan (plugin_utils/weights_plan.py
fanout_plan, the weights_fanout filter), for each --degrees value:

* 0: the star of 1.0 (every host copies from the source, whose capped link carries N copies): "before";
* 1: the chain (the default): each host copies from the one before it, which relays the bytes as they arrive;
* 2: a binary tree.

Every copying host starts at the same moment (as the role's lock-step does); T is until the last one ends.
T(1 host) is one host copying from the source alone. Prints T and T(N)/T(1) per shape, the bytes the source
sent (x the model), and checks every host ends with the published files.

All hosts share this machine's two cores and one disk, and the links are loopback capped by the mirrors, so the
figures compare the shapes under a link cap that is the bottleneck, not this box's disk or CPU; keep the cap
well under what the box can hash and write (about 1.4 GB/s of sha256 per core here).

Usage: .venv/bin/python tests/benchmarks/bench_fanout_tree.py [--hosts 6] [--degrees 0,1,2] [--rate-mib 64]
       [--shards 4] [--shard-mib 256] [--stall 120] [--workdir DIR] [--keep] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [HERE, os.path.join(ROOT, ".build")]

from bench_fanout import MIRROR, REPO, MiB, get_json, make_model, model_files, params, publish_repo, serve  # noqa: E402
from bench_fanout import start_module, stop, tree_digest, wait_all  # noqa: E402
from ansible_collections.inferops.vllm.plugins.plugin_utils.weights_plan import fanout_plan  # noqa: E402


def wanted_item(sha):
    """The one snapshot every host wants, in the shape of weights_models(...)["models"]."""
    return {"id": "%s@%s" % (REPO, sha), "repo_id": REPO, "revision": sha, "allow_patterns": None,
            "ignore_patterns": None, "verify": "sha256"}


def run_shape(work, name, sha, hosts, degree, rate_mib, stall, src_models):
    """The copying hosts of one shape, all at once; returns its figures."""
    names = ["src"] + ["h%d" % i for i in range(1, hosts + 1)]
    wanted = {h: [wanted_item(sha)] for h in names}
    plans = {h: fanout_plan(wanted, h, fanout=True, source="src", hosts=names, degree=degree) for h in names}
    models = {h: os.path.join(work, name, h, "models") for h in names[1:]}
    models["src"] = src_models
    for d in models.values():
        os.makedirs(d, exist_ok=True)
    mirrors, ports = {}, {}
    try:
        for h in names:
            if not plans[h]["serve"]:
                continue
            argv = [MIRROR, "--root", models[h], "--port", "0", "--quiet", "--max-rate", str(rate_mib)]
            if plans[h]["relay"]:
                argv += ["--relay", "--stall-timeout", str(stall)]
            mirrors[h], ports[h] = serve(argv)
        procs = []
        t0 = time.perf_counter()
        for h in names[1:]:
            parent = plans[h]["peer"][0]["source"]
            p = dict(params("http://127.0.0.1:%d" % ports[parent], sha, os.path.join(models[h], REPO, sha)),
                     timeout=stall + 30, retries=3)
            procs.append(start_module(p, work, "%s-%s" % (name, h)))
        results = wait_all(procs)
        seconds = time.perf_counter() - t0
        stats = {h: get_json("http://127.0.0.1:%d/_mirror/stats" % ports[h]) for h in mirrors}
    finally:
        stop(*mirrors.values())
    return {"degree": degree, "seconds": round(seconds, 2), "source_bytes": stats["src"]["bytes_sent"],
            "relayed_bytes": sum(s.get("relayed_bytes", 0) for h, s in stats.items() if h != "src"),
            "host_seconds": [r["seconds"] for r in results],
            "routes": plans["src"]["routes"]["%s@%s" % (REPO, sha)], "dests": [models[h] for h in names[1:]]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=6)
    ap.add_argument("--degrees", default="0,1,2", help="shapes to run (0 star, 1 chain, 2 binary tree ...)")
    ap.add_argument("--rate-mib", type=float, default=64.0, help="every host's sending cap, MiB/s")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=256)
    ap.add_argument("--stall", type=int, default=120)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="bench-fanout-tree-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    hub = None
    try:
        src = os.path.join(work, "published")
        make_model(src, seed=0, bulk_shards=args.shards, bulk_shard_mib=args.shard_mib)
        sha = publish_repo(src, os.path.join(work, "hub"), REPO)
        hub, hub_port = serve([os.path.join(ROOT, "tests", "hubserver", "hubserver.py"),
                               "--root", os.path.join(work, "hub"), "--port", "0"])
        src_models = os.path.join(work, "src", "models")
        first = wait_all([start_module(params("http://127.0.0.1:%d" % hub_port, sha, os.path.join(src_models, REPO, sha)),
                                       work, "src")])[0]
        stop(hub)
        hub = None
        model_bytes = first["total_bytes"]
        figures = {"hosts": args.hosts, "rate_mib": args.rate_mib, "model_bytes": model_bytes,
                   "load_before": os.getloadavg()[0]}
        names = model_files(os.path.join(src_models, REPO, sha))
        want = tree_digest(src, names)

        def check(shape):
            """Every copy holds the published files; the copies are removed after (disk)."""
            ok = all(model_files(os.path.join(d, REPO, sha)) == names
                     and tree_digest(os.path.join(d, REPO, sha), names) == want for d in shape["dests"])
            for d in shape.pop("dests"):
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
            return ok

        one = run_shape(work, "one", sha, 1, 1, args.rate_mib, args.stall, src_models)
        figures["identical"] = check(one)
        figures["one"] = one
        shapes = []
        for degree in [int(d) for d in args.degrees.split(",") if d.strip()]:
            shapes.append(run_shape(work, "d%d" % degree, sha, args.hosts, degree, args.rate_mib, args.stall,
                                    src_models))
            figures["identical"] = check(shapes[-1]) and figures["identical"]
        figures["shapes"] = shapes
        figures["load_after"] = os.getloadavg()[0]

        print("model: %.1f MiB (%d shards of %d MiB + tiny Llama), verify=sha256, every host's mirror capped at "
              "%.0f MiB/s, load %.1f -> %.1f" % (model_bytes / MiB, args.shards, args.shard_mib, args.rate_mib,
                                                 figures["load_before"], figures["load_after"]))
        print("T(1 host) = %.2f s (%.0f MiB/s)" % (one["seconds"], model_bytes / MiB / one["seconds"]))
        head = ("%d hosts" % args.hosts, "T (s)", "T(N)/T(1)", "source sent (x)", "relayed (x)")
        print("%-28s %10s %12s %16s %16s" % head)
        for s in shapes:
            label = {0: "star (1.0, before)", 1: "chain (degree 1)"}.get(s["degree"], "tree (degree %d)" % s["degree"])
            row = (label, s["seconds"], s["seconds"] / one["seconds"], s["source_bytes"] / model_bytes,
                   s["relayed_bytes"] / model_bytes)
            print("%-28s %10.2f %12.2f %16.2f %16.2f" % row)
            print("    " + ", ".join("%s<-%s" % (h, p or "hub") for h, p in s["routes"]))
        print("every copy verified (sha256) by its host and identical to the published files: %s"
              % figures["identical"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
    finally:
        stop(hub)
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
