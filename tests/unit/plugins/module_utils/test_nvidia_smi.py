"""module_utils/nvidia_smi: parser cases (tests/unit/data/nvidia_smi_parse_cases.yml), error
classification, sysfs/proc readers, the runner, and hypothesis round-trip / garbage properties."""
import os
import re

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi as n

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "nvidia-smi")
with open(os.path.join(ROOT, "tests", "unit", "data", "nvidia_smi_parse_cases.yml")) as _handle:
    CASES = yaml.safe_load(_handle)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fixture(rel):
    with open(os.path.join(FIXTURES, rel)) as handle:
        return handle.read()


def expand_cpus(text):
    out = []
    for part in text.split(","):
        lo, _sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _parse(case):
    text = fixture(case["input"]["file"]) if "file" in case["input"] else case["input"]["text"]
    kind = case["parser"]
    if kind == "gpu_query":
        return n.parse_gpu_query(text, fields=tuple(case["fields"])) if "fields" in case else n.parse_gpu_query(text)
    if kind == "compute_apps":
        return n.parse_compute_apps(text, fields=tuple(case["fields"])) if "fields" in case else n.parse_compute_apps(text)
    if kind == "topo":
        return n.parse_topo(text)
    if kind == "version":
        return n.parse_version(text)
    if kind == "cpulist":
        return n.parse_cpulist(text)
    if kind == "bus_id":
        return n.normalize_bus_id(text)
    if kind == "cgroup":
        return n.unit_from_cgroup(text)
    raise AssertionError(kind)


def _check_topo(expect, result):
    for index, sub in expect.get("gpus", {}).items():
        got = result["gpus"][int(index)]
        for key, value in sub.items():
            if key == "cpu_affinity" and value is not None:
                value = expand_cpus(value)
            if key in ("links",):
                value = dict((int(k), v) for k, v in value.items())
            assert got[key] == value, (index, key, got[key], value)
    if "legend_keys" in expect:
        assert list(result["legend"]) == expect["legend_keys"]
    if "nics" in expect:
        assert result["nics"] == expect["nics"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_parse_case(case):
    if "error" in case:
        with pytest.raises(n.NvidiaSmiParseError) as info:
            _parse(case)
        for part in case["error"]:
            assert part in str(info.value), (part, str(info.value))
        return
    result = _parse(case)
    if case["parser"] == "topo":
        _check_topo(case["expect"], result)
    else:
        assert result == case["expect"]


# --------------------------------------------------------------------------------------------
# Error classification (real and built outputs)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rel, rc, kind, parts", [
    ("errors/nvml_mismatch.out", 18, n.NvidiaSmiError, ["Driver/library version mismatch", "reboot"]),
    ("errors/no_devices.out", 6, n.NvidiaSmiError, ["found no NVIDIA GPU", "exit 6"]),
    ("h200-1gpu/smi_badid.out", 6, n.NvidiaSmiError, ["No devices were found"]),
    ("errors/driver_not_loaded.out", 9, n.NvidiaSmiError, ["could not talk to the NVIDIA driver"]),
    ("h200-1gpu/smi_bad.out", 2, n.NvidiaSmiUnknownFieldError, ["'bogus.field'", "exit 2"]),
    ("errors/no_reserved_field.out", 2, n.NvidiaSmiUnknownFieldError, ["'memory.reserved'"]),
    ("h200-1gpu-b/q_bad3.out", 2, n.NvidiaSmiUnknownFieldError, ["'bogus.a'"]),
    ("h200-1gpu-b/apps_bad.out", 2, n.NvidiaSmiUnknownFieldError, ["'bogus'"]),
    ("h200-1gpu-b/i_uuid_nogpu.out", 6, n.NvidiaSmiError, ["No devices were found"]),
    ("h200-1gpu-b/bad_opt.out", 255, n.NvidiaSmiError, ["failed with exit code 255: ERROR: Option --bogus is not recognized"]),
])
def test_error_from_output(rel, rc, kind, parts):
    error = n.error_from_output(["nvidia-smi", "--query-gpu=index"], rc, fixture(rel), "")
    assert isinstance(error, kind)
    assert isinstance(error, n.NvidiaSmiUnknownFieldError) is (kind is n.NvidiaSmiUnknownFieldError)
    for part in parts:
        assert part in str(error)
    if kind is n.NvidiaSmiUnknownFieldError:
        assert error.field in fixture(rel)


def test_error_from_output_on_stderr_and_unknown():
    error = n.error_from_output(["nvidia-smi", "topo", "-m"], 255, "", "Failed to initialize NVML: Unknown Error\n")
    assert "could not initialize NVML (exit 255): Failed to initialize NVML: Unknown Error" in str(error)
    error = n.error_from_output(["nvidia-smi", "topo", "-m"], 3, "", "")
    assert str(error) == "`nvidia-smi topo -m` failed with exit code 3: (no output)"


# --------------------------------------------------------------------------------------------
# sysfs / procfs (roots injected)
# --------------------------------------------------------------------------------------------

def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("content, node", [("1\n", 1), ("0\n", 0), ("-1\n", None), ("garbage\n", None), (None, None)])
def test_sysfs_numa_node(tmp_path, content, node):
    if content is not None:
        _write(tmp_path / "bus/pci/devices/0000:b8:00.0/numa_node", content)
    assert n.sysfs_numa_node("00000000:B8:00.0", str(tmp_path)) == node


@pytest.mark.parametrize("content, cpus", [("0-3,8\n", [0, 1, 2, 3, 8]), ("\n", []), ("zz\n", []), (None, [])])
def test_sysfs_local_cpulist(tmp_path, content, cpus):
    if content is not None:
        _write(tmp_path / "bus/pci/devices/0000:18:00.0/local_cpulist", content)
    assert n.sysfs_local_cpulist("00000000:18:00.0", str(tmp_path)) == cpus


def test_pid_unit(tmp_path):
    _write(tmp_path / "4242/cgroup", "0::/system.slice/vllm-chat.service\n")
    assert n.pid_unit(4242, str(tmp_path)) == "vllm-chat.service"
    assert n.pid_unit(4243, str(tmp_path)) is None


def test_module_level_roots_are_the_defaults(tmp_path, monkeypatch):
    _write(tmp_path / "bus/pci/devices/0000:18:00.0/numa_node", "1\n")
    monkeypatch.setattr(n, "SYSFS_ROOT", str(tmp_path))
    assert n.sysfs_numa_node("00000000:18:00.0") == 1


# --------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------

class FakeModule(object):
    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def run_command(self, cmd, environ_update=None):
        self.calls.append((cmd, environ_update))
        return self.answers.pop(0)

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return None


def test_runner_retries_without_an_optional_field():
    module = FakeModule([(2, fixture("errors/no_reserved_field.out"), ""),
                         (0, fixture("mixed-4x/query_no_reserved.out"), "")])
    smi = n.NvidiaSmi(module, "nvidia-smi")
    gpus = smi.query_gpus()
    assert [g["memory_reserved_mib"] for g in gpus] == [None] * 4
    assert "memory.reserved" not in module.calls[1][0][1]
    assert all(env == {"LC_ALL": "C", "LANG": "C", "LC_MESSAGES": "C"} for _cmd, env in module.calls)
    assert [c["rc"] for c in smi.calls] == [2, 0]


def test_runner_nvml_text_with_exit_zero_still_fails():
    module = FakeModule([(0, "Failed to initialize NVML: Driver/library version mismatch\n", "")])
    with pytest.raises(n.NvidiaSmiError, match="reboot"):
        n.NvidiaSmi(module, "nvidia-smi").query_gpus()


def test_find_nvidia_smi_missing():
    with pytest.raises(n.NvidiaSmiError, match="nvidia-smi not found on PATH"):
        n.find_nvidia_smi(FakeModule([]))


# --------------------------------------------------------------------------------------------
# Hypothesis: round trips
# --------------------------------------------------------------------------------------------

NA = st.sampled_from(["[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"])
MIB = st.integers(min_value=0, max_value=2 ** 21)
NAME = st.from_regex(r"\A[A-Za-z][A-Za-z0-9 ()-]{0,30}[A-Za-z0-9)]\Z").filter(lambda s: "N/A" not in s)
PROCESS = st.from_regex(r"\A[A-Za-z/:._@-][A-Za-z0-9/:._@ -]{0,30}[A-Za-z0-9_]\Z")


@st.composite
def bus_ids(draw):
    return "%08X:%02X:%02X.%d" % (draw(st.integers(0, 0xFFFF)), draw(st.integers(0, 255)),
                                  draw(st.integers(0, 31)), draw(st.integers(0, 7)))


@st.composite
def gpu_uuids(draw):
    return "GPU-" + str(draw(st.uuids()))


@st.composite
def gpu_rows(draw):
    count = draw(st.integers(1, 8))
    uuids = draw(st.lists(gpu_uuids(), min_size=count, max_size=count, unique=True))
    buses = draw(st.lists(bus_ids(), min_size=count, max_size=count, unique=True))
    rows = []
    for i in range(count):
        rows.append({
            "index": i, "uuid": uuids[i], "name": draw(NAME), "pci_bus_id": buses[i],
            "memory_total_mib": draw(MIB), "memory_used_mib": draw(MIB), "memory_free_mib": draw(MIB),
            "memory_reserved_mib": draw(st.none() | MIB),
            "mig_mode": draw(st.sampled_from([None, "Enabled", "Disabled"])),
            "compute_mode": draw(st.sampled_from([None, "Default", "Exclusive_Process", "Prohibited"])),
            "driver_version": draw(st.sampled_from(["580.159.04", "535.161.08", "470.57.02"])),
        })
    return rows


KEYS = dict((field, n._GPU_SPECS[field][0]) for field in n.GPU_FIELDS)


def render_gpus(rows, header, units, na_words):
    lines = []
    mib_fields = ("memory.total", "memory.used", "memory.free", "memory.reserved")
    if header:
        lines.append(", ".join(f + " [MiB]" if f in mib_fields else f for f in n.GPU_FIELDS))
    for r, na in zip(rows, na_words):
        cells = []
        for field in n.GPU_FIELDS:
            value = r[KEYS[field]]
            if value is None:
                cells.append(na)
            elif field in mib_fields:
                cells.append("%d MiB" % value if units else str(value))
            else:
                cells.append(str(value))
        lines.append(", ".join(cells))
    return "\n".join(lines) + "\n"


@SETTINGS
@given(rows=gpu_rows(), header=st.booleans(), units=st.booleans(), data=st.data())
def test_gpu_query_round_trip(rows, header, units, data):
    na_words = data.draw(st.lists(NA, min_size=len(rows), max_size=len(rows)))
    text = render_gpus(rows, header, units, na_words)
    assert n.parse_gpu_query(text) == rows


@st.composite
def app_rows(draw):
    count = draw(st.integers(0, 6))
    pids = draw(st.lists(st.integers(1, 4194304), min_size=count, max_size=count, unique=True))
    return [{"pid": pid, "process_name": draw(PROCESS | st.just("/opt/a, b/python3")), "gpu_uuid": draw(gpu_uuids()),
             "gpu_bus_id": draw(bus_ids()), "used_mib": draw(st.none() | MIB)} for pid in pids]


@SETTINGS
@given(rows=app_rows(), header=st.booleans(), units=st.booleans(), na=NA)
def test_compute_apps_round_trip(rows, header, units, na):
    lines = ["pid, process_name, gpu_uuid, gpu_bus_id, used_gpu_memory [MiB]"] if header else []
    for r in rows:
        used = na if r["used_mib"] is None else ("%d MiB" % r["used_mib"] if units else str(r["used_mib"]))
        lines.append("%d, %s, %s, %s, %s" % (r["pid"], r["process_name"], r["gpu_uuid"], r["gpu_bus_id"], used))
    assert n.parse_compute_apps("\n".join(lines) + "\n") == rows


def render_cpulist(cpus, split):
    """Compact ranges, optionally split into more pieces than needed."""
    if not cpus:
        return "N/A"
    parts, start, prev = [], cpus[0], cpus[0]
    for cpu in cpus[1:] + [None]:
        if cpu is not None and cpu == prev + 1 and not (split and cpu % 3 == 0):
            prev = cpu
            continue
        parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


@SETTINGS
@given(cpus=st.sets(st.integers(0, 511), min_size=1, max_size=64), split=st.booleans())
def test_cpulist_round_trip(cpus, split):
    cpus = sorted(cpus)
    assert n.parse_cpulist(render_cpulist(cpus, split)) == cpus


LINKS = st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS", "NV1", "NV4", "NV12", "NV18"])


@st.composite
def topologies(draw):
    count = draw(st.integers(1, 8))
    nics = draw(st.integers(0, 3))
    links = {}
    for i in range(count):
        for j in range(i + 1, count):
            links[(i, j)] = links[(j, i)] = draw(LINKS)
    nic_links = dict(((i, k), draw(st.sampled_from(["PIX", "PXB", "PHB", "NODE", "SYS"])))
                     for i in range(count) for k in range(nics))
    gpus = {}
    for i in range(count):
        cpus = draw(st.none() | st.sets(st.integers(0, 255), min_size=1, max_size=40).map(sorted))
        gpus[i] = {
            "links": dict((j, links[(i, j)]) for j in range(count) if j != i),
            "nics": dict(("NIC%d" % k, nic_links[(i, k)]) for k in range(nics)),
            "cpu_affinity": cpus,
            "numa_node": draw(st.none() | st.integers(0, 7)),
            "gpu_numa_id": draw(st.none() | st.integers(0, 15)),
        }
    return gpus, nics, draw(st.booleans()), draw(st.booleans()), draw(st.booleans())


def render_topo(gpus, nics, with_gpu_numa_id, legend, pad):
    devs = ["GPU%d" % i for i in gpus] + ["NIC%d" % k for k in range(nics)]
    cols = ["CPU Affinity", "NUMA Affinity"] + (["GPU NUMA ID"] if with_gpu_numa_id else [])
    lines = ["\t\x1b[4m" + "\t".join(devs + cols) + "\x1b[0m"]
    for i, g in gpus.items():
        cells = [" X " if j == i else g["links"][j] for j in gpus] + [g["nics"]["NIC%d" % k] for k in range(nics)]
        vals = [render_cpulist(g["cpu_affinity"] or [], False),
                "N/A" if g["numa_node"] is None else str(g["numa_node"])]
        row = "GPU%d\t" % i + "\t".join(cells) + "\t" + "\t".join(vals)
        if with_gpu_numa_id:
            row += ("\t\t" if pad else "\t") + ("N/A" if g["gpu_numa_id"] is None else str(g["gpu_numa_id"]))
        lines.append(row)
    for k in range(nics):
        cells = [gpus[i]["nics"]["NIC%d" % k] for i in gpus] + [" X " if kk == k else "SYS" for kk in range(nics)]
        lines.append("NIC%d\t" % k + "\t".join(cells))
    if legend:
        lines += ["", "Legend:", "", "  X    = Self", "  NV#  = Connection traversing a bonded set of # NVLinks"]
        if nics:
            lines += ["", "NIC Legend:", ""] + ["  NIC%d: mlx5_%d" % (k, k) for k in range(nics)]
    return "\n".join(lines) + "\n"


@SETTINGS
@given(topo=topologies())
def test_topo_round_trip(topo):
    gpus, nics, with_gpu_numa_id, legend, pad = topo
    parsed = n.parse_topo(render_topo(gpus, nics, with_gpu_numa_id, legend, pad))
    expected = {}
    for i, g in gpus.items():
        expected[i] = dict(g, gpu_numa_id=g["gpu_numa_id"] if with_gpu_numa_id else None)
    assert parsed["gpus"] == expected
    if legend and nics:
        assert parsed["nics"] == dict(("NIC%d" % k, "mlx5_%d" % k) for k in range(nics))


# --------------------------------------------------------------------------------------------
# Hypothesis: garbage never becomes a number
# --------------------------------------------------------------------------------------------

PARSERS = [
    n.parse_gpu_query,
    lambda t: n.parse_gpu_query(t, fields=("index", "memory.used", "memory.total")),
    n.parse_compute_apps,
    n.parse_topo,
    n.parse_version,
    n.parse_cpulist,
]


def _numbers(value):
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _numbers(k) + _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


@SETTINGS
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300)
       | st.lists(st.sampled_from(["0", "1", ", ", "MiB", " ", "\n", "\t", "X", "GPU0", "N/A", "[N/A]", "-", "SYS",
                                   "GPU-84ea54cb-4767-0e6a-8104-87422151c222", "00000000:18:00.0", "index", "CPU Affinity"]),
                  max_size=40).map("".join))
@example(text="index, memory.used [MiB]\n0, 5 MiB\n")
def test_garbage_raises_parse_error_or_yields_only_numbers_in_the_text(text):
    for parse in PARSERS:
        try:
            result = parse(text)
        except n.NvidiaSmiParseError:
            continue
        present = set(int(x) for x in re.findall(r"[0-9]+", text))
        for number in _numbers(result):
            # cpu lists expand ranges: every CPU id lies within a range written in the text
            if parse is n.parse_cpulist:
                assert min(present) <= number <= max(present)
            else:
                assert number in present, (number, text, result)


GARBAGE_CELL = st.sampled_from(["12a", "MiB", "0x10", "1e3", "12.5", "-1", "one", "", "12 GiB", "1,5"])


@SETTINGS
@given(rows=gpu_rows(), header=st.booleans(), units=st.booleans(), data=st.data())
def test_corrupted_number_in_gpu_query_raises(rows, header, units, data):
    text = render_gpus(rows, header, units, ["[N/A]"] * len(rows))
    lines = text.splitlines()
    row = data.draw(st.integers(1 if header else 0, len(lines) - 1))
    col = data.draw(st.sampled_from([0, 4, 5, 6]))   # index, memory.total/used/free
    cells = lines[row].split(", ")
    cells[col] = data.draw(GARBAGE_CELL)
    lines[row] = ", ".join(cells)
    with pytest.raises(n.NvidiaSmiParseError):
        n.parse_gpu_query("\n".join(lines) + "\n")


@SETTINGS
@given(rows=app_rows().filter(bool), data=st.data())
def test_corrupted_number_in_compute_apps_raises(rows, data):
    lines = ["pid, process_name, gpu_uuid, gpu_bus_id, used_gpu_memory [MiB]"]
    for r in rows:
        lines.append("%d, python3, %s, %s, %s MiB" % (r["pid"], r["gpu_uuid"], r["gpu_bus_id"], r["used_mib"] or 0))
    row = data.draw(st.integers(1, len(lines) - 1))
    cells = lines[row].split(", ")
    col = data.draw(st.sampled_from([0, 4]))
    cells[col] = data.draw(GARBAGE_CELL.filter(lambda c: c not in ("MiB", "1,5", "")))
    lines[row] = ", ".join(cells)
    with pytest.raises(n.NvidiaSmiParseError):
        n.parse_compute_apps("\n".join(lines) + "\n")


@SETTINGS
@given(topo=topologies(), data=st.data())
def test_corrupted_topo_raises(topo, data):
    gpus, nics, with_gpu_numa_id, legend, pad = topo
    lines = render_topo(gpus, nics, with_gpu_numa_id, legend, pad).splitlines()
    row = data.draw(st.integers(1, len(gpus)))
    cells = lines[row].split("\t")
    col = data.draw(st.integers(1, len(gpus) + nics))
    cells[col] = data.draw(st.sampled_from(["nv18", "?", "12", "X X", "Sys", "-"]))
    lines[row] = "\t".join(cells)
    with pytest.raises(n.NvidiaSmiParseError):
        n.parse_topo("\n".join(lines) + "\n")
