"""The preflight's disk check reads the free space in the host probe (one call with the systemd version, NUMA
nodes and online CPUs) and refuses a host whose models file system is too small, naming host, variable and fix,
with the plan's problems (before any host changes).
The real ansible-playbook on a local stand-in host (simulated GPUs)."""
from __future__ import annotations

import re

from test_refusal_corpus import ROLE_ONLY, Runner


def test_a_full_disk_is_refused_naming_the_host_the_variable_and_the_fix(tmp_path):
    runner = Runner(tmp_path)
    result = runner.run("disk", {"disk-node": {"vars": {"vllm_preflight_min_free_gib": 1e9}}}, ROLE_ONLY,
                        "--skip-tags", "vllm_preflight_health")
    assert result.rc != 0, result.tail()
    task, msg = result.failures["disk-node"]
    # reported with the plan's problems, in the one task that stops every host that cannot be planned
    assert "Stop on plan problems" in task and "Plan problems (nothing was changed)" in msg, (task, msg)
    msg = " ".join(msg.split())
    assert re.search(r"host disk-node: the file system of \S+ has [0-9.]+ GiB free, less than "
                     r"vllm_preflight_min_free_gib \(1000000000.0 GiB\); free space or lower it", msg), msg
    assert result.recap["disk-node"]["changed"] == 0


def test_enough_free_space_passes(tmp_path):
    runner = Runner(tmp_path)
    result = runner.run("disk", {"disk-node": {"vars": {"vllm_preflight_min_free_gib": 0.001}}}, ROLE_ONLY,
                        "--skip-tags", "vllm_preflight_health")
    assert result.rc == 0, result.tail()
