# Apache License 2.0 (see LICENSE)
"""Filters that check and resolve the inventory's model and instance declarations.

``vllm_inventory_problems`` returns the problems of the one normalisation
(``plugins/plugin_utils/inventory.py``): one sentence per problem, each naming the host, the variable
and the fix. ``vllm_instances_resolved`` merges each instance with what the planner needs to know about
its model. ``vllm_cpu_plan`` plans a host without GPUs through the placement planner. The preflight
role uses the ``vllm_plan`` filter, which runs all of these once.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import PlanError, plan

# model facts the placement planner uses when they are known
PLANNER_MODEL_KEYS = ("weights_bytes", "num_attention_heads", "num_key_value_heads")


def vllm_inventory_problems(models, instances, host=None):
    """Return a list of problems (empty when the declarations are consistent)."""
    return normalise(models, instances, host=host)["problems"]


def vllm_instances_resolved(instances, models):
    """Instances with their model's planner facts (weights_bytes, heads) filled in where unset."""
    if not isinstance(instances, list) or not isinstance(models, dict):
        raise AnsibleFilterError("vllm_instances_resolved expects a list of instances and a dict of models")
    out = []
    for inst in instances:
        merged = dict(inst)
        model = models.get(inst.get("model"), {}) or {}
        for key in PLANNER_MODEL_KEYS:
            if merged.get(key) is None and model.get(key) is not None:
                merged[key] = model[key]
        out.append(merged)
    return out


def vllm_cpu_plan(instances, host=None, base_port=8000, unit_prefix="vllm-"):
    """Plan for a CPU-only host: the planner's checks (names, ports) with no GPU pinning and no footprint."""
    try:
        return plan([], instances, host=host, base_port=base_port, unit_prefix=unit_prefix, cpu_only=True)
    except PlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """Inventory checks for inferops.vllm."""

    def filters(self):
        return {
            "vllm_inventory_problems": vllm_inventory_problems,
            "vllm_instances_resolved": vllm_instances_resolved,
            "vllm_cpu_plan": vllm_cpu_plan,
        }
