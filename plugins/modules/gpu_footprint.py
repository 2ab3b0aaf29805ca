#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_footprint
short_description: Fail when GPU memory use differs from what the placement expects
version_added: 1.0.0
description:
  - Reads the memory in use on every GPU and the processes holding it (C(nvidia-smi
    --query-gpu) and C(--query-compute-apps), 2 calls per reading, with C(LC_ALL=C)), compares
    it with O(expected), and fails with one message that names every deviating GPU, what it uses,
    the range it should be in, the expectation (instance) it belongs to and who holds its memory
    (pid, process name, systemd unit).
  - Catches a model that did not load (or only partly), stray processes on GPUs that should be
    idle, memory on the wrong GPUs and, with O(expected[].unit), memory held by another instance
    or by a process outside the instance's systemd unit.
  - GPUs not named in O(expected) must use at most O(idle_max_mib), unless O(idle_gpus=ignore).
  - Read-only; runs the same in check mode.
options:
  expected:
    description:
      - What each instance should hold, one entry per instance. The placement plan (filter
        C(inferops.vllm.gpu_plan)) emits exactly these entries.
      - Each GPU named in an entry must use the entry's amount within its tolerance.
      - An empty list means every GPU must be idle (see O(idle_gpus)).
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description:
          - Name used in messages (the instance name). Defaults to O(expected[].unit), else
            C(expected[N]).
        type: str
      gpus:
        description:
          - The GPUs of this instance, each as index (C(0)), UUID (C(GPU-...)) or PCI bus id
            (C(00000000:18:00.0) or C(0000:18:00.0)).
        type: list
        elements: raw
        required: true
      used_mib:
        description:
          - Expected memory use per GPU in MiB, as C(nvidia-smi) counts it (it includes the CUDA
            context, about 600 MiB on an H200).
          - Give exactly one of O(expected[].used_mib) and O(expected[].used_fraction).
        type: int
      used_fraction:
        description:
          - Expected memory use per GPU as a fraction (0-1] of the memory CUDA sees on that GPU,
            that is C(memory.total - memory.reserved) - the base vLLM's
            C(--gpu-memory-utilization) is applied to. A running vLLM sits at its
            C(gpu_memory_utilization) within about a GiB.
          - Give exactly one of O(expected[].used_mib) and O(expected[].used_fraction).
        type: float
      tolerance_mib:
        description:
          - Allowed difference from the expected amount, in MiB, either way.
          - Default 1024 MiB when neither O(expected[].tolerance_mib) nor
            O(expected[].tolerance_pct) is set.
        type: int
      tolerance_pct:
        description:
          - Allowed difference as a percentage (0-100) of the expected amount, either way.
          - Mutually exclusive with O(expected[].tolerance_mib).
        type: float
      unit:
        description:
          - The systemd unit that must own every process holding memory on these GPUs
            (C(vllm-<instance>.service); a name without a dot gets C(.service) appended).
          - Processes of another unit, or in no unit, on these GPUs are reported as deviations.
        type: str
  idle_max_mib:
    description:
      - Most memory, in MiB, a GPU not named in O(expected) may use.
      - 256 sits above what an idle GPU shows (0 MiB on an H200, 3 MiB on an RTX PRO 6000, tens
        of MiB with a display server) and below the smallest CUDA context (about 600 MiB
        measured on an H200), so any process that opened a CUDA context is caught.
    type: int
    default: 256
  idle_gpus:
    description:
      - C(must_be_idle) checks GPUs not named in O(expected) against O(idle_max_mib).
      - C(ignore) skips them, for hosts whose other GPUs belong to someone else.
    type: str
    choices: [must_be_idle, ignore]
    default: must_be_idle
  allow_shared_gpus:
    description:
      - Allow one GPU to be named by several entries of O(expected) (instances meant to share
        it). Their amounts and tolerances are then added up, and each entry's unit may own
        memory there.
      - When false, a GPU named twice is an error in O(expected).
    type: bool
    default: false
  memory_base:
    description:
      - What O(expected[].used_fraction) is a fraction of.
      - C(total_minus_reserved) - C(memory.total - memory.reserved), the memory CUDA sees and the
        base vLLM's C(--gpu-memory-utilization) applies to (the planner checks the fit on the same base).
      - C(total) - C(memory.total) as C(nvidia-smi) prints it.
    type: str
    choices: [total_minus_reserved, total]
    default: total_minus_reserved
  wait_timeout:
    description:
      - Seconds to keep reading until the footprint holds (weights load progressively, the KV
        cache comes last). 0 reads once. On timeout the last reading is reported.
    type: int
    default: 0
  poll_interval:
    description: Seconds between readings while waiting.
    type: float
    default: 5
  nvidia_smi:
    description:
      - Path of the C(nvidia-smi) binary; by default looked up on C(PATH) and in the usual
        driver directories.
    type: path
    required: false
notes:
  - Clear failures, never tracebacks, for - C(nvidia-smi) missing; NVML errors (for
    C(Driver/library version mismatch) a reboot is likely needed); no GPU found; an expected GPU
    that does not exist; MIG mode enabled on an expected GPU (memory is per MIG instance there);
    both or neither of O(expected[].used_mib) and O(expected[].used_fraction); output that
    cannot be parsed.
seealso:
  - module: inferops.vllm.gpu_facts
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: A TP=4 vLLM at gpu_memory_utilization 0.9 on GPUs 0-3, GPUs 4-7 idle
  inferops.vllm.gpu_footprint:
    expected:
      - name: chat
        gpus: [0, 1, 2, 3]
        used_fraction: 0.9
        unit: vllm-chat.service
    wait_timeout: 600
    poll_interval: 10

- name: Before starting, the target GPUs must be idle (other GPUs are someone else's)
  inferops.vllm.gpu_footprint:
    expected: []
    idle_gpus: must_be_idle

- name: Check what the placement plan expects on this host
  inferops.vllm.gpu_footprint:
    expected: "{{ vllm_plan.hosts[inventory_hostname].expected }}"

- name: Two small instances sharing GPU 0
  inferops.vllm.gpu_footprint:
    allow_shared_gpus: true
    expected:
      - {name: embed, gpus: [0], used_fraction: 0.3, unit: vllm-embed.service}
      - {name: rerank, gpus: [0], used_fraction: 0.3, unit: vllm-rerank.service}
"""

RETURN = r"""
gpus:
  description:
    - One entry per GPU of the last reading, in PCI order.
    - C(expectation) is the expectation's name (names joined with C( + ) for shared GPUs), or
      C(idle). C(expected_min_mib)/C(expected_max_mib) is the allowed range (max null for an
      ignored idle GPU); C(checked) is false for GPUs skipped by O(idle_gpus=ignore).
    - C(processes) lists the compute processes on the GPU with C(pid), C(name), C(unit) (systemd
      unit or null) and C(used_mib) (null under MIG).
  returned: always, once the GPUs could be read
  type: list
  elements: dict
  sample:
    - index: 0
      uuid: GPU-84ea54cb-4767-0e6a-8104-87422151c222
      used_mib: 21099
      total_mib: 143771
      expected_mib: 20480
      expected_min_mib: 19456
      expected_max_mib: 21504
      expectation: torch
      checked: true
      ok: true
      processes:
        - pid: 495
          name: python3
          unit: null
          used_mib: 21090
deviations:
  description: One sentence per deviating GPU (empty when the footprint holds).
  returned: always
  type: list
  elements: str
  sample:
    - >-
      GPU 5 (GPU-91e2055f-aa6b-4bfb-9224-510c32505394) should be idle: uses 20993 MiB, more than
      the idle limit of 256 MiB; held by pid 51234 (python3, no systemd unit, 20986 MiB).
polls:
  description: Number of readings taken.
  returned: always
  type: int
  sample: 1
nvidia_smi_calls:
  description: The C(nvidia-smi) commands run, with exit code and duration in seconds.
  returned: always
  type: list
  elements: dict
  sample:
    - command: nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,gpu_bus_id,used_memory --format=csv
      rc: 0
      seconds: 0.035
"""

import time

from ansible.module_utils.basic import AnsibleModule

# the check itself is shared with the watchdog (inferops-vllm-watchdog): module_utils/footprint.py
from ansible_collections.inferops.vllm.plugins.module_utils.footprint import (
    DEFAULT_IDLE_MAX_MIB,
    FootprintError,
    evaluate,
    plan_expectations,
)
from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
    NvidiaSmi,
    NvidiaSmiError,
    MEMORY_BASE,
    MEMORY_BASES,
    attach_processes,
    find_nvidia_smi,
)

_now = time.monotonic
_sleep = time.sleep


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            expected=dict(
                type="list", elements="dict", default=[],
                options=dict(
                    name=dict(type="str"),
                    gpus=dict(type="list", elements="raw", required=True),
                    used_mib=dict(type="int"),
                    used_fraction=dict(type="float"),
                    tolerance_mib=dict(type="int"),
                    tolerance_pct=dict(type="float"),
                    unit=dict(type="str"),
                ),
            ),
            idle_max_mib=dict(type="int", default=DEFAULT_IDLE_MAX_MIB),
            idle_gpus=dict(type="str", default="must_be_idle", choices=["must_be_idle", "ignore"]),
            allow_shared_gpus=dict(type="bool", default=False),
            memory_base=dict(type="str", default=MEMORY_BASE, choices=list(MEMORY_BASES)),
            wait_timeout=dict(type="int", default=0),
            poll_interval=dict(type="float", default=5),
            nvidia_smi=dict(type="path", required=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["idle_max_mib"] < 0:
        module.fail_json(msg="idle_max_mib must not be negative (%s)" % p["idle_max_mib"])
    if p["wait_timeout"] < 0:
        module.fail_json(msg="wait_timeout must not be negative (%s)" % p["wait_timeout"])
    if p["poll_interval"] <= 0:
        module.fail_json(msg="poll_interval must be positive (%s)" % p["poll_interval"])

    smi = None
    result = {"changed": False, "gpus": [], "deviations": [], "polls": 0}
    try:
        smi = NvidiaSmi(module, find_nvidia_smi(module, p["nvidia_smi"]))
        deadline = _now() + p["wait_timeout"]
        plan = None
        while True:
            gpus = smi.query_gpus()
            apps = smi.query_compute_apps()
            result["polls"] += 1
            if plan is None:
                plan = plan_expectations(p["expected"], gpus, p["allow_shared_gpus"], p["memory_base"])
            processes = attach_processes(gpus, apps, smi.proc_root)
            result["gpus"], result["deviations"] = evaluate(
                gpus, processes, plan, p["idle_max_mib"], p["idle_gpus"])
            left = deadline - _now()
            if not result["deviations"] or left <= 0:
                break
            _sleep(min(p["poll_interval"], left))
    except (FootprintError, NvidiaSmiError) as exc:
        module.fail_json(msg=str(exc), nvidia_smi_calls=smi.calls if smi else [], **result)

    result["nvidia_smi_calls"] = smi.calls
    checked = [g for g in result["gpus"] if g["checked"]]
    if result["deviations"]:
        waited = ""
        if result["polls"] > 1:
            waited = " (last of %d readings over %d s)" % (result["polls"], p["wait_timeout"])
        module.fail_json(
            msg="GPU footprint differs on %d of %d checked GPUs%s: %s" % (
                len(result["deviations"]), len(checked), waited, " ".join(result["deviations"])),
            **result)
    module.exit_json(msg="GPU footprint as expected on %d checked GPU%s" % (
        len(checked), "" if len(checked) == 1 else "s"), **result)


def main():
    run_module()


if __name__ == "__main__":
    main()
