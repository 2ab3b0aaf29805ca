"""The fleet report's GPU health panel: gpu_health run against the simulated seed box whose P2P read
is NS between its NUMA halves (a TP=8 group fails) and the one with a GPU at x8, rendered by the real
vllm_verify report templates."""
import os
import subprocess
import sys
from html.parser import HTMLParser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPUSIM = os.path.join(ROOT, "tests", "gpusim")

PLAYBOOK = """
- hosts: all
  gather_facts: false
  environment:
    GPUSIM_PROFILE: "{{ profile }}"
  tasks:
    - name: Health of the simulated host
      inferops.vllm.gpu_health:
        nvidia_smi: "{{ smi }}"
        cuda_build: "12.9"
        kernel_log: /dev/null
        shm_min_mib: 1
        nofile_min: 1
        plan: {instances: [{name: big, gpus: [0, 1, 2, 3, 4, 5, 6, 7], tensor_parallel_size: 8}]}
    - name: Summary as vllm_verify records it
      ansible.builtin.set_fact:
        vllm_verify_summary: {plan: [], gpus: [], footprint: [], bench: [], models: {}, health: "{{ ansible_facts.gpu_health }}"}
    - name: Write the report
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_verify
        tasks_from: report
"""


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.text = []

    def handle_data(self, data):
        self.text.append(data)


def test_health_panel_per_host_gpu_by_gpu(tmp_path):
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.ini").write_text(
        "p2p ansible_connection=local profile=fault-seed-p2p-ns\n"
        "x8 ansible_connection=local profile=fault-h200-pcie-x8\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
    res = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                          "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "site.yml"),
                          "-e", "smi=%s/nvidia-smi vllm_verify_report_dir=%s" % (GPUSIM, tmp_path / "reports")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    md = (tmp_path / "reports" / "fleet-report.md").read_text()
    assert "### p2p: fail" in md and "### x8: warn" in md
    assert "Driver 580.95.05, CUDA build 12.9 (needs >= 575.51.03)." in md  # the seed box's driver
    assert "| 0 | 00000000:00:06.0 | warn | Gen5 x8 | 0 | GPU 0 (00000000:00:06.0): PCIe link runs at x8 of x16" in md
    assert md.count("| pass | Gen5 x16 | 0 | - |") == 8  # the seed's 8 GPUs
    assert "- **p2p** (fail): tensor-parallel group GPUs 0,1,2,3,4,5,6,7: P2P read is not available" in md
    parser = _Text()
    parser.feed((tmp_path / "reports" / "fleet-report.html").read_text())
    text = " ".join(parser.text)
    assert "GPU health by host" in text and "NCCL_P2P_DISABLE=1" in text and "x8 of x16" in text
