# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""The transition of one host from what its instance units run now to the plan (docs/operate.md, "Transitions").

A plan change is not a list of changed units: an instance that moves onto GPUs (or a port) another
instance is leaving cannot start until that one stopped, or its start check (``vllm-gpu-idle``) refuses
and the node is stuck. This module orders the steps of one host's service stage:

* ``restart`` an instance of the plan (drained at its front door, stopped, started, gated, put back);
* ``stop`` an instance: one removed from the plan (drained first, its files are removed after the
  steps), or one that must make room for another and starts later in the same transition.

Inputs are what the host runs *now*, read from each instance unit's main process (its
``CUDA_VISIBLE_DEVICES``, ``--port`` and ``VLLM_PORT``; the unit's own settings when the process cannot
be read), not the recorded plan: after a run that failed half-way, the next run starts from the truth
and resumes without a hand on the node.

The order: the instances to (re)start are taken in the plan's order, those that serve nothing now (new
or stopped) before those that run (make before break); the first whose resources are free (or held
only by itself, by removed instances, or by settled instances the plan lets it share GPUs with) goes
next. When none is free (a cycle: two instances swapping GPUs), the first is started
after stopping those that hold what it needs; they start later in the order. Removed instances
that are in nobody's way stop last, so a renamed instance serves its model with no gap when it can.

A *gap* is a time during the transition when a model that this host served before and serves after
has no instance up on this host (its only instance moves, or all its instances swap GPUs). Gaps are
said before anything changes; instances of the model on other hosts are not counted.
"""
from __future__ import annotations

import re

# ActiveState values of a unit whose process holds (or is about to take again) its GPUs and ports
HOLDING_STATES = ("active", "activating", "deactivating", "reloading", "refreshing")

_PORT_ARG = re.compile(r"^--port(?:=(\d+))?$")


class TransitionError(ValueError):
    """The transition cannot be done by this role (the messages say why and what to do)."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def _int_or_none(value):
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _env_value(text, name):
    """The value of ``name`` in ``systemctl show -p Environment`` output or a NUL-split environ."""
    for token in re.split(r"[\s\x00]+", text or ""):
        if token.startswith(name + "="):
            return token[len(name) + 1:]
    return None


def _port_from_argv(argv):
    for pos, token in enumerate(argv):
        match = _PORT_ARG.match(token)
        if match:
            return _int_or_none(match.group(1) if match.group(1) else (argv[pos + 1] if pos + 1 < len(argv) else None))
    return None


def parse_live(text):
    """Rows of the service role's live probe -> one dict per instance unit on the host.

    One line per unit, tab-separated: ``unit``, instance ``name``, ``ActiveState``, ``MainPID``, the main
    process's environment (NUL-separated, or ``-`` when it cannot be read), its command line
    (NUL-separated, or ``-``) and the unit's ``Environment=`` (``systemctl show`` form). Lines that do not
    start with ``live`` are ignored.
    """
    units = []
    for line in (text or "").splitlines():
        cells = line.split("\t")
        if len(cells) < 8 or cells[0] != "live":
            continue
        _tag, unit, name, state, pid, environ, cmdline, unit_env = cells[:8]
        from_process = environ not in ("", "-")
        env_text = environ.replace("\\0", "\x00") if from_process else unit_env
        argv = [t for t in cmdline.replace("\\0", "\x00").split("\x00") if t] if cmdline not in ("", "-") else []
        cvd = _env_value(env_text, "CUDA_VISIBLE_DEVICES")
        units.append({
            "unit": unit,
            "name": name or re.sub(r"\.service$", "", unit),
            "state": state,
            "pid": _int_or_none(pid) or 0,
            "source": "process" if from_process else "unit",
            "gpus": [t.strip() for t in (cvd or "").split(",") if t.strip()],
            "port": _port_from_argv(argv),
            "vllm_port": _int_or_none(_env_value(env_text, "VLLM_PORT")),
        })
    return units


def _planned_resources(inst):
    res = {"gpu:" + str(g).lower() for g in list(inst.get("gpus") or []) + list(inst.get("gpu_uuids") or [])}
    if inst.get("port") is not None:
        res.add("port:%s" % inst["port"])
    if inst.get("vllm_port") is not None:
        res.add("vport:%s" % inst["vllm_port"])
    return res


def _live_resources(unit, recorded_instance):
    res = {"gpu:" + str(g).lower() for g in unit.get("gpus") or []}
    port = unit.get("port")
    vport = unit.get("vllm_port")
    if recorded_instance:
        # what the process does not tell (a process that cannot be read): the plan it was configured from
        port = port if port is not None else recorded_instance.get("port")
        vport = vport if vport is not None else recorded_instance.get("vllm_port")
        if not res and unit.get("source") != "process":
            res = {"gpu:" + str(g).lower() for g in recorded_instance.get("gpus") or []}
    if port is not None:
        res.add("port:%s" % port)
    if vport is not None:
        res.add("vport:%s" % vport)
    return res


def _frontdoor_of(plan, name):
    for door in (plan or {}).get("frontdoors") or []:
        if door.get("router") or door.get("worker"):
            # a router's front door (its one backend is the router) or a worker listener (the router's own drain,
            # the routers step, takes the instance out of the router that uses it)
            continue
        for backend in door.get("backends") or []:
            if backend.get("instance") == name:
                return door.get("name") or ""
    return ""


def _routers_of(plan, name):
    return [dict(w) for w in (plan or {}).get("router_workers") or [] if w.get("instance") == name]


#: A step that does nothing: it holds a host back while another host takes a worker of the same router out.
WAIT_STEP = {"action": "wait", "name": "", "unit": "", "why": "another host's instance of the same router goes first",
             "removed": False, "drain_frontdoor": "", "drain_url": "", "frontdoor": "", "url": "", "routers": [],
             "routers_back": []}


def align_router_waves(steps_by_host, hosts):
    """Each host's steps, padded with ``WAIT_STEP`` so that no two hosts stop or restart a worker of the same router
    at the same step position (the service role runs step N on every host before step N + 1, so a router always
    keeps its other workers while one is out). ``hosts``: the play's hosts, in order; ``steps_by_host``: host ->
    that host's ``plan_transition`` steps. The same answer on every host."""
    taken, out = {}, {}
    for host in hosts:
        pos, padded = 0, []
        for step in steps_by_host.get(host) or []:
            # only a running instance taken out costs its router a worker (a new one only joins)
            keys = {(r.get("router_host"), r.get("router")) for r in step.get("routers") or []}
            while any(pos in taken.get(k, ()) for k in keys):
                padded.append(dict(WAIT_STEP))
                pos += 1
            for key in keys:
                taken.setdefault(key, set()).add(pos)
            padded.append(step)
            pos += 1
        out[host] = padded
    return out


def _describe(resources, index_of=None):
    """``{"gpu:<uuid>", "port:8000"}`` -> ``GPU 2 and port 8000`` (GPUs by index where the plans know it)."""
    index_of = index_of or {}
    gpus = sorted({index_of.get(r[4:], r[4:]) for r in resources if r.startswith("gpu:")},
                  key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g))
    ports = sorted(r[5:] for r in resources if r.startswith("port:"))
    vports = sorted(r[6:] for r in resources if r.startswith("vport:"))
    parts = (["GPU " + ",".join(gpus)] if gpus else []) + (["port " + ",".join(ports)] if ports else [])
    return " and ".join(parts + (["VLLM_PORT " + ",".join(vports)] if vports else [])) or "nothing"


def plan_transition(live, instances, restart, recorded=None, plan=None, prune=True):
    """The ordered steps of this host's service stage; see the module docstring.

    ``live``: ``parse_live`` rows (every instance unit on the host). ``instances``: the plan's instances.
    ``restart``: names of planned instances the run (re)starts (changed, pending, not running).
    ``recorded``: the plan the host was configured from before this run (``plan.json``) or None.
    ``plan``: the new plan (its front doors). ``prune``: removed instances are stopped (else they stay
    and an instance that needs what they hold cannot start: a problem, said before anything changes).

    Returns ``{"steps", "gaps", "removed", "problems", "lines"}``; ``steps`` are dicts with ``action``
    (``stop``/``restart``), ``name``, ``unit``, ``why``, ``removed``, ``drain_frontdoor`` and ``drain_url``
    (where its running process is drained first: the recorded plan's front door, else the new plan's),
    ``frontdoor`` and ``url`` (where a restarted instance is put back: the new plan's).
    """
    work = _Transition(live, instances, restart, recorded, plan, prune)
    work.order()
    planned, steps, problems = work.planned, work.steps, work.problems
    removed = sorted(u["name"] for u in live or [] if u["name"] not in planned)
    gaps = [] if problems else _gaps(_before_models(live, work.recorded_by_name, planned, work.restart), steps,
                                     planned)
    return {"steps": steps, "gaps": gaps, "removed": removed, "problems": problems,
            "lines": describe(steps, gaps, problems)}


class _Transition:
    """The state of one ordering: who holds what now (``holders``), who still has to (re)start (``pending``)."""

    def __init__(self, live, instances, restart, recorded, plan, prune):
        self.recorded, self.plan = recorded, plan
        self.recorded_by_name = {i.get("name"): i for i in (recorded or {}).get("instances") or []
                                 if isinstance(i, dict)}
        self.planned = {i["name"]: i for i in instances}
        self.restart = set(restart or ())
        self.new_res = {name: _planned_resources(inst) for name, inst in self.planned.items()}
        self.index_of = {}
        for inst in list(self.recorded_by_name.values()) + list(instances):
            self.index_of.update({str(u).lower(): str(g)
                                  for g, u in zip(inst.get("gpus") or [], inst.get("gpu_uuids") or [])})
        self.holders = {}
        for unit in live or []:
            if unit.get("state") not in HOLDING_STATES:
                continue
            name = unit["name"]
            is_planned = name in self.planned
            self.holders[name] = {
                "unit": unit["unit"],
                "res": _live_resources(unit, self.recorded_by_name.get(name)),
                "planned": is_planned,
                "removed": not is_planned,
                # a planned instance that is not restarted runs what the plan says (what it may share)
                "settled": is_planned and name not in self.restart,
                "fixed": (is_planned and bool(self.planned[name].get("multinode"))) or (not is_planned and not prune),
            }
        self.original = {name: holder["res"] for name, holder in self.holders.items()}
        self.pending = [i["name"] for i in instances if not i.get("multinode") and i["name"] in self.restart]
        self.steps, self.problems = [], []

    def _shareable(self, holder_name, name, overlap):
        holder = self.holders[holder_name]
        return (holder["settled"] and all(r.startswith("gpu:") for r in overlap)
                and holder["unit"] in (self.planned[name].get("share_gpus_with") or []))

    def _blockers(self, name):
        out = []
        for other, holder in self.holders.items():
            if other == name:
                continue
            overlap = holder["res"] & self.new_res[name]
            if overlap and not self._shareable(other, name, overlap):
                out.append((other, overlap))
        return out

    def _step(self, action, name, unit, why):
        """Drained where its running process serves (the recorded plan's front door, else the new plan's);
        put back (after a restart) where the new plan puts it."""
        rec = self.recorded_by_name.get(name) or {}
        new = self.planned.get(name) or {}
        old_door = _frontdoor_of(self.recorded, name) if rec else ""
        self.steps.append({
            "action": action, "name": name, "unit": unit, "why": why, "removed": name not in self.planned,
            "drain_frontdoor": old_door or _frontdoor_of(self.plan, name),
            "drain_url": (rec.get("url") if old_door else new.get("url")) or "",
            "frontdoor": _frontdoor_of(self.plan, name) if action == "restart" else "",
            "url": new.get("url") or "",
            # the routers (router.py) that send it requests now (only if it runs now: a stop, or a restart of a
            # running instance), and those that get it back after a restart
            "routers": _routers_of(self.plan if new else self.recorded, name)
            if action == "stop" or name in self.holders else [],
            "routers_back": _routers_of(self.plan, name) if action == "restart" else [],
        })

    def _stop(self, other, why):
        holder = self.holders.pop(other)
        self._step("stop", other, holder["unit"], why)

    def _next(self):
        """Make before break: instances that serve nothing now (new, stopped) start before running ones restart;
        the first one nothing that stays blocks, else the first pending (a swap: something must stop first)."""
        for name in [n for n in self.pending if n not in self.holders] + [n for n in self.pending if n in self.holders]:
            blocking = [b for b, _o in self._blockers(name)
                        if not self.holders[b]["removed"] or self.holders[b]["fixed"]]
            if not blocking:
                return name
        return self.pending[0]

    def _free(self, chosen):
        """Stop whatever holds what ``chosen`` needs; a holder this run may not stop is a problem."""
        for other, overlap in self._blockers(chosen):
            holder = self.holders[other]
            what = _describe(overlap, self.index_of)
            if holder["fixed"]:
                self.problems.append(
                    "instance '%s' needs %s, held by %s, which this run does not stop (%s); stop it first or %s" % (
                        chosen, what, holder["unit"],
                        "an instance that spans hosts restarts as a group" if holder["planned"]
                        else "removed from the plan, but vllm_service_prune is false",
                        "change the plan" if holder["planned"] else "set vllm_service_prune: true"))
                continue
            if holder["removed"]:
                why = "removed from the plan; %s frees %s for %s" % (other, what, chosen)
            else:
                why = "frees %s for %s, which starts before it" % (what, chosen)
                if other not in self.pending:  # a settled instance in the way: it restarts too
                    self.pending.append(other)
            self._stop(other, why)

    def order(self):
        """Fill ``steps`` (or ``problems``): every pending instance restarts once what it needs is free."""
        planned = self.planned
        while self.pending:
            chosen = self._next()
            self._free(chosen)
            if self.problems:
                break
            why = _why(chosen, self.original.get(chosen), self.new_res[chosen], self.recorded_by_name, self.steps,
                       self.index_of)
            rec = self.recorded_by_name.get(chosen)
            if rec and rec.get("model", {}).get("key") != planned[chosen]["model"]["key"]:
                why += "; model %s -> %s" % (rec.get("model", {}).get("key"), planned[chosen]["model"]["key"])
            self._step("restart", chosen, planned[chosen]["unit"], why)
            self.holders[chosen] = {"unit": planned[chosen]["unit"], "res": self.new_res[chosen], "planned": True,
                                    "removed": False, "settled": True, "fixed": False}
            self.pending.remove(chosen)
        if not self.problems:
            for other in [n for n, h in self.holders.items() if h["removed"] and not h["fixed"]]:
                self._stop(other, "removed from the plan")


def _why(name, was, now, recorded_by_name, steps, index_of):
    """Why an instance (re)starts: new, not running, changed, or where it moves (only what differs)."""
    stopped = [pos for pos, st in enumerate(steps, 1) if st["name"] == name and st["action"] == "stop"]
    if was is None:
        return "new" if name not in recorded_by_name else "not running"
    moved = []
    for kind in ("gpu:", "port:", "vport:"):
        before, after = {r for r in was if r.startswith(kind)}, {r for r in now if r.startswith(kind)}
        # a GPU spelt by index in one and by UUID in the other is the same GPU
        if kind == "gpu:" and {index_of.get(r[4:], r[4:]) for r in before} == {
                index_of.get(r[4:], r[4:]) for r in after if r[4:] in index_of}:
            continue
        if before != after:
            moved.append((before, after))
    text = "; ".join("moves from %s to %s" % (_describe(b, index_of), _describe(a, index_of)) for b, a in moved)
    text = text or "changed"
    return text + ("; stopped at step %d to make room" % stopped[0] if stopped else "")


def _before_models(live, recorded_by_name, planned, restart):
    """{name: model key} of the instances serving before the transition."""
    out = {}
    for unit in live or []:
        if unit.get("state") != "active":
            continue
        rec = recorded_by_name.get(unit["name"])
        if rec and rec.get("model", {}).get("key"):
            out[unit["name"]] = rec["model"]["key"]
        elif unit["name"] in planned and unit["name"] not in restart:
            out[unit["name"]] = planned[unit["name"]]["model"]["key"]
    return out


def _gaps(serving_before, steps, planned):
    serving = dict(serving_before)
    before = set(serving.values())
    after = {inst["model"]["key"] for inst in planned.values()}
    watched = before & after
    gaps, open_gap = [], {}
    for pos, step in enumerate(steps, 1):
        serving.pop(step["name"], None)
        for model in sorted(watched):
            if model not in serving.values() and model not in open_gap:
                open_gap[model] = pos
        if step["action"] == "restart":
            serving[step["name"]] = planned[step["name"]]["model"]["key"]
            for model in sorted(open_gap):
                if model in serving.values():
                    gaps.append({"model": model, "from_step": open_gap.pop(model), "to_step": pos})
    for model, start in sorted(open_gap.items()):
        gaps.append({"model": model, "from_step": start, "to_step": None})
    return gaps


def describe(steps, gaps, problems):
    """The transition as lines for the play output (also in check mode)."""
    if problems:
        return ["The transition cannot be done:"] + ["  - " + p for p in problems]
    if not steps:
        return ["No instance to stop or (re)start."]
    lines = ["%d step(s), in this order:" % len(steps)]
    for pos, step in enumerate(steps, 1):
        door = (", drained at front door %s first" % step["drain_frontdoor"]) if step["drain_frontdoor"] else ""
        verb = "restart+gate" if step["action"] == "restart" else "stop"
        lines.append("  %d. %-12s %s (%s%s)" % (pos, verb, step["unit"], step["why"], door))
    for gap in gaps:
        end = ("until step %d passes its gate" % gap["to_step"]) if gap["to_step"] else "until the end"
        lines.append("  GAP: model %s has no instance up on this host from step %d %s" % (
            gap["model"], gap["from_step"], end))
    if not gaps:
        lines.append("  No gap: every model served before keeps an instance up on this host throughout.")
    return lines
