"""Automatic ports and GPUs stay put (issue 39): an instance that keeps its name keeps the HTTP port, the VLLM_PORT
range and the GPUs the host's recorded plan gave it when others are added, removed or reordered, so the transition
restarts only what really changed.

The recorded plan's ``slots`` go through JSON, as the service stage writes ``plan.json`` and ``gpu_facts`` reads it
back (``module_utils/plan_record.py``). Each example plans a host, then plans it again from a changed inventory with
the first plan's slots, and compares with a fresh plan of the same inventory (what the collection did before).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.plugin_utils.fleet_view import fleet_view
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import build_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.router import inventory_endpoints
from test_plan_contract import SHA, host_facts

MODELS = {"m": {"repo_id": "org/m", "revision": SHA}}


def inst(name, **keys):
    return dict({"name": name, "model": "m"}, **keys)


def slots_of(plan):
    """The slots as the next run reads them: through the plan file's JSON."""
    return json.loads(json.dumps(plan["slots"]))


def placed(plan):
    return {i["name"]: (i["port"], i["vllm_port"], tuple(i["gpus"])) for i in plan["instances"]}


def replan(shape, before, after, inputs=None):
    first = build_plan(MODELS, before, host_facts(shape), inputs, host="h")
    again = build_plan(MODELS, after, host_facts(shape, slots=slots_of(first)), inputs, host="h")
    fresh = build_plan(MODELS, after, host_facts(shape), inputs, host="h")
    return placed(first), placed(again), placed(fresh)


def test_an_instance_added_at_the_head_moves_no_other():
    """The case of the issue: before, every instance got the next port, range and GPU (all restarted)."""
    before = [inst("a"), inst("b"), inst("c")]
    first, again, fresh = replan("h200-8x-nvlink", before, [inst("z")] + before)
    assert {n: again[n] for n in "abc"} == first
    assert again["z"][0] == 8003 and again["z"][1] == 20300 and again["z"][2] not in {v[2] for v in first.values()}
    assert fresh["a"] != first["a"]  # what a fresh plan does: every instance moves


def test_removing_and_reordering_moves_no_remaining_instance():
    before = [inst("a"), inst("b", tensor_parallel_size=2), inst("c"), inst("d")]
    first, again, _fresh = replan("h200-8x-nvlink", before, [inst("d"), inst("b", tensor_parallel_size=2), inst("a")])
    assert again == {n: first[n] for n in "dba"}
    # the port c left is the first one a new instance gets (HTTP ports: the lowest free from base_port); its
    # VLLM_PORT range starts where its position puts it, or the next one free (what a plan without a record gives)
    later = [inst("a"), inst("b", tensor_parallel_size=2), inst("d"), inst("e")]
    _f, refilled, _fresh2 = replan("h200-8x-nvlink", before, later)
    assert {n: refilled[n] for n in "abd"} == {n: first[n] for n in "abd"}
    assert refilled["e"][:2] == (first["c"][0], 20400)


def test_what_the_inventory_names_wins_over_what_was_kept():
    """An explicit port (or vllm_port, or gpus) taking a kept one moves the instance that held it, not the other."""
    before = [inst("a"), inst("b")]
    held = placed(build_plan(MODELS, before, host_facts("h200-8x-nvlink"), host="h"))["a"]
    first, again, _fresh = replan("h200-8x-nvlink", before,
                                  [inst("a"), inst("b"), inst("c", port=held[0], vllm_port=held[1], gpus=list(held[2]))])
    assert first["a"] == held
    assert again["c"] == held
    assert again["b"] == first["b"]
    assert again["a"][0] != held[0] and again["a"][1] != held[1] and again["a"][2] != held[2]


def test_changed_port_rules_renumber():
    """A new base_port (or VLLM_PORT base or stride) is a new rule: the ports follow it; the GPUs stay."""
    before = [inst("a"), inst("b")]
    first = build_plan(MODELS, before, host_facts("h200-8x-nvlink"), host="h")
    slots = slots_of(first)
    again = placed(build_plan(MODELS, [inst("z")] + before, host_facts("h200-8x-nvlink", slots=slots),
                              {"vllm_preflight_plan_options": {"base_port": 9000},
                               "vllm_service_vllm_port_stride": 50}, host="h"))
    assert [again[n][:2] for n in ("z", "a", "b")] == [(9000, 20000), (9001, 20050), (9002, 20100)]
    assert again["a"][2] == placed(first)["a"][2] and again["b"][2] == placed(first)["b"][2]


def test_a_kept_group_never_costs_another_instance_its_numa_node():
    """Kept GPUs that would leave a new TP=4 instance no whole NUMA node are given up (only as many as need to move):
    the new instance gets a whole node, as a fresh plan gives it."""
    facts = host_facts("seed-8x-rtxpro6000")
    uuid = {g["index"]: g["uuid"] for g in facts["gpus"]}
    # a on GPU 0 (node 0) and b on GPU 4 (node 1), as an earlier plan could have left them
    slots = {"base_port": 8000, "vllm_port_base": 20000, "vllm_port_stride": 100,
             "auto": {"a": {"port": 8000, "vllm_port": 20000, "gpu_uuids": [uuid[0]]},
                      "b": {"port": 8001, "vllm_port": 20100, "gpu_uuids": [uuid[4]]}}}
    after = [inst("a"), inst("b"), inst("c", tensor_parallel_size=4)]
    again = placed(build_plan(MODELS, after, dict(facts, slots=slots), host="h"))
    numa = {g["index"]: g["numa_node"] for g in facts["gpus"]}
    assert len({numa[g] for g in again["c"][2]}) == 1  # c on one NUMA node, as a fresh plan puts it
    # one of the two keeps its GPU, the other moves to the node c does not take
    assert again["a"][2] == (0,) or again["b"][2] == (4,)
    assert len({numa[g] for g in again["a"][2] + again["b"][2]}) == 1
    assert (again["a"][:2], again["b"][:2]) == ((8000, 20000), (8001, 20100))  # the ports still stay


@pytest.mark.parametrize("slots", [
    None, {}, {"auto": "x"}, {"base_port": "8000", "auto": {"a": {"port": True}}}, {"auto": {"a": None}},
    {"base_port": 8000, "vllm_port_base": 20000, "vllm_port_stride": 100,
     "auto": {"a": {"port": 70000, "vllm_port": 20001, "gpu_uuids": ["GPU-not-on-this-host"]}}},
])
def test_a_record_that_cannot_serve_keeps_nothing(slots):
    """Slots of another shape, a port out of range, a range off the stride, a GPU the host does not have: the plan
    is the fresh one, never an error."""
    after = [inst("z"), inst("a")]
    got = build_plan(MODELS, after, host_facts("h200-8x-nvlink", slots=slots), host="h")
    assert placed(got) == placed(build_plan(MODELS, after, host_facts("h200-8x-nvlink"), host="h"))


def test_a_router_on_another_host_reads_the_kept_port_of_a_host_not_planned_in_the_run():
    """A host outside the run is routed to at the ports its recorded plan keeps (its facts, when they were read),
    as its own plan will give them."""
    before = [inst("a"), inst("b")]
    first = build_plan(MODELS, before, host_facts("h200-8x-nvlink"), host="w")
    hostvars = {"w": {"vllm_instances": [inst("z")] + before, "vllm_models": MODELS,
                      "ansible_facts": {"host_resources": {"slots": slots_of(first)}}}}
    view = fleet_view(hostvars, ["w"], [], {})
    ports = {e["instance"]: e["port"] for e in inventory_endpoints("w", view["w"], view)}
    planned = build_plan(MODELS, [inst("z")] + before, host_facts("h200-8x-nvlink", slots=slots_of(first)), host="w")
    assert ports == {i["name"]: i["port"] for i in planned["instances"]} == {"z": 8002, "a": 8000, "b": 8001}


NAMES = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=4, unique=True)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=NAMES, after=NAMES, tp2=st.sets(st.sampled_from("abcdefgh")),
       shape=st.sampled_from(["h200-8x-nvlink", "seed-8x-rtxpro6000"]))
def test_every_instance_that_stays_keeps_its_ports_and_its_gpus_unless_they_would_cost_placement(
        before, after, tp2, shape):
    """Any inventory, then any other (instances added, removed, reordered; a TP change makes a new shape): every
    instance in both keeps its HTTP port and its VLLM_PORT range; its GPUs too, unless the plan is the fresh one
    (kept groups given up because they would put an instance on a looser group)."""
    def insts(names):
        return [inst(n, tensor_parallel_size=2 if n in tp2 else 1) for n in names]

    first = build_plan(MODELS, insts(before), host_facts(shape), host="h")
    again = placed(build_plan(MODELS, insts(after), host_facts(shape, slots=slots_of(first)), host="h"))
    fresh = placed(build_plan(MODELS, insts(after), host_facts(shape), host="h"))
    kept = placed(first)
    both = [n for n in after if n in kept]
    assert all(again[n][:2] == kept[n][:2] for n in both)
    assert all(again[n][2] == kept[n][2] for n in both) or {n: v[2] for n, v in again.items()} == {
        n: v[2] for n, v in fresh.items()}
    assert len({v[0] for v in again.values()}) == len(again) and len({v[1] for v in again.values()}) == len(again)
