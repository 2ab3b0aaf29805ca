"""The plan is the contract (issue: normalise the inventory once, plan everything, later stages only read).

The first group reproduces seven failures of the collection before the plan contract, each as a test
(they fail on the earlier code and pass now). Then: the documented keys and the accepted keys are
one list; a hypothesis property over random valid inventories and host shapes checks that every
rendered unit runs exactly the plan's argv with the plan's environment, that the footprint
expectation names exactly the plan's GPUs, and that no inventory the plan accepts makes a later
stage (units, footprint, weights) fail on input.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_plan import vllm_plan
from ansible_collections.inferops.vllm.plugins.filter.vllm_service_units import vllm_service_units
from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi
from ansible_collections.inferops.vllm.plugins.modules import gpu_footprint
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import (
    PLAN_INPUTS, PlanContractError, build_plan, input_problems)
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import INSTANCE_KEYS, MODEL_KEYS, normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.weights_plan import wanted_models
from ansible.errors import AnsibleFilterError
from systemd_unit import directives, environment, split_exec
from test_vllm_service_render import render
from test_vllm_gpu_idle import IDLE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HOSTS = os.path.join(ROOT, "tests", "unit", "data", "hosts")
SHA = "0123456789abcdef0123456789abcdef01234567"


def host_facts(name, **extra):
    with open(os.path.join(HOSTS, name + ".json")) as fh:
        facts = json.load(fh)
    out = {"gpus": facts["gpus"], "gpu_links": facts["gpu_links"], "systemd_version": 252,
           "kernel_numa_nodes": sorted({g["numa_node"] for g in facts["gpus"] if g["numa_node"] is not None}),
           "online_cpus": ",".join(str(c) for c in sorted({c for g in facts["gpus"] for c in g["cpu_affinity"]}))}
    out.update(extra)
    return out


def load_yaml(*parts):
    with open(os.path.join(ROOT, *parts)) as fh:
        return yaml.safe_load(fh)


def preflight_instance_spec():
    specs = load_yaml("roles", "vllm_preflight", "meta", "argument_specs.yml")["argument_specs"]
    return specs


# --------------------------------------------------------------------------- the seven failures

def test_1_served_model_name_and_vllm_port_pass_the_preflight_argument_specs():
    spec = preflight_instance_spec()["main"]["options"]
    validator = ArgumentSpecValidator(spec)
    result = validator.validate({
        "vllm_models": {"tiny": {"repo_id": "org/tiny", "revision": SHA}},
        "vllm_instances": [{"name": "chat", "model": "tiny", "served_model_name": "chat-a", "vllm_port": 21000}],
    })
    assert not result.error_messages, result.error_messages


def test_2_verify_asks_for_the_served_name_the_plan_serves():
    models = {"m": {"repo_id": "Org/Model", "revision": SHA}}
    plan = build_plan(models, [{"name": "chat", "model": "m"}], host_facts("h200-1gpu"), host="h")
    inst = plan["instances"][0]
    assert inst["served_model_name"] == "Org/Model"
    assert inst["argv"][inst["argv"].index("--served-model-name") + 1] == "Org/Model"
    tasks = load_yaml("roles", "vllm_verify", "tasks", "main.yml")
    bench = next(t for t in tasks if "inferops.vllm.vllm_bench" in t)
    templar = Templar(loader=DataLoader(), variables={
        "vllm_verify_instance": inst, "vllm_models": models, "vllm_verify_address": "127.0.0.1",
        **(bench.get("vars") or {})})
    model = templar.template(trust_as_template(bench["inferops.vllm.vllm_bench"]["model"]))
    url = templar.template(trust_as_template(bench["inferops.vllm.vllm_bench"]["url"]))
    assert model == "Org/Model"
    assert url == inst["url"] == "http://127.0.0.1:8000"


def test_3_two_instances_on_one_port_without_gpus_are_refused():
    models = {"m": {"repo_id": "org/m", "revision": SHA}}
    instances = [{"name": "a", "model": "m", "port": 8000}, {"name": "b", "model": "m", "port": 8000}]
    with pytest.raises(PlanContractError) as err:
        build_plan(models, instances, {"systemd_version": 252}, {"vllm_preflight_gpu": False}, host="cpu1")
    assert "port 8000 is given to 'a', 'b'" in str(err.value) and "host cpu1" in str(err.value)


def test_4_instances_sharing_a_gpu_can_start_and_pass_the_footprint():
    models = {"m": {"repo_id": "org/m", "revision": SHA}}
    instances = [{"name": "a", "model": "m", "gpus": [0], "gpu_memory_utilization": 0.45},
                 {"name": "b", "model": "m", "gpus": [0], "gpu_memory_utilization": 0.45}]
    facts = host_facts("h200-1gpu")
    plan = build_plan(models, instances, facts, host="h")
    assert plan["footprint"]["allow_shared_gpus"] is True
    assert [i["share_gpus_with"] for i in plan["instances"]] == [["vllm-b.service"], ["vllm-a.service"]]
    # the footprint arguments the plan hands to gpu_footprint are accepted and add up on GPU 0
    gpus = [dict(g, memory_used_mib=0) for g in facts["gpus"]]
    fp = plan["footprint"]
    expect = gpu_footprint.plan_expectations(fp["expected"], gpus, fp["allow_shared_gpus"], fp["memory_base"])
    total = facts["gpus"][0]["memory_total_mib"] - facts["gpus"][0]["memory_reserved_mib"]
    assert abs(expect[0]["expected_mib"] - 0.9 * total) <= 1
    # b's start check tolerates a's processes on the shared GPU (the unit passes --share-with)
    units = vllm_service_units(plan["instances"])
    text = render("vllm-instance.service.j2", {"vllm_service_spec": units[1], "vllm_service__systemd_version": 252,
                                               "vllm_service__idle_max_mib": fp["idle_max_mib"]}, os.devnull)
    pre = directives(text)["ExecStartPre"][0]
    assert "--share-with vllm-a.service" in pre

    class Smi:
        def query_gpus(self):
            return [dict(gpus[0], memory_used_mib=64000)]

        def processes(self, _gpus):
            return [{"pid": 7, "process_name": "python", "gpu_index": 0, "used_mib": 63900, "unit": "vllm-a.service"}]

    assert IDLE.check(Smi(), ["0"], fp["idle_max_mib"], {"vllm-a.service"}) == ([], [])
    busy, unknown = IDLE.check(Smi(), ["0"], fp["idle_max_mib"], set())
    assert not unknown
    assert busy and "vllm-a.service" in busy[0]


def test_5_preflight_stage_tags_reach_their_tasks(tmp_path):
    main = load_yaml("roles", "vllm_preflight", "tasks", "main.yml")
    assert all("ansible.builtin.import_tasks" in t for t in main)
    playbook = tmp_path / "pb.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [inferops.vllm.vllm_preflight]\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"), ANSIBLE_NOCOLOR="1")
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "--list-tasks",
                          "--tags", "vllm_preflight_facts", str(playbook)], env=env, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "Read the host (GPUs" in out.stdout and "Plan the fleet once" not in out.stdout


def test_6_a_repo_id_the_hub_refuses_fails_validation():
    problems = normalise({"m": {"repo_id": "org/a..b", "revision": SHA}}, [], host="h")["problems"]
    assert problems and "host h: vllm_models.m.repo_id is 'org/a..b'" in problems[0] and "'..'" in problems[0]


def test_7_an_empty_cpu_affinity_cell_falls_back_to_sysfs(tmp_path):
    topo = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \tNODE\t\t0\t\tN/A\n"
            "GPU1\tNODE\t X \t\t0\t\tN/A\n")
    parsed = nvidia_smi.parse_topo(topo)
    assert parsed["gpus"][0]["cpu_affinity"] is None and parsed["gpus"][0]["numa_node"] == 0
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "local_cpulist").write_text("0-15,32-47\n")
        (d / "numa_node").write_text("0\n")
    gpus = [{"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"00000000:{b}:00.0", "memory_total_mib": 1000,
             "memory_used_mib": 0, "memory_free_mib": 1000} for i, b in ((0, "18"), (1, "2A"))]
    warnings = []
    facts = nvidia_smi.build_facts(gpus, [], parsed, None, sysfs_root=str(tmp_path), warnings=warnings)
    assert facts["gpus"][0]["cpu_affinity"] == list(range(16)) + list(range(32, 48))
    assert len(warnings) == 2 and "empty CPU Affinity for GPU 0" in warnings[0] and "sysfs" in warnings[0]


# --------------------------------------------------------------------------- one list of keys

def test_documented_instance_keys_are_the_accepted_keys():
    spec = preflight_instance_spec()
    for entry in ("validate", "main"):
        options = spec[entry]["options"]["vllm_instances"]["options"]
        assert list(options) == list(INSTANCE_KEYS)
        for key, (kind, default, _doc) in INSTANCE_KEYS.items():
            assert options[key]["type"] == kind, key
            assert options[key].get("default") == default or key in ("name", "model"), key


def test_documented_plan_inputs_are_the_plan_inputs():
    spec = preflight_instance_spec()["main"]["options"]
    role_vars = load_yaml("roles", "vllm_preflight", "vars", "main.yml")["vllm_preflight__plan_inputs"]
    assert role_vars == list(PLAN_INPUTS)
    defaults = load_yaml("roles", "vllm_preflight", "defaults", "main.yml")
    install = load_yaml("roles", "vllm_install", "defaults", "main.yml")
    for variable, row in PLAN_INPUTS.items():
        default = row.default
        assert spec[variable]["default"] == default, variable
        if variable in defaults:
            assert defaults[variable] == default, variable
        if variable in install:
            assert install[variable] == default, variable
    # nothing else defines them: the service and verify roles only read the plan
    for role in ("vllm_service", "vllm_verify"):
        role_defaults = load_yaml("roles", role, "defaults", "main.yml")
        assert not set(role_defaults) & set(PLAN_INPUTS), role


def test_what_the_docs_accept_the_check_accepts():
    """issue 39: a plan input's bound in the docs, in the argument spec and in the check come from one row; a value
    at either end of a documented range is accepted, one step outside it is refused naming the variable."""
    with open(os.path.join(ROOT, "docs", "plan.md")) as fh:
        text = fh.read()
    spec = preflight_instance_spec()["main"]["options"]
    ranges = 0
    for variable, row in PLAN_INPUTS.items():
        accepts = row.rule.accepts() if row.rule is not None else ""
        if accepts:
            assert f"| `{variable}` | `" in text and f"| {accepts} |" in text.split(f"| `{variable}` |", 1)[1] \
                .split("\n", 1)[0], variable
            doc = spec[variable]["description"]
            assert f"Accepted: {accepts}." in (" ".join(doc) if isinstance(doc, list) else doc), variable
        low, high = getattr(row.rule, "low", None), getattr(row.rule, "high", None)
        if low is None or isinstance(row.default, bool):
            continue
        ranges += 1
        for good in (low, high, str(high)):
            assert input_problems({variable: good}) == [], (variable, good)
        for bad in (low - 1, high + 1):
            if bad == getattr(row.rule, "off", None):
                continue
            problems = input_problems({variable: bad})
            assert len(problems) == 1 and problems[0].startswith(f"{variable} is {bad};") \
                and f"from {low} to {high}" in problems[0], (variable, problems)
        for choice in getattr(row.rule, "choices", None) or ():
            assert input_problems({variable: choice}) == []
    assert ranges >= 10
    # a whole-number input without its range would be refused as "not a string": every one has its rule
    assert all(row.rule is not None and row.rule.accepts() for row in PLAN_INPUTS.values()
               if isinstance(row.default, int) and not isinstance(row.default, bool))
    for variable, row in PLAN_INPUTS.items():
        for choice in (row.rule.choices or ()) if row.rule is not None else ():
            assert spec[variable]["choices"] == list(row.rule.choices)
            if variable not in ("vllm_install_variant",):
                assert input_problems({variable: choice}) == [], (variable, choice)
                assert input_problems({variable: choice + "x"}) and input_problems({variable: 7}), variable


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_value_in_a_documented_range_is_accepted(data):
    variable = data.draw(st.sampled_from(sorted(v for v, row in PLAN_INPUTS.items() if hasattr(row.rule, "low"))))
    rule = PLAN_INPUTS[variable].rule
    value = data.draw(st.integers(rule.low, rule.high))
    assert input_problems({variable: value}) == []
    outside = data.draw(st.one_of(st.integers(max_value=rule.low - 1), st.integers(min_value=rule.high + 1)))
    assert input_problems({variable: outside}) == [] if outside == rule.off else input_problems({variable: outside})


def test_docs_name_every_key():
    with open(os.path.join(ROOT, "docs", "plan.md")) as fh:
        text = fh.read()
    for key in list(INSTANCE_KEYS) + list(MODEL_KEYS) + list(PLAN_INPUTS):
        assert f"`{key}`" in text, key


def test_unknown_and_misspelt_keys_name_the_fix():
    instances = [{"name": "a", "model": "m", "tensor_paralel_size": 2},
                 {"name": "b", "model": "m", "num-key-value-heads": 8}]
    problems = normalise({"m": {"repo_id": "org/m", "revision": SHA, "served_modle_name": "x"}}, instances,
                         host="h")["problems"]
    text = "\n".join(problems)
    assert "did you mean 'served_model_name'?" in text
    assert "did you mean 'tensor_parallel_size'?" in text
    assert "did you mean 'num_key_value_heads' (underscores, not dashes)?" in text


def test_the_plan_filter_names_host_and_variable():
    with pytest.raises(AnsibleFilterError) as err:
        vllm_plan({"m": {"repo_id": "org/m", "revision": "main"}}, [{"name": "a", "model": "m"}],
                  facts=host_facts("h200-1gpu"), host="gpu7")
    assert "host gpu7" in str(err.value) and "vllm_models.m.revision" in str(err.value)


# --------------------------------------------------------------------------- the property

HOST_SHAPES = ["h200-1gpu", "h200-8x-nvlink", "l40s-4x-pcie", "seed-8x-rtxpro6000"]
names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
instance = st.fixed_dictionaries(
    {"name": names, "model": st.sampled_from(["a", "b"])},
    optional={"tensor_parallel_size": st.sampled_from([1, 2, 4]),
              "gpu_memory_utilization": st.sampled_from([0.3, 0.45, 0.9]),
              "numa_node": st.sampled_from(["auto", 0, 1]),
              "served_model_name": names,
              "max_model_len": st.integers(1, 1 << 17),
              "vllm_port": st.sampled_from([30000, 40000]),
              "extra_args": st.sampled_from([[], ["--enforce-eager"], ["--dtype float32"]]),
              "env": st.sampled_from([{}, {"VLLM_LOGGING_LEVEL": "INFO"}])})
MODELS = {"a": {"repo_id": "org/a", "revision": SHA, "served_model_name": "model-a",
                "extra_args": ["--enable-prefix-caching"], "env": {"OMP_NUM_THREADS": "4"}},
          "b": {"repo_id": "Org-2/b.v1", "revision": SHA, "kv_cache_dtype": "fp8"}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(HOST_SHAPES + ["cpu"]), instances=st.lists(instance, min_size=1, max_size=3),
       host_addr=st.sampled_from(["127.0.0.1", "0.0.0.0", "::1"]))
def test_what_the_plan_accepts_renders_exactly_and_serves(tmp_path_factory, shape, instances, host_addr):
    gpu = shape != "cpu"
    facts = host_facts(shape) if gpu else {"systemd_version": 252, "online_cpus": "0-3"}
    inputs = {"vllm_service_host": host_addr, "vllm_preflight_gpu": gpu}
    try:
        plan = build_plan(MODELS, instances, facts, inputs, host="prop")
    except PlanContractError:
        return  # refused in preflight, before any host changes
    json.dumps(plan)  # plain data
    python = "/opt/inferops/vllm/0.32.0-cpu/bin/python"
    units = vllm_service_units(plan["instances"], python)
    out = tmp_path_factory.mktemp("units")
    for inst, unit, raw in zip(plan["instances"], units, instances):
        text = render("vllm-instance.service.j2", {"vllm_service_spec": unit, "vllm_service__systemd_version": 252,
                                                   "vllm_service__idle_max_mib": 256}, str(out / unit["unit"]))
        argv = split_exec(directives(text)["ExecStart"][0])
        assert argv == [python if a == plan["paths"]["venv"] + "/bin/python" else a for a in inst["argv"]]
        assert environment(text) == dict(inst["environment"])
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(raw.get("tensor_parallel_size", 1))
        served = raw.get("served_model_name") or MODELS[raw["model"]].get("served_model_name") or \
            MODELS[raw["model"]]["repo_id"]
        assert argv[argv.index("--served-model-name") + 1] == served == inst["served_model_name"]
        if gpu:
            assert [e["gpus"] for e in inst["expected"]] == [inst["gpus"]]
            assert len(inst["gpus"]) == raw.get("tensor_parallel_size", 1)
            assert environment(text)["CUDA_VISIBLE_DEVICES"].split(",") == \
                [facts["gpus"][i]["uuid"] for i in inst["gpus"]]
        else:
            assert inst["expected"] == [] and "CUDA_VISIBLE_DEVICES" not in environment(text)
    if gpu:
        fp = plan["footprint"]
        gpus = [dict(g, memory_used_mib=0) for g in facts["gpus"]]
        expect = gpu_footprint.plan_expectations(fp["expected"], gpus, fp["allow_shared_gpus"], fp["memory_base"])
        assert sorted(expect) == sorted({g for i in plan["instances"] for g in i["gpus"]})
    keys = sorted({i["model"]["key"] for i in plan["instances"]})
    wanted = wanted_models(MODELS, keys, models_dir=plan["paths"]["models_dir"])
    assert {m["current"] for m in wanted["models"]} == {i["model"]["path"] for i in plan["instances"]}


def test_the_plan_says_whether_broken_p2p_is_mitigated_and_health_reads_only_that():
    """The health stage's p2p_mitigated comes from the plan (both inputs set), not from the inventory."""
    models = {"m": {"repo_id": "org/m", "revision": SHA}}
    base = {"name": "chat", "model": "m"}

    def plan(**inputs):
        return build_plan(models, [base], host_facts("h200-1gpu"), dict(inputs), host="h")

    assert plan()["p2p_mitigated"] is False
    assert plan(vllm_service_nccl_env={"NCCL_P2P_DISABLE": "1"})["p2p_mitigated"] is False
    assert plan(vllm_service_nccl_env={"NCCL_P2P_DISABLE": 1},
                vllm_service_disable_custom_all_reduce=True)["p2p_mitigated"] is True
    tasks = load_yaml("roles", "vllm_preflight", "tasks", "health.yml")
    assert tasks[0]["inferops.vllm.gpu_health"]["p2p_mitigated"] == "{{ vllm_preflight_plan.p2p_mitigated | default(false) }}"


def test_units_that_would_kill_a_graceful_shutdown_are_refused_by_the_plan():
    """vllm_service_timeout_stop_sec (TimeoutStopSec= of every unit) is a plan input: not longer than an instance's
    shutdown_timeout, the plan refuses before any host changes (it was the service role's check, after the install and
    the weights); otherwise each instance carries it for its unit."""
    models = {"m": {"repo_id": "org/m", "revision": SHA, "shutdown_timeout": 120}}
    with pytest.raises(PlanContractError) as err:
        build_plan(models, [{"name": "chat", "model": "m"}], host_facts("h200-1gpu"), host="h")
    assert ("host h: vllm_service_timeout_stop_sec is 90, not longer than the shutdown_timeout of chat (120 s)"
            in str(err.value))
    plan = build_plan(models, [{"name": "chat", "model": "m"}], host_facts("h200-1gpu"),
                      {"vllm_service_timeout_stop_sec": 150}, host="h")
    assert [i["timeout_stop_sec"] for i in plan["instances"]] == [150]
    with pytest.raises(PlanContractError, match="vllm_service_timeout_stop_sec"):
        build_plan(models, [{"name": "chat", "model": "m"}], host_facts("h200-1gpu"),
                   {"vllm_service_timeout_stop_sec": 0}, host="h")
