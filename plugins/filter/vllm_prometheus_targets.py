# Apache License 2.0 (see LICENSE)
"""Filter ``vllm_prometheus_targets``: Prometheus file_sd target groups of the planned instances and front doors.

The logic lives in ``plugins/plugin_utils/metrics_targets.py``.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def vllm_prometheus_targets(hosts, scraper=None):
    """Target groups of every host's planned instances and front doors; see vllm_prometheus_targets.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.metrics_targets import file_sd_targets  # pylint: disable=import-outside-toplevel
    try:
        return file_sd_targets(hosts, scraper=scraper)
    except (ValueError, KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"vllm_prometheus_targets: {exc}") from exc


class FilterModule:
    """Metrics targets."""

    def filters(self):
        return {"vllm_prometheus_targets": vllm_prometheus_targets}
