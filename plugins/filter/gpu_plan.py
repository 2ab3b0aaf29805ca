# Apache License 2.0 (see LICENSE)
"""Filters ``gpu_plan`` and ``gpu_plan_table``: the GPU placement plan for vLLM instances.

The planning logic lives in ``plugins/plugin_utils/placement.py``; these are thin wrappers that turn
its ``PlanError`` into ``AnsibleFilterError``.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

# The planner is imported when a filter is called, not when the file is loaded: Ansible loads every filter file of
# the collection to resolve any one of its filters, in every worker process (see docs/fleet.md, "Fleet scale").


#: reserve_mib and tolerance_mib left out: the planner's defaults (a None given is still refused by the planner)
_DEFAULT = object()


def gpu_plan(gpus, instances, links=None, host=None, variable="vllm_instances",
             reserve_mib=_DEFAULT, tolerance_mib=_DEFAULT, unit_prefix="vllm-", use_uuids=True, base_port=8000):
    """Place vLLM instances on a host's GPUs; see gpu_plan.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import (  # pylint: disable=import-outside-toplevel
        DEFAULT_RESERVE_MIB, DEFAULT_TOLERANCE_MIB, PlanError, plan)
    reserve_mib = DEFAULT_RESERVE_MIB if reserve_mib is _DEFAULT else reserve_mib
    tolerance_mib = DEFAULT_TOLERANCE_MIB if tolerance_mib is _DEFAULT else tolerance_mib
    try:
        return plan(gpus, instances, links, host=host, variable=variable, reserve_mib=reserve_mib,
                    tolerance_mib=tolerance_mib, unit_prefix=unit_prefix, use_uuids=use_uuids,
                    base_port=base_port)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def gpu_plan_table(plan_entries, gpus=None):
    """Render a plan from gpu_plan as a fixed-width text table; see gpu_plan_table.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import format_table  # pylint: disable=import-outside-toplevel
    if not isinstance(plan_entries, (list, tuple)):
        raise AnsibleFilterError("gpu_plan_table: the input must be the list that inferops.vllm.gpu_plan returns, "
                                 f"got {type(plan_entries).__name__}")
    try:
        return format_table(plan_entries, gpus)
    except (TypeError, ValueError, AttributeError) as exc:
        raise AnsibleFilterError(f"gpu_plan_table: the input is not a plan from inferops.vllm.gpu_plan ({exc})") from exc


class FilterModule:
    """GPU placement filters."""

    def filters(self):
        return {
            "gpu_plan": gpu_plan,
            "gpu_plan_table": gpu_plan_table,
        }
