# Apache License 2.0 (see LICENSE)
"""The fleet's routers: one ``vllm-router`` per model on each host of the group ``vllm_routers``, over the
model's instances on every host (controller side, pure Python, no Ansible imports).

``plan_routers(host, fleet, models, opts, taken, routes)`` and ``router_workers(host, fleet, routes)`` read the
fleet view
(``fleet_view.py``: every inventory host's groups, ``vllm_instances``, ``vllm_models``, bind address, router
address and port base) and give the plan of ``host``:

* ``routers`` (hosts of ``vllm_routers`` only): one per model of this host whose ``vllm_models`` entry sets
  ``router_port``, sorted by model key: ``{name, model, unit, served_model_name, port, listen, url, metrics,
  policy, workers: [{host, instance, url}]}``. The router listens on loopback only (``listen``; its worker
  admin routes answer anyone who reaches it), on ``vllm_router_listen_port_base`` + its position; clients
  reach it through the host's front door on ``port`` (``router_port``), which passes ``/v1/*`` and ``/health``
  and nothing else. ``metrics`` is its Prometheus listener (``vllm_router_metrics_port_base`` + position).
* ``router_workers`` (every host, ``router_workers()``): this host's instances that a router routes to, with where that router is:
  ``{instance, model, router_host, router, router_url, worker_url, wave, policy}``. The service role takes an instance
  out of each router before it stops or restarts it and puts it back after its gate. ``wave`` is the host's
  position among the router's worker hosts: the service role restarts the workers of one router one wave at
  a time, so two hosts never take the same router's instances out together.

A worker is every instance of the model, on every host of the inventory, in inventory order: a single-host instance
(no ``nodes``) on its host, an instance that spans hosts once, on its rank 0's host (``multinode.serves_api_on``: the
rank that serves the API; the headless ranks are never workers, and the service role's group restart takes rank 0 out
of its routers first). Its URL: ``http://<address>:<port>``; the port is the one that host's plan gives it
(``fleet_endpoints``: read from the plans of the hosts planned in this run, ``host_plan.plan_fleet``; a host that is
not, outside the play, from its inventory through the same normalisation and port rule); the address is that host's: loopback
on the router's own host, else the host's ``vllm_router_worker_address``, else its ``vllm_service_host`` when that is
one address, else the IPv4 address of its ``vllm_service_network_interface`` (network facts). An instance bound to
loopback on another host is reached through a worker listener of that host's front door (``_worker_address``);
without an address for it: a problem naming the variable to set.
"""
from __future__ import annotations

from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import connect_host
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import adapter_pins, normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import interface_ips, planned_on, serves_api_on
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import assign_ports, kept_slots
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import LOOPBACK as _LOOPBACK, as_int

__all__ = ["plan_routers", "router_workers", "plan_endpoints", "inventory_endpoints", "fleet_endpoints",
           "fleet_routes", "routed_policies", "ROUTER_GROUP", "ROUTER_POLICIES", "router_unit", "frontdoor_name",
           "SCALE_OUT_FLAG"]

#: The vLLM flag that registers the render endpoints (``/v1/completions/render``, ...) vllm-router's cache_aware
#: policy asks every worker for a prompt's tokens: without it vLLM answers 403 and the router falls back to
#: load-based routing (measured with vllm-router 0.1.17 and vLLM 0.32.0, tests/benchmarks/bench_router.py). The
#: endpoints check the instance's API key like the OpenAI routes.
SCALE_OUT_FLAG = "--enable-scale-out"

#: The inventory group whose hosts run the routers.
ROUTER_GROUP = "vllm_routers"
#: vllm-router's policies (``--policy``) this collection offers.
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "consistent_hash", "random")
_WILDCARD = ("0.0.0.0", "", "*", "::")


def router_unit(model):
    """The systemd unit of the router of ``model``."""
    return f"inferops-vllm-router-{model}.service"


def frontdoor_name(model):
    """The front door listener of the router of ``model`` (no model key starts with '_')."""
    return f"_router_{model}"


def _url(host, port):
    host = "[%s]" % host if ":" in host else host
    return f"http://{host}:{port}"


def _router_models(entry):
    """Sorted model keys with ``router_port`` in a fleet entry's ``vllm_models``."""
    models = entry.get("models") if isinstance(entry.get("models"), dict) else {}
    return sorted(k for k, m in models.items() if isinstance(m, dict) and m.get("router_port") not in (None, ""))


def _listen_port(entry, model):
    base = as_int(entry.get("router_listen_base"))
    return None if base is None else base + _router_models(entry).index(model)


def _is_router_host(entry):
    return ROUTER_GROUP in (entry.get("groups") or [])


def _listener_address(entry):
    """The address other hosts reach ``entry``'s host at: ``vllm_router_worker_address``, else the IPv4 address of
    ``vllm_service_network_interface``; None when neither is known."""
    if entry.get("router_address"):
        return str(entry["router_address"])
    iface = entry.get("interface") or ""
    for item in (interface_ips(entry, iface) or []) if iface else []:
        if item.version == 4:
            return str(item.ip)
    return None


def _no_address_fix(name, entry, unset=None):
    """What to do when ``_listener_address`` knows no address for fleet host ``name``: the fix the case needs (a
    phrase that ends a refusal). ``unset``: the phrase when no interface is set either (the caller's wording)."""
    iface = entry.get("interface") or ""
    if not iface:
        return unset or f"set vllm_router_worker_address (or vllm_service_network_interface) on {name}"
    if not entry.get("in_play", True):
        # its network facts are read only when it is in the play: a --limit, or another batch of serial
        return (f"{name} is not in this run (a --limit, or a batch of its own), so the address of its {iface} "
                f"(vllm_service_network_interface) is not known here: run over every host of the fleet, or set "
                f"vllm_router_worker_address on {name}")
    return (f"{name}'s {iface} (vllm_service_network_interface) has no IPv4 address: set vllm_router_worker_address "
            f"on {name}, or name an interface that has one")


def _worker_address(name, entry, router_host):
    """(address, problem, listener) where ``router_host`` reaches the instances of fleet host ``name``; ``listener``:
    the instances listen on loopback, and the host's front door listens for the router on ``address`` (a worker
    listener: the same key check and routes as a front door), so no vLLM port is on the network."""
    bind = str(entry.get("bind_host") or "127.0.0.1")
    if name == router_host:
        return connect_host(bind), None, False
    if bind in _LOOPBACK:
        address = _listener_address(entry)
        if address is None:
            return None, (f"host {name}: its instances listen on {bind} (vllm_service_host), so the router on "
                          f"{router_host} reaches them through {name}'s front door, which needs the address to listen "
                          f"on: {_no_address_fix(name, entry)}"), False
        return address, None, True
    if entry.get("router_address"):
        return str(entry["router_address"]), None, False
    if bind not in _WILDCARD:
        return bind, None, False
    address = _listener_address(entry)
    if address is not None:
        return address, None, False
    fix = _no_address_fix(name, entry, unset=f"set vllm_router_worker_address on {name} to the address the router "
                          "host reaches it at (or vllm_service_network_interface, whose address is then used)")
    return None, (f"host {name}: the router on {router_host} cannot tell where to reach its instances (they listen "
                  f"on {bind or 'every address'}); {fix}"), False


def plan_endpoints(instances):
    """The instances of a host's plan a router can route to: ``[{instance, model, port}]`` (those that serve the API
    on the host: single-host instances and rank 0 of one that spans hosts; a headless rank has no ``url``)."""
    return [{"instance": i["name"], "model": i["model"]["key"], "port": i["port"],
             "adapters": sorted(adapter_pins(i.get("lora")))}
            for i in instances if i.get("url") is not None and i.get("port") is not None]


def inventory_endpoints(name, entry, fleet):
    """The same list for a host that is not planned in this run (outside the play, or its plan was refused): its
    inventory through the one normalisation and the plan's port rule (``placement.assign_ports`` over the instances
    its plan keeps, ``multinode.planned_on``), so it agrees with the plan that host gets when it is planned."""
    norm = normalise(entry.get("models"), entry.get("instances"), host=name)
    kept = [r for r in norm["instances"] if planned_on(r.get("nodes"), name, fleet)]
    base = as_int(entry.get("base_port")) or 8000
    ports = assign_ports([r.get("port") for r in kept], base, [r.get("name") for r in kept],
                         kept_slots(entry.get("slots"), "port", base))
    return [{"instance": r["name"], "model": r["model"], "port": p, "adapters": sorted(adapter_pins(r.get("lora")))}
            for r, p in zip(kept, ports)
            if p is not None and (r.get("nodes") is None or serves_api_on(r.get("nodes"), name, fleet))]


def fleet_endpoints(fleet, planned):
    """Host -> its endpoints (``plan_endpoints``): from ``planned`` (host -> the plan's instances) where the host was
    planned, else from its inventory (``inventory_endpoints``); only hosts with an instance of a routed model."""
    routed = {m for entry in fleet.values() if _is_router_host(entry) for m in _router_models(entry)}
    out = {}
    for name, entry in fleet.items():
        if name in planned:
            out[name] = plan_endpoints(planned[name])
        elif any(isinstance(i, dict) and i.get("model") in routed for i in (entry.get("instances") or [])):
            out[name] = inventory_endpoints(name, entry, fleet)
    return out


def routed_policies(fleet):
    """Model -> the policies of the routers that route it (every host of ``vllm_routers`` whose models set
    ``router_port``): what a worker's argv depends on, known before any port is (``SCALE_OUT_FLAG``)."""
    out = {}
    for entry in fleet.values():
        if _is_router_host(entry):
            for key in _router_models(entry):
                out.setdefault(key, []).append(entry.get("router_policy") or "cache_aware")
    return out


def _workers(fleet, model, router_host, endpoints):
    """[{host, instance, url}] of every instance of ``model`` in the fleet (one that spans hosts at its rank 0's host
    only), at the port of its host's plan (``endpoints``), and the problems."""
    workers, problems, kinds = [], [], {}
    for name, entry in fleet.items():
        mine = [e for e in endpoints.get(name) or [] if e["model"] == model]
        if not mine:
            continue
        address, problem, listener = _worker_address(name, entry, router_host)
        if problem:
            problems.append(problem)
            continue
        workers += [dict({"host": name, "instance": e["instance"], "url": _url(address, e["port"])},
                         **({"listener": {"address": address, "port": e["port"]}} if listener else {})) for e in mine]
        for e in mine:
            kinds.setdefault(tuple(e.get("adapters") or ()), []).append(f"{name}/{e['instance']}")
    # a request naming an adapter must reach a worker that serves it: every worker serves the same adapters
    if len(kinds) > 1:
        problems.append(f"the router of '{model}' on {router_host} would route to workers that serve different adapters ("
                        + "; ".join(f"{', '.join(who)}: {', '.join(k) or 'none'}" for k, who in kinds.items())
                        + f"), so a request naming an adapter could reach one without it; give every instance of "
                          f"'{model}' the same adapters (their adapters key, and one vllm_models.{model}.adapters on "
                          "every host), or serve the others under a model key of their own")
    return workers, problems


def _backups(fleet, model, router_host):
    """The other router hosts of ``model`` as backups of ``router_host``'s front door: [{host, name, address, port,
    url}] (their front door on ``router_port``, where ``router_host`` reaches them), and the problems."""
    backups, problems = [], []
    for name, entry in fleet.items():
        if name == router_host or not _is_router_host(entry) or model not in _router_models(entry):
            continue
        port = as_int(((entry.get("models") or {}).get(model) or {}).get("router_port"))
        bind = str(entry.get("frontdoor_bind") or entry.get("bind_host") or "127.0.0.1")
        if bind in _LOOPBACK:
            problems.append(f"host {name}: it runs a router of '{model}' too, but its front door listens on {bind} "
                            f"(vllm_frontdoor_bind_address, else vllm_service_host), so {router_host}'s front door "
                            f"cannot fall back to it (nor can clients reach it); set vllm_frontdoor_bind_address on "
                            f"{name} (0.0.0.0, or an address)")
            continue
        address = bind if bind not in _WILDCARD else _listener_address(entry)
        if address is None or port is None:
            problems.append(f"host {name}: it runs a router of '{model}' too, but {router_host} cannot tell where to "
                            f"reach its front door; " + (_no_address_fix(name, entry) if address is None else
                                                         f"set router_port of '{model}' on {name}"))
            continue
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        backups.append({"host": name, "name": f"router_{safe}", "address": address, "port": port,
                        "url": _url(address, port)})
    return backups, problems


def fleet_routes(fleet, endpoints):
    """(router host, model) -> (its workers, the problems reaching them), for every router of the fleet: worked out
    once per plan and read by the router's own host (``plan_routers``) and by every worker's (``router_workers``).
    ``endpoints``: ``fleet_endpoints``."""
    return {(name, key): _workers(fleet, key, name, endpoints)
            for name, entry in fleet.items() if _is_router_host(entry) for key in _router_models(entry)}


def plan_routers(host, fleet, models, opts, taken, routes):
    """``(routers, problems)`` of ``host`` (empty unless it is in ``vllm_routers``); see the module docstring.

    ``models``: this host's normalised models; ``opts``: the plan inputs (``router_policy``,
    ``router_listen_base``, ``router_metrics_base``, ``metrics_bind_address``); ``taken``: ports this host
    already uses, ``[(low, high, what)]``; ``routes``: ``fleet_routes``.
    """
    fleet = fleet if isinstance(fleet, dict) else {}
    routers, problems = [], []
    me = fleet.get(host) or {}
    if _is_router_host(me):
        keys = [k for k in sorted(models) if models[k].get("router_port") is not None]
        for pos, key in enumerate(keys):
            listen = int(opts["router_listen_base"]) + pos
            metrics = int(opts["router_metrics_base"]) + pos
            for port, what in ((listen, f"the loopback port of the router of '{key}' (vllm_router_listen_port_base)"),
                               (metrics, f"the metrics port of the router of '{key}' (vllm_router_metrics_port_base)"),
                               (models[key]["router_port"], f"vllm_models.{key}.router_port")):
                problems += [f"{what} is {port}, which is {used}; give it a port nothing else on the host uses"
                             for low, high, used in taken if low <= port <= high]
            workers, worker_problems = routes.get((host, key), ([], []))
            problems += worker_problems
            backups, backup_problems = _backups(fleet, key, host)
            problems += backup_problems
            if not workers and not worker_problems:
                problems.append(f"vllm_models.{key}.router_port: no host of the inventory has an instance "
                                f"of model '{key}', so its router would have no worker; add instances or leave "
                                "router_port out")
            bind = opts["metrics_bind_address"]
            routers.append({
                "name": key,
                "model": key,
                "unit": router_unit(key),
                "frontdoor": frontdoor_name(key),
                "served_model_name": _names(models[key].get("served_model_name")) or [models[key].get("repo_id") or key],
                "port": models[key]["router_port"],
                "listen": {"address": "127.0.0.1", "port": listen},
                "url": _url("127.0.0.1", listen),
                "metrics": {"bind_address": bind, "port": metrics,
                            "url": _url(connect_host(bind), metrics) + "/metrics"},
                "policy": opts["router_policy"],
                "workers": workers,
                # the other router hosts of the model, the backups of this host's front door for it
                "backups": backups,
            })
    return routers, problems


def router_workers(host, fleet, routes):
    """This host's instances that a router of the fleet routes to (the plan's ``router_workers``); see the module
    docstring; ``routes``: ``fleet_routes``."""
    fleet = fleet if isinstance(fleet, dict) else {}
    workers_of_host = []
    for router_host, entry in fleet.items():
        if not _is_router_host(entry):
            continue
        for key in _router_models(entry):
            workers = routes.get((router_host, key), ([], []))[0]
            hosts = list(dict.fromkeys(w["host"] for w in workers))
            listen = _listen_port(entry, key)
            if host not in hosts or listen is None:
                continue
            workers_of_host += [dict({"instance": w["instance"], "model": key, "router_host": router_host,
                                      "router": router_unit(key), "router_url": _url("127.0.0.1", listen),
                                      "worker_url": w["url"], "wave": hosts.index(host),
                                      "policy": entry.get("router_policy") or "cache_aware"},
                                     **({"listener": w["listener"]} if "listener" in w else {}))
                                for w in workers if w["host"] == host]
    return workers_of_host


def _names(value):
    if isinstance(value, str):
        return [value]
    return list(value or [])
