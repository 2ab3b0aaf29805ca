"""Render the units of roles/vllm_service without containers and check what systemd would run.

The plan comes from the real plan filter (``vllm_plan``: normalisation, placement, unit content) over
recorded host facts, the unit view from the real ``vllm_service_units`` filter (the role's own
chain), and the unit and environment file from the role's own templates,
rendered by Ansible's templar the way the ``template`` module does it (role defaults, ansible_managed,
trim_blocks). Each unit is then parsed back as systemd would read it (continuation lines, quoting)
and, where this machine has systemd-analyze, verified and scored with ``systemd-analyze security``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, generate_ansible_template_vars, trust_as_template

from ansible_collections.inferops.vllm.plugins.filter.vllm_plan import vllm_plan
from ansible_collections.inferops.vllm.plugins.filter.vllm_service_units import vllm_service_units
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import compress_ints
from ansible.errors import AnsibleFilterError
from systemd_unit import directives, environment, split_exec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(ROOT, "roles", "vllm_service")
HOSTS = os.path.join(ROOT, "tests", "unit", "data", "hosts")
API_KEY = "sk-render-test-4c0ffee"
HF_TOKEN = "hf_rendertestTOKEN123"
HAVE_ANALYZE = shutil.which("systemd-analyze") is not None

MODELS = {
    "minimax-m2": {
        "repo_id": "MiniMaxAI/MiniMax-M2",
        "revision": "0a1b2c3d4e5f60718293a4b5c6d7e8f901234567",
        "served_model_name": "minimax-m2",
        "max_model_len": 131072,
        "tool_call_parser": "minimax_m2",
        "reasoning_parser": "minimax_m2_append_think",
        "trust_remote_code": True,
        "kv_cache_dtype": "fp8",
    },
    "llama-70b": {
        "repo_id": "meta-llama/Llama-3.1-70B-Instruct",
        "revision": "1605565b47bb9346c5515c34102e054115b4f98b",
        "served_model_name": "llama-3.1-70b",
        "max_model_len": 65536,
        "extra_args": ["--enable-prefix-caching", "--max-num-seqs 256"],
    },
}


def load_host(name):
    with open(os.path.join(HOSTS, name + ".json")) as fh:
        return json.load(fh)


def role_defaults(loader):
    return loader.load_from_file(os.path.join(ROLE, "defaults", "main.yml"), trusted_as_template=True)


def render(template, variables, dest):
    """Render a role template exactly as the template module would (trim_blocks, no backslash escaping)."""
    loader = DataLoader()
    src = os.path.join(ROLE, "templates", template)
    allvars = dict(role_defaults(loader))
    allvars.update(variables)
    allvars.update(generate_ansible_template_vars(path=template, fullpath=src, dest_path=dest))
    templar = Templar(loader=loader, variables=allvars)
    with open(src) as fh:
        text = trust_as_template(fh.read())
    out = templar.template(text, escape_backslashes=False, overrides=dict(trim_blocks=True, lstrip_blocks=False))
    with open(dest, "w") as fh:
        fh.write(out)
    return out


def deploy(tmp_path, host, instances, models=None, kernel_nodes=(0, 1), systemd_version=252,
           online=None, extra_vars=None, spec_options=None):
    """Plan, spec and render every instance of one host into tmp_path.

    Returns (facts, plan, specs filter result, {unit: text}, {instance: environment file text}).
    """
    models = MODELS if models is None else models
    facts = load_host(host)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    if online is None:
        online = compress_ints(c for g in facts["gpus"] for c in g["cpu_affinity"])
    variable_of = {row.option: variable for variable, row in PLAN_INPUTS.items()}
    inputs = {"vllm_service_host": "127.0.0.1", "vllm_service_nccl_env": {"NCCL_P2P_LEVEL": "PXB"},
              "vllm_service_disable_custom_all_reduce": True}
    inputs.update({variable_of[k]: v for k, v in (spec_options or {}).items()})
    host_facts = {"gpus": facts["gpus"], "gpu_links": facts["gpu_links"], "kernel_numa_nodes": list(kernel_nodes),
                  "online_cpus": online, "systemd_version": systemd_version}
    full = vllm_plan(models, instances, facts=host_facts, inputs=inputs, host=host)
    plan = full["instances"]
    result = {"instances": vllm_service_units(plan, str(python)), "warnings": full["warnings"], "plan": full}
    variables = {
        "vllm_service_api_key": API_KEY,
        "vllm_service_hf_token": HF_TOKEN,
        "vllm_service_venv": str(venv),
        "vllm_service_python": str(python),
        "vllm_service__systemd_version": systemd_version,
        "vllm_service__idle_max_mib": (full["footprint"] or {}).get("idle_max_mib", 0),
    }
    variables.update(extra_vars or {})
    units, envs = {}, {}
    for spec in result["instances"]:
        variables["vllm_service_spec"] = spec
        units[spec["unit"]] = render("vllm-instance.service.j2", variables, str(tmp_path / spec["unit"]))
        envs[spec["name"]] = render("instance.env.j2", variables, str(tmp_path / (spec["name"] + ".env")))
    return facts, plan, result, units, envs


def flag_value(argv, flag):
    i = argv.index(flag)
    return argv[i + 1]


def analyze_verify(path):
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def exposure(path):
    proc = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                          capture_output=True, text=True, check=False)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert m, proc.stdout + proc.stderr
    return float(m.group(1))


# --------------------------------------------------------------------------- the seed host: two TP=4

SEED_INSTANCES = [
    {"name": "m2-node0", "model": "minimax-m2", "tensor_parallel_size": 4, "numa_node": 0,
     "gpu_memory_utilization": 0.92, "port": 8000},
    {"name": "m2-node1", "model": "minimax-m2", "tensor_parallel_size": 4, "numa_node": 1,
     "gpu_memory_utilization": 0.92, "port": 8001},
]


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    return deploy(tmp_path_factory.mktemp("seed"), "seed-8x-rtxpro6000", SEED_INSTANCES) + (
        tmp_path_factory.getbasetemp(),)


def test_seed_host_gets_one_unit_per_instance_on_its_numa_node(seed):
    facts, plan, result, units, _envs, _base = seed
    assert sorted(units) == ["vllm-m2-node0.service", "vllm-m2-node1.service"]
    assert result["warnings"] == []
    for node, unit in ((0, "vllm-m2-node0.service"), (1, "vllm-m2-node1.service")):
        gpus = [g for g in facts["gpus"] if g["numa_node"] == node]
        text = units[unit]
        d = directives(text)
        env = environment(text)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["CUDA_VISIBLE_DEVICES"].split(",") == [g["uuid"] for g in gpus]
        assert d["CPUAffinity"] == [compress_ints(c for g in gpus for c in g["cpu_affinity"])]
        assert d["NUMAPolicy"] == ["bind"] and d["NUMAMask"] == [str(node)]
        assert len(d["ExecStart"]) == 1
        argv = split_exec(d["ExecStart"][0])
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert flag_value(argv, "--model") == "/var/lib/inferops/models/MiniMaxAI/MiniMax-M2/current"
        assert flag_value(argv, "--served-model-name") == "minimax-m2"
        assert flag_value(argv, "--tensor-parallel-size") == "4"
        assert flag_value(argv, "--pipeline-parallel-size") == "1"
        assert flag_value(argv, "--gpu-memory-utilization") == "0.92"
        assert flag_value(argv, "--port") == str(8000 + node)
        assert flag_value(argv, "--host") == "127.0.0.1"
        assert flag_value(argv, "--max-model-len") == "131072"
        assert flag_value(argv, "--kv-cache-dtype") == "fp8"
        assert flag_value(argv, "--tool-call-parser") == "minimax_m2"
        assert flag_value(argv, "--reasoning-parser") == "minimax_m2_append_think"
        for flag in ("--trust-remote-code", "--enable-auto-tool-choice", "--disable-custom-all-reduce"):
            assert argv.count(flag) == 1, flag
        # the spec's argv is exactly what systemd will exec
        spec = next(s for s in result["instances"] if s["unit"] == unit)
        assert argv == spec["argv"]
        # the GPU-idle check names the same GPUs and runs as root outside the sandbox
        pre = d["ExecStartPre"]
        assert len(pre) == 1 and pre[0].startswith("+")
        assert flag_value(split_exec(pre[0][1:]), "--gpus") == env["CUDA_VISIBLE_DEVICES"]


def test_seed_host_instances_do_not_share_ports(seed):
    _facts, _plan, _result, units, _envs, _base = seed
    vllm_ports = [int(environment(t)["VLLM_PORT"]) for t in units.values()]
    http_ports = [int(flag_value(split_exec(directives(t)["ExecStart"][0]), "--port")) for t in units.values()]
    assert len(set(vllm_ports)) == 2
    assert abs(vllm_ports[0] - vllm_ports[1]) >= 100
    assert not set(http_ports) & set(range(min(vllm_ports), max(vllm_ports) + 100))


def test_one_flag_per_line_and_managed_header(seed):
    _facts, _plan, _result, units, _envs, _base = seed
    for text in units.values():
        lines = text.splitlines()
        assert lines[0] == "#" and "Ansible managed" in lines[1]
        start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
        cont = []
        for line in lines[start + 1:]:
            cont.append(line)
            if not line.endswith("\\"):
                break
        assert all(line.strip().startswith("--") for line in cont)
        assert len(cont) >= 10
        for line in cont:
            flags = [w for w in line.split() if w.startswith("--")]
            assert len(flags) == 1, line


def test_secrets_only_in_the_environment_file(seed):
    _facts, _plan, result, units, envs, _base = seed
    for spec in result["instances"]:
        text = units[spec["unit"]]
        assert API_KEY not in text and HF_TOKEN not in text
        assert "--api-key" not in text
        assert directives(text)["EnvironmentFile"] == [f"/etc/inferops/vllm/{spec['name']}.env"]
        assert API_KEY not in json.dumps(spec) and HF_TOKEN not in json.dumps(spec)
        env_lines = [line for line in envs[spec["name"]].splitlines() if line and not line.startswith("#")]
        # no HF token: the instances are offline (HF_HUB_OFFLINE=1), the weights role alone uses it
        assert env_lines == [f"VLLM_API_KEY='{API_KEY}'"]
        assert envs[spec["name"]].startswith("#\n# Ansible managed")


def test_environment_is_offline_and_quiet(seed):
    _facts, _plan, _result, units, _envs, _base = seed
    for text in units.values():
        env = environment(text)
        for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
            assert env[key] == "1", key
        assert env["NCCL_P2P_LEVEL"] == "PXB"
        assert env["VLLM_CACHE_ROOT"].startswith("/var/cache/inferops/vllm/")
        assert directives(text)["ReadWritePaths"] == [env["VLLM_CACHE_ROOT"]]
        assert env["TMPDIR"] == "/tmp"


def test_hardening_is_the_measured_set(seed):
    _facts, _plan, _result, units, _envs, _base = seed
    for text in units.values():
        d = directives(text)
        assert "MemoryDenyWriteExecute" not in d
        assert "PrivateDevices" not in d
        assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
        assert d["DevicePolicy"] == ["closed"]
        allowed = {v.split()[0] for v in d["DeviceAllow"]}
        assert allowed >= {"char-nvidia", "char-nvidiactl", "char-nvidia-uvm", "char-nvidia-caps"}
        for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                           ("PrivateTmp", "yes"), ("KillMode", "control-group"), ("Restart", "on-failure"),
                           ("ProtectProc", "invisible"), ("CapabilityBoundingSet", ""), ("Type", "exec"),
                           ("User", "vllm"), ("LimitNOFILE", "65536")):
            assert d.get(key) == [value], key


@pytest.mark.skipif(not HAVE_ANALYZE, reason="systemd-analyze not installed")
def test_units_verify_and_score_at_most_2(seed):
    _facts, _plan, _result, units, _envs, base = seed
    for unit in units:
        path = next(base.rglob(unit))
        rc, out = analyze_verify(path)
        assert rc == 0 and out == "", out
        assert exposure(path) <= 2.0


# --------------------------------------------------------------------------- 8 x H200: one TP=8

def test_h200_host_one_tp8_instance(tmp_path):
    facts, _plan, result, units, _envs = deploy(
        tmp_path, "h200-8x-nvlink", [{"name": "llama", "model": "llama-70b", "tensor_parallel_size": 8}])
    assert list(units) == ["vllm-llama.service"]
    text = units["vllm-llama.service"]
    d = directives(text)
    env = environment(text)
    assert env["CUDA_VISIBLE_DEVICES"].split(",") == [g["uuid"] for g in facts["gpus"]]
    argv = split_exec(d["ExecStart"][0])
    assert flag_value(argv, "--tensor-parallel-size") == "8"
    assert flag_value(argv, "--served-model-name") == "llama-3.1-70b"
    assert flag_value(argv, "--max-num-seqs") == "256"
    assert "--enable-prefix-caching" in argv and "--trust-remote-code" not in argv
    # the group spans both sockets: CPUs of both, no memory binding
    assert d["CPUAffinity"] == [compress_ints(c for g in facts["gpus"] for c in g["cpu_affinity"])]
    assert "NUMAPolicy" not in d and "NUMAMask" not in d
    assert result["instances"][0]["numa_mode"] == "none"
    if HAVE_ANALYZE:
        rc, out = analyze_verify(tmp_path / "vllm-llama.service")
        assert rc == 0 and out == "", out
        assert exposure(tmp_path / "vllm-llama.service") <= 2.0


# --------------------------------------------------------------------------- host differences

def test_vm_with_one_kernel_numa_node_keeps_cpu_affinity_and_warns(tmp_path):
    facts, _plan, result, units, _envs = deploy(tmp_path, "seed-8x-rtxpro6000", SEED_INSTANCES, kernel_nodes=[0])
    d0 = directives(units["vllm-m2-node0.service"])
    d1 = directives(units["vllm-m2-node1.service"])
    assert d0["NUMAMask"] == ["0"]
    assert "NUMAPolicy" not in d1 and "NUMAMask" not in d1
    node1_cpus = compress_ints(c for g in facts["gpus"] if g["numa_node"] == 1 for c in g["cpu_affinity"])
    assert d1["CPUAffinity"] == [node1_cpus]
    assert len(result["warnings"]) == 1 and "m2-node1" in result["warnings"][0] and "node1" in result["warnings"][0]


def test_offline_cpus_are_dropped_from_the_affinity(tmp_path):
    _facts, _plan, result, units, _envs = deploy(tmp_path, "seed-8x-rtxpro6000", SEED_INSTANCES, online="0-3")
    assert directives(units["vllm-m2-node0.service"])["CPUAffinity"] == ["0-3"]
    assert "CPUAffinity" not in directives(units["vllm-m2-node1.service"])
    assert len(result["warnings"]) == 2


@pytest.mark.skipif(not HAVE_ANALYZE, reason="systemd-analyze not installed")
def test_old_systemd_gets_numactl_and_no_unknown_keys(tmp_path):
    _facts, _plan, result, units, _envs = deploy(tmp_path, "seed-8x-rtxpro6000", SEED_INSTANCES, systemd_version=240,
                                                 spec_options={"numactl": "/bin/true"})
    for node, (unit, text) in enumerate(sorted(units.items())):
        d = directives(text)
        argv = split_exec(d["ExecStart"][0])
        assert argv[:4] == ["/bin/true", f"--cpunodebind={node}", f"--membind={node}", "--"]
        assert "NUMAPolicy" not in d and "ProtectProc" not in d and "ProtectClock" not in d
        rc, out = analyze_verify(tmp_path / unit)
        assert rc == 0 and out == "", out
    assert {s["numa_mode"] for s in result["instances"]} == {"numactl"}


def test_cpu_only_plan_has_no_gpu_pinning(tmp_path):
    plan = vllm_plan(MODELS, [{"name": "small", "model": "llama-70b", "extra_args": ["--dtype", "bfloat16"]}],
                     facts={"systemd_version": 252}, inputs={"vllm_preflight_gpu": False})
    assert plan["footprint"] is None and plan["gpu"] is False
    spec = vllm_service_units(plan["instances"])[0]
    variables = {"vllm_service_spec": spec, "vllm_service__systemd_version": 252, "vllm_service__idle_max_mib": 0}
    text = render("vllm-instance.service.j2", variables, str(tmp_path / spec["unit"]))
    d = directives(text)
    env = environment(text)
    assert "CUDA_VISIBLE_DEVICES" not in env and "ExecStartPre" not in d
    assert not any(v.startswith("char-nvidia") for v in d.get("DeviceAllow", []))
    argv = split_exec(d["ExecStart"][0])
    assert "--gpu-memory-utilization" not in argv and flag_value(argv, "--dtype") == "bfloat16"


def test_hardening_toggle_off(tmp_path):
    _facts, _plan, _result, units, _envs = deploy(
        tmp_path, "h200-8x-nvlink", [{"name": "llama", "model": "llama-70b", "tensor_parallel_size": 8}],
        extra_vars={"vllm_service_hardening": False})
    d = directives(units["vllm-llama.service"])
    assert "ProtectSystem" not in d and "DevicePolicy" not in d and "SystemCallFilter" not in d
    assert d["KillMode"] == ["control-group"] and "CPUAffinity" in d


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("extra, needle", [
    (["--port 9000"], "'--port' duplicates a flag the role sets"),
    (["--tensor_parallel_size=2"], "'--tensor_parallel_size' duplicates"),
    (["-tp", "2"], "'-tp' duplicates"),
    (["--api-key", "x"], "'--api-key' is not allowed"),
    (["--enforce-eager", "--enforce-eager"], "given twice"),
])
def test_extra_args_refused_with_the_flag_named(tmp_path, extra, needle):
    instances = [dict(SEED_INSTANCES[0], extra_args=extra)]
    with pytest.raises(AnsibleFilterError) as err:
        deploy(tmp_path, "seed-8x-rtxpro6000", instances)
    assert needle in str(err.value)
    assert "m2-node0" in str(err.value)


def test_secret_in_environment_refused(tmp_path):
    models = dict(MODELS, **{"minimax-m2": dict(MODELS["minimax-m2"], env={"HF_TOKEN": "hf_x"})})
    with pytest.raises(AnsibleFilterError) as err:
        deploy(tmp_path, "seed-8x-rtxpro6000", SEED_INSTANCES, models=models)
    assert "HF_TOKEN is a secret" in str(err.value) and "hf_x" not in str(err.value)
