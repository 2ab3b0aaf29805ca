"""The fleet view from real network facts, and the ranks of multi-node instances judged together."""
from __future__ import annotations

import copy
import json
import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.filter.vllm_fleet_view import vllm_fleet_view, vllm_rank_groups
from ansible_collections.inferops.vllm.plugins.plugin_utils.fleet_view import interface_addresses
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import build_plan

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "ansible-facts")
SHA = "5e1f00d0c0ffee0000000000000000000000cafe"
MODELS = {"tiny": {"repo_id": "inferops-test/tiny-llama", "revision": SHA, "served_model_name": "tiny"}}
DUO = {"name": "duo", "model": "tiny", "nodes": {"group": "pair", "count": 2}, "tensor_parallel_size": 1,
       "pipeline_parallel_size": 2, "numa_node": 0}


def network_facts(name, address=None):
    """Real ``setup`` network facts (captured), optionally moved to another eth0 address."""
    with open(os.path.join(FIXTURES, name)) as fh:
        facts = json.load(fh)
    if address:
        facts = copy.deepcopy(facts)
        facts["eth0"]["ipv4"]["address"] = address
    return facts


GPUS = [{"index": i, "numa_node": i // 2, "memory_total_mib": 23034, "memory_reserved_mib": 0,
         "uuid": f"GPU-{i}", "cpu_affinity": str(i // 2)} for i in range(4)]


def hostvars_of(*hosts, **extra):
    out = {}
    for pos, host in enumerate(hosts):
        facts = network_facts("network-debian12-controller.json", f"192.0.2.{pos + 10}")
        facts["gpus"] = GPUS
        out[host] = {"ansible_facts": facts, "group_names": ["pair", "vllm_nodes"], "vllm_instances": [DUO],
                     "vllm_models": MODELS, "vllm_service_network_interface": "eth0"}
        out[host].update(extra.get(host, {}))
    return out


def test_interface_addresses_of_real_facts_skip_link_local():
    facts = network_facts("network-debian12-controller.json")
    addrs = interface_addresses(facts)
    assert addrs["eth0"] == [{"address": "192.0.2.2", "prefix": "24"}, {"address": "fd00::2", "prefix": "64"}]
    assert addrs["lo"][0] == {"address": "127.0.0.1", "prefix": "8"}
    assert "ifb0" not in addrs  # no address


def test_interface_names_with_dashes_are_read_from_their_fact_key():
    ipv4 = {"address": "10.1.0.2", "netmask": "255.255.0.0"}
    facts = {"interfaces": ["br-lan"], "br_lan": {"device": "br-lan", "ipv4": ipv4}}
    assert interface_addresses(facts) == {"br-lan": [{"address": "10.1.0.2", "prefix": "16"}]}


def test_fleet_view_entries_and_defaults():
    hv = hostvars_of("a", "b")
    del hv["b"]["vllm_service_network_interface"]
    view = vllm_fleet_view(hv, ["a", "b", "c"], ["a", "b"])
    assert list(view) == ["a", "b", "c"]
    assert view["a"]["in_play"] and not view["c"]["in_play"]
    assert view["a"]["gpu_count"] == 4 and view["c"]["gpu_count"] == 0
    assert view["a"]["models_dir"] == "/var/lib/inferops/models"  # the plan input's default
    assert view["b"]["interface"] == "" and view["a"]["fast_interconnect"] is False
    assert view["a"]["addresses"]["eth0"][0] == {"address": "192.0.2.10", "prefix": "24"}
    with pytest.raises(AnsibleFilterError, match="hosts must be a list"):
        vllm_fleet_view(hv, "a,b")


def test_the_plan_of_each_rank_from_the_fleet_view():
    hv = hostvars_of("mn-0", "mn-1")
    fleet = vllm_fleet_view(hv, ["mn-0", "mn-1"], ["mn-0", "mn-1"])
    facts = {"gpus": GPUS, "gpu_links": {}, "systemd_version": 252, "kernel_numa_nodes": [0], "online_cpus": "0-1"}
    inputs = {"vllm_service_network_interface": "eth0", "vllm_service_host": "0.0.0.0"}
    plans = {h: build_plan(MODELS, [DUO], facts, inputs, host=h, fleet=fleet) for h in ("mn-0", "mn-1")}
    first, second = (plans[h]["instances"][0]["multinode"] for h in ("mn-0", "mn-1"))
    assert first["master_addr"] == second["master_addr"] == "192.0.2.10"
    assert (first["node_rank"], second["node_rank"]) == (0, 1)
    assert second["address"] == "192.0.2.11" and second["peers"] == ["192.0.2.10"]
    assert plans["mn-1"]["instances"][0]["url"] is None and plans["mn-0"]["instances"][0]["url"]


def test_a_rank_without_the_interface_is_refused_naming_it():
    hv = hostvars_of("mn-0", "mn-1")
    hv["mn-1"]["ansible_facts"]["interfaces"] = ["lo"]
    fleet = vllm_fleet_view(hv, ["mn-0", "mn-1"], ["mn-0", "mn-1"])
    facts = {"gpus": GPUS, "gpu_links": {}, "systemd_version": 252, "kernel_numa_nodes": [0], "online_cpus": "0-1"}
    with pytest.raises(Exception, match="mn-1"):
        build_plan(MODELS, [DUO], facts, {"vllm_service_network_interface": "eth0"}, host="mn-0", fleet=fleet)


# --------------------------------------------------------------------------- the ranks judged together

def inst(rank, hosts=("h0", "h1"), name="duo"):
    return {"name": name, "unit": f"vllm-{name}.service",
            "multinode": {"node_rank": rank, "hosts": list(hosts), "nnodes": len(hosts)}}


def reports(states, queued=None, hosts=("h0", "h1")):
    """states: host -> (active, since)."""
    return {h: {"instances": [inst(hosts.index(h), hosts)],
                "units": {"vllm-duo.service": {"active": states[h][0], "since": states[h][1]}},
                "queued": (queued or {}).get(h, [])} for h in states}


def test_a_healthy_group_is_left_alone():
    (grp,) = vllm_rank_groups(reports({"h0": (True, 200), "h1": (True, 150)}))
    assert grp["key"] == "duo@h0" and grp["hosts"] == ["h0", "h1"]
    assert grp["broken"] == [] and grp["restart"] is False and grp["answer"] is None


def test_a_headless_rank_restarted_after_rank_0_breaks_the_group():
    (grp,) = vllm_rank_groups(reports({"h0": (True, 200), "h1": (True, 260)}))
    assert grp["restart"] and grp["broken"] == [
        "rank 1 (vllm-duo.service on h1) restarted after rank 0 started, so it is not in rank 0's group"]


def test_a_headless_rank_newer_than_a_rank_0_that_answers_is_in_its_group():
    """rank 0 restarted (systemd, or the watchdog): the headless rank lost it, restarted later and joined."""
    rep = reports({"h0": (True, 200), "h1": (True, 260)})
    rep["h0"]["answers"] = {"duo": 200}
    (grp,) = vllm_rank_groups(rep)
    assert grp["broken"] == [] and grp["restart"] is False and grp["answer"] == 200
    for no_answer in (-1, 503):  # no completion within the deadline, or an error: the order decides again
        rep["h0"]["answers"] = {"duo": no_answer}
        (grp,) = vllm_rank_groups(rep)
        assert grp["restart"] and grp["answer"] == no_answer and "restarted after rank 0 started" in grp["broken"][0]
    # an answer does not hide a dead rank
    rep = reports({"h0": (True, 200), "h1": (False, 0)})
    rep["h0"]["answers"] = {"duo": 200}
    (grp,) = vllm_rank_groups(rep)
    assert grp["restart"] and grp["broken"] == ["rank 1 (vllm-duo.service on h1) is not active"]


def test_a_dead_rank_breaks_the_group():
    (grp,) = vllm_rank_groups(reports({"h0": (True, 200), "h1": (False, 0)}))
    assert grp["restart"] and grp["broken"] == ["rank 1 (vllm-duo.service on h1) is not active"]
    (grp,) = vllm_rank_groups(reports({"h0": (False, 0), "h1": (True, 100)}))
    assert grp["restart"] and grp["broken"] == ["rank 0 (vllm-duo.service on h0) is not active"]


def test_a_change_on_one_rank_restarts_the_whole_group():
    (grp,) = vllm_rank_groups(reports({"h0": (True, 200), "h1": (True, 150)}, queued={"h1": ["duo"]}))
    assert grp["restart"] and grp["queued"] == ["h1"] and grp["broken"] == []


def test_a_rank_missing_from_the_run_is_incomplete_and_not_restarted():
    (grp,) = vllm_rank_groups(reports({"h0": (False, 0)}))
    assert grp["incomplete"] == ["h1"] and grp["restart"] is False


def test_two_groups_of_one_name_on_other_hosts_stay_apart_and_single_host_instances_are_ignored():
    rep = reports({"h0": (True, 1), "h1": (True, 1)})
    rep.update(reports({"h2": (True, 1), "h3": (True, 9)}, hosts=("h2", "h3")))
    rep["h0"]["instances"].append({"name": "solo", "unit": "vllm-solo.service"})
    groups = vllm_rank_groups(rep)
    assert [g["key"] for g in groups] == ["duo@h0", "duo@h2"]
    assert [g["restart"] for g in groups] == [False, True]


def test_a_malformed_report_names_what_is_expected():
    with pytest.raises(AnsibleFilterError, match="instances"):
        vllm_rank_groups({"h0": {"instances": [{"name": "x", "multinode": {"hosts": ["h0"]}}]}})
    with pytest.raises(AnsibleFilterError, match="must map inventory hosts"):
        vllm_rank_groups([])
