"""The one parser of HAProxy's `show stat` (plugin_utils.frontdoor.server_states, filter vllm_frontdoor_servers).

On a capture from a real HAProxy 2.6 (Debian 12's, tests/fixtures/haproxy/), on a real HAProxy run here
whose servers are drained, put in maintenance and back through its runtime socket, and on generated
tables (hypothesis) whose columns come in any order, as another HAProxy version may print them.
"""
from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_frontdoor_servers import vllm_frontdoor_servers
from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import runtime_command
from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import server_states

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "haproxy", "show-stat-2.6.12.csv")
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)


def test_a_capture_of_a_real_haproxy():
    """tiny: alpha up (2 requests), beta drained, gamma down (nothing listens); chat/one in maintenance."""
    with open(FIXTURE) as fh:
        text = fh.read()
    got = server_states(text)
    assert {k: (v["status"], v["check_status"], v["sessions_total"]) for k, v in got.items()} == {
        "tiny/alpha": ("UP", "L7OK", 2), "tiny/beta": ("DRAIN", "L7OK", 2), "tiny/gamma": ("DOWN", "L4CON", 0),
        "chat/one": ("MAINT", "", 0)}
    assert got["tiny/beta"]["backend"] == "tiny" and got["tiny/beta"]["server"] == "beta"
    # the lines, as Ansible's stdout_lines gives them, read the same
    assert server_states(text.splitlines()) == got
    assert vllm_frontdoor_servers(text) == got


@pytest.mark.parametrize("empty", ["", "\n\n", [], None])
def test_no_output_no_servers(empty):
    assert server_states(empty) == {}


@pytest.mark.parametrize("text", ["Permission denied.\n", "Unknown command: 'show stats'\n", "pxname,svname\n"])
def test_an_answer_that_is_not_show_stat_is_refused_quoting_it(text):
    with pytest.raises(ValueError, match="not HAProxy's `show stat` output"):
        server_states(text)
    with pytest.raises(AnsibleFilterError, match=r"vllm_frontdoor_servers: .*" + text.split()[0]):
        vllm_frontdoor_servers(text)


_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=12).filter(
    lambda n: n not in ("FRONTEND", "BACKEND"))
_status = st.sampled_from(["UP", "DOWN", "DRAIN", "MAINT", "NOLB", "UP 1/3", "DOWN 1/2", "no check"])
_check = st.sampled_from(["", "L7OK", "L4CON", "L7STS", "L4TOUT", "INI"])
_extra = ["qcur", "weight", "act", "lastchg", "rate", "hrsp_2xx", "agent_status", "srv_icur"]
_row = st.tuples(_status, _check, st.integers(0, 10**9), st.integers(0, 10**4))


@settings(max_examples=200, deadline=None)
@given(servers=st.dictionaries(st.tuples(_name, _name), _row, max_size=8),
       order=st.permutations(["pxname", "svname", "status", "check_status", "stot", "scur"] + _extra),
       summaries=st.booleans())
def test_any_column_order_any_servers(servers, order, summaries):
    head = [c for c in order if c not in ("pxname", "svname")]
    head = ["pxname", "svname"] + head  # HAProxy always starts with these two; the header line says so
    lines = ["# " + ",".join(head)]
    for (backend, server), (status, check, total, current) in servers.items():
        row = {"pxname": backend, "svname": server, "status": status, "check_status": check, "stot": str(total),
               "scur": str(current)}
        lines.append(",".join(row.get(c, "0") for c in head))
        if summaries:
            lines.append(",".join({"pxname": backend, "svname": "BACKEND", "status": "UP"}.get(c, "") for c in head))
    got = server_states("\n".join(lines) + "\n")
    assert got == {f"{b}/{s}": {"backend": b, "server": s, "status": st_, "check_status": c, "sessions_total": t,
                                "sessions_current": cur, "address": ""}
                   for (b, s), (st_, c, t, cur) in servers.items()}


# --------------------------------------------------------------------------- a real HAProxy

class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed here (make sysdeps installs it)")
def test_a_running_haproxy_drained_and_put_in_maintenance_through_its_socket(tmp_path):
    backends = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok) for _n in range(2)]
    for srv in backends:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    admin = str(tmp_path / "admin.sock")
    front = _free_port()
    cfg = tmp_path / "h.cfg"
    cfg.write_text("\n".join([
        "global", f"    stats socket {admin} mode 600 level admin",
        "defaults", "    mode http", "    timeout connect 2s", "    timeout client 10s", "    timeout server 10s",
        "frontend tiny", f"    bind 127.0.0.1:{front}", "    default_backend tiny",
        "backend tiny", "    option httpchk GET /health",
        f"    server alpha 127.0.0.1:{backends[0].server_address[1]} check inter 300ms rise 3",
        f"    server beta 127.0.0.1:{backends[1].server_address[1]} check inter 300ms rise 3",
        f"    server gone 127.0.0.1:{_free_port()} check inter 300ms rise 3", ""]))
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def states():
            return {k: v["status"] for k, v in server_states(runtime_command(admin, "show stat")).items()}

        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(admin) and states() == {"tiny/alpha": "UP", "tiny/beta": "UP", "tiny/gone": "DOWN"}:
                break
            time.sleep(0.2)
        assert states() == {"tiny/alpha": "UP", "tiny/beta": "UP", "tiny/gone": "DOWN"}
        assert runtime_command(admin, "set server tiny/beta state drain").strip() == ""
        assert runtime_command(admin, "set server tiny/alpha state maint").strip() == ""
        assert states() == {"tiny/alpha": "MAINT", "tiny/beta": "DRAIN", "tiny/gone": "DOWN"}
        assert runtime_command(admin, "set server tiny/alpha state ready").strip() == ""
        assert runtime_command(admin, "set server tiny/beta state ready").strip() == ""
        # out of maintenance, a server is not UP at once: its checks must rise first (the role's ready step
        # waits for exactly "UP"); out of drain it is UP at once
        now = states()
        assert now["tiny/alpha"] != "UP" and now["tiny/beta"] == "UP", now
        while time.time() < deadline + 20 and states()["tiny/alpha"] != "UP":
            time.sleep(0.2)
        got = server_states(runtime_command(admin, "show stat"))
        assert {k: v["status"] for k, v in got.items()} == {"tiny/alpha": "UP", "tiny/beta": "UP", "tiny/gone": "DOWN"}
        assert got["tiny/gone"]["check_status"] == "L4CON" and got["tiny/alpha"]["check_status"] == "L7OK"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for srv in backends:
            srv.shutdown()
