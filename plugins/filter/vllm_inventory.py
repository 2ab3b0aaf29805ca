# Apache License 2.0 (see LICENSE)
"""Filters that check and resolve the inventory's model and instance declarations.

``vllm_inventory_problems`` catches what ``meta/argument_specs.yml`` cannot express (references
between variables, pinned revisions, names usable in paths and unit names) and returns one
sentence per problem, each naming the host, the variable and the fix. ``vllm_instances_resolved``
merges each instance with what the planner needs to know about its model.
"""
from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# model facts the placement planner uses when they are known
PLANNER_MODEL_KEYS = ("weights_bytes", "num_attention_heads", "num_key_value_heads")


def _where(host):
    return f"host {host}: " if host else ""


def vllm_inventory_problems(models, instances, host=None):
    """Return a list of problems (empty when the declarations are consistent)."""
    w = _where(host)
    problems = []
    if models is None:
        models = {}
    if not isinstance(models, dict):
        return [f"{w}vllm_models must be a dict of model name -> settings (repo_id, revision, ...), "
                f"got {type(models).__name__}"]
    for key, model in models.items():
        where = f"{w}vllm_models.{key}"
        if not NAME_RE.match(str(key)):
            problems.append(f"{where}: the model name must match {NAME_RE.pattern} (lower case, digits, '._-'); rename it")
        if not isinstance(model, dict):
            problems.append(f"{where}: must be a dict with at least repo_id and revision")
            continue
        repo = model.get("repo_id")
        if not isinstance(repo, str) or not REPO_RE.match(repo):
            problems.append(f"{where}.repo_id is {repo!r}; set it to the Hub repository as 'org/name'")
        rev = model.get("revision")
        if not isinstance(rev, str) or not rev:
            problems.append(f"{where}.revision is missing; pin the 40-hex commit sha of the repository "
                            "(HfApi().model_info(repo_id).sha) or set allow_unpinned: true with a branch name")
        elif not SHA_RE.match(rev) and not model.get("allow_unpinned", False):
            problems.append(f"{where}.revision is {rev!r}, not a 40-hex commit sha; pin the commit "
                            "(a branch moves under a running fleet) or set allow_unpinned: true")
        for k in ("weights_bytes", "num_attention_heads", "num_key_value_heads", "max_model_len"):
            v = model.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                problems.append(f"{where}.{k} is {v!r}; use a positive whole number or leave it out")
        extra = model.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            problems.append(f"{where}.extra_args must be a list of strings, e.g. ['--enable-prefix-caching']")
    if instances is None:
        instances = []
    if not isinstance(instances, list):
        return problems + [f"{w}vllm_instances must be a list of dicts (name, model, tensor_parallel_size, ...), "
                           f"got {type(instances).__name__}"]
    for pos, inst in enumerate(instances):
        if not isinstance(inst, dict):
            problems.append(f"{w}vllm_instances[{pos}] must be a dict with at least name and model")
            continue
        where = f"{w}vllm_instances[{pos}] ({inst.get('name', '?')})"
        model = inst.get("model")
        if model is None:
            problems.append(f"{where}.model is missing; set it to one of vllm_models: {', '.join(sorted(models)) or '(none declared)'}")
        elif model not in models:
            problems.append(f"{where}.model is {model!r}, which vllm_models does not declare; "
                            f"use one of: {', '.join(sorted(models)) or '(none declared: add it to vllm_models)'}")
        extra = inst.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            problems.append(f"{where}.extra_args must be a list of strings, e.g. ['--enable-prefix-caching']")
    return problems


def vllm_instances_resolved(instances, models):
    """Instances with their model's planner facts (weights_bytes, heads) filled in where unset."""
    if not isinstance(instances, list) or not isinstance(models, dict):
        raise AnsibleFilterError("vllm_instances_resolved expects a list of instances and a dict of models")
    out = []
    for inst in instances:
        merged = dict(inst)
        model = models.get(inst.get("model"), {}) or {}
        for key in PLANNER_MODEL_KEYS:
            if merged.get(key) is None and model.get(key) is not None:
                merged[key] = model[key]
        out.append(merged)
    return out


def vllm_cpu_plan(instances, host=None, base_port=8000, unit_prefix="vllm-"):
    """Plan for a CPU-only host: same shape as gpu_plan's, with no GPU pinning and no footprint."""
    if not isinstance(instances, list):
        raise AnsibleFilterError(f"{_where(host)}vllm_instances must be a list")
    used = {i.get("port") for i in instances if isinstance(i, dict) and i.get("port")}
    port = base_port
    out = []
    for inst in instances:
        entry = {
            "gpus": [], "gpu_uuids": [], "cuda_visible_devices": "", "cuda_device_order": "PCI_BUS_ID",
            "numa_node": inst.get("numa_node") if isinstance(inst.get("numa_node"), int) else None,
            "cpus": [], "cpus_str": "", "tensor_parallel_size": int(inst.get("tensor_parallel_size", 1)),
            "pipeline_parallel_size": int(inst.get("pipeline_parallel_size", 1)),
            "gpu_memory_utilization": None, "link": None,
            "unit": f"{unit_prefix}{inst['name']}.service", "expected": [],
        }
        if not inst.get("port"):
            while port in used:
                port += 1
            entry["port"] = port
            used.add(port)
        for key, value in inst.items():
            entry.setdefault(key, value)
        out.append(entry)
    return out


class FilterModule:
    """Inventory checks for inferops.vllm."""

    def filters(self):
        return {
            "vllm_inventory_problems": vllm_inventory_problems,
            "vllm_instances_resolved": vllm_instances_resolved,
            "vllm_cpu_plan": vllm_cpu_plan,
        }
