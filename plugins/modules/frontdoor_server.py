#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: frontdoor_server
short_description: Drain one server of the HAProxy front door, or put it back and wait until it is UP
version_added: 1.1.0
description:
  - Takes one vLLM instance (a server of a backend) out of the front door before it stops or restarts, or
    puts it back after its health gate, over HAProxy's runtime API (the admin socket of the
    C(inferops.vllm.vllm_frontdoor) role). One call does what a restart step needs, so the service role's
    restart path asks the host once per step instead of once per command.
  - O(state=drain) sets the server's state to C(drain) (HAProxy sends it no new request; requests it runs
    go on), then waits until the instance's own C(/metrics) at O(wait_url) shows no request running or
    waiting, or the instance no longer answers, or O(timeout) seconds passed (a warning; RV(drained) is
    false and the caller goes on).
  - O(state=ready) sets the server's state to C(ready), then waits until HAProxy's own health checks see it
    C(UP); after O(timeout) seconds it fails naming the server's state and its last check.
  - No front door on the host (no socket at O(socket), the first deployment) or no such server in it (a new
    instance, or one the front door does not know yet) is not an error - there is nothing to drain or put
    back (RV(present) false); except that O(state=ready) with O(address), O(port) and O(check) adds a server
    missing from a running backend (a new or renamed instance, RV(added)), so that a model's front door has
    it before the model's other instances restart later in the same run. HAProxy's C(add server) creates it in
    maintenance with its checks off; the module sets its checks (the backend's C(option httpchk) with O(check)'s
    interval, fall and rise), enables them and the server, and waits until it is C(UP). The front door role's
    reload at the end of the run then carries it in the configuration.
  - In check mode the state is read and nothing is set or waited for.
options:
  socket:
    description: The runtime API's UNIX socket (C(stats socket ... level admin) in the front door's configuration).
    type: path
    default: /run/inferops-vllm-frontdoor/admin.sock
  backend:
    description: The backend (the front door of one model, named after the model).
    type: str
    required: true
  server:
    description: The server in O(backend) (the instance's name).
    type: str
    required: true
  state:
    description: C(drain) before a stop or restart, C(ready) after the instance passed its health gate.
    type: str
    required: true
    choices: [drain, ready]
  wait_url:
    description:
      - The instance's base URL (C(http://127.0.0.1:8000)); with O(state=drain) its C(/metrics) is polled until
        C(vllm:num_requests_running) plus C(vllm:num_requests_waiting) is 0. Without it, a drain does not wait.
    type: str
  address:
    description:
      - With O(state=ready), the address (an IP) the server must have, set over the runtime API before it is put back
        (C(set server ... addr ... port ...)) when it differs. A plan change that moves an instance to another port
        or address restarts it there; the front door's configuration follows later in the run (its reload keeps
        the address), but the put-back must already reach the instance where it listens now.
    type: str
  port:
    description: With O(address), the server's port.
    type: int
  check:
    description:
      - With O(state=ready), O(address) and O(port), the health checks of a server added to a running backend (the
        plan's C(frontdoor_runtime.check), the same as the configuration's servers). Without it a missing server
        is not added.
    type: dict
    suboptions:
      inter:
        description: Time between two checks (C(2s), C(500ms)).
        type: str
        required: true
      fall:
        description: Failed checks in a row that take the server out.
        type: int
        required: true
      rise:
        description: Passed checks in a row that put it back.
        type: int
        required: true
  standby:
    description:
      - With O(state=drain), other servers of O(backend) of which one must be C(UP) before the server is drained (a
        router's backups, the other router hosts' front doors). The drain waits for one, up to O(timeout) seconds,
        and fails naming their states when none comes UP, draining nothing. Without it a drain could leave the
        backend no server while the other router host's front door, just restarted itself, was not UP here yet.
    type: list
    elements: str
    default: []
  wait_sessions:
    description:
      - With O(state=drain), also wait until HAProxy's own count of the requests the server runs through this front
        door (C(scur) of C(show stat)) is 0. For a server whose load O(wait_url) cannot read, such as a router (the
        router role drains a router this way before it restarts it, while the other router hosts serve).
    type: bool
    default: false
  timeout:
    description: The longest wait in seconds (draining, or until UP).
    type: int
    default: 60
  interval:
    description: Seconds between two reads while waiting.
    type: float
    default: 1.0
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Drain alpha at the front door of model chat before it restarts
  inferops.vllm.frontdoor_server:
    backend: chat
    server: alpha
    state: drain
    wait_url: http://127.0.0.1:8000
    timeout: 300

- name: Put gamma (new in this run) into the running front door after its gate, and wait until it is UP
  inferops.vllm.frontdoor_server:
    backend: chat
    server: gamma
    state: ready
    address: 127.0.0.1
    port: 8002
    check: {inter: 2s, fall: 3, rise: 2}

- name: Put alpha back after its health gate, and wait until HAProxy sees it UP
  inferops.vllm.frontdoor_server:
    backend: chat
    server: alpha
    state: ready
    timeout: 60
"""

RETURN = r"""
present:
  description: Whether a front door runs and has the server (false means there was nothing to do).
  returned: always
  type: bool
  sample: true
before:
  description: The server's status before this call (C(UP), C(DOWN), C(DRAIN), C(MAINT), ...; empty when not present).
  returned: always
  type: str
  sample: UP
added:
  description: Whether the server was missing from the running backend and was added (O(check) given).
  returned: when O(state=ready)
  type: bool
  sample: false
moved:
  description: With O(address), whether the server's address or port was changed before it was put back.
  returned: when O(address) is given
  type: bool
  sample: true
address_before:
  description: With O(address), the server's C(<ip>:<port>) before the call.
  returned: when O(address) is given
  type: str
  sample: 127.0.0.1:8001
status:
  description: The server's status when the call ended.
  returned: always
  type: str
  sample: DRAIN
drained:
  description: With O(state=drain), whether the instance ran no request when the call ended.
  returned: when O(state=drain) and the server is present
  type: bool
  sample: true
waited:
  description: Seconds the call waited (draining, or until UP).
  returned: always
  type: float
  sample: 2.1
"""

import os
import stat
import time
from urllib.error import URLError

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (
    runtime_command,
    server_states,
    vllm_load,
)

# statuses HAProxy shows for a server an operator (or this module) took out of rotation
_ADMIN_OUT = ("DRAIN", "MAINT", "NOLB")


def _servers(module, path):
    """Every server of the front door (``server_states`` of ``show stat``); fails the module on a socket error."""
    try:
        servers = server_states(runtime_command(path, "show stat"))
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"front door runtime API {path}: `show stat` failed: {exc}")
    return servers


def _status(module, path, name):
    """(present, status, last check) of backend/server ``name``."""
    server = _servers(module, path).get(name)
    if server is None:
        return False, "", ""
    return True, server["status"], server["check_status"]


def _backends(module, path):
    """The backends of the running front door (from ``show stat``'s servers)."""
    return {key.split("/", 1)[0] for key in _servers(module, path)}


def _address(module, path, name):
    """The server's ``<ip>:<port>`` as HAProxy shows it now."""
    return (_servers(module, path).get(name) or {}).get("address", "")


def _command(module, path, command):
    """A runtime API command that answers something on success (``set server ... addr``): fail on an error."""
    try:
        answer = runtime_command(path, command).strip()
    except OSError as exc:
        module.fail_json(msg=f"front door runtime API {path}: `{command}` failed: {exc}")
    if answer and not answer.lower().startswith(("ip changed", "port changed", "no need to change")):
        module.fail_json(msg=f"front door runtime API {path}: `{command}` answered: {answer}")


def _add(module, path, name, address, port, check):
    """Add ``name`` (backend/server) to the running front door with ``check``'s health checks, then turn its checks
    and itself on (HAProxy creates a dynamic server in maintenance, checks off). True when added; False when the
    backend is not running (a model new in this run: the role's reload brings its front door)."""
    target = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    command = f"add server {name} {target} check inter {check['inter']} fall {int(check['fall'])} rise {int(check['rise'])}"
    try:
        answer = runtime_command(path, command).strip()
    except OSError as exc:
        module.fail_json(msg=f"front door runtime API {path}: `{command}` failed: {exc}")
    if answer.lower().startswith("no such backend"):
        return False
    if not answer.lower().startswith("new server registered"):
        module.fail_json(msg=f"front door runtime API {path}: `{command}` answered: {answer}")
    for follow in (f"enable health {name}", f"enable server {name}"):
        try:
            answer = runtime_command(path, follow).strip()
        except OSError as exc:
            module.fail_json(msg=f"front door runtime API {path}: `{follow}` failed: {exc}")
        if answer:
            module.fail_json(msg=f"front door runtime API {path}: `{follow}` answered: {answer}")
    return True


def _wait_up(module, path, name, start, timeout, interval, result, late):
    """Wait (from ``start``) until HAProxy's checks see ``name`` UP, then exit with ``result``; fail at ``timeout``
    saying what it is (``late``: how the message says it is not UP in time)."""
    present, status, check = _status(module, path, name)
    while status != "UP" and time.monotonic() - start < timeout:
        time.sleep(interval)
        present, status, check = _status(module, path, name)
    result.update(waited=round(time.monotonic() - start, 1), status=status, present=present)
    if status != "UP":
        module.fail_json(msg=f"front door server {name}{late}: it is {status or 'gone'}"
                             + (f" (last check {check})" if check else "")
                             + "; HAProxy sends it no request. DOWN: the instance fails its /health check "
                               "(see its journal).", **result)
    module.exit_json(**result)


def _wait_standby(module, path, backend, standby, timeout, interval, name):
    """Wait until one of ``standby`` (servers of ``backend``) is UP; fail naming their states when none comes UP."""
    start = time.monotonic()
    while True:
        servers = _servers(module, path)
        states = {s: (servers.get(f"{backend}/{s}") or {}).get("status", "missing") for s in standby}
        if any(v == "UP" for v in states.values()):
            return
        if time.monotonic() - start >= timeout:
            module.fail_json(msg=f"not draining {name}: none of the servers that would take its requests is UP "
                                 f"after {timeout} s (" + ", ".join(f"{s} is {v}" for s, v in sorted(states.items()))
                                 + "); draining it would leave the front door no server. Bring one of them back "
                                   "(its router and its front door) and re-run.")
        time.sleep(interval)


def _set(module, path, name, state):
    try:
        answer = runtime_command(path, f"set server {name} state {state}").strip()
    except OSError as exc:
        module.fail_json(msg=f"front door runtime API {path}: `set server {name} state {state}` failed: {exc}")
    if answer:
        module.fail_json(msg=f"front door runtime API {path}: `set server {name} state {state}` answered: {answer}")


def _sessions(module, path, name):
    """Requests the server runs through this front door now (HAProxy's scur)."""
    return (_servers(module, path).get(name) or {}).get("sessions_current", 0)


def _load(url):
    """Requests running or waiting on the instance, or None when it does not answer (nothing left to drain)."""
    try:
        response = open_url(url.rstrip("/") + "/metrics", timeout=5, validate_certs=False)
        return vllm_load(response.read().decode("utf-8", "replace"))
    except (URLError, OSError, ValueError):
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "default": "/run/inferops-vllm-frontdoor/admin.sock"},
            "backend": {"type": "str", "required": True},
            "server": {"type": "str", "required": True},
            "state": {"type": "str", "required": True, "choices": ["drain", "ready"]},
            "wait_url": {"type": "str"},
            "wait_sessions": {"type": "bool", "default": False},
            "standby": {"type": "list", "elements": "str", "default": []},
            "address": {"type": "str"},
            "port": {"type": "int"},
            "check": {"type": "dict", "options": {"inter": {"type": "str", "required": True},
                                                  "fall": {"type": "int", "required": True},
                                                  "rise": {"type": "int", "required": True}}},
            "timeout": {"type": "int", "default": 60},
            "interval": {"type": "float", "default": 1.0},
        },
        required_together=[("address", "port")],
        supports_check_mode=True,
    )
    path, state = module.params["socket"], module.params["state"]
    name = f"{module.params['backend']}/{module.params['server']}"
    timeout, interval = max(module.params["timeout"], 0), max(module.params["interval"], 0.1)
    result = {"changed": False, "present": False, "before": "", "status": "", "waited": 0.0}

    try:
        is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        module.exit_json(msg=f"no front door runs here ({path} is not a socket): nothing to {state}", **result)

    present, before, _check = _status(module, path, name)
    result.update(present=present, before=before, status=before)
    addable = state == "ready" and module.params["address"] and module.params["check"]
    if state == "ready":
        result["added"] = False
    if not present and not addable:
        module.exit_json(msg=f"the front door has no server {name}: nothing to {state}", **result)
    if not present:
        if module.params["backend"] not in _backends(module, path):
            module.exit_json(msg=f"the front door has no backend {module.params['backend']} yet (its reload brings "
                                 f"it): nothing to {state}", **result)
        result.update(changed=True, added=True)
        if module.check_mode:
            module.exit_json(msg=f"would add {name} to the running front door", **result)
        if not _add(module, path, name, module.params["address"], module.params["port"], module.params["check"]):
            result.update(changed=False, added=False)
            module.exit_json(msg=f"the front door has no backend {module.params['backend']}: nothing to {state}",
                             **result)
        _wait_up(module, path, name, time.monotonic(), timeout, interval, result,
                 f", added to the running front door, is not UP {timeout} s later")

    if state == "drain":
        result["changed"] = before != "DRAIN"
    else:
        result["changed"] = before.split(" ", maxsplit=1)[0] in _ADMIN_OUT
    want = None
    if state == "ready" and module.params["address"]:
        host = module.params["address"]
        want = f"[{host}]:{module.params['port']}" if ":" in host else f"{host}:{module.params['port']}"
        result["address_before"] = _address(module, path, name)
        result["moved"] = result["address_before"] != want
        result["changed"] = result["changed"] or result["moved"]
    if module.check_mode:
        module.exit_json(**result)
    if state == "drain" and result["changed"] and module.params["standby"]:
        _wait_standby(module, path, module.params["backend"], module.params["standby"], timeout, interval, name)
    if want and result["moved"]:
        _command(module, path, f"set server {name} addr {module.params['address']} port {module.params['port']}")
    if result["changed"] or state == "ready":
        _set(module, path, name, state)

    start = time.monotonic()
    if state == "drain":
        load = _load(module.params["wait_url"]) if module.params["wait_url"] else None
        while load and time.monotonic() - start < timeout:
            time.sleep(interval)
            load = _load(module.params["wait_url"])
        if not load and module.params["wait_sessions"]:
            load = _sessions(module, path, name)
            while load and time.monotonic() - start < timeout:
                time.sleep(interval)
                load = _sessions(module, path, name)
        result["drained"] = not load
        if load:
            module.warn(f"{module.params['server']} still had {load:g} request(s) after {timeout} s of draining; "
                        "it stops anyway and those requests fail")
        result.update(waited=round(time.monotonic() - start, 1), status=_status(module, path, name)[1])
        module.exit_json(**result)

    _wait_up(module, path, name, start, timeout, interval, result, f" is not UP {timeout} s after it was put back")


if __name__ == "__main__":
    main()
