# Apache License 2.0 (see LICENSE)
"""GPU placement planner for vLLM instances (controller side, pure Python, no Ansible imports).

``plan(gpus, instances, links)`` turns the host's GPU facts (``ansible_facts.gpus`` and
``ansible_facts.gpu_links`` as ``inferops.vllm.gpu_facts`` returns them) and the user's list of
instances into one checked placement plan. The filter ``inferops.vllm.gpu_plan`` is a thin wrapper;
a preflight role, a report or a table formatter can import this module directly.

Rules (see docs/placement.md for the long form):

* ``gpus: auto`` (the default) puts an instance's ``tensor_parallel_size x pipeline_parallel_size``
  GPUs inside one NUMA node where that fits, else inside one NVLink-connected set (all pairs
  ``NV#``). A tensor-parallel group whose members are joined by ``SYS`` (PCIe across the
  inter-socket link) is refused unless the instance sets ``allow_cross_numa: true``. With pipeline
  parallelism the rule applies to every tensor-parallel stage; stages themselves may sit on
  different nodes (they exchange only activations, not per-layer all-reduces).
* Among acceptable groups the tightest wins (NV# > PIX > PXB > PHB > NODE > SYS), then the one
  that leaves the fewest free GPUs behind on the NUMA nodes it touches (best fit, so larger holes
  stay whole), then the lowest indices. Instances with explicit ``gpus`` are fixed first, then
  instances pinned to a ``numa_node``, then the rest, each by descending size; a bounded
  backtracking search finds a plan when the greedy order would paint itself into a corner.
  The result is reported in input order.
* A GPU serves one instance, unless every instance on it names it explicitly and their
  ``gpu_memory_utilization`` add up to at most ``SHARE_LIMIT`` (0.95).
* Every error names the host (when given), the instance, the variable and the fix.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field

from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
    FOOTPRINT_TOLERANCE_MIB,
    MEMORY_BASE,
    usable_mib,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import table_cells
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import (
    as_bool as _as_bool,
    as_float as _as_float,
    as_int as _as_int,
    compress_ints,
    is_int as _is_int,
)

__all__ = [
    "PlanError",
    "plan",
    "assign_ports",
    "kept_slots",
    "format_table",
    "compress_ints",
    "DEFAULT_RESERVE_MIB",
    "DEFAULT_TOLERANCE_MIB",
    "SHARE_LIMIT",
]

#: Per-GPU room, on top of the weights, that ``gpu_memory_utilization x total`` must leave:
#: about 2 GiB for the CUDA context, activation peak, CUDA graphs and NCCL buffers, plus 2 GiB as
#: the smallest KV cache worth starting a server for.
DEFAULT_RESERVE_MIB = 4096
#: How far the measured footprint may stray from ``gpu_memory_utilization x total`` (CUDA graphs,
#: NCCL buffers): about a GiB.
DEFAULT_TOLERANCE_MIB = FOOTPRINT_TOLERANCE_MIB
#: Upper bound for the summed ``gpu_memory_utilization`` of instances sharing one GPU.
SHARE_LIMIT = 0.95
#: Above this many candidate groups per instance, fall back from exhaustive search to greedy growth.
COMBINATION_LIMIT = 5000
#: Placement attempts the backtracking search may make before it settles for the greedy answer.
SEARCH_BUDGET = 20000

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
#: systemd unit names are limited to 255 characters.
UNIT_NAME_MAX = 255

# Link ranks, tightest first. Unknown pairs rank between NODE and SYS.
_RANK_NV, _RANK_PIX, _RANK_PXB, _RANK_PHB, _RANK_NODE, _RANK_UNKNOWN, _RANK_SYS = range(7)
_LINK_RANKS = {"PIX": _RANK_PIX, "PSB": _RANK_PIX, "PXB": _RANK_PXB, "PHB": _RANK_PHB,
               "NODE": _RANK_NODE, "SYS": _RANK_SYS, "SOC": _RANK_SYS}
_NV_RE = re.compile(r"^NV(\d+)$")


class PlanError(ValueError):
    """Raised for any input the planner refuses; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str], host: str | None = None):
        self.problems = list(problems)
        self.host = host
        where = f"host {host}: " if host else ""
        if len(self.problems) == 1:
            text = f"gpu_plan: {where}{self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            text = f"gpu_plan: {where}{len(self.problems)} problems:\n{lines}"
        super().__init__(text)


# --------------------------------------------------------------------------- small helpers

def _is_auto(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() == "auto")


def _divisors(n: int, limit: int) -> list[int]:
    """The divisors of ``n`` up to ``limit`` (a GPU count: the loop never runs past it, whatever ``n`` is)."""
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _gpus_word(indices) -> str:
    """ "GPU 3" or "GPUs 0-3" """
    indices = sorted(indices)
    return f"GPU {indices[0]}" if len(indices) == 1 else f"GPUs {_gpu_list(indices)}"


def _gpu_list(indices) -> str:
    """Human form of a GPU index set: "0-3", "0,2", "none"."""
    indices = sorted(indices)
    return compress_ints(indices) if indices else "none"


# --------------------------------------------------------------------------- host model

@dataclass(frozen=True)
class _Gpu:
    index: int
    uuid: str
    total_mib: int
    numa: int | None
    cpus: tuple
    mig: bool
    compute_mode: str | None


@dataclass
class _Host:
    gpus: dict  # index -> _Gpu
    order: list  # indices in fact order
    rank: dict  # (a, b) -> rank int (both directions)
    link: dict  # (a, b) -> link string as topo -m printed it, or None
    by_uuid: dict  # lower-case uuid -> index

    def crosses(self, a: int, b: int) -> bool:
        """True when a and b talk over the inter-socket link (SYS), as far as the facts tell."""
        r = self.rank[(a, b)]
        if r == _RANK_SYS:
            return True
        if r == _RANK_UNKNOWN:
            na, nb = self.gpus[a].numa, self.gpus[b].numa
            return na is not None and nb is not None and na != nb
        return False

    def nodes(self) -> list:
        return sorted({g.numa for g in self.gpus.values() if g.numa is not None})


def _link_rank(text) -> tuple[int, int]:
    """(rank, -nvlink count) for a link string; unknown strings rank as unknown."""
    if not isinstance(text, str):
        return _RANK_UNKNOWN, 0
    text = text.strip().upper()
    m = _NV_RE.match(text)
    if m:
        return _RANK_NV, -int(m.group(1))
    return _LINK_RANKS.get(text, _RANK_UNKNOWN), 0


def _lookup_link(links, a: int, b: int):
    if not isinstance(links, dict):
        return None
    for x, y in ((a, b), (b, a)):
        row = links.get(str(x), links.get(x))
        if isinstance(row, dict):
            val = row.get(str(y), row.get(y))
            if isinstance(val, str) and val.strip():
                return val.strip()
    return None


def _build_host(gpus, links, where: str, memory_base=MEMORY_BASE) -> _Host:
    if gpus is None:
        gpus = []
    if not isinstance(gpus, (list, tuple)):
        raise PlanError([f"the GPU facts must be a list (ansible_facts.gpus), got {type(gpus).__name__}; "
                         "gather them with inferops.vllm.gpu_facts first"], where)
    problems = []
    model = {}
    order = []
    for pos, g in enumerate(gpus):
        if not isinstance(g, dict):
            problems.append(f"ansible_facts.gpus[{pos}] is not a dict; gather the facts with inferops.vllm.gpu_facts")
            continue
        idx = g.get("index")
        if not _is_int(idx) or idx < 0:
            problems.append(f"ansible_facts.gpus[{pos}] has no valid 'index'; gather the facts with inferops.vllm.gpu_facts")
            continue
        total = g.get("memory_total_mib")
        if _is_int(total) and total > 0 and _is_int(g.get("memory_reserved_mib")):
            # the base vLLM's gpu_memory_utilization (and gpu_footprint's used_fraction) applies to
            total = usable_mib(g, memory_base)
        if not _is_int(total) or total <= 0:
            problems.append(f"ansible_facts.gpus[{pos}] (GPU {idx}) has no valid 'memory_total_mib'; "
                            "gather the facts with inferops.vllm.gpu_facts")
            continue
        if idx in model:
            problems.append(f"ansible_facts.gpus lists GPU index {idx} twice; gather the facts again")
            continue
        numa = g.get("numa_node")
        numa = numa if _is_int(numa) and numa >= 0 else None
        cpus = g.get("cpu_affinity") or []
        cpus = tuple(sorted({c for c in cpus if _is_int(c) and c >= 0})) if isinstance(cpus, (list, tuple)) else ()
        mig = str(g.get("mig_mode") or "").strip().lower() == "enabled"
        uuid = g.get("uuid")
        uuid = uuid.strip() if isinstance(uuid, str) and uuid.strip() else f"GPU-index-{idx}"
        mode = g.get("compute_mode")
        model[idx] = _Gpu(idx, uuid, total, numa, cpus, mig, mode if isinstance(mode, str) else None)
        order.append(idx)
    if problems:
        raise PlanError(problems, where)
    rank = {}
    link = {}
    for a, b in itertools.permutations(order, 2):
        text = _lookup_link(links, a, b)
        rank[(a, b)] = _link_rank(text)[0]
        link[(a, b)] = text
    by_uuid = {g.uuid.lower(): i for i, g in model.items()}
    return _Host(model, sorted(order), rank, link, by_uuid)


# --------------------------------------------------------------------------- instance model

@dataclass
class _Inst:
    pos: int
    raw: dict
    name: str
    tp: int = 1
    pp: int = 1
    explicit: tuple | None = None  # sorted indices, or None for auto
    numa: int | None = None
    util: float = 0.9
    port: int | None = None
    allow_cross: bool = False
    weights_bytes: float | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ok: bool = True
    where: str = ""
    group: tuple = field(default=())

    @property
    def size(self) -> int:
        return self.tp * self.pp


def _stages(host: _Host, group, tp: int) -> list[tuple]:
    """Split a group into pipeline stages of ``tp`` GPUs: GPUs ordered by NUMA node, then index."""
    ordered = sorted(group, key=lambda i: (host.gpus[i].numa is None, host.gpus[i].numa or 0, i))
    return [tuple(ordered[k:k + tp]) for k in range(0, len(ordered), tp)]


def _crossing_pairs(host: _Host, group, tp: int) -> list[tuple]:
    pairs = []
    for stage in _stages(host, group, tp):
        for a, b in itertools.combinations(stage, 2):
            if host.crosses(a, b):
                pairs.append((a, b))
    return pairs


def _worst_link(host: _Host, group):
    """The loosest link inside a group, as topo -m prints it; None for one GPU or unknown links."""
    worst = None
    worst_key = None
    for a, b in itertools.combinations(sorted(group), 2):
        text = host.link[(a, b)]
        key = _link_rank(text)
        if worst_key is None or key > worst_key:
            worst_key, worst = key, text
    if worst is None:
        return None
    return worst.upper()


def _node_word(host: _Host, group) -> str:
    nodes = sorted({host.gpus[i].numa for i in group}, key=lambda n: (n is None, n or 0))
    return ", ".join("unknown" if n is None else str(n) for n in nodes)


def _free_by_node(host: _Host, free) -> str:
    """ "node 0: 2 free (GPUs 2-3), node 1: 0 free" """
    buckets = {}
    for i in host.order:
        buckets.setdefault(host.gpus[i].numa, [])
    for i in free:
        buckets[host.gpus[i].numa].append(i)
    parts = []
    for node in sorted(buckets, key=lambda n: (n is None, n or 0)):
        label = "NUMA node unknown" if node is None else f"node {node}"
        got = buckets[node]
        parts.append(f"{label}: {len(got)} free" + (f" (GPUs {_gpu_list(got)})" if got else ""))
    return ", ".join(parts)


class _Planner:
    def __init__(self, host: _Host, host_name, variable, reserve_mib, use_uuids, cpu_only=False):
        self.cpu_only = cpu_only
        self.host = host
        self.host_name = host_name
        self.variable = variable
        self.reserve_mib = reserve_mib
        self.use_uuids = use_uuids
        self.usable = [i for i in host.order if not host.gpus[i].mig
                       and (host.gpus[i].compute_mode or "").strip().lower() != "prohibited"]
        self._cand_cache = {}
        self._failed = set()
        self._keep = {}
        self.steps = 0

    # ----------------------------------------------------------------- parsing / validation
    def label(self, inst_pos, name=None) -> str:
        base = f"{self.variable}[{inst_pos}]"
        return f"{base} '{name}'" if name else base

    def parse(self, pos: int, raw) -> tuple[_Inst | None, list[str]]:
        problems = []
        if not isinstance(raw, dict):
            return None, [f"{self.label(pos)} must be a dict with at least a 'name', got {type(raw).__name__}"]
        name = raw.get("name")
        shown = name if isinstance(name, str) and name else None
        # the inventory position (normalise keeps it): this host's plan may leave out other hosts' instances
        where = self.label(raw["position"] if _is_int(raw.get("position")) else pos, shown)
        share = raw.get("multinode")
        if isinstance(share, dict) and "node_rank" in share:
            where += (f" (rank {share['node_rank']} of {share['nnodes']} hosts; the sizes here are this host's "
                      "share)")
        inst = _Inst(pos=pos, raw=raw, name=shown or f"#{pos}", where=where)

        def bad(msg):
            problems.append(f"{where}: {msg}")
            inst.ok = False

        self._parse_name(name, bad)
        self._parse_sizes(raw, inst, bad)
        self._parse_port(raw, inst, bad)
        self._parse_numa(raw, inst, bad)
        self._parse_model_facts(raw, inst, bad)

        gpus_raw = raw.get("gpus")
        if not _is_auto(gpus_raw) and self.cpu_only:
            bad(f"gpus is {gpus_raw!r} but this host is planned without GPUs (vllm_preflight_gpu: false); "
                "remove gpus or set vllm_preflight_gpu: true")
        elif not _is_auto(gpus_raw):
            inst.explicit = self._parse_explicit(gpus_raw, bad)

        if inst.ok and not self.cpu_only:
            self._check_model(inst, bad)
        return inst, problems

    def _parse_name(self, name, bad) -> None:
        """Check an instance's 'name' (required, a string usable in a systemd unit name)."""
        if name is None or name == "":
            bad("'name' is required (a short name such as 'chat'; the unit becomes vllm-<name>.service)")
        elif not isinstance(name, str):
            bad(f"name is {name!r}; it must be a string such as 'chat' (the unit becomes vllm-<name>.service)")
        elif not NAME_RE.match(name):
            bad(f"name '{name}' cannot be used in a systemd unit name; use lower-case letters, digits, "
                "'_', '.' and '-', starting with a letter or digit (e.g. '"
                + (re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-_.") or "chat") + "')")
        elif len(name) > 200:
            bad(f"name is {len(name)} characters long; keep it under 200 so the unit name stays valid")

    def _parse_sizes(self, raw, inst: _Inst, bad) -> None:
        """Read tensor/pipeline parallel sizes and gpu_memory_utilization into ``inst``."""
        for key in ("tensor_parallel_size", "pipeline_parallel_size"):
            value = raw.get(key, 1)
            num = _as_int(1 if value is None else value)
            if num is None or num < 1:
                bad(f"{key} is {value!r}; it must be a whole number of at least 1 "
                    "(tensor_parallel_size x pipeline_parallel_size GPUs are used)")
            else:
                setattr(inst, "tp" if key.startswith("tensor") else "pp", num)

        util_raw = raw.get("gpu_memory_utilization", 0.9)
        util = _as_float(0.9 if util_raw is None else util_raw)
        if util is None or not (0.0 < util <= 1.0) or math.isnan(util):
            bad(f"gpu_memory_utilization is {util_raw!r}; it must be a fraction in (0, 1], e.g. 0.9")
        else:
            inst.util = util

    def _parse_port(self, raw, inst: _Inst, bad) -> None:
        """Read an explicit 'port' into ``inst`` (left unset when auto)."""
        port_raw = raw.get("port")
        if not _is_auto(port_raw):
            port = _as_int(port_raw)
            if port is None or not (1 <= port <= 65535):
                bad(f"port is {port_raw!r}; use a TCP port number 1-65535, or leave it out to get one from base_port")
            else:
                inst.port = port

    def _parse_numa(self, raw, inst: _Inst, bad) -> None:
        """Read allow_cross_numa and an explicit numa_node (checked against this host's nodes) into ``inst``."""
        cross_raw = raw.get("allow_cross_numa", False)
        cross = _as_bool(False if cross_raw is None else cross_raw)
        if cross is None:
            bad(f"allow_cross_numa is {cross_raw!r}; use true or false")
        else:
            inst.allow_cross = cross

        numa_raw = raw.get("numa_node")
        if not _is_auto(numa_raw):
            numa = _as_int(numa_raw)
            nodes = self.host.nodes()
            if numa is None or numa < 0:
                bad(f"numa_node is {numa_raw!r}; use a NUMA node number or 'auto'")
            elif self.cpu_only:
                inst.numa = numa
            elif numa not in nodes:
                have = ("this host's GPUs are on NUMA node(s) " + ", ".join(map(str, nodes))) if nodes \
                    else "the GPUs' NUMA nodes are unknown on this host"
                bad(f"numa_node is {numa} but {have}; set numa_node to one of those or to 'auto'")
            else:
                inst.numa = numa

    def _parse_model_facts(self, raw, inst: _Inst, bad) -> None:
        """Read the optional model facts (attention/KV head counts, weights_bytes) into ``inst``."""
        for key, attr in (("num_attention_heads", "heads"), ("num_key_value_heads", "kv_heads")):
            value = raw.get(key)
            if value is None:
                continue
            num = _as_int(value)
            if num is None or num < 1:
                bad(f"{key} is {value!r}; use the model's config.json value (a whole number >= 1) or leave it out")
            else:
                setattr(inst, attr, num)

        wb = raw.get("weights_bytes")
        if wb is not None:
            num = _as_float(wb)
            if num is None or math.isnan(num) or num <= 0 or math.isinf(num):
                bad(f"weights_bytes is {wb!r}; use the total size of the model's safetensors in bytes, or leave it out")
            else:
                inst.weights_bytes = num

    def _parse_explicit(self, gpus_raw, bad):
        items = gpus_raw
        if isinstance(items, str):
            items = [s for s in re.split(r"[\s,]+", items.strip()) if s]
        elif _is_int(items):
            items = [items]
        if not isinstance(items, (list, tuple)) or not items:
            bad(f"gpus is {gpus_raw!r}; use 'auto' or a list of GPU indices or UUIDs, e.g. [0, 1]")
            return None
        found = []
        unknown = []
        for item in items:
            idx = _as_int(item)
            if idx is not None and idx in self.host.gpus:
                found.append(idx)
            elif isinstance(item, str) and item.strip().lower() in self.host.by_uuid:
                found.append(self.host.by_uuid[item.strip().lower()])
            else:
                unknown.append(item)
        if unknown:
            have = _gpu_list(self.host.order) if self.host.order else "no GPUs"
            bad(f"gpus names {', '.join(repr(u) for u in unknown)}, which this host does not have "
                f"(GPU indices here: {have}, or their UUIDs from nvidia-smi -L); fix the list or use gpus: auto")
            return None
        dupes = sorted({i for i in found if found.count(i) > 1})
        if dupes:
            bad(f"gpus lists GPU {_gpu_list(dupes)} more than once (an index and its UUID count as the same GPU); "
                "list each GPU once")
            return None
        for i in found:
            g = self.host.gpus[i]
            if g.mig:
                bad(f"GPU {i} has MIG mode enabled, so vLLM would see MIG slices, not the GPU; "
                    f"disable MIG (nvidia-smi -i {i} -mig 0, then reset the GPU) or choose other gpus")
                return None
            if (g.compute_mode or "").strip().lower() == "prohibited":
                bad(f"GPU {i} is in compute mode Prohibited (no CUDA process may use it); "
                    f"set it back with nvidia-smi -i {i} -c DEFAULT or choose other gpus")
                return None
        return tuple(sorted(found))

    def _check_model(self, inst: _Inst, bad):
        n = len(self.host.order)
        if inst.explicit is not None and len(inst.explicit) != inst.size:
            bad(f"gpus lists {_plural(len(inst.explicit), 'GPU')} but tensor_parallel_size {inst.tp} x "
                f"pipeline_parallel_size {inst.pp} = {inst.size}; make them agree (e.g. tensor_parallel_size: "
                f"{len(inst.explicit) // inst.pp if len(inst.explicit) % inst.pp == 0 else len(inst.explicit)})")
        elif inst.size > n and n:
            fits = _divisors(inst.heads, n) if inst.heads else None
            hint = f" (tensor_parallel_size values that fit here: {', '.join(map(str, fits))})" if fits else ""
            bad(f"tensor_parallel_size {inst.tp} x pipeline_parallel_size {inst.pp} needs {inst.size} GPUs "
                f"but this host has {_plural(n, 'GPU')}; lower tensor_parallel_size or pipeline_parallel_size{hint}")
        if inst.heads is not None and inst.heads % inst.tp:
            fits = _divisors(inst.heads, max(n, 1))
            bad(f"tensor_parallel_size {inst.tp} does not divide num_attention_heads {inst.heads}; "
                f"use one of {', '.join(map(str, fits))}")
        if inst.kv_heads is not None and inst.kv_heads % inst.tp and inst.tp % inst.kv_heads:
            fits = [d for d in range(1, max(n, 1) + 1)
                    if (inst.kv_heads % d == 0 or d % inst.kv_heads == 0)
                    and (inst.heads is None or inst.heads % d == 0)]
            bad(f"tensor_parallel_size {inst.tp} and num_key_value_heads {inst.kv_heads} do not fit: "
                "the KV heads must split evenly across the GPUs or be replicated evenly; "
                f"use tensor_parallel_size {', '.join(map(str, fits))}")
        if inst.weights_bytes is not None:
            totals = [self.host.gpus[i].total_mib for i in (inst.explicit or self.usable)]
            if totals:
                total = min(totals) if inst.explicit else max(totals)
                msg = self.weights_problem(inst, total)
                if msg:
                    bad(msg)

    def weights_problem(self, inst: _Inst, total_mib: int):
        per_gpu = inst.weights_bytes / inst.size / 2**20
        budget = inst.util * total_mib
        if per_gpu + self.reserve_mib <= budget:
            return None
        need_util = (per_gpu + self.reserve_mib) / total_mib
        fix = []
        if need_util <= SHARE_LIMIT:
            fix.append(f"raise gpu_memory_utilization to at least {math.ceil(need_util * 100) / 100:.2f}")
        room = max(total_mib * max(inst.util, 0.9) - self.reserve_mib, 1)
        need_gpus = math.ceil(inst.weights_bytes / 2**20 / room)
        n = len(self.host.order)
        sizes = [s for s in range(max(need_gpus, inst.size + 1), n + 1)
                 if (inst.heads % s == 0 if inst.heads else s & (s - 1) == 0)]
        if sizes:
            fix.append(f"spread the weights over more GPUs (e.g. tensor_parallel_size x pipeline_parallel_size = "
                       f"{sizes[0]})")
        fix.append("or use a smaller or quantized model")
        return (f"weights of {inst.weights_bytes / 2**30:.1f} GiB over {_plural(inst.size, 'GPU')} are "
                f"{per_gpu / 1024:.1f} GiB per GPU, which does not fit in gpu_memory_utilization {inst.util:g} x "
                f"{total_mib / 1024:.1f} GiB = {budget / 1024:.1f} GiB while leaving {self.reserve_mib / 1024:.1f} GiB "
                f"(reserve_mib) for the KV cache, activations and CUDA graphs; Fix: " + ", ".join(fix))

    # ----------------------------------------------------------------- explicit groups
    def check_explicit(self, insts) -> list[str]:
        problems = []
        users = {}
        for inst in insts:
            if inst.explicit is None:
                continue
            for i in inst.explicit:
                users.setdefault(i, []).append(inst)
            if inst.numa is not None:
                off = [i for i in inst.explicit if self.host.gpus[i].numa != inst.numa]
                if off:
                    on_node = [i for i in self.host.order if self.host.gpus[i].numa == inst.numa]
                    problems.append(f"{inst.where}: numa_node is {inst.numa} but gpus {_gpu_list(off)} "
                                    f"sit on NUMA node {_node_word(self.host, off)}; pick GPUs of node "
                                    f"{inst.numa} ({_gpu_list(on_node)}) or drop numa_node")
                    continue
            if not inst.allow_cross:
                pairs = _crossing_pairs(self.host, inst.explicit, inst.tp)
                if pairs:
                    pool = set(inst.explicit) | self._unused(insts)
                    nodes = self._nodes_with(pool, inst.tp)
                    if nodes:
                        fix = (f"choose gpus inside one NUMA node ({nodes}), or use gpus: auto")
                    else:
                        fix = self._fits_instead(inst, pool)
                    problems.append(f"{inst.where}: gpus {list(inst.explicit)} {self._why_cross(inst, pairs)} "
                                    f"Fix: {fix}; or set allow_cross_numa: true on this instance to accept "
                                    "the slow path")
        for i in sorted(users):
            group = users[i]
            if len(group) < 2:
                continue
            names = ", ".join(f"'{u.name}'" for u in group)
            total = sum(u.util for u in group)
            if total > SHARE_LIMIT + 1e-9:
                parts = " + ".join(f"{u.util:g}" for u in group)
                where = ", ".join(str(u.raw["position"] if _is_int(u.raw.get("position")) else u.pos) for u in group)
                problems.append(f"{self.variable}[{where}].gpu_memory_utilization: GPU {i} is shared by {names} whose "
                                "gpu_memory_utilization add up to "
                                f"{parts} = {total:.2f}, above {SHARE_LIMIT}; lower gpu_memory_utilization so they "
                                "add up to at most 0.95, or give the instances separate gpus")
            mode = (self.host.gpus[i].compute_mode or "").strip().lower()
            if mode.startswith("exclusive"):
                problems.append(f"GPU {i} is shared by {names} but is in compute mode "
                                f"{self.host.gpus[i].compute_mode} (one process per GPU); "
                                f"set nvidia-smi -i {i} -c DEFAULT or give the instances separate gpus")
        return problems

    def _nodes_with(self, pool, k) -> str:
        """ "node 0: GPUs 0-3, node 1: GPUs 4-7" for the NUMA nodes with at least k GPUs of pool."""
        buckets = {}
        for i in sorted(pool):
            buckets.setdefault(self.host.gpus[i].numa, []).append(i)
        return ", ".join(f"node {n}: GPUs {_gpu_list(m)}" for n, m in sorted(
            (kv for kv in buckets.items() if kv[0] is not None), key=lambda kv: kv[0]) if len(m) >= k)

    def _unused(self, insts) -> set:
        taken = set()
        for inst in insts:
            if inst.explicit:
                taken.update(inst.explicit)
        return set(self.usable) - taken

    # ----------------------------------------------------------------- candidates
    def _score(self, inst: _Inst, group: tuple, free: frozenset):
        host = self.host
        stages = _stages(host, group, inst.tp)
        numas = {host.gpus[i].numa for i in group}
        same_node = len(numas) == 1 and None not in numas
        pairs = list(itertools.combinations(group, 2))
        all_nv = all(host.rank[p] == _RANK_NV for p in pairs)
        stage_pairs = [p for s in stages for p in itertools.combinations(s, 2)]
        if any(host.crosses(*p) for p in stage_pairs):
            if not inst.allow_cross:
                return None
            tier = 4
        elif same_node:
            tier = 0
        elif all_nv:
            tier = 1
        elif all(len({host.gpus[i].numa for i in s}) == 1 and host.gpus[s[0]].numa is not None
                 or all(host.rank[p] == _RANK_NV for p in itertools.combinations(s, 2)) for s in stages):
            tier = 2
        else:
            tier = 3
        ranks = [host.rank[p] for p in stage_pairs]
        worst_stage = max(ranks, default=-1)
        worst_all = max((host.rank[p] for p in pairs), default=-1)
        left = sum(1 for i in free if host.gpus[i].numa in numas and i not in group)
        return (tier, worst_stage, sum(ranks), worst_all, left, group)

    def candidates(self, inst: _Inst, free: frozenset) -> list[tuple]:
        key = (inst.pos, free)
        if key in self._cand_cache:
            return self._cand_cache[key]
        pool = sorted(i for i in free if inst.numa is None or self.host.gpus[i].numa == inst.numa)
        k = inst.size
        out = []
        if len(pool) >= k:
            if math.comb(len(pool), k) <= COMBINATION_LIMIT:
                groups = itertools.combinations(pool, k)
            else:
                groups = self._grown_groups(pool, k)
            scored = [s for s in (self._score(inst, g, free) for g in groups) if s is not None]
            scored.sort()
            out = [s[-1] for s in scored]
        self._cand_cache[key] = out
        return out

    def _grown_groups(self, pool, k):
        """Deterministic greedy groups for big hosts: from every seed, add the tightest-linked GPU."""
        host = self.host
        seen = set()
        buckets = {}
        for i in pool:
            buckets.setdefault(host.gpus[i].numa, []).append(i)
        scopes = [b for b in buckets.values() if len(b) >= k] + [pool]
        for scope in scopes:
            for seed in scope:
                group = [seed]
                while len(group) < k:
                    best = min((i for i in scope if i not in group),
                               key=lambda i: (max(host.rank[(i, j)] for j in group),
                                              sum(host.rank[(i, j)] for j in group), i))
                    group.append(best)
                g = tuple(sorted(group))
                if g not in seen:
                    seen.add(g)
                    yield g

    # ----------------------------------------------------------------- search
    def place(self, insts, kept=None) -> None:
        """Give every instance without explicit ``gpus`` its group. ``kept`` (name -> GPU indices): the groups the
        host's recorded plan gave; they are kept where the rules still accept them and keeping them leaves no
        instance on a looser group than a fresh placement gives it (so adding, removing or reordering instances
        moves no instance that need not move, and a kept group never costs another instance its NUMA node)."""
        fixed = [i for i in insts if i.explicit is not None]
        auto = [i for i in insts if i.explicit is None]
        auto.sort(key=lambda i: (i.numa is None, -i.size, i.pos))
        taken = set()
        for inst in fixed:
            inst.group = inst.explicit
            taken.update(inst.explicit)
        free = frozenset(i for i in self.usable if i not in taken)
        result = self._place(auto, free)
        if result is None:
            # Report what the greedy order runs into: that is the instance the operator must change.
            self._greedy_failure(auto, free, fixed)
        # kept groups still free of what the inventory pins (explicit gpus); those instances are placed first
        keep = {i.pos: tuple(sorted(kept[i.name])) for i in auto
                if i.name in (kept or {}) and len(kept[i.name]) == i.size and set(kept[i.name]) <= free}
        if keep:
            sticky = self._place(sorted(auto, key=lambda i: i.pos not in keep), free, keep)
            if sticky is not None and self._looseness(auto, sticky, free) <= self._looseness(auto, result, free):
                result = sticky
        for inst in auto:
            inst.group = result[inst.pos]

    def _place(self, order, free, keep=None):
        """The search over ``order`` (None when it finds nothing); ``keep`` (pos -> group) is tried first."""
        self.steps = 0
        self._failed = set()
        self._keep = keep or {}
        try:
            return self._search(order, 0, free, {})
        except _Exhausted:
            return None
        finally:
            self._keep = {}

    def _looseness(self, auto, result, free):
        """How loose a placement is, to compare two: the loosest tier of any instance, then the tiers' sum."""
        tiers = [self._score(i, result[i.pos], free)[0] for i in auto]
        return (max(tiers, default=0), sum(tiers))

    def _search(self, order, n, free, chosen):
        """Depth-first over instances in placement order, candidates best first; failed states memoised."""
        if n == len(order):
            return dict(chosen)
        if (n, free) in self._failed or sum(i.size for i in order[n:]) > len(free):
            return None
        inst = order[n]
        cands = self.candidates(inst, free)
        kept = self._keep.get(inst.pos)
        if kept is not None and set(kept) <= free and self._score(inst, kept, free) is not None \
                and (inst.numa is None or all(self.host.gpus[i].numa == inst.numa for i in kept)):
            cands = [kept] + [g for g in cands if g != kept]
        for group in cands:
            self.steps += 1
            if self.steps > SEARCH_BUDGET:
                raise _Exhausted()
            chosen[inst.pos] = group
            got = self._search(order, n + 1, free - set(group), chosen)
            if got is not None:
                return got
            del chosen[inst.pos]
        self._failed.add((n, free))
        return None

    def _greedy_failure(self, order, free, fixed):
        holders = {i: inst for inst in fixed for i in inst.group}
        for inst in order:
            cands = self.candidates(inst, free)
            if not cands:
                raise PlanError([self._no_room(inst, free, holders)], self.host_name)
            for i in cands[0]:
                holders[i] = inst
            free = free - set(cands[0])
        raise PlanError(["no placement satisfies every instance together (the search gave up after "
                         f"{SEARCH_BUDGET} attempts); pin some instances with explicit gpus or numa_node"],
                        self.host_name)

    # ----------------------------------------------------------------- messages
    def _held(self, holders, skip=()) -> str:
        by = {}
        for i, inst in sorted(holders.items()):
            if i not in skip:
                by.setdefault(inst.name, []).append(i)
        mig = [i for i in self.host.order if i not in self.usable]
        parts = [f"{_gpus_word(v)} by '{k}'" for k, v in by.items()]
        if mig:
            parts.append(f"{_gpus_word(mig)} not placeable (MIG enabled or compute mode Prohibited)")
        return ("; in use: " + ", ".join(parts)) if parts else ""

    def _no_room(self, inst: _Inst, free, holders) -> str:
        k = inst.size
        need = (f"tensor_parallel_size {inst.tp} x pipeline_parallel_size {inst.pp} needs {_plural(k, 'GPU')}")
        share = ("remove or shrink another instance, or share GPUs by giving both instances explicit gpus "
                 f"whose gpu_memory_utilization add up to at most {SHARE_LIMIT}")
        if inst.numa is not None:
            on_node = [i for i in free if self.host.gpus[i].numa == inst.numa]
            if len(on_node) < k:
                return (f"{inst.where}: {need} on NUMA node {inst.numa} (numa_node: {inst.numa}) but only "
                        f"{len(on_node)} are free there ({_free_by_node(self.host, free)}{self._held(holders)}); "
                        f"Fix: set numa_node to a node with {k} free GPUs or to 'auto', lower "
                        f"tensor_parallel_size, or {share}")
        if len(free) < k:
            return (f"{inst.where}: {need} but only {len(free)} of the host's "
                    f"{_plural(len(self.host.order), 'GPU')} are free ({_free_by_node(self.host, free)}"
                    f"{self._held(holders)}); Fix: lower tensor_parallel_size or pipeline_parallel_size, or {share}")
        pool = [i for i in free if inst.numa is None or self.host.gpus[i].numa == inst.numa]
        # Enough GPUs, but every group of k has a tensor-parallel stage over SYS.
        return (f"{inst.where}: {need}, and no {k} free GPUs share a NUMA node or an NVLink-connected set: "
                f"{self._why_cross(inst, [], free=free)} What would fit instead: "
                f"{self._fits_instead(inst, set(pool))}; or set allow_cross_numa: true on this instance to accept "
                "the slow path")

    def _why_cross(self, inst: _Inst, pairs, free=None) -> str:
        """Why a group over SYS is refused. ``free``: describe the free GPUs per node instead of pairs."""
        host = self.host
        why = ("Tensor parallelism runs an all-reduce in every layer, and over the inter-socket link that "
               "all-reduce caps throughput, often below a smaller group on one node.")
        if free is not None:
            by_node = {}
            for i in free:
                by_node.setdefault(host.gpus[i].numa, set()).add(i)
            sides = [f"{_gpu_list(v)} (NUMA node {'unknown' if n is None else n})"
                     for n, v in sorted(by_node.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]
            if len(by_node) > 1 and None not in by_node:
                return (f"the free GPUs {' and '.join(sides)} are joined only by SYS links "
                        f"(PCIe across the inter-socket link). {why}")
            return (f"every such group of the free GPUs {', '.join(sides)} has members joined by SYS links "
                    f"(PCIe across the inter-socket link). {why}")
        shown = ", ".join(f"{a} (node {_node_word(host, [a])}) and {b} (node {_node_word(host, [b])})"
                          for a, b in pairs[:3]) + (", ..." if len(pairs) > 3 else "")
        return (f"put GPUs {shown} into one tensor-parallel group over SYS links "
                f"(PCIe across the inter-socket link). {why}")

    def _fits_instead(self, inst: _Inst, pool: set) -> str:
        """Name the largest group that fits without SYS, and where; plus a pipeline-parallel split."""
        host = self.host
        pool = sorted(pool)
        k = inst.size
        buckets = {}
        for i in pool:
            buckets.setdefault(host.gpus[i].numa, []).append(i)

        def ok_size(s):
            if inst.heads is not None:
                return inst.heads % s == 0
            return s & (s - 1) == 0  # without the model's head count, suggest powers of two

        def label(s):
            return f"TP={s}" if inst.pp == 1 else f"{s} GPUs (tensor_parallel_size x pipeline_parallel_size)"

        options = []
        best = 0
        for s in range(k - 1, 0, -1):
            if not ok_size(s):
                continue
            where = [f"node {node} (GPUs {_gpu_list(members)})"
                     for node, members in sorted((kv for kv in buckets.items() if kv[0] is not None),
                                                 key=lambda kv: kv[0])
                     if len(members) >= s]
            if where:
                options.append(f"{label(s)} on NUMA " + " or ".join(where))
            else:
                for g in itertools.islice(itertools.combinations(pool, s), COMBINATION_LIMIT):
                    pairs = list(itertools.combinations(g, 2))
                    if pairs and all(host.rank[p] == _RANK_NV for p in pairs):
                        options.append(f"{label(s)} on the NVLink-connected GPUs {_gpu_list(g)}")
                        break
                    if not any(host.crosses(*p) for p in pairs):
                        options.append(f"{label(s)} on GPUs {_gpu_list(g)}")
                        break
            if options:
                best = s
                break
        if best > 1 and inst.pp == 1 and k % best == 0:
            stages = k // best
            slots = sum(len(m) // best for n, m in buckets.items() if n is not None)
            if slots >= stages:
                options.append(f"tensor_parallel_size: {best} with pipeline_parallel_size: {stages} "
                               "(pipeline stages on separate NUMA nodes exchange only activations)")
        if not options:
            return "no smaller group either; free GPUs first"
        return "; or ".join(options)


class _Exhausted(Exception):
    pass


# --------------------------------------------------------------------------- public API

def kept_slots(slots, key, base=None, stride=None):
    """Name -> what the host's recorded plan gave each instance automatically (its ``slots``, as ``gpu_facts`` read
    them from the plan file): ``key`` is ``port``, ``vllm_port`` or ``gpu_uuids``. Ports are kept while the rule
    that gave them holds: the same ``base`` (and ``stride`` for ``vllm_port``). Anything unreadable keeps nothing:
    the plan works them out afresh."""
    if not isinstance(slots, dict) or not isinstance(slots.get("auto"), dict):
        return {}
    rule = {"port": ("base_port",), "vllm_port": ("vllm_port_base", "vllm_port_stride"), "gpu_uuids": ()}[key]
    if [_as_int(slots.get(k)) for k in rule] != [_as_int(v) for v in (base, stride)[:len(rule)]]:
        return {}
    out = {}
    for name, given in slots["auto"].items():
        value = given.get(key) if isinstance(given, dict) else None
        if not isinstance(name, str):
            continue
        if key == "gpu_uuids":
            if isinstance(value, list) and value and all(isinstance(u, str) for u in value):
                out[name] = list(value)
        elif _is_int(value) and not isinstance(value, bool):
            out[name] = int(value)
    return out


def assign_ports(ports, base_port, names=None, kept=None):
    """The HTTP port of each instance: its own (``ports[i]``) or, for None, the port the host's recorded plan gave
    the instance of that name (``kept``: name -> port, ``kept_slots``) while no other instance holds it, else the
    next port from ``base_port`` that no instance took; None where none is left. So an instance keeps its port when
    others are added, removed or reordered. The one rule, read by the plan of the host and by the routers of other
    hosts (``router.py``), which need the port of every instance they route to."""
    out = list(ports)
    used = {p for p in ports if p is not None}
    for i, port in enumerate(ports):
        held = (kept or {}).get(names[i]) if names and port is None else None
        if held is not None and base_port <= held <= 65535 and held not in used:
            out[i] = held
            used.add(held)
    next_port = base_port
    for i, port in enumerate(out):
        if port is None:
            while next_port in used:
                next_port += 1
            out[i] = next_port if next_port <= 65535 else None
            used.add(next_port)
            next_port += 1
    return out


def plan(gpus, instances, links=None, *, host=None, variable="vllm_instances",
         reserve_mib=DEFAULT_RESERVE_MIB, tolerance_mib=DEFAULT_TOLERANCE_MIB, unit_prefix="vllm-",
         use_uuids=True, base_port=8000, cpu_only=False, memory_base=MEMORY_BASE, kept_ports=None,
         kept_gpus=None) -> list[dict]:
    """Return the placement plan (one dict per instance, input order) or raise PlanError.

    ``cpu_only``: plan a host without GPUs (``vllm_preflight_gpu: false``) through the same checks
    (names, ports, sizes); every instance gets no GPUs, no CPU set and no footprint expectation.
    ``memory_base``: what ``gpu_memory_utilization`` is a fraction of when the weights' fit is
    checked (the same base ``gpu_footprint`` applies; see module_utils/nvidia_smi.py).
    ``kept_ports``: name -> the automatic port the host's recorded plan gave it (``kept_slots``); an instance left
    without ``port`` keeps it while it is free (``assign_ports``). ``kept_gpus``: name -> the UUIDs of the GPUs the
    recorded plan gave an instance without explicit ``gpus`` (``kept_slots``); kept where the rules still accept
    them (``_Planner.place``).
    """
    host_name = str(host) if host not in (None, "") else None
    for key, value, lo in (("reserve_mib", reserve_mib, 0), ("tolerance_mib", tolerance_mib, 0),
                           ("base_port", base_port, 1)):
        if _as_int(value) is None or _as_int(value) < lo or (key == "base_port" and _as_int(value) > 65535):
            raise PlanError([f"option {key} is {value!r}; use a whole number >= {lo}"], host_name)
    reserve_mib, tolerance_mib, base_port = _as_int(reserve_mib), _as_int(tolerance_mib), _as_int(base_port)
    if not isinstance(unit_prefix, str) or not re.fullmatch(r"[a-zA-Z0-9_.@:-]*", unit_prefix):
        raise PlanError([f"option unit_prefix is {unit_prefix!r}; use characters valid in a systemd unit name"],
                        host_name)
    use_uuids = bool(use_uuids)
    if instances is None:
        instances = []
    if not isinstance(instances, (list, tuple)):
        raise PlanError([f"{variable} must be a list of instances (dicts with at least a 'name'), "
                         f"got {type(instances).__name__}"], host_name)
    hostm = _build_host([] if cpu_only else gpus, links, host_name, memory_base)
    if not instances:
        return []
    planner = _Planner(hostm, host_name, variable, reserve_mib, use_uuids, cpu_only)

    problems = []
    insts = []
    for pos, raw in enumerate(instances):
        inst, probs = planner.parse(pos, raw)
        problems.extend(probs)
        if inst is not None:
            insts.append(inst)
    if not hostm.order and not cpu_only:
        problems.append(f"{variable} asks for {_plural(len(instances), 'instance')} but this host has no GPUs "
                        "(ansible_facts.gpus is empty); check the driver with nvidia-smi or remove the instances")

    names = {}
    for inst in insts:
        if isinstance(inst.raw.get("name"), str):
            names.setdefault(inst.raw["name"], []).append(inst.pos)
    for name, where in names.items():
        if len(where) > 1:
            problems.append(f"{variable}[{', '.join(map(str, where))}]: name '{name}' is used {len(where)} times; "
                            "instance names must be unique (each becomes its own systemd unit)")
    ports = {}
    for inst in insts:
        if inst.port is not None:
            ports.setdefault(inst.port, []).append(inst)
    for port, users in ports.items():
        if len(users) > 1:
            problems.append(f"{variable}[{', '.join(str(u.pos) for u in users)}]: port {port} is given to "
                            f"{', '.join(repr(u.name) for u in users)}; give each instance its own port "
                            "or leave port out to get one from base_port")
    if problems:
        raise PlanError(problems, host_name)
    problems = planner.check_explicit(insts)
    if problems:
        raise PlanError(problems, host_name)

    if not cpu_only:
        kept = {name: [hostm.by_uuid[str(u).lower()] for u in uuids] for name, uuids in (kept_gpus or {}).items()
                if isinstance(uuids, list) and uuids and all(str(u).lower() in hostm.by_uuid for u in uuids)}
        planner.place(insts, kept)

    problems = []
    for inst in insts:
        if inst.explicit is None and inst.weights_bytes is not None and inst.group:  # no GPUs: nothing to fit in
            msg = planner.weights_problem(inst, min(hostm.gpus[i].total_mib for i in inst.group))
            if msg:
                problems.append(f"{inst.where}: {msg}")
    if problems:
        raise PlanError(problems, host_name)

    ports = assign_ports([inst.port for inst in insts], base_port, [inst.name for inst in insts], kept_ports)
    for inst, port in zip(insts, ports):
        if port is None:
            raise PlanError([f"{inst.where}: no free port left above base_port {base_port}; "
                             "set port on the instances or lower base_port"], host_name)
        inst.port = port

    return [_entry(hostm, inst, unit_prefix, use_uuids, tolerance_mib, cpu_only) for inst in insts]


def _entry(host: _Host, inst: _Inst, unit_prefix, use_uuids, tolerance_mib, cpu_only=False) -> dict:
    group = tuple(sorted(inst.group))
    rank_order = group if inst.pp == 1 else tuple(i for s in _stages(host, group, inst.tp) for i in s)
    numas = {host.gpus[i].numa for i in group}
    numa = numas.pop() if len(numas) == 1 else None
    if cpu_only:
        numa = inst.numa
    cpus = sorted({c for i in group for c in host.gpus[i].cpus})
    unit = f"{unit_prefix}{inst.name}.service"
    out = {
        "name": inst.name,
        "gpus": list(group),
        "gpu_uuids": [host.gpus[i].uuid for i in group],
        "cuda_visible_devices": ",".join(host.gpus[i].uuid if use_uuids else str(i) for i in rank_order),
        "cuda_device_order": "PCI_BUS_ID",
        "numa_node": numa,
        "cpus": cpus,
        "cpus_str": compress_ints(cpus),
        "tensor_parallel_size": inst.tp,
        "pipeline_parallel_size": inst.pp,
        "port": inst.port,
        "gpu_memory_utilization": inst.util,
        "link": _worst_link(host, group),
        "unit": unit,
        "expected": [] if cpu_only else [{
            "name": inst.name,
            "gpus": list(group),
            "used_fraction": inst.util,
            "tolerance_mib": tolerance_mib,
            "unit": unit,
        }],
    }
    if cpu_only:
        out["gpu_memory_utilization"] = None
    for key, value in inst.raw.items():
        if key not in out:
            out[key] = value
    return out


def format_table(plan_entries, gpus=None) -> str:
    """Fixed-width table of a plan: instance, GPUs, NUMA node, CPUs, TP x PP, port, link, GiB per GPU.

    With multi-node instances two more columns: RANK (``0/2 api``, ``1/2 headless``) and HOSTS (rank order).
    TP x PP of a multi-node instance is the whole instance's; GPUS are this host's share.
    """
    totals = {}
    for g in gpus or []:
        if isinstance(g, dict) and _is_int(g.get("index")) and _is_int(g.get("memory_total_mib")):
            # the base gpu_memory_utilization applies to (memory.total - memory.reserved)
            totals[g["index"]] = usable_mib(g) if _is_int(g.get("memory_reserved_mib")) else g["memory_total_mib"]
    header = ("INSTANCE", "GPUS", "NUMA", "CPUS", "TP x PP", "PORT", "LINK", "GiB/GPU")
    # multi-node instances (plan entries with ``multinode``) add the rank and the hosts, rank order
    spans = any(isinstance(e, dict) and e.get("multinode") for e in plan_entries or [])
    if spans:
        header += ("RANK", "HOSTS")
    rows = [header]
    for e in plan_entries or []:
        util = float(e.get("gpu_memory_utilization") or 0)
        mems = [totals[i] for i in e.get("gpus", []) if i in totals]
        if mems:
            lo, hi = min(mems) * util / 1024, max(mems) * util / 1024
            gib = f"{lo:.1f}" if abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f}"
            gib += f" ({util:g})"
        else:
            gib = f"{util:g} x total"
        numa = e.get("numa_node")
        rows.append((
            str(e.get("name", "")),
            compress_ints(e.get("gpus", [])) or "-",
            "-" if numa is None else str(numa),
            e.get("cpus_str") or compress_ints(e.get("cpus", [])) or "-",
            f"{e.get('tensor_parallel_size', 1)} x {e.get('pipeline_parallel_size', 1)}",
            str(e.get("port", "")),
            e.get("link") or "-",
            gib,
        ))
        if spans:
            mn = e.get("multinode")
            if mn and mn.get("headless"):
                rows[-1] = rows[-1][:5] + ("-",) + rows[-1][6:]  # a headless rank serves no API
            rows[-1] += table_cells(mn)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
