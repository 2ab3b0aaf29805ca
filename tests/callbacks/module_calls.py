# -*- coding: utf-8 -*-
# A callback of the tests (issue 42): counts, per host and per stage (role), the module calls that reach each host,
# so that a converged host's cost is a number a test can bound (not a timing). Enabled by the Molecule scenarios
# that check it (ANSIBLE_CALLBACK_PLUGINS=tests/callbacks, ANSIBLE_CALLBACKS_ENABLED=module_calls).
#
# A module call reaching the host: a task that ran for the host (not skipped), whose action runs a module there
# (not a controller-side action such as set_fact, assert, debug, include_*), and was not delegated to the
# controller; a loop counts each item that ran, an `until` each attempt.
# The counts are printed after the recap and, when INFEROPS_MODULE_CALLS_FILE is set, appended to that file as one
# JSON line per playbook run: {"playbook": ..., "hosts": {host: {"calls": n, "stages": {stage: n}, "tasks": [...]}}}.
from __future__ import annotations

DOCUMENTATION = r"""
name: module_calls
type: aggregate
short_description: Count the module calls that reach each host, per stage
description:
  - A test helper of inferops.vllm, not part of the collection; see the comment at the top of the file.
requirements:
  - enable in configuration
"""

import json
import os
import time
from collections import defaultdict

from ansible.plugins.callback import CallbackBase

CONTROLLER_ACTIONS = {
    "set_fact", "assert", "debug", "fail", "meta", "include_tasks", "import_tasks", "include_role",
    "import_role", "include_vars", "add_host", "group_by", "set_stats", "validate_argument_spec", "pause",
    "import_playbook", "noop",
}
LOCAL = {"localhost", "127.0.0.1", "::1"}


def _short(action):
    return str(action or "").rsplit(".", 1)[-1]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_calls"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.playbook = None
        self.hosts = defaultdict(lambda: {"calls": 0, "stages": defaultdict(int), "tasks": []})
        # wall time per task (INFEROPS_MODULE_CALLS_TIMES=N prints the N slowest): where a run's seconds go
        self.started, self.current, self.times = None, None, []

    def _close_task(self):
        if self.current is not None:
            self.times.append((time.monotonic() - self.started, self.current))
        self.current = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close_task()
        role = task._role.get_name(include_role_fqcn=False) if task._role else "play"  # pylint: disable=protected-access
        self.started, self.current = time.monotonic(), f"{role}: {task.get_name()}"

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_start(self, playbook):
        self.playbook = os.path.basename(getattr(playbook, "_file_name", "") or "")

    def _count(self, result):
        task = result._task  # pylint: disable=protected-access
        if _short(task.action) in CONTROLLER_ACTIONS:
            return
        delegate = task.delegate_to
        if delegate and str(delegate) in LOCAL:
            return
        res = result._result  # pylint: disable=protected-access
        if isinstance(res.get("results"), list):
            calls = sum(1 for item in res["results"] if isinstance(item, dict) and not item.get("skipped"))
        else:
            calls = int(res.get("attempts") or 1)
        if not calls:
            return
        host = str(delegate) if delegate else result._host.get_name()  # pylint: disable=protected-access
        role = task._role.get_name(include_role_fqcn=False) if task._role else "play"  # pylint: disable=protected-access
        entry = self.hosts[host]
        entry["calls"] += calls
        entry["stages"][role] += calls
        entry["tasks"].append(f"{role}: {task.get_name()} x{calls}")

    def v2_runner_on_ok(self, result):
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result)

    def v2_playbook_on_stats(self, stats):
        self._close_task()
        slowest = int(os.environ.get("INFEROPS_MODULE_CALLS_TIMES") or 0)
        if slowest:
            self._display.banner(f"SLOWEST {slowest} TASKS OF {len(self.times)} ({sum(t for t, _n in self.times):.1f} s in all)")
            for took, name in sorted(self.times, reverse=True)[:slowest]:
                self._display.display(f"{took:7.2f} s  {name}")
        if not self.hosts:
            return
        self._display.banner("MODULE CALLS PER HOST (tests/callbacks/module_calls.py)")
        for host in sorted(self.hosts):
            entry = self.hosts[host]
            stages = ", ".join(f"{k} {v}" for k, v in entry["stages"].items())
            self._display.display(f"{host}: {entry['calls']} module calls ({stages})")
        path = os.environ.get("INFEROPS_MODULE_CALLS_FILE")
        if path:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"playbook": self.playbook,
                                         "hosts": {h: dict(e, stages=dict(e["stages"])) for h, e in self.hosts.items()}})
                             + "\n")
