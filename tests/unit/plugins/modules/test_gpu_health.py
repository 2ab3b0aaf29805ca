"""gpu_health through its main(): real H200 captures (tests/fixtures/nvidia-smi/h200-1gpu-health/)
as nvidia-smi's answers, edited into each fault; the commands it runs and the verdicts."""
import os

import pytest
from ansible.module_utils import basic

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi as n
from ansible_collections.inferops.vllm.plugins.modules import gpu_health

from gpu_harness import run_main

CAP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                   "fixtures", "nvidia-smi", "h200-1gpu-health")


def cap(name):
    with open(os.path.join(CAP, name)) as handle:
        return handle.read()


class Host(object):
    """Answers the module's commands; ``answers`` maps a command kind to (rc, out) or a list of them."""

    def __init__(self, monkeypatch, **answers):
        self.answers = {
            "query": (0, cap("query_health.out")),
            "remap": (0, cap("remapped_rows.out")),
            "p2p": (0, cap("topo_p2p_r.out")),
            "journalctl": (0, "[    0.000000] kernel: Linux version 6.8.0\n"),
            "dmesg": (0, cap("dmesg_xid.out").replace("dmesg rc=0\n", "")),
            "systemctl": (0, "active\n"),
            "fm": (0, "Fabric Manager version is : 580.159.04\n"),
        }
        self.answers.update(answers)
        self.calls = []
        self.warnings = []
        monkeypatch.setattr(basic.AnsibleModule, "run_command", self.run_command)
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                            lambda _self, name, required=False, opt_dirs=None: "/usr/bin/" + name)
        monkeypatch.setattr(basic.AnsibleModule, "warn", lambda _self, text: self.warnings.append(text))

    @staticmethod
    def kind(cmd):
        base = os.path.basename(cmd[0])
        if base == "nvidia-smi":
            arg = cmd[1]
            return {"--query-gpu": "query", "--query-remapped-rows": "remap", "topo": "p2p"}[arg.split("=")[0]]
        return {"journalctl": "journalctl", "dmesg": "dmesg", "systemctl": "systemctl",
                "nv-fabricmanager": "fm"}[base]

    def run_command(self, cmd, environ_update=None, **_kwargs):
        kind = self.kind(cmd)
        self.calls.append((kind, list(cmd)))
        answer = self.answers[kind]
        if isinstance(answer, list):
            answer = answer.pop(0) if len(answer) > 1 else answer[0]
        return answer[0], answer[1], ""


def run(monkeypatch, tmp_path, args=None, **answers):
    host = Host(monkeypatch, **answers)
    params = {"nvidia_smi": None, "cuda_build": "13.0", "nvswitch_dir": str(tmp_path / "nvswitch"),
              "shm_path": str(tmp_path), "shm_min_mib": 1, "nofile_min": 1}
    params.update(args or {})
    monkeypatch.setattr(n, "find_nvidia_smi", lambda module, path=None: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(gpu_health, "find_nvidia_smi", lambda module, path=None: "/usr/bin/nvidia-smi")
    status, result = run_main(gpu_health.main, params, monkeypatch)
    return status, result, host


def health(result):
    return result["ansible_facts"]["gpu_health"]


def test_an_empty_journal_falls_back_to_dmesg(monkeypatch, tmp_path):
    _s, result, host = run(monkeypatch, tmp_path, journalctl=(0, ""))
    assert [call[0] for call in host.calls] == ["query", "remap", "journalctl", "dmesg"]
    assert health(result)["kernel_log"] == "dmesg"


def test_the_real_h200_passes_every_check_in_three_calls(monkeypatch, tmp_path):
    status, result, host = run(monkeypatch, tmp_path, {"plan": [{"name": "a", "gpus": [0], "tensor_parallel_size": 1}]})
    assert status == "ok" and result["changed"] is False
    h = health(result)
    assert h["status"] == "pass" and h["failures"] == [] and h["warnings"] == []
    assert set(h["checks"]) == set(dict(gpu_health.CHECKS))
    assert all(c["status"] == "pass" for c in h["checks"].values())
    assert [call[0] for call in host.calls] == ["query", "remap", "journalctl"]
    assert h["gpus"][0]["clocks_event_reasons"] == "0x0000000000000001" and h["min_driver"] == "580.65.06"
    assert h["nvswitch"] is False and h["tp_groups"] == []


def fault(text, column, value):
    """The capture with one column of the GPU row replaced."""
    head, row = text.splitlines()[:2]
    names = [c.strip() for c in head.split(",")]
    cells = [c.strip() for c in row.split(",")]
    cells[names.index(column)] = value
    return head + "\n" + ", ".join(cells) + "\n"


Q = cap("query_health.out")


@pytest.mark.parametrize("column,value,check,status,text", [
    ("persistence_mode", "Disabled", "persistence", "warn", "persistence mode is off"),
    ("compute_mode", "Prohibited", "compute_mode", "fail", "compute mode is Prohibited"),
    ("mig.mode.current", "Enabled", "mig", "fail", "MIG mode is on"),
    ("mig.mode.pending", "Enabled", "mig", "fail", "turn it off with nvidia-smi -mig 0 -i 0"),
    ("ecc.mode.current", "Disabled", "ecc_mode", "warn", "ECC is off"),
    ("ecc.errors.uncorrected.volatile.total", "3", "ecc_errors", "fail", "3 uncorrected ECC error(s)"),
    ("retired_pages.pending", "Yes", "ecc_errors", "fail", "retired pages pending"),
    ("pcie.link.width.current", "8", "pcie_width", "warn", "PCIe link runs at x8 of x16"),
    ("clocks_event_reasons.hw_thermal_slowdown", "Active", "clocks", "warn", "HW thermal slowdown"),
    ("clocks_event_reasons.hw_power_brake_slowdown", "Active", "clocks", "warn", "HW power brake"),
    ("driver_version", "570.86.15", "driver", "fail", "driver 570.86.15 is older than 580.65.06"),
])
def test_each_gpu_fault_names_the_gpu_and_the_fix(monkeypatch, tmp_path, column, value, check, status, text):
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, fault(Q, column, value)))
    h = health(result)
    assert h["checks"][check]["status"] == status and h["status"] == status
    messages = h["failures"] if status == "fail" else h["warnings"]
    assert len(messages) == 1 and text in messages[0]
    if check != "driver":
        assert messages[0].startswith("GPU 0 (00000000:00:06.0): ")
        assert h["gpus"][0]["checks"][check]["status"] == status


def test_pcie_generation_is_judged_only_under_load(monkeypatch, tmp_path):
    idle = fault(Q, "pcie.link.gen.current", "1")
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, idle))
    assert health(result)["status"] == "pass" and "idle: not judged" in health(result)["checks"]["pcie_gen"]["gpus"]["0"]["message"]
    busy = fault(cap("device_busy_query_health.out"), "pcie.link.gen.current", "3")
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, busy))
    assert health(result)["warnings"] == ["GPU 0 (00000000:00:06.0): PCIe link at Gen3 of Gen5 while the GPU is "
                                          "busy: check the slot's and the BIOS's PCIe generation setting"]


def test_severities_turn_checks_up_down_and_off(monkeypatch, tmp_path):
    q = fault(fault(Q, "pcie.link.width.current", "8"), "mig.mode.current", "Enabled")
    _s, result, _host = run(monkeypatch, tmp_path, {"severities": {"pcie_width": "fail", "mig": "ignore"}},
                            query=(0, q))
    h = health(result)
    assert h["checks"]["pcie_width"]["status"] == "fail" and h["checks"]["mig"]["status"] == "pass"
    assert h["failures"] == [m for m in h["failures"] if "x8 of x16" in m] and len(h["failures"]) == 1
    assert h["checks"]["mig"]["messages"][0].startswith("(ignored) GPU 0")
    status, result, _host = run(monkeypatch, tmp_path, {"severities": {"pcie": "warn"}})
    assert status == "fail" and "unknown check 'pcie'" in result["msg"]


def test_remap_pending_and_failed(monkeypatch, tmp_path):
    pending = cap("remapped_rows.out").replace("0, 0, No, No", "0, 1, Yes, No")
    _s, result, _host = run(monkeypatch, tmp_path, remap=(0, pending))
    assert "row remapping pending" in health(result)["failures"][0]
    failed = cap("remapped_rows.out").replace("0, 0, No, No", "0, 512, No, Yes")
    _s, result, _host = run(monkeypatch, tmp_path, remap=(0, failed))
    assert "row remapping FAILED (512 uncorrectable" in health(result)["failures"][0]
    _s, result, host = run(monkeypatch, tmp_path, remap=(2, cap("device_remapped_rows_bad_field.out")))
    assert health(result)["status"] == "pass" and "row remapping not checked" in host.warnings[0]


def test_a_driver_without_a_field_is_asked_again_without_it(monkeypatch, tmp_path):
    bad = 'Field "fabric.state" is not a valid field to query.\n\n'
    _s, result, host = run(monkeypatch, tmp_path, query=[(2, bad), (0, Q)])
    assert [call[0] for call in host.calls][:2] == ["query", "query"]
    assert "fabric.state" not in host.calls[1][1][1] and health(result)["status"] == "pass"
    assert any("fabric.state" in w for w in host.warnings)


def test_xid_from_the_kernel_log_file(monkeypatch, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:00:06): 13, Graphics Exception\n"
                   "[ 2.0] NVRM: Xid (PCI:0000:00:06): 94, Contained ECC error\n"
                   "[ 3.0] NVRM: Xid (PCI:0000:00:06): 94, Contained ECC error\n")
    _s, result, host = run(monkeypatch, tmp_path, {"kernel_log": str(log)})
    h = health(result)
    assert [call[0] for call in host.calls] == ["query", "remap"]  # the file, not journalctl
    assert len(h["failures"]) == 1 and "Xid 94 (contained ECC error)" in h["failures"][0]
    assert any("Xid 13" in m for m in h["checks"]["xid"]["messages"])  # listed, passes
    _s, result, _host = run(monkeypatch, tmp_path, {"kernel_log": str(log), "xid_fail_codes": [13]})
    assert "Xid 13" in health(result)["failures"][0]


def test_nvswitch_host_needs_the_fabric_manager_at_the_driver_version(monkeypatch, tmp_path):
    (tmp_path / "nvswitch" / "0").mkdir(parents=True)
    q = fault(fault(Q, "fabric.state", "Completed"), "fabric.status", "Success")
    _s, result, host = run(monkeypatch, tmp_path, query=(0, q))
    assert health(result)["status"] == "pass" and health(result)["nvswitch"] is True
    assert [call[0] for call in host.calls][-2:] == ["systemctl", "fm"]
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, fault(q, "fabric.state", "In Progress")),
                            systemctl=(3, "inactive\n"))
    failures = health(result)["failures"]
    assert "1 NVSwitch device(s) but nvidia-fabricmanager is inactive" in failures[0]
    assert "nvidia-fabricmanager-580" in failures[0] and "fabric state In Progress" in failures[1]
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, q), fm=(0, "Fabric Manager version is : 580.95.05\n"))
    assert "fabric manager 580.95.05 does not match the driver 580.159.04" in health(result)["failures"][0]


P2P = (" \t\x1b[4mGPU0\tGPU1\tGPU2\t\x1b[0m\n GPU0\tX\tOK\tNS\t\n GPU1\tOK\tX\tNS\t\n GPU2\tNS\tNS\tX\t\n\nLegend:\n")
ROW0 = "0, GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad, 00000000:00:06.0"
Q3 = Q + "\n".join(Q.splitlines()[1].replace(ROW0, "%d, GPU-ed3c5504-4725-ca05-65a6-3231da0a09a%d, 00000000:00:0%d.0" % (i, i, 6 + i))
                   for i in (1, 2)) + "\n"


@pytest.mark.parametrize("plan", [
    [{"name": "a", "gpus": [0, 1], "tensor_parallel_size": 2}, {"name": "b", "gpus": [1, 2], "tensor_parallel_size": 2}],
    {"instances": [{"name": "a", "gpus": [0, 1], "tensor_parallel_size": 2},
                   {"name": "b", "gpus": ["GPU-ed3c5504-4725-ca05-65a6-3231da0a09a1", 2], "tensor_parallel_size": 2}]},
])
def test_p2p_per_planned_group_both_plan_shapes(monkeypatch, tmp_path, plan):
    _s, result, host = run(monkeypatch, tmp_path, {"plan": plan}, query=(0, Q3), p2p=(0, P2P))
    h = health(result)
    assert h["tp_groups"] == [[0, 1], [1, 2]]
    assert [c for c in host.calls if c[0] == "p2p"] == [("p2p", ["/usr/bin/nvidia-smi", "topo", "-p2p", "r"])]
    assert len(h["failures"]) == 1
    assert h["failures"][0].startswith("tensor-parallel group GPUs 1,2: P2P read is not available (GPU1-GPU2 NS")
    assert "NCCL_P2P_DISABLE=1" in h["failures"][0] and "ACS" in h["failures"][0]
    _s, result, _host = run(monkeypatch, tmp_path, {"plan": plan, "p2p_mitigated": True}, query=(0, Q3), p2p=(0, P2P))
    assert health(result)["status"] == "pass"


def test_shm_size_follows_the_planned_instances(monkeypatch, tmp_path):
    plan = [{"name": "a", "gpus": [0], "tensor_parallel_size": 1},
            {"name": "b", "gpus": [], "tensor_parallel_size": 2}, {"name": "c", "gpus": [], "pipeline_parallel_size": 2}]
    _s, result, _host = run(monkeypatch, tmp_path, {"plan": plan, "shm_min_mib": None, "shm_mib_per_instance": 10 ** 9})
    assert "less than the 2000000000 MiB asked for 2 planned multi-GPU instance(s)" in health(result)["failures"][0]
    _s, result, _host = run(monkeypatch, tmp_path, {"plan": plan[:1], "shm_min_mib": None, "shm_mib_per_instance": 10 ** 9})
    assert health(result)["checks"]["shm"]["status"] == "pass"  # single-GPU instances ask for none


def test_cpu_build_skips_the_driver_check_and_unknown_builds_fail(monkeypatch, tmp_path):
    _s, result, _host = run(monkeypatch, tmp_path, {"cuda_build": ""}, query=(0, fault(Q, "driver_version", "470.1.1")))
    assert health(result)["checks"]["driver"]["status"] == "pass"
    _s, result, _host = run(monkeypatch, tmp_path, {"cuda_build": "14.2"})
    assert "CUDA build 14.2 of vLLM is not in the driver table" in health(result)["failures"][0]
    _s, result, _host = run(monkeypatch, tmp_path, {"cuda_build": "14.2", "min_driver": "590.10"})
    assert "older than 590.10" in health(result)["failures"][0]
