# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""Run and parse ``nvidia-smi``: the one place in the collection that does.

Two layers:

* pure parse functions (``parse_gpu_query``, ``parse_compute_apps``, ``parse_topo``,
  ``parse_version``, ``parse_cpulist``, ``unit_from_cgroup``) take text and return data, or raise
  :class:`NvidiaSmiParseError`; they never guess a number from text they do not understand;
* :class:`NvidiaSmi`, a runner around ``module.run_command`` (always ``LC_ALL=C``) that turns
  failed calls into :class:`NvidiaSmiError` with a message an operator can act on.

Calls made (see ``NvidiaSmi``): ``gather_facts`` asks ``nvidia-smi`` 4 times (one
``--query-gpu`` for every GPU field incl. the driver version, one ``--query-compute-apps``,
one ``topo -m``, one ``--version`` for the CUDA version); a driver without ``--version`` costs one
more call (the plain ``nvidia-smi`` table header), and a driver that lacks an optional query
field one more (the query is retried without it). The footprint check needs 2 calls per reading.
"""

from __future__ import annotations

import os
import re
import time

SYSFS_ROOT = "/sys"
PROC_ROOT = "/proc"

# nvidia-smi's messages and number formats are only stable in the C locale.
NVIDIA_SMI_ENV = {"LC_ALL": "C", "LANG": "C", "LC_MESSAGES": "C"}

# Directories searched besides PATH (container toolkit and WSL layouts).
NVIDIA_SMI_DIRS = ["/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/lib/wsl/lib"]

# Footprint defaults, defined once: the gpu_footprint module, the planner (plugin_utils) and the
# units' start check (vllm-gpu-idle) all read these.
# The steady-state footprint of a vLLM is gpu_memory_utilization x total "within about a GiB"
# (CUDA graphs, NCCL buffers); a torch process holding 20 GiB showed 619 MiB on top (context).
FOOTPRINT_TOLERANCE_MIB = 1024
# Idle GPUs show 0-3 MiB (real H200 / RTX PRO 6000); one CUDA context is ~600 MiB (H200).
IDLE_MAX_MIB = 256
# The memory base vLLM's --gpu-memory-utilization applies to: what CUDA sees as the GPU's total,
# memory.total minus memory.reserved (driver and firmware).
MEMORY_BASE = "total_minus_reserved"
MEMORY_BASES = ("total_minus_reserved", "total")


def usable_mib(gpu, base=MEMORY_BASE):
    """The GPU's total memory on ``base`` (MiB), from a gpu_facts entry; None when unknown."""
    total = gpu.get("memory_total_mib")
    if total is None:
        return None
    reserved = gpu.get("memory_reserved_mib")
    if base == "total_minus_reserved" and reserved is not None:
        return total - reserved
    return total


GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "mig.mode.current",
    "compute_mode",
    "driver_version",
)
# Fields the query may be retried without when an older driver does not know them.
OPTIONAL_GPU_FIELDS = ("name", "memory.reserved", "mig.mode.current", "compute_mode", "driver_version")
REQUIRED_GPU_FIELDS = ("index", "uuid", "pci.bus_id", "memory.total", "memory.used", "memory.free")
# Columns that must hold a value; memory may read [N/A] / [Not Supported] (unified-memory boards).
_IDENTITY_FIELDS = ("index", "uuid", "pci.bus_id", "pid", "gpu_uuid", "gpu_bus_id")

APP_FIELDS = ("pid", "process_name", "gpu_uuid", "gpu_bus_id", "used_memory")

QUERY_GPU_ARGS = ("--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv")
QUERY_APPS_ARGS = ("--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv")
TOPO_ARGS = ("topo", "-m")
VERSION_ARGS = ("--version",)
PLAIN_ARGS = ()


class NvidiaSmiError(Exception):
    """nvidia-smi could not be run or reported a failure; the message is for the operator."""


class NvidiaSmiParseError(NvidiaSmiError):
    """Output that does not have the expected shape (never guessed around)."""


class NvidiaSmiUnknownFieldError(NvidiaSmiError):
    """The driver does not know a ``--query-*`` field (nvidia-smi exit code 2)."""

    def __init__(self, message, field):
        super(NvidiaSmiUnknownFieldError, self).__init__(message)
        self.field = field


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------

_UNAVAILABLE = re.compile(r"^\[[A-Za-z][A-Za-z /_-]*\]$")
_INT = re.compile(r"^[0-9]+$")
_MIB = re.compile(r"^([0-9]+)(?: ?MiB)?$")
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
_MIG_UUID = re.compile(
    r"^MIG-(?:GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}/[0-9]+/[0-9]+"
    r"|[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})$"
)
_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")
_VERSION = re.compile(r"^[0-9]+(?:\.[0-9]+)+$")
_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9_. -]*$")
_CPULIST = re.compile(r"^[0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*$")


def is_unavailable(value):
    """True for nvidia-smi's "no value" spellings: ``N/A``, ``[N/A]``, ``[Not Supported]``, ..."""
    value = value.strip()
    return value == "N/A" or bool(_UNAVAILABLE.match(value))


# The bracketed cells that only mean "this GPU or driver has no such value" (the field does not apply).
NO_VALUE_SPELLINGS = ("N/A", "[N/A]", "[Not Supported]", "[Requested functionality has been deprecated]")
_BRACKETED = re.compile(r"^\[[^\[\],]+\]$")


def error_state(value):
    """The error state nvidia-smi printed in place of a reading (``[GPU requires reset]``), or None.

    Every bracketed cell other than the no-value spellings (``NO_VALUE_SPELLINGS``) is an NVML error
    for that GPU: ``[GPU requires reset]``, ``[GPU is lost]``, ``[Unknown Error]``, ``[Insufficient
    Permissions]``, and any other a driver prints (a bracket not known to be harmless counts as an
    error: no bad reading is taken for good news). The cell is returned as printed, brackets included.
    Only the health parsers use this; ``is_unavailable`` (which reads every bracket as N/A) is unchanged.
    """
    if not isinstance(value, str):
        return None
    value = value.strip()
    if value in NO_VALUE_SPELLINGS or not _BRACKETED.match(value):
        return None
    return value


def normalize_bus_id(bus_id):
    """nvidia-smi's ``00000000:18:00.0`` -> sysfs's ``0000:18:00.0`` (lower case, 4-digit domain)."""
    m = _BUS_ID.match(bus_id.strip()) if isinstance(bus_id, str) else None
    if not m:
        raise NvidiaSmiParseError("not a PCI bus id: %r" % (bus_id,))
    domain, bus, dev, fn = m.groups()
    return "%04x:%s:%s.%s" % (int(domain, 16), bus.lower(), dev.lower(), fn)


def parse_cpulist(text):
    """``0-31,64-95`` -> sorted CPU ids; ``N/A`` -> None; anything else raises."""
    text = text.strip()
    if is_unavailable(text):
        return None
    if not _CPULIST.match(text):
        raise NvidiaSmiParseError("not a CPU list: %r" % (text,))
    cpus = set()
    for part in text.split(","):
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            if lo > hi:
                raise NvidiaSmiParseError("CPU range runs backwards: %r" % (part,))
            cpus.update(range(lo, hi + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def _conv_int(value):
    if not _INT.match(value):
        raise ValueError("not a whole number")
    return int(value)


def _conv_mib(value):
    m = _MIB.match(value)
    if not m:
        raise ValueError("not a MiB amount")
    return int(m.group(1))


def _conv_gpu_uuid(value):
    if not _GPU_UUID.match(value) and not _MIG_UUID.match(value):
        raise ValueError("not a GPU UUID")
    return value


def _conv_bus_id(value):
    if not _BUS_ID.match(value):
        raise ValueError("not a PCI bus id")
    return value


def _conv_mode(value):
    if value not in ("Enabled", "Disabled"):
        raise ValueError("not Enabled/Disabled")
    return value


def _conv_word(value):
    if not _WORD.match(value):
        raise ValueError("not a mode name")
    return value


def _conv_version(value):
    if not _VERSION.match(value):
        raise ValueError("not a version")
    return value


def _conv_text(value):
    if not value:
        raise ValueError("empty")
    return value


# field -> (result key, converter, header names nvidia-smi may print, free text)
_GPU_SPECS = {
    "index": ("index", _conv_int, ("index",)),
    "uuid": ("uuid", _conv_gpu_uuid, ("uuid", "gpu_uuid")),
    "name": ("name", _conv_text, ("name", "gpu_name")),
    "pci.bus_id": ("pci_bus_id", _conv_bus_id, ("pci.bus_id", "gpu_bus_id")),
    "memory.total": ("memory_total_mib", _conv_mib, ("memory.total",)),
    "memory.used": ("memory_used_mib", _conv_mib, ("memory.used",)),
    "memory.free": ("memory_free_mib", _conv_mib, ("memory.free",)),
    "memory.reserved": ("memory_reserved_mib", _conv_mib, ("memory.reserved",)),
    "mig.mode.current": ("mig_mode", _conv_mode, ("mig.mode.current",)),
    "compute_mode": ("compute_mode", _conv_word, ("compute_mode",)),
    "driver_version": ("driver_version", _conv_version, ("driver_version",)),
}
_APP_SPECS = {
    "pid": ("pid", _conv_int, ("pid",)),
    "process_name": ("process_name", None, ("process_name", "name")),
    "gpu_uuid": ("gpu_uuid", _conv_gpu_uuid, ("gpu_uuid", "uuid")),
    "gpu_bus_id": ("gpu_bus_id", _conv_bus_id, ("gpu_bus_id", "pci.bus_id")),
    "used_memory": ("used_mib", _conv_mib, ("used_memory", "used_gpu_memory")),
}
_MIB_FIELDS = ("memory.total", "memory.used", "memory.free", "memory.reserved", "used_memory")

_HEADER_CELL = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)(?: \[([^\]]*)\])?$")


def _header_of(cells, specs):
    """Map a header row to ``{field: (column, unit)}``; None if the row is not a header."""
    parsed = []
    for cell in cells:
        m = _HEADER_CELL.match(cell)
        if not m:
            return None
        parsed.append((m.group(1), m.group(2)))
    known = {}
    for field, spec in specs.items():
        for col, (name, unit) in enumerate(parsed):
            if name in spec[2]:
                known[field] = (col, unit)
                break
    if not known:
        return None
    return known


def _parse_csv(text, fields, specs, required, what, free_text=None, error_states=False):
    """Parse ``--format=csv`` output with or without header and units into dicts.

    With a header, columns are found by name (so extra columns are ignored and order does not
    matter); without one, ``fields`` gives the columns in order. Every requested field that is
    missing raises unless it is optional (then it is None). ``free_text`` names the one column that
    may itself contain ", " (a process name); extra cells are folded back into it.
    ``error_states``: each row gets ``error_states`` ``{field: "[GPU requires reset]"}`` for the cells
    in an error state (see ``error_state``; their value is None); identity columns other than
    ``index``/``pid`` may then be in one too. Without it every bracketed cell reads as N/A (None).
    """
    for field in fields:
        if field not in specs:
            raise NvidiaSmiParseError("unknown %s field %r" % (what, field))
    lines = [line.rstrip("\r") for line in text.splitlines()]
    lines = [line for line in lines if line.strip()]
    if not lines:
        return []
    first = [c.strip() for c in lines[0].split(",")]
    header = _header_of(first, specs)
    if header is not None:
        ncols = len(first)
        columns = {}
        for field in fields:
            if field in header:
                col, unit = header[field]
                if field in _MIB_FIELDS and unit not in (None, "MiB"):
                    raise NvidiaSmiParseError(
                        "%s: column %s is in %s, expected MiB" % (what, field, unit))
                columns[field] = col
            elif field in required:
                raise NvidiaSmiParseError(
                    "%s: header %r has no column %s" % (what, lines[0], field))
        rows = lines[1:]
    else:
        ncols = len(fields)
        columns = dict((field, i) for i, field in enumerate(fields))
        rows = lines
    free_col = columns.get(free_text) if free_text else None
    result = []
    for lineno, line in enumerate(rows, start=2 if header is not None else 1):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) > ncols and free_col is not None:
            extra = len(cells) - ncols
            merged = ", ".join(cells[free_col:free_col + extra + 1])
            cells = cells[:free_col] + [merged] + cells[free_col + extra + 1:]
        if len(cells) != ncols:
            raise NvidiaSmiParseError(
                "%s: line %d has %d value(s), expected %d: %r" % (what, lineno, len(cells), ncols, line))
        row = {"error_states": {}} if error_states else {}
        for field, spec in specs.items():
            key, conv = spec[0], spec[1]
            if field not in columns:
                if field in fields:
                    row[key] = None
                continue
            value = cells[columns[field]]
            if conv is None:
                row[key] = value
                continue
            state = error_state(value) if error_states and field not in ("index", "pid") else None
            if state is not None:
                row["error_states"][field] = state
                row[key] = None
                continue
            if is_unavailable(value):
                if field in required and field in _IDENTITY_FIELDS:
                    raise NvidiaSmiParseError(
                        "%s: line %d: %s is %s: %r" % (what, lineno, field, value, line))
                row[key] = None
                continue
            try:
                row[key] = conv(value)
            except ValueError as exc:
                raise NvidiaSmiParseError(
                    "%s: line %d: %s %r is %s: %r" % (what, lineno, field, value, exc, line))
        result.append(row)
    return result


def parse_gpu_query(text, fields=GPU_FIELDS, required=REQUIRED_GPU_FIELDS):
    """``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` -> list of GPU dicts.

    Keys follow the facts contract (``index``, ``uuid``, ``name``, ``pci_bus_id``,
    ``memory_total_mib``, ``memory_used_mib``, ``memory_free_mib``, ``memory_reserved_mib``,
    ``mig_mode``, ``compute_mode``, ``driver_version``); a field not asked for is absent, one
    reported as N/A is None.
    """
    required = tuple(f for f in required if f in fields)
    gpus = _parse_csv(text, fields, _GPU_SPECS, required, "nvidia-smi --query-gpu")
    if not gpus:
        raise NvidiaSmiParseError("nvidia-smi --query-gpu: no GPU rows in the output")
    seen = set()
    for gpu in gpus:
        for key in ("index", "uuid", "pci_bus_id"):
            if key in gpu and gpu[key] is not None:
                if (key, gpu[key]) in seen:
                    raise NvidiaSmiParseError(
                        "nvidia-smi --query-gpu: %s %s appears twice" % (key, gpu[key]))
                seen.add((key, gpu[key]))
    return gpus


def parse_compute_apps(text, fields=APP_FIELDS):
    """``nvidia-smi --query-compute-apps=<fields> --format=csv[...]`` -> list of process dicts.

    Keys: ``pid``, ``process_name``, ``gpu_uuid``, ``gpu_bus_id``, ``used_mib`` (None when the
    driver reports N/A, e.g. under MIG). No processes (header only, or nothing) -> [].
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and lines[0].strip() == "No running processes found":
        return []
    required = tuple(f for f in ("pid", "gpu_uuid", "gpu_bus_id") if f in fields)
    return _parse_csv(text, fields, _APP_SPECS, required, "nvidia-smi --query-compute-apps",
                      free_text="process_name")


# --------------------------------------------------------------------------------------------
# topo -m
# --------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_TRAILING_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_LINK = re.compile(r"^(?:X|NV[0-9]+|[A-Z][A-Z0-9]{1,7})$")
_DEVICE = re.compile(r"^[A-Za-z][A-Za-z0-9_:.-]*$")
_GPU_LABEL = re.compile(r"^GPU([0-9]+)$")
_LEGEND_LINE = re.compile(r"^\s*(\S+)\s*=\s*(.+?)\s*$")
_NIC_LEGEND_LINE = re.compile(r"^\s*(\S+):\s*(\S+)\s*$")


def strip_ansi(text):
    return _ANSI.sub("", text)


def _numa_value(value, what):
    if is_unavailable(value):
        return None
    if _INT.match(value):
        return int(value)
    if _CPULIST.match(value):
        # Affine to several nodes ("0-1"): no single node to report.
        return None
    raise NvidiaSmiParseError("nvidia-smi topo -m: %s %r is not a NUMA node" % (what, value))


def _topo_header(lines):
    """Split the ``topo -m`` header into its device columns and trailing value columns."""
    head = lines[0]
    if "\t" not in head:
        raise NvidiaSmiParseError("nvidia-smi topo -m: header has no tab-separated columns: %r" % head)
    columns = [c.strip() for c in head.split("\t")]
    if columns[0]:
        raise NvidiaSmiParseError("nvidia-smi topo -m: header does not start with a tab: %r" % head)
    columns = [c for c in columns[1:] if c]
    devices = []
    trailing = []
    for col in columns:
        if col in _TRAILING_COLUMNS:
            trailing.append(col)
        elif trailing:
            raise NvidiaSmiParseError("nvidia-smi topo -m: device column %r after %r" % (col, trailing[-1]))
        elif _DEVICE.match(col):
            devices.append(col)
        else:
            raise NvidiaSmiParseError("nvidia-smi topo -m: unexpected column %r" % col)
    if not any(_GPU_LABEL.match(d) for d in devices):
        raise NvidiaSmiParseError("nvidia-smi topo -m: no GPU columns in header %r" % head)
    if len(set(devices)) != len(devices):
        raise NvidiaSmiParseError("nvidia-smi topo -m: repeated device column in %r" % head)
    return devices, trailing


def _topo_row(line, devices, trailing, rows):
    """Parse one matrix row of ``topo -m`` into ``(label, (links, values, line))``."""
    ndev = len(devices)
    cells = line.split("\t")
    label = cells[0].strip()
    if label not in devices:
        raise NvidiaSmiParseError("nvidia-smi topo -m: row for unknown device %r: %r" % (label, line))
    if label in rows:
        raise NvidiaSmiParseError("nvidia-smi topo -m: second row for %s" % label)
    links = [c.strip() for c in cells[1:1 + ndev]]
    if len(links) != ndev:
        raise NvidiaSmiParseError(
            "nvidia-smi topo -m: row %s has %d links, expected %d: %r" % (label, len(links), ndev, line))
    for link in links:
        if not _LINK.match(link):
            raise NvidiaSmiParseError("nvidia-smi topo -m: %r is not a link type (row %s)" % (link, label))
    if links[devices.index(label)] != "X":
        raise NvidiaSmiParseError("nvidia-smi topo -m: row %s does not link to itself with X" % label)
    raw = [c.strip() for c in cells[1 + ndev:]]
    values = [v for v in raw if v]
    if (len(values) == len(trailing) - 1 and trailing and trailing[0] == "CPU Affinity"
            and raw and not raw[0]):
        # Hosts whose NUMA nodes interleave CPUs print an empty CPU Affinity cell
        # ("NODE\t\t0\t\tN/A"): keep the column, unknown (sysfs fills it in).
        values = [""] + values
    return label, (links, values, line)


def _topo_legend(lines):
    """Read the ``Legend:`` and ``NIC Legend:`` sections after the matrix into two dicts."""
    legend = {}
    nic_names = {}
    section = None
    for line in lines:
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "Legend:":
            section = "legend"
            continue
        if stripped == "NIC Legend:":
            section = "nic"
            continue
        if section == "legend":
            m = _LEGEND_LINE.match(line)
            if m:
                legend[m.group(1)] = m.group(2)
                continue
        if section == "nic":
            m = _NIC_LEGEND_LINE.match(line)
            if m:
                nic_names[m.group(1)] = m.group(2)
                continue
        # Unknown trailing prose (newer drivers add notes): keep going, it carries no numbers we use.
    return legend, nic_names


def _topo_gpu_entry(label, devices, trailing, row):
    """Build one GPU's entry (links, NICs, CPU/NUMA affinity) from its parsed ``topo -m`` row."""
    links, values, line = row
    if len(values) != len(trailing):
        raise NvidiaSmiParseError(
            "nvidia-smi topo -m: row %s has %d values for %d columns (%s): %r"
            % (label, len(values), len(trailing), ", ".join(trailing), line))
    by_col = dict(zip(trailing, values))
    entry = {"links": {}, "nics": {}, "cpu_affinity": None, "numa_node": None, "gpu_numa_id": None}
    for other, link in zip(devices, links):
        if other == label:
            continue
        om = _GPU_LABEL.match(other)
        if om:
            entry["links"][int(om.group(1))] = link
        else:
            entry["nics"][other] = link
    if "CPU Affinity" in by_col and not by_col["CPU Affinity"]:
        entry["cpu_affinity_empty"] = True
    elif "CPU Affinity" in by_col:
        try:
            entry["cpu_affinity"] = parse_cpulist(by_col["CPU Affinity"])
        except NvidiaSmiParseError as exc:
            raise NvidiaSmiParseError("nvidia-smi topo -m: row %s: %s" % (label, exc))
    if "NUMA Affinity" in by_col:
        entry["numa_node"] = _numa_value(by_col["NUMA Affinity"], "NUMA Affinity")
    if "GPU NUMA ID" in by_col:
        entry["gpu_numa_id"] = _numa_value(by_col["GPU NUMA ID"], "GPU NUMA ID")
    return entry


def parse_topo(text):
    """``nvidia-smi topo -m`` -> dict.

    Returns ``{"gpus": {index: {"links": {other index: link}, "nics": {nic: link},
    "cpu_affinity": [cpu ids] | None, "numa_node": int | None, "gpu_numa_id": int | None}},
    "devices": [column labels], "legend": {token: meaning}, "nics": {NICn: name}}``.
    Tabs separate cells; the header carries ANSI escapes; value cells after the link matrix may
    be padded with empty cells (seen: ``0\\t\\tN/A``). Link tokens are checked (``X``, ``NV#``,
    ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS`` and other upper-case words) and the diagonal must
    be ``X``.
    """
    lines = [strip_ansi(line).rstrip("\r\n") for line in text.splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        raise NvidiaSmiParseError("nvidia-smi topo -m: empty output")
    devices, trailing = _topo_header(lines)

    rows = {}
    rest = lines[1:]
    i = 0
    while i < len(rest) and rest[i].strip():
        label, row = _topo_row(rest[i], devices, trailing, rows)
        rows[label] = row
        i += 1

    legend, nic_names = _topo_legend(rest[i:])

    gpus = {}
    for label in devices:
        m = _GPU_LABEL.match(label)
        if not m:
            continue
        if label not in rows:
            raise NvidiaSmiParseError("nvidia-smi topo -m: no row for %s" % label)
        gpus[int(m.group(1))] = _topo_gpu_entry(label, devices, trailing, rows[label])
    return {"gpus": gpus, "devices": devices, "legend": legend, "nics": nic_names}


# --------------------------------------------------------------------------------------------
# Driver and CUDA versions
# --------------------------------------------------------------------------------------------

_TABLE_VERSIONS = re.compile(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")
_KV_LINE = re.compile(r"^\s*([A-Za-z -]+?)\s*:\s*(\S+)\s*$")


def _cuda(value):
    if is_unavailable(value):
        return None
    if not re.match(r"^[0-9]+\.[0-9]+$", value):
        raise NvidiaSmiParseError("CUDA version %r is not MAJOR.MINOR" % value)
    return value


def parse_version(text):
    """``nvidia-smi --version`` or the plain ``nvidia-smi`` table -> driver and CUDA versions.

    ``--version`` prints ``DRIVER version : 580.159.04`` / ``CUDA Version : 13.0`` lines; the
    table header holds ``Driver Version: 580.159.04     CUDA Version: 13.0``.
    Returns ``{"driver_version": str, "cuda_version": str | None}``.
    """
    m = _TABLE_VERSIONS.search(text)
    if m:
        driver, cuda = m.group(1), m.group(2)
    else:
        found = {}
        for line in text.splitlines():
            km = _KV_LINE.match(line)
            if km:
                found[km.group(1).strip().lower()] = km.group(2)
        if "driver version" not in found or "cuda version" not in found:
            raise NvidiaSmiParseError("no driver and CUDA version in nvidia-smi output: %r" % text[:200])
        driver, cuda = found["driver version"], found["cuda version"]
    if not _VERSION.match(driver):
        raise NvidiaSmiParseError("driver version %r is not a version" % driver)
    return {"driver_version": driver, "cuda_version": _cuda(cuda)}


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

_UNKNOWN_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


def error_from_output(cmd, rc, out, err):
    """Turn a failed (or NVML-failing) nvidia-smi call into an NvidiaSmiError with advice."""
    text = "\n".join(part.strip() for part in (out or "", err or "") if part and part.strip())
    shown = " ".join(cmd)
    first = text.splitlines()[0] if text else "(no output)"
    if "Driver/library version mismatch" in text:
        return NvidiaSmiError(
            "nvidia-smi could not initialize NVML: Driver/library version mismatch (exit %s). The "
            "running kernel module is not the one the installed driver libraries belong to, which "
            "happens after a driver update: a reboot (or reloading the nvidia kernel modules) is "
            "likely needed. Output: %s" % (rc, text))
    if "No devices were found" in text:
        return NvidiaSmiError(
            "nvidia-smi found no NVIDIA GPU ('No devices were found', exit %s): check that the GPUs "
            "are visible (lspci), the driver is loaded and, in a container or VM, passed through."
            % rc)
    if "couldn't communicate with the NVIDIA driver" in text:
        return NvidiaSmiError(
            "nvidia-smi could not talk to the NVIDIA driver (exit %s): the kernel module is not "
            "loaded or the driver is not installed. Output: %s" % (rc, first))
    m = _UNKNOWN_FIELD.search(text)
    if m:
        return NvidiaSmiUnknownFieldError(
            "nvidia-smi does not know the query field %r (exit %s); the driver is older than this "
            "module expects. Command: %s" % (m.group(1), rc, shown), m.group(1))
    if "Failed to initialize NVML" in text:
        return NvidiaSmiError("nvidia-smi could not initialize NVML (exit %s): %s" % (rc, text))
    if "Insufficient Permissions" in text:
        return NvidiaSmiError("nvidia-smi lacks permissions (exit %s): %s" % (rc, text))
    return NvidiaSmiError("`%s` failed with exit code %s: %s" % (shown, rc, text or "(no output)"))


# --------------------------------------------------------------------------------------------
# sysfs and procfs
# --------------------------------------------------------------------------------------------

def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def sysfs_numa_node(bus_id, sysfs_root=None):
    """``/sys/bus/pci/devices/<bus>/numa_node``: the node, or None (-1, missing, unreadable)."""
    root = sysfs_root if sysfs_root is not None else SYSFS_ROOT
    text = _read(os.path.join(root, "bus", "pci", "devices", normalize_bus_id(bus_id), "numa_node"))
    if text is None:
        return None
    text = text.strip()
    if not re.match(r"^-?[0-9]+$", text):
        return None
    node = int(text)
    return node if node >= 0 else None


def sysfs_local_cpulist(bus_id, sysfs_root=None):
    """``/sys/bus/pci/devices/<bus>/local_cpulist`` as sorted CPU ids; [] when unknown."""
    root = sysfs_root if sysfs_root is not None else SYSFS_ROOT
    text = _read(os.path.join(root, "bus", "pci", "devices", normalize_bus_id(bus_id), "local_cpulist"))
    if text is None:
        return []
    try:
        return parse_cpulist(text) or []
    except NvidiaSmiParseError:
        return []


def unit_from_cgroup(text):
    """Contents of ``/proc/<pid>/cgroup`` -> the systemd service unit, or None.

    Works for cgroup v2 (``0::/system.slice/vllm-chat.service``), v1 and hybrid (the unified
    ``0::`` line first, then ``name=systemd``, then any controller). The innermost ``*.service``
    path component wins, so user services (``user@1000.service/app.slice/x.service``) and
    delegated sub-groups (``x.service/payload``) resolve to the service; scopes (sessions,
    containers) alone give None.
    """
    unified, named, others = [], [], []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            unified.append(path)
        elif "name=systemd" in controllers.split(","):
            named.append(path)
        else:
            others.append(path)
    for path in unified + named + others:
        services = [c for c in path.split("/") if c.endswith(".service") and len(c) > len(".service")]
        if services:
            return services[-1]
    return None


def pid_unit(pid, proc_root=None):
    """The systemd service unit of a process (from ``/proc/<pid>/cgroup``), or None."""
    root = proc_root if proc_root is not None else PROC_ROOT
    text = _read(os.path.join(root, str(int(pid)), "cgroup"))
    if text is None:
        return None
    return unit_from_cgroup(text)


# --------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------

def find_nvidia_smi(module, path=None):
    """Path of the nvidia-smi binary, or raise NvidiaSmiError saying why there is none."""
    if path:
        if not os.path.isfile(path):
            raise NvidiaSmiError("nvidia-smi not found at %s" % path)
        if not os.access(path, os.X_OK):
            raise NvidiaSmiError("%s is not executable" % path)
        return path
    found = module.get_bin_path("nvidia-smi", required=False, opt_dirs=NVIDIA_SMI_DIRS)
    if not found:
        raise NvidiaSmiError(
            "nvidia-smi not found on PATH or in %s: is the NVIDIA driver installed? Set the "
            "nvidia_smi option to its path if it lives elsewhere." % ", ".join(NVIDIA_SMI_DIRS))
    return found


class NvidiaSmi(object):
    """Runs nvidia-smi through ``module.run_command`` and returns parsed data.

    ``calls`` records every command run (with exit code and seconds) so modules can report them.
    """

    def __init__(self, module, path, sysfs_root=None, proc_root=None):
        self.module = module
        self.path = path
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.calls = []
        self.warnings = []

    def run(self, args, check=True):
        cmd = [self.path] + list(args)
        start = time.time()
        rc, out, err = self.module.run_command(cmd, environ_update=dict(NVIDIA_SMI_ENV))
        self.calls.append({"command": " ".join(cmd), "rc": rc, "seconds": round(time.time() - start, 3)})
        if rc != 0 or "Failed to initialize NVML" in (out or ""):
            if check:
                raise error_from_output(cmd, rc, out, err)
        return rc, out or "", err or ""

    def query_gpus(self):
        fields = list(GPU_FIELDS)
        while True:
            args = ("--query-gpu=" + ",".join(fields), "--format=csv")
            try:
                _rc, out, _err = self.run(args)
            except NvidiaSmiUnknownFieldError as exc:
                if exc.field in fields and exc.field in OPTIONAL_GPU_FIELDS:
                    fields.remove(exc.field)
                    continue
                raise
            gpus = parse_gpu_query(out, fields=tuple(fields))
            for gpu in gpus:
                for field in GPU_FIELDS:
                    gpu.setdefault(_GPU_SPECS[field][0], None)
            return gpus

    def query_compute_apps(self):
        _rc, out, _err = self.run(QUERY_APPS_ARGS)
        return parse_compute_apps(out)

    def topology(self):
        """Parsed ``topo -m``, or None when this host's nvidia-smi cannot print one."""
        rc, out, err = self.run(TOPO_ARGS, check=False)
        if rc != 0:
            text = (out.strip() or err.strip() or "(no output)").splitlines()[0]
            self.warnings.append(
                "nvidia-smi topo -m failed (exit %s: %s): no GPU links; NUMA node and CPU affinity "
                "come from sysfs" % (rc, text))
            return None
        return parse_topo(out)

    def versions(self):
        """Driver and CUDA versions: ``--version``, else the plain table's header."""
        rc, out, _err = self.run(VERSION_ARGS, check=False)
        if rc == 0:
            try:
                return parse_version(out)
            except NvidiaSmiParseError:
                pass
        _rc, out, _err = self.run(PLAIN_ARGS)
        return parse_version(out)

    def processes(self, gpus, apps=None):
        """Compute processes with their GPU index and systemd unit (facts contract)."""
        if apps is None:
            apps = self.query_compute_apps()
        return attach_processes(gpus, apps, self.proc_root)


def attach_processes(gpus, apps, proc_root=None):
    by_uuid = dict((g["uuid"], g["index"]) for g in gpus)
    by_bus = dict((normalize_bus_id(g["pci_bus_id"]), g["index"]) for g in gpus)
    result = []
    for app in apps:
        index = by_uuid.get(app.get("gpu_uuid"))
        if index is None and app.get("gpu_bus_id"):
            index = by_bus.get(normalize_bus_id(app["gpu_bus_id"]))
        result.append({
            "pid": app["pid"],
            "process_name": app.get("process_name") or "",
            "gpu_uuid": app.get("gpu_uuid"),
            "gpu_index": index,
            "used_mib": app.get("used_mib"),
            "unit": pid_unit(app["pid"], proc_root),
        })
    return result


def build_facts(gpus, apps, topo, versions, sysfs_root=None, proc_root=None, warnings=None):
    """Assemble ``gpus``, ``gpu_links``, ``gpu_driver`` and ``gpu_processes`` (facts contract).

    ``warnings``: a list that gets one sentence per fallback taken (an empty CPU Affinity cell).
    """
    topo_gpus = topo["gpus"] if topo else {}
    facts_gpus = []
    for gpu in gpus:
        t = topo_gpus.get(gpu["index"], {})
        numa = t.get("numa_node")
        if numa is None:
            numa = sysfs_numa_node(gpu["pci_bus_id"], sysfs_root)
        cpus = t.get("cpu_affinity")
        if cpus is None:
            cpus = sysfs_local_cpulist(gpu["pci_bus_id"], sysfs_root)
            if t.get("cpu_affinity_empty") and warnings is not None:
                warnings.append(
                    "nvidia-smi topo -m printed an empty CPU Affinity for GPU %s (NUMA nodes with interleaved "
                    "CPUs); read local_cpulist from sysfs instead: %s"
                    % (gpu["index"], ",".join(str(c) for c in cpus) if cpus else "unknown (no CPU pinning)"))
        facts_gpus.append({
            "index": gpu["index"],
            "uuid": gpu["uuid"],
            "name": gpu.get("name"),
            "pci_bus_id": gpu["pci_bus_id"],
            "memory_total_mib": gpu["memory_total_mib"],
            "memory_used_mib": gpu["memory_used_mib"],
            "memory_free_mib": gpu["memory_free_mib"],
            "memory_reserved_mib": gpu.get("memory_reserved_mib"),
            "mig_mode": gpu.get("mig_mode"),
            "numa_node": numa,
            "cpu_affinity": list(cpus),
            "compute_mode": gpu.get("compute_mode"),
        })
    indices = [g["index"] for g in gpus]
    links = {}
    if len(indices) > 1:
        for i in indices:
            row = topo_gpus.get(i, {}).get("links", {})
            links[str(i)] = dict((str(j), row[j]) for j in indices if j != i and j in row)
        if not any(links.values()):
            links = {}
    driver = None
    for gpu in gpus:
        if gpu.get("driver_version"):
            driver = gpu["driver_version"]
            break
    if versions and versions.get("driver_version"):
        driver = driver or versions["driver_version"]
    return {
        "gpus": facts_gpus,
        "gpu_links": links,
        "gpu_driver": {"driver_version": driver, "cuda_version": (versions or {}).get("cuda_version")},
        "gpu_processes": attach_processes(gpus, apps, proc_root),
    }


def gather_facts(smi):
    """All four facts in 4 nvidia-smi calls (see module docstring)."""
    gpus = smi.query_gpus()
    apps = smi.query_compute_apps()
    topo = smi.topology()
    versions = smi.versions()
    return build_facts(gpus, apps, topo, versions, smi.sysfs_root, smi.proc_root, smi.warnings)


# --------------------------------------------------------------------------------------------
# GPU health (inferops.vllm.gpu_health): one --query-gpu, --query-remapped-rows, topo -p2p,
# the kernel log's Xid lines, the fabric manager's version
# --------------------------------------------------------------------------------------------

HEALTH_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "driver_version",
    "persistence_mode",
    "compute_mode",
    "mig.mode.current",
    "mig.mode.pending",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.volatile.total",
    "retired_pages.pending",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "clocks_event_reasons.active",
    "clocks_event_reasons.hw_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "fabric.state",
    "fabric.status",
)
# Fields an older driver may not know: the health query is retried without them (the checks that
# need them then say "not available").
OPTIONAL_HEALTH_FIELDS = HEALTH_FIELDS[3:]
# Drivers before R535 know the clock-event fields only by their old names: R535 renamed
# clocks_throttle_reasons.* to clocks_event_reasons.* and keeps the old names as deprecated aliases
# (--help-query-gpu of 580.159.04: '"clocks_event_reasons.active" or "clocks_throttle_reasons.active"').
# query_health asks an old driver again with these names (see there why not by driver version).
LEGACY_HEALTH_FIELDS = dict((field, field.replace("clocks_event_reasons.", "clocks_throttle_reasons."))
                            for field in HEALTH_FIELDS if field.startswith("clocks_event_reasons."))
REQUIRED_HEALTH_FIELDS = ("index", "uuid", "pci.bus_id")

REMAPPED_ROWS_FIELDS = ("gpu_uuid", "gpu_bus_id", "remapped_rows.correctable",
                        "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure")
QUERY_REMAPPED_ROWS_ARGS = ("--query-remapped-rows=" + ",".join(REMAPPED_ROWS_FIELDS), "--format=csv")
TOPO_P2P_READ_ARGS = ("topo", "-p2p", "r")

# Minimum Linux driver per CUDA build of the vLLM wheel (NVIDIA's CUDA Toolkit release notes,
# table "CUDA Toolkit and Corresponding Driver Versions", Linux x86_64 GA drivers).
CUDA_MIN_DRIVER = {
    "11.8": "520.61.05",
    "12.1": "530.30.02",
    "12.4": "550.54.14",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}

# Xid codes that mean a broken GPU, GPU memory or fabric (not an application's own fault, such as
# 13, 31 or 43), with what each one means.
XID_MEANINGS = {
    48: "double-bit ECC error",
    56: "display engine error",
    57: "error programming video memory interface",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error",
    123: "SPI PMU RPC failure",
    136: "link training failure",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    144: "NVLink error",
    145: "NVLink error",
    146: "NVLink error",
    147: "NVLink error",
    148: "NVLink error",
    149: "NVLink error",
    150: "NVLink error",
    154: "GPU recovery action required",
}
XID_FAIL_DEFAULT = (48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 143, 154)

_YES_NO = {"Yes": True, "No": False}
_ACTIVE = {"Active": True, "Not Active": False}
_HEX = re.compile(r"^0x[0-9A-Fa-f]+$")
_NUMBER = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(?: ?([A-Za-z%]+))?$")

# clocks_event_reasons.active bits (nvml.h nvmlClocksEventReason*)
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def _conv_yes_no(value):
    if value not in _YES_NO:
        raise ValueError("not Yes/No")
    return _YES_NO[value]


def _conv_active(value):
    if value not in _ACTIVE:
        raise ValueError("not Active/Not Active")
    return _ACTIVE[value]


def _conv_hex(value):
    if not _HEX.match(value):
        raise ValueError("not a hex bit mask")
    return int(value, 16)


def _conv_number(unit):
    def conv(value):
        m = _NUMBER.match(value)
        if not m or (m.group(2) and m.group(2) != unit):
            raise ValueError("not a number in %s" % unit)
        return float(m.group(1))
    return conv


# field -> (result key, converter, header names)
_HEALTH_SPECS = {
    "index": ("index", _conv_int, ("index",)),
    "uuid": ("uuid", _conv_gpu_uuid, ("uuid", "gpu_uuid")),
    "pci.bus_id": ("pci_bus_id", _conv_bus_id, ("pci.bus_id", "gpu_bus_id")),
    "driver_version": ("driver_version", _conv_version, ("driver_version",)),
    "persistence_mode": ("persistence_mode", _conv_mode, ("persistence_mode",)),
    "compute_mode": ("compute_mode", _conv_word, ("compute_mode",)),
    "mig.mode.current": ("mig_mode", _conv_mode, ("mig.mode.current",)),
    "mig.mode.pending": ("mig_mode_pending", _conv_mode, ("mig.mode.pending",)),
    "ecc.mode.current": ("ecc_mode", _conv_mode, ("ecc.mode.current",)),
    "ecc.errors.uncorrected.volatile.total": (
        "ecc_uncorrected_volatile", _conv_int, ("ecc.errors.uncorrected.volatile.total",)),
    "ecc.errors.corrected.volatile.total": (
        "ecc_corrected_volatile", _conv_int, ("ecc.errors.corrected.volatile.total",)),
    "retired_pages.pending": ("retired_pages_pending", _conv_yes_no, ("retired_pages.pending",)),
    "pcie.link.gen.current": ("pcie_gen_current", _conv_int, ("pcie.link.gen.current",)),
    "pcie.link.gen.max": ("pcie_gen_max", _conv_int, ("pcie.link.gen.max",)),
    "pcie.link.width.current": ("pcie_width_current", _conv_int, ("pcie.link.width.current",)),
    "pcie.link.width.max": ("pcie_width_max", _conv_int, ("pcie.link.width.max",)),
    "clocks_event_reasons.active": (
        "clocks_event_reasons", _conv_hex,
        ("clocks_event_reasons.active", "clocks_throttle_reasons.active")),
    "clocks_event_reasons.hw_slowdown": (
        "hw_slowdown", _conv_active,
        ("clocks_event_reasons.hw_slowdown", "clocks_throttle_reasons.hw_slowdown")),
    "clocks_event_reasons.sw_thermal_slowdown": (
        "sw_thermal_slowdown", _conv_active,
        ("clocks_event_reasons.sw_thermal_slowdown", "clocks_throttle_reasons.sw_thermal_slowdown")),
    "clocks_event_reasons.hw_thermal_slowdown": (
        "hw_thermal_slowdown", _conv_active,
        ("clocks_event_reasons.hw_thermal_slowdown", "clocks_throttle_reasons.hw_thermal_slowdown")),
    "clocks_event_reasons.hw_power_brake_slowdown": (
        "hw_power_brake_slowdown", _conv_active,
        ("clocks_event_reasons.hw_power_brake_slowdown", "clocks_throttle_reasons.hw_power_brake_slowdown")),
    "temperature.gpu": ("temperature_gpu", _conv_int, ("temperature.gpu",)),
    "power.draw": ("power_draw_w", _conv_number("W"), ("power.draw",)),
    "power.limit": ("power_limit_w", _conv_number("W"), ("power.limit",)),
    "fabric.state": ("fabric_state", _conv_word, ("fabric.state",)),
    "fabric.status": ("fabric_status", _conv_text, ("fabric.status",)),
}
# nvidia-smi field name (the current and the pre-R535 one) -> key of parse_health_query's dicts
HEALTH_FIELD_KEYS = dict((field, spec[0]) for field, spec in _HEALTH_SPECS.items())
HEALTH_FIELD_KEYS.update((old, _HEALTH_SPECS[new][0]) for new, old in LEGACY_HEALTH_FIELDS.items())

_REMAP_SPECS = {
    "gpu_uuid": ("gpu_uuid", _conv_gpu_uuid, ("gpu_uuid", "uuid")),
    "gpu_bus_id": ("gpu_bus_id", _conv_bus_id, ("gpu_bus_id", "pci.bus_id")),
    "remapped_rows.correctable": ("correctable", _conv_int, ("remapped_rows.correctable",)),
    "remapped_rows.uncorrectable": ("uncorrectable", _conv_int, ("remapped_rows.uncorrectable",)),
    "remapped_rows.pending": ("pending", _conv_yes_no, ("remapped_rows.pending",)),
    "remapped_rows.failure": ("failure", _conv_yes_no, ("remapped_rows.failure",)),
}


def parse_health_query(text, fields=HEALTH_FIELDS):
    """``nvidia-smi --query-gpu=<HEALTH_FIELDS> --format=csv[,noheader][,nounits]`` -> GPU dicts.

    Keys (see ``_HEALTH_SPECS``): ``index``, ``uuid``, ``pci_bus_id``, ``driver_version``,
    ``persistence_mode``, ``compute_mode``, ``mig_mode``, ``mig_mode_pending``, ``ecc_mode``,
    ``ecc_uncorrected_volatile``, ``ecc_corrected_volatile``, ``retired_pages_pending`` (bool),
    ``pcie_gen_current``/``pcie_gen_max``/``pcie_width_current``/``pcie_width_max``,
    ``clocks_event_reasons`` (the bit mask as an int), ``hw_slowdown``, ``sw_thermal_slowdown``,
    ``hw_thermal_slowdown``, ``hw_power_brake_slowdown`` (bools), ``temperature_gpu``,
    ``power_draw_w``, ``power_limit_w``, ``fabric_state``, ``fabric_status``. N/A is None; a field
    not asked for is None too. The clock-event columns may carry their pre-R535 names
    (``clocks_throttle_reasons.*``) in the header.

    ``error_states``: ``{field: cell}`` for every cell in an error state (``[GPU requires reset]``,
    ``[GPU is lost]``, ``[Unknown Error]``, ``[Insufficient Permissions]``, any bracket that is not
    N/A or Not Supported); the reading is None. ``uuid`` and ``pci.bus_id`` may be in one (None then);
    ``index`` may not (a row without an index raises).
    """
    required = tuple(f for f in REQUIRED_HEALTH_FIELDS if f in fields)
    gpus = _parse_csv(text, fields, _HEALTH_SPECS, required, "nvidia-smi --query-gpu", error_states=True)
    if not gpus:
        raise NvidiaSmiParseError("nvidia-smi --query-gpu: no GPU rows in the output")
    for gpu in gpus:
        for spec in _HEALTH_SPECS.values():
            gpu.setdefault(spec[0], None)
    return gpus


def parse_remapped_rows(text, fields=REMAPPED_ROWS_FIELDS):
    """``nvidia-smi --query-remapped-rows=<fields> --format=csv`` -> one dict per GPU.

    Keys: ``gpu_uuid``, ``gpu_bus_id``, ``correctable``, ``uncorrectable`` (rows remapped),
    ``pending`` and ``failure`` (bools); None where the GPU does not support row remapping
    (before Ampere). ``error_states``: ``{field: cell}`` for cells in an error state (see
    ``parse_health_query``), whose values are None.
    """
    required = tuple(f for f in ("gpu_uuid", "gpu_bus_id") if f in fields)
    return _parse_csv(text, fields, _REMAP_SPECS, required, "nvidia-smi --query-remapped-rows",
                      error_states=True)


_P2P_CELL = re.compile(r"^(?:X|OK|CNS|GNS|TNS|NS|U)$")


def parse_topo_p2p(text):
    """``nvidia-smi topo -p2p r|w|n|a|p`` -> ``{gpu index: {other index: status}}``.

    Status is the matrix cell: ``OK``, ``NS`` (not supported), ``CNS`` (chipset), ``GNS`` (GPU),
    ``TNS`` (topology), ``U`` (unknown); the diagonal (``X``) is left out. Lines start with a
    space, cells are tab separated, the header carries ANSI escapes; the legend is ignored.
    """
    lines = [strip_ansi(line).rstrip("\r\n") for line in text.splitlines()]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        raise NvidiaSmiParseError("nvidia-smi topo -p2p: empty output")
    header = [c.strip() for c in lines[0].split("\t") if c.strip()]
    columns = []
    for label in header:
        m = _GPU_LABEL.match(label)
        if not m:
            raise NvidiaSmiParseError("nvidia-smi topo -p2p: header cell %r is not GPU<n>" % label)
        columns.append(int(m.group(1)))
    if not columns:
        raise NvidiaSmiParseError("nvidia-smi topo -p2p: no GPU columns in %r" % lines[0])
    matrix = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = [c.strip() for c in line.split("\t")]
        while cells and cells[-1] == "":
            cells.pop()
        if not cells or not cells[0]:
            raise NvidiaSmiParseError("nvidia-smi topo -p2p: row without a label: %r" % line)
        m = _GPU_LABEL.match(cells[0])
        if not m:
            raise NvidiaSmiParseError("nvidia-smi topo -p2p: row label %r is not GPU<n>" % cells[0])
        values = cells[1:]
        if len(values) != len(columns):
            raise NvidiaSmiParseError(
                "nvidia-smi topo -p2p: row %s has %d cells for %d GPUs: %r"
                % (cells[0], len(values), len(columns), line))
        index = int(m.group(1))
        row = {}
        for other, value in zip(columns, values):
            if not _P2P_CELL.match(value):
                raise NvidiaSmiParseError("nvidia-smi topo -p2p: unknown status %r in row %s" % (value, cells[0]))
            if other == index:
                if value != "X":
                    raise NvidiaSmiParseError("nvidia-smi topo -p2p: diagonal of %s is %r" % (cells[0], value))
                continue
            if value == "X":
                raise NvidiaSmiParseError("nvidia-smi topo -p2p: X off the diagonal in row %s" % cells[0])
            row[other] = value
        matrix[index] = row
    if sorted(matrix) != sorted(columns):
        raise NvidiaSmiParseError("nvidia-smi topo -p2p: rows %s do not match columns %s"
                                  % (sorted(matrix), columns))
    return matrix


_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\): "
                  r"([0-9]+),\s*(.*)$")
_SXID = re.compile(r"nvidia-nvswitch([0-9]+): SXid \(PCI:([0-9A-Fa-f:.]+)\): ([0-9]+),\s*(.*)$")


def parse_xid_lines(text):
    """Kernel log text (``journalctl -k``, ``dmesg``, a file) -> Xid and SXid events.

    Returns dicts ``{"kind": "Xid"|"SXid", "xid": int, "pci": "0000:18:00" (domain:bus:device,
    lower case) | "nvswitch<n>", "detail": str, "line": str}`` in log order. Lines without an Xid
    are ignored; so is anything before ``NVRM:`` (timestamps, host names).
    """
    events = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            domain, bus, dev = m.group(1).split(":")
            events.append({"kind": "Xid", "xid": int(m.group(2)),
                           "pci": "%04x:%s:%s" % (int(domain, 16), bus.lower(), dev.lower()),
                           "detail": m.group(3).strip(), "line": line.strip()})
            continue
        m = _SXID.search(line)
        if m:
            events.append({"kind": "SXid", "xid": int(m.group(3)), "pci": "nvswitch" + m.group(1),
                           "detail": m.group(4).strip(), "line": line.strip()})
    return events


def xid_pci_of_bus_id(bus_id):
    """``00000000:18:00.0`` -> ``0000:18:00``: the form Xid lines name a GPU by."""
    return normalize_bus_id(bus_id).rsplit(".", 1)[0]


_FM_VERSION = re.compile(r"[Vv]ersion[^0-9\n]*([0-9]{3,}\.[0-9]+(?:\.[0-9]+)?)\b")


def parse_fabricmanager_version(text):
    """``nv-fabricmanager --version`` -> ``580.159.04``; None when the text holds no version.

    The tool prints ``Fabric Manager version is : 580.159.04``; any "version" followed by a
    driver-style version on the same line is accepted (no capture from an NVSwitch host yet).
    """
    m = _FM_VERSION.search(text or "")
    return m.group(1) if m else None


_PROC_DRIVER = re.compile(r"NVRM version:.*?\s([0-9]{3,}\.[0-9]+(?:\.[0-9]+)?)\s")


def parse_proc_driver_version(text):
    """``/proc/driver/nvidia/version`` -> the kernel module's version, or None."""
    m = _PROC_DRIVER.search(text or "")
    return m.group(1) if m else None


def version_tuple(version):
    """``575.51.03`` -> (575, 51, 3); raises NvidiaSmiParseError for anything else."""
    if not isinstance(version, str) or not _VERSION.match(version.strip()):
        raise NvidiaSmiParseError("not a version: %r" % (version,))
    return tuple(int(part) for part in version.strip().split("."))


def clock_event_names(mask):
    """The set bits of ``clocks_event_reasons.active`` as names (unknown bits as hex)."""
    if mask is None:
        return []
    names = []
    for bit in sorted(CLOCK_EVENT_BITS):
        if mask & bit:
            names.append(CLOCK_EVENT_BITS[bit])
    rest = mask & ~sum(CLOCK_EVENT_BITS)
    if rest:
        names.append("0x%x" % rest)
    return names


def query_health(smi):
    """The health query through an :class:`NvidiaSmi`: ``(gpus, dropped)``.

    A driver that does not know a field answers 'Field "x" is not a valid field to query.' (exit 2)
    and is asked again: without that field (``dropped``; its checks then say "not available"), or,
    for a clock-event field, with the whole group's pre-R535 names (``LEGACY_HEALTH_FIELDS``,
    ``clocks_throttle_reasons.*``) first. Each GPU gets ``clock_event_fields``: the prefix the clock-event
    readings were asked with (``clocks_event_reasons``, ``clocks_throttle_reasons``; None when the
    driver knows neither), and its ``error_states`` name the fields as asked.

    Why by the driver's answer, not by its version: the version comes from this same query, so
    deciding first would cost every host one more call; the answer is the driver's own word on which
    names it knows, so no branch cut-off has to be right (the rename's release and back-ports, vGPU
    and data-center branches); current drivers still take the old names, but only as deprecated
    aliases that may go away, so the current names are asked first. It costs one call, on old
    drivers only, and never loops: each retry renames the group once or drops a field.
    """
    fields = list(HEALTH_FIELDS)  # the parser's names
    asked = dict((field, field) for field in fields)  # -> the name on the command line
    dropped = []
    while True:
        args = ("--query-gpu=" + ",".join(asked[f] for f in fields), "--format=csv")
        try:
            _rc, out, _err = smi.run(args)
        except NvidiaSmiUnknownFieldError as exc:
            field = next((f for f in fields if asked[f] == exc.field), None)
            if field in LEGACY_HEALTH_FIELDS and asked[field] == field:
                asked.update(LEGACY_HEALTH_FIELDS)
                continue
            if field in OPTIONAL_HEALTH_FIELDS:
                fields.remove(field)
                dropped.append(exc.field)
                continue
            raise
        gpus = parse_health_query(out, fields=tuple(fields))
        clock_fields = [asked[f] for f in fields if f in LEGACY_HEALTH_FIELDS]
        for gpu in gpus:
            gpu["clock_event_fields"] = clock_fields[0].split(".")[0] if clock_fields else None
            gpu["error_states"] = dict((asked.get(f, f), cell) for f, cell in gpu["error_states"].items())
        return gpus, dropped
