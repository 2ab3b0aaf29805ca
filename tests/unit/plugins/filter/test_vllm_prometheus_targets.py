"""The vllm_prometheus_targets filter: file_sd target groups from real plans (the planner over recorded host facts)."""
from __future__ import annotations

import json
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.filter.vllm_prometheus_targets import vllm_prometheus_targets
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
MODELS = {"m": {"repo_id": "org/Model-7B", "revision": "0123456789abcdef0123456789abcdef01234567",
                "served_model_name": "model-7b"}}


def plan(shape, instances, models=None, **inputs):
    with open(os.path.join(ROOT, "tests", "unit", "data", "hosts", shape + ".json")) as fh:
        facts = json.load(fh)
    return build_plan(models or MODELS, instances, facts, inputs, host=shape)


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


# --------------------------------------------------------------------------- the front doors' metrics listener

FD_MODELS = {"m": dict(MODELS["m"], frontdoor_port=9000),
             "n": {"repo_id": "org/Other", "revision": MODELS["m"]["revision"], "frontdoor_port": 9001}}


FD_SEED = plan("seed-8x-rtxpro6000", [{"name": "a", "model": "m", "tensor_parallel_size": 4, "numa_node": 0},
                                      {"name": "b", "model": "n", "tensor_parallel_size": 4, "numa_node": 1}],
               FD_MODELS, vllm_service_host="0.0.0.0")
FD_L40S = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}, {"name": "d", "model": "m"}], FD_MODELS)


def test_one_front_door_group_per_host_after_every_instance_group():
    hosts = {"seed-1": {"plan": FD_SEED, "address": "10.0.0.5", "vllm_version": "0.32.0"}, "l40s-1": {"plan": FD_L40S}}
    out = vllm_prometheus_targets(hosts)
    groups = out["targets"]
    assert [g["labels"]["instance"] for g in groups] == [
        "l40s-1/c", "l40s-1/d", "seed-1/a", "seed-1/b", "l40s-1/_frontdoor", "seed-1/_frontdoor"]
    # the instance groups are those of plans without front doors: same targets, same labels, same order
    plain = {h: dict(e, plan={k: v for k, v in e["plan"].items() if k not in ("frontdoors", "frontdoor_metrics")})
             for h, e in hosts.items()}
    assert groups[:4] == vllm_prometheus_targets(plain)["targets"]
    assert groups[5] == {"targets": ["10.0.0.5:9101"], "labels": {
        "instance": "seed-1/_frontdoor", "host": "seed-1", "inferops_role": "frontdoor", "models": "m,n",
        "served_model_names": "model-7b,org/Other", "frontdoor_ports": "9000,9001"}}
    assert groups[4] == {"targets": ["127.0.0.1:9101"], "labels": {
        "instance": "l40s-1/_frontdoor", "host": "l40s-1", "inferops_role": "frontdoor", "models": "m",
        "served_model_names": "model-7b", "frontdoor_ports": "9000"}}
    for group in groups:
        assert all(isinstance(v, str) for v in group["labels"].values())
    assert yaml.safe_load(yaml.safe_dump(groups)) == groups


def test_the_front_door_target_is_its_bind_address_and_port():
    p = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], FD_MODELS, vllm_service_host="0.0.0.0",
             vllm_frontdoor_bind_address="::1", vllm_frontdoor_metrics_port=9200)
    assert vllm_prometheus_targets({"h": {"plan": p}})["targets"][-1]["targets"] == ["[::1]:9200"]
    p = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], FD_MODELS, vllm_frontdoor_bind_address="::")
    assert vllm_prometheus_targets({"h": {"plan": p, "address": "h.example"}})["targets"][-1]["targets"] == [
        "h.example:9101"]


def test_no_front_door_group_without_a_metrics_listener_or_front_door():
    off = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], FD_MODELS, vllm_frontdoor_metrics_port=0)
    assert off["frontdoors"] and off["frontdoor_metrics"] is None
    assert [g["labels"]["instance"] for g in vllm_prometheus_targets({"h": {"plan": off}})["targets"]] == ["h/c"]
    assert len(vllm_prometheus_targets({"h": {"plan": L40S}})["targets"]) == 1
    # a plan written before front doors had metrics (no frontdoor_metrics key): its instances only
    old = {k: v for k, v in FD_L40S.items() if k != "frontdoor_metrics"}
    assert len(vllm_prometheus_targets({"h": {"plan": old}})["targets"]) == 2


def test_a_loopback_front_door_on_another_host_than_prometheus_is_named():
    out = vllm_prometheus_targets({"l40s-1": {"plan": FD_L40S}}, scraper="monitor-1")
    assert out["warnings"][-1] == ("host l40s-1: the front doors' metrics listener binds 127.0.0.1, so the Prometheus "
                                   "on monitor-1 cannot scrape it; set vllm_frontdoor_bind_address to an address that "
                                   "host reaches")
    assert vllm_prometheus_targets({"seed-1": {"plan": FD_SEED}}, scraper="monitor-1")["warnings"] == []


def test_one_node_exporter_group_per_host_that_has_one_last_and_its_port_checked():
    ne = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], FD_MODELS, vllm_service_node_exporter_port=9100,
              vllm_frontdoor_bind_address="0.0.0.0")
    assert ne["node_exporter"] == {"bind_address": "0.0.0.0", "port": 9100, "url": "http://127.0.0.1:9100/metrics"}
    out = vllm_prometheus_targets({"l40s-1": {"plan": ne, "address": "10.0.0.7"}, "seed-1": {"plan": FD_SEED}},
                                  scraper="monitor-1")
    assert [g["labels"]["instance"] for g in out["targets"]][-3:] == [
        "l40s-1/_frontdoor", "seed-1/_frontdoor", "l40s-1/_node"]
    assert out["targets"][-1] == {"targets": ["10.0.0.7:9100"], "labels": {
        "instance": "l40s-1/_node", "host": "l40s-1", "inferops_role": "node"}}
    assert not any("node_exporter" in w for w in out["warnings"])
    # its own bind address, else the front doors', else vllm_service_host; loopback is named for a remote scraper
    lo = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], vllm_service_node_exporter_port=9100)
    assert lo["node_exporter"]["bind_address"] == "127.0.0.1"
    assert vllm_prometheus_targets({"h": {"plan": lo}}, scraper="monitor-1")["warnings"][-1] == (
        "host h: node_exporter binds 127.0.0.1, so the Prometheus on monitor-1 cannot scrape it; set "
        "vllm_service_node_exporter_bind_address to an address that host reaches")
    own = plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], vllm_service_node_exporter_port=9100,
               vllm_service_node_exporter_bind_address="::")
    assert vllm_prometheus_targets({"h": {"plan": own, "address": "h.example"}})["targets"][-1]["targets"] == [
        "h.example:9100"]
    assert L40S["node_exporter"] is None
    # a port another listener of the host uses is refused, naming it
    for port, what in ((9101, "the front doors' metrics listener"), (9000, "the front door of model 'm'"),
                       (8000, "the HTTP port of instance 'c'")):
        with pytest.raises(PlanContractError, match=f"vllm_service_node_exporter_port is {port}, which is {what}"):
            plan("l40s-4x-pcie", [{"name": "c", "model": "m"}], FD_MODELS, vllm_service_node_exporter_port=port)
