"""verify's plan-drift check (roles/vllm_verify/tasks/plan_drift.yml), run by ansible-playbook on this machine.

The plan comes from the real vllm_plan filter; the host's recorded plan.json is written by the test:
the same plan passes, a changed instance or a missing instance fails naming it, no file warns.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HOSTS = os.path.join(ROOT, "tests", "unit", "data", "hosts")
SHA = "a" * 40

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Plan with the real filter
      ansible.builtin.set_fact:
        vllm_preflight_plan: >-
          {{ models | inferops.vllm.vllm_plan(instances, facts={'gpus': gpus, 'gpu_links': links},
             inputs={'vllm_service_config_dir': config_dir}, host=inventory_hostname) }}
    - name: Record what the host "was configured from"
      ansible.builtin.copy:
        content: "{{ (recorded_instances | default(none)) and (models | inferops.vllm.vllm_plan(recorded_instances,
                     facts={'gpus': gpus, 'gpu_links': links}, inputs={'vllm_service_config_dir': config_dir}))
                     | to_json }}"
        dest: "{{ config_dir }}/plan.json"
        mode: "0600"
      when: recorded_instances is defined
    - name: Check for drift
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_verify
        tasks_from: plan_drift
"""


def run(tmp_path, recorded, drift="fail"):
    with open(os.path.join(HOSTS, "seed-8x-rtxpro6000.json")) as fh:
        host = json.load(fh)
    instances = [{"name": "chat-a", "model": "big", "tensor_parallel_size": 4},
                 {"name": "chat-b", "model": "big", "tensor_parallel_size": 4}]
    extra = {"gpus": host["gpus"], "links": host["gpu_links"], "instances": instances,
             "models": {"big": {"repo_id": "org/big-moe", "revision": SHA}},
             "config_dir": str(tmp_path), "vllm_verify_plan_drift": drift}
    if recorded is not None:
        extra["recorded_instances"] = recorded(instances)
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    (tmp_path / "pb.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "seed,",
                           "-c", "local", str(tmp_path / "pb.yml"), "-e", "@" + str(tmp_path / "extra.json")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False)


def test_same_plan_passes(tmp_path):
    res = run(tmp_path, lambda i: i)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "WARNING" not in res.stdout


@pytest.mark.parametrize("change, needle", [
    (lambda i: [i[0], dict(i[1], gpu_memory_utilization=0.8)], "instance chat-b (unit, placement or command line)"),
    (lambda i: i[:1], "instance chat-b"),
])
def test_a_changed_plan_fails_naming_the_instance(tmp_path, change, needle):
    res = run(tmp_path, change)
    assert res.returncode != 0
    assert "differs from the plan of this inventory in" in res.stdout and needle in res.stdout, res.stdout[-3000:]
    assert "chat-a" not in res.stdout.split("differs from the plan of this inventory in")[1].split(";")[0]


def test_warn_mode_and_missing_file_warn(tmp_path):
    res = run(tmp_path, lambda i: i[:1], drift="warn")
    assert res.returncode == 0 and "its recorded plan differs in instance chat-b" in res.stdout, res.stdout[-3000:]
    res = run(tmp_path / "..", None)
    assert res.returncode == 0 and "no " in res.stdout and "plan.json (configured before plans" in res.stdout, \
        res.stdout[-3000:]
