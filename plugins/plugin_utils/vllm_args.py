# Apache License 2.0 (see LICENSE)
"""The rules of what users add to an instance's command line and environment (``extra_args``, ``env``).

Stage 1 (the inventory's one normalisation, ``inventory.normalise``) checks them; the unit builder
(``service_spec``) reads the same rules. Flags the roles set come from the schema's rows
(``schema.MANAGED``) and the plan; flags that must never appear (secrets, what the plan decides) are refused
with the reason; a flag that became a key (``schema.PROMOTED``) is accepted as it is, with a warning.
Environment variables the roles set or keep secret are refused naming where to set them.
"""
from __future__ import annotations

import re
import shlex

from ansible_collections.inferops.vllm.plugins.plugin_utils import multinode
from ansible_collections.inferops.vllm.plugins.plugin_utils.schema import MANAGED, PROMOTED
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import kind, shown

__all__ = ["MANAGED_FLAGS", "FORBIDDEN_FLAGS", "FLAG_ALIASES", "MANAGED_ENV", "SECRET_ENV", "ENV_NAME_RE",
           "ENV_REFERENCE_RE", "canonical_flag", "parse_extra_args", "check_extra_args", "env_problems"]

#: Flags the role writes itself, canonical name -> where to set it instead.
MANAGED_FLAGS = {
    "model": "the instance's 'model' (a key of vllm_models) or the model's 'path'",
    "served-model-name": "served_model_name in the model entry of vllm_models",
    "tensor-parallel-size": "tensor_parallel_size of the instance",
    "pipeline-parallel-size": "pipeline_parallel_size of the instance",
    "gpu-memory-utilization": "gpu_memory_utilization of the instance",
    "port": "port of the instance",
    "host": "vllm_service_host",
    "disable-custom-all-reduce": "vllm_service_disable_custom_all_reduce",
}
MANAGED_FLAGS.update(MANAGED)  # the vLLM settings of the schema (plugins/plugin_utils/schema.py)
MANAGED_FLAGS.update(multinode.MULTINODE_FLAGS)

#: Flags that must never appear, canonical name -> why.
FORBIDDEN_FLAGS = {
    "api-key": "a secret on the command line is readable by every user (ps); set vllm_service_api_key, "
               "which goes into the instance's root-only environment file as VLLM_API_KEY",
    "hf-token": "a secret on the command line is readable by every user (ps); set vllm_service_hf_token",
    "data-parallel-size": "the plan gives each instance tensor_parallel_size x pipeline_parallel_size GPUs; "
                          "for more replicas, plan more instances",
    "device-ids": "the GPUs come from the plan (CUDA_VISIBLE_DEVICES); set gpus on the instance",
    "uds": "the health gate and clients reach the instance on its TCP port",
}

#: Short spellings vLLM accepts for some flags.
FLAG_ALIASES = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "q": "quantization",
                "dp": "data-parallel-size"}

#: Environment variables the role writes (or keeps out of the unit); value: where to set them.
MANAGED_ENV = {
    "CUDA_DEVICE_ORDER": "the plan (always PCI_BUS_ID)",
    "CUDA_VISIBLE_DEVICES": "gpus of the instance (the plan)",
    "VLLM_PORT": "vllm_port of the instance or vllm_service_vllm_port_base",
    "VLLM_CACHE_ROOT": "vllm_service_cache_dir",
    "VLLM_HOST_IP": "vllm_service_host (multi-node instances: vllm_service_network_interface)",
}
#: Environment variables that must never be set, name -> why.
FORBIDDEN_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "it lets any client with the key load or unload adapters at run time "
                                        "(/v1/load_lora_adapter, which the front doors refuse anyway); declare "
                                        "adapters in vllm_models.<model>.adapters (pinned, fetched, verified)",
}
SECRET_ENV = {
    "VLLM_API_KEY": "vllm_service_api_key",
    "HF_TOKEN": "vllm_service_hf_token",
    "HUGGING_FACE_HUB_TOKEN": "vllm_service_hf_token",
}

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``$NAME`` or ``${NAME}`` in a value: a shell would expand it, systemd's Environment= does not.
ENV_REFERENCE_RE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9_.-]*(=.*)?$", re.S)
_NUMBER = re.compile(r"^-[0-9.]")


def canonical_flag(token: str) -> str:
    """``--Max_Model_Len=8`` -> ``max-model-len``; ``-tp`` -> ``tensor-parallel-size``."""
    name = token.split("=", 1)[0].lstrip("-").lower().replace("_", "-")
    return FLAG_ALIASES.get(name, name)


def parse_extra_args(extra, where: str) -> list[list[str]]:
    """Free-form extra arguments -> groups ``[flag, value...]`` (one group per flag).

    ``extra`` is a list of strings (each split like a shell would: ``"--dtype float32"``,
    ``"--dtype=float32"``, ``"--enforce-eager"``), the schema's type of ``extra_args``.
    Raises ValueError for anything that is not a flag followed by its values.
    """
    if extra is None:
        return []
    groups = []
    if isinstance(extra, str):
        extra = [extra]
    if not isinstance(extra, (list, tuple)):
        raise ValueError(f"{where} must be a list of strings such as ['--enforce-eager', '--dtype float32'], "
                         f"got {type(extra).__name__}")
    # Items are named by their position, never by their value: a refused item may hold a secret (an API key pasted
    # into a flag's value), and a refusal is printed and logged.
    tokens = []
    for pos, item in enumerate(extra):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ValueError(f"{where}[{pos}] is {kind(item)}, not a string; give each flag with its value as "
                             "one string, e.g. '--dtype float32'")
        item = str(item)
        if "\n" in item or "\r" in item or "\0" in item:
            raise ValueError(f"{where}[{pos}] contains a line break or NUL character (its value is not shown); give "
                             "the flag and its value on one line")
        try:
            split = shlex.split(item) if item.strip().startswith("-") else [item]
        except ValueError as exc:
            raise ValueError(f"{where}[{pos}] cannot be split like a shell would split it ({exc}; its value is not "
                             "shown); close the quote, or give the value without quotes") from None
        tokens.extend((pos, tok) for tok in split)
    for pos, tok in tokens:
        if tok.startswith("-") and not _NUMBER.match(tok) and _FLAG.match(tok):
            if "=" in tok:
                flag, value = tok.split("=", 1)
                groups.append([flag, value])
            else:
                groups.append([tok])
        elif groups:
            groups[-1].append(tok)
        else:
            raise ValueError(f"{where}[{pos}] starts with a value, not a flag (its value is not shown); extra_args "
                             "must start with a flag such as '--enforce-eager'")
    return groups


def check_extra_args(groups, where: str) -> list[str]:
    """Problems with extra argument groups: a flag the role sets, a forbidden one, a repeated one."""
    problems = []
    seen = {}
    for group in groups:
        flag = group[0]
        name = canonical_flag(flag)
        base = name[3:] if name.startswith("no-") else name
        if base in FORBIDDEN_FLAGS:
            problems.append(f"{where}: '{flag}' is not allowed: {FORBIDDEN_FLAGS[base]}")
        elif base in PROMOTED:
            # a flag that became a key: accepted as it is, with a warning (see _promoted_warnings); once
            if base in seen:
                problems.append(f"{where}: '{flag}' is given twice (also as '{seen[base]}'); give it once")
        elif base in MANAGED_FLAGS:
            problems.append(f"{where}: '{flag}' duplicates a flag the role sets (--{base}); "
                            f"remove it and set {MANAGED_FLAGS[base]} instead")
        elif base in seen:
            problems.append(f"{where}: '{flag}' is given twice (also as '{seen[base]}'); give it once")
        seen.setdefault(base, flag)
    return problems


def env_problems(value, where, problems):
    """A dict of environment variables, checked: names valid, no secrets, no pinning overrides."""
    if value in (None, ""):
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where} must be a dict of NAME: value, got {kind(value)} ({shown(value)})")
        return {}
    out = {}
    for name, val in value.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            problems.append(f"{where}: {shown(name)} is not a valid environment variable name; use letters, digits "
                            "and '_', not starting with a digit (e.g. OMP_NUM_THREADS)")
            continue
        if name in SECRET_ENV:
            problems.append(f"{where}: {name} is a secret and must not be written into the unit; "
                            f"set {SECRET_ENV[name]} (it goes into the root-only environment file)")
            continue
        if name in FORBIDDEN_ENV:
            problems.append(f"{where}: {name} is not allowed: {FORBIDDEN_ENV[name]}")
            continue
        if name in MANAGED_ENV:
            problems.append(f"{where}: {name} is set by the role; set {MANAGED_ENV[name]} instead")
            continue
        if isinstance(val, bool):
            val = "1" if val else "0"
        if val is None or isinstance(val, (dict, list)):
            problems.append(f"{where}: {name} is {kind(val)}; give it a string or a number ('' for an empty value)")
            continue
        text = str(val)
        if "\n" in text or "\r" in text or "\0" in text:
            problems.append(f"{where}: {name} contains a line break")
            continue
        ref = ENV_REFERENCE_RE.search(text)
        if ref:
            problems.append(f"{where}: {name} is {text!r}, but systemd does not expand {ref.group(0)} in a unit's "
                            f"environment (the process would get the text '{ref.group(0)}' itself); write the value "
                            "out in full (an Ansible template in the inventory is filled in before the unit is "
                            "written)")
            continue
        out[name] = text
    return out
