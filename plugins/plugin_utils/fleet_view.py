# Apache License 2.0 (see LICENSE)
"""The fleet view: what the planner needs from the other hosts (controller side, no Ansible imports).

A multi-node instance (``nodes``, see ``multinode.py`` and ``docs/multinode.md``) is planned on each of
its hosts from that host's facts *and* the other ranks' facts and inventory. ``fleet_view`` builds
that view once, from ``hostvars``, for the preflight role's plan step (filter
``inferops.vllm.vllm_fleet_view``), and for the routers (``router.py``: where every host's instances are
reached):

    inventory host -> {in_play, groups, group_positions, addresses, interface, gpu_count, models_dir,
                       fast_interconnect, instances, models, bind_host, frontdoor_bind, router_address,
                       router_listen_base, router_policy, base_port}

``addresses`` come from the network facts (``ansible.builtin.setup`` with ``gather_subset: network``,
which the preflight facts step reads only on hosts with a multi-node instance): interface ->
list of ``{address, prefix}`` (the IPv4 primary, its secondaries, then the IPv6 addresses).
Inventory values a host leaves unset take the plan inputs' defaults (``host_plan.PLAN_INPUTS``).
"""
from __future__ import annotations

from collections.abc import Mapping

__all__ = ["fleet_view", "interface_addresses"]


def _get(mapping, key, default=None):
    """``mapping[key]`` for dicts and Ansible's lazy host variables (which template on access)."""
    try:
        if key in mapping:
            return mapping[key]
    except TypeError:
        return default
    return default


def interface_addresses(facts) -> dict:
    """Interface name -> list of {address, prefix} from Ansible's network facts (``ansible_facts``).

    Fact keys spell ``-`` and ``:`` as ``_`` (``br-lan`` is ``ansible_facts.br_lan``); the entry's
    ``device`` holds the real name, which is what ``vllm_service_network_interface`` names.
    """
    out = {}
    if not isinstance(facts, Mapping):
        return out
    for name in _get(facts, "interfaces", None) or []:
        entry = _get(facts, str(name).replace("-", "_").replace(":", "_").replace(".", "_"))
        if not isinstance(entry, Mapping):
            entry = _get(facts, str(name))
        if not isinstance(entry, Mapping):
            continue
        device = str(entry.get("device") or name)
        addrs = []
        ipv4 = entry.get("ipv4")
        for item in ([ipv4] if isinstance(ipv4, Mapping) else []) + list(entry.get("ipv4_secondaries") or []):
            if isinstance(item, Mapping) and item.get("address"):
                addrs.append({"address": str(item["address"]),
                              "prefix": str(item.get("prefix") or _prefix(item.get("netmask")) or "")})
        for item in entry.get("ipv6") or []:
            if isinstance(item, Mapping) and item.get("address") and item.get("scope", "global") != "link":
                addrs.append({"address": str(item["address"]), "prefix": str(item.get("prefix") or "")})
        if addrs:
            out[device] = addrs
    return out


def _prefix(netmask):
    if not netmask:
        return None
    try:
        return sum(bin(int(part)).count("1") for part in str(netmask).split("."))
    except ValueError:
        return None


def fleet_view(hostvars, hosts, play_hosts, defaults, groups=None) -> dict:
    """The fleet view of ``hosts`` (inventory order) from ``hostvars``.

    ``play_hosts``: the play's hosts (``ansible_play_hosts_all``); ``defaults``: variable -> default
    for the inventory values read here (``vllm_install_models_dir``, ``vllm_service_network_interface``,
    ``vllm_service_fast_interconnect``); ``groups``: Ansible's ``groups`` (group -> hosts in the group's
    order), for ``group_positions``.
    """
    in_play = set(play_hosts or [])
    positions = {}
    for group, members in (groups.items() if isinstance(groups, Mapping) else ()):
        for pos, member in enumerate(members if isinstance(members, (list, tuple)) else []):
            positions.setdefault(member, {}).setdefault(group, pos)
    view = {}
    for host in hosts or []:
        hv = _get(hostvars, host, {}) or {}
        facts = _get(hv, "ansible_facts", {}) or {}

        def var(name, hv=hv):
            value = _get(hv, name)
            return defaults.get(name) if value is None else value

        gpus = _get(facts, "gpus", None)
        view[host] = {
            "in_play": host in in_play,
            "groups": list(_get(hv, "group_names", []) or []),
            "group_positions": positions.get(host, {}),
            "addresses": interface_addresses(facts),
            "interface": var("vllm_service_network_interface") or "",
            "gpu_count": len(gpus) if isinstance(gpus, list) else 0,
            "models_dir": var("vllm_install_models_dir"),
            "fast_interconnect": var("vllm_service_fast_interconnect"),
            "instances": _get(hv, "vllm_instances", []) or [],
            "models": _get(hv, "vllm_models", {}) or {},
            # what a router on another host needs to reach this host's instances (router.py)
            "bind_host": var("vllm_service_host"),
            "frontdoor_bind": var("vllm_frontdoor_bind_address") or "",
            "router_address": var("vllm_router_worker_address") or "",
            "router_listen_base": var("vllm_router_listen_port_base"),
            "router_policy": var("vllm_router_policy"),
            "base_port": _get(var("vllm_preflight_plan_options") or {}, "base_port", None),
            # what the host's recorded plan gave its instances automatically, where its facts were read (the ports
            # a router reads for a host not planned in this run keep to them, as that host's plan does)
            "slots": _get(_get(facts, "host_resources", {}) or {}, "slots", {}) or {},
        }
    return view
