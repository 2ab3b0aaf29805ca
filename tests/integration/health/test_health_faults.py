"""The preflight's health entry point (roles/vllm_preflight/tasks/health.yml) against the GPU simulator.

One ``ansible-playbook -c local`` run over one inventory host per gpusim profile (the healthy ones and
every fault profile): each fault fails (or warns) with its message, the healthy hosts pass, and no
host reports a change. The kernel log, the NVSwitch directory, ``systemctl is-active`` and
``nv-fabricmanager --version`` come from ``tests/gpusim/gpusim-host`` for the same profile.
"""
import json
import os
import re
import subprocess
import sys

from html.parser import HTMLParser

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPUSIM = os.path.join(ROOT, "tests", "gpusim")

ONE = [{"name": "chat", "gpus": [0], "tensor_parallel_size": 1}]
SEED_TP8 = {"instances": [{"name": "big", "gpus": list(range(8)), "tensor_parallel_size": 8}]}
HGX_TP8 = [{"name": "big", "gpus": list(range(8)), "tensor_parallel_size": 8}]

# host -> (profile, extra vars, expected status, text expected in a failure or warning)
CASES = {
    "h200": ("h200-1gpu", {"vllm_preflight_plan": ONE}, "pass", None),
    "hgx": ("hgx-8x-h200", {"vllm_preflight_plan": HGX_TP8}, "pass", None),
    "seed": ("seed-8x-rtxpro6000", {"vllm_preflight_plan": SEED_TP8}, "pass", None),
    "remap": ("fault-h200-remap-pending", {"vllm_preflight_plan": ONE}, "fail",
              "GPU 0 (00000000:00:06.0): row remapping pending"),
    "x8": ("fault-h200-pcie-x8", {"vllm_preflight_plan": ONE}, "warn",
           "GPU 0 (00000000:00:06.0): PCIe link runs at x8 of x16"),
    "x8-strict": ("fault-h200-pcie-x8", {"vllm_preflight_plan": ONE,
                                         "vllm_preflight_health_severities": {"pcie_width": "fail"}},
                  "fail", "PCIe link runs at x8 of x16"),
    "mig": ("fault-h200-mig-on", {"vllm_preflight_plan": ONE}, "fail",
            "GPU 0 (00000000:00:06.0): MIG mode is on"),
    "xid": ("fault-h200-xid", {"vllm_preflight_plan": ONE}, "fail",
            "GPU 0 (00000000:00:06.0): Xid 79 (GPU has fallen off the bus)"),
    "fm-stopped": ("fault-hgx-fm-stopped", {"vllm_preflight_plan": HGX_TP8}, "fail",
                   "4 NVSwitch device(s) but nvidia-fabricmanager is inactive"),
    "fm-mismatch": ("fault-hgx-fm-mismatch", {"vllm_preflight_plan": HGX_TP8}, "fail",
                    "fabric manager 580.95.05 does not match the driver 580.159.04"),
    "p2p": ("fault-seed-p2p-ns", {"vllm_preflight_plan": SEED_TP8}, "fail",
            "tensor-parallel group GPUs 0,1,2,3,4,5,6,7: P2P read is not available (GPU0-GPU4 NS"),
    # the plan says so (p2p_mitigated: NCCL_P2P_DISABLE=1 in vllm_service_nccl_env and
    # vllm_service_disable_custom_all_reduce, read by the planner); the health stage reads only the plan
    "p2p-mitigated": ("fault-seed-p2p-ns", {"vllm_preflight_plan": dict(SEED_TP8, p2p_mitigated=True)}, "pass", None),
    "old-driver": ("h200-1gpu", {"vllm_preflight_plan": ONE, "vllm_preflight_health_min_driver": "590.1"},
                   "fail", "driver 580.159.04 is older than 590.1"),
    "reset": ("fault-h200-reset-required", {"vllm_preflight_plan": ONE}, "fail",
              "GPU 0 (00000000:00:06.0, GPU-84ea54cb-4767-0e6a-8104-87422151c222) is in an error state: nvidia-smi "
              "reads [GPU requires reset] (ecc.errors.uncorrected.volatile.total, ecc.errors.corrected.volatile.total, "
              "pcie.link.gen.current, pcie.link.width.current, clocks_event_reasons.active, "
              "clocks_event_reasons.hw_slowdown, clocks_event_reasons.sw_thermal_slowdown, "
              "clocks_event_reasons.hw_thermal_slowdown, clocks_event_reasons.hw_power_brake_slowdown, "
              "temperature.gpu, "
              "power.draw, remapped_rows.correctable, remapped_rows.uncorrectable, remapped_rows.pending, "
              "remapped_rows.failure); no reading of this GPU can be trusted: drain the GPU and reset it "
              "(nvidia-smi -r -i 0) or reboot the host; the kernel log says why (dmesg | grep -i xid)"),
    "r525": ("fault-a100-r525-thermal", {"vllm_preflight_plan": ONE, "vllm_preflight_health_cuda_build": "11.8"},
             "warn", "GPU 0 (00000000:00:06.0): clocks held down by HW thermal slowdown (91 C, 80.6 of 700.0 W) "
                     "(read as clocks_throttle_reasons.*: a driver before R535)"),
    "cpu-only": ("fault-h200-mig-on", {"vllm_preflight_gpu": False}, "skipped", None),
}

PLAYBOOK = """
- name: Health preflight against gpusim profiles
  hosts: all
  gather_facts: false
  environment:
    GPUSIM_PROFILE: "{{ gpusim_profile }}"
    # an empty proc root and stray directory: the machine's own processes (a Molecule scenario's vLLM beside the
    # units) must not load the simulated GPUs
    GPUSIM_PROC: "{{ gpusim_empty }}"
    GPUSIM_STRAY_DIR: "{{ gpusim_empty }}"
  tasks:
    - name: Run the health entry point
      block:
        - name: Include the preflight's health tasks
          ansible.builtin.include_role:
            name: inferops.vllm.vllm_preflight
            tasks_from: health
      rescue:
        - name: Record the failure
          ansible.builtin.set_fact:
            health_failure: "{{ ansible_failed_result.msg }}"
            cacheable: true

    - name: Record the health as vllm_verify does for the fleet report
      ansible.builtin.set_fact:
        vllm_verify_summary: {plan: [], gpus: [], footprint: [], bench: [], models: {},
                              health: "{{ ansible_facts.gpu_health | default(none) }}"}

    - name: Write the fleet report
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_verify
        tasks_from: report
"""
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+"
                   r"skipped=(\d+)\s+rescued=(\d+)", re.M)


def _untag(value):
    """Drop ansible-core's data tags (``{"value": ..., "tags": ..., "__ansible_type": ...}``)."""
    if isinstance(value, dict):
        if "__ansible_type" in value and "value" in value:
            return _untag(value["value"])
        return dict((k, _untag(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


@pytest.fixture(scope="module", name="run")
def fixture_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("health")
    (tmp / "empty").mkdir()
    hosts = {}
    for host, (profile, extra, _status, _text) in CASES.items():
        files = tmp / host
        env = dict(os.environ, GPUSIM_PROFILE=profile)
        subprocess.run([sys.executable, os.path.join(GPUSIM, "gpusim-host"), "files", str(files)],
                       check=True, env=env)
        hostvars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "gpusim_profile": profile,
            "gpusim_empty": str(tmp / "empty"),
            "vllm_preflight_nvidia_smi": os.path.join(GPUSIM, "nvidia-smi"),
            "vllm_preflight_health_cuda_build": "13.0",
            "vllm_preflight_health_kernel_log": str(files / "kern.log"),
            "vllm_preflight_health_nvswitch_dir": str(files / "nvswitch"),
            "vllm_preflight_health_systemctl": os.path.join(GPUSIM, "gpusim-systemctl"),
            "vllm_preflight_health_fabricmanager_bin": os.path.join(GPUSIM, "nv-fabricmanager"),
            "vllm_preflight_health_shm_min_mib": 1,
            "vllm_service_limit_nofile": 65536,
            "vllm_verify_report_dir": str(tmp / "reports"),
        }
        hostvars.update(extra)
        hosts[host] = hostvars
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    (tmp / "play.yml").write_text(PLAYBOOK)
    (tmp / "reports").mkdir()  # exists already: the report's directory task reports no change
    # Results come back through the controller's fact cache (nothing is written on the "hosts").
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN="ansible.builtin.jsonfile", ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp / "facts"),
               ANSIBLE_FORKS="8", ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_HOST_KEY_CHECKING="0")
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([playbook, "-i", str(tmp / "inventory.yml"), str(tmp / "play.yml")],
                          capture_output=True, text=True, env=env, cwd=str(tmp), timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stats = dict((m.group(1), dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued"),
                                       (int(x) for x in m.groups()[1:]))))
                 for m in RECAP.finditer(proc.stdout))
    facts = {}
    for host in CASES:
        # the jsonfile cache names a host's file <host> or s<n>_<host> (ansible-core 2.21)
        names = [n for n in os.listdir(str(tmp / "facts")) if re.match(r"^(?:s[0-9]+_)?%s$" % re.escape(host), n)]
        assert len(names) <= 1, (host, names)
        facts[host] = {}
        if names:  # no file for a host without facts (cpu-only)
            with open(str(tmp / "facts" / names[0])) as handle:
                data = json.load(handle)
            # ansible-core 2.19+ wraps the cached facts: {"__payload__": "<json text>"}
            facts[host] = _untag(json.loads(data["__payload__"]) if "__payload__" in data else data)
    return {"stats": stats, "facts": facts, "stdout": proc.stdout, "reports": tmp / "reports"}


@pytest.mark.parametrize("host", sorted(CASES))
def test_each_profile_gives_its_verdict_and_changes_nothing(run, host):
    _profile, _extra, status, text = CASES[host]
    stats = run["stats"][host]
    assert stats["changed"] == 0 and stats["failed"] == 0 and stats["unreachable"] == 0, stats
    facts = run["facts"][host]
    if status == "skipped":
        assert "gpu_health" not in facts and "health_failure" not in facts
        return
    health = facts["gpu_health"]
    assert health["status"] == status, (health["failures"], health["warnings"])
    if status == "fail":
        assert stats["rescued"] == 1
        message = facts["health_failure"]
        assert text in message, message
        assert message.startswith("host %s: GPU health checks failed" % host)
    else:
        assert stats["rescued"] == 0 and "health_failure" not in facts
    if status == "warn":
        assert any(text in w for w in health["warnings"]), health["warnings"]
        assert "host %s: GPU health warnings" % host in run["stdout"]
    if status == "pass":
        assert health["failures"] == [] and health["warnings"] == []
    for gpu in health["gpus"]:
        assert set(gpu["checks"]) >= {"persistence", "mig", "row_remap", "pcie_width", "xid"}


def test_a_pre_r535_driver_is_read_through_the_old_names_and_a_broken_gpu_says_so(run):
    r525 = run["facts"]["r525"]["gpu_health"]
    assert r525["driver_version"] == "525.147.05" and r525["min_driver"] == "520.61.05"
    (gpu,) = r525["gpus"]
    assert gpu["clock_event_fields"] == "clocks_throttle_reasons" and gpu["hw_thermal_slowdown"] is True
    assert gpu["clocks_event_reasons"] == "0x0000000000000041" and gpu["error_states"] == {}
    reset = run["facts"]["reset"]["gpu_health"]
    (gpu,) = reset["gpus"]
    assert gpu["status"] == "fail" and set(gpu["error_states"].values()) == {"[GPU requires reset]"}
    assert len(reset["failures"]) == 1 and "is in an error state" in reset["failures"][0]
    checks = gpu["checks"]
    assert checks["clocks"]["message"].startswith("GPU 0 (00000000:00:06.0): clock event reasons (thermal and "
                                                  "power-brake slowdown) not readable (clocks_event_reasons.active "
                                                  "[GPU requires reset]")
    assert checks["row_remap"]["message"].startswith("GPU 0 (00000000:00:06.0): row remapping not readable")
    assert checks["pcie_width"]["message"].startswith("GPU 0 (00000000:00:06.0): PCIe link width not readable")
    assert checks["ecc_errors"]["message"].startswith(
        "GPU 0 (00000000:00:06.0): uncorrected ECC error count not readable")
    for host in ("reset", "r525", "h200"):
        for message in [c["message"] for g in run["facts"][host]["gpu_health"]["gpus"] for c in g["checks"].values()]:
            assert "None" not in message, (host, message)


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.text = []

    def handle_data(self, data):
        self.text.append(data)


def test_fleet_report_has_a_health_panel_per_host_gpu_by_gpu(run):
    md = (run["reports"] / "fleet-report.md").read_text()
    assert "### remap: fail" in md and "### x8: warn" in md and "### h200: pass" in md
    assert "### cpu-only" not in md  # no health on a CPU-only host
    assert "Driver 580.159.04, CUDA build 13.0 (needs >= 580.65.06), NVSwitch." in md  # hgx
    assert "| 0 | 00000000:00:06.0 | warn | Gen5 x8 | 0 | GPU 0 (00000000:00:06.0): PCIe link runs at x8 of x16" in md
    assert "| 0 | 00000000:00:06.0 | fail | n/a | - | GPU 0 (00000000:00:06.0, GPU-84ea54cb" in md  # reset
    assert "None" not in md
    assert "- **p2p** (fail): tensor-parallel group GPUs 0,1,2,3,4,5,6,7: P2P read is not available" in md
    assert "- **fabric** (fail): 4 NVSwitch device(s) but nvidia-fabricmanager is inactive" in md
    parser = _Text()
    parser.feed((run["reports"] / "fleet-report.html").read_text())
    text = " ".join(parser.text)
    assert "GPU health by host" in text and "NCCL_P2P_DISABLE=1" in text and "x8 of x16" in text
