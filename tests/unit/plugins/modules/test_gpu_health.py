"""gpu_health through its main(): real H200 captures (tests/fixtures/nvidia-smi/h200-1gpu-health/)
as nvidia-smi's answers, edited into each fault; the commands it runs and the verdicts."""
import os

import pytest
from ansible.module_utils import basic
from hypothesis import HealthCheck, given, settings, strategies as st

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
        if callable(answer):  # a driver that answers by what is asked
            answer = answer(list(cmd))
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
    names = [c.strip().split(" [")[0] for c in head.split(",")]  # power.draw [W] -> power.draw
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


# ------------------------------------------------------------------ old drivers, N/A readings, broken GPUs (issue 24)
# The real capture with cells replaced as a pre-R535 driver or a broken GPU prints them (same header,
# columns and separators).

UUID = "GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad"
LABEL = "GPU 0 (00000000:00:06.0)"
# the pass sentences of the readings a broken GPU's test replaces
GOOD_NEWS = ("no thermal or power-brake slowdown", "no uncorrected ECC errors", "PCIe x", "PCIe Gen",
             "no reading in an error state")


def cells(text, **values):
    """The capture with cells of the GPU row replaced ({field: value}; dots written as __)."""
    out = text
    for field, value in values.items():
        out = fault(out, field.replace("__", "."), value)
    return out


def old_driver(text, knows_old_names=True):
    """A driver before R535 serving ``text``: clocks_event_reasons.* are not valid fields (the real
    exit-2 answer), clocks_throttle_reasons.* are (if ``knows_old_names``) and head their columns."""
    head, row = text.splitlines()[:2]
    columns = dict(zip([c.strip().split(" [")[0] for c in head.split(",")],
                       zip([c.strip() for c in head.split(",")], [c.strip() for c in row.split(",")])))

    def answer(cmd):
        asked = cmd[1].split("=", 1)[1].split(",")
        for field in asked:
            unknown = field.startswith("clocks_event_reasons.") or (
                field.startswith("clocks_throttle_reasons.") and not knows_old_names)
            if unknown:
                return 2, cap("device_query_bad_field.out").replace("clocks_event_reasons.nope", field)
        picked = [columns[f.replace("clocks_throttle_reasons.", "clocks_event_reasons.")] for f in asked]
        header = [f + name[len(name.split(" [")[0]):] for f, (name, _cell) in zip(asked, picked)]
        return 0, ", ".join(header) + "\n" + ", ".join(cell for _name, cell in picked) + "\n"
    return answer


def queries(host):
    return [call[1][1] for call in host.calls if call[0] == "query"]


def all_messages(h):
    return [c["message"] for g in h["gpus"] for c in g["checks"].values()] + [
        m for c in h["checks"].values() for m in c["messages"]]


def test_a_pre_r535_driver_is_asked_again_with_the_throttle_names(monkeypatch, tmp_path):
    q = cells(Q, driver_version="525.147.05", clocks_event_reasons__active="0x0000000000000041",
              clocks_event_reasons__hw_thermal_slowdown="Active", temperature__gpu="91")
    _s, result, host = run(monkeypatch, tmp_path, {"cuda_build": "11.8"}, query=old_driver(q))
    asked = queries(host)
    assert asked == ["--query-gpu=" + ",".join(n.HEALTH_FIELDS),
                     "--query-gpu=" + ",".join(n.LEGACY_HEALTH_FIELDS.get(f, f) for f in n.HEALTH_FIELDS)]
    h = health(result)
    assert h["status"] == "warn" and h["failures"] == [] and host.warnings == []
    assert h["warnings"] == ["GPU 0 (00000000:00:06.0): clocks held down by HW thermal slowdown (91 C, 81.63 of "
                             "700.0 W) (read as clocks_throttle_reasons.*: a driver before R535): check cooling, "
                             "fans and the power supply / power brake cable"]
    assert h["gpus"][0]["clock_event_fields"] == "clocks_throttle_reasons" and h["driver_version"] == "525.147.05"


def test_a_pre_r535_driver_without_slowdown_says_where_the_reading_came_from(monkeypatch, tmp_path):
    q = cells(Q, driver_version="525.147.05")
    _s, result, _host = run(monkeypatch, tmp_path, {"cuda_build": "11.8"}, query=old_driver(q))
    h = health(result)
    assert h["status"] == "pass"
    assert h["checks"]["clocks"]["gpus"]["0"]["message"] == (
        LABEL + ": no thermal or power-brake slowdown (read as clocks_throttle_reasons.*: a driver before R535)")


def test_a_driver_that_knows_neither_name_says_not_available(monkeypatch, tmp_path):
    q = cells(Q, driver_version="470.239.06", pcie__link__gen__current="3")
    _s, result, host = run(monkeypatch, tmp_path, {"cuda_build": ""}, query=old_driver(q, knows_old_names=False))
    assert len(queries(host)) == 2 + 5 and "clocks_" not in queries(host)[-1]
    h = health(result)
    clocks = h["checks"]["clocks"]["gpus"]["0"]["message"]
    assert clocks == (LABEL + ": clock event reasons (thermal and power-brake slowdown) not available (nvidia-smi "
                      "reports N/A or Not Supported, or this driver lacks the field)")
    assert h["checks"]["pcie_gen"]["gpus"]["0"]["message"] == (
        LABEL + ": PCIe Gen3 of Gen5 (not judged: clocks_event_reasons.active, which tells busy from idle, "
        "is not available)")
    assert host.warnings == ["this driver does not know the query field %s: the checks that need it report it as "
                             "not available" % f for f in n.LEGACY_HEALTH_FIELDS.values()]
    assert h["gpus"][0]["clock_event_fields"] is None


NA_CASES = [
    ({"pcie.link.width.current": "[N/A]", "pcie.link.width.max": "[N/A]"}, "pcie_width",
     LABEL + ": PCIe link width not available (nvidia-smi reports N/A or Not Supported, or this driver lacks the "
     "field)"),
    ({"pcie.link.width.current": "[Not Supported]"}, "pcie_width",
     LABEL + ": PCIe link width not available (current not available, max x16; nvidia-smi reports N/A or Not "
     "Supported, or this driver lacks the field)"),
    ({"pcie.link.gen.current": "[N/A]", "pcie.link.gen.max": "[Not Supported]"}, "pcie_gen",
     LABEL + ": PCIe link generation not available (nvidia-smi reports N/A or Not Supported, or this driver lacks "
     "the field)"),
    ({"ecc.errors.uncorrected.volatile.total": "[N/A]"}, "ecc_errors",
     LABEL + ": uncorrected ECC error count not available; retired pages pending not available (GPUs from Ampere "
     "on remap rows instead: see row_remap)"),
    ({"ecc.errors.uncorrected.volatile.total": "[Not Supported]", "retired_pages.pending": "No"}, "ecc_errors",
     LABEL + ": uncorrected ECC error count not available; no retired pages pending"),
    ({"ecc.mode.current": "[N/A]"}, "ecc_mode",
     LABEL + ": ECC mode not available (nvidia-smi reports N/A or Not Supported, or this driver lacks the field)"),
    ({"persistence_mode": "[Not Supported]"}, "persistence",
     LABEL + ": persistence mode not available (nvidia-smi reports N/A or Not Supported, or this driver lacks the "
     "field)"),
    ({"mig.mode.current": "[N/A]", "mig.mode.pending": "[N/A]"}, "mig",
     LABEL + ": MIG mode not available (nvidia-smi reports N/A or Not Supported, or this driver lacks the field)"),
    ({"compute_mode": "[N/A]"}, "compute_mode",
     LABEL + ": compute mode not available (nvidia-smi reports N/A or Not Supported, or this driver lacks the field)"),
    (dict((f, "[Not Supported]") for f in n.HEALTH_FIELDS if f.startswith("clocks_event_reasons.")), "clocks",
     LABEL + ": clock event reasons (thermal and power-brake slowdown) not available (nvidia-smi reports N/A or Not "
     "Supported, or this driver lacks the field)"),
    # per-reason fields N/A, the bit mask readable: the mask's bits are the reading
    (dict((f, "[N/A]") for f in n.HEALTH_FIELDS if f.startswith(("clocks_event_reasons.h", "clocks_event_reasons.s"))),
     "clocks", LABEL + ": no thermal or power-brake slowdown"),
    ({"clocks_event_reasons.active": "[N/A]", "clocks_event_reasons.hw_power_brake_slowdown": "[N/A]"}, "clocks",
     LABEL + ": no HW slowdown, HW thermal slowdown, SW thermal slowdown; HW power brake not available"),
]


@pytest.mark.parametrize("values,check,message", NA_CASES)
def test_n_a_and_not_supported_readings_say_not_available(monkeypatch, tmp_path, values, check, message):
    q = Q
    for field, value in values.items():
        q = fault(q, field, value)
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, q))
    h = health(result)
    assert h["checks"][check]["gpus"]["0"] == {"status": "pass", "message": message}
    assert h["gpus"][0]["checks"][check]["message"] == message
    assert h["checks"]["gpu_state"]["status"] == "pass" and h["gpus"][0]["error_states"] == {}
    assert not any("None" in m for m in all_messages(h))


def test_a_na_reading_next_to_a_slowdown_never_prints_none(monkeypatch, tmp_path):
    q = cells(Q, clocks_event_reasons__hw_slowdown="Active", temperature__gpu="[N/A]", power__draw="[Not Supported]")
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, q))
    assert health(result)["warnings"] == [
        LABEL + ": clocks held down by HW slowdown (not available C, not available of 700.0 W): check cooling, fans "
        "and the power supply / power brake cable"]


def test_remapped_rows_n_a_is_not_good_news(monkeypatch, tmp_path):
    na = cap("remapped_rows.out").replace("0, 0, No, No", "[N/A], [N/A], [N/A], [N/A]")
    _s, result, _host = run(monkeypatch, tmp_path, remap=(0, na))
    assert health(result)["checks"]["row_remap"]["gpus"]["0"]["message"] == (
        LABEL + ": row remapping not available (GPUs before Ampere: retired pages are checked instead)")
    other = cap("remapped_rows.out").replace("ed3c5504", "00000000").replace("00:06.0", "00:07.0")
    _s, result, _host = run(monkeypatch, tmp_path, remap=(0, other))
    assert health(result)["checks"]["row_remap"]["gpus"]["0"]["message"] == (
        LABEL + ": row remapping not available: --query-remapped-rows has no row for this GPU")


# Live readings of a broken GPU: what nvidia-smi prints in their place.
LIVE = ("ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total", "pcie.link.gen.current",
        "pcie.link.width.current", "clocks_event_reasons.active", "clocks_event_reasons.hw_slowdown",
        "temperature.gpu", "power.draw")
HINTS = {
    "[GPU requires reset]": "drain the GPU and reset it (nvidia-smi -r -i 0) or reboot the host; the kernel log says "
                            "why (dmesg | grep -i xid)",
    "[GPU is lost]": "the GPU has fallen off the bus: drain the host and reboot it, check the slot, riser and power "
                     "cabling, and replace the GPU if it comes back; the kernel log says why (dmesg | grep -i xid)",
    "[Unknown Error]": "drain the GPU and reset it (nvidia-smi -r -i 0) or reboot the host; the kernel log says why "
                       "(dmesg | grep -i xid)",
    "[Insufficient Permissions]": "this user may not read the GPU: run the check as root (become: true) or give the "
                                  "user access to /dev/nvidia*",
    "[Timeout]": "drain the GPU and reset it (nvidia-smi -r -i 0) or reboot the host; the kernel log says why "
                 "(dmesg | grep -i xid)",
}


@pytest.mark.parametrize("state", sorted(HINTS))
def test_a_gpu_in_a_bracketed_error_state_fails_naming_it(monkeypatch, tmp_path, state):
    q = Q
    for field in LIVE:
        q = fault(q, field, state)
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, q))
    h = health(result)
    assert h["status"] == "fail" and h["checks"]["gpu_state"]["status"] == "fail"
    assert h["failures"] == [
        "GPU 0 (00000000:00:06.0, %s) is in an error state: nvidia-smi reads %s (%s); no reading of this GPU can be "
        "trusted: %s" % (UUID, state, ", ".join(LIVE), HINTS[state])]
    gpu = h["gpus"][0]
    assert gpu["status"] == "fail" and gpu["checks"]["gpu_state"]["status"] == "fail"
    assert gpu["error_states"] == dict((f, state) for f in LIVE)
    readable = "not readable (ecc.errors.uncorrected.volatile.total %s; see the gpu_state check)" % state
    assert gpu["checks"]["ecc_errors"]["message"] == (
        LABEL + ": uncorrected ECC error count %s; retired pages pending not available (GPUs from Ampere on remap "
        "rows instead: see row_remap)" % readable)
    assert gpu["checks"]["pcie_width"]["message"] == (
        LABEL + ": PCIe link width not readable (current not available, max x16; pcie.link.width.current %s; see the "
        "gpu_state check)" % state)
    assert gpu["checks"]["clocks"]["message"] == (
        LABEL + ": clock event reasons (thermal and power-brake slowdown) not readable (clocks_event_reasons.active "
        "%s, clocks_event_reasons.hw_slowdown %s; see the gpu_state check)" % (state, state))
    for message in all_messages(h):
        assert "None" not in message and not any(good in message for good in GOOD_NEWS), message


def test_a_lost_gpu_without_a_readable_uuid_or_bus_id_is_named_by_index(monkeypatch, tmp_path):
    q = cells(Q, uuid="[GPU is lost]", pci__bus_id="[GPU is lost]", temperature__gpu="[GPU is lost]")
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus.\n")
    _s, result, _host = run(monkeypatch, tmp_path, {"kernel_log": str(log)}, query=(0, q))
    h = health(result)
    assert h["failures"][0] == (
        "GPU 0 (bus id not readable, uuid not readable) is in an error state: nvidia-smi reads [GPU is lost] (uuid, "
        "pci.bus_id, temperature.gpu); no reading of this GPU can be trusted: " + HINTS["[GPU is lost]"])
    assert h["checks"]["row_remap"]["gpus"]["0"]["message"] == (
        "GPU 0 (bus id [GPU is lost]): row remapping not available: --query-remapped-rows has no row for this GPU")
    assert "PCI 0000:00:06: Xid 79" in h["failures"][1]  # the Xid can no longer be matched to the GPU


def test_mixed_states_and_remapped_rows_in_an_error_state(monkeypatch, tmp_path):
    q = cells(Q, power__draw="[Unknown Error]", pcie__link__gen__current="[GPU requires reset]")
    remap = cap("remapped_rows.out").replace("0, 0, No, No", "0, 0, [GPU requires reset], No")
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, q), remap=(0, remap))
    h = health(result)
    assert h["failures"] == [
        "GPU 0 (00000000:00:06.0, %s) is in an error state: nvidia-smi reads [GPU requires reset] "
        "(pcie.link.gen.current, remapped_rows.pending) and [Unknown Error] (power.draw); no reading of this GPU can "
        "be trusted: drain the GPU and reset it (nvidia-smi -r -i 0) or reboot the host; the kernel log says why "
        "(dmesg | grep -i xid)" % UUID]
    assert h["checks"]["row_remap"]["gpus"]["0"]["message"] == (
        LABEL + ": row remapping not readable (remapped_rows.pending [GPU requires reset]; see the gpu_state check)")


def test_the_gpu_state_check_takes_a_severity(monkeypatch, tmp_path):
    q = cells(Q, temperature__gpu="[Unknown Error]")
    _s, result, _host = run(monkeypatch, tmp_path, {"severities": {"gpu_state": "warn"}}, query=(0, q))
    h = health(result)
    assert h["status"] == "warn" and h["warnings"][0].startswith("GPU 0 (00000000:00:06.0, %s) is in an error" % UUID)
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, Q))
    assert health(result)["checks"]["gpu_state"]["gpus"]["0"] == {
        "status": "pass", "message": LABEL + ": no reading in an error state"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="[],"),
                     min_size=1, max_size=30).filter(
                         lambda t: t.strip() == t and "[%s]" % t not in n.NO_VALUE_SPELLINGS),
       fields=st.lists(st.sampled_from([f for f in n.HEALTH_FIELDS if f not in ("index", "uuid", "pci.bus_id")]),
                       min_size=1, max_size=5, unique=True))
def test_any_bracketed_state_in_any_reading_fails_the_gpu(monkeypatch, tmp_path, state, fields):
    q = Q
    for field in fields:
        q = fault(q, field, "[%s]" % state)
    _s, result, _host = run(monkeypatch, tmp_path, query=(0, q))
    h = health(result)
    assert h["status"] == "fail" and h["gpus"][0]["status"] == "fail"
    ordered = [f for f in n.HEALTH_FIELDS if f in fields]
    assert ("nvidia-smi reads [%s] (%s)" % (state, ", ".join(ordered))) in h["checks"]["gpu_state"]["problems"][0]
    # no Python None leaks into a message (the reading itself may spell "None": it is quoted as read)
    assert not any("None" in m.replace(state, "") for m in all_messages(h))
