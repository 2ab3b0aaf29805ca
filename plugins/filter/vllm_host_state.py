# Apache License 2.0 (see LICENSE)
"""Filters of the converged-host short cut of site.yml (docs/noop.md; the module ``host_state`` reads the host).

``vllm_inputs_digest``: one digest of what a run's stages read: the host's plan, the host's variables named
``vllm_*`` or ``inferops_*`` (inventory, extra vars; the run's own ``__`` facts left out) and the collection's
code (its roles, plugins and playbooks, hashed once per controller process).
``vllm_converged_hosts``: the hosts whose probe found them converged, less those that share an instance spanning
hosts with a host that is not (every rank of a group runs, or none).
"""
from __future__ import annotations

import hashlib
import json
import os
import re

from ansible.errors import AnsibleFilterError

_CODE = {}
_NAMES = re.compile(r"^(?!.*__)(vllm|inferops)_")
_TREES = ("roles", "plugins", "playbooks", "galaxy.yml", "meta")


def _code_digest(root):
    root = os.path.realpath(str(root))
    if root not in _CODE:
        digest = hashlib.sha256()
        for top in _TREES:
            base = os.path.join(root, top)
            paths = [base] if os.path.isfile(base) else []
            for folder, dirs, files in os.walk(base):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                paths += [os.path.join(folder, f) for f in sorted(files) if not f.endswith((".pyc", ".pyo"))]
            for path in paths:
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as handle:
                    digest.update(hashlib.sha256(handle.read()).digest())
        _CODE[root] = digest.hexdigest()
    return _CODE[root]


def _plain(value):
    """JSON-able copy of a templated value (Ansible's lazy containers and tagged strings included)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def vllm_inputs_digest(variables, plan, code_root):
    """sha256 hex of the plan, the host's ``vllm_*``/``inferops_*`` variables and the collection's code."""
    if not isinstance(plan, dict):
        raise AnsibleFilterError("vllm_inputs_digest: the plan must be the vllm_preflight plan (a dict)")
    values = {}
    for name in sorted(str(k) for k in variables.keys() if _NAMES.match(str(k))):
        try:
            values[name] = _plain(variables[name])
        except Exception as exc:  # pylint: disable=broad-except  # a variable that does not template here
            values[name] = "<%s>" % type(exc).__name__
    try:
        code = _code_digest(code_root)
    except OSError as exc:
        raise AnsibleFilterError("vllm_inputs_digest: cannot read the collection at %s: %s" % (code_root, exc)) from exc
    text = json.dumps({"plan": _plain(plan), "vars": values, "code": code}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def vllm_converged_hosts(probes, plans):
    """Hosts (sorted) whose probe says converged and whose instances that span hosts span only such hosts.

    ``probes``: host -> the host_state probe's result; ``plans``: host -> its plan."""
    if not isinstance(probes, dict) or not isinstance(plans, dict):
        raise AnsibleFilterError("vllm_converged_hosts: expects host -> probe result and host -> plan")
    ok = {h for h, res in probes.items() if isinstance(res, dict) and res.get("converged") is True}
    spans = {h: [set((inst.get("multinode") or {}).get("hosts") or [])
                 for inst in (plans.get(h) or {}).get("instances") or [] if isinstance(inst, dict)] for h in ok}
    while True:  # a host that runs takes every group it is in with it, and so on
        gone = {h for h in ok if not all(span <= ok for span in spans[h])}
        if not gone:
            return sorted(ok)
        ok -= gone


class FilterModule:
    """Converged hosts."""

    def filters(self):
        return {"vllm_inputs_digest": vllm_inputs_digest, "vllm_converged_hosts": vllm_converged_hosts}
