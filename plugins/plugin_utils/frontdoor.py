# Apache License 2.0 (see LICENSE)
"""The front doors of one host: one listener per served model, its backends the host's instances of it.

``plan_frontdoors(instances, models, bind_address, stride, metrics_port=0)`` reads the plan's instances
(after placement and unit content: ``port``, ``url``, ``vllm_port``, ``multinode``) and the normalised
models (``frontdoor_port``, ``task``, ``routes``) and returns ``(frontdoors, metrics, problems)``; each front door
carries its ``edge`` (``edge.edge_policy``: the model's routes it passes with a key, ``/health`` without one, what a
request target may not hold). A model gets a front door on a
host when it sets ``frontdoor_port`` and at least one of the host's instances serves its API (a
headless rank of a multi-node instance serves none: its ``url`` is None). The front door's port must
not be an instance's HTTP port, lie in an instance's ``VLLM_PORT`` range, be the ``master_port`` of
a multi-node instance whose rank 0 is this host, or be another model's front door; the instances of
one model behind one front door must serve the same names (a client asking the front door for a name
must get it from every backend). Each problem names the variable and the fix; the caller adds the host.

``metrics`` is the one metrics listener of the host's HAProxy (it serves every front door of the host):
``{"bind_address", "port", "url"}`` (``url`` ends in ``/metrics``, where the host itself reaches it), or
None when the host has no front door or ``metrics_port`` is 0. Its port must be none of the ports above
(an instance's, a ``VLLM_PORT`` range, a master port, a front door's).

The role ``vllm_frontdoor`` renders HAProxy's configuration from ``frontdoors`` and ``metrics`` alone.

``server_states(show_stat)`` reads HAProxy's runtime answer to ``show stat`` (the filter
``vllm_frontdoor_servers``): the one parser of that CSV for the role's ready and check steps and the tests.
"""
from __future__ import annotations

# HAProxy's runtime API is read on the host too (the frontdoor_server module): one parser, in module_utils
from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import server_states  # noqa: F401  pylint: disable=unused-import
from ansible_collections.inferops.vllm.plugins.plugin_utils.edge import edge_policy

__all__ = ["METRICS_PORTS", "plan_frontdoors", "worker_frontdoors", "plan_node_exporter", "connect_host", "server_states", "taken_ports",
           "router_frontdoor", "metrics_listener"]

_WILDCARD = ("0.0.0.0", "", "*")


def connect_host(address):
    """Where the host itself reaches a listener bound to ``address`` (every address: loopback)."""
    if address in _WILDCARD:
        return "127.0.0.1"
    if address == "::":
        return "::1"
    return address


def _url(host, port):
    host = "[%s]" % host if ":" in host else host
    return f"http://{host}:{port}"


def _taken(instances, stride):
    """Every port this host's instances use: [(low, high, what)]."""
    out = []
    for inst in instances:
        mn = inst.get("multinode") or {}
        if inst.get("url") is not None:
            out.append((inst["port"], inst["port"], f"the HTTP port of instance '{inst['name']}'"))
        base = inst.get("vllm_port")
        if isinstance(base, int):
            out.append((base, base + stride - 1,
                        f"the VLLM_PORT range {base}-{base + stride - 1} of instance '{inst['name']}'"))
        if mn and mn.get("node_rank") == 0 and isinstance(mn.get("master_port"), int):
            out.append((mn["master_port"], mn["master_port"], f"the master_port of instance '{inst['name']}'"))
    return out


def taken_ports(instances, stride, frontdoors=(), metrics=None, node_exporter=None):
    """Every port the host's instances, front doors, front door metrics and node_exporter use: [(low, high, what)]."""
    taken = _taken(instances, int(stride))
    taken += [(fd["port"], fd["port"], f"the front door of model '{fd['model']}'") for fd in frontdoors]
    if metrics:
        taken.append((metrics["port"], metrics["port"], "the front doors' metrics listener (vllm_frontdoor_metrics_port)"))
    if node_exporter:
        taken.append((node_exporter["port"], node_exporter["port"], "node_exporter (vllm_service_node_exporter_port)"))
    return taken


def router_frontdoor(router, bind_address, model):
    """The front door of a router (``router.py``): clients reach the router on loopback through the host's HAProxy,
    which passes the model's routes (``edge.edge_policy``, with a key) and ``/health`` only (the router's worker
    admin routes answer without a key). ``model``: the normalised model. Its backends: this host's router, then the
    other router hosts' front doors of the model as backups (``router["backups"]``: used while this host's router
    is down or drained)."""
    return {
        "name": router["frontdoor"],
        "model": router["model"],
        "router": True,
        "edge": edge_policy(model, router=True),
        "served_model_name": router["served_model_name"][0],
        "served_model_names": list(router["served_model_name"]),
        "bind_address": bind_address,
        "port": router["port"],
        "url": _url(connect_host(bind_address), router["port"]),
        "backends": [{"instance": "router", "unit": router["unit"], "address": router["listen"]["address"],
                      "port": router["listen"]["port"], "url": router["url"]}]
        + [{"instance": b["name"], "unit": "", "address": b["address"], "port": b["port"], "url": b["url"],
            "backup": True} for b in router.get("backups") or []],
    }


def worker_frontdoors(workers_here, instances, models):
    """The worker listeners of this host: one per instance that a router on another host reaches through this host's
    front door (``router_workers`` entries with a ``listener``: the instance listens on loopback, the front door on
    ``listener.address`` and the same port, with the model's key check and routes, plus the render routes of a
    cache_aware router). No vLLM port is on the network then."""
    by_name = {i["name"]: i for i in instances}
    out, seen = [], set()
    for worker in workers_here:
        listener, inst = worker.get("listener"), by_name.get(worker.get("instance"))
        if not listener or inst is None or inst["name"] in seen or worker.get("model") not in models:
            continue
        seen.add(inst["name"])
        out.append({
            "name": f"_worker_{inst['name']}",
            "model": worker["model"],
            "worker": True,
            "served_model_name": inst["served_model_name"],
            "served_model_names": list(inst["served_model_names"]),
            "bind_address": listener["address"],
            "port": listener["port"],
            "url": _url(listener["address"], listener["port"]),
            "edge": edge_policy(models[worker["model"]], render=worker.get("policy") == "cache_aware"),
            "backends": [{"instance": inst["name"], "unit": inst["unit"], "address": connect_host(inst["bind_address"]),
                          "port": inst["port"], "url": inst["url"]}],
        })
    return out


def plan_frontdoors(instances, models, bind_address, stride, metrics_port=0):
    """``(frontdoors, metrics, problems)`` of one host; see the module docstring."""
    problems = []
    by_model = {}
    for inst in instances:
        key = (inst.get("model") or {}).get("key")
        model = models.get(key) or {}
        if model.get("frontdoor_port") is None or inst.get("url") is None:
            continue
        by_model.setdefault(key, []).append(inst)
    taken = _taken(instances, int(stride))
    frontdoors, ports = [], {}
    for key in sorted(by_model):
        port = models[key]["frontdoor_port"]
        insts = by_model[key]
        where = f"vllm_models.{key}.frontdoor_port"
        names = {tuple(i["served_model_names"]) for i in insts}
        if len(names) > 1:
            problems.append(
                f"{where}: the instances of model '{key}' on this host serve different names ("
                + "; ".join(f"'{i['name']}': {', '.join(i['served_model_names'])}" for i in insts)
                + "), so one front door cannot serve them all; give them the same served_model_name "
                  "or leave frontdoor_port out")
        for low, high, what in taken:
            if low <= port <= high:
                problems.append(f"{where} is {port}, which is {what}; give the front door a port no instance uses")
        if port in ports:
            problems.append(f"{where} is {port}, which is also the front door of model '{ports[port]}'; "
                            "give each model its own frontdoor_port")
        ports.setdefault(port, key)
        address = bind_address
        frontdoors.append({
            "name": key,
            "model": key,
            "served_model_name": insts[0]["served_model_name"],
            "served_model_names": list(insts[0]["served_model_names"]),
            "bind_address": address,
            "port": port,
            "url": _url(connect_host(address), port),
            "edge": edge_policy(models[key]),
            "backends": [{"instance": i["name"], "unit": i["unit"], "address": connect_host(i["bind_address"]),
                          "port": i["port"], "url": i["url"]} for i in insts],
        })
    metrics, metrics_problems = metrics_listener(frontdoors, taken, bind_address, metrics_port)
    return frontdoors, metrics, problems + metrics_problems


def plan_node_exporter(instances, frontdoors, metrics, bind_address, port, stride):
    """``(node_exporter, problems)``: node_exporter's listener on this host (None when ``port`` is 0), checked
    against every port the host's instances, front doors and front door metrics listener use."""
    if not port:
        return None, []
    where = "vllm_service_node_exporter_port"
    problems = [f"{where} is {port}, which is {what}; give node_exporter a port nothing else on the host uses"
                for low, high, what in taken_ports(instances, stride, frontdoors, metrics) if low <= port <= high]
    return {"bind_address": bind_address, "port": port,
            "url": _url(connect_host(bind_address), port) + "/metrics"}, problems


#: The ports the front doors' metrics listener may take (0: none); the plan inputs' docs read it too.
METRICS_PORTS = (1, 65535)


def metrics_listener(frontdoors, taken, bind_address, port):
    """The metrics listener of the host's HAProxy for ``frontdoors`` (or None) and its problems."""
    where = "vllm_frontdoor_metrics_port"
    low, high = METRICS_PORTS
    if isinstance(port, bool) or not isinstance(port, int) or not (port == 0 or low <= port <= high):
        return None, [f"{where} is {port!r}; use a TCP port number {low}-{high}, or 0 for no metrics listener"]
    if not frontdoors or port == 0:
        return None, []
    problems = [f"{where} is {port}, which is {what}; give the front doors' metrics listener a port no instance uses"
                for low, high, what in taken if low <= port <= high]
    problems += [f"{where} is {port}, which is the front door of model '{fd['model']}' "
                 f"(vllm_models.{fd['model']}.frontdoor_port); give the metrics listener another port"
                 for fd in frontdoors if fd["port"] == port]
    return {"bind_address": bind_address, "port": port,
            "url": _url(connect_host(bind_address), port) + "/metrics"}, problems
