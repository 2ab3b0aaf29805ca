"""The transition planner (plugins/plugin_utils/transition.py) over real plans of recorded hosts.

Plans come from the real planner (build_plan) over recorded host facts; what a host "runs now" is
the old plan's instances as the live probe would report them. An independent replay checks every
step order: no instance starts on a GPU or port that an instance still running (at that point of the
order) holds, except GPUs the new plan lets it share with an instance already running its new config.
"""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_service_transition import vllm_service_transition
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.transition import parse_live, plan_transition

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
REV = "0123456789abcdef0123456789abcdef01234567"
MODELS = {"m": {"repo_id": "org/Model-7B", "revision": REV, "served_model_name": "model-7b", "frontdoor_port": 9000},
          "n": {"repo_id": "org/Other-7B", "revision": REV, "served_model_name": "other-7b"}}


def facts(shape):
    with open(os.path.join(ROOT, "tests", "unit", "data", "hosts", shape + ".json")) as fh:
        return json.load(fh)


SEED = facts("seed-8x-rtxpro6000")  # 8 GPUs, 0-3 on NUMA node 0, 4-7 on node 1


def plan(instances, shape=SEED):
    return build_plan(MODELS, instances, shape, {}, host="seed")


def running(old, source="process"):
    """What the live probe reports for a host that runs ``old`` (its instances all active)."""
    out = []
    for inst in old["instances"]:
        env = dict(inst["environment"])
        out.append({"unit": inst["unit"], "name": inst["name"], "state": "active", "pid": 100, "source": source,
                    "gpus": [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g],
                    "port": inst["port"], "vllm_port": int(env["VLLM_PORT"])})
    return out


def changed(old, new):
    """Names the service role would (re)start: new, or their unit differs (any planned field differs)."""
    before = {i["name"]: i for i in old["instances"]}
    return [i["name"] for i in new["instances"] if before.get(i["name"]) != i]


def resources(gpus, port, vport):
    return {"gpu:" + str(g).lower() for g in gpus} | {"port:%s" % port, "vport:%s" % vport}


def replay(live, new, steps, restarted):
    """Apply the steps to the live state; assert the invariant at every start; return the final state.

    An instance runs its new config when it is planned and not in ``restarted`` (unchanged), or once restarted."""
    planned = {i["name"]: i for i in new["instances"]}
    uuid_of = {}
    for inst in new["instances"]:
        uuid_of.update({str(g): u.lower() for g, u in zip(inst["gpus"], inst["gpu_uuids"])})
    state = {}
    for unit in live:
        gpus = {uuid_of.get(str(g), str(g).lower()) for g in unit["gpus"]}
        state[unit["name"]] = {"gpus": gpus, "ports": {unit["port"], "v%s" % unit["vllm_port"]},
                               "new": unit["name"] in planned and unit["name"] not in restarted}
    for step in steps:
        state.pop(step["name"], None)
        if step["action"] == "stop":
            continue
        inst = planned[step["name"]]
        mine = {"gpus": {u.lower() for u in inst["gpu_uuids"]},
                "ports": {inst["port"], "v%s" % inst["vllm_port"]}, "new": True}
        for other, held in state.items():
            assert not (held["ports"] & mine["ports"]), (step, other, held)
            if held["gpus"] & mine["gpus"]:
                assert held["new"] and planned[other]["unit"] in inst["share_gpus_with"], (step, other, held, steps)
        state[step["name"]] = mine
    return state


def check(old, new):
    live = running(old)
    result = plan_transition(live, new["instances"], changed(old, new), recorded=old, plan=new)
    assert result["problems"] == []
    final = replay(live, new, result["steps"], changed(old, new))
    assert set(final) == {i["name"] for i in new["instances"]}
    # every removed instance is stopped, every planned one (re)started at most once
    names = [s["name"] for s in result["steps"] if s["action"] == "restart"]
    assert len(names) == len(set(names))
    assert set(changed(old, new)) <= set(names)
    return result


def test_swapping_two_instances_numa_nodes_stops_one_first_and_reports_the_gap():
    old = plan([{"name": "a", "model": "m", "tensor_parallel_size": 4, "numa_node": 0},
                {"name": "b", "model": "n", "tensor_parallel_size": 4, "numa_node": 1}])
    new = plan([{"name": "a", "model": "m", "tensor_parallel_size": 4, "numa_node": 1},
                {"name": "b", "model": "n", "tensor_parallel_size": 4, "numa_node": 0}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("stop", "b"), ("restart", "a"), ("restart", "b")]
    assert result["steps"][0]["why"].startswith("frees GPU ")
    # b (model n) is down from step 1 to step 3; a (model m) only during its own restart
    assert {g["model"]: (g["from_step"], g["to_step"]) for g in result["gaps"]} == {"m": (2, 2), "n": (1, 3)}
    assert any("GAP: model n has no instance up on this host from step 1 until step 3" in line
               for line in result["lines"])


def test_the_demo_case_shared_gpu_back_to_one_instance_per_numa_node_needs_no_stop():
    """The node of issue 23: both on GPU 0 (0.45 each), then back to one per NUMA node."""
    old = plan([{"name": "numa0", "model": "m", "gpus": [0], "gpu_memory_utilization": 0.45},
                {"name": "numa1", "model": "m", "gpus": [0], "gpu_memory_utilization": 0.45}])
    new = plan([{"name": "numa0", "model": "m", "numa_node": 0, "gpu_memory_utilization": 0.45},
                {"name": "numa1", "model": "m", "numa_node": 1, "gpu_memory_utilization": 0.45}])
    result = check(old, new)
    # numa0 stays on GPU 0 but must wait until numa1 (which still holds GPU 0) moved away
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("restart", "numa1"), ("restart", "numa0")]
    assert result["gaps"] == []
    assert all(s["frontdoor"] == s["drain_frontdoor"] == "m" for s in result["steps"])


def test_exclusive_to_shared_restarts_in_plan_order_with_no_stop():
    old = plan([{"name": "a", "model": "m", "numa_node": 0}, {"name": "b", "model": "m", "numa_node": 1}])
    new = plan([{"name": "a", "model": "m", "gpus": [0], "gpu_memory_utilization": 0.45},
                {"name": "b", "model": "m", "gpus": [0], "gpu_memory_utilization": 0.45}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("restart", "a"), ("restart", "b")]


def test_tp_growing_onto_a_neighbours_gpu_moves_the_neighbour_first():
    old = plan([{"name": "a", "model": "m", "gpus": [0]}, {"name": "b", "model": "n", "gpus": [1]}])
    new = plan([{"name": "a", "model": "m", "gpus": [0, 1], "tensor_parallel_size": 2},
                {"name": "b", "model": "n", "gpus": [2]}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("restart", "b"), ("restart", "a")]


def test_a_renamed_instance_starts_before_the_old_name_stops_when_they_share_nothing():
    old = plan([{"name": "a", "model": "m", "gpus": [0], "port": 8000}])
    new = plan([{"name": "c", "model": "m", "gpus": [1], "port": 8001, "vllm_port": 26000}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("restart", "c"), ("stop", "a")]
    assert result["steps"][1]["removed"] and result["steps"][1]["drain_frontdoor"] == "m"
    assert result["gaps"] == [] and result["removed"] == ["a"]


def test_make_before_break_a_renamed_instance_starts_before_its_neighbour_restarts():
    """TP 1 -> 2 onto the GPU a renamed neighbour leaves: the new name starts first, so m keeps an instance."""
    old = plan([{"name": "a", "model": "m", "gpus": [0]}, {"name": "b", "model": "m", "gpus": [2]}])
    new = plan([{"name": "a", "model": "m", "gpus": [2, 3], "tensor_parallel_size": 2},
                {"name": "c", "model": "m", "gpus": [1]}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("stop", "b"), ("restart", "c"), ("restart", "a")]
    assert result["gaps"] == []


def test_a_renamed_instance_on_a_free_gpu_still_waits_for_the_old_names_vllm_port_range():
    old = plan([{"name": "a", "model": "m", "gpus": [0], "port": 8000}])
    new = plan([{"name": "c", "model": "m", "gpus": [1], "port": 8001}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("stop", "a"), ("restart", "c")]
    assert "VLLM_PORT" in result["steps"][0]["why"]


def test_a_renamed_instance_on_the_same_gpu_stops_the_old_name_first():
    old = plan([{"name": "a", "model": "m", "gpus": [0]}])
    new = plan([{"name": "c", "model": "m", "gpus": [0]}])
    result = check(old, new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("stop", "a"), ("restart", "c")]
    assert result["gaps"] == [{"model": "m", "from_step": 1, "to_step": 2}]


def test_a_model_changed_under_an_instance_is_named():
    old = plan([{"name": "a", "model": "m", "gpus": [0]}])
    new = plan([{"name": "a", "model": "n", "gpus": [0]}])
    result = check(old, new)
    assert result["steps"][0]["why"].endswith("model m -> n")
    # drained at the front door it serves in now (model m's), put back in none (model n has no front door)
    assert (result["steps"][0]["drain_frontdoor"], result["steps"][0]["frontdoor"]) == ("m", "")
    assert result["steps"][0]["drain_url"] == old["instances"][0]["url"]


def test_a_run_that_failed_half_way_resumes_from_what_runs():
    """Swap a<->b failed at b's gate: b was stopped for room, a failed and is stopped. Both start now."""
    old = plan([{"name": "a", "model": "m", "numa_node": 0}, {"name": "b", "model": "m", "numa_node": 1}])
    new = plan([{"name": "a", "model": "m", "numa_node": 1}, {"name": "b", "model": "m", "numa_node": 0}])
    live = [dict(u, state="failed") for u in running(old)]
    result = plan_transition(live, new["instances"], ["a", "b"], recorded=new, plan=new)
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("restart", "a"), ("restart", "b")]


def test_a_removed_instance_kept_by_prune_false_that_is_in_the_way_is_a_problem_before_anything_changes():
    old = plan([{"name": "a", "model": "m", "gpus": [0]}])
    new = plan([{"name": "c", "model": "m", "gpus": [0]}])
    result = plan_transition(running(old), new["instances"], ["c"], recorded=old, plan=new, prune=False)
    assert result["steps"] == []
    assert "vllm_service_prune is false" in result["problems"][0] and "set vllm_service_prune: true" in \
        result["problems"][0]


def test_an_instance_added_at_the_head_starts_alone_and_a_removed_one_stops_alone():
    """Issue 39, ports and GPUs stay put: with the recorded plan's slots (through plan.json's JSON), adding an instance
    at the head starts that one and restarts none (without them all four restarted, each on the next port, range and
    GPU); removing one stops it and restarts none (tests/unit/roles/test_plan_slots.py holds the plan's cases)."""
    def inst(name):
        return {"name": name, "model": "n"}

    def plan_of(names, recorded=None):
        slots = json.loads(json.dumps(recorded["slots"])) if recorded else None
        return build_plan(MODELS, [inst(n) for n in names], dict(SEED, slots=slots), {}, host="seed")

    old = plan_of("abc")
    assert changed(old, plan_of("zabc")) == ["z", "a", "b", "c"]
    added = plan_of("zabc", old)
    assert changed(old, added) == ["z"]
    assert [(s["action"], s["name"]) for s in check(old, added)["steps"]] == [("restart", "z")]
    removed = plan_of("ac", old)
    assert changed(old, removed) == []
    assert [(s["action"], s["name"]) for s in check(old, removed)["steps"]] == [("stop", "b")]


def test_nothing_changed_is_no_step():
    old = plan([{"name": "a", "model": "m", "numa_node": 0}])
    result = check(old, old)
    assert result["steps"] == [] and result["lines"] == ["No instance to stop or (re)start."]


def test_the_probe_rows_parse_from_the_process_and_fall_back_to_the_unit():
    text = ("live\tvllm-a.service\ta\tactive\t4242\tPATH=/x\\0CUDA_VISIBLE_DEVICES=GPU-AB,GPU-CD\\0VLLM_PORT=25000"
            "\t/p/python\\0-m\\0vllm\\0--port\\08001\\0--x\tCUDA_VISIBLE_DEVICES=9\n"
            "live\tvllm-b.service\tb\tactivating\t0\t-\t-\tCUDA_VISIBLE_DEVICES=3 VLLM_PORT=25100\n"
            "other line\n")
    a, b = parse_live(text)
    assert a == {"unit": "vllm-a.service", "name": "a", "state": "active", "pid": 4242, "source": "process",
                 "gpus": ["GPU-AB", "GPU-CD"], "port": 8001, "vllm_port": 25000}
    assert b["source"] == "unit" and b["gpus"] == ["3"] and b["vllm_port"] == 25100 and b["port"] is None


def test_the_filter_takes_the_probe_text_and_the_recorded_plan_as_json():
    old = plan([{"name": "a", "model": "m", "gpus": [0]}])
    new = plan([{"name": "a", "model": "m", "gpus": [1]}])
    text = "live\t%s\ta\tactive\t0\t-\t-\tCUDA_VISIBLE_DEVICES=%s VLLM_PORT=%s\n" % (
        old["instances"][0]["unit"], old["instances"][0]["cuda_visible_devices"], old["instances"][0]["vllm_port"])
    result = vllm_service_transition(new, text, ["a"], recorded=json.dumps(old))
    assert [(s["action"], s["name"]) for s in result["steps"]] == [("restart", "a")]
    assert "moves from GPU" in result["steps"][0]["why"]
    assert vllm_service_transition(new, text, ["a"], recorded="not json {")["steps"][0]["name"] == "a"


# --------------------------------------------------------------------------- properties

def _instance(draw, name, model):
    kind = draw(st.sampled_from(["numa", "gpus1", "gpus2", "shared"]))
    if kind == "numa":
        return {"name": name, "model": model, "numa_node": draw(st.integers(0, 1)),
                "tensor_parallel_size": draw(st.sampled_from([1, 2, 4]))}
    if kind == "gpus1":
        return {"name": name, "model": model, "gpus": [draw(st.integers(0, 7))]}
    if kind == "gpus2":
        first = draw(st.sampled_from([0, 2, 4, 6]))
        return {"name": name, "model": model, "gpus": [first, first + 1], "tensor_parallel_size": 2}
    return {"name": name, "model": model, "gpus": [draw(st.integers(0, 7))], "gpu_memory_utilization": 0.3}


@st.composite
def plans(draw):
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=0, max_size=4, unique=True))
    instances = [_instance(draw, n, draw(st.sampled_from(["m", "n"]))) for n in names]
    if draw(st.booleans()):
        ports = draw(st.permutations([8000, 8001, 8002, 8003, 8004]))
        for inst, port in zip(instances, ports):
            inst["port"] = port
    try:
        return plan(instances)
    except PlanContractError:
        assume(False)
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(old=plans(), new=plans())
def test_no_order_ever_starts_an_instance_on_what_a_running_instance_holds(old, new):
    result = check(old, new)
    stops = [s["name"] for s in result["steps"] if s["action"] == "stop" and s["removed"]]
    assert sorted(stops) == result["removed"]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(old=plans(), new=plans())
def test_a_second_run_after_the_transition_has_nothing_to_do(old, new):
    check(old, new)
    result = plan_transition(running(new), new["instances"], [], recorded=new, plan=new)
    assert result["steps"] == [] and result["gaps"] == []


@pytest.mark.parametrize("junk", [None, "", "live\tx", "live\ta\tb\tc\td\te\tf\tg\th\n\x00\x00"])
def test_junk_probe_output_never_raises(junk):
    assert isinstance(parse_live(junk), list)
