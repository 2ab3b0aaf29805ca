#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_state
short_description: Record what a converged host looks like, and tell in one call whether it still does
version_added: 1.0.0
description:
  - The converged-host short cut of C(site.yml) (docs/noop.md). After a run that changed and verified a
    host, O(state=record) writes a record of that host (root only, mode 0600) that holds the digest of
    the run's inputs (O(inputs), the plan, the inventory's variables, the collection's code), and a
    signature of everything the stages put in place. On the next run O(state=probe) reads the record and,
    in the same call, everything it lists. The host is converged when the inputs are the same and
    nothing listed changed; the stages that install, fetch, serve, route and guard then do nothing.
  - What a record lists, each read again by the probe, follows.
  - Content files (O(files), globs; a directory stands for every file under it, C(__pycache__) left out)
    by path, SHA-256 of the content, mode, owner and group; a symbolic link by its target. A file added,
    changed, removed or re-linked under the globs is a difference.
  - Large files (O(stat_files), globs, the weights) by size and modification time only, so a run does not
    read hundreds of gigabytes (the weights stage's own check verifies the digests when it runs).
  - Units (O(units)) by their active state and whether they are enabled. A unit stopped, failed, or
    disabled since the record is a difference (a dead instance is restarted by the full run).
  - Users and groups (O(users), O(groups)) must exist.
  - Live, not recorded, with O(state=probe), each router of O(routers) must list exactly its workers
    (vllm-router's C(GET /list_workers) on its loopback address).
  - Any difference, or no record, or other inputs make the host not converged, with the reasons (at most 40,
    every difference found; the inputs', the units', users', groups' and routers' before the files'). O(state=probe) also removes the record then (not in check
    mode), so that a run that fails halfway is never taken for converged by the next one.
options:
  path:
    description: The record file (its directory must exist).
    type: path
    required: true
  state:
    description:
      - V(probe) reads the record and the host (read-only unless the record must go, see above).
      - V(record) writes the record of the host as it is now.
      - V(absent) removes the record.
    type: str
    choices: [probe, record, absent]
    default: probe
  inputs:
    description: Digest of the run's inputs (required with V(probe) and V(record)); compared, never interpreted.
    type: str
  files:
    description: Globs of content files and links to record (V(record) only).
    type: list
    elements: path
    default: []
  stat_files:
    description: Globs of large files recorded by size and modification time (V(record) only).
    type: list
    elements: path
    default: []
  units:
    description: systemd units whose active and enabled states are recorded (V(record) only).
    type: list
    elements: str
    default: []
  users:
    description: Users that must exist (V(record) only).
    type: list
    elements: str
    default: []
  groups:
    description: Groups that must exist (V(record) only).
    type: list
    elements: str
    default: []
  facts:
    description: Values kept in the record and returned by V(probe) (for example the installed vLLM version).
    type: dict
    default: {}
  routers:
    description: Routers whose live worker list must equal C(workers) (V(probe) only).
    type: list
    elements: dict
    default: []
    suboptions:
      url:
        description: The router's loopback URL.
        type: str
        required: true
      workers:
        description: The worker URLs the plan gives it.
        type: list
        elements: str
        required: true
  timeout:
    description: Seconds to wait for each router's answer.
    type: float
    default: 5
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
    details: V(probe) reads only; V(record) and V(absent) report what they would change.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: none
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Is this host converged? (one call)
  inferops.vllm.host_state:
    path: /etc/inferops/vllm/converged.json
    inputs: "{{ digest }}"
    routers: [{url: "http://127.0.0.1:18100", workers: ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]}]
  register: converged

- name: Record the host after a run that changed and verified it
  inferops.vllm.host_state:
    path: /etc/inferops/vllm/converged.json
    state: record
    inputs: "{{ digest }}"
    files: [/etc/inferops/vllm, /etc/systemd/system/vllm-*.service]
    stat_files: [/var/lib/inferops/models/org/Model/0123*/**]
    units: [vllm-a.service]
"""

RETURN = r"""
converged:
  description: Whether the record's inputs equal O(inputs) and nothing it lists changed (V(probe)).
  returned: always
  type: bool
reasons:
  description: What differs, at most 40 lines (V(probe)); empty when converged.
  returned: always
  type: list
  elements: str
facts:
  description: The facts kept in the record (V(probe), when converged).
  returned: always
  type: dict
entries:
  description: How many files, units, users and groups the record lists.
  returned: always
  type: dict
"""

import glob
import grp
import hashlib
import json
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

SCHEMA = 1
MAX_REASONS = 40


def _expand(patterns):
    """Every path the globs name (directories walked), sorted; a link is not followed."""
    out = set()
    for pattern in patterns:
        for path in glob.glob(pattern, recursive=True) or []:
            if os.path.isdir(path) and not os.path.islink(path):
                for root, dirs, files in os.walk(path):
                    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                    out.update(os.path.join(root, name) for name in files)
                    out.update(os.path.join(root, d) for d in dirs if os.path.islink(os.path.join(root, d)))
            else:
                out.add(path)
    return sorted(out)


def _content_sig(path):
    try:
        if os.path.islink(path):
            return "link:" + os.readlink(path)
        st = os.stat(path)
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return "%s %o %d:%d" % (digest.hexdigest(), st.st_mode & 0o7777, st.st_uid, st.st_gid)
    except OSError:
        return None


def _stat_sig(path):
    try:
        if os.path.islink(path):
            return "link:" + os.readlink(path)
        st = os.stat(path)
        return "%d %d %o %d:%d" % (st.st_size, st.st_mtime_ns, st.st_mode & 0o7777, st.st_uid, st.st_gid)
    except OSError:
        return None


def _unit_states(module, units):
    if not units:
        return {}
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        return {unit: "unreadable: no systemctl" for unit in units}
    rc, out, err = module.run_command([systemctl, "show", "--property=Id,ActiveState,UnitFileState", "--"] + list(units))
    # what systemctl could read, even when it also failed for a unit (a unit it does not know still gets a block)
    states, current = {}, {}
    for block in out.strip().split("\n\n"):
        current = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if current.get("Id"):
            states[current["Id"]] = "%s/%s" % (current.get("ActiveState", "?"), current.get("UnitFileState", "") or "-")
    missing = "unreadable: " + (err.strip() or out.strip() or "rc %d" % rc)[:200] if rc != 0 else "unknown"
    return {unit: states.get(unit, missing) for unit in units}


def _signatures(module, rec):
    files = {path: _content_sig(path) for path in _expand(rec.get("globs", []))}
    large = {path: _stat_sig(path) for path in _expand(rec.get("stat_globs", []))}
    return files, large, _unit_states(module, rec.get("units", []))


def _compare(kind, old, new, reasons):
    for path in sorted(set(old) | set(new)):
        if path not in new:
            reasons.append("%s %s is gone" % (kind, path))
        elif path not in old:
            reasons.append("%s %s is new" % (kind, path))
        elif old[path] != new[path]:
            reasons.append("%s %s changed (%s, recorded %s)" % (kind, path, new[path], old[path]))


def _router_reasons(routers, timeout):
    reasons = []
    for router in routers:
        url = router["url"].rstrip("/") + "/list_workers"
        try:
            answer = json.loads(open_url(url, timeout=timeout, validate_certs=False).read())
            live = sorted(str(u).rstrip("/") for u in (answer.get("urls") or []))
        except Exception as exc:  # pylint: disable=broad-except
            reasons.append("router %s does not answer GET /list_workers: %s" % (router["url"], str(exc)[:200]))
            continue
        want = sorted(str(u).rstrip("/") for u in router["workers"])
        if live != want:
            reasons.append("router %s lists %s, the plan %s" % (router["url"], live, want))
    return reasons


def _remove(module, path):
    if not os.path.lexists(path):
        return False
    if not module.check_mode:
        os.unlink(path)
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["probe", "record", "absent"], default="probe"),
            inputs=dict(type="str", no_log=False),
            files=dict(type="list", elements="path", default=[]),
            stat_files=dict(type="list", elements="path", default=[]),
            units=dict(type="list", elements="str", default=[]),
            users=dict(type="list", elements="str", default=[]),
            groups=dict(type="list", elements="str", default=[]),
            facts=dict(type="dict", default={}),
            routers=dict(type="list", elements="dict", default=[], options=dict(
                url=dict(type="str", required=True),
                workers=dict(type="list", elements="str", required=True))),
            timeout=dict(type="float", default=5),
        ),
        required_if=[("state", "probe", ["inputs"]), ("state", "record", ["inputs"])],
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    result = dict(changed=False, converged=False, reasons=[], facts={}, entries={})

    if params["state"] == "absent":
        result["changed"] = _remove(module, path)
        module.exit_json(**result)

    if params["state"] == "record":
        rec = {"schema": SCHEMA, "inputs": params["inputs"], "globs": sorted(set(params["files"]) - {path}),
               "stat_globs": sorted(set(params["stat_files"])), "units": list(params["units"]),
               "users": list(params["users"]), "groups": list(params["groups"]), "facts": params["facts"]}
        files, large, units = _signatures(module, rec)
        files.pop(path, None)
        large.pop(path, None)
        rec.update(files=files, large=large, unit_states=units)
        text = json.dumps(rec, sort_keys=True, indent=1) + "\n"
        try:
            with open(path, encoding="utf-8") as handle:
                old = handle.read()
        except OSError:
            old = None
        result["entries"] = {"files": len(files), "large": len(large), "units": len(units),
                             "users": len(rec["users"]), "groups": len(rec["groups"])}
        if old != text:
            result["changed"] = True
            if not module.check_mode:
                tmp = path + ".tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
                os.chmod(tmp, 0o600)
                os.rename(tmp, path)
        module.exit_json(**result)

    # probe
    reasons = []
    try:
        with open(path, encoding="utf-8") as handle:
            rec = json.load(handle)
        if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
            raise ValueError("unknown schema")
    except (OSError, ValueError) as exc:
        rec = None
        reasons.append("no record of a converged run (%s)" % (exc.strerror if isinstance(exc, OSError) else exc))
    if rec is not None:
        # every difference is listed (the inputs' too): the run's output says what the full run will mend
        if rec.get("inputs") != params["inputs"]:
            reasons.append("the inputs changed (the plan, the inventory's variables or the collection)")
        files, large, units = _signatures(module, rec)
        files.pop(path, None)
        large.pop(path, None)
        for unit, state in sorted(units.items()):
            if state != rec.get("unit_states", {}).get(unit) or state.startswith("unreadable"):
                reasons.append("unit %s is %s (recorded %s)" % (unit, state, rec.get("unit_states", {}).get(unit)))
        for user in rec.get("users", []):
            try:
                pwd.getpwnam(user)
            except KeyError:
                reasons.append("user %s is gone" % user)
        for group in rec.get("groups", []):
            try:
                grp.getgrnam(group)
            except KeyError:
                reasons.append("group %s is gone" % group)
        reasons += _router_reasons(params["routers"], params["timeout"])
        # files last: a changed directory can list many
        _compare("file", rec.get("files", {}), files, reasons)
        _compare("file", rec.get("large", {}), large, reasons)
        result["entries"] = {"files": len(rec.get("files", {})), "large": len(rec.get("large", {})),
                             "units": len(rec.get("units", [])), "users": len(rec.get("users", [])),
                             "groups": len(rec.get("groups", []))}
    result["converged"] = not reasons
    result["reasons"] = reasons[:MAX_REASONS] + (["... %d more" % (len(reasons) - MAX_REASONS)]
                                                 if len(reasons) > MAX_REASONS else [])
    if result["converged"]:
        result["facts"] = rec.get("facts", {})
    elif rec is not None:
        # a run that is not a no-op may fail halfway: its host must not look converged to the next run
        result["changed"] = _remove(module, path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
