"""The vllm_weights role's helper scripts against the hf_snapshot test Hub (fixtures shared with
tests/integration/hf_snapshot through hf_snapshot_helpers.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf_snapshot"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "roles", "vllm_weights", "files"))

from hf_snapshot_helpers import hub, repos, server  # noqa: E402  (fixtures)

__all__ = ["hub", "repos", "server"]
