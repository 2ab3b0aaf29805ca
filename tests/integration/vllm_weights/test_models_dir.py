"""One models directory (issue 25): with the preflight's plan, the weights land in the plan's models directory
(vllm_install_models_dir, where the units serve from); a vllm_weights_models_dir that differs is refused in the
role's first, read-only stage, naming the host, both directories and the fix. The real ansible-playbook."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLAY = """- name: The first stage of vllm_weights with a plan
  hosts: node
  gather_facts: false
  tasks:
    - name: Run the read-only stage of vllm_weights
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_weights
        tasks_from: validate
        public: true
    - name: Show where the weights go
      ansible.builtin.debug:
        msg: "models_dir={{ vllm_weights_models_dir }}"
"""


def run(tmp_path, plan=True, **variables):
    (tmp_path / "play.yml").write_text(PLAY)
    host = dict({"ansible_connection": "local", "ansible_python_interpreter": sys.executable}, **variables)
    if plan:
        host["vllm_preflight_plan"] = {"paths": {"models_dir": "/srv/models"}, "instances": []}
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"hosts": {"node": host}}}))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_RETRY_FILES_ENABLED="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i",
                           str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_weights_follow_the_plans_models_directory(tmp_path):
    rc, out = run(tmp_path, vllm_install_models_dir="/var/lib/elsewhere")
    assert rc == 0, out[-3000:]
    assert "models_dir=/srv/models" in out


def test_a_second_models_directory_is_refused_naming_both_and_the_fix(tmp_path):
    rc, out = run(tmp_path, vllm_weights_models_dir="/data/models")
    assert rc != 0, out[-3000:]
    assert ("host node: vllm_weights_models_dir is /data/models, but the plan serves the models from /srv/models "
            "(vllm_install_models_dir): the weights would land where no instance reads them. Set "
            "vllm_install_models_dir: /data/models") in " ".join(out.split()), out[-3000:]
    assert "Traceback" not in out and "changed=0" in out
    rc, out = run(tmp_path, vllm_weights_models_dir="/srv/models/")
    assert rc == 0, out[-3000:]


def test_without_a_plan_the_install_roles_models_directory(tmp_path):
    rc, out = run(tmp_path, plan=False, vllm_install_models_dir="/opt/models")
    assert rc == 0, out[-3000:]
    assert "models_dir=/opt/models" in out
