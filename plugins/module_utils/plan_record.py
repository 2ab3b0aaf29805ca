# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""The plan a host was configured from, as the service stage records it (``<config_dir>/plan.json``).

One place for where the record lives (the plan's ``paths.plan_file`` and ``gpu_facts``' read of it both come
from here) and for what the next plan reads back from it: its ``slots``, what the recorded plan gave each instance
automatically (the HTTP port, the ``VLLM_PORT`` base, the GPUs), so that the next plan keeps them
(``plugin_utils/placement.kept_slots``).
"""
from __future__ import annotations

import json
import os

DEFAULT_CONFIG_DIR = "/etc/inferops/vllm"
PLAN_FILE_NAME = "plan.json"
#: a recorded plan larger than this is not read for its slots (a plan of a few hundred instances is far smaller)
MAX_PLAN_BYTES = 16 * 1024 * 1024


def plan_file(config_dir=None):
    """The path of the recorded plan under ``config_dir`` (the default one when None or empty)."""
    return (str(config_dir or DEFAULT_CONFIG_DIR)).rstrip("/") + "/" + PLAN_FILE_NAME


def read_slots(path):
    """The ``slots`` of the recorded plan at ``path``: a dict, empty when there is no record or it cannot be read
    (not a file, too large, not JSON, no ``slots``). Never raises: a missing or broken record only means the next
    plan works every port and GPU out afresh."""
    try:
        if os.path.getsize(path) > MAX_PLAN_BYTES:
            return {}
        with open(path, encoding="utf-8") as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        return {}
    slots = recorded.get("slots") if isinstance(recorded, dict) else None
    return slots if isinstance(slots, dict) else {}
