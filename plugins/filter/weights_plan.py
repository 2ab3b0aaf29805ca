# Apache License 2.0 (see LICENSE)
"""Filters ``weights_models``, ``weights_fanout`` and ``weights_adapter_problems``: what the vllm_weights role fetches,
from where, and whether a fetched LoRA adapter can serve.

The logic lives in ``plugins/plugin_utils/weights_plan.py``; these wrappers turn its
``WeightsPlanError`` into ``AnsibleFilterError``.
"""
from __future__ import annotations

import json

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


def weights_adapter_problems(items, configs, host=None):
    """Problems of the fetched adapters; see weights_adapter_problems.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.weights_plan import adapter_problems  # pylint: disable=import-outside-toplevel
    if not isinstance(items, list) or not isinstance(configs, dict):
        raise AnsibleFilterError("weights_adapter_problems: give the weights items (a list) and a dict item id -> "
                                 "the adapter_config.json text")
    problems = []
    for item in items:
        if not isinstance(item, dict) or not item.get("adapters"):
            continue
        text = configs.get(item["id"])
        if text is None:
            config = "was not read"
        else:
            try:
                config = json.loads(text)
            except ValueError:
                config = "is missing or not JSON" if not str(text).strip() else "is not JSON"
        problems.extend(adapter_problems(item, config, host))
    return problems


class FilterModule:
    """Model weights planning filters."""

    def filters(self):
        return {
            "weights_models": weights_models,
            "weights_fanout": weights_fanout,
            "weights_adapter_problems": weights_adapter_problems,
        }
