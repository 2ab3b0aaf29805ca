# Apache License 2.0 (see LICENSE)
"""Filter ``vllm_service_specs``: what each vLLM instance's systemd unit contains.

The logic lives in ``plugins/plugin_utils/service_spec.py``; this wrapper turns its errors into
``AnsibleFilterError``.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import (
    ServiceSpecError,
    service_specs,
)


def vllm_service_specs(plan, models, **options):
    """Build the unit specs of every planned instance; see vllm_service_specs.yml."""
    try:
        return service_specs(plan, models, **options)
    except ServiceSpecError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    except TypeError as exc:
        raise AnsibleFilterError(f"vllm_service_specs: bad option: {exc}") from exc
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_service: {exc}") from exc


class FilterModule:
    """vLLM service filters."""

    def filters(self):
        return {"vllm_service_specs": vllm_service_specs}
