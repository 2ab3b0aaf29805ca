# Apache License 2.0 (see LICENSE)
"""Filters ``weights_models`` and ``weights_fanout``: what the vllm_weights role fetches, and from where.

The logic lives in ``plugins/plugin_utils/weights_plan.py``; these wrappers turn its
``WeightsPlanError`` into ``AnsibleFilterError``.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError


def weights_models(models, keys, host=None, models_dir="/var/lib/inferops/models", verify="size"):
    """The snapshots one host needs; see weights_models.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.weights_plan import WeightsPlanError, wanted_models  # pylint: disable=import-outside-toplevel
    try:
        return wanted_models(models, keys, host=host, models_dir=models_dir, verify=verify)
    except WeightsPlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def weights_fanout(wanted_by_host, host, fanout=False, source=None, hosts=None, models_dir=None, degree=0):
    """Where one host gets each snapshot (endpoint or another host); see weights_fanout.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.weights_plan import WeightsPlanError, fanout_plan  # pylint: disable=import-outside-toplevel
    if not isinstance(wanted_by_host, dict):
        raise AnsibleFilterError("weights_fanout: the input must be a dict host -> weights_models(...).models, got %s"
                                 % type(wanted_by_host).__name__)
    try:
        return fanout_plan(wanted_by_host, host, fanout=bool(fanout), source=source or None, hosts=hosts,
                           models_dir=models_dir, degree=degree)
    except WeightsPlanError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    """Model weights planning filters."""

    def filters(self):
        return {
            "weights_models": weights_models,
            "weights_fanout": weights_fanout,
        }
