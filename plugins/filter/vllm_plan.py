# Apache License 2.0 (see LICENSE)
"""Filter ``vllm_plan``: the plan of one host, the contract every later stage reads.

The logic lives in ``plugins/plugin_utils/host_plan.py``; this wrapper turns its errors into
``AnsibleFilterError``.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import (
    PlanContractError,
    build_plan,
)


def vllm_plan(models, instances, facts=None, inputs=None, host=None, fleet=None):
    """Normalise the inventory, place the instances, decide their units; see vllm_plan.yml."""
    try:
        return build_plan(models, instances, facts=facts, inputs=inputs, host=host, fleet=fleet)
    except PlanContractError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """The plan contract."""

    def filters(self):
        return {"vllm_plan": vllm_plan}
