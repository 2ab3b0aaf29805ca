# Apache License 2.0 (see LICENSE)
"""Filters of the rolling host maintenance (role vllm_maintenance, playbooks/maintenance.yml): its input checks, the
drain steps from a host's plan and the state metric; the logic is ``plugins/plugin_utils/maintenance.py``."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def vllm_maintenance_input_problems(values, host=None, cuda_build=""):
    """The maintenance inputs' checks of ``values`` (variable -> value), one sentence per problem; ``cuda_build``: the
    CUDA build of the host's vLLM, which a driver version must run."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.maintenance import input_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain  # pylint: disable=import-outside-toplevel
    return input_problems(plain(values), host, plain(cuda_build) or "")


def vllm_maintenance_steps(plan):
    """A host's plan -> one drain-and-stop step per instance, in the form vllm_service's tasks/step.yml reads."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.maintenance import drain_steps  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain  # pylint: disable=import-outside-toplevel
    plan = plain(plan)
    if not isinstance(plan, dict) or not isinstance(plan.get("instances"), list):
        raise AnsibleFilterError("vllm_maintenance_steps: pass a host's plan (vllm_preflight_plan), with its instances")
    return drain_steps(plan)


def vllm_maintenance_metric(state, host, since):
    """The node_exporter textfile of a host's maintenance ``state`` (entered at ``since``, seconds since the epoch)."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.maintenance import STATES, state_metrics  # pylint: disable=import-outside-toplevel
    if state not in STATES:
        raise AnsibleFilterError(f"vllm_maintenance_metric: state must be one of {', '.join(STATES)}, got {state!r}")
    return state_metrics(str(host), state, float(since))


class FilterModule:
    """Rolling host maintenance filters for inferops.vllm."""

    def filters(self):
        return {"vllm_maintenance_input_problems": vllm_maintenance_input_problems,
                "vllm_maintenance_steps": vllm_maintenance_steps,
                "vllm_maintenance_metric": vllm_maintenance_metric}
