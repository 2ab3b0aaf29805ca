# Apache License 2.0 (see LICENSE)
"""Rollout batches that keep every instance spanning hosts in one batch (controller side).

``rollout.yml`` upgrades the fleet in batches (``serial``: ``vllm_rollout_batches``, default
``[1, '25%', '100%']``, the canary hosts first). An instance that spans hosts (``nodes``, see
``docs/multinode.md``) is restarted as one group on all its hosts, so its hosts are one unit of the
rollout: ``rollout_plan`` orders the hosts so that each unit's hosts are adjacent (a unit with a canary
host goes first with it) and grows a batch rather than split a unit. The batch sizes follow Ansible's
``serial`` rules (a percentage of all hosts, rounded down, at least 1; the last size repeats).

The units are read from the hosts' plans (each plan's instances that span hosts name their hosts in rank order,
``multinode.hosts``), never worked out again from the inventory: ``rollout.yml`` and ``maintenance.yml`` plan every
host before they order the batches.
"""
from __future__ import annotations

__all__ = ["rollout_plan", "serial_sizes", "spanned_hosts"]


def _size(value, total) -> int:
    text = str(value).strip()
    if text.endswith("%"):
        return max(1, int(total * float(text[:-1]) / 100))
    return max(1, int(text))


def serial_sizes(batches, total) -> list:
    """Ansible's batch sizes for ``serial: batches`` over ``total`` hosts."""
    batches = list(batches) if isinstance(batches, (list, tuple)) else [batches]
    sizes, done, pos = [], 0, 0
    while done < total:
        size = _size(batches[min(pos, len(batches) - 1)], total) if batches else total
        sizes.append(min(size, total - done))
        done += sizes[-1]
        pos += 1
    return sizes


def spanned_hosts(plan) -> list:
    """The host lists (rank order) of the instances of one host's plan that span hosts."""
    out = []
    for inst in (plan or {}).get("instances") or []:
        hosts = ((inst or {}).get("multinode") or {}).get("hosts") if isinstance(inst, dict) else None
        if isinstance(hosts, list) and len(hosts) > 1:
            out.append([h for h in hosts if isinstance(h, str)])
    return out


def _units(order, plans):
    """Hosts linked by instances that span hosts, as their plans say: host -> its unit's hosts (in rollout order)."""
    parent = {h: h for h in order}

    def find(h):
        while parent[h] != h:
            parent[h] = parent[parent[h]]
            h = parent[h]
        return h

    for host in order:
        for hosts in spanned_hosts(plans.get(host)):
            members = [h for h in hosts if h in parent]
            for other in members[1:]:
                parent[find(other)] = find(members[0])
    units = {}
    for host in order:
        units.setdefault(find(host), []).append(host)
    return {h: units[find(h)] for h in order}


def rollout_plan(plans, order, batches) -> dict:
    """``order``: the rollout's hosts (canary first); ``plans``: host -> its plan (``vllm_preflight_plan``).

    Returns ``order`` (hosts, each unit's hosts adjacent, units in the order of their first host),
    ``serial`` (the batch sizes to give ``serial``), ``batches`` (the hosts of each batch) and
    ``units`` (the units of more than one host).
    """
    order = list(dict.fromkeys(order))
    unit_of = _units(order, plans)
    ordered, seen = [], set()
    for host in order:
        if host not in seen:
            ordered.extend(unit_of[host])
            seen.update(unit_of[host])
    wanted = serial_sizes(batches, len(ordered))
    out_batches, pos, step = [], 0, 0
    while pos < len(ordered):
        target = wanted[min(step, len(wanted) - 1)]
        batch = []
        while pos < len(ordered) and len(batch) < target:
            unit = unit_of[ordered[pos]]
            batch.extend(unit)
            pos += len(unit)
        out_batches.append(batch)
        step += 1
    multi = []
    for host in ordered:
        if len(unit_of[host]) > 1 and unit_of[host] not in multi:
            multi.append(unit_of[host])
    return {"order": ordered, "serial": [len(b) for b in out_batches], "batches": out_batches, "units": multi}
