# Apache License 2.0 (see LICENSE)
"""Instances that span several hosts (controller side, pure Python, no Ansible imports).

vLLM serves one model across hosts with its own launcher: every rank runs the same command with
``--nnodes N --node-rank R --master-addr <rank-0 address> --master-port P
--distributed-executor-backend mp``; rank 0 serves the API, ranks > 0 run headless
(``python -m vllm.entrypoints.cli.main serve --model ... --headless``: the ``openai.api_server``
entry point ignores ``--headless``). See ``docs/multinode.md``.

An instance spans hosts when it names them in ``nodes`` (a list of inventory host names, rank 0
first, or ``{group: <name>, count: N}``: the first N hosts of the group in the group's own order,
``groups[<name>]``). The plan
of every host stays per host; this module adds the fleet view the planner needs to decide one host's
share of a multi-node instance:

* ``key_problems(rec, where)``: the new instance keys (``nodes``, ``nodes_parallel``, ``master_port``),
  checked by the one normalisation (``inventory.normalise``).
* ``resolve(records, models, host, fleet, opts)``: for each instance with ``nodes``, its hosts in rank
  order, the checks across the ranks (every problem names the host, the instance, the variable and the
  fix) and, on the hosts it spans, a record with this host's share (``tensor_parallel_size`` /
  ``pipeline_parallel_size`` per host, so placement picks a GPU set on this host exactly as for a
  single-host instance) and a ``multinode`` dict. Instances that do not name this host are dropped.
* ``flags(mn)``, ``environment(mn)``: the launcher flags and the environment of one rank.
* ``port_problems(instances, stride)``: the master port against this host's other ports.
* ``table_cells(mn)``: the plan table's RANK and HOSTS cells.
* ``group_key(mn, name)``, ``rank_groups(reports)``: the ranks of each multi-node instance as the hosts
  report their units (queued, active, since when), judged together: which groups the service role
  restarts as one (stop all, start the headless ranks, then rank 0 behind the gate) and which are
  broken (verify fails naming the rank).

How the model is split (``nodes_parallel``):

* ``pipeline`` (default): ``pipeline_parallel_size`` spans the hosts, ``tensor_parallel_size`` is the
  GPUs of one stage and stays inside one host. ``pipeline_parallel_size`` must be a multiple of the
  number of hosts; each host holds ``pipeline_parallel_size / nnodes`` whole stages, i.e.
  ``tensor_parallel_size x pipeline_parallel_size / nnodes`` GPUs (vLLM numbers ranks TP-innermost, so
  the ranks of node R are exactly its stages).
* ``tensor``: ``tensor_parallel_size`` spans the hosts (``pipeline_parallel_size`` must be 1), each host
  holds ``tensor_parallel_size / nnodes`` GPUs of the one group. Every layer then all-reduces over the
  network, so it is refused unless ``vllm_service_fast_interconnect`` is true on every rank.

The fleet view (``fleet``, built from hostvars by the preflight role): inventory host name -> dict

* ``in_play`` (bool, default true): the host is one of the play's hosts;
* ``groups`` (list): the host's groups (``group_names``), for ``nodes: {group: ..., count: ...}``;
* ``group_positions`` (dict, optional): group -> the host's position in ``groups[group]``, so
  ``{group, count}`` takes the group's first hosts in the group's order (without it: the fleet view's order);
* ``addresses`` (dict): interface name -> ``{address, prefix}`` (or ``"10.0.0.5/24"``, or a list of
  either), the host's addresses as the facts step read them;
* ``interface`` (str): that host's ``vllm_service_network_interface``;
* ``gpu_count`` (int): GPUs the host shows (``ansible_facts.gpus | length``);
* ``models_dir`` (str): that host's ``vllm_install_models_dir``;
* ``fast_interconnect`` (bool): that host's ``vllm_service_fast_interconnect``;
* ``instances`` (list, optional): that host's ``vllm_instances``, to check that every rank declares the
  instance with the same model and the same per-host GPU count;
* ``models`` (dict, optional): that host's ``vllm_models``, to check that every rank serves the same
  model (repository, revision, path).
"""
from __future__ import annotations

import ipaddress

from ansible_collections.inferops.vllm.plugins.plugin_utils.schema import DEFAULT_MASTER_PORT as _SCHEMA_MASTER_PORT
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import (
    as_bool as _as_bool,
    as_int as _as_int,
    is_int as _is_int,
    suggest,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.schema import snapshot_dirs

__all__ = ["NODES_PARALLEL", "CLI_MODULE", "DEFAULT_MASTER_PORT", "MULTINODE_FLAGS", "SOCKET_ENV",
           "key_problems", "resolve", "restore", "flags", "environment", "port_problems", "table_cells",
           "group_key", "rank_groups", "interface_ips", "planned_on", "serves_api_on"]

#: How the ranks split the model: ``pipeline`` (PP across hosts) or ``tensor`` (TP across hosts).
NODES_PARALLEL = ("pipeline", "tensor")
#: The module headless ranks run (``serve ... --headless``); the API server module ignores ``--headless``.
CLI_MODULE = "vllm.entrypoints.cli.main"
#: vLLM's own default ``--master-port``.
DEFAULT_MASTER_PORT = _SCHEMA_MASTER_PORT
#: Flags the plan sets for a multi-node instance, canonical name -> where to set it instead. They are
#: refused on every instance; ``--distributed-executor-backend`` only on multi-node ones (the plan sets
#: ``mp`` there; a single-host instance may choose its own backend).
MULTINODE_FLAGS = {
    "nnodes": "nodes of the instance (the number of hosts it names)",
    "node-rank": "nodes of the instance (a host's position in it)",
    "master-addr": "vllm_service_network_interface of the first host in nodes",
    "master-port": "master_port of the instance",
    "headless": "nodes of the instance (every host after the first runs headless)",
}
#: Environment the plan sets for a multi-node rank from ``vllm_service_network_interface``.
SOCKET_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_IFACE_VAR = "vllm_service_network_interface"


def _label(rec) -> str:
    return f"vllm_instances[{rec.get('position', 0)}] ({rec['name']})"


# --------------------------------------------------------------------------- the keys

def key_problems(rec, where) -> list:
    """Problems with the keys ``nodes``, ``nodes_parallel``, ``master_port`` of one typed record."""
    problems = []
    nodes = rec.get("nodes")
    if nodes is not None:
        if isinstance(nodes, dict):
            unknown = sorted((k for k in nodes if k not in ("group", "count")), key=str)
            group, count = nodes.get("group"), nodes.get("count")
            if unknown:
                problems += [f"{where}.nodes has an unknown key {str(k)!r} (its keys are group and count)"
                             + suggest(k, ("group", "count")) for k in unknown]
            elif not isinstance(group, str) or not group or not _is_int(count) or count < 1:
                problems.append(f"{where}.nodes is {nodes!r}; give a group and how many of its hosts, e.g. "
                                "{group: gpu_nodes, count: 2}, or a list of inventory host names (rank 0 first)")
        elif isinstance(nodes, list):
            if not nodes or not all(isinstance(n, str) and n for n in nodes):
                problems.append(f"{where}.nodes is {nodes!r}; list inventory host names (rank 0 first), "
                                "e.g. [gpu-1, gpu-2]")
            else:
                dupes = sorted({n for n in nodes if nodes.count(n) > 1})
                if dupes:
                    problems.append(f"{where}.nodes names {', '.join(dupes)} more than once; list each host once")
        else:
            problems.append(f"{where}.nodes is {nodes!r}; use a list of inventory host names (rank 0 first) or "
                            "{group: <name>, count: N}")
    mode = rec.get("nodes_parallel")
    if mode is not None and mode not in NODES_PARALLEL:
        problems.append(f"{where}.nodes_parallel is {mode!r}; use 'pipeline' (pipeline_parallel_size across hosts) "
                        "or 'tensor' (tensor_parallel_size across hosts, fast interconnect only)")
    port = rec.get("master_port")
    if port is not None and not 1024 <= port <= 65535:
        problems.append(f"{where}.master_port is {port!r}; use a TCP port number 1024-65535 (default "
                        f"{DEFAULT_MASTER_PORT})")
    return problems


# --------------------------------------------------------------------------- the fleet view

def _fleet_problems(fleet) -> list:
    if not isinstance(fleet, dict):
        return [f"the fleet view must be a dict of inventory host -> facts (groups, addresses, interface, "
                f"gpu_count, models_dir), got {type(fleet).__name__}; the preflight role builds it from hostvars"]
    bad = sorted(str(h) for h, v in fleet.items() if not isinstance(v, dict))
    if bad:
        return [f"the fleet view's entries of {', '.join(bad)} are not dicts; the preflight role builds them "
                "from hostvars"]
    return []


def _in_play(entry) -> bool:
    flag = _as_bool(entry.get("in_play", True))
    return True if flag is None else flag


def _group_position(entry, group):
    """Where a host stands in ``groups[group]`` (the fleet view's ``group_positions``); unknown: last."""
    positions = entry.get("group_positions")
    pos = positions.get(group) if isinstance(positions, dict) else None
    return pos if _is_int(pos) else float("inf")


def _hosts(rec, fleet, where, play=True):
    """The instance's hosts in rank order, or (None, problems). ``play``: false leaves out whether they are in
    this play (the instance spans them all the same)."""
    nodes = rec["nodes"]
    if isinstance(nodes, dict):
        group, count = nodes["group"], nodes["count"]
        # the group's own order (groups[group]), not the inventory's: a canary listed first elsewhere stays where
        # the group puts it
        members = sorted((h for h, v in fleet.items() if group in (v.get("groups") or [])),
                         key=lambda h: _group_position(fleet[h], group))
        if len(members) < count:
            have = f"{len(members)} ({', '.join(members)})" if members else "none"
            return None, [f"{where}.nodes asks for {count} hosts of group '{group}' but the inventory has "
                          f"{have}; add hosts to the group or lower count"]
        hosts = members[:count]
    else:
        hosts = list(nodes)
    problems = []
    for pos, name in enumerate(hosts):
        if name not in fleet:
            problems.append(f"{where}.nodes names '{name}' (rank {pos}), which is not in the inventory; "
                            "fix the host name or add the host")
        elif play and not _in_play(fleet[name]):
            problems.append(f"{where}.nodes names '{name}' (rank {pos}), which is not in this play (--limit?); "
                            "every rank must be planned together: run the play on all of "
                            f"{', '.join(hosts)}")
    if len(hosts) == 1 and not problems:
        problems.append(f"{where}.nodes names one host ({hosts[0]}); a multi-node instance needs at least 2: "
                        f"drop nodes to serve it as a single-host instance on {hosts[0]}")
    return (None, problems) if problems else (hosts, [])


def _span(nodes, fleet):
    """The hosts (rank order) of an instance whose raw ``nodes`` is this, as the plans of its hosts resolve them
    (``_hosts``), in this play or not: which hosts an instance spans does not depend on ``--limit``. None: no
    ``nodes`` (a single-host instance), a malformed one, or one that does not resolve (the plans refuse it)."""
    if not isinstance(nodes, (dict, list)) or (isinstance(nodes, dict) and not {"group", "count"} <= set(nodes)):
        return None
    hosts, problems = _hosts({"nodes": nodes}, fleet, "nodes", play=False)
    return None if problems else hosts


def planned_on(nodes, host, fleet):
    """Whether ``host``'s own plan keeps an instance whose (raw) ``nodes`` is this: a single-host instance (no
    ``nodes``) always; one that spans hosts when ``host`` is among its hosts (``resolve`` drops it elsewhere). Nodes
    that cannot be resolved count as kept: that host's own plan refuses them, naming why. The routers read it for a
    host that is not planned in the run (``router.inventory_endpoints``): the hosts planned read their plans."""
    if nodes is None or nodes == "":
        return True
    hosts = _span(nodes, fleet)
    return hosts is None or host in hosts


def serves_api_on(nodes, host, fleet):
    """Whether ``host`` is rank 0 (the API server) of an instance that spans hosts whose (raw) ``nodes`` is this: the
    first of its hosts (``_span``). False for a single-host instance and for nodes that cannot be resolved (that
    host's own plan refuses them). The routers list such an instance once, at this host (``router.py``)."""
    hosts = _span(nodes, fleet)
    return hosts is not None and hosts[0] == host


def interface_ips(entry, iface):
    """ip_interface objects of one interface of a fleet entry (None: the interface has none); the routers read
    it too (``router.py``)."""
    table = entry.get("addresses") or {}
    if not isinstance(table, dict):
        return None
    raw = table.get(iface)
    if raw is None:
        return None
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for item in items:
        if isinstance(item, dict):
            addr, prefix = item.get("address"), item.get("prefix")
            text = f"{addr}/{prefix}" if prefix not in (None, "") else str(addr)
        else:
            text = str(item)
        try:
            out.append(ipaddress.ip_interface(text))
        except ValueError:
            continue
    return out or None


def _sharing(entry, other) -> list:
    """Interfaces of a fleet entry with an address on ``other``'s network: 'eth1 (10.0.0.6/24)'."""
    found = []
    for name in sorted((entry.get("addresses") or {}) if isinstance(entry.get("addresses"), dict) else {}):
        for addr in interface_ips(entry, name) or []:
            if other is not None and addr.version == other.version and other.ip in addr.network \
                    and addr.ip in other.network:
                found.append(f"{name} ({addr.with_prefixlen})")
    return found


def _rank_addresses(rec, hosts, host, fleet, opts, where):
    """One address per rank (the first on its interface sharing rank 0's network), or (None, problems)."""
    problems = []
    picked = {}
    ifaces = {}
    for pos, name in enumerate(hosts):
        entry = fleet[name]
        iface = opts.get("network_interface") if name == host else entry.get("interface")
        if not iface:
            ifaces[name] = None
            continue
        ifaces[name] = iface
        addrs = interface_ips(entry, iface)
        if not addrs:
            known = sorted(entry.get("addresses") or {}) if isinstance(entry.get("addresses"), dict) else []
            problems.append(f"host {name} (rank {pos} of {where}): {_IFACE_VAR} is '{iface}' but that interface has "
                            f"no address on the host (interfaces with an address: {', '.join(known) or 'none'}); "
                            "set it to the interface on the network the ranks share")
            continue
        picked[name] = addrs
    first = picked.get(hosts[0], [None])[0]
    for pos, name in enumerate(hosts):
        if ifaces[name] is None:
            hint = _sharing(fleet[name], first) if name != hosts[0] else []
            problems.append(f"host {name} (rank {pos} of {where}): {_IFACE_VAR} is not set; without it the ranks "
                            "fall back to loopback and never connect; set it (in host_vars) to the interface on "
                            "the network the ranks share" + (f", e.g. {hint[0].split(' ')[0]}" if hint else ""))
    if problems:
        return None, problems
    chosen = {hosts[0]: first}
    for pos, name in enumerate(hosts[1:], start=1):
        match = [a for a in picked[name] if a.version == first.version and first.ip in a.network
                 and a.ip in first.network]
        if not match:
            have = ", ".join(a.with_prefixlen for a in picked[name])
            hint = _sharing(fleet[name], first)
            problems.append(
                f"{where}: no rank-0 address on a network every rank shares: rank 0 ({hosts[0]}) is "
                f"{first.with_prefixlen} on {ifaces[hosts[0]]}, rank {pos} ({name}) has {have} on {ifaces[name]}; "
                f"set {_IFACE_VAR} on {name} to an interface on {first.network}"
                + (f" (it has {', '.join(hint)})" if hint else "")
                + " or put the ranks on one network")
            continue
        chosen[name] = match[0]
    seen = {}
    for name, addr in chosen.items():
        if addr.ip in seen:
            problems.append(f"{where}: hosts {seen[addr.ip]} and {name} both have the address {addr.ip} on their "
                            f"{_IFACE_VAR}; each rank needs its own address")
        seen.setdefault(addr.ip, name)
    if problems:
        return None, problems
    return {name: (ifaces[name], chosen[name]) for name in hosts}, []


def _model_path(models_dir, model):
    if model.get("path"):
        return model["path"]
    if isinstance(model.get("repo_id"), str):
        try:
            return snapshot_dirs(models_dir, model["repo_id"])["current"]
        except ValueError:
            return None
    return None


def _same_definition(rec, size_here, hosts, host, fleet, models, opts, where):
    """Every rank declares the instance alike: model, path, per-host GPU count, GPUs it has."""
    problems = []
    model = models[rec["model"]]
    path_here = _model_path(opts["models_dir"], model)
    for pos, name in enumerate(hosts):
        if name == host:
            continue
        entry = fleet[name]
        count = entry.get("gpu_count")
        if opts.get("gpu", True) and _is_int(count) and count < size_here:
            problems.append(f"host {name} (rank {pos} of {where}) has {count} GPUs but every rank of this instance "
                            f"needs {size_here} (tensor_parallel_size x pipeline_parallel_size / nodes); unequal "
                            "hosts cannot share one instance: choose hosts with enough GPUs in nodes or lower the "
                            "sizes")
        models_dir = entry.get("models_dir") or opts["default_models_dir"]
        theirs = model
        if isinstance(entry.get("models"), dict) and isinstance(entry["models"].get(rec["model"]), dict):
            theirs = entry["models"][rec["model"]]
            for key in ("repo_id", "revision", "path"):
                if theirs.get(key) != model.get(key):
                    problems.append(f"host {name} (rank {pos} of {where}): vllm_models.{rec['model']}.{key} is "
                                    f"{theirs.get(key)!r} there but {model.get(key)!r} here; every rank must serve "
                                    "the same model: define vllm_models once for all of nodes (group_vars)")
        path_there = _model_path(models_dir, theirs)
        if path_there != path_here:
            problems.append(f"host {name} (rank {pos} of {where}): the model path is {path_there} there but "
                            f"{path_here} here (vllm_install_models_dir differs); every rank loads the same path: "
                            "set vllm_install_models_dir alike on all of nodes")
        theirs_list = entry.get("instances")
        if isinstance(theirs_list, list):
            other = next((i for i in theirs_list if isinstance(i, dict) and i.get("name") == rec["name"]), None)
            if other is None:
                problems.append(f"host {name} (rank {pos} of {where}): its vllm_instances has no instance "
                                f"'{rec['name']}'; every rank must declare it alike: define it in the group_vars of "
                                "a group that holds all of nodes")
                continue
            size_there = _share(other, len(hosts))
            if size_there is not None and size_there != size_here:
                problems.append(f"host {name} (rank {pos} of {where}): unequal per-host GPU counts: its "
                                f"definition gives {size_there} GPUs per host, this host's gives {size_here}; "
                                "tensor_parallel_size, pipeline_parallel_size and nodes_parallel must be the same "
                                "on every rank (define the instance once, in a group holding all of nodes)")
            for key, default in (("model", None), ("nodes", None), ("master_port", DEFAULT_MASTER_PORT),
                                 ("nodes_parallel", "pipeline")):
                mine = rec.get(key)
                there = other.get(key, default)
                there = default if there is None else there
                if key == "master_port":
                    there = _as_int(there)
                if there != mine:
                    problems.append(f"host {name} (rank {pos} of {where}): {key} is {there!r} there but {mine!r} "
                                    "here; define the instance once, in a group holding all of nodes")
    return problems


def _share(raw, nnodes):
    """GPUs one host gives to an instance declared as ``raw`` (None: sizes unusable)."""
    tp = _as_int(raw.get("tensor_parallel_size", 1) or 1)
    pp = _as_int(raw.get("pipeline_parallel_size", 1) or 1)
    if tp is None or pp is None or nnodes < 1 or (tp * pp) % nnodes:
        return None
    return tp * pp // nnodes


# --------------------------------------------------------------------------- resolve

def _pipeline_split(rec, n, where):
    """This host's ``(tp, pp)`` when pipeline stages span ``n`` hosts, and the problems: ``(local, problems)``."""
    problems = []
    tp, pp = rec["tensor_parallel_size"], rec["pipeline_parallel_size"]
    if pp % n:
        problems.append(f"{where}: nodes_parallel is 'pipeline' over {n} hosts, so pipeline_parallel_size "
                        f"({pp}) must be a multiple of {n} (whole stages per host); set "
                        f"pipeline_parallel_size: {n} (one stage of tensor_parallel_size {tp} GPUs per host)")
    return (tp, pp // n if pp % n == 0 else pp), problems


def _tensor_split(rec, hosts, host, fleet, opts, where):
    """This host's ``(tp, pp)`` when one tensor-parallel group spans the hosts, and the problems: ``(local, problems)``."""
    problems = []
    n = len(hosts)
    tp, pp = rec["tensor_parallel_size"], rec["pipeline_parallel_size"]
    slow = [h for h in hosts if not _as_bool(opts.get("fast_interconnect") if h == host
                                             else fleet[h].get("fast_interconnect", False))]
    if slow:
        problems.append(f"{where}: nodes_parallel is 'tensor' (tensor_parallel_size across hosts: an "
                        "all-reduce over the network in every layer) but vllm_service_fast_interconnect is "
                        f"not true on {', '.join(slow)}; use nodes_parallel: pipeline, or set "
                        "vllm_service_fast_interconnect: true where the hosts share a fast fabric "
                        "(InfiniBand, RoCE)")
    if pp != 1:
        problems.append(f"{where}: nodes_parallel 'tensor' spreads one tensor-parallel group over the hosts; "
                        f"pipeline_parallel_size must be 1 (it is {pp}): use nodes_parallel: pipeline for "
                        "pipeline stages across hosts")
    if tp % n:
        problems.append(f"{where}: nodes_parallel is 'tensor' over {n} hosts, so tensor_parallel_size ({tp}) "
                        f"must be a multiple of {n}; set tensor_parallel_size: {n * max(tp // n, 1)}")
    heads, kv_heads = rec.get("num_attention_heads"), rec.get("num_key_value_heads")
    if heads and heads % tp:
        problems.append(f"{where}: tensor_parallel_size {tp} does not divide num_attention_heads {heads}; "
                        "choose a tensor_parallel_size that divides it")
    if kv_heads and kv_heads % tp and tp % kv_heads:
        problems.append(f"{where}: tensor_parallel_size {tp} and num_key_value_heads {kv_heads} do not fit: "
                        "the KV heads must split evenly across the GPUs or be replicated evenly")
    return (tp // n if tp % n == 0 else tp, 1), problems


def _share_record(rec, hosts, host, addrs, mode, local):
    """This host's record of a multi-node instance: its share of the sizes and the ``multinode`` dict."""
    n = len(hosts)
    rank = hosts.index(host)
    master = addrs[hosts[0]][1]
    mine_iface, mine = addrs[host]
    mn = {
        "nnodes": n,
        "node_rank": rank,
        "role": "api" if rank == 0 else "headless",
        "headless": rank > 0,
        "hosts": list(hosts),
        "addresses": [str(addrs[h][1].ip) for h in hosts],
        "master_addr": str(master.ip),
        "master_port": rec["master_port"],
        "address": str(mine.ip),
        "interface": mine_iface,
        "peers": [str(addrs[h][1].ip) for h in hosts if h != host],
        "parallel": mode,
        "gpus_per_node": local[0] * local[1],
        "tensor_parallel_size": rec["tensor_parallel_size"],
        "pipeline_parallel_size": rec["pipeline_parallel_size"],
    }
    share = dict(rec, tensor_parallel_size=local[0], pipeline_parallel_size=local[1], multinode=mn)
    if rec.get("weights_bytes"):
        # placement checks the fit of this host's share of the weights on this host's GPUs
        share["weights_bytes"] = max(1, int(rec["weights_bytes"] // n))
    if mode == "tensor":
        share.pop("num_attention_heads", None)  # checked above against the whole group
        share.pop("num_key_value_heads", None)
    return share


def resolve(records, models, host, fleet, opts):
    """This host's records: single-host ones unchanged, multi-node ones as this host's share.

    ``opts``: the plan options (``network_interface``, ``fast_interconnect``, ``models_dir``,
    ``default_models_dir``, ``gpu``: false on CPU-only hosts, where GPU counts are not compared).
    Returns ``(records, problems)``.
    """
    if not any(r.get("nodes") is not None for r in records):
        return list(records), []
    if fleet is None:
        names = ", ".join(r["name"] for r in records if r.get("nodes") is not None)
        return [], [f"instances {names} span hosts (nodes) but the plan was given no fleet view; plan with "
                    "the preflight role (it passes fleet=...) or drop nodes"]
    problems = _fleet_problems(fleet)
    if problems:
        return [], problems
    if host not in fleet:
        return [], [f"this host ({host}) is not in the fleet view; the preflight role builds it from every play host"]
    out = []
    for rec in records:
        if rec.get("nodes") is None:
            out.append(rec)
            continue
        where = _label(rec)
        hosts, probs = _hosts(rec, fleet, where)
        if probs:
            problems.extend(probs)
            continue
        if host not in hosts:
            continue  # another host's instance: not in this host's plan
        mode = rec.get("nodes_parallel") or "pipeline"
        if mode == "pipeline":
            local, probs = _pipeline_split(rec, len(hosts), where)
        else:
            local, probs = _tensor_split(rec, hosts, host, fleet, opts, where)
        if probs:
            problems.extend(probs)
            continue  # the sizes do not split over the hosts: GPU counts per host would be compared wrongly
        probs = _same_definition(rec, local[0] * local[1], hosts, host, fleet, models, opts, where)
        if probs:
            problems.extend(probs)
            continue
        addrs, probs = _rank_addresses(rec, hosts, host, fleet, opts, where)
        if probs:
            problems.extend(probs)
            continue
        out.append(_share_record(rec, hosts, host, addrs, mode, local))
    return out, problems


def restore(entry):
    """A placed entry of a multi-node share -> the whole instance's sizes (what vLLM is told)."""
    mn = entry.get("multinode")
    if mn:
        entry["tensor_parallel_size"] = mn["tensor_parallel_size"]
        entry["pipeline_parallel_size"] = mn["pipeline_parallel_size"]
    return entry


# --------------------------------------------------------------------------- one rank's unit

def flags(mn) -> list:
    """The launcher's flags of one rank (one flag with its value per entry)."""
    out = [["--nnodes", str(mn["nnodes"])], ["--node-rank", str(mn["node_rank"])],
           ["--master-addr", mn["master_addr"]], ["--master-port", str(mn["master_port"])],
           ["--distributed-executor-backend", "mp"]]
    if mn["headless"]:
        out.append(["--headless"])
    return out


def environment(mn) -> list:
    """(name, value) pairs of one rank: its own address and the interface gloo and NCCL must use."""
    return [("VLLM_HOST_IP", mn["address"])] + [(name, mn["interface"]) for name in SOCKET_ENV]


def port_problems(instances, stride) -> list:
    """The master port of every instance whose rank 0 is this host against this host's other ports."""
    problems = []
    masters = {}
    for inst in instances:
        mn = inst.get("multinode")
        if not mn or mn["node_rank"] != 0:
            continue
        port = mn["master_port"]
        for other in instances:
            if other.get("multinode", {}).get("node_rank", 0) == 0 and other["port"] == port:
                problems.append(f"instance '{inst['name']}': master_port {port} is the HTTP port of "
                                f"'{other['name']}'; give master_port another port")
            base = other.get("vllm_port")
            if _is_int(base) and base <= port <= base + stride - 1:
                problems.append(f"instance '{inst['name']}': master_port {port} lies in the VLLM_PORT range "
                                f"{base}-{base + stride - 1} of '{other['name']}'; give master_port another port")
        if port in masters:
            problems.append(f"instances '{masters[port]}' and '{inst['name']}' both listen on master_port {port} on "
                            "this host (rank 0 of both); give them distinct master_port values")
        masters.setdefault(port, inst["name"])
    return problems


def table_cells(mn) -> tuple:
    """(RANK, HOSTS) cells of the plan table: ('0/2 api', 'gpu-1,gpu-2')."""
    if not mn:
        return "-", "-"
    return f"{mn['node_rank']}/{mn['nnodes']} {mn['role']}", ",".join(mn["hosts"])


# --------------------------------------------------------------------------- the ranks together

def group_key(mn, name) -> str:
    """One multi-node instance across the fleet: its name at its rank-0 host (``m2@gpu-1``)."""
    return f"{name}@{mn['hosts'][0]}"


def rank_groups(reports) -> list:
    """Judge every multi-node instance from its ranks' reports, one list shared by all hosts.

    ``reports``: inventory host -> ``{instances, units, queued}``: the host's plan instances (those with
    ``multinode`` count), ``units``: unit -> ``{active: bool, since: int}`` (``since``: the unit's
    ``ActiveEnterTimestamp`` in epoch seconds, 0 when never active), ``queued``: names of the instances
    this host's service stage would (re)start anyway (changed, pending or not running), ``answers``
    (optional): instance name -> the HTTP status of a one-token completion asked of the rank 0 this host
    runs (-1: no answer within the deadline; absent: not asked). A host of an instance missing from
    ``reports`` (failed earlier, or not in the play) leaves that group incomplete.

    Returns one dict per group, sorted by key (``group_key``): ``key``, ``name``, ``hosts`` (rank order),
    ``restart`` (bool: restart the whole group), ``broken`` (reasons naming the rank, unit and host;
    empty when the units look healthy), ``queued`` (hosts that would restart their rank anyway),
    ``incomplete`` (hosts of the instance without a report), ``answer`` (rank 0's status, None when not
    asked).

    A group is broken when a rank's unit is not active, or a headless rank (re)entered the active
    state after rank 0 did and rank 0 does not answer a completion: after systemd restarted only the
    headless rank, rank 0's group holds the rank's earlier process, so the new one never joins and every
    request hangs while rank 0's ``/health`` stays 200 (docs/multinode.md). A headless rank newer than a
    rank 0 that answers is in its group: rank 0 was restarted (by systemd or the watchdog), the headless
    ranks lost it, restarted and joined the new one; a completion needs every rank.
    """
    groups = {}
    for host, report in sorted((reports or {}).items()):
        report = report or {}
        units = report.get("units") or {}
        queued = set(report.get("queued") or [])
        answers = report.get("answers") or {}
        for inst in report.get("instances") or []:
            mn = inst.get("multinode")
            if not mn:
                continue
            key = group_key(mn, inst["name"])
            grp = groups.setdefault(key, {"name": inst["name"], "hosts": list(mn["hosts"]), "ranks": {}})
            state = units.get(inst["unit"]) or {}
            answer = answers.get(inst["name"])
            grp["ranks"][int(mn["node_rank"])] = {
                "host": host, "unit": inst["unit"], "queued": inst["name"] in queued,
                "active": _as_bool(state.get("active", False)), "since": _as_int(state.get("since") or 0),
                "answer": None if answer is None else _as_int(answer)}
    out = []
    for key in sorted(groups):
        grp = groups[key]
        ranks = grp["ranks"]
        incomplete = [h for pos, h in enumerate(grp["hosts"]) if pos not in ranks]
        broken = []
        first = ranks.get(0)
        answer = first["answer"] if first else None
        for pos in sorted(ranks):
            rank = ranks[pos]
            where = f"rank {pos} ({rank['unit']} on {rank['host']})"
            if not rank["active"]:
                broken.append(f"{where} is not active")
            elif pos > 0 and first and first["active"] and rank["since"] > first["since"] and answer != 200:
                broken.append(f"{where} restarted after rank 0 started, so it is not in rank 0's group")
        queued = [ranks[pos]["host"] for pos in sorted(ranks) if ranks[pos]["queued"]]
        out.append({"key": key, "name": grp["name"], "hosts": grp["hosts"], "incomplete": incomplete,
                    "broken": broken, "queued": queued, "answer": answer,
                    "restart": not incomplete and bool(broken or queued)})
    return out
