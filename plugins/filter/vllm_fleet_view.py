# Apache License 2.0 (see LICENSE)
"""Filters for instances that span hosts: ``vllm_fleet_view`` (what the planner needs from the other
hosts), ``vllm_rank_groups`` (their ranks judged together) and ``vllm_rollout_plan`` (rollout batches
that keep their hosts together); see their .yml docs.

The logic lives in ``plugins/plugin_utils/fleet_view.py`` ``multinode.py`` and ``rollout.py``.
"""
from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


_READ = ("vllm_install_models_dir", "vllm_service_network_interface", "vllm_service_fast_interconnect",
         "vllm_service_host", "vllm_router_worker_address", "vllm_router_listen_port_base", "vllm_router_policy",
         "vllm_preflight_plan_options")


def vllm_fleet_view(hostvars, hosts, play_hosts=None, groups=None):
    """Inventory host -> in_play, groups, group_positions, addresses, interface, gpu_count, models_dir, ..."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.fleet_view import fleet_view  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS  # pylint: disable=import-outside-toplevel
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError(f"vllm_fleet_view: hosts must be a list of inventory host names, "
                                 f"got {type(hosts).__name__}")
    defaults = {name: PLAN_INPUTS[name][1] for name in _READ}
    return fleet_view(hostvars, list(hosts), list(play_hosts if play_hosts is not None else hosts), defaults,
                      groups=groups)


def vllm_rank_groups(reports):
    """Every multi-node instance judged from its ranks' reports; see vllm_rank_groups.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import rank_groups  # pylint: disable=import-outside-toplevel
    if not isinstance(reports, dict):
        raise AnsibleFilterError("vllm_rank_groups: the input must map inventory hosts to their rank reports, "
                                 f"got {type(reports).__name__}")
    try:
        return rank_groups(reports)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"vllm_rank_groups: a report is not as documented ({exc}); each host gives "
                                 "instances (its plan's), units (unit -> active, since) and queued") from exc


def vllm_rollout_plan(hostvars, order, batches=None, hosts=None, groups=None):  # pylint: disable=unused-argument
    """Rollout order and batch sizes that keep each instance spanning hosts in one batch, the units read from the hosts'
    plans (``vllm_preflight_plan``); see vllm_rollout_plan.yml. ``hosts`` and ``groups`` are accepted and not read
    (the plans resolved ``nodes`` already)."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.rollout import rollout_plan  # pylint: disable=import-outside-toplevel
    if not isinstance(order, (list, tuple)) or not all(isinstance(h, str) for h in order):
        raise AnsibleFilterError(f"vllm_rollout_plan: order must be a list of inventory host names, got {type(order).__name__}")
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(f"vllm_rollout_plan: the input must be hostvars, got {type(hostvars).__name__}")
    plans, unplanned = {}, []
    for host in order:
        plan = (hostvars.get(host) or {}).get("vllm_preflight_plan") if host in hostvars else None
        if isinstance(plan, Mapping) and isinstance(plan.get("instances"), list):
            plans[host] = plan
        else:
            unplanned.append(host)
    if unplanned:
        shown = ", ".join(unplanned[:5]) + (f" and {len(unplanned) - 5} more" if len(unplanned) > 5 else "")
        raise AnsibleFilterError(
            f"vllm_rollout_plan: {shown} {'has' if len(unplanned) == 1 else 'have'} no plan (vllm_preflight_plan) in "
            "this play: run the role inferops.vllm.vllm_preflight on every host of the order first; the batches "
            "keep the hosts of each instance that spans hosts together as their plans name them")
    try:
        return rollout_plan(plans, list(order), [1, "25%", "100%"] if batches is None else batches)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"vllm_rollout_plan: vllm_rollout_batches must be a list of host counts or "
                                 f"percentages such as [1, '25%', '100%'] ({exc})") from exc


class FilterModule:
    """The fleet view for multi-node instances."""

    def filters(self):
        return {"vllm_fleet_view": vllm_fleet_view, "vllm_rank_groups": vllm_rank_groups,
                "vllm_rollout_plan": vllm_rollout_plan}
