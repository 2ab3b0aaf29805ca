"""The health parsers of module_utils/nvidia_smi.py on real H200 captures, on gpusim output, and as
hypothesis properties (render -> parse gives back what was rendered)."""
import atexit
import csv
import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi as n

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
CAP = os.path.join(ROOT, "tests", "fixtures", "nvidia-smi", "h200-1gpu-health")
SMI = os.path.join(ROOT, "tests", "gpusim", "nvidia-smi")
EMPTY = tempfile.mkdtemp(prefix="gpusim-empty-")
atexit.register(os.rmdir, EMPTY)


def cap(name):
    with open(os.path.join(CAP, name)) as handle:
        return handle.read()


def commands():
    with open(os.path.join(CAP, "commands.tsv")) as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    return dict((r[0], (int(r[1]), r[2])) for r in rows[1:])


def sim(profile, *args):
    # an empty proc root and stray directory: the machine's own processes (a vLLM or a gpusim-hold of a
    # Molecule scenario running beside the unit tests, in a container whose processes the host's /proc
    # shows) would otherwise load the simulated GPU (CI failed that way: the captured idle GPU read busy)
    env = dict(os.environ, GPUSIM_PROFILE=profile, GPUSIM_NOW="2026-12-03T13:55:23",
               GPUSIM_PROC=EMPTY, GPUSIM_STRAY_DIR=EMPTY)
    proc = subprocess.run([sys.executable, SMI] + list(args), capture_output=True, text=True, env=env, check=False)
    return proc.returncode, proc.stdout


H200 = {
    "index": 0, "pci_bus_id": "00000000:00:06.0", "driver_version": "580.159.04",
    "persistence_mode": "Enabled", "compute_mode": "Default", "mig_mode": "Disabled",
    "mig_mode_pending": "Disabled", "ecc_mode": "Enabled", "ecc_uncorrected_volatile": 0,
    "ecc_corrected_volatile": 0, "retired_pages_pending": None, "pcie_gen_current": 5,
    "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16, "hw_slowdown": False,
    "sw_thermal_slowdown": False, "hw_thermal_slowdown": False, "hw_power_brake_slowdown": False,
    "power_limit_w": 700.0, "fabric_state": None, "fabric_status": None,
}


def test_the_capture_asks_for_exactly_the_modules_fields():
    _rc, command = commands()["query_health.out"]
    assert command == "nvidia-smi --query-gpu=%s --format=csv" % ",".join(n.HEALTH_FIELDS)
    _rc, command = commands()["remapped_rows.out"]
    assert command == "nvidia-smi " + " ".join(n.QUERY_REMAPPED_ROWS_ARGS)


@pytest.mark.parametrize("name", ["query_health.out", "query_health_nounits.out"])
def test_health_query_of_the_real_h200(name):
    (gpu,) = n.parse_health_query(cap(name))
    assert dict((k, gpu[k]) for k in H200) == H200
    assert gpu["clocks_event_reasons"] == 1 and n.clock_event_names(1) == ["gpu_idle"]
    assert gpu["power_draw_w"] == 81.63 and gpu["temperature_gpu"] == 40


def test_health_query_under_load_clears_the_idle_bit():
    (gpu,) = n.parse_health_query(cap("device_busy_query_health.out"))
    assert gpu["clocks_event_reasons"] == 0 and n.clock_event_names(0) == []
    assert (gpu["pcie_gen_current"], gpu["pcie_width_current"]) == (5, 16)
    assert gpu["power_draw_w"] == 539.79


def test_unknown_fields_are_named_for_the_retry():
    for name, field in (("device_query_bad_field.out", "clocks_event_reasons.nope"),
                        ("device_remapped_rows_bad_field.out", "remapped_rows.nope")):
        rc, command = commands()[name]
        exc = n.error_from_output(command.split(), rc, cap(name), "")
        assert isinstance(exc, n.NvidiaSmiUnknownFieldError) and exc.field == field


def test_remapped_rows_and_p2p_of_the_real_h200():
    assert n.parse_remapped_rows(cap("remapped_rows.out")) == [{
        "gpu_uuid": "GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad", "gpu_bus_id": "00000000:00:06.0",
        "correctable": 0, "uncorrectable": 0, "pending": False, "failure": False, "error_states": {}}]
    for kind in "rwn":
        assert n.parse_topo_p2p(cap("topo_p2p_%s.out" % kind)) == {0: {}}


def test_driver_version_xid_and_nvswitch_captures():
    assert n.parse_proc_driver_version(cap("proc_driver_version.out")) == "580.159.04"
    assert n.parse_xid_lines(cap("dmesg_xid.out")) == []
    assert "total 0" in cap("nvswitch_devices.out")


@pytest.mark.parametrize("name,args", [
    ("query_health.out", ["--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv"]),
    ("query_health_nounits.out", ["--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv,noheader,nounits"]),
    ("remapped_rows.out", list(n.QUERY_REMAPPED_ROWS_ARGS)),
    ("topo_p2p_r.out", ["topo", "-p2p", "r"]),
    ("topo_p2p_w.out", ["topo", "-p2p", "w"]),
    ("topo_p2p_n.out", ["topo", "-p2p", "n"]),
])
def test_gpusim_prints_the_captured_forms(name, args):
    rc, out = sim("h200-1gpu", *args)
    assert rc == 0
    real = cap(name)
    # the simulated H200 is another card of the same VM type: other UUID, temperature and power
    swap = {"GPU-84ea54cb-4767-0e6a-8104-87422151c222": "GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad",
            ", 33, 80.60": ", 40, 81.63"}
    for a, b in swap.items():
        out = out.replace(a, b)
    assert out == real


def test_gpusim_fault_profiles_read_as_faults():
    _rc, out = sim("fault-h200-remap-pending", *n.QUERY_REMAPPED_ROWS_ARGS)
    assert n.parse_remapped_rows(out)[0]["pending"] is True
    _rc, out = sim("fault-h200-pcie-x8", "--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv")
    assert n.parse_health_query(out)[0]["pcie_width_current"] == 8
    _rc, out = sim("fault-h200-mig-on", "--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv")
    assert n.parse_health_query(out)[0]["mig_mode"] == "Enabled"
    _rc, out = sim("fault-seed-p2p-ns", "topo", "-p2p", "r")
    matrix = n.parse_topo_p2p(out)
    assert matrix[0][3] == "OK" and matrix[0][4] == "NS" and matrix[7][4] == "OK"
    _rc, out = sim("fault-hgx-fm-stopped", "--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv")
    assert {g["fabric_state"] for g in n.parse_health_query(out)} == {"In Progress"}


@pytest.mark.parametrize("line,expected", [
    ("[ 4021.337201] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     ("Xid", 79, "0000:18:00")),
    ("Dec 03 13:55:23 gpu7 kernel: NVRM: Xid (PCI:0000:B5:00): 48, pid=1234, name=python3, DBE (0x1,0x0)",
     ("Xid", 48, "0000:b5:00")),
    ("[  12.5] NVRM: Xid (PCI:00000000:3b:00.0): 94, Contained: SM (0x1)", ("Xid", 94, "0000:3b:00")),
    ("[ 99.1] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error",
     ("SXid", 12028, "nvswitch2")),
])
def test_xid_lines_in_the_kernel_log_formats(line, expected):
    (event,) = n.parse_xid_lines("noise\n" + line + "\nNVRM: loading module\n")
    assert (event["kind"], event["xid"], event["pci"]) == expected
    assert n.xid_pci_of_bus_id("00000000:B5:00.0") == "0000:b5:00"


def test_fabricmanager_version_and_version_order():
    assert n.parse_fabricmanager_version("Fabric Manager version is : 580.159.04\n") == "580.159.04"
    assert n.parse_fabricmanager_version("nv-fabricmanager: command not found") is None
    assert n.version_tuple("580.65.06") < n.version_tuple("580.159.04")
    assert n.version_tuple(n.CUDA_MIN_DRIVER["12.9"]) == (575, 51, 3)
    with pytest.raises(n.NvidiaSmiParseError):
        n.version_tuple("580.x")


@pytest.mark.parametrize("text", [
    "", " \tGPU0\t\n GPU0\tOK\t\n", " \tGPU0\tGPU1\t\n GPU0\tX\tOK\t\n", " \tGPU0\tGPU1\t\n GPU0\tX\tMAYBE\t\n GPU1\tOK\tX\t\n",
    " \tNIC0\t\n NIC0\tX\t\n",
])
def test_bad_p2p_matrices_raise(text):
    with pytest.raises(n.NvidiaSmiParseError):
        n.parse_topo_p2p(text)


# ------------------------------------------------------------------ properties

STATUS = st.sampled_from(["OK", "NS", "CNS", "GNS", "TNS", "U"])


def render_p2p(size, cells):
    head = " \t\x1b[4m" + "".join("GPU%d\t" % i for i in range(size)) + "\x1b[0m\n"
    rows = "".join(" GPU%d\t" % i + "".join(("X" if i == j else cells[(min(i, j), max(i, j))]) + "\t"
                                            for j in range(size)) + "\n" for i in range(size))
    return head + rows + "\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=8).flatmap(
    lambda size: st.tuples(st.just(size), st.fixed_dictionaries(
        dict(((i, j), STATUS) for i in range(size) for j in range(i + 1, size))))))
def test_p2p_matrix_round_trips(args):
    size, cells = args
    matrix = n.parse_topo_p2p(render_p2p(size, cells))
    assert sorted(matrix) == list(range(size))
    for (i, j), value in cells.items():
        assert matrix[i][j] == value and matrix[j][i] == value


HEX = "0123456789abcdef"


@settings(max_examples=80, deadline=None)
@given(domain=st.integers(0, 0xFFFF), bus=st.integers(0, 255), dev=st.integers(0, 31),
       xid=st.integers(1, 200), upper=st.booleans(), long_domain=st.booleans(),
       prefix=st.sampled_from(["", "[ 1234.567890] ", "Dec 03 13:55:23 host kernel: "]),
       detail=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60))
def test_xid_line_round_trips(domain, bus, dev, xid, upper, long_domain, prefix, detail):
    pci = ("%08x" if long_domain else "%04x") % domain + ":%02x:%02x" % (bus, dev)
    if upper:
        pci = pci.upper()
    line = "%sNVRM: Xid (PCI:%s): %d, %s" % (prefix, pci, xid, detail)
    (event,) = n.parse_xid_lines(line)
    assert event["xid"] == xid and event["pci"] == "%04x:%02x:%02x" % (domain, bus, dev)
    assert event["detail"] == detail.strip()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99), st.booleans(), st.booleans(),
                          st.booleans()), min_size=1, max_size=8), st.booleans())
def test_remapped_rows_round_trip(rows, header):
    lines = ["gpu_uuid, gpu_bus_id, remapped_rows.correctable, remapped_rows.uncorrectable, "
             "remapped_rows.pending, remapped_rows.failure"] if header else []
    expected = []
    for k, (corr, unc, pending, failure, na) in enumerate(rows):
        uuid = "GPU-%08x-0000-0000-0000-%012x" % (k, k)
        bus = "00000000:%02X:00.0" % (k + 1)
        if na:
            lines.append("%s, %s, [N/A], [N/A], [N/A], [N/A]" % (uuid, bus))
            expected.append({"gpu_uuid": uuid, "gpu_bus_id": bus, "correctable": None,
                             "uncorrectable": None, "pending": None, "failure": None, "error_states": {}})
        else:
            flags = ("Yes" if pending else "No", "Yes" if failure else "No")
            lines.append("%s, %s, %d, %d, %s, %s" % ((uuid, bus, corr, unc) + flags))
            expected.append({"gpu_uuid": uuid, "gpu_bus_id": bus, "correctable": corr,
                             "uncorrectable": unc, "pending": pending, "failure": failure, "error_states": {}})
    assert n.parse_remapped_rows("\n".join(lines) + "\n") == expected


def na(value):
    return None if value == "[N/A]" else value


MODE = st.sampled_from(["Enabled", "Disabled", "[N/A]"])
ACTIVE = st.sampled_from(["Active", "Not Active", "[N/A]"])


@settings(max_examples=60, deadline=None)
@given(pm=MODE, mig=MODE, ecc=MODE, unc=st.integers(0, 10**6), gen=st.integers(1, 6),
       width=st.sampled_from([1, 2, 4, 8, 16, 32]), mask=st.integers(0, 0x1FF), slow=ACTIVE,
       watts=st.integers(0, 100000), units=st.booleans(), header=st.booleans(),
       remap=st.sampled_from(["Yes", "No", "[N/A]"]))
def test_health_query_round_trips(pm, mig, ecc, unc, gen, width, mask, slow, watts, units, header, remap):
    w = "%.2f" % (watts / 100.0)
    row = ["3", "GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad", "00000000:19:00.0", "580.159.04", pm, "Default",
           mig, mig, ecc, str(unc), "0", remap, str(gen), str(gen), str(width), "16", "0x%016x" % mask,
           slow, slow, slow, slow, "40", w + (" W" if units else ""), "700.00" + (" W" if units else ""),
           "N/A", "N/A"]
    head = [f + (" [W]" if f in ("power.draw", "power.limit") and units else "") for f in n.HEALTH_FIELDS]
    text = (", ".join(head) + "\n" if header else "") + ", ".join(row) + "\n"
    (gpu,) = n.parse_health_query(text)
    assert gpu["index"] == 3 and gpu["persistence_mode"] == na(pm) and gpu["mig_mode"] == na(mig)
    assert gpu["ecc_mode"] == na(ecc) and gpu["ecc_uncorrected_volatile"] == unc
    assert gpu["retired_pages_pending"] == {"Yes": True, "No": False, "[N/A]": None}[remap]
    assert (gpu["pcie_gen_current"], gpu["pcie_width_current"]) == (gen, width)
    assert gpu["clocks_event_reasons"] == mask
    assert gpu["hw_slowdown"] == {"Active": True, "Not Active": False, "[N/A]": None}[slow]
    assert gpu["power_draw_w"] == float(w)
    names = n.clock_event_names(mask)
    assert ("gpu_idle" in names) == bool(mask & 1)


# ------------------------------------------------------------------ old drivers and broken GPUs (issue 24)
# Inputs are the real capture with cells replaced as a pre-R535 driver or a broken GPU prints them:
# same header, column layout and ", " separators.

CLOCK_FIELDS = [f for f in n.HEALTH_FIELDS if f.startswith("clocks_event_reasons.")]
STATES = ["[GPU requires reset]", "[Unknown Error]", "[GPU is lost]", "[Insufficient Permissions]"]


def replace_cells(text, **cells):
    """The capture with cells of the GPU row replaced ({field: value}; dots as __ in the keyword)."""
    head, row = text.splitlines()[:2]
    names = [c.strip().split(" [")[0] for c in head.split(",")]
    values = [c.strip() for c in row.split(",")]
    for field, value in cells.items():
        values[names.index(field.replace("__", "."))] = value
    return head + "\n" + ", ".join(values) + "\n"


def pre_r535(text, driver="525.147.05"):
    """The capture as a driver before R535 prints it: the clock-event columns under their old names."""
    head, row = text.splitlines()[:2]
    head = head.replace("clocks_event_reasons.", "clocks_throttle_reasons.")
    return head + "\n" + row.replace("580.159.04", driver) + "\n"


def test_the_old_names_are_the_help_texts_deprecated_aliases():
    with open(os.path.join(ROOT, "tests", "fixtures", "nvidia-smi", "h200-1gpu", "smi_help_query.out")) as handle:
        help_text = handle.read()
    for new, old in n.LEGACY_HEALTH_FIELDS.items():
        assert '"%s" or "%s"' % (new, old) in help_text
    assert sorted(n.LEGACY_HEALTH_FIELDS) == sorted(CLOCK_FIELDS) and len(CLOCK_FIELDS) == 5


def test_a_pre_r535_header_reads_as_the_same_clock_event_readings():
    text = pre_r535(replace_cells(cap("query_health.out"), clocks_event_reasons__active="0x0000000000000041",
                                  clocks_event_reasons__hw_thermal_slowdown="Active"))
    assert "clocks_throttle_reasons.hw_thermal_slowdown" in text and "clocks_event_reasons" not in text
    (gpu,) = n.parse_health_query(text)
    assert gpu["driver_version"] == "525.147.05" and gpu["clocks_event_reasons"] == 0x41
    assert (gpu["hw_thermal_slowdown"], gpu["hw_slowdown"], gpu["hw_power_brake_slowdown"]) == (True, False, False)
    assert n.clock_event_names(0x41) == ["gpu_idle", "hw_thermal_slowdown"] and gpu["error_states"] == {}


@pytest.mark.parametrize("value", ["[N/A]", "[Not Supported]", "N/A", "[Requested functionality has been deprecated]",
                                   "0", "Enabled", "GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad", "[]", "[a, b]"])
def test_no_value_spellings_and_values_are_no_error_state(value):
    assert n.error_state(value) is None


@pytest.mark.parametrize("value", STATES + ["[Not Found]", "[Timeout]", "[GPU access blocked by the operating system]",
                                            " [Unknown Error] ", "[Error 999]"])
def test_other_brackets_are_error_states(value):
    assert n.error_state(value) == value.strip()
    assert n.is_unavailable(value) or value.strip() == "[Error 999]"  # what gpu_facts reads is unchanged


@pytest.mark.parametrize("state", STATES)
def test_a_broken_gpus_cells_are_error_states_not_n_a(state):
    text = replace_cells(cap("query_health.out"), ecc__errors__uncorrected__volatile__total=state,
                         pcie__link__width__current=state, clocks_event_reasons__hw_slowdown=state,
                         temperature__gpu=state, power__draw=state)
    (gpu,) = n.parse_health_query(text)
    assert gpu["error_states"] == {
        "ecc.errors.uncorrected.volatile.total": state, "pcie.link.width.current": state,
        "clocks_event_reasons.hw_slowdown": state, "temperature.gpu": state, "power.draw": state}
    assert gpu["ecc_uncorrected_volatile"] is None and gpu["pcie_width_current"] is None
    assert gpu["hw_slowdown"] is None and gpu["power_draw_w"] is None
    assert gpu["retired_pages_pending"] is None and "retired_pages.pending" not in gpu["error_states"]  # [N/A]
    assert gpu["ecc_corrected_volatile"] == 0 and gpu["pcie_width_max"] == 16


def test_a_lost_gpus_uuid_and_bus_id_may_be_unreadable_its_index_not():
    text = replace_cells(cap("query_health.out"), uuid="[GPU is lost]", pci__bus_id="[GPU is lost]")
    (gpu,) = n.parse_health_query(text)
    assert (gpu["index"], gpu["uuid"], gpu["pci_bus_id"]) == (0, None, None)
    assert gpu["error_states"] == {"uuid": "[GPU is lost]", "pci.bus_id": "[GPU is lost]"}
    with pytest.raises(n.NvidiaSmiParseError, match=r"index is \[GPU is lost\]"):
        n.parse_health_query(replace_cells(cap("query_health.out"), index="[GPU is lost]"))
    with pytest.raises(n.NvidiaSmiParseError, match=r"uuid is \[N/A\]"):
        n.parse_health_query(replace_cells(cap("query_health.out"), uuid="[N/A]"))


def test_remapped_rows_in_an_error_state():
    text = cap("remapped_rows.out").replace("0, 0, No, No", "[GPU requires reset], [GPU requires reset], "
                                            "[GPU requires reset], [GPU requires reset]")
    (row,) = n.parse_remapped_rows(text)
    assert (row["pending"], row["failure"], row["correctable"]) == (None, None, None)
    assert row["error_states"] == dict(("remapped_rows." + k, "[GPU requires reset]")
                                       for k in ("correctable", "uncorrectable", "pending", "failure"))


def test_the_facts_parser_still_reads_every_bracket_as_n_a():
    # gpu_facts / gpu_footprint / vllm-gpu-idle keep their behaviour (no error_states there)
    text = ("index, uuid, pci.bus_id, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n"
            "0, GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad, 00000000:00:06.0, 143771 MiB, [GPU requires reset], "
            "[Unknown Error]\n")
    (gpu,) = n.parse_gpu_query(text, fields=("index", "uuid", "pci.bus_id", "memory.total", "memory.used",
                                             "memory.free"))
    assert gpu == {"index": 0, "uuid": "GPU-ed3c5504-4725-ca05-65a6-3231da0a09ad", "pci_bus_id": "00000000:00:06.0",
                   "memory_total_mib": 143771, "memory_used_mib": None, "memory_free_mib": None}


class OldDriver(object):
    """A driver answering --query-gpu from the real capture: ``knows`` is the set of clock-event names it
    takes (the others get the real exit-2 answer for the first unknown field); the header carries the
    names asked, the cells are the capture's."""

    def __init__(self, knows, text=None):
        self.knows = knows
        self.text = text or cap("query_health.out")
        self.calls = []
        self.path = "/usr/bin/nvidia-smi"

    def run(self, args, check=True):
        self.calls.append(list(args))
        asked = args[0].split("=", 1)[1].split(",")
        for field in asked:
            if field.startswith("clocks_") and field not in self.knows:
                answer = cap("device_query_bad_field.out").replace("clocks_event_reasons.nope", field)
                raise n.error_from_output([self.path] + list(args), 2, answer, "")
        head, row = self.text.splitlines()[:2]
        names = [c.strip() for c in head.split(",")]
        cells = [c.strip() for c in row.split(",")]
        by_field = dict((name.split(" [")[0].replace("clocks_throttle_reasons.", "clocks_event_reasons."), (name, cell))
                        for name, cell in zip(names, cells))
        picked = [by_field[f.replace("clocks_throttle_reasons.", "clocks_event_reasons.")] for f in asked]
        picked = [(f + name[len(name.split(" [")[0]):], cell) for f, (name, cell) in zip(asked, picked)]
        return 0, ", ".join(p[0] for p in picked) + "\n" + ", ".join(p[1] for p in picked) + "\n", ""


OLD_NAMES = set(n.LEGACY_HEALTH_FIELDS.values())


def test_a_pre_r535_driver_is_asked_once_more_with_the_old_names():
    smi = OldDriver(OLD_NAMES, pre_r535(replace_cells(cap("query_health.out"),
                                                      clocks_event_reasons__sw_thermal_slowdown="[Unknown Error]")))
    (gpu,), dropped = n.query_health(smi)
    assert len(smi.calls) == 2 and dropped == []
    assert smi.calls[0][0] == "--query-gpu=" + ",".join(n.HEALTH_FIELDS)
    assert smi.calls[1][0] == "--query-gpu=" + ",".join(n.LEGACY_HEALTH_FIELDS.get(f, f) for f in n.HEALTH_FIELDS)
    assert gpu["clock_event_fields"] == "clocks_throttle_reasons" and gpu["clocks_event_reasons"] == 1
    assert gpu["error_states"] == {"clocks_throttle_reasons.sw_thermal_slowdown": "[Unknown Error]"}
    assert n.HEALTH_FIELD_KEYS["clocks_throttle_reasons.sw_thermal_slowdown"] == "sw_thermal_slowdown"


def test_a_current_driver_is_asked_once_with_the_current_names():
    smi = OldDriver(set(CLOCK_FIELDS))
    (gpu,), dropped = n.query_health(smi)
    assert len(smi.calls) == 1 and dropped == [] and gpu["clock_event_fields"] == "clocks_event_reasons"


def test_a_driver_without_either_name_drops_the_clock_fields():
    smi = OldDriver(set())
    (gpu,), dropped = n.query_health(smi)
    assert dropped == sorted(OLD_NAMES, key=list(n.LEGACY_HEALTH_FIELDS.values()).index)
    assert len(smi.calls) == 2 + len(CLOCK_FIELDS) and "clocks_" not in smi.calls[-1][0]
    assert gpu["clock_event_fields"] is None and gpu["clocks_event_reasons"] is None and gpu["hw_slowdown"] is None


def test_gpusim_before_r535_knows_only_the_old_names():
    event = ["--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv"]
    old = ["--query-gpu=" + ",".join(n.LEGACY_HEALTH_FIELDS.get(f, f) for f in n.HEALTH_FIELDS), "--format=csv"]
    rc, out = sim("fault-a100-r525-thermal", *event)
    assert (rc, out) == (2, 'Field "clocks_event_reasons.active" is not a valid field to query.\n\n')
    assert n.error_from_output(["nvidia-smi"] + event, rc, out, "").field == "clocks_event_reasons.active"
    rc, out = sim("fault-a100-r525-thermal", *old)
    assert rc == 0 and out.splitlines()[0] == pre_r535(cap("query_health.out")).splitlines()[0]
    (gpu,) = n.parse_health_query(out)
    assert gpu["driver_version"] == "525.147.05" and gpu["hw_thermal_slowdown"] is True
    # from R535 on the old names are aliases and the default profiles answer as before
    rc, out = sim("h200-1gpu", *old)
    assert rc == 0 and out == sim("h200-1gpu", *event)[1]


def test_gpusim_reset_required_reads_as_error_states():
    _rc, out = sim("fault-h200-reset-required", "--query-gpu=" + ",".join(n.HEALTH_FIELDS), "--format=csv")
    (gpu,) = n.parse_health_query(out)
    assert gpu["uuid"] == "GPU-84ea54cb-4767-0e6a-8104-87422151c222"
    assert set(gpu["error_states"].values()) == {"[GPU requires reset]"}
    assert "ecc.errors.uncorrected.volatile.total" in gpu["error_states"] and "index" not in gpu["error_states"]
    _rc, out = sim("fault-h200-reset-required", *n.QUERY_REMAPPED_ROWS_ARGS)
    assert len(n.parse_remapped_rows(out)[0]["error_states"]) == 4


BRACKET_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="[],"),
                       min_size=1, max_size=40).filter(lambda t: t.strip() == t and t.strip())
CELL_FIELDS = [f for f in n.HEALTH_FIELDS if f != "index"]


@settings(max_examples=80, deadline=None)
@given(text=BRACKET_TEXT, fields=st.lists(st.sampled_from(CELL_FIELDS), min_size=1, max_size=6, unique=True))
def test_any_other_bracket_in_any_cell_is_an_error_state(text, fields):
    cell = "[%s]" % text
    parsed = n.parse_health_query(replace_cells(cap("query_health.out"),
                                                **dict((f.replace(".", "__"), cell) for f in fields)))[0]
    if cell in n.NO_VALUE_SPELLINGS:
        assert parsed["error_states"] == {}
    else:
        assert parsed["error_states"] == dict((f, cell) for f in CELL_FIELDS if f in fields)
        for f in fields:
            assert parsed[n.HEALTH_FIELD_KEYS[f]] is None
