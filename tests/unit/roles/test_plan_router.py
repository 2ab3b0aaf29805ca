"""The fleet's routers (issue 27): the router host's ``routers`` and every host's ``router_workers``, planned from
the fleet view, and the refusals (an unreachable worker, a router with no worker, a taken port, a bad policy)."""
from __future__ import annotations

import pytest

from ansible_collections.inferops.vllm.plugins.filter.vllm_fleet_view import vllm_fleet_view
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan
from test_plan_contract import SHA, host_facts

SHAPE = "seed-8x-rtxpro6000"
MODELS = {"tiny": {"repo_id": "inferops-test/tiny-llama", "revision": SHA, "served_model_name": "tiny-llama",
                   "router_port": 8300}}
SOLO = {"name": "solo", "model": "tiny", "numa_node": 1, "gpu_memory_utilization": 0.5}


def hostvars(**over):
    """Two hosts with one instance each; mn-0 is in vllm_routers. ``over``: host -> variables."""
    hv = {}
    for pos, host in enumerate(["mn-0", "mn-1"]):
        hv[host] = {"group_names": ["vllm_nodes"] + (["vllm_routers"] if pos == 0 else []),
                    "vllm_models": MODELS, "vllm_instances": [SOLO], "vllm_service_host": "0.0.0.0",
                    "vllm_service_network_interface": "eth0",
                    "ansible_facts": {"interfaces": ["lo", "eth0"],
                                      "eth0": {"device": "eth0", "ipv4": {"address": f"10.88.0.{pos + 5}",
                                                                          "netmask": "255.255.0.0"}}}}
        hv[host].update(over.get(host, {}))
    return hv


def fleet(hv):
    groups = {"all": list(hv), "vllm_routers": [h for h in hv if "vllm_routers" in hv[h]["group_names"]]}
    return vllm_fleet_view(hv, list(hv), list(hv), groups=groups)


def plan(host, hv=None):
    hv = hv or hostvars()
    inputs = {k: v for k, v in hv[host].items() if k.startswith("vllm_service_") or k.startswith("vllm_router_")}
    return build_plan(hv[host]["vllm_models"], hv[host]["vllm_instances"], host_facts(SHAPE), inputs, host=host,
                      fleet=fleet(hv))


def test_the_router_host_routes_to_every_hosts_instance_and_each_host_knows_its_router():
    p0, p1 = plan("mn-0"), plan("mn-1")
    (router,) = p0["routers"]
    assert router["unit"] == "inferops-vllm-router-tiny.service" and router["policy"] == "cache_aware"
    assert router["listen"] == {"address": "127.0.0.1", "port": 18100}
    assert router["workers"] == [{"host": "mn-0", "instance": "solo", "url": "http://127.0.0.1:8000"},
                                 {"host": "mn-1", "instance": "solo", "url": "http://10.88.0.6:8000"}]
    assert router["served_model_name"] == ["tiny-llama"] and router["metrics"]["port"] == 29100
    # the router's front door on the router host: loopback backend, only the OpenAI routes
    fd = [f for f in p0["frontdoors"] if f.get("router")]
    assert [f["name"] for f in fd] == ["_router_tiny"] and fd[0]["port"] == 8300
    assert fd[0]["backends"][0]["address"] == "127.0.0.1" and fd[0]["backends"][0]["port"] == 18100
    assert p0["frontdoor_metrics"] is not None
    assert p1["routers"] == [] and p1["frontdoors"] == []
    assert p0["router_workers"] == [{"instance": "solo", "model": "tiny", "router_host": "mn-0",
                                     "router": "inferops-vllm-router-tiny.service",
                                     "router_url": "http://127.0.0.1:18100", "worker_url": "http://127.0.0.1:8000",
                                     "wave": 0, "policy": "cache_aware"}]
    assert p1["router_workers"][0]["worker_url"] == "http://10.88.0.6:8000" and p1["router_workers"][0]["wave"] == 1
    # cache_aware tokenizes through every worker's render endpoint: the workers serve it (and nothing else gets it)
    for p in (p0, p1):
        (solo,) = p["instances"]
        assert solo["argv"].count("--enable-scale-out") == 1


def test_only_cache_aware_routers_workers_get_the_render_endpoints():
    hv = hostvars(**{"mn-0": {"vllm_router_policy": "round_robin"}})
    assert "--enable-scale-out" not in plan("mn-1", hv)["instances"][0]["argv"]
    hv = hostvars(**{"mn-1": {"vllm_instances": [dict(SOLO, extra_args=["--enable-scale-out"])]}})
    assert plan("mn-1", hv)["instances"][0]["argv"].count("--enable-scale-out") == 1
    hv = hostvars(**{"mn-0": {"group_names": ["vllm_nodes"]}})
    assert "--enable-scale-out" not in plan("mn-1", hv)["instances"][0]["argv"]


def test_worker_ports_follow_the_hosts_own_port_rule_and_address_overrides():
    hv = hostvars(**{"mn-1": {"vllm_instances": [dict(SOLO, name="a", port=8000), dict(SOLO, name="b", numa_node=0)],
                              "vllm_router_worker_address": "gpu-b.example"}})
    (router,) = plan("mn-0", hv)["routers"]
    assert [w["url"] for w in router["workers"]] == ["http://127.0.0.1:8000", "http://gpu-b.example:8000",
                                                     "http://gpu-b.example:8001"]
    assert [w["url"] for w in router["workers"]][1:] == [
        i["url"].replace("127.0.0.1", "gpu-b.example") for i in plan("mn-1", hv)["instances"]]


def test_an_address_unknown_because_the_host_is_not_in_the_run_says_so():
    """A host outside the play (a --limit, or another batch of serial) has no network facts: the refusal says that, not
    to set an interface that is set (stop 53; rollout.yml now plans every host before its batches)."""
    hv = hostvars(**{"mn-1": {"vllm_service_host": "127.0.0.1", "ansible_facts": {}}})
    groups = {"all": list(hv), "vllm_routers": ["mn-0"]}
    inputs = {k: v for k, v in hv["mn-0"].items() if k.startswith("vllm_service_") or k.startswith("vllm_router_")}
    with pytest.raises(PlanContractError) as err:
        build_plan(hv["mn-0"]["vllm_models"], hv["mn-0"]["vllm_instances"], host_facts(SHAPE), inputs, host="mn-0",
                   fleet=vllm_fleet_view(hv, list(hv), ["mn-0"], groups=groups))
    assert ("mn-1 is not in this run (a --limit, or a batch of its own), so the address of its eth0 "
            "(vllm_service_network_interface) is not known here") in str(err.value)
    # in the run, with the interface set but no IPv4 address on it: that is what it says
    with pytest.raises(PlanContractError) as err:
        plan("mn-0", hv)
    assert "mn-1's eth0 (vllm_service_network_interface) has no IPv4 address" in str(err.value)


@pytest.mark.parametrize("over, expect", [
    ({"mn-1": {"vllm_service_host": "127.0.0.1", "vllm_service_network_interface": "", "ansible_facts": {}}},
     "host mn-1: its instances listen on 127.0.0.1 (vllm_service_host), so the router on mn-0 reaches them through "
     "mn-1's front door, which needs the address to listen on: set vllm_router_worker_address"),
    ({"mn-1": {"vllm_service_network_interface": "", "ansible_facts": {}}},
     "set vllm_router_worker_address on mn-1"),
    ({"mn-0": {"vllm_instances": []}, "mn-1": {"vllm_instances": []}},
     "no host of the inventory has an instance of model 'tiny', so its router would have no worker"),
    ({"mn-0": {"vllm_router_listen_port_base": 8000}}, "which is the HTTP port of instance 'solo'"),
    ({"mn-0": {"vllm_router_policy": "fastest"}}, "vllm_router_policy"),
    ({"mn-0": {"vllm_models": {"tiny": dict(MODELS["tiny"], frontdoor_port=8300)}}},
     "router_port and frontdoor_port are both 8300"),
])
def test_refusals_name_the_host_and_the_variable(over, expect):
    with pytest.raises(PlanContractError) as err:
        plan("mn-0", hostvars(**over))
    assert expect in str(err.value)
    assert str(err.value).startswith("host mn-")


# ---- waves: two hosts never take a worker of the same router out at the same step position

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ansible_collections.inferops.vllm.plugins.filter.vllm_service_transition import vllm_router_waves  # noqa: E402


def _step(name, routers=(), action="restart"):
    refs = [{"router_host": "r", "router": u, "instance": name} for u in routers]
    return {"action": action, "name": name, "routers": refs, "routers_back": refs if action == "restart" else []}


def test_the_second_host_waits_while_the_first_restarts_its_worker():
    steps = {"mn-0": [_step("solo", ["A"])], "mn-1": [_step("solo", ["A"]), _step("other")]}
    out = vllm_router_waves(steps, ["mn-0", "mn-1"])
    assert [s["action"] for s in out["mn-0"]] == ["restart"]
    assert [s["action"] for s in out["mn-1"]] == ["wait", "restart", "restart"]
    # a step of another router, or no router, does not wait
    out = vllm_router_waves({"a": [_step("x", ["A"])], "b": [_step("y", ["B"])]}, ["a", "b"])
    assert [s["action"] for s in out["b"]] == ["restart"]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["h0", "h1", "h2", "h3"]),
                       st.lists(st.tuples(st.sets(st.sampled_from(["A", "B", "C"]), max_size=2),
                                          st.sampled_from(["restart", "stop"])), max_size=4), min_size=1))
def test_no_position_has_two_hosts_on_one_router_and_the_order_is_kept(plan):
    hosts = sorted(plan)
    steps = {h: [_step(f"{h}-{i}", sorted(r), a) for i, (r, a) in enumerate(v)] for h, v in plan.items()}
    out = vllm_router_waves(steps, hosts)
    for h in hosts:
        assert [s for s in out[h] if s["action"] != "wait"] == steps[h]
    for pos in range(max(len(v) for v in out.values())):
        seen = {}
        for h in hosts:
            if pos < len(out[h]):
                for ref in out[h][pos]["routers"]:
                    assert seen.setdefault(ref["router"], h) == h


def test_the_routers_metrics_listener_is_a_file_sd_target():
    from ansible_collections.inferops.vllm.plugins.plugin_utils.metrics_targets import file_sd_targets
    out = file_sd_targets({"mn-0": {"plan": plan("mn-0"), "address": "10.88.0.5"},
                           "mn-1": {"plan": plan("mn-1"), "address": "10.88.0.6"}})
    routers = [g for g in out["targets"] if g["labels"].get("inferops_role") == "router"]
    assert routers == [{"targets": ["10.88.0.5:29100"],
                        "labels": {"instance": "mn-0/_router_tiny", "host": "mn-0", "inferops_role": "router",
                                   "model": "tiny-llama", "router_port": "8300"}}]


# ---- the transition's steps carry the routers to take the instance out of, and to put it back into

from ansible_collections.inferops.vllm.plugins.plugin_utils.transition import plan_transition  # noqa: E402


def _live(p):
    return [{"unit": i["unit"], "name": i["name"], "state": "active", "pid": 100, "source": "process",
             "gpus": [g for g in dict(i["environment"]).get("CUDA_VISIBLE_DEVICES", "").split(",") if g],
             "port": i["port"], "vllm_port": int(dict(i["environment"])["VLLM_PORT"])} for i in p["instances"]]


def test_a_running_worker_is_taken_out_and_put_back_a_new_one_only_joins():
    p1 = plan("mn-1")
    (step,) = plan_transition(_live(p1), p1["instances"], ["solo"], recorded=p1, plan=p1)["steps"]
    assert step["action"] == "restart" and step["routers"] == p1["router_workers"] == step["routers_back"]
    (step,) = plan_transition([], p1["instances"], ["solo"], recorded=None, plan=p1)["steps"]
    assert step["routers"] == [] and step["routers_back"] == p1["router_workers"]
    # removed from the plan: taken out of the router it was in (the recorded plan's), nothing to put back
    empty = plan("mn-1", hostvars(**{"mn-1": {"vllm_instances": []}}))
    (step,) = plan_transition(_live(p1), [], [], recorded=p1, plan=empty)["steps"]
    assert step["action"] == "stop" and step["routers"] == p1["router_workers"] and step["routers_back"] == []


def test_instances_on_loopback_are_reached_through_a_worker_listener_of_their_hosts_front_door():
    """Issue 37: no vLLM port on the network. mn-1's solo listens on loopback; the router on mn-0 reaches it at
    mn-1's interface address and the same port, where mn-1's front door listens for it (a worker listener: the key
    check, the model's routes and the render routes of a cache_aware router), its one backend the instance."""
    hv = hostvars(**{h: {"vllm_service_host": "127.0.0.1"} for h in ("mn-0", "mn-1")})
    p0, p1 = plan("mn-0", hv), plan("mn-1", hv)
    (router,) = p0["routers"]
    assert [w["url"] for w in router["workers"]] == ["http://127.0.0.1:8000", "http://10.88.0.6:8000"]
    (solo,) = p1["instances"]
    assert solo["bind_address"] == "127.0.0.1"
    (fd,) = p1["frontdoors"]
    assert fd["name"] == "_worker_solo" and fd["worker"] is True and fd["bind_address"] == "10.88.0.6"
    assert fd["port"] == 8000 and fd["url"] == "http://10.88.0.6:8000"
    assert fd["backends"] == [{"instance": "solo", "unit": "vllm-solo.service", "address": "127.0.0.1", "port": 8000,
                               "url": "http://127.0.0.1:8000"}]
    assert [f"{r['method']} {r['path']}" for r in fd["edge"]["routes"]] == [
        "POST /v1/chat/completions", "POST /v1/chat/completions/render", "POST /v1/completions",
        "POST /v1/completions/render", "GET /v1/models"]
    assert p1["frontdoor_metrics"] is not None and p1["frontdoor_metrics"]["bind_address"] == "127.0.0.1"
    assert p1["router_workers"][0]["listener"] == {"address": "10.88.0.6", "port": 8000}
    # the router's own host needs none (its router reaches its instances on loopback)
    assert [f["name"] for f in p0["frontdoors"]] == ["_router_tiny"]
    # round_robin asks for no render route
    hv = hostvars(**{h: {"vllm_service_host": "127.0.0.1", "vllm_router_policy": "round_robin"} for h in ("mn-0", "mn-1")})
    (fd,) = plan("mn-1", hv)["frontdoors"]
    assert "/v1/completions/render" not in [r["path"] for r in fd["edge"]["routes"]]


def test_two_router_hosts_back_each_other_up_through_their_front_doors():
    """Issue 38: with two hosts in vllm_routers, each front door of the model's router lists its own router, then the
    other host's front door on router_port as a backup server (checked on /liveness, which a router's front door
    answers without a key)."""
    hv = hostvars(**{h: {"group_names": ["vllm_nodes", "vllm_routers"], "vllm_frontdoor_bind_address": "0.0.0.0"}
                     for h in ("mn-0", "mn-1")})
    p0, p1 = plan("mn-0", hv), plan("mn-1", hv)
    for p, other, address in ((p0, "mn-1", "10.88.0.6"), (p1, "mn-0", "10.88.0.5")):
        (router,) = p["routers"]
        assert router["backups"] == [{"host": other, "name": f"router_{other}", "address": address, "port": 8300,
                                      "url": f"http://{address}:8300"}]
        (fd,) = [f for f in p["frontdoors"] if f.get("router")]
        assert [(b["instance"], b["port"], b.get("backup", False)) for b in fd["backends"]] == [
            ("router", 18100, False), (f"router_{other}", 8300, True)]
        assert fd["edge"]["health"] == ["/health", "/liveness"]
    # each instance is a worker of both routers, and takes turns the same way in both
    assert [(w["router_host"], w["wave"]) for w in p1["router_workers"]] == [("mn-0", 1), ("mn-1", 1)]
    # a second router host whose front door listens on loopback cannot be a backup (nor reached by clients)
    hv["mn-1"]["vllm_frontdoor_bind_address"] = "127.0.0.1"
    with pytest.raises(PlanContractError) as err:
        plan("mn-0", hv)
    assert "host mn-1: it runs a router of 'tiny' too, but its front door listens on 127.0.0.1" in str(err.value)


# ---- issue 39's shape: instances that span hosts are workers too (issue 38), at their rank 0 (the API server)

from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import planned_on, serves_api_on  # noqa: E402

BIG = {"name": "big", "model": "tiny", "nodes": {"group": "gpu", "count": 2}, "tensor_parallel_size": 1,
       "pipeline_parallel_size": 2, "master_port": 29511, "numa_node": 0, "gpu_memory_utilization": 0.5}
GPU_HOSTS = ["a-1", "a-2", "a-3"]


def issue39(instances=None, routers=("a-1",), gpu=None, play=None, **over):
    """a-1..a-3 in group gpu share group vars: ``instances`` (default ``[BIG, SOLO]``: the multi-node ``big`` before
    ``solo``, neither with a port); ``routers``: the hosts of vllm_routers; ``gpu``: groups['gpu'] (its own order);
    ``play``: the play's hosts (default all); ``over``: host -> variables (a host not in GPU_HOSTS is added).
    Returns (the fleet view, the plan of every host of the play)."""
    names = GPU_HOSTS + [h for h in over if h not in GPU_HOSTS]
    hv = {}
    for pos, host in enumerate(names):
        hv[host] = {"group_names": (["gpu"] if host in GPU_HOSTS else []) + (["vllm_routers"] if host in routers else []),
                    "vllm_models": MODELS, "vllm_instances": [BIG, SOLO] if instances is None else instances,
                    "vllm_service_host": "0.0.0.0", "vllm_service_network_interface": "eth0",
                    "ansible_facts": {"interfaces": ["lo", "eth0"], "gpus": host_facts(SHAPE)["gpus"],
                                      "eth0": {"device": "eth0", "ipv4": {"address": f"10.88.0.{pos + 5}",
                                                                          "netmask": "255.255.0.0"}}}}
        hv[host].update(over.get(host, {}))
    groups = {"all": names, "gpu": gpu or GPU_HOSTS, "vllm_routers": [h for h in names if h in routers]}
    play = names if play is None else play
    view = vllm_fleet_view(hv, names, play, groups=groups)
    plans = {}
    for host in play:
        inputs = {k: v for k, v in hv[host].items() if k.startswith("vllm_service_") or k.startswith("vllm_router_")}
        plans[host] = build_plan(MODELS, hv[host]["vllm_instances"], host_facts(SHAPE), inputs, host=host, fleet=view)
    return view, plans


def _as_planned(router, plans):
    """Every worker of ``router`` is at the port its own host's plan gives it, and serves the API there."""
    for worker in router["workers"]:
        (inst,) = [i for i in plans[worker["host"]]["instances"] if i["name"] == worker["instance"]]
        assert worker["url"].rsplit(":", 1)[1] == str(inst["port"]) and inst["url"] is not None, (worker, inst)


def test_a_worker_is_listed_at_the_port_its_own_hosts_plan_gives_it():
    """Issue 39's shape: a-1..a-3 share group vars with a multi-node instance `big` (2 hosts of group gpu, no port)
    before `solo` (no port); a-3 is not among big's hosts, so its own plan drops big and puts solo on the base port.
    The router lists each host's solo where that host's plan puts it, never counting an instance the plan dropped,
    and big once, at its rank 0 (a-1, the API server) on the port a-1's plan gives it; its headless rank on a-2 is
    no worker."""
    _view, plans = issue39()
    assert [i["name"] for i in plans["a-3"]["instances"]] == ["solo"]
    (router,) = plans["a-1"]["routers"]
    _as_planned(router, plans)
    assert [(w["host"], w["instance"], w["url"]) for w in router["workers"]] == [
        ("a-1", "big", "http://127.0.0.1:8000"), ("a-1", "solo", "http://127.0.0.1:8001"),
        ("a-2", "solo", "http://10.88.0.6:8001"), ("a-3", "solo", "http://10.88.0.7:8000")]
    # each host's router_workers: big on rank 0's host (whose group restart takes it out), never on a-2's
    assert [(w["instance"], w["worker_url"], w["wave"]) for w in plans["a-1"]["router_workers"]] == [
        ("big", "http://127.0.0.1:8000", 0), ("solo", "http://127.0.0.1:8001", 0)]
    assert [(w["instance"], w["wave"]) for w in plans["a-2"]["router_workers"]] == [("solo", 1)]
    (rw,) = plans["a-3"]["router_workers"]
    assert rw["worker_url"] == "http://10.88.0.7:8000" and rw["wave"] == 2
    # rank 0 serves the render endpoints of a cache_aware router; the headless rank serves no API
    big = {h: [i for i in plans[h]["instances"] if i["name"] == "big"][0] for h in ("a-1", "a-2")}
    assert big["a-1"]["argv"].count("--enable-scale-out") == 1 and "--enable-scale-out" not in big["a-2"]["argv"]


def test_a_rank_0_on_loopback_is_reached_through_its_hosts_worker_listener():
    """The router on a-3 reaches big's rank 0 on a-1 (loopback, like every instance here) at a-1's interface address,
    where a-1's front door listens for it; a-2 (big's headless rank) gets a listener for its solo only."""
    _view, plans = issue39(routers=("a-3",), **{h: {"vllm_service_host": "127.0.0.1"} for h in GPU_HOSTS})
    (router,) = plans["a-3"]["routers"]
    _as_planned(router, plans)
    assert [(w["host"], w["instance"], w["url"], w.get("listener")) for w in router["workers"]] == [
        ("a-1", "big", "http://10.88.0.5:8000", {"address": "10.88.0.5", "port": 8000}),
        ("a-1", "solo", "http://10.88.0.5:8001", {"address": "10.88.0.5", "port": 8001}),
        ("a-2", "solo", "http://10.88.0.6:8001", {"address": "10.88.0.6", "port": 8001}),
        ("a-3", "solo", "http://127.0.0.1:8000", None)]
    fds = {f["name"]: f for f in plans["a-1"]["frontdoors"]}
    assert sorted(fds) == ["_worker_big", "_worker_solo"]
    assert fds["_worker_big"]["bind_address"] == "10.88.0.5" and fds["_worker_big"]["port"] == 8000
    assert [(b["instance"], b["address"], b["port"]) for b in fds["_worker_big"]["backends"]] == [
        ("big", "127.0.0.1", 8000)]
    assert [f["name"] for f in plans["a-2"]["frontdoors"]] == ["_worker_solo"]
    assert [w["instance"] for w in plans["a-2"]["router_workers"]] == ["solo"]


def test_a_model_served_only_across_hosts_has_a_router_with_that_one_worker():
    _view, plans = issue39(instances=[BIG])
    (router,) = plans["a-1"]["routers"]
    assert router["workers"] == [{"host": "a-1", "instance": "big", "url": "http://127.0.0.1:8000"}]
    _as_planned(router, plans)
    assert [w["instance"] for w in plans["a-1"]["router_workers"]] == ["big"]
    assert plans["a-2"]["router_workers"] == [] and plans["a-3"]["router_workers"] == []


def test_a_router_lists_the_same_workers_whatever_hosts_the_play_limits_to():
    """A router host of its own (r-1, no instance of its own) in a play limited to it lists big at its rank 0 and
    each solo at its full plan's port, as the play of every host does (the router role takes out of the router
    every worker the plan no longer lists)."""
    over = {"r-1": {"vllm_instances": []}}
    full = issue39(routers=("r-1",), **over)[1]["r-1"]["routers"]
    limited = issue39(routers=("r-1",), play=["r-1"], **over)[1]["r-1"]["routers"]
    assert limited == full
    assert [(w["instance"], w["url"]) for w in full[0]["workers"]] == [
        ("big", "http://10.88.0.5:8000"), ("solo", "http://10.88.0.5:8001"), ("solo", "http://10.88.0.6:8001"),
        ("solo", "http://10.88.0.7:8000")]


@pytest.mark.parametrize("nodes, gpu", [
    ({"group": "gpu", "count": 2}, None),
    ({"group": "gpu", "count": 3}, None),
    ({"group": "gpu", "count": 2}, ["a-3", "a-1", "a-2"]),  # the group's own order, not the inventory's
    (["a-2", "a-1"], None),
    (["a-3", "a-2", "a-1"], None),
])
def test_exactly_one_host_serves_the_api_of_an_instance_that_spans_hosts_the_first_its_plans_resolve(nodes, gpu):
    big = dict(BIG, nodes=nodes, pipeline_parallel_size=len(nodes) if isinstance(nodes, list) else nodes["count"])
    view, plans = issue39(instances=[big, SOLO], gpu=gpu)
    ranks = {h: [i["multinode"] for i in p["instances"] if i["name"] == "big"] for h, p in plans.items()}
    api = [h for h, mn in ranks.items() if mn and mn[0]["node_rank"] == 0]
    assert len(api) == 1 and ranks[api[0]][0]["hosts"][0] == api[0]
    assert [h for h in GPU_HOSTS if serves_api_on(nodes, h, view)] == api
    assert [h for h in GPU_HOSTS if planned_on(nodes, h, view)] == [h for h in GPU_HOSTS if ranks[h]]
    (router,) = plans["a-1"]["routers"]
    assert [w["host"] for w in router["workers"] if w["instance"] == "big"] == api


@pytest.mark.parametrize("nodes", [None, "", {"group": "gpu", "count": 4}, {"group": "cpu", "count": 2},
                                   ["a-1", "z-9"], ["a-1"], {"group": "gpu"}, "a-1"])
def test_nodes_that_do_not_resolve_serve_no_api_anywhere(nodes):
    view = issue39(instances=[SOLO])[0]
    assert not any(serves_api_on(nodes, h, view) for h in GPU_HOSTS)
    assert all(planned_on(nodes, h, view) for h in GPU_HOSTS)  # kept: each host's own plan refuses them


# --------------------------------------------------------------------------- LoRA adapters behind a router (issue 40)

ADAPTERS = {"lora-a": {"repo_id": "inferops-test/tiny-lora-a", "revision": "a" * 40, "rank": 8},
            "lora-b": {"repo_id": "inferops-test/tiny-lora-b", "revision": "b" * 40, "rank": 16}}


def test_a_routers_workers_serve_the_same_adapters_or_the_plan_refuses():
    """A request naming an adapter may reach any worker of the model's router, so every worker serves the same
    adapters: the same list passes; a worker that narrows its list (or a host whose vllm_models pins another revision)
    is refused, naming the workers, what each serves and the fix."""
    same = dict(MODELS, tiny=dict(MODELS["tiny"], adapters=ADAPTERS))
    hv = hostvars(**{h: {"vllm_models": same} for h in ("mn-0", "mn-1")})
    p0 = plan("mn-0", hv)
    assert len(p0["routers"][0]["workers"]) == 2 and p0["instances"][0]["lora"]["max_lora_rank"] == 16

    narrowed = hostvars(**{"mn-0": {"vllm_models": same},
                           "mn-1": {"vllm_models": same, "vllm_instances": [dict(SOLO, adapters=["lora-a"])]}})
    with pytest.raises(PlanContractError) as err:
        plan("mn-0", narrowed)
    assert ("the router of 'tiny' on mn-0 would route to workers that serve different adapters (mn-0/solo: "
            f"lora-a=inferops-test/tiny-lora-a@{'a' * 40}, lora-b=inferops-test/tiny-lora-b@{'b' * 40}; mn-1/solo: "
            f"lora-a=inferops-test/tiny-lora-a@{'a' * 40})") in str(err.value), str(err.value)
    assert "give every instance of 'tiny' the same adapters" in str(err.value)

    moved = dict(ADAPTERS, **{"lora-b": dict(ADAPTERS["lora-b"], revision="c" * 40)})
    other = hostvars(**{"mn-0": {"vllm_models": same},
                        "mn-1": {"vllm_models": dict(MODELS, tiny=dict(MODELS["tiny"], adapters=moved))}})
    with pytest.raises(PlanContractError) as err:
        plan("mn-0", other)
    assert f"lora-b=inferops-test/tiny-lora-b@{'c' * 40}" in str(err.value)
