"""Every refusal clean, nothing accepted that cannot serve (issue 24): the real ``ansible-playbook`` on a corpus.

``cases/*.yml``: one inventory mistake each (the file name is the inventory host that carries it; ``hosts`` adds
hosts a case needs, ``failing`` the hosts that must fail). ``stage: validate`` mistakes fail in the first play of
``playbooks/site.yml`` (on the controller, before any host is contacted); ``stage: plan`` mistakes need the host's
GPUs (the simulator, ``tests/gpusim``) and fail in the plan step of the preflight. Every case runs both ways a
user takes: ``site.yml`` and a playbook that only lists the role ``inferops.vllm.vllm_preflight``. All cases of
one stage run as the hosts of one inventory, in one play: every host fails in the same task with its own message,
so one host's mistake never hides another's. Each message names the host, the variable (``expect.variable``) and the fix (``expect.fix``); the run
changes nothing (``changed=0``) and shows none of Ansible's raw errors.

``valid/*.yml``: unusual inventories that are right; every one plans (the preflight role's plan table).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
GPUSIM = os.path.join(ROOT, "tests", "gpusim")
SHA = "0123456789abcdef0123456789abcdef01234567"
#: What every case host has unless the case sets it.
BASE_VARS = {
    "vllm_models": {"m": {"repo_id": "org/m", "revision": SHA, "num_attention_heads": 32, "num_key_value_heads": 8}},
    "vllm_instances": [{"name": "chat", "model": "m"}],
    # the instances' key: a model with a front door needs a key (vllm_frontdoor_api_keys or this one)
    "vllm_service_api_key": "sk-refusals-0123456789abcdef",
}
#: Raw errors a refusal must never show.
BANNED = ("Traceback", "caused by", "Finalization of task args", "_AnsibleTagged", "Supported parameters include",
          "unable to convert")
TASKS = {"validate": "Stop on inventory problems (nothing was changed)",
         "plan": "Stop on plan problems (nothing was changed)"}
ROLE_ONLY = """- name: A playbook that only lists the preflight role
  hosts: vllm_nodes
  gather_facts: false
  roles:
    - role: inferops.vllm.vllm_preflight
"""
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def load(kind):
    out = {}
    folder = os.path.join(HERE, kind)
    for name in sorted(os.listdir(folder)):
        if name.endswith(".yml"):
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                out[name[:-4]] = yaml.safe_load(handle)
    return out


CASES = load("cases")
VALID = load("valid")


def by_stage(stage):
    return {name: case for name, case in CASES.items() if case["stage"] == stage}


class Runner:
    """Writes the inventory of a set of cases and runs a playbook on it (local connection, simulated GPUs)."""

    def __init__(self, tmp):
        self.tmp = tmp
        bindir = tmp / "bin"
        bindir.mkdir()
        self.bindir = bindir
        self.env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_LOCALHOST_WARNING="0",
                        ANSIBLE_HOST_KEY_CHECKING="0", ANSIBLE_RETRY_FILES_ENABLED="0", ANSIBLE_FORKS="16",
                        ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
                        ANSIBLE_DISPLAY_SKIPPED_HOSTS="0")

    def nvidia_smi(self, profile):
        """A stand-in nvidia-smi showing ``profile`` (one per profile, so hosts of one run differ)."""
        path = self.bindir / f"nvidia-smi-{profile}"
        if not path.exists():
            # an empty proc root and stray directory: the machine's own processes (a Molecule scenario's vLLM
            # beside the units) must not load the simulated GPUs
            empty = self.bindir / "empty"
            empty.mkdir(exist_ok=True)
            path.write_text(f"#!/bin/sh\nGPUSIM_PROC={empty} GPUSIM_STRAY_DIR={empty} GPUSIM_PROFILE={profile} "
                            f"exec {sys.executable} "
                            f"{os.path.join(GPUSIM, 'nvidia-smi')} \"$@\"\n")
            path.chmod(0o755)
        return str(path)

    def host(self, profile, variables):
        out = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "vllm_preflight_nvidia_smi": self.nvidia_smi(profile or "hgx-8x-h200"),
               "vllm_preflight_min_free_gib": 0}
        out.update(BASE_VARS)
        out.update(variables or {})
        return out

    def run(self, name, cases, playbook, *args):
        hosts = {}
        for host, case in cases.items():
            hosts[host] = self.host(case.get("profile"), case.get("vars"))
            for extra, variables in (case.get("hosts") or {}).items():
                hosts[extra] = self.host(case.get("profile"), variables)
        inventory = self.tmp / f"{name}.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"vllm_nodes": {"hosts": hosts}}}}, sort_keys=False))
        if not os.path.isabs(playbook):
            (self.tmp / f"{name}-playbook.yml").write_text(playbook)
            playbook = str(self.tmp / f"{name}-playbook.yml")
        command = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inventory), playbook,
                   *args]
        proc = subprocess.run(command, capture_output=True, text=True, env=self.env, cwd=str(self.tmp), timeout=600,
                              check=False)
        return Result(proc, list(hosts))


class Result:
    """One ansible-playbook run: its output, its recap, and each host's failure (task, message)."""

    def __init__(self, proc, hosts):
        self.rc = proc.returncode
        self.out = proc.stdout + proc.stderr
        self.hosts = hosts
        self.recap = {m.group(1): {"ok": int(m.group(2)), "changed": int(m.group(3)), "failed": int(m.group(5))}
                      for m in RECAP.finditer(proc.stdout)}
        self.failures = {}
        task = None
        for line in proc.stdout.splitlines():
            if line.startswith("TASK ["):
                task = line
            match = re.match(r"^fatal: \[([^\]]+)\]: FAILED! => (\{.*\})$", line)
            if match:
                self.failures[match.group(1)] = (task, json.loads(match.group(2)).get("msg", ""))
        self.plans = {}
        # "Show the plan of every host of the batch" runs once, an item per host: ok: [first] => (item=HOST) => {...}
        for match in re.finditer(r"^ok: \[([^\]]+)\](?: => \(item=([^)]+)\))? => (\{\n.*?\n\})$", proc.stdout,
                                 re.M | re.S):
            data = json.loads(match.group(3))
            if isinstance(data.get("msg"), list) and data["msg"] and str(data["msg"][0]).startswith("INSTANCE"):
                self.plans[match.group(2) or match.group(1)] = "\n".join(data["msg"])

    def tail(self):
        return self.out[-6000:]


@pytest.fixture(scope="module", name="runner")
def fixture_runner(tmp_path_factory):
    return Runner(tmp_path_factory.mktemp("refusals"))


@pytest.fixture(scope="module", name="runs")
def fixture_runs(runner):
    """The runs, made once and only when a test asks for them."""
    made = {}
    site = os.path.join(ROOT, "playbooks", "site.yml")

    def get(name):
        if name not in made:
            if name == "site-validate":
                made[name] = runner.run(name, by_stage("validate"), site, "--tags", "inferops-none")
            elif name == "role-validate":
                made[name] = runner.run(name, by_stage("validate"), ROLE_ONLY)
            elif name == "site-plan":
                made[name] = runner.run(name, by_stage("plan"), site, "--tags", "inferops-none")
            elif name == "role-plan":
                made[name] = runner.run(name, by_stage("plan"), ROLE_ONLY)
            elif name == "valid":
                # up to the plan: the health and host checks are other tests' business
                made[name] = runner.run(name, VALID, ROLE_ONLY, "--skip-tags",
                                        "vllm_preflight_health")
        return made[name]

    return get


RUNS = {"validate": ("site-validate", "role-validate"), "plan": ("site-plan", "role-plan")}


def test_the_corpus_is_large_and_each_case_is_complete():
    assert len(CASES) >= 40 and len(VALID) >= 10
    for name, case in CASES.items():
        assert case["stage"] in TASKS, name
        assert case["expect"]["variable"] and case["expect"]["fix"], name


@pytest.mark.parametrize("run", ["site-validate", "role-validate", "site-plan", "role-plan"])
def test_a_refused_run_changes_nothing_and_shows_no_raw_error(runs, run):
    result = runs(run)
    assert result.rc != 0, result.tail()
    for word in BANNED:
        assert word not in result.out, (word, result.out[max(0, result.out.find(word) - 3000):][:6000])
    assert set(result.recap) == set(result.hosts), result.tail()
    for host, stats in result.recap.items():
        assert stats["changed"] == 0, (host, stats)
    if run.endswith("validate"):
        # refused on the controller: no host was contacted for its GPUs
        assert "Read the host (GPUs" not in result.out


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_mistake_is_refused_naming_host_variable_and_fix(runs, name):
    case = CASES[name]
    for run in RUNS[case["stage"]]:
        result = runs(run)
        for host in case.get("failing") or [name]:
            assert host in result.failures, (run, host, result.tail())
            task, message = result.failures[host]
            assert TASKS[case["stage"]] in task, (run, host, task, message)
            assert result.recap[host]["failed"] == 1, (run, host, result.recap[host])
            for line in message.splitlines()[1:]:
                assert line.startswith("  - host "), (run, line)  # every problem names its host
            assert f"host {host}: " in message, (run, message)
            for fragment in [case["expect"]["variable"], case["expect"]["fix"]] + case["expect"].get("more", []):
                assert fragment in message, (run, host, fragment, message)
            for fragment in case.get("absent") or []:
                assert fragment not in message, (run, host, fragment, message)


def test_every_host_of_a_stage_fails_in_the_same_task(runs):
    """One play, one task: every host's problems at once (one host failing does not hide another's)."""
    for stage, names in (("validate", by_stage("validate")), ("plan", by_stage("plan"))):
        result = runs(RUNS[stage][0])
        tasks = {task for task, _message in result.failures.values()}
        assert len(tasks) == 1 and TASKS[stage] in tasks.pop(), result.tail()
        expected = {h for name, case in names.items() for h in (case.get("failing") or [name])}
        assert expected <= set(result.failures), sorted(expected - set(result.failures))


@pytest.mark.parametrize("name", sorted(VALID))
def test_unusual_but_right_inventories_plan(runs, name):
    result = runs("valid")
    assert name not in result.failures, result.failures.get(name)
    assert result.recap[name]["failed"] == 0 and result.recap[name]["changed"] == 0, result.recap[name]
    table = result.plans.get(name)
    assert table is not None, result.tail()
    words = " ".join(table.split())
    for fragment in VALID[name]["plan"]:
        assert " ".join(fragment.split()) in words, (fragment, table)
