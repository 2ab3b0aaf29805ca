# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""HAProxy's runtime API (the front door's admin socket): one command, the servers of ``show stat``, and the
load of a vLLM instance read from its ``/metrics``.

Used on the host by the ``frontdoor_server`` module (drain and ready of one server) and the ``frontdoor_reload``
module (a reload that keeps servers out of rotation), and on the controller by the ``vllm_frontdoor_servers``
filter, so ``show stat`` has one parser.
"""
from __future__ import annotations

import re
import socket

# rows of `show stat` that sum up a proxy rather than name a server
_SUMMARY_ROWS = ("FRONTEND", "BACKEND")
# vLLM's gauges of requests running on the engine and waiting for it (any labels)
_LOAD = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)$", re.M)


def runtime_command(path, command, timeout=10.0):
    """Send one command to the runtime API at the UNIX socket ``path``; return its whole answer (str).

    Raises OSError when the socket cannot be reached (no front door runs, permission denied).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        sock.close()


# rows of `show stat` that sum up a proxy rather than name a server
_SUMMARY_ROWS = ("FRONTEND", "BACKEND")


def server_states(show_stat):
    """Every server of HAProxy's ``show stat`` output: ``{"<backend>/<server>": {...}}``.

    ``show_stat`` is the runtime API's answer (a string or its lines): CSV whose first line is the header
    ``# pxname,svname,...`` (field positions differ between HAProxy versions; the header names them). Each
    server maps to ``backend``, ``server``, ``status`` (UP, DOWN, DRAIN, MAINT, "UP 1/3", ...), ``check_status``
    (the last health check: L7OK, L4CON, ...; "" when none ran), ``sessions_total`` (requests it was sent,
    an int), ``sessions_current`` (requests it runs now, through this front door) and ``address`` (``addr``:
    ``<ip>:<port>``, "" when the version shows none). The FRONTEND and BACKEND
    summary rows are left out. Empty input gives ``{}``; input that is not
    ``show stat`` output (an error of the socket) raises ValueError quoting its first line.
    """
    lines = show_stat.splitlines() if isinstance(show_stat, str) else list(show_stat or [])
    lines = [line for line in lines if line.strip()]
    if not lines:
        return {}
    if not lines[0].startswith("# pxname,svname,"):
        raise ValueError(f"not HAProxy's `show stat` output (no '# pxname,svname,...' header): {lines[0][:200]!r}")
    head = lines[0][2:].split(",")
    servers = {}
    for line in lines[1:]:
        row = dict(zip(head, line.split(",")))
        if row.get("svname", "") in _SUMMARY_ROWS or not row.get("pxname") or not row.get("svname"):
            continue
        total, current = row.get("stot", ""), row.get("scur", "")
        servers[f"{row['pxname']}/{row['svname']}"] = {
            "backend": row["pxname"], "server": row["svname"], "status": row.get("status", ""),
            "check_status": row.get("check_status", ""), "sessions_total": int(total) if total.isdigit() else 0,
            "sessions_current": int(current) if current.isdigit() else 0, "address": row.get("addr", ""),
        }
    return servers


# the status HAProxy shows for a server taken out of rotation over the runtime API -> the state that puts it back there
_ADMIN = {"DRAIN": "drain", "MAINT": "maint"}


def admin_states(servers):
    """``{"<backend>/<server>": "drain" | "maint"}`` of the servers (``server_states``) an operator or a run took out
    of rotation (``set server ... state drain|maint``); a server that is only DOWN (its checks fail) is not one."""
    out = {}
    for name, server in (servers or {}).items():
        state = _ADMIN.get(str(server.get("status", "")).split(" ", maxsplit=1)[0])
        if state:
            out[name] = state
    return out


def worker_pid(show_info):
    """The ``Pid:`` of HAProxy's ``show info`` answer (the process that answered); ValueError when there is none."""
    for line in (show_info or "").splitlines():
        key, _sep, value = line.partition(":")
        if key.strip() == "Pid" and value.strip().isdigit():
            return int(value.strip())
    raise ValueError(f"not HAProxy's `show info` output: {(show_info or '')[:200]!r}")


def vllm_load(metrics_text):
    """Requests running plus waiting on a vLLM instance, from its ``/metrics`` text (0.0 when it shows none)."""
    return sum(float(value) for value in _LOAD.findall(metrics_text or ""))
