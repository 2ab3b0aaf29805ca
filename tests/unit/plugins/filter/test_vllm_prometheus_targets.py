"""The vllm_prometheus_targets filter: file_sd target groups from real plans (the planner over recorded host facts)."""
from __future__ import annotations

import json
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.filter.vllm_prometheus_targets import vllm_prometheus_targets
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import build_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODELS = {"m": {"repo_id": "org/Model-7B", "revision": "0123456789abcdef0123456789abcdef01234567",
                "served_model_name": "model-7b"}}


def plan(shape, instances, **inputs):
    with open(os.path.join(ROOT, "tests", "unit", "data", "hosts", shape + ".json")) as fh:
        facts = json.load(fh)
    return build_plan(MODELS, instances, facts, inputs, host=shape)


SEED = plan("seed-8x-rtxpro6000", [{"name": "a", "model": "m", "tensor_parallel_size": 4, "numa_node": 0},
                                   {"name": "b", "model": "m", "tensor_parallel_size": 4, "numa_node": 1}],
            vllm_service_host="0.0.0.0")
L40S = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}])


def test_one_group_per_instance_with_the_plan_s_labels():
    out = vllm_prometheus_targets({"seed-1": {"plan": SEED, "address": "10.0.0.5", "vllm_version": "0.32.0"},
                                   "l40s-1": {"plan": L40S}})
    assert out["warnings"] == []
    groups = out["targets"]
    # hosts in name order, instances in plan order
    assert [g["labels"]["instance"] for g in groups] == ["l40s-1/c", "seed-1/a", "seed-1/b"]
    assert groups[1] == {"targets": ["10.0.0.5:8000"], "labels": {
        "instance": "seed-1/a", "host": "seed-1", "vllm_instance": "a", "unit": "vllm-a.service",
        "model": "model-7b", "repo_id": "org/Model-7B", "revision": "0123456789abcdef0123456789abcdef01234567",
        "gpus": "0,1,2,3", "numa_node": "0", "tensor_parallel_size": "4", "vllm_version": "0.32.0"}}
    assert groups[2]["targets"] == ["10.0.0.5:8001"] and groups[2]["labels"]["gpus"] == "4,5,6,7"
    # loopback-bound: the bind address; no version known
    assert groups[0]["targets"] == ["127.0.0.1:8000"] and groups[0]["labels"]["vllm_version"] == "unknown"
    # what Prometheus reads: every label value a string
    for group in groups:
        assert all(isinstance(v, str) for v in group["labels"].values())
    assert yaml.safe_load(yaml.safe_dump(groups)) == groups


def test_the_host_name_is_the_address_by_default_and_ipv6_is_bracketed():
    out = vllm_prometheus_targets({"seed-1": {"plan": SEED}})
    assert out["targets"][0]["targets"] == ["seed-1:8000"]
    v6 = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], vllm_service_host="::1")
    assert vllm_prometheus_targets({"h": {"plan": v6}})["targets"][0]["targets"] == ["[::1]:8000"]


def test_loopback_instances_on_another_host_than_prometheus_are_named():
    out = vllm_prometheus_targets({"seed-1": {"plan": SEED}, "l40s-1": {"plan": L40S}}, scraper="monitor-1")
    assert out["warnings"] == ["host l40s-1: instance 'c' binds 127.0.0.1, so the Prometheus on monitor-1 cannot "
                               "scrape it; set vllm_service_host to an address that host reaches"]
    assert vllm_prometheus_targets({"l40s-1": {"plan": L40S}}, scraper="l40s-1")["warnings"] == []


def test_headless_ranks_are_left_out():
    headless = json.loads(json.dumps(L40S))
    headless["instances"][0]["url"] = None
    assert vllm_prometheus_targets({"h": {"plan": headless}})["targets"] == []


@pytest.mark.parametrize("bad, text", [
    ([], "must be a dict"),
    ({"h": {}}, "host h: no plan"),
    ({"h": {"plan": {"schema": 1}}}, "host h: no plan"),
])
def test_bad_input_is_named(bad, text):
    with pytest.raises(AnsibleFilterError, match=text):
        vllm_prometheus_targets(bad)
