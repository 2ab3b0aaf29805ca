"""The vllm_service_specs filter: what each instance's unit says, and what it refuses.

Table-driven cases in tests/unit/data/vllm_service_specs_cases.yml (plans from the real planner
over recorded host facts), plus hypothesis properties for the quoting that carries arguments and
environment values through a unit file unchanged.
"""
from __future__ import annotations

import json
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_service_specs import vllm_service_specs
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import plan as gpu_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import (
    check_extra_args,
    parse_extra_args,
    rank_cpu_sets,
    systemd_env_assignment,
    systemd_quote,
)
from systemd_unit import split_exec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
with open(os.path.join(ROOT, "tests", "unit", "data", "vllm_service_specs_cases.yml")) as fh:
    CASES = yaml.safe_load(fh)["cases"]


def host_facts(name):
    with open(os.path.join(ROOT, "tests", "unit", "data", "hosts", name + ".json")) as fh:
        return json.load(fh)


def build_plan(case):
    if "plan" in case:
        return case["plan"]
    facts = host_facts(case["host"])
    return gpu_plan(facts["gpus"], case["instances"], facts["gpu_links"], host=case["host"])


def per_instance(value, names):
    """An expectation for every instance, or {name: expectation} for some."""
    if isinstance(value, dict) and value and set(value) <= set(names):
        return value
    return {name: value for name in names}


def groups_in(argv, group):
    n = len(group)
    return any(argv[i:i + n] == group for i in range(len(argv) - n + 1))


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    expect = case["expect"]
    plan = build_plan(case)
    if "error" in expect:
        with pytest.raises(AnsibleFilterError) as err:
            vllm_service_specs(plan, case["models"], **case.get("options", {}))
        text = str(err.value)
        for needle in expect["error"]:
            assert needle in text, (needle, text)
        for needle in expect.get("never", []):
            assert needle not in text
        return
    result = vllm_service_specs(plan, case["models"], **case.get("options", {}))
    specs = {s["name"]: s for s in result["instances"]}
    names = list(specs)
    assert names == [e["name"] for e in plan]
    for name, groups in per_instance(expect.get("argv_has", {}), names).items():
        for group in groups:
            assert groups_in(specs[name]["argv"], group), (name, group, specs[name]["argv"])
    for name, flags in per_instance(expect.get("argv_lacks", {}), names).items():
        for flag in flags:
            assert flag not in specs[name]["argv"], (name, flag)
    for name, env in per_instance(expect.get("env", {}), names).items():
        have = dict(specs[name]["environment"])
        for key, value in env.items():
            assert have.get(key) == value, (name, key, have.get(key))
    for name, keys in per_instance(expect.get("env_lacks", {}), names).items():
        assert not set(keys) & set(dict(specs[name]["environment"])), name
    for key in ("numa_mode", "cpu_affinity", "connect_host"):
        if key in expect:
            for name, value in per_instance(expect[key], names).items():
                assert specs[name][key] == value, (name, key)
    if "argv_prefix" in expect:
        for spec in specs.values():
            assert spec["argv"][:len(expect["argv_prefix"])] == expect["argv_prefix"]
    if "warnings" in expect:
        assert len(result["warnings"]) == len(expect["warnings"]), result["warnings"]
        for got, want in zip(result["warnings"], expect["warnings"]):
            assert want in got
    for spec in specs.values():
        # every spec's unit lines carry exactly its argv and environment
        assert split_exec(" ".join(spec["exec_start"])) == spec["argv"]
        env_back = [split_exec(line, dollars=False)[0].split("=", 1) for line in spec["environment_lines"]]
        assert env_back == spec["environment"]


def test_every_case_id_is_unique():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))


def test_input_is_not_changed():
    case = CASES[0]
    plan = build_plan(case)
    before = json.dumps([plan, case["models"]], sort_keys=True)
    vllm_service_specs(plan, case["models"], **case.get("options", {}))
    assert json.dumps([plan, case["models"]], sort_keys=True) == before


# --------------------------------------------------------------------------- properties

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_an_argument_survives_the_unit_file(arg):
    assert split_exec(systemd_quote(arg)) == [arg]


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True), TEXT)
def test_an_environment_value_survives_the_unit_file(name, value):
    assert split_exec(systemd_env_assignment(name, value), dollars=False) == [f"{name}={value}"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"--[a-z][a-z0-9-]{0,15}", fullmatch=True),
                          st.lists(st.from_regex(r"[A-Za-z0-9_./:]{1,10}", fullmatch=True), max_size=2)),
                max_size=5))
def test_extra_args_lists_parse_back_into_their_groups(groups):
    tokens = [tok for flag, values in groups for tok in [flag] + values]
    assert parse_extra_args(tokens, "x") == [[flag] + values for flag, values in groups]


@pytest.mark.parametrize("flag", ["--port", "--PORT=1", "--tensor_parallel_size", "-tp", "--no-trust-remote-code",
                                  "--served-model-name", "--api-key", "--uds"])
def test_role_flags_and_secrets_are_always_refused(flag):
    assert check_extra_args([[flag, "1"]], "x")


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 255), min_size=1, max_size=128), st.integers(1, 16))
def test_rank_cpu_sets_are_equal_disjoint_shares(cpus, ranks):
    """VLLM_CPU_OMP_THREADS_BIND: every rank gets its own CPUs of the instance, as many as the others."""
    if len(cpus) < ranks:
        return
    sets = rank_cpu_sets(sorted(cpus), ranks)
    assert len(sets) == ranks
    assert all(s and len(s) == len(sets[0]) for s in sets)
    flat = [c for s in sets for c in s]
    assert len(flat) == len(set(flat)) and set(flat) <= cpus
    runs = sum(1 for c in cpus if c - 1 not in cpus)
    assert len(cpus) - len(flat) < ranks * runs  # at most a remainder per contiguous run is left out


def test_rank_cpu_sets_keep_hyperthread_siblings_together():
    sets = rank_cpu_sets(list(range(0, 32)) + list(range(64, 96)), 4)
    assert sets[1] == list(range(8, 16)) + list(range(72, 80))
