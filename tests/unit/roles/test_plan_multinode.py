"""Instances that span hosts (issue 13): the planner across hosts and the units' command lines.

Two of the seed's hosts (8 x RTX PRO 6000, GPUs 0-3 on NUMA node 0) serve one model with
pipeline_parallel_size 2 across the hosts and tensor_parallel_size 4 on each host's NUMA node 0.
Every host gets its own plan (``build_plan(..., host=h, fleet=...)``); the fleet view carries what
the planner needs from the other hosts. Then the refusals (unequal hosts, taken GPUs, a host not in
the play, different models_dir, no shared network, interface missing, TP across hosts without the
fast-interconnect flag, one node), the environment and a hypothesis property over N hosts.
"""
from __future__ import annotations

import ipaddress

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_plan import vllm_plan
from ansible_collections.inferops.vllm.plugins.filter.vllm_service_units import vllm_service_units
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import format_table
from systemd_unit import directives, environment, split_exec
from test_plan_contract import SHA, host_facts
from test_vllm_service_render import render

SEED = "seed-8x-rtxpro6000"
L40S = "l40s-4x-pcie"
PYTHON = "/opt/inferops/vllm/current/bin/python"
PATH = "/var/lib/inferops/models/MiniMaxAI/MiniMax-M2/current"
MODELS = {"minimax-m2": {"repo_id": "MiniMaxAI/MiniMax-M2", "revision": SHA, "served_model_name": "minimax-m2",
                         "max_model_len": 131072, "trust_remote_code": True}}
BIG = {"name": "m2", "model": "minimax-m2", "nodes": ["seed-1", "seed-2"], "tensor_parallel_size": 4,
       "pipeline_parallel_size": 2, "numa_node": 0, "gpu_memory_utilization": 0.92}
INPUTS = {"vllm_service_host": "0.0.0.0", "vllm_service_network_interface": "eth1"}


def gpu_count(shape):
    return len(host_facts(shape)["gpus"])


def fleet_of(hosts, shapes=None, iface="eth1", net="10.0.0.", **per_host):
    """The fleet view of hosts numbered from .5 on one /24; ``per_host``: host -> entry overrides."""
    shapes = shapes or {}
    fleet = {}
    for pos, name in enumerate(hosts):
        fleet[name] = {"in_play": True, "groups": ["gpu_nodes", "seed"], "interface": iface,
                       "addresses": {"lo": {"address": "127.0.0.1", "prefix": 8},
                                     iface: {"address": f"{net}{pos + 5}", "prefix": 24}},
                       "gpu_count": gpu_count(shapes.get(name, SEED)), "models_dir": "/var/lib/inferops/models"}
        fleet[name].update(per_host.get(name, {}))
    return fleet


def plan_of(host, instances=None, fleet=None, shape=SEED, inputs=None, models=None):
    inputs = dict(INPUTS, **(inputs or {}))
    if fleet is not None and host in fleet and "interface" in fleet[host]:
        inputs.setdefault("vllm_service_network_interface", fleet[host]["interface"])
    return build_plan(models or MODELS, [BIG] if instances is None else instances, host_facts(shape), inputs,
                      host=host, fleet=fleet_of(["seed-1", "seed-2"]) if fleet is None else fleet)


def refusal(host, **kwargs):
    with pytest.raises(PlanContractError) as err:
        plan_of(host, **kwargs)
    return str(err.value)


# --------------------------------------------------------------------------- the seed pair

def test_two_seed_hosts_pp2_tp4_on_numa_node_0():
    plans = {h: plan_of(h) for h in ("seed-1", "seed-2")}
    facts = host_facts(SEED)
    node0 = [g["index"] for g in facts["gpus"] if g["numa_node"] == 0]
    for rank, host in enumerate(("seed-1", "seed-2")):
        plan = plans[host]
        assert plan["schema"] == 1
        (inst,) = plan["instances"]
        assert inst["gpus"] == node0 == [0, 1, 2, 3] and inst["numa_node"] == 0
        assert inst["tensor_parallel_size"] == 4 and inst["pipeline_parallel_size"] == 2
        mn = inst["multinode"]
        assert mn == {"nnodes": 2, "node_rank": rank, "role": ["api", "headless"][rank], "headless": rank == 1,
                      "hosts": ["seed-1", "seed-2"], "addresses": ["10.0.0.5", "10.0.0.6"],
                      "master_addr": "10.0.0.5", "master_port": 29501, "address": f"10.0.0.{5 + rank}",
                      "interface": "eth1", "peers": [f"10.0.0.{6 - rank}"], "parallel": "pipeline",
                      "gpus_per_node": 4}
        # the footprint covers only this host's GPUs, at the instance's fraction
        assert plan["footprint"]["expected"] == [{"name": "m2", "gpus": [0, 1, 2, 3], "used_fraction": 0.92,
                                                  "tolerance_mib": 1024, "unit": "vllm-m2.service"}]
    assert plans["seed-1"]["instances"][0]["url"] == "http://127.0.0.1:8000"
    assert plans["seed-2"]["instances"][0]["url"] is None


def test_rank_0_and_headless_argv_exactly():
    api = plan_of("seed-1")["instances"][0]
    headless = plan_of("seed-2")["instances"][0]
    common = ["--model", PATH, "--served-model-name", "minimax-m2", "--tensor-parallel-size", "4",
              "--pipeline-parallel-size", "2", "--gpu-memory-utilization", "0.92"]
    tail = ["--max-model-len", "131072", "--trust-remote-code", "--shutdown-timeout", "30"]
    launcher = ["--nnodes", "2", "--node-rank", "{rank}", "--master-addr", "10.0.0.5", "--master-port", "29501",
                "--distributed-executor-backend", "mp"]
    assert api["argv"] == ([PYTHON, "-m", "vllm.entrypoints.openai.api_server"] + common
                           + ["--host", "0.0.0.0", "--port", "8000"] + tail
                           + [a.format(rank=0) for a in launcher])
    assert headless["argv"] == ([PYTHON, "-m", "vllm.entrypoints.cli.main", "serve"] + common + tail
                                + [a.format(rank=1) for a in launcher] + ["--headless"])


def test_each_rank_has_its_address_and_the_interface_in_the_environment():
    for rank, host in enumerate(("seed-1", "seed-2")):
        env = dict(plan_of(host)["instances"][0]["environment"])
        assert env["VLLM_HOST_IP"] == f"10.0.0.{5 + rank}"
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth1"
        assert env["CUDA_VISIBLE_DEVICES"].count(",") == 3


def test_the_units_run_the_plan_headless_included(tmp_path):
    for host in ("seed-1", "seed-2"):
        inst = plan_of(host)["instances"][0]
        unit = vllm_service_units([inst])[0]
        text = render("vllm-instance.service.j2", {"vllm_service_spec": unit, "vllm_service__systemd_version": 252,
                                                   "vllm_service__idle_max_mib": 256}, str(tmp_path / host))
        assert split_exec(directives(text)["ExecStart"][0]) == inst["argv"]
        assert environment(text)["VLLM_HOST_IP"] == inst["multinode"]["address"]


def test_the_plan_table_shows_hosts_and_ranks():
    gpus = host_facts(SEED)["gpus"]
    api = format_table(plan_of("seed-1")["instances"], gpus).splitlines()
    headless = format_table(plan_of("seed-2")["instances"], gpus).splitlines()
    assert api[0].split()[-2:] == ["RANK", "HOSTS"]
    assert api[2].split()[-3:] == ["0/2", "api", "seed-1,seed-2"] and " 8000 " in api[2]
    assert headless[2].split()[-3:] == ["1/2", "headless", "seed-1,seed-2"] and " 8000 " not in headless[2]


def test_group_and_count_pick_the_group_s_first_hosts_in_inventory_order():
    inst = dict(BIG, nodes={"group": "gpu_nodes", "count": 2})
    fleet = fleet_of(["seed-1", "seed-2", "seed-3"])
    fleet["seed-3"]["groups"] = ["seed"]
    assert plan_of("seed-2", [inst], fleet)["instances"][0]["multinode"]["hosts"] == ["seed-1", "seed-2"]
    # a host the instance does not span does not have it in its plan
    assert plan_of("seed-3", [inst], fleet)["instances"] == []
    text = refusal("seed-1", instances=[dict(BIG, nodes={"group": "gpu_nodes", "count": 3})], fleet=fleet)
    assert "nodes asks for 3 hosts of group 'gpu_nodes' but the inventory has 2 (seed-1, seed-2)" in text


def test_single_host_instances_next_to_a_multinode_one_keep_their_plan():
    small = {"name": "small", "model": "minimax-m2", "tensor_parallel_size": 4, "numa_node": 1, "port": 8100,
             "vllm_port": 21000}
    alone = build_plan(MODELS, [small], host_facts(SEED), INPUTS, host="seed-1")
    both = plan_of("seed-1", [BIG, small])
    assert both["instances"][1] == alone["instances"][0]
    assert "multinode" not in both["instances"][1]
    # no instance with nodes: the fleet view changes nothing
    assert build_plan(MODELS, [small], host_facts(SEED), INPUTS, host="seed-1", fleet=fleet_of(["seed-1"])) == alone


def test_cpu_only_hosts_span_hosts_without_gpus():
    fleet = fleet_of(["cpu-1", "cpu-2"], **{h: {"gpu_count": 0} for h in ("cpu-1", "cpu-2")})
    inst = dict(BIG, nodes=["cpu-1", "cpu-2"], tensor_parallel_size=1, numa_node="auto")
    for rank, host in enumerate(("cpu-1", "cpu-2")):
        plan = build_plan(MODELS, [inst], {"systemd_version": 252, "online_cpus": "0-3"},
                          dict(INPUTS, vllm_preflight_gpu=False), host=host, fleet=fleet)
        got = plan["instances"][0]
        assert got["gpus"] == [] and plan["footprint"] is None
        assert got["multinode"]["node_rank"] == rank
        assert "CUDA_VISIBLE_DEVICES" not in dict(got["environment"])
        assert ("--headless" in got["argv"]) == bool(rank)


def test_tensor_across_hosts_needs_the_fast_interconnect_flag():
    inst = dict(BIG, nodes_parallel="tensor", tensor_parallel_size=8, pipeline_parallel_size=1)
    text = refusal("seed-1", instances=[inst])
    assert "vllm_service_fast_interconnect is not true on seed-1, seed-2" in text
    fleet = fleet_of(["seed-1", "seed-2"], **{h: {"fast_interconnect": True} for h in ("seed-1", "seed-2")})
    plan = plan_of("seed-2", [inst], fleet, inputs={"vllm_service_fast_interconnect": True})
    got = plan["instances"][0]
    assert got["gpus"] == [0, 1, 2, 3] and got["multinode"]["gpus_per_node"] == 4
    assert got["argv"][got["argv"].index("--tensor-parallel-size") + 1] == "8"
    assert got["argv"][got["argv"].index("--pipeline-parallel-size") + 1] == "1"
    # the head counts are checked against the whole tensor-parallel group, not this host's share
    text = refusal("seed-1", instances=[dict(inst, num_attention_heads=12)], fleet=fleet,
                   inputs={"vllm_service_fast_interconnect": True})
    assert "tensor_parallel_size 8 does not divide num_attention_heads 12" in text


# --------------------------------------------------------------------------- refusals

def test_pipeline_size_must_cover_the_hosts():
    text = refusal("seed-1", instances=[dict(BIG, pipeline_parallel_size=1)])
    assert "vllm_instances[0] (m2): nodes_parallel is 'pipeline' over 2 hosts" in text
    assert "set pipeline_parallel_size: 2" in text and "host seed-1" in text


def test_one_node_says_drop_nodes():
    text = refusal("seed-1", instances=[dict(BIG, nodes=["seed-1"], pipeline_parallel_size=1)])
    assert "nodes names one host (seed-1)" in text and "drop nodes" in text


def test_a_host_not_in_the_play_or_not_in_the_inventory():
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"in_play": False}})
    text = refusal("seed-1", fleet=fleet)
    assert "nodes names 'seed-2' (rank 1), which is not in this play" in text
    text = refusal("seed-1", instances=[dict(BIG, nodes=["seed-1", "seed-9"])])
    assert "nodes names 'seed-9' (rank 1), which is not in the inventory" in text


def test_unequal_hosts_mixed_host_classes():
    # the seed's 8-GPU host with a 4-GPU L40S host: TP=4 per host fits both
    fleet = fleet_of(["seed-1", "l40s-1"], shapes={"l40s-1": L40S})
    inst = dict(BIG, nodes=["seed-1", "l40s-1"], numa_node="auto")
    a = plan_of("seed-1", [inst], fleet)["instances"][0]
    b = plan_of("l40s-1", [inst], fleet, shape=L40S)["instances"][0]
    assert len(a["gpus"]) == len(b["gpus"]) == 4
    # TP=8 per host: the 4-GPU host cannot hold its share, and the 8-GPU host refuses too
    wide = dict(inst, tensor_parallel_size=8)
    text = refusal("seed-1", instances=[wide], fleet=fleet)
    assert "host l40s-1 (rank 1 of vllm_instances[0] (m2)) has 4 GPUs but every rank of this instance needs 8" in text
    text = refusal("l40s-1", instances=[wide], fleet=fleet, shape=L40S)
    assert "needs 8 GPUs but this host has 4 GPUs" in text


def test_unequal_per_host_gpu_counts_between_the_ranks_definitions():
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"instances": [dict(BIG, tensor_parallel_size=2)]}})
    text = refusal("seed-1", fleet=fleet)
    assert "host seed-2 (rank 1 of vllm_instances[0] (m2)): unequal per-host GPU counts" in text
    assert "gives 2 GPUs per host, this host's gives 4" in text
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"instances": []}})
    assert "its vllm_instances has no instance 'm2'" in refusal("seed-1", fleet=fleet)
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"instances": [BIG]}})
    assert plan_of("seed-1", fleet=fleet)["instances"][0]["multinode"]["node_rank"] == 0


def test_taken_gpus_refuse_on_the_host_that_has_them():
    taken = {"name": "other", "model": "minimax-m2", "tensor_parallel_size": 4, "numa_node": 0}
    elsewhere = dict(BIG, name="elsewhere", nodes=["seed-3", "seed-4"])
    fleet = fleet_of(["seed-1", "seed-2", "seed-3", "seed-4"])
    text = refusal("seed-2", instances=[elsewhere, taken, BIG], fleet=fleet)
    # named by its inventory position (the other hosts' instance is not in this host's plan)
    assert "host seed-2" in text and "vllm_instances[2] 'm2' (rank 1 of 2 hosts" in text
    assert "numa_node" in text and "by 'other'" in text
    # the multi-node instance takes part in placement: an explicit group on its GPUs is refused too
    text = refusal("seed-1", instances=[BIG, dict(taken, numa_node="auto", gpus=[0, 1, 2, 3])])
    assert "host seed-1" in text and "GPU" in text


def test_model_path_must_be_identical_on_every_rank():
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"models_dir": "/data/models"}})
    text = refusal("seed-1", fleet=fleet)
    assert ("host seed-2 (rank 1 of vllm_instances[0] (m2)): the model path is "
            "/data/models/MiniMaxAI/MiniMax-M2/current there but " + PATH) in text
    assert "vllm_install_models_dir" in text
    other = {"minimax-m2": dict(MODELS["minimax-m2"], revision="f" * 40)}
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"models": other}})
    assert "vllm_models.minimax-m2.revision is 'ffff" in refusal("seed-1", fleet=fleet)


def test_no_shared_network():
    fleet = fleet_of(["seed-1", "seed-2"])
    fleet["seed-2"]["addresses"]["eth1"] = {"address": "10.0.1.6", "prefix": 24}
    fleet["seed-2"]["addresses"]["eth2"] = {"address": "10.0.0.66", "prefix": 24}
    text = refusal("seed-1", fleet=fleet)
    assert "no rank-0 address on a network every rank shares" in text
    assert "rank 0 (seed-1) is 10.0.0.5/24 on eth1, rank 1 (seed-2) has 10.0.1.6/24 on eth1" in text
    assert "set vllm_service_network_interface on seed-2 to an interface on 10.0.0.0/24 (it has eth2" in text


def test_interface_missing():
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"interface": ""}})
    text = refusal("seed-1", fleet=fleet)
    assert "host seed-2 (rank 1 of vllm_instances[0] (m2)): vllm_service_network_interface is not set" in text
    assert "loopback" in text and "e.g. eth1" in text
    fleet = fleet_of(["seed-1", "seed-2"], **{"seed-2": {"interface": "ib0"}})
    text = refusal("seed-1", fleet=fleet)
    assert "vllm_service_network_interface is 'ib0' but that interface has no address" in text
    # this host's own input is what counts for this host
    text = refusal("seed-1", inputs={"vllm_service_network_interface": ""})
    assert "host seed-1 (rank 0 of vllm_instances[0] (m2)): vllm_service_network_interface is not set" in text


def test_no_fleet_view_and_bad_keys():
    with pytest.raises(PlanContractError) as err:
        build_plan(MODELS, [BIG], host_facts(SEED), INPUTS, host="seed-1")
    assert "span hosts (nodes) but the plan was given no fleet view" in str(err.value)
    problems = normalise(MODELS, [dict(BIG, nodes="seed-1", nodes_parallel="data", master_port=80),
                                  dict(BIG, name="b", nodes=["a", "a"])], host="h")["problems"]
    text = "\n".join(problems)
    assert "vllm_instances[0] (m2).nodes is 'seed-1'; use a list" in text
    assert "nodes_parallel is 'data'" in text and "master_port is 80" in text
    assert "vllm_instances[1] (b).nodes names a more than once" in text


def test_extra_args_and_env_cannot_repeat_what_the_launcher_sets():
    text = refusal("seed-1", instances=[dict(BIG, extra_args=["--node-rank 1"])])
    assert "'--node-rank' duplicates a flag the role sets" in text and "nodes of the instance" in text
    text = refusal("seed-1", instances=[dict(BIG, extra_args=["--headless"])])
    assert "'--headless' duplicates a flag the role sets" in text
    text = refusal("seed-1", instances=[dict(BIG, extra_args=["--distributed-executor-backend ray"])])
    assert "'--distributed-executor-backend' duplicates a flag the plan sets for a multi-node instance" in text
    text = refusal("seed-1", inputs={"vllm_service_nccl_env": {"NCCL_SOCKET_IFNAME": "eth0"}})
    assert "NCCL_SOCKET_IFNAME is set to 'eth0'" in text and "vllm_service_network_interface" in text
    # the same value is fine
    plan_of("seed-1", inputs={"vllm_service_nccl_env": {"NCCL_SOCKET_IFNAME": "eth1"}})


def test_master_port_must_not_collide_on_rank_0():
    text = refusal("seed-1", instances=[dict(BIG, master_port=20000)])
    assert "master_port 20000 lies in the VLLM_PORT range 20000-20099 of 'm2'" in text
    plan_of("seed-2", [dict(BIG, master_port=20000)])  # rank 1 does not listen on it


def test_the_filter_passes_the_fleet_through():
    plan = vllm_plan(MODELS, [BIG], facts=host_facts(SEED), inputs=INPUTS, host="seed-2",
                     fleet=fleet_of(["seed-1", "seed-2"]))
    assert plan["instances"][0]["multinode"]["role"] == "headless"


# --------------------------------------------------------------------------- the property

def _strip(argv):
    """argv without what differs between ranks: the entry point, API binding, rank and --headless."""
    out = []
    skip = 0
    for tok in argv[argv.index("--model"):]:
        if skip:
            skip -= 1
            continue
        if tok in ("--host", "--port", "--node-rank"):
            skip = 1
            continue
        if tok != "--headless":
            out.append(tok)
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 4), tp=st.sampled_from([1, 2, 4]), stages=st.sampled_from([1, 2]),
       last=st.lists(st.integers(1, 254), min_size=4, max_size=4, unique=True),
       net=st.sampled_from(["10.0.0.0/24", "192.168.7.0/24", "fd00:1::/64"]))
def test_any_hosts_on_a_shared_network_rank_in_order(n, tp, stages, last, net):
    network = ipaddress.ip_network(net)
    hosts = [f"node-{i}" for i in range(n)]
    addrs = [str(network[x]) for x in last[:n]]
    fleet = {h: {"groups": ["all"], "interface": "eth1", "gpu_count": 8, "models_dir": "/m",
                 "addresses": {"eth1": {"address": a, "prefix": network.prefixlen}}} for h, a in zip(hosts, addrs)}
    inst = {"name": "big", "model": "minimax-m2", "nodes": hosts, "tensor_parallel_size": tp,
            "pipeline_parallel_size": n * stages}
    plans = [build_plan(MODELS, [inst], host_facts(SEED), dict(INPUTS, vllm_install_models_dir="/m"),
                        host=h, fleet=fleet)["instances"][0] for h in hosts]
    assert [p["multinode"]["node_rank"] for p in plans] == list(range(n))
    assert {p["multinode"]["master_addr"] for p in plans} == {addrs[0]}
    assert [p["multinode"]["address"] for p in plans] == addrs
    for p in plans:
        assert sorted(p["multinode"]["peers"]) == sorted(set(addrs) - {p["multinode"]["address"]})
        assert len(p["gpus"]) == tp * stages == p["multinode"]["gpus_per_node"]
        assert _strip(p["argv"]) == _strip(plans[0]["argv"])
        assert p["argv"][p["argv"].index("--node-rank") + 1] == str(p["multinode"]["node_rank"])
        assert ("--headless" in p["argv"]) == (p["multinode"]["node_rank"] > 0)
        assert p["argv"][1:4] == (["-m", "vllm.entrypoints.cli.main", "serve"] if p["multinode"]["headless"]
                                  else ["-m", "vllm.entrypoints.openai.api_server", "--model"])


def test_cpu_build_ranks_are_counted_per_host():
    """vllm_install_variant cpu: the CPU build's settings follow the whole instance (PP across hosts needs
    eager compilation), the OpenMP binding this host's ranks (TP = 2 per host: two ranks here)."""
    inputs = {"vllm_install_variant": "cpu"}
    plan = plan_of("seed-1", inputs=inputs, instances=[dict(BIG, tensor_parallel_size=2, extra_args=["--enforce-eager"])])
    (inst,) = plan["instances"]
    env = dict(inst["environment"])
    assert env["TORCH_COMPILE_DISABLE"] == "1" and len(env["VLLM_CPU_OMP_THREADS_BIND"].split("|")) == 2, env
    assert "-cc.mode=1" in inst["argv"] and "--enforce-eager" not in inst["argv"]
    plan = plan_of("seed-2", inputs=inputs, instances=[dict(BIG, tensor_parallel_size=1)])
    (inst,) = plan["instances"]
    assert "-cc.mode=1" in inst["argv"] and "VLLM_CPU_OMP_THREADS_BIND" not in dict(inst["environment"])
