"""Ansible loads every filter file of a collection, in every worker process, to resolve any one of its filters
(``Jinja2Loader.get_with_context``), and compiles the source each time. Loading the filter files must not import the
planner's code (``plugin_utils``, ``module_utils``): that cost 284 ms per worker (docs/fleet.md, "Fleet scale").
Each filter imports what it needs when it is called."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import BUILD

PROBE = """
import importlib, pkgutil, sys
import ansible_collections.inferops.vllm.plugins.filter as pkg
for _, name, ispkg in pkgutil.iter_modules(pkg.__path__, prefix=pkg.__name__ + "."):
    mod = importlib.import_module(name)
    mod.FilterModule().filters()
print("\\n".join(sorted(m for m in sys.modules
                         if m.startswith("ansible_collections.inferops.vllm.plugins.")
                         and (".plugin_utils" in m or ".module_utils" in m))))
"""


def test_loading_every_filter_file_imports_none_of_the_planner():
    out = subprocess.run([sys.executable, "-c", PROBE], env=dict(os.environ, PYTHONPATH=BUILD), capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == [], out.stdout


def test_a_filter_still_reaches_the_planner_when_called():
    probe = PROBE + """
from ansible_collections.inferops.vllm.plugins.filter.gpu_plan import gpu_plan_table
gpu_plan_table([])
print("after", "ansible_collections.inferops.vllm.plugins.plugin_utils.placement" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, PYTHONPATH=BUILD), capture_output=True,
                         text=True, check=True)
    assert out.stdout.split()[-2:] == ["after", "True"], out.stdout
