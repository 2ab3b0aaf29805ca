#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: frontdoor_reload
short_description: Reload the HAProxy front door and keep the servers a run or an operator took out of rotation out
version_added: 1.2.0
description:
  - Reloads the front door (the C(inferops.vllm.vllm_frontdoor) role's unit) after its configuration changed. A
    reload starts a new HAProxy process from the configuration, where every server is C(ready); a server that was
    drained (C(DRAIN)) or put in maintenance (C(MAINT)) over the runtime API would get requests again, though its
    instance may be stopping, or down for maintenance.
  - Before the reload it reads every server's administrative state over the runtime API; after it, once the new
    process answers on the socket, it sets the same state on each server the new configuration still has (same
    backend, same server name), and reports the ones it no longer has. Only the state is carried over, never an
    address or a port (the configuration's are the plan's; HAProxy's C(server-state-file) would restore old ones).
  - No front door running (no socket at O(socket)) is a plain reload (nothing to carry over).
  - In check mode it reads the states and reports a change; it reloads nothing.
options:
  unit:
    description: The front door's systemd unit; the reload is C(systemctl reload <unit>).
    type: str
    required: true
  socket:
    description: The runtime API's UNIX socket (C(stats socket ... level admin) in the front door's configuration).
    type: path
    default: /run/inferops-vllm-frontdoor/admin.sock
  reload_argv:
    description: Another command that reloads the front door (for a front door that systemd does not run).
    type: list
    elements: str
  timeout:
    description: The longest wait in seconds for the new process to answer on the socket.
    type: int
    default: 30
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Reload the front door, keeping drained servers drained
  inferops.vllm.frontdoor_reload:
    unit: inferops-vllm-frontdoor.service
    socket: /run/inferops-vllm-frontdoor/admin.sock
"""

RETURN = r"""
kept:
  description: The servers whose administrative state was set again after the reload, with that state.
  returned: always
  type: list
  elements: dict
  sample: [{"server": "chat/alpha", "state": "drain"}]
gone:
  description: Servers that were out of rotation before the reload and that the new configuration no longer has.
  returned: always
  type: list
  elements: str
  sample: ["chat/beta"]
pid_before:
  description: The HAProxy worker's pid before the reload (0 when none answered).
  returned: always
  type: int
  sample: 4242
pid_after:
  description: The new worker's pid (0 in check mode or when none answered).
  returned: always
  type: int
  sample: 4311
"""

import os
import stat
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (
    admin_states,
    runtime_command,
    server_states,
    worker_pid,
)


def _read(path):
    """(pid, {server: admin state}) of the process answering on ``path``; (0, {}) when none does."""
    try:
        pid = worker_pid(runtime_command(path, "show info", timeout=5))
        return pid, admin_states(server_states(runtime_command(path, "show stat", timeout=5)))
    except (OSError, ValueError):
        return 0, {}


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "socket": {"type": "path", "default": "/run/inferops-vllm-frontdoor/admin.sock"},
            "reload_argv": {"type": "list", "elements": "str"},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    path = module.params["socket"]
    try:
        running = stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        running = False
    pid_before, saved = _read(path) if running else (0, {})
    result = {"changed": True, "kept": [], "gone": [], "pid_before": pid_before, "pid_after": 0}
    if module.check_mode:
        module.exit_json(**result)

    argv = module.params["reload_argv"] or ["systemctl", "reload", module.params["unit"]]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"{' '.join(argv)} failed ({rc}): {(err or out).strip()}", **result)
    if not pid_before:
        module.exit_json(**result)

    deadline = time.monotonic() + max(module.params["timeout"], 1)
    pid_after, now = _read(path)
    while (not pid_after or pid_after == pid_before) and time.monotonic() < deadline:
        time.sleep(0.2)
        pid_after, now = _read(path)
    result["pid_after"] = pid_after
    if not pid_after or pid_after == pid_before:
        module.fail_json(msg=f"the front door reloaded, but no new HAProxy process answered on {path} within "
                             f"{module.params['timeout']} s (still pid {pid_before}); servers that were out of "
                             f"rotation may be back in: {', '.join(sorted(saved)) or 'none'}", **result)
    try:
        servers = server_states(runtime_command(path, "show stat", timeout=5))
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"front door runtime API {path}: `show stat` failed after the reload: {exc}", **result)
    for name, state in sorted(saved.items()):
        if name not in servers:
            result["gone"].append(name)
            continue
        if now.get(name) == state:
            continue
        answer = runtime_command(path, f"set server {name} state {state}").strip()
        if answer:
            module.fail_json(msg=f"front door runtime API {path}: `set server {name} state {state}` answered: {answer}",
                             **result)
        result["kept"].append({"server": name, "state": state})
    module.exit_json(**result)


if __name__ == "__main__":
    main()
