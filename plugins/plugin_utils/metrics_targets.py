# Apache License 2.0 (see LICENSE)
"""Prometheus file service discovery for the planned vLLM instances (controller side, pure Python).

``file_sd_targets(hosts)`` turns the plans of several hosts into the list Prometheus reads from a
``file_sd_configs`` file, the format the ``prometheus.prometheus`` collection's ``prometheus_targets``
writes: one target group per instance, ``{"targets": ["<address>:<port>"], "labels": {...}}``, then one
per host with front doors (the plan's ``frontdoor_metrics``: HAProxy's exporter, which serves the
metrics of every front door of the host).

``hosts`` maps each inventory host to ``{"plan": <its vllm_plan>, "address": <how Prometheus reaches
the host>, "vllm_version": <installed version or None>}``. The target address is the instance's bind
address, or ``address`` when it binds every address (``0.0.0.0``, ``::``). An instance bound to
loopback can only be scraped by a Prometheus on its own host: ``warnings`` says so when the file is
meant for another host (``scraper``).

Labels: ``instance`` (``<host>/<instance>``: unique across the fleet, instead of Prometheus' default
``<address>:<port>``), ``host``, ``vllm_instance``, ``unit``, ``model`` (the first served name),
``repo_id``, ``revision``, ``gpus`` (indices, ``0,1``), ``numa_node``, ``tensor_parallel_size``,
``vllm_version``. Label values are strings, as Prometheus wants them.

A front door group's labels: ``instance`` (``<host>/_frontdoor``: no instance has that name, as names
start with a letter or digit), ``host``, ``inferops_role`` (``frontdoor``; instance groups have no such
label), ``models`` (the model keys it fronts, comma-separated: HAProxy's own ``proxy`` label of each
front door), ``served_model_names`` (the first served name of each, in the same order) and
``frontdoor_ports``. Its target follows the rules of the instances' (bind address; wildcard: ``address``).
Instance groups come first, in host order, then the front door groups in host order, then the node_exporter
groups (the plan's ``node_exporter``, when the service role manages it: the host's metrics and the watchdog's
textfile metrics) in host order: labels ``instance`` (``<host>/_node``), ``host``, ``inferops_role``
(``node``); then the routers' Prometheus listeners (the plan's ``routers``) in host and model order: labels
``instance`` (``<host>/_router_<model>``), ``host``, ``inferops_role`` (``router``), ``model`` (the first served
name), ``router_port``.
"""
from __future__ import annotations

from ansible_collections.inferops.vllm.plugins.plugin_utils.values import LOOPBACK as _LOOPBACK

__all__ = ["file_sd_targets"]

_WILDCARD = ("0.0.0.0", "::", "", "*")


def _hostport(address, port):
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _target(host, bind, port, address, scraper, warnings, what, variable):
    """``address:port`` Prometheus scrapes for a listener of ``host`` bound to ``bind`` (``address`` when it binds
    every address); a loopback listener that a Prometheus on another host (``scraper``) cannot reach is named in
    ``warnings`` with the variable that fixes it."""
    if bind in _LOOPBACK and scraper not in (None, host):
        warnings.append(f"host {host}: {what} binds {bind}, so the Prometheus on {scraper} cannot scrape it; "
                        f"set {variable} to an address that host reaches")
    return _hostport(address if bind in _WILDCARD else bind, port)


def _frontdoor_group(host, plan, address, scraper, warnings):
    """The target group of the host's front doors' metrics listener, or None."""
    metrics = plan.get("frontdoor_metrics")
    frontdoors = plan.get("frontdoors") or []
    if not metrics or not frontdoors:
        return None
    target = _target(host, metrics["bind_address"], metrics["port"], address, scraper, warnings,
                     "the front doors' metrics listener", "vllm_frontdoor_bind_address")
    labels = {
        "instance": f"{host}/_frontdoor",
        "host": host,
        "inferops_role": "frontdoor",
        "models": ",".join(fd["model"] for fd in frontdoors),
        "served_model_names": ",".join(fd["served_model_name"] for fd in frontdoors),
        "frontdoor_ports": ",".join(str(fd["port"]) for fd in frontdoors),
    }
    return {"targets": [target], "labels": labels}


def _node_group(host, plan, address, scraper, warnings):
    """The target group of the host's node_exporter (the plan's ``node_exporter``), or None."""
    node = plan.get("node_exporter")
    if not node:
        return None
    target = _target(host, node["bind_address"], node["port"], address, scraper, warnings, "node_exporter",
                     "vllm_service_node_exporter_bind_address")
    return {"targets": [target],
            "labels": {"instance": f"{host}/_node", "host": host, "inferops_role": "node"}}


def _router_groups(host, plan, address, scraper, warnings):
    """The target groups of the host's routers' Prometheus listeners (the plan's ``routers``)."""
    out = []
    for router in plan.get("routers") or []:
        metrics = router["metrics"]
        target = _target(host, metrics["bind_address"], metrics["port"], address, scraper, warnings,
                         f"the router of '{router['model']}'", "vllm_frontdoor_bind_address")
        out.append({"targets": [target],
                    "labels": {"instance": f"{host}/_router_{router['model']}", "host": host, "inferops_role": "router",
                               "model": router["served_model_name"][0], "router_port": str(router["port"])}})
    return out


def file_sd_targets(hosts, scraper=None):
    """``{"targets": [target groups], "warnings": [...]}``, hosts and instances in a stable order."""
    if not isinstance(hosts, dict):
        raise ValueError(f"the input must be a dict: host -> {{plan, address, vllm_version}}, got {type(hosts).__name__}")
    groups, frontdoor_groups, node_groups, router_groups, warnings = [], [], [], [], []
    for host in sorted(hosts):
        entry = hosts[host]
        plan = (entry or {}).get("plan") if isinstance(entry, dict) else None
        if not isinstance(plan, dict) or not isinstance(plan.get("instances"), list):
            raise ValueError(f"host {host}: no plan (run the vllm_preflight role first; it sets vllm_preflight_plan)")
        address = entry.get("address") or host
        version = entry.get("vllm_version")
        for inst in plan["instances"]:
            if inst.get("url") is None:
                continue  # a headless rank of a multi-node instance serves no API and no /metrics
            target = _target(host, inst["bind_address"], inst["port"], address, scraper, warnings,
                             f"instance '{inst['name']}'", "vllm_service_host")
            model = inst.get("model") or {}
            labels = {
                "instance": f"{host}/{inst['name']}",
                "host": host,
                "vllm_instance": inst["name"],
                "unit": inst["unit"],
                "model": inst["served_model_name"],
                "repo_id": model.get("repo_id") or "",
                "revision": model.get("revision") or "",
                "gpus": ",".join(str(g) for g in inst.get("gpus") or []),
                "numa_node": "" if inst.get("numa_node") is None else str(inst["numa_node"]),
                "tensor_parallel_size": str(inst["tensor_parallel_size"]),
                "vllm_version": str(version) if version else "unknown",
            }
            groups.append({"targets": [target], "labels": labels})
        frontdoor = _frontdoor_group(host, plan, address, scraper, warnings)
        if frontdoor:
            frontdoor_groups.append(frontdoor)
        node = _node_group(host, plan, address, scraper, warnings)
        if node:
            node_groups.append(node)
        router_groups += _router_groups(host, plan, address, scraper, warnings)
    return {"targets": groups + frontdoor_groups + node_groups + router_groups, "warnings": warnings}
