"""inventories/example: every host class validates and plans on a host of its shape.

The group_vars are read with ansible-inventory (the real merge), then checked with the same filters
site.yml uses: vllm_inventory_problems, vllm_instances_resolved and gpu_plan.
"""
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.inferops.vllm.plugins.filter.vllm_inventory import (
    vllm_instances_resolved,
    vllm_inventory_problems,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HOSTS = os.path.join(ROOT, "tests", "unit", "data", "hosts")
SHAPES = {
    "gpu-pcie-01.example.internal": "seed-8x-rtxpro6000.json",
    "gpu-hgx-01.example.internal": "h200-8x-nvlink.json",
    "gpu-l40s-01.example.internal": "l40s-4x-pcie.json",
}


@pytest.fixture(scope="module")
def hostvars():
    exe = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    out = subprocess.run([exe, "-i", os.path.join(ROOT, "inventories", "example"), "--list"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["_meta"]["hostvars"]


def test_every_host_validates(hostvars):
    assert len(hostvars) == 5
    for name, hv in hostvars.items():
        assert vllm_inventory_problems(hv["vllm_models"], hv.get("vllm_instances", []), host=name) == [], name


@pytest.mark.parametrize("host,shape", sorted(SHAPES.items()))
def test_gpu_hosts_plan_on_their_shape(hostvars, host, shape):
    with open(os.path.join(HOSTS, shape)) as fh:
        facts = json.load(fh)
    hv = hostvars[host]
    instances = vllm_instances_resolved(hv["vllm_instances"], hv["vllm_models"])
    result = plan(facts["gpus"], instances, facts.get("gpu_links"), host=host)
    assert len(result) == len(instances)
    if host.startswith("gpu-pcie"):
        # the seed case: two TP=4 instances, one per NUMA node
        assert [p["gpus"] for p in result] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert [p["numa_node"] for p in result] == [0, 1]
    if host.startswith("gpu-hgx"):
        assert result[0]["gpus"] == list(range(8)) and result[0]["link"].startswith("NV")


def test_cpu_only_host_plans_without_gpus(hostvars):
    hv = hostvars["cpu-01.example.internal"]
    assert hv["vllm_preflight_gpu"] is False and hv["vllm_install_variant"] == "cpu"
