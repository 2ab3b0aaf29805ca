#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU, topology, driver and GPU process facts with nvidia-smi
version_added: 1.0.0
description:
  - Runs C(nvidia-smi) (with C(LC_ALL=C)) and returns the host's GPUs in PCI order, the link type
    between every pair of GPUs, the driver and CUDA versions, and the processes that hold GPU memory
    together with the systemd unit each one runs in.
  - Asks C(nvidia-smi) four times - one C(--query-gpu) for every GPU field and the driver version,
    one C(--query-compute-apps), one C(topo -m) and one C(--version) for the CUDA version. A driver
    without C(--version) costs one more call (the plain C(nvidia-smi) table header), one that
    lacks an optional query field (such as C(memory.reserved)) one more (the query is repeated
    without it).
  - The NUMA node of a GPU comes from C(nvidia-smi topo -m) (NUMA Affinity), else from
    C(/sys/bus/pci/devices/<bus id>/numa_node) where C(-1) means unknown; the CPU affinity from
    C(topo -m) (CPU Affinity), else from C(local_cpulist) in the same directory.
  - The systemd unit of a process is read from C(/proc/<pid>/cgroup) (cgroup v1 and v2); it is
    null for processes outside any C(.service) (login sessions, containers).
  - Read-only; runs the same in check mode.
  - Also reads what a plan needs of the host besides its GPUs (C(host_resources)) - the systemd
    version (C(systemctl --version)), the kernel's NUMA nodes (C(/sys/devices/system/node)), the
    online CPUs (C(/sys/devices/system/cpu/online)) and, with O(free_space_of), the free space of a
    file system. With O(gpus=false) only these (a CPU-only host). One call reads the whole host.
  - It also returns the C(slots) of the plan the host was configured from (C(plan.json) in O(config_dir)),
    what that plan gave each instance automatically (ports, GPUs), so the next plan keeps them.
options:
  gpus:
    description:
      - Read the GPUs with C(nvidia-smi). With V(false) only C(host_resources) is returned (a host without
        GPUs, where C(nvidia-smi) is not looked for).
    type: bool
    default: true
  free_space_of:
    description:
      - Also return the space available to unprivileged users (C(df)'s Available column, in KiB) of the
        file system that holds this path, or its nearest existing parent when the path does not exist yet
        (the directory the models will go to, before it is created).
    type: path
    required: false
  config_dir:
    description:
      - The directory of the host's recorded plan (C(plan.json)), the plan input C(vllm_service_config_dir).
      - Left out, the plan's default (C(/etc/inferops/vllm)).
    type: path
    required: false
  nvidia_smi:
    description:
      - Path of the C(nvidia-smi) binary.
      - By default it is looked up on C(PATH) and in C(/usr/bin), C(/usr/local/bin),
        C(/usr/local/nvidia/bin) and C(/usr/lib/wsl/lib).
    type: path
    required: false
notes:
  - Fails with a clear message when C(nvidia-smi) is missing, when NVML cannot be initialized
    (for C(Driver/library version mismatch) a reboot is likely needed), when no GPU is found, and
    when the output cannot be parsed; it never returns guessed numbers.
seealso:
  - module: inferops.vllm.gpu_footprint
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Gather GPU facts
  inferops.vllm.gpu_facts:

- name: Show the NUMA node of every GPU
  ansible.builtin.debug:
    msg: "GPU {{ item.index }} ({{ item.name }}): NUMA node {{ item.numa_node }}"
  loop: "{{ ansible_facts.gpus }}"

- name: Read a CPU-only host (systemd version, NUMA nodes, online CPUs, free space of the models' file system)
  inferops.vllm.gpu_facts:
    gpus: false
    free_space_of: /var/lib/inferops/models

- name: Use an nvidia-smi outside PATH
  inferops.vllm.gpu_facts:
    nvidia_smi: /usr/local/nvidia/bin/nvidia-smi
"""

RETURN = r"""
ansible_facts:
  description: GPU facts.
  returned: success
  type: dict
  contains:
    gpus:
      description:
        - One dict per GPU in PCI bus order (the order of C(nvidia-smi) indices).
        - Memory figures are in MiB; a value C(nvidia-smi) reports as N/A is null.
        - C(memory_reserved_mib) is what the driver and firmware keep (not in C(memory_used_mib));
          CUDA sees C(memory_total_mib - memory_reserved_mib) as the GPU's total.
        - C(mig_mode) is C(Enabled), C(Disabled) or null (no MIG support).
        - C(numa_node) is null when unknown; C(cpu_affinity) is the sorted list of CPU ids near
          the GPU, empty when unknown.
      returned: success
      type: list
      elements: dict
      sample:
        - index: 0
          uuid: GPU-84ea54cb-4767-0e6a-8104-87422151c222
          name: NVIDIA H200
          pci_bus_id: "00000000:00:06.0"
          memory_total_mib: 143771
          memory_used_mib: 0
          memory_free_mib: 143156
          memory_reserved_mib: 616
          mig_mode: Disabled
          numa_node: 0
          cpu_affinity: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
          compute_mode: Default
    gpu_links:
      description:
        - Link type between every pair of GPUs as C(nvidia-smi topo -m) prints it, keyed by the
          GPU index (as a string), then the other GPU's index (as a string); self pairs omitted.
        - C(NV#) is a bonded set of that many NVLinks (C(NV18) - 18), C(PIX) at most one PCIe bridge, C(PXB) several
          PCIe bridges, C(PHB) a PCIe host bridge, C(NODE) host bridges within a NUMA node, C(SYS)
          the link between NUMA nodes.
        - Empty with one GPU or when the topology is unknown.
      returned: success
      type: dict
      sample:
        "0": {"1": "PIX", "2": "NODE", "3": "SYS"}
        "1": {"0": "PIX", "2": "NODE", "3": "SYS"}
        "2": {"0": "NODE", "1": "NODE", "3": "SYS"}
        "3": {"0": "SYS", "1": "SYS", "2": "SYS"}
    gpu_driver:
      description: Driver version, and the CUDA version the driver supports (null when unknown).
      returned: success
      type: dict
      sample:
        driver_version: "580.159.04"
        cuda_version: "13.0"
    gpu_processes:
      description:
        - Compute processes holding GPU memory, one entry per process and GPU.
        - C(used_mib) is null where the driver does not report it (MIG); C(unit) is the systemd
          service the process runs in, null when none; C(gpu_index) is null if the GPU is not in
          C(gpus).
      returned: success
      type: list
      elements: dict
      sample:
        - pid: 495
          process_name: python3
          gpu_uuid: GPU-84ea54cb-4767-0e6a-8104-87422151c222
          gpu_index: 0
          used_mib: 21090
          unit: vllm-chat.service
    host_resources:
      description:
        - What a plan needs of the host besides its GPUs.
        - C(systemd_version) is 0 when C(systemctl) is missing or says no version; C(kernel_numa_nodes) is
          empty without C(/sys/devices/system/node); C(online_cpus) is the kernel's list (C(0-3,8)), empty
          when unknown; C(free_kib) is null without O(free_space_of).
        - C(slots) is the recorded plan's C(slots) (the ports, C(VLLM_PORT) bases and GPU UUIDs it gave
          instances automatically, and the port rules' inputs); empty without a readable C(plan.json).
      returned: success
      type: dict
      sample:
        systemd_version: 252
        kernel_numa_nodes: [0, 1]
        online_cpus: "0-63"
        free_kib: 1851723400
        slots:
          base_port: 8000
          vllm_port_base: 20000
          vllm_port_stride: 100
          auto:
            chat: {port: 8000, vllm_port: 20000, gpu_uuids: [GPU-84ea54cb-4767-0e6a-8104-87422151c222]}
nvidia_smi_calls:
  description: The C(nvidia-smi) commands run, with exit code and duration in seconds.
  returned: always
  type: list
  elements: dict
  sample:
    - command: nvidia-smi topo -m
      rc: 0
      seconds: 0.041
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
    NvidiaSmi,
    NvidiaSmiError,
    find_nvidia_smi,
    gather_facts,
)
from ansible_collections.inferops.vllm.plugins.module_utils.plan_record import plan_file, read_slots


SYS_NODES = "/sys/devices/system/node"
SYS_ONLINE = "/sys/devices/system/cpu/online"


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def host_resources(module, free_space_of=None, config_dir=None):
    """The systemd version, the kernel's NUMA nodes, the online CPUs, the free KiB of ``free_space_of``'s file
    system (its nearest existing parent) and the recorded plan's slots (``plan_record``); unknown values are 0,
    empty or None, never guessed."""
    out = {"systemd_version": 0, "kernel_numa_nodes": [], "online_cpus": _read(SYS_ONLINE), "free_kib": None,
           "slots": read_slots(plan_file(config_dir))}
    systemctl = module.get_bin_path("systemctl")
    if systemctl:
        rc, stdout, _err = module.run_command([systemctl, "--version"], environ_update={"LC_ALL": "C"})
        found = re.match(r"systemd (\d+)", stdout or "")
        if rc == 0 and found:
            out["systemd_version"] = int(found.group(1))
    try:
        names = os.listdir(SYS_NODES)
    except OSError:
        names = []
    out["kernel_numa_nodes"] = sorted(int(name[4:]) for name in names if re.fullmatch(r"node[0-9]+", name))
    if free_space_of:
        path = os.path.abspath(free_space_of)
        while not os.path.exists(path) and path != os.path.dirname(path):
            path = os.path.dirname(path)
        try:
            stat = os.statvfs(path)
            out["free_kib"] = stat.f_bavail * stat.f_frsize // 1024
        except OSError:
            pass
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(nvidia_smi=dict(type="path", required=False), gpus=dict(type="bool", default=True),
                           free_space_of=dict(type="path", required=False),
                           config_dir=dict(type="path", required=False)),
        supports_check_mode=True,
    )
    smi, facts, calls = None, {}, []
    if module.params["gpus"]:
        try:
            smi = NvidiaSmi(module, find_nvidia_smi(module, module.params["nvidia_smi"]))
            facts = gather_facts(smi)
        except NvidiaSmiError as exc:
            module.fail_json(msg=str(exc), nvidia_smi_calls=smi.calls if smi else [])
        for warning in smi.warnings:
            module.warn(warning)
        calls = smi.calls
    facts["host_resources"] = host_resources(module, module.params["free_space_of"], module.params["config_dir"])
    module.exit_json(changed=False, ansible_facts=facts, nvidia_smi_calls=calls)


if __name__ == "__main__":
    main()
