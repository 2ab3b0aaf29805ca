"""Every refusal clean, nothing accepted that cannot serve (issue 24): the checks behind the refusals.

The corpus in ``tests/integration/refusals/`` runs the real playbooks; here the functions themselves: the plan
inputs (``host_plan.input_problems``, ``address_problem``), a role's variables against its argument spec
(``role_options.option_problems``), the environment (``$VAR``), the CPU ranks of a host without GPUs, where a
flag in ``extra_args`` is reported, the filters that never raise, the multi-node refusals that say only what is
true and ``nodes: {group, count}`` in the group's own order. And two hypothesis properties: any junk in
``vllm_models`` / ``vllm_instances`` / the variables gives messages, never an exception, and no message names an
internal class.
"""
from __future__ import annotations

import os
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError, AnsibleUndefinedVariable
from ansible.parsing.dataloader import DataLoader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter import vllm_inventory as inventory_filter
from ansible_collections.inferops.vllm.plugins.filter import vllm_plan as plan_filter
from ansible_collections.inferops.vllm.plugins.filter.vllm_fleet_view import vllm_fleet_view, vllm_rollout_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import (
    PLAN_INPUTS,
    PlanContractError,
    address_problem,
    build_plan,
    cpu_rank_problems,
    input_problems,
    inventory_problems,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils import host_plan, multinode
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import INSTANCE_KEYS, MODEL_KEYS, normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.role_options import option_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_args import env_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import kind, plain, scrub, shown
from test_plan_contract import ROOT, SHA, host_facts
from test_plan_multinode import BIG, fleet_of, plan_of

M = {"m": {"repo_id": "org/m", "revision": SHA, "num_attention_heads": 32}}
ONE = [{"name": "chat", "model": "m"}]


def load_yaml(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


PREFLIGHT_SPEC = load_yaml("roles", "vllm_preflight", "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]


# --------------------------------------------------------------------------- values as the user wrote them

def test_plain_values_lose_ansible_s_tagged_classes():
    data = DataLoader().load("{1: {repo_id: a/b}, m: [1, x, 1.5, true, null]}")
    assert type(next(iter(data))).__name__.startswith("_AnsibleTagged")
    out = plain(data)
    assert out == {1: {"repo_id": "a/b"}, "m": [1, "x", 1.5, True, None]}
    assert {type(k) for k in out} == {int, str} and [type(v) for v in out["m"]] == [int, str, float, bool, type(None)]


@pytest.mark.parametrize("value,word", [(None, "null"), (True, "a boolean"), (3, "a whole number"), (0.5, "a number"),
                                        ("x", "a string"), ({}, "a dict"), ([], "a list")])
def test_kind_names_values_as_yaml_does(value, word):
    assert kind(value) == word


def test_shown_and_scrub():
    assert shown("x" * 200).endswith(" ...") and len(shown("x" * 200)) == 80
    assert shown(DataLoader().load("[1, a]")) == "[1, 'a']"
    assert scrub("expected str instance, _AnsibleTaggedInt found in _AnsibleLazyTemplateDict") == \
        "expected str instance, int found in dict"


# --------------------------------------------------------------------------- the plan inputs

@pytest.mark.parametrize("value,fix", [
    ("0.0.0.0:8000", "set vllm_service_host: 0.0.0.0 and the port on each instance"),
    ("[::1]:8000", "set vllm_service_host: ::1 and the port"),
    ("[::]", "give the IPv6 address without brackets: ::"),
    ("http://10.0.0.5:8000/v1", "a URL; give the address only, e.g. 10.0.0.5"),
    ("gpu host", "neither an IP address nor a host name"),
    ("", "use an address such as 127.0.0.1"),
    (8000, "use an address such as 127.0.0.1"),
])
def test_an_address_with_a_port_or_a_scheme_is_refused(value, fix):
    problem = address_problem("vllm_service_host", value)
    assert problem and problem.startswith("vllm_service_host is ") and fix in problem, problem


@pytest.mark.parametrize("variable,fix", [
    ("vllm_frontdoor_bind_address", "set vllm_frontdoor_bind_address: 0.0.0.0 and each model's port in "
                                    "vllm_models.<model>.frontdoor_port"),
    ("vllm_service_node_exporter_bind_address", "set vllm_service_node_exporter_bind_address: 0.0.0.0 and the port "
                                                "in vllm_service_node_exporter_port"),
])
def test_an_address_with_a_port_names_where_that_listeners_port_goes(variable, fix):
    problem = address_problem(variable, "0.0.0.0:9100", allow_empty=True)
    assert problem and fix in problem and "on each instance" not in problem, problem


@pytest.mark.parametrize("value", ["127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "localhost",
                                   "gpu-1.example.internal", "*"])
def test_addresses_to_bind_to(value):
    assert address_problem("vllm_service_host", value) is None


def test_every_plan_input_problem_at_once():
    problems = input_problems({
        "vllm_preflight_gpu": "maybe", "vllm_install_prefix": "opt/vllm",
        "vllm_service_host": "0.0.0.0:80", "vllm_service_vllm_port_base": 80, "vllm_service_vllm_port_stride": "x",
        "vllm_service_environment": {"PATH": "${PATH}:/x"}, "vllm_service_unit_prefix": "a b",
        "vllm_verify_idle_gpus": "warn", "vllm_preflight_plan_options": {"base_port": 443, "memory_base": "all",
                                                                         "use_uuids": "sometimes", "typo": 1},
        "vllm_service_network_interface": "eth 1", "vllm_preflight_min_systemd_version": 0})
    text = "\n".join(problems)
    for needle in ("vllm_preflight_gpu is 'maybe' (a string); use true or false",
                   "vllm_install_prefix is 'opt/vllm'; use an absolute path",
                   "vllm_service_host is '0.0.0.0:80', an address with a port",
                   "vllm_service_vllm_port_base is 80; use a TCP port number from 1024 to 65535",
                   "vllm_service_vllm_port_stride is 'x'",
                   "vllm_service_environment: PATH is '${PATH}:/x', but systemd does not expand ${PATH}",
                   "vllm_service_unit_prefix is 'a b'", "vllm_verify_idle_gpus is 'warn'",
                   "vllm_preflight_plan_options has an unknown key 'typo' (known: reserve_mib",
                   "vllm_preflight_plan_options.base_port is 443", "vllm_preflight_plan_options.memory_base is 'all'",
                   "vllm_preflight_plan_options.use_uuids is 'sometimes'", "vllm_service_network_interface is 'eth 1'",
                   "vllm_preflight_min_systemd_version is 0"):
        assert needle in text, (needle, text)
    assert len(problems) == 14


def test_plan_inputs_as_strings_from_the_command_line_are_read_as_their_types():
    inputs = {"vllm_preflight_gpu": "no", "vllm_service_vllm_port_base": "30000", "vllm_service_numa_bind": "yes",
              "vllm_install_variant": "cpu"}
    assert input_problems(inputs) == []
    plan = build_plan(M, ONE, {"systemd_version": 252, "online_cpus": "0-3"}, inputs, host="h")
    assert plan["gpu"] is False and plan["instances"][0]["vllm_port"] == 30000


def test_the_planner_refuses_what_the_validation_refuses():
    with pytest.raises(PlanContractError) as err:
        build_plan(M, ONE, host_facts("h200-1gpu"), {"vllm_service_host": "0.0.0.0:8000"}, host="gpu1")
    assert err.value.lines == ["host gpu1: vllm_service_host is '0.0.0.0:8000', an address with a port; set "
                               "vllm_service_host: 0.0.0.0 and the port on each instance (port; left out, the plan "
                               "gives one from base_port)"]
    assert inventory_problems(M, ONE, {"vllm_service_host": "0.0.0.0:8000"}, "gpu1") == err.value.lines


# --------------------------------------------------------------------------- a role's variables, its spec's types

def test_the_role_s_settings_are_checked_against_its_spec_in_the_project_s_words():
    problems = option_problems(PREFLIGHT_SPEC, {
        "vllm_preflight_min_free_gib": "lots", "vllm_preflight_expected_gpu_count": "eight",
        "vllm_preflight_show_plan": "sometimes", "vllm_preflight_health_xid_fail_codes": [79, "x"],
        "vllm_preflight_health_severities": ["pcie_width"], "vllm_preflight_expected_gpu_name": ["H200"],
        "vllm_preflight_health_shm_min_mib": "1024", "vllm_preflight_min_systemd_version": 7,
        "vllm_instances": "skipped"}, skip=set(PLAN_INPUTS) | {"vllm_instances"})
    assert problems == [
        "vllm_preflight_expected_gpu_count is 'eight' (a string); use a whole number",
        "vllm_preflight_expected_gpu_name is ['H200'] (a list); use a string",
        "vllm_preflight_min_free_gib is 'lots' (a string); use a number",
        "vllm_preflight_show_plan is 'sometimes' (a string); use true or false",
        "vllm_preflight_health_severities is ['pcie_width'] (a list); use a dict (NAME: value)",
        "vllm_preflight_health_xid_fail_codes has 'x' (a string) among its items; use a list of whole numbers",
    ]


def test_choices_of_a_spec():
    spec = {"mode": {"type": "str", "choices": ["a", "b"]}, "n": {"type": "int", "choices": [1, 2]}}
    assert option_problems(spec, {"mode": "c", "n": "2"}) == ["mode is 'c'; use one of a, b"]
    assert option_problems(spec, {"mode": ["a"]}) == ["mode is ['a'] (a list); use a string: one of a, b"]


# --------------------------------------------------------------------------- what cannot serve

@pytest.mark.parametrize("value", ["$PATH:/opt/bin", "${HOME}/cache", "a-$B_1"])
def test_a_shell_variable_in_the_environment_is_refused(value):
    problems = []
    assert env_problems({"X": value}, "vllm_instances[0] (chat).env", problems) == {}
    assert len(problems) == 1 and "systemd does not expand $" in problems[0] and "write the value out" in problems[0]


@pytest.mark.parametrize("value", ["100$", "$$", "50%", "a$1", "$"])
def test_a_dollar_sign_that_names_no_variable_is_kept(value):
    problems = []
    assert env_problems({"X": value}, "env", problems) == {"X": value} and problems == []


@pytest.mark.parametrize("port,ok", [(80, False), (443, False), (1023, False), (1024, True), (8000, True)])
def test_an_instance_port_below_1024_is_refused(port, ok):
    problems = normalise(M, [{"name": "chat", "model": "m", "port": port}], host="h")["problems"]
    assert (problems == []) is ok, problems
    if not ok:
        assert problems[0].startswith(f"host h: vllm_instances[0] (chat).port is {port}; use a TCP port number 1024")
        assert "CAP_NET_BIND_SERVICE" in problems[0] and "frontdoor_port" in problems[0]


def test_a_base_port_below_1024_is_refused_a_front_door_below_1024_is_not():
    assert "base_port is 80" in inventory_problems(M, ONE, {"vllm_preflight_plan_options": {"base_port": 80}}, "h")[0]
    models = {"m": dict(M["m"], frontdoor_port=80)}
    assert build_plan(models, ONE, host_facts("h200-1gpu"), host="h")["frontdoors"][0]["port"] == 80


def test_more_ranks_than_cpus_on_a_host_without_gpus():
    records = [{"name": "a", "position": 0, "tensor_parallel_size": 2, "pipeline_parallel_size": 2},
               {"name": "b", "position": 1, "tensor_parallel_size": 2, "pipeline_parallel_size": 1}]
    (problem,) = cpu_rank_problems(records, "0-2")
    assert problem.startswith("vllm_instances[0] (a): tensor_parallel_size 2 x pipeline_parallel_size 2 is 4 ranks "
                              "on this host, but it has 3 online CPUs (0-2)")
    assert "lower tensor_parallel_size or pipeline_parallel_size to 3 ranks or fewer" in problem
    assert cpu_rank_problems(records, None) == [] and cpu_rank_problems(records, "0-3") == []
    with pytest.raises(PlanContractError) as err:
        build_plan(M, [{"name": "a", "model": "m", "tensor_parallel_size": 4}], {"online_cpus": "0-1"},
                   {"vllm_preflight_gpu": False, "vllm_install_variant": "cpu"}, host="cpu1")
    assert "host cpu1: vllm_instances[0] (a): tensor_parallel_size 4 x pipeline_parallel_size 1 is 4 ranks" in str(
        err.value)


# --------------------------------------------------------------------------- the right variable named

def test_a_flag_in_the_model_s_extra_args_names_the_model():
    models = {"m": dict(M["m"], extra_args=["--port 9000"])}
    problems = normalise(models, [{"name": "a", "model": "m"}, {"name": "b", "model": "m"}], host="h")["problems"]
    assert problems == ["host h: vllm_models.m.extra_args: '--port' duplicates a flag the role sets (--port); remove "
                        "it and set port of the instance instead"]


def test_a_flag_in_the_instance_s_extra_args_names_the_instance():
    problems = normalise(M, [{"name": "a", "model": "m", "extra_args": ["--tp", "2"]}], host="h")["problems"]
    assert problems == ["host h: vllm_instances[0] (a).extra_args: '--tp' duplicates a flag the role sets "
                        "(--tensor-parallel-size); remove it and set tensor_parallel_size of the instance instead"]


def test_a_flag_in_both_names_both():
    models = {"m": dict(M["m"], extra_args=["--enable-prefix-caching"])}
    problems = normalise(models, [{"name": "a", "model": "m", "extra_args": ["--no-enable-prefix-caching"]}],
                         host="h")["problems"]
    assert problems == ["host h: vllm_instances[0] (a).extra_args: '--no-enable-prefix-caching' is also in "
                        "vllm_models.m.extra_args (as '--enable-prefix-caching'); give it once: remove it from one "
                        "of the two"]


# --------------------------------------------------------------------------- shapes that used to raise

def test_a_model_keyed_by_a_number():
    models, instances = DataLoader().load("{1: {repo_id: a/b, revision: %s}}" % SHA), DataLoader().load(
        "[{name: chat, model: 1}]")
    problems = inventory_filter.vllm_inventory_problems(models, instances, host="h")
    assert problems == [
        "host h: vllm_models: the model key 1 is a whole number, not a name; quote it in YAML ('1':) or use a "
        "lower-case name such as 'llama-8b' (instances name it in model)",
        "host h: vllm_instances[0] (chat).model is 1 (a whole number); set it to the key of a model in vllm_models, "
        "as a string (quote it, '1', and the model's key too)"]


@pytest.mark.parametrize("models,instances,needle", [
    ({"m": None}, ONE, "vllm_models.m must be a dict with at least repo_id and revision (or path), got null"),
    ({"m": None}, ONE, "vllm_instances[0] (chat).model is 'm', whose entry vllm_models.m is refused (see its problem)"),
    ([M], ONE, "vllm_models must be a dict of model name -> settings (repo_id, revision, ...), got a list"),
    (M, {"name": "chat", "model": "m"}, "got a dict; write it as a list: [{'name': 'chat', 'model': 'm'}]"),
    (M, [None], "vllm_instances[0] must be a dict with at least name and model, got null"),
    (M, [{"name": "chat", "model": ["m"]}], "vllm_instances[0] (chat).model is ['m'] (a list)"),
    (M, [{"name": 7, "model": "m"}], "vllm_instances[0]: name 7 cannot be used in a systemd unit name"),
    (M, [{"name": "chat", "model": "m", "env": {"A": None}}], "env: A is null; give it a string or a number"),
])
def test_shapes_that_used_to_raise_are_refused(models, instances, needle):
    problems = inventory_filter.vllm_inventory_problems(models, instances, host="h")
    assert any(needle in p for p in problems), problems


def test_the_plan_filter_returns_its_refusals_when_asked_and_never_raises(monkeypatch):
    out = plan_filter.vllm_plan(M, [{"name": "chat", "model": "m", "gpus": [9]}], facts=host_facts("h200-1gpu"),
                                host="gpu1", on_problems="return")
    assert out["schema"] == 1 and out["host"] == "gpu1" and "instances" not in out
    assert out["problems"] == ["host gpu1: vllm_instances[0] 'chat': gpus names 9, which this host does not have "
                               "(GPU indices here: 0, or their UUIDs from nvidia-smi -L); fix the list or use "
                               "gpus: auto"]
    with pytest.raises(AnsibleFilterError):
        plan_filter.vllm_plan(M, [{"name": "chat", "model": "m", "gpus": [9]}], facts=host_facts("h200-1gpu"),
                              host="gpu1")

    def broken(*_args, **_kwargs):
        raise TypeError("sequence item 0: expected str instance, _AnsibleTaggedInt found")

    monkeypatch.setattr(host_plan, "build_plan", broken)  # the filter imports it when called
    (problem,) = plan_filter.vllm_plan(M, ONE, host="gpu1", on_problems="return")["problems"]
    assert problem.startswith("host gpu1: the plan could not be computed from vllm_models, vllm_instances and the "
                              "plan inputs (TypeError: sequence item 0: expected str instance, int found)")
    monkeypatch.setattr(host_plan, "inventory_problems", broken)
    assert inventory_filter.vllm_inventory_problems(M, ONE, host="gpu1")[0].startswith("host gpu1: the plan could not")


class HostVars(dict):
    """A host's hostvars as a filter sees them: each value templated when it is read, and a template may fail."""

    def __getitem__(self, name):
        value = super().__getitem__(name)
        if isinstance(value, str) and value.startswith("{{"):
            raise AnsibleUndefinedVariable(f"'{value.strip('{} ')}' is undefined")
        return value


def test_the_variables_are_read_one_by_one_so_a_failing_template_names_its_variable():
    hostvars = HostVars(vllm_models=M, vllm_instances=[{"name": "chat", "model": "m", "port": 80}],
                        vllm_service_host="{{ undefined_address }}", vllm_preflight_min_free_gib="lots",
                        ansible_connection="local", unrelated="{{ never_read }}")
    problems = inventory_filter.vllm_inventory_problems(None, None, host="h", variables=hostvars, spec=PREFLIGHT_SPEC)
    assert problems == [
        "host h: vllm_service_host could not be templated ('undefined_address' is undefined); define the variable it "
        "names (group_vars, host_vars or -e) or fix the template",
        "host h: vllm_instances[0] (chat).port is 80; use a TCP port number 1024-65535, or leave it out to get one "
        "from the plan's base port: the unit runs without capabilities (no CAP_NET_BIND_SERVICE), so vLLM cannot bind "
        "a port below 1024; give the model a front door (frontdoor_port) on the low port instead",
        "host h: vllm_preflight_min_free_gib is 'lots' (a string); use a number"]
    # models that cannot be read: said once, the instances are not checked against nothing
    hostvars = HostVars(vllm_models="{{ undefined_models }}", vllm_instances=ONE)
    assert inventory_filter.vllm_inventory_problems(None, None, host="h", variables=hostvars) == [
        "host h: vllm_models could not be templated ('undefined_models' is undefined); define the variable it names "
        "(group_vars, host_vars or -e) or fix the template"]


# --------------------------------------------------------------------------- multi-node: only what is true

def test_a_pipeline_size_that_does_not_split_over_the_hosts_says_only_that():
    inst = dict(BIG, pipeline_parallel_size=3)
    fleet = fleet_of(["seed-1", "seed-2"], **{h: {"instances": [inst]} for h in ("seed-1", "seed-2")})
    with pytest.raises(PlanContractError) as err:
        plan_of("seed-1", [inst], fleet)
    assert err.value.problems == [
        "vllm_instances[0] (m2): nodes_parallel is 'pipeline' over 2 hosts, so pipeline_parallel_size (3) must be a "
        "multiple of 2 (whole stages per host); set pipeline_parallel_size: 2 (one stage of tensor_parallel_size 4 "
        "GPUs per host)"]


def test_group_and_count_follow_the_group_s_own_order():
    # the canary was listed first elsewhere in the inventory, so it comes first in groups['all']
    hostvars = {h: {"group_names": ["gpu_nodes"] + (["canary"] if h == "seed-2" else []), "vllm_instances": []}
                for h in ("seed-1", "seed-2", "seed-3")}
    groups = {"all": ["seed-2", "seed-1", "seed-3"], "canary": ["seed-2"], "gpu_nodes": ["seed-1", "seed-2", "seed-3"]}
    view = vllm_fleet_view(hostvars, groups["all"], groups["all"], groups=groups)
    assert view["seed-2"]["group_positions"] == {"all": 0, "gpu_nodes": 1, "canary": 0}
    inst = dict(BIG, nodes={"group": "gpu_nodes", "count": 2})
    fleet = fleet_of(["seed-2", "seed-1", "seed-3"])
    for host in fleet:
        fleet[host]["group_positions"] = view[host]["group_positions"]
        fleet[host]["groups"] = ["gpu_nodes"]
    mn = plan_of("seed-2", [inst], fleet)["instances"][0]["multinode"]
    assert mn["hosts"] == ["seed-1", "seed-2"] and mn["node_rank"] == 1  # rank 0 is the group's first host
    # without the positions (an older fleet view): the view's order, as before
    for host in fleet:
        del fleet[host]["group_positions"]
    assert plan_of("seed-2", [inst], fleet)["instances"][0]["multinode"]["hosts"] == ["seed-2", "seed-1"]
    # the rollout batches group the same ranks, read from the hosts' plans
    plans = {h: plan_of(h, [inst], fleet) for h in ("seed-1", "seed-2")}
    hostvars = {h: {"vllm_preflight_plan": plans.get(h, {"instances": []})} for h in hostvars}
    plan = vllm_rollout_plan(hostvars, ["seed-2", "seed-1", "seed-3"], [1, "100%"])
    assert plan["units"] == [["seed-2", "seed-1"]]
    # a host without a plan is refused, named (the filter does not work the ranks out again from the inventory)
    del hostvars["seed-3"]["vllm_preflight_plan"]
    with pytest.raises(AnsibleFilterError, match=re.escape("vllm_rollout_plan: seed-3 has no plan (vllm_preflight_plan)")):
        vllm_rollout_plan(hostvars, ["seed-2", "seed-1", "seed-3"], [1, "100%"])


# --------------------------------------------------------------------------- any junk: messages, never an exception

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=6), st.sampled_from(["auto", "m", "chat", "a/b", "--port", "$X", "0,1", SHA]))
KEYS = st.one_of(st.sampled_from(sorted(set(INSTANCE_KEYS) | set(MODEL_KEYS) | {"m"})), st.text(max_size=4),
                 st.integers(0, 3), st.none(), st.booleans())
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(KEYS, inner, max_size=4)), max_leaves=15)
_MODEL = st.dictionaries(st.sampled_from(sorted(MODEL_KEYS)), JUNK, max_size=4).map(
    lambda d: {"repo_id": "org/m", "revision": SHA, **d})
ANY_MODELS = st.one_of(JUNK, st.dictionaries(KEYS, JUNK, max_size=3), st.dictionaries(st.just("m"), _MODEL, max_size=1))
INSTANCE = st.one_of(JUNK, st.dictionaries(st.sampled_from(sorted(INSTANCE_KEYS)), JUNK, max_size=5)
                     .map(lambda d: {"name": "chat", "model": "m", **d}))
ANY_INSTANCES = st.one_of(JUNK, st.lists(INSTANCE, max_size=3))
ANY_VARIABLES = st.dictionaries(st.sampled_from(sorted(PREFLIGHT_SPEC)), JUNK, max_size=4)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(models=ANY_MODELS, instances=ANY_INSTANCES, variables=ANY_VARIABLES)
def test_any_junk_gives_messages_never_an_exception(models, instances, variables):
    problems = inventory_filter.vllm_inventory_problems(models, instances, host="h", variables=variables,
                                                        spec=PREFLIGHT_SPEC)
    assert isinstance(problems, list)
    for problem in problems:
        assert isinstance(problem, str) and problem.startswith("host h: "), problem
        assert "could not be computed" not in problem, problem  # foreseen: a message of its own, not the catch-all
        assert "_AnsibleTagged" not in problem and "Traceback" not in problem


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(models=ANY_MODELS, instances=ANY_INSTANCES, gpu=st.booleans(),
       inputs=st.dictionaries(st.sampled_from(sorted(PLAN_INPUTS)), JUNK, max_size=2))
def test_the_plan_of_any_junk_is_a_plan_or_problems(models, instances, gpu, inputs):
    inputs = dict(inputs, vllm_preflight_gpu=gpu) if "vllm_preflight_gpu" not in inputs else inputs
    facts = host_facts("seed-8x-rtxpro6000") if gpu else {"systemd_version": 252, "online_cpus": "0-3"}
    out = plan_filter.vllm_plan(models, instances, facts=facts, inputs=inputs, host="h", on_problems="return")
    if "problems" in out:
        assert out["problems"] and all(p.startswith("host ") for p in out["problems"]), out
        assert not any("could not be computed" in p for p in out["problems"]), out
    else:
        assert out["schema"] == 1 and isinstance(out["instances"], list)


def test_ansible_s_own_values_give_the_same_messages():
    text = "{m: {repo_id: org/m, revision: %s, extra_args: ['--port 1']}, 2: {path: /x}}" % SHA
    models = DataLoader().load(text)
    instances = DataLoader().load("[{name: chat, model: m, port: '80', env: {A: '$B'}}, [1], {name: x, model: 2}]")
    problems = inventory_filter.vllm_inventory_problems(models, instances, host="h")
    assert problems == inventory_filter.vllm_inventory_problems(yaml.safe_load(text), yaml.safe_load(
        "[{name: chat, model: m, port: '80', env: {A: '$B'}}, [1], {name: x, model: 2}]"), host="h")
    assert len(problems) == 6 and not any("_Ansible" in p for p in problems), problems


def test_the_validation_reads_the_preflight_spec_and_runs_before_it():
    meta = load_yaml("roles", "vllm_preflight", "meta", "main.yml")
    assert meta["dependencies"] == [{"role": "inferops.vllm.vllm_validate"}]
    with open(os.path.join(ROOT, "roles", "vllm_validate", "tasks", "main.yml"), encoding="utf-8") as handle:
        tasks = handle.read()
    assert "role_path ~ '/../vllm_preflight/meta/argument_specs.yml'" in tasks
    # the install role's own input checks, for every host of the batch in the same task (stage_inputs.py)
    assert "inferops.vllm.vllm_inventory_problems" in tasks and "include_role" not in tasks
    with open(os.path.join(ROOT, "roles", "vllm_install", "vars", "main.yml"), encoding="utf-8") as handle:
        assert "inferops.vllm.vllm_install_input_problems" in handle.read()
    spec = load_yaml("roles", "vllm_validate", "meta", "argument_specs.yml")["argument_specs"]
    assert spec["main"]["options"] == {}  # nothing for Ansible to refuse ahead of the messages


def test_a_misspelt_nested_key_gets_the_closest_known_key():
    """Issue 39: the closest known key at any depth: an instance's nodes, the placement options."""
    problems = host_plan._option_problems({"reserve": 1, "tolerance_mb": 2})
    assert problems == [
        "vllm_preflight_plan_options has an unknown key 'reserve' (known: reserve_mib, tolerance_mib, use_uuids, "
        "base_port, memory_base, unit_prefix); did you mean 'reserve_mib'?",
        "vllm_preflight_plan_options has an unknown key 'tolerance_mb' (known: reserve_mib, tolerance_mib, use_uuids, "
        "base_port, memory_base, unit_prefix); did you mean 'tolerance_mib'?"]
    assert multinode.key_problems({"nodes": {"gruop": "gpu", "count": 2}}, "vllm_instances[0] (big)") == [
        "vllm_instances[0] (big).nodes has an unknown key 'gruop' (its keys are group and count); did you mean 'group'?"]
