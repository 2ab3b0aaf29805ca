# Apache License 2.0 (see LICENSE)
"""Filter ``vllm_service_units``: what the vllm_service templates render for each instance of the plan.

The logic lives in ``plugins/plugin_utils/service_spec.py`` (``unit_view``); this wrapper turns its
errors into ``AnsibleFilterError``.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def vllm_service_units(instances, python=None):
    """The unit view of every plan instance (interpreter of the resolved venv); see vllm_service_units.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import unit_view  # pylint: disable=import-outside-toplevel
    if not isinstance(instances, (list, tuple)):
        raise AnsibleFilterError("vllm_service_units: the input must be the plan's instances "
                                 f"(vllm_preflight_plan.instances), got {type(instances).__name__}")
    try:
        return [unit_view(i, python) for i in instances]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise AnsibleFilterError(f"vllm_service_units: {exc}; pass the instances of inferops.vllm.vllm_plan") from exc


class FilterModule:
    """vLLM service filters."""

    def filters(self):
        return {"vllm_service_units": vllm_service_units}
