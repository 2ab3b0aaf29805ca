# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""The GPU footprint check: a reading of nvidia-smi compared with the plan's expectation.

One implementation for the ``gpu_footprint`` module (the play fails on a deviation) and the watchdog
(``inferops-vllm-watchdog`` on each host, installed by the service role next to this file and
``nvidia_smi.py``: it exports ``inferops_footprint_ok``). Standard library only.
"""
from __future__ import annotations

try:
    from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
        NvidiaSmiError,
        FOOTPRINT_TOLERANCE_MIB,
        IDLE_MAX_MIB,
        MEMORY_BASE,
        normalize_bus_id,
        usable_mib,
    )
except ImportError:  # installed next to nvidia_smi.py on a host (the watchdog), outside a collection
    from nvidia_smi import (  # type: ignore[no-redef]
        NvidiaSmiError,
        FOOTPRINT_TOLERANCE_MIB,
        IDLE_MAX_MIB,
        MEMORY_BASE,
        normalize_bus_id,
        usable_mib,
    )

# Defined once in module_utils (the planner and the units' start check use the same values).
DEFAULT_TOLERANCE_MIB = FOOTPRINT_TOLERANCE_MIB
DEFAULT_IDLE_MAX_MIB = IDLE_MAX_MIB


class FootprintError(Exception):
    """The expectation cannot be checked on this host (bad option, unknown GPU, MIG)."""


def _gpu_list(gpus):
    return ", ".join("%d (%s)" % (g["index"], g["uuid"]) for g in gpus)


def resolve_gpu(ref, gpus, where):
    """An index / UUID / bus id from the options -> the GPU dict, or FootprintError."""
    if isinstance(ref, bool) or ref is None or isinstance(ref, (list, dict, float)):
        raise FootprintError("%s: %r is not a GPU index, UUID or PCI bus id" % (where, ref))
    text = str(ref).strip()
    match = None
    if isinstance(ref, int) or text.isdecimal():
        match = [g for g in gpus if g["index"] == int(text)]
    elif text.upper().startswith("MIG-"):
        raise FootprintError("%s: %s is a MIG device; MIG instances are not supported" % (where, text))
    elif text.upper().startswith("GPU-"):
        match = [g for g in gpus if g["uuid"].lower() == text.lower()]
    else:
        try:
            bus = normalize_bus_id(text)
        except NvidiaSmiError:
            raise FootprintError("%s: %r is not a GPU index, UUID or PCI bus id" % (where, ref))
        match = [g for g in gpus if normalize_bus_id(g["pci_bus_id"]) == bus]
    if not match:
        raise FootprintError(
            "%s names GPU %s, which this host does not have (GPUs: %s)" % (where, text, _gpu_list(gpus)))
    return match[0]


def _unit_name(unit):
    unit = unit.strip()
    return unit if "." in unit else unit + ".service"


def plan_expectations(expected, gpus, allow_shared=False, memory_base=MEMORY_BASE):
    """Validate ``expected`` against the GPUs -> {index: merged expectation}."""
    per_gpu = {}
    for i, entry in enumerate(expected or []):
        if not isinstance(entry, dict):
            raise FootprintError("expected[%d] is not a dict: %r" % (i, entry))
        unit = _unit_name(entry["unit"]) if entry.get("unit") else None
        name = entry.get("name") or unit
        where = "expected[%d] (%s)" % (i, name) if name else "expected[%d]" % i
        name = name or "expected[%d]" % i
        used_mib, fraction = entry.get("used_mib"), entry.get("used_fraction")
        if (used_mib is None) == (fraction is None):
            raise FootprintError(
                "%s: give exactly one of used_mib and used_fraction (%s)"
                % (where, "both are set" if used_mib is not None else "neither is set"))
        if used_mib is not None and used_mib < 0:
            raise FootprintError("%s: used_mib must not be negative (%s)" % (where, used_mib))
        if fraction is not None and not 0 < fraction <= 1:
            raise FootprintError("%s: used_fraction must be in (0, 1], got %s" % (where, fraction))
        tol_mib, tol_pct = entry.get("tolerance_mib"), entry.get("tolerance_pct")
        if tol_mib is not None and tol_pct is not None:
            raise FootprintError("%s: give at most one of tolerance_mib and tolerance_pct" % where)
        if tol_mib is not None and tol_mib < 0:
            raise FootprintError("%s: tolerance_mib must not be negative (%s)" % (where, tol_mib))
        if tol_pct is not None and not 0 <= tol_pct <= 100:
            raise FootprintError("%s: tolerance_pct must be in [0, 100], got %s" % (where, tol_pct))
        refs = entry.get("gpus") or []
        if not refs:
            raise FootprintError("%s: gpus is empty" % where)
        seen = set()
        for ref in refs:
            gpu = resolve_gpu(ref, gpus, where)
            if gpu["index"] in seen:
                raise FootprintError("%s names GPU %d twice" % (where, gpu["index"]))
            seen.add(gpu["index"])
            if gpu.get("mig_mode") == "Enabled":
                raise FootprintError(
                    "%s names GPU %d (%s), which has MIG mode enabled: its memory is split into MIG "
                    "instances that this check does not measure. Disable MIG on it or leave it out "
                    "of expected." % (where, gpu["index"], gpu["uuid"]))
            if used_mib is not None:
                amount = used_mib
            else:
                base = usable_mib(gpu, memory_base)
                if base is None:
                    raise FootprintError(
                        "%s: GPU %d reports no total memory, so used_fraction cannot be applied"
                        % (where, gpu["index"]))
                amount = int(fraction * base + 0.5)
            if tol_mib is not None:
                tolerance = tol_mib
            elif tol_pct is not None:
                tolerance = int(amount * tol_pct / 100.0 + 0.5)
            else:
                tolerance = DEFAULT_TOLERANCE_MIB
            per_gpu.setdefault(gpu["index"], []).append(
                {"name": name, "expected_mib": amount, "tolerance_mib": tolerance, "unit": unit})
    plan = {}
    for index, parts in per_gpu.items():
        if len(parts) > 1 and not allow_shared:
            raise FootprintError(
                "GPU %d is named by %s; set allow_shared_gpus: true if these instances are meant to "
                "share it (their amounts are then added up)"
                % (index, " and ".join("'%s'" % p["name"] for p in parts)))
        units = [p["unit"] for p in parts]
        plan[index] = {
            "names": [p["name"] for p in parts],
            "expected_mib": sum(p["expected_mib"] for p in parts),
            "tolerance_mib": sum(p["tolerance_mib"] for p in parts),
            "units": sorted(set(units)) if all(units) else None,
        }
    return plan


def _holder(proc, unit_owner):
    if proc["unit"]:
        owner = unit_owner.get(proc["unit"])
        unit = "unit %s%s" % (proc["unit"], " of '%s'" % owner if owner else "")
    else:
        unit = "no systemd unit"
    used = "%d MiB" % proc["used_mib"] if proc["used_mib"] is not None else "memory not reported"
    return "pid %d (%s, %s, %s)" % (proc["pid"], proc["name"] or "?", unit, used)


def _holders(procs, unit_owner):
    if not procs:
        return "no compute process holds memory on it"
    return "held by " + ", ".join(_holder(p, unit_owner) for p in procs)


def evaluate(gpus, processes, plan, idle_max_mib=DEFAULT_IDLE_MAX_MIB, idle_gpus="must_be_idle"):
    """Compare a reading with the plan -> (per-GPU results, deviation sentences)."""
    unit_owner = {}
    for entry in plan.values():
        for unit in entry["units"] or []:
            unit_owner.setdefault(unit, " + ".join(entry["names"]))
    results, deviations = [], []
    for gpu in gpus:
        index = gpu["index"]
        procs = [{"pid": p["pid"], "name": p["process_name"], "unit": p["unit"], "used_mib": p["used_mib"]}
                 for p in processes if p["gpu_index"] == index]
        used = gpu["memory_used_mib"]
        entry = plan.get(index)
        result = {"index": index, "uuid": gpu["uuid"], "used_mib": used,
                  "total_mib": gpu["memory_total_mib"], "processes": procs, "checked": True}
        label = "GPU %d (%s)" % (index, gpu["uuid"])
        problems = []
        if entry is not None:
            names = " + ".join(entry["names"])
            low = max(0, entry["expected_mib"] - entry["tolerance_mib"])
            high = entry["expected_mib"] + entry["tolerance_mib"]
            result.update(expectation=names, expected_mib=entry["expected_mib"],
                          expected_min_mib=low, expected_max_mib=high)
            range_text = "%d-%d MiB (%d +/- %d)" % (low, high, entry["expected_mib"], entry["tolerance_mib"])
            if used is None:
                problems.append("nvidia-smi reports no memory figure for it (expected %s); %s"
                                % (range_text, _holders(procs, unit_owner)))
            elif used < low or used > high:
                problems.append("uses %d MiB, %s the expected %s; %s" % (
                    used, "below" if used < low else "above", range_text, _holders(procs, unit_owner)))
            if entry["units"]:
                strangers = [p for p in procs if p["unit"] not in entry["units"]]
                if strangers:
                    problems.append("memory held by processes outside %s: %s" % (
                        " / ".join(entry["units"]), ", ".join(_holder(p, unit_owner) for p in strangers)))
            subject = "%s of '%s'" % (label, names)
        else:
            result.update(expectation="idle", expected_mib=0, expected_min_mib=0)
            subject = "%s should be idle" % label
            if idle_gpus == "ignore":
                result.update(expected_max_mib=None, checked=False)
            else:
                result["expected_max_mib"] = idle_max_mib
                if used is None:
                    problems.append("nvidia-smi reports no memory figure for it; %s"
                                    % _holders(procs, unit_owner))
                elif used > idle_max_mib:
                    problems.append("uses %d MiB, more than the idle limit of %d MiB; %s"
                                    % (used, idle_max_mib, _holders(procs, unit_owner)))
        result["ok"] = not problems
        if problems:
            deviations.append("%s: %s." % (subject, "; ".join(problems)))
        results.append(result)
    return results, deviations
