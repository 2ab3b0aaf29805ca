#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_files
short_description: Ensure many directories and small files on a host in one module call
version_added: 1.0.0
description:
  - Ensures each directory of O(directories) exists with its owner, group and mode, then each file
    of O(files) has exactly its content, owner, group and mode, all in one module call (one round
    trip to the host instead of two per item for M(ansible.builtin.file), M(ansible.builtin.copy) or
    M(ansible.builtin.template) in a loop). The roles of this collection use it for their layouts,
    helper scripts, environment files and systemd units, which made an idempotent C(site.yml) run
    much faster.
  - A missing directory is created with its missing parents; the parents it creates get the same
    owner, group and mode, like M(ansible.builtin.file) does.
  - A file whose content differs is written to a temporary file in its own directory, checked with
    its O(files[].validate) command when given, and moved over the old one atomically. A file whose
    content is the same is not rewritten; only its owner, group and mode are corrected.
  - Directories are handled before files, in the order given, so a file may live in a directory of
    the same call.
options:
  directories:
    description: Directories to ensure, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the directory.
        type: path
        required: true
      owner:
        description: Owner (name or uid); unchanged when omitted.
        type: str
      group:
        description: Group (name or gid); unchanged when omitted.
        type: str
      mode:
        description: Mode as an octal string such as C("0750"), or a symbolic mode; unchanged when omitted.
        type: raw
  files:
    description: Files to ensure, in order, after the directories.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file. Its directory must exist (or be in O(directories)).
        type: path
        required: true
      content:
        description:
          - The whole content of the file, as text (written as UTF-8).
          - For a template use C(lookup('ansible.builtin.template', ...)); for a file of the
            controller C(lookup('ansible.builtin.file', ..., rstrip=false)).
        type: str
        required: true
      owner:
        description: Owner (name or uid); unchanged when omitted (a new file belongs to the connecting user).
        type: str
      group:
        description: Group (name or gid); unchanged when omitted.
        type: str
      mode:
        description: Mode as an octal string such as C("0644"), or a symbolic mode. A new file without it gets C(0600).
        type: raw
      validate:
        description:
          - Command that checks the new content before it replaces the file; C(%s) stands for the
            temporary file's path and must appear. Runs only when the content changes. A non-zero
            exit fails the module and leaves the old file in place.
        type: str
  show_content:
    description:
      - Whether the diff (C(--diff)) shows the files' old and new content. Set to false for files
        that hold secrets, together with C(no_log) on the task; the diff then names the files only.
    type: bool
    default: true
attributes:
  check_mode:
    description: Can run in check mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check mode), when in diff mode.
    support: full
notes:
  - Text files only, meant for configuration and scripts (up to a few MiB each); use
    M(ansible.builtin.copy) for large or binary files.
  - In check mode an owner or group that does not exist yet (a user created earlier in the same
    run) makes the path count as changed instead of failing.
seealso:
  - module: ansible.builtin.file
  - module: ansible.builtin.copy
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Layout and helper scripts in one call
  inferops.vllm.host_files:
    directories:
      - {path: /opt/inferops/tools, owner: root, group: root, mode: "0755"}
      - {path: /var/lib/inferops/models, owner: vllm, group: vllm, mode: "0750"}
    files:
      - path: /opt/inferops/tools/vllm-gpu-idle
        content: "{{ lookup('ansible.builtin.file', 'vllm-gpu-idle', rstrip=false) }}"
        owner: root
        group: root
        mode: "0755"
      - path: /etc/systemd/system/vllm-chat.service
        content: "{{ lookup('ansible.builtin.template', 'vllm-instance.service.j2') }}"
        mode: "0644"
        validate: /usr/bin/systemd-analyze verify %s
  register: layout

- name: Environment files with secrets (no content in logs or diffs)
  inferops.vllm.host_files:
    files:
      - {path: /etc/inferops/vllm/chat.env, content: "API_KEY={{ api_key }}\n", owner: root, group: root, mode: "0600"}
    show_content: false
  no_log: true
"""

RETURN = r"""
changed_paths:
  description: Paths that were created or changed (content, owner, group or mode), in order; in
    check mode, those that would be.
  returned: always
  type: list
  elements: str
  sample: [/var/lib/inferops/models, /etc/systemd/system/vllm-chat.service]
content_changed:
  description: Files whose content was (or would be) written, in order.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/vllm-chat.service]
"""

import errno
import grp
import os
import pwd
import shlex
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native


def _unknown_owner(spec):
    """Whether the owner or group of spec names a user or group this host does not have."""
    for key, lookup in (("owner", pwd.getpwnam), ("group", grp.getgrnam)):
        value = spec.get(key)
        if value is None or str(value).isdecimal():
            continue
        try:
            lookup(value)
        except KeyError:
            return True
    return False


def _attrs(spec, path):
    return {"path": path, "owner": spec.get("owner"), "group": spec.get("group"), "mode": spec.get("mode"),
            "secontext": None, "attributes": None}


def _fix_attributes(module, spec, path, diff):
    """Correct owner, group and mode of an existing path; True when something (would) change."""
    if module.check_mode and _unknown_owner(spec):
        return True
    return module.set_fs_attributes_if_different(_attrs(spec, path), False, diff=diff, expand=False)


def ensure_directory(module, spec, diffs):
    path = spec["path"]
    if not os.path.isabs(path):
        module.fail_json(msg="directories: %s is not an absolute path" % path)
    if os.path.isdir(path):
        diff = {"before": {"path": path}, "after": {"path": path}}
        changed = _fix_attributes(module, spec, path, diff)
        if changed:
            diffs.append(diff)
        return changed
    if os.path.lexists(path):
        module.fail_json(msg="directories: %s exists and is not a directory" % path)
    # the parents to create, outermost first
    missing = []
    cur = path
    while not os.path.lexists(cur):
        missing.insert(0, cur)
        cur = os.path.dirname(cur)
    if not os.path.isdir(cur):
        module.fail_json(msg="directories: cannot create %s: %s is not a directory" % (path, cur))
    diffs.append({"before": {"path": path, "state": "absent"}, "after": {"path": path, "state": "directory"}})
    if module.check_mode:
        return True
    for new in missing:
        try:
            os.mkdir(new)
        except OSError as exc:
            if exc.errno != errno.EEXIST:
                module.fail_json(msg="directories: cannot create %s: %s" % (new, to_native(exc)))
        module.set_fs_attributes_if_different(_attrs(spec, new), False, expand=False)
    return True


def _run_validate(module, command, tmp, path):
    if "%s" not in command:
        module.fail_json(msg="files: validate of %s must contain %%s, got %r" % (path, command))
    rc, out, err = module.run_command(command % shlex.quote(tmp), use_unsafe_shell=False)
    if rc != 0:
        module.fail_json(msg="files: the new content of %s failed validation (%s): %s" % (
            path, command, (err or out).strip()[-2000:]), rc=rc, stdout=out, stderr=err)


def ensure_file(module, spec, show, diffs):
    path = spec["path"]
    if not os.path.isabs(path):
        module.fail_json(msg="files: %s is not an absolute path" % path)
    wanted = to_bytes(spec["content"], errors="surrogate_or_strict")
    exists = os.path.lexists(path)
    if exists and (os.path.islink(path) or not os.path.isfile(path)):
        module.fail_json(msg="files: %s exists and is not a regular file" % path)
    before = None
    if exists:
        with open(path, "rb") as handle:
            before = handle.read()
    content_changed = before != wanted
    changed = content_changed
    if content_changed:
        diff = {"before_header": path if exists else "%s (absent)" % path, "after_header": path}
        if show:
            diff["before"] = to_native(before or b"", errors="surrogate_or_replace")
            diff["after"] = to_native(wanted, errors="surrogate_or_replace")
        else:
            diff["before"] = "(content not shown)\n" if exists else ""
            diff["after"] = "(content not shown: changed)\n"
        diffs.append(diff)
    if content_changed and not module.check_mode:
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            module.fail_json(msg="files: the directory of %s does not exist" % path)
        # mkstemp makes it 0600; over an existing file, atomic_move gives it that file's mode and owner
        fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(wanted)
            if spec.get("validate"):
                _run_validate(module, spec["validate"], tmp, path)
            module.atomic_move(tmp, path, unsafe_writes=False)
            if not exists and spec.get("mode") is None:
                os.chmod(path, 0o600)  # atomic_move gives a new file the umask's mode
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    if exists or not module.check_mode:
        diff = {"before": {"path": path}, "after": {"path": path}}
        if _fix_attributes(module, spec, path, diff):
            changed = True
            if not content_changed:
                diffs.append(diff)
    return changed, content_changed


def main():
    path_spec = dict(
        path=dict(type="path", required=True),
        owner=dict(type="str"),
        group=dict(type="str"),
        mode=dict(type="raw"),
    )
    file_spec = dict(path_spec, content=dict(type="str", required=True), validate=dict(type="str"))
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", options=path_spec, default=[]),
            files=dict(type="list", elements="dict", options=file_spec, default=[]),
            show_content=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    changed_paths, content_changed, diffs = [], [], []
    for spec in module.params["directories"]:
        if ensure_directory(module, spec, diffs):
            changed_paths.append(spec["path"])
    for spec in module.params["files"]:
        changed, written = ensure_file(module, spec, module.params["show_content"], diffs)
        if changed:
            changed_paths.append(spec["path"])
        if written:
            content_changed.append(spec["path"])
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths, "content_changed": content_changed}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
