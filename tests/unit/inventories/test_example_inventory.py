"""inventories/example: every host class validates and plans on a host of its shape.

The group_vars are read with ansible-inventory (the real merge), then checked with what site.yml runs:
the vllm_inventory_problems filter and the plan (build_plan, the vllm_plan filter's logic).
"""
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.inferops.vllm.plugins.filter.vllm_inventory import vllm_inventory_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS, build_plan

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
    inputs = {k: v for k, v in hv.items() if k in PLAN_INPUTS}
    result = build_plan(hv["vllm_models"], hv["vllm_instances"], facts, inputs, host=host)["instances"]
    assert len(result) == len(hv["vllm_instances"])
    if host.startswith("gpu-pcie"):
        # the seed case: two TP=4 instances, one per NUMA node
        assert [p["gpus"] for p in result] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert [p["numa_node"] for p in result] == [0, 1]
    if host.startswith("gpu-hgx"):
        assert result[0]["gpus"] == list(range(8)) and result[0]["link"].startswith("NV")


def test_cpu_only_host_plans_without_gpus(hostvars):
    hv = hostvars["cpu-01.example.internal"]
    assert hv["vllm_preflight_gpu"] is False and hv["vllm_install_variant"] == "cpu"
    inputs = {k: v for k, v in hv.items() if k in PLAN_INPUTS}
    plan = build_plan(hv["vllm_models"], hv["vllm_instances"], {"online_cpus": "0-63"}, inputs, host="cpu-01")
    assert plan["instances"] and all(i["gpus"] == [] for i in plan["instances"]) and plan["footprint"] is None
