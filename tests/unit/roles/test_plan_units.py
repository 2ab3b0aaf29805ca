"""The plan's units: what each instance's argv and environment say, and what the plan refuses.

Table-driven cases in tests/unit/data/plan_units_cases.yml, each through ``build_plan`` (the one entry
point: the inventory normalised once, placed on recorded host facts, then the units), plus hypothesis
properties for the quoting that carries arguments and environment values through a unit file unchanged.
"""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_service_units import vllm_service_units
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import (
    rank_cpu_sets,
    systemd_env_assignment,
    systemd_quote,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_args import check_extra_args, parse_extra_args
from systemd_unit import split_exec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
with open(os.path.join(ROOT, "tests", "unit", "data", "plan_units_cases.yml")) as fh:
    CASES = yaml.safe_load(fh)["cases"]
SHA = "0123456789abcdef0123456789abcdef01234567"


def host_facts(name):
    with open(os.path.join(ROOT, "tests", "unit", "data", "hosts", name + ".json")) as fh:
        return json.load(fh)


def plan_of(case):
    """The case through build_plan: its models (pinned where they give no revision), instances, facts, inputs."""
    models = copy.deepcopy(case["models"])
    for model in models.values():
        if isinstance(model, dict) and "repo_id" in model and "revision" not in model:
            model["revision"] = SHA
    facts = dict(host_facts(case["host"]) if "host" in case else {}, **case.get("facts", {}))
    inputs = dict(case.get("inputs", {}))
    if "host" not in case:
        inputs.setdefault("vllm_preflight_gpu", False)
    return build_plan(models, case["instances"], facts, inputs, host="h")


def per_instance(value, names):
    """An expectation for every instance, or {name: expectation} for some."""
    if isinstance(value, dict) and value and set(value) <= set(names):
        return value
    return {name: value for name in names}


def groups_in(argv, group):
    n = len(group)
    return any(argv[i:i + n] == group for i in range(len(argv) - n + 1))


def check_refusal(case, expect):
    with pytest.raises(PlanContractError) as err:
        plan_of(case)
    text = str(err.value)
    for needle in expect["error"]:
        assert needle in text, (needle, text)
    for needle in expect.get("never", []):
        assert needle not in text


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case):
    expect = case["expect"]
    if "error" in expect:
        check_refusal(case, expect)
        return
    plan = plan_of(case)
    units = {u["name"]: u for u in vllm_service_units(plan["instances"])}
    names = list(units)
    assert names == [i["name"] for i in case["instances"]]
    for name, groups in per_instance(expect.get("argv_has", {}), names).items():
        for group in groups:
            assert groups_in(units[name]["argv"], group), (name, group, units[name]["argv"])
    for name, flags in per_instance(expect.get("argv_lacks", {}), names).items():
        for flag in flags:
            assert flag not in units[name]["argv"], (name, flag)
    for name, env in per_instance(expect.get("env", {}), names).items():
        have = dict(units[name]["environment"])
        for key, value in env.items():
            assert have.get(key) == value, (name, key, have.get(key))
    for name, keys in per_instance(expect.get("env_lacks", {}), names).items():
        assert not set(keys) & set(dict(units[name]["environment"])), name
    for key in ("numa_mode", "cpu_affinity", "connect_host", "unit"):
        if key in expect:
            for name, value in per_instance(expect[key], names).items():
                assert units[name][key] == value, (name, key)
    if "argv_prefix" in expect:
        for unit in units.values():
            assert unit["argv"][:len(expect["argv_prefix"])] == expect["argv_prefix"]
    if "warnings" in expect:
        assert len(plan["warnings"]) == len(expect["warnings"]), plan["warnings"]
        for got, want in zip(plan["warnings"], expect["warnings"]):
            assert want in got
    for unit in units.values():
        # every unit's lines carry exactly its argv and environment
        assert split_exec(" ".join(unit["exec_start"])) == unit["argv"]
        env_back = [split_exec(line, dollars=False)[0].split("=", 1) for line in unit["environment_lines"]]
        assert env_back == [list(pair) for pair in unit["environment"]]


def test_every_case_id_is_unique():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))


def test_input_is_not_changed():
    case = CASES[0]
    models, instances = copy.deepcopy(case["models"]), copy.deepcopy(case["instances"])
    for model in models.values():
        model["revision"] = SHA
    before = json.dumps([models, instances], sort_keys=True)
    build_plan(models, instances, host_facts(case["host"]), host="h")
    assert json.dumps([models, instances], sort_keys=True) == before


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
