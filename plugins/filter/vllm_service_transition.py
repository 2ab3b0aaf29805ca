# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""Filters ``vllm_service_transition`` (the ordered stops and restarts of one host's service stage) and
``vllm_router_waves`` (those steps padded so that hosts take a router's workers out one host at a time).

The logic lives in ``plugins/plugin_utils/transition.py``; this wrapper parses the live probe and the
recorded plan and never raises on what the host said (a plan.json that does not parse is no plan).
"""
from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError


def _recorded(value):
    if isinstance(value, dict):
        return value
    try:
        loaded = json.loads(value) if isinstance(value, (str, bytes)) and value else None
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


def vllm_service_transition(plan, live, restart, recorded=None, prune=True):
    """The transition from what the host runs (``live``: the probe's text) to ``plan``; see the .yml docs."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.transition import parse_live, plan_transition  # pylint: disable=import-outside-toplevel
    if not isinstance(plan, dict) or not isinstance(plan.get("instances"), list):
        raise AnsibleFilterError("vllm_service_transition: the input must be the plan (vllm_preflight_plan)")
    return plan_transition(parse_live(live if isinstance(live, str) else ""), plan["instances"],
                           [str(n) for n in restart or []], recorded=_recorded(recorded), plan=plan,
                           prune=bool(prune))


def vllm_router_waves(steps_by_host, hosts):
    """Each host's transition steps, padded so that no two hosts take a worker of the same router out at once."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.transition import align_router_waves  # pylint: disable=import-outside-toplevel
    if not isinstance(steps_by_host, dict) or not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError("vllm_router_waves: the input must map the play's hosts to their transition steps, "
                                 "and hosts must be the play's hosts in order")
    return align_router_waves({str(h): list(v or []) for h, v in steps_by_host.items()}, [str(h) for h in hosts])


class FilterModule:
    """Transition filters."""

    def filters(self):
        return {"vllm_service_transition": vllm_service_transition, "vllm_router_waves": vllm_router_waves}
