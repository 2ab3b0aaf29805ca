"""Fixtures of the hf_snapshot tests live in hf_snapshot_helpers.py (importable by name; conftest is not)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hf_snapshot_helpers import hub, repos, server  # noqa: E402  (fixtures)

__all__ = ["hub", "repos", "server"]
