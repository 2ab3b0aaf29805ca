#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: router_worker
short_description: Take one vLLM instance out of a vllm-router and drain it, or put it back
version_added: 1.2.0
description:
  - Takes one instance (a worker) out of a router of the fleet (role C(inferops.vllm.vllm_router)) before it stops
    or restarts, or puts it back after its health gate, through vllm-router's worker API on the router's host
    (the router listens on loopback, so the module runs there, with C(delegate_to)). The service role's restart
    steps call it, as they call M(inferops.vllm.frontdoor_server) for the host's front door.
  - O(state=absent) reads C(GET /list_workers); a worker the router lists is removed with C(POST /remove_worker)
    (the router sends it no new request, requests it runs go on), then the module waits until the instance's own
    C(/metrics) at O(worker_url) shows no request running or waiting, or the instance no longer answers, or
    O(timeout) seconds passed (a warning; RV(drained) is false and the caller goes on).
  - O(state=present) adds a worker the router does not list (C(POST /add_worker); vllm-router checks the worker's
    health before it answers) and fails naming the router's answer when it refuses.
  - A router that does not answer (not deployed yet, or down) is not an error, there is nothing to take out or
    put back (RV(present) false); the router role starts it with the plan's workers.
  - In check mode the list is read and nothing is changed or waited for.
options:
  router_url:
    description: The router's loopback URL (the plan's C(router_workers[].router_url), C(http://127.0.0.1:18100)).
    type: str
    required: true
  worker_url:
    description: The instance as the router reaches it (the plan's C(router_workers[].worker_url)).
    type: str
    required: true
  state:
    description: C(absent) before a stop or restart, C(present) after the instance passed its health gate.
    type: str
    required: true
    choices: [absent, present]
  timeout:
    description: The longest wait in seconds (draining, or the router's answer to C(add_worker)).
    type: int
    default: 60
  interval:
    description: Seconds between two reads of the instance's metrics while draining.
    type: float
    default: 1.0
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Take solo out of the router of model tiny on gpu-a before it restarts
  inferops.vllm.router_worker:
    router_url: http://127.0.0.1:18100
    worker_url: http://10.0.0.6:8010
    state: absent
    timeout: 300
  delegate_to: gpu-a

- name: Put solo back after its health gate
  inferops.vllm.router_worker:
    router_url: http://127.0.0.1:18100
    worker_url: http://10.0.0.6:8010
    state: present
  delegate_to: gpu-a
"""

RETURN = r"""
present:
  description: Whether a router answered (false means there was nothing to do).
  returned: always
  type: bool
  sample: true
listed:
  description: Whether the router listed the worker before this call.
  returned: always
  type: bool
  sample: true
drained:
  description: With O(state=absent), whether the instance ran no request when the call ended.
  returned: when O(state=absent) and the worker was taken out
  type: bool
  sample: true
waited:
  description: Seconds the call waited for the instance to drain.
  returned: always
  type: float
  sample: 2.1
"""

import json
import time
from urllib.error import HTTPError, URLError
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import vllm_load


def _listed(router_url):
    """The workers the router lists, or None when it does not answer."""
    try:
        with open_url(router_url.rstrip("/") + "/list_workers", timeout=10) as resp:
            return list(json.loads(resp.read().decode("utf-8", "replace")).get("urls") or [])
    except (URLError, OSError, ValueError):
        return None


def _post(router_url, route, worker_url, timeout):
    """(status, answer) of the router's worker API."""
    try:
        with open_url(f"{router_url.rstrip('/')}/{route}?url={quote(worker_url, safe='')}", method="POST",
                      timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace").strip()
    except HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace").strip()
    except (URLError, OSError) as exc:
        return None, str(exc)


def _load(url):
    """Requests running or waiting on the instance, or None when it does not answer (nothing left to drain)."""
    try:
        with open_url(url.rstrip("/") + "/metrics", timeout=5, validate_certs=False) as resp:
            return vllm_load(resp.read().decode("utf-8", "replace"))
    except (URLError, OSError, ValueError):
        return None


def main():
    module = AnsibleModule(
        argument_spec={
            "router_url": {"type": "str", "required": True},
            "worker_url": {"type": "str", "required": True},
            "state": {"type": "str", "required": True, "choices": ["absent", "present"]},
            "timeout": {"type": "int", "default": 60},
            "interval": {"type": "float", "default": 1.0},
        },
        supports_check_mode=True,
    )
    router, worker, state = module.params["router_url"], module.params["worker_url"], module.params["state"]
    timeout, interval = max(module.params["timeout"], 1), max(module.params["interval"], 0.1)
    result = {"changed": False, "present": False, "listed": False, "waited": 0.0}

    listed = _listed(router)
    if listed is None:
        module.exit_json(msg=f"no router answers at {router}: nothing to {'take out' if state == 'absent' else 'put back'}",
                         **result)
    result.update(present=True, listed=worker in listed)
    result["changed"] = result["listed"] if state == "absent" else not result["listed"]
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)

    if state == "present":
        status, answer = _post(router, "add_worker", worker, timeout)
        if status != 200 and "already exists" not in answer:
            module.fail_json(msg=f"the router at {router} did not take {worker} back: "
                                 f"{status or 'no answer'} {answer[:300]}", **result)
        module.exit_json(**result)

    status, answer = _post(router, "remove_worker", worker, 10)
    if status != 200:
        module.fail_json(msg=f"the router at {router} did not take {worker} out: {status or 'no answer'} "
                             f"{answer[:300]}", **result)
    start = time.monotonic()
    load = _load(worker)
    while load and time.monotonic() - start < timeout:
        time.sleep(interval)
        load = _load(worker)
    result.update(drained=not load, waited=round(time.monotonic() - start, 1))
    if load:
        module.warn(f"{worker} still had {load:g} request(s) after {timeout} s out of the router; it stops anyway "
                    "and those requests fail")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
