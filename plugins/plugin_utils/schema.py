# Apache License 2.0 (see LICENSE)
"""The inventory schema: one table of every key of ``vllm_models`` and ``vllm_instances``.

Each row says a key's type, default, at which level it may be set (a model's setting, an instance's own,
or a model's setting an instance may override), its documentation line, and, for the vLLM settings, the
flag it becomes and how (``value``: ``--flag <value>``; ``switch``: ``--flag`` when true; ``tristate``:
``--flag`` when true, ``--no-flag`` when false, vLLM's default when left out), with the check of its value.

Everything else is derived from these rows, so a new vLLM setting is one row:
- ``MODEL_KEYS`` and ``INSTANCE_KEYS`` (read by the one normalisation, ``inventory.normalise``);
- the keys an instance may override (``OVERRIDES``) and the flags the roles set (``MANAGED``: an
  ``extra_args`` flag that a row sets is refused, naming the key - or, for a row with ``promoted``, the
  version that turned a flag users passed in ``extra_args`` into a key, accepted with a warning);
- the flags of one instance (``flag_args``), in the order of the rows;
- the ``vllm_instances`` options of ``roles/vllm_preflight/meta/argument_specs.yml`` and the key tables of
  ``docs/plan.md`` (``tools/schema_docs.py`` writes them; ``make lint`` checks they are current).

Pure Python, no Ansible imports, no import of a later stage.
"""
from __future__ import annotations

import json
import re

__all__ = ["ROWS", "MODEL_KEYS", "INSTANCE_KEYS", "OVERRIDES", "FLAG_ROWS", "MANAGED", "PROMOTED",
           "value_problem", "flag_args", "argument_spec_options", "models_description", "docs_table", "flags_table",
           "DEFAULT_MASTER_PORT", "SHA_RE", "VERIFY_MODES", "repo_id_problem", "snapshot_dirs"]

#: vLLM's default ``--master-port`` for a multi-node instance (multinode.py reads it from here).
DEFAULT_MASTER_PORT = 29501
#: A vLLM name setting (quantization method, parser, dtype): what vLLM's own choices look like.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

MODEL, INSTANCE, BOTH = "model", "instance", "both"

#: A pinned ``revision``: a 40-hex commit sha.
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# The Hub's repository names: letters, digits, '-', '_', '.'; no '--' or '..' at the start or end.
REPO_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: The values of ``verify`` (a model's) and ``vllm_weights_verify``.
VERIFY_MODES = ("size", "sha256")


def repo_id_problem(repo_id):
    """Why ``repo_id`` is not a Hub repository id (``org/name``), or None when it is one."""
    if not isinstance(repo_id, str) or not repo_id:
        return "it is missing"
    parts = repo_id.split("/")
    if len(parts) != 2:
        return "it must be exactly 'org/name'"
    if not all(REPO_PART_RE.match(p) for p in parts):
        return "each part may hold letters, digits, '-', '_' and '.' (up to 96 characters), starting with a letter or digit"
    if ".." in repo_id or any(p.endswith(".") or p.endswith("-") for p in parts):
        return "the Hub refuses '..' and a part ending in '.' or '-'"
    return None


def snapshot_dirs(models_dir, repo_id):
    """Where ``repo_id`` lands, the one layout rule: ``{"repo_dir": <models_dir>/<org>/<name>, "current":
    <repo_dir>/current}`` (the weights role fetches there, the units serve ``current``)."""
    repo_dir = "%s/%s" % ((models_dir or "").rstrip("/"), repo_id)
    return {"repo_dir": repo_dir, "current": repo_dir + "/current"}


def _row(key, kind, level, doc, *, default=None, instance_default=None, instance_doc=None, flag=None, form=None,
         check=None, example=None, also=(), promoted=None, choices=None, elements=None):
    """One key. ``level``: MODEL (vllm_models only), INSTANCE (vllm_instances only), BOTH (a model's setting an
    instance may override; its instance line says so unless ``instance_doc`` is given)."""
    return {"key": key, "type": kind, "level": level, "doc": doc, "default": default,
            "instance_default": instance_default, "instance_doc": instance_doc, "flag": flag, "form": form,
            "check": check, "example": example, "also": tuple(also), "promoted": promoted, "choices": choices,
            "elements": elements}


_SERVED = ("Name (or list of names) clients ask for; default the C(repo_id) (or the model key for a C(path) "
           "model).")

#: Every key, in the order of the docs tables and of the flags on the command line.
ROWS = [
    # ---- the model: where its weights come from
    _row("repo_id", "str", MODEL, "Hub repository as C(org/name); fetched to C(<models_dir>/<org>/<name>/<sha>/), "
                                  "served from its C(current) link."),
    _row("revision", "str", MODEL, "The 40-hex commit sha to serve (a branch or tag only with "
                                   "C(allow_unpinned: true))."),
    _row("allow_unpinned", "bool", MODEL, "Accept a branch or tag as C(revision) (it moves under a running fleet).",
         default=False),
    _row("path", "path", MODEL, "Serve from this absolute directory instead of fetching C(repo_id)."),
    # ---- the instance: what it is and where it runs
    _row("name", "str", INSTANCE, "Unique instance name; the unit is C(vllm-<name>.service)."),
    _row("model", "str", INSTANCE, "Key of the model in C(vllm_models)."),
    _row("tensor_parallel_size", "int", INSTANCE, "GPUs per pipeline stage (C(--tensor-parallel-size)).", default=1),
    _row("pipeline_parallel_size", "int", INSTANCE, "Pipeline stages (C(--pipeline-parallel-size)).", default=1),
    _row("gpus", "raw", INSTANCE, "C(auto), or an explicit list of GPU indices or UUIDs.", default="auto"),
    _row("numa_node", "raw", INSTANCE, "C(auto), or the NUMA node the instance's GPUs must sit on.", default="auto"),
    _row("gpu_memory_utilization", "float", INSTANCE, "Fraction of each GPU's memory (as CUDA sees it) vLLM may use.",
         default=0.9),
    _row("port", "int", INSTANCE, "HTTP port; assigned from the plan's base port upwards when left out."),
    _row("vllm_port", "int", INSTANCE, "Base of vLLM's internal ports (C(VLLM_PORT)); default one range per instance "
                                       "from C(vllm_service_vllm_port_base)."),
    _row("allow_cross_numa", "bool", INSTANCE, "Accept a tensor-parallel group joined only by the inter-socket link "
                                               "(SYS).", default=False),
    # ---- vLLM settings of a model (an instance may override each); flags in this order
    _row("served_model_name", "raw", BOTH, _SERVED,
         instance_doc="Overrides the model's C(served_model_name) for this instance."),
    _row("max_model_len", "int", BOTH, "C(--max-model-len).", flag="max-model-len", form="value", check="positive",
         example="32768"),
    _row("quantization", "str", BOTH, "C(--quantization), e.g. C(fp8).", flag="quantization", form="value",
         check="name", example="'fp8'"),
    _row("kv_cache_dtype", "str", BOTH, "C(--kv-cache-dtype), e.g. C(fp8).", flag="kv-cache-dtype", form="value",
         check="name", example="'fp8'"),
    _row("tool_call_parser", "str", BOTH, "C(--tool-call-parser) (turns on C(--enable-auto-tool-choice)).",
         flag="tool-call-parser", form="value", check="name", example="'hermes'", also=("enable-auto-tool-choice",)),
    _row("reasoning_parser", "str", BOTH, "C(--reasoning-parser).", flag="reasoning-parser", form="value",
         check="name", example="'deepseek_r1'"),
    _row("trust_remote_code", "bool", BOTH, "Pass C(--trust-remote-code).", default=False,
         flag="trust-remote-code", form="switch", check="bool"),
    _row("shutdown_timeout", "int", BOTH, "C(--shutdown-timeout): seconds a stopping instance refuses new requests "
                                          "and lets those in flight finish (0: vLLM aborts them); the unit's "
                                          "C(vllm_service_timeout_stop_sec) must be longer (the plan "
                                          "refuses).", default=30, flag="shutdown-timeout", form="value",
         check="seconds", example="30"),
    _row("max_num_seqs", "int", BOTH, "C(--max-num-seqs): the most requests the engine runs at once.",
         flag="max-num-seqs", form="value", check="positive", example="256", promoted="1.1.0"),
    _row("max_num_batched_tokens", "int", BOTH, "C(--max-num-batched-tokens): the most tokens of one engine step.",
         flag="max-num-batched-tokens", form="value", check="positive", example="8192", promoted="1.1.0"),
    _row("enable_prefix_caching", "bool", BOTH, "C(--enable-prefix-caching) when true, "
                                                "C(--no-enable-prefix-caching) when false; vLLM's default when left out.",
         flag="enable-prefix-caching", form="tristate", check="bool", promoted="1.1.0"),
    _row("enable_chunked_prefill", "bool", BOTH, "C(--enable-chunked-prefill) when true, "
                                                 "C(--no-enable-chunked-prefill) when false; vLLM's default when left "
                                                 "out.",
         flag="enable-chunked-prefill", form="tristate", check="bool", promoted="1.1.0"),
    # ---- more flags and the environment (a model's and an instance's own add up)
    _row("extra_args", "list", BOTH, "More vLLM flags (flags the roles set and secrets are refused).", default=[],
         instance_default=[], instance_doc="Extra vLLM flags for this instance (flags the roles set are refused).",
         elements="str"),
    _row("env", "dict", BOTH, "Environment variables of every instance of this model (no secrets, no pinning).",
         default={}, instance_default={}, instance_doc="Extra environment variables for this instance's unit "
                                                       "(not secrets)."),
    # ---- what the planner needs to know of a model
    _row("weights_bytes", "int", BOTH, "Total size of the safetensors, for the planner's fit check.",
         instance_doc="Overrides the model's C(weights_bytes) for the memory fit check."),
    _row("num_attention_heads", "int", BOTH, "From config.json, for the tensor-parallel divisibility check."),
    _row("num_key_value_heads", "int", BOTH, "From config.json, for the tensor-parallel divisibility check."),
    # ---- fetching and serving a model
    _row("allow_patterns", "list", MODEL, "Files to fetch (globs); default the weights, configs and tokenizer."),
    _row("ignore_patterns", "list", MODEL, "Files not to fetch (globs)."),
    _row("verify", "str", MODEL, "C(size) or C(sha256); default C(vllm_weights_verify)."),
    _row("frontdoor_port", "int", MODEL, "Port of this model's front door on each host that serves it (HAProxy, role "
                                         "C(vllm_frontdoor)): one listener balancing over the host's instances of the "
                                         "model; leave it out for no front door."),
    _row("router_port", "int", MODEL, "Port of this model's router on each host of the group C(vllm_routers) (role "
                                      "C(vllm_router)): one endpoint over the model's instances on every host, "
                                      "reached through that host's front door (only C(/v1/*) and C(/health)); leave "
                                      "it out for no router. See C(docs/operate.md)."),
    _row("task", "str", MODEL, "What clients ask of the model; it picks the routes its front doors pass (with a key): "
                               "C(generate) (chat, completions, models), C(embed) (embeddings, models), C(score) "
                               "(score, rerank, models), C(classify) (classify, models). It sets no vLLM flag. See "
                               "C(docs/operate.md), \"Security model\".", default="generate",
         choices=["generate", "embed", "score", "classify"]),
    _row("routes", "list", MODEL, "More routes the front doors pass to this model (with a key), each C(METHOD /path), "
                                  "e.g. C(POST /tokenize); routes that change or read a server's state are refused.",
         default=[], elements="str"),
    # ---- LoRA adapters (docs/service.md, "LoRA adapters")
    _row("adapters", "raw", BOTH, "LoRA adapters of this model, by the name clients give in C(model): each "
                                  "C({repo_id, revision, rank}) (a Hub repository pinned like the model, fetched by "
                                  "the weights stage beside it) or C({path, rank}) (a directory on the host). "
                                  "C(rank) is the adapter's C(r) in its C(adapter_config.json); the weights stage "
                                  "checks it and the adapter's base against the model before any unit changes. "
                                  "Every instance of the model serves them all unless it narrows the list.",
         instance_doc="Names of the model's C(adapters) this instance serves (default all of them; C([]) for none)."),
    _row("base_aliases", "list", MODEL, "More names an adapter's C(base_model_name_or_path) may give for this model "
                                        "besides its C(repo_id) (the directory it was trained from, say).",
         default=[], elements="str"),
    _row("max_lora_rank", "int", MODEL, "C(--max-lora-rank): default the smallest rank vLLM accepts that holds the "
                                        "largest C(rank) of the adapters (LoRA's memory grows with it)."),
    _row("max_loras", "int", MODEL, "C(--max-loras): adapters in one batch; default the instance's adapter count."),
    _row("max_cpu_loras", "int", MODEL, "C(--max-cpu-loras): adapters vLLM keeps in CPU memory; default and least "
                                        "C(max_loras)."),
    # ---- an instance that spans hosts
    _row("nodes", "raw", INSTANCE, "Hosts this instance spans (vLLM's multi-node launcher): a list of inventory host "
                                   "names, rank 0 (the API) first, or C({group: <name>, count: N}) (the group's first "
                                   "N hosts); leave it out for a single-host instance. See C(docs/multinode.md)."),
    _row("nodes_parallel", "str", INSTANCE, "With C(nodes): C(pipeline) (C(pipeline_parallel_size) spans the hosts, "
                                            "C(tensor_parallel_size) GPUs per stage on one host) or C(tensor) "
                                            "(C(tensor_parallel_size) spans the hosts; needs "
                                            "C(vllm_service_fast_interconnect)).", default="pipeline",
         choices=["pipeline", "tensor"]),
    _row("master_port", "int", INSTANCE, "With C(nodes): C(--master-port), where rank 0 listens for the other ranks.",
         default=DEFAULT_MASTER_PORT),
]
_BY_KEY = {r["key"]: r for r in ROWS}


def _instance_doc(row):
    return row["instance_doc"] or (row["doc"] if row["level"] == INSTANCE else f"Overrides the model's C({row['key']}).")


#: Keys of one entry of ``vllm_models``: name -> (type, default, description).
MODEL_KEYS = {r["key"]: (r["type"], r["default"], r["doc"]) for r in ROWS if r["level"] in (MODEL, BOTH)}
#: Keys of one entry of ``vllm_instances``: name -> (type, default, description).
INSTANCE_KEYS = {r["key"]: (r["type"], r["default"] if r["level"] == INSTANCE else r["instance_default"],
                            _instance_doc(r)) for r in ROWS if r["level"] in (INSTANCE, BOTH)}
#: Instance keys that override the model's setting of the same name (extra_args and env add up instead).
OVERRIDES = tuple(r["key"] for r in ROWS if r["level"] == BOTH and r["key"] not in ("extra_args", "env", "adapters"))
#: The rows that become vLLM flags, in command-line order.
FLAG_ROWS = [r for r in ROWS if r["flag"]]
#: Flags a row sets (canonical, without dashes) -> where to set it instead.
MANAGED = {}
for _r in FLAG_ROWS:
    _where = f"{_r['key']}{': true' if _r['form'] == 'switch' else ''} in the model entry of vllm_models"
    MANAGED[_r["flag"]] = _where
    for _also in _r["also"]:
        MANAGED[_also] = f"{_r['key']} in the model entry of vllm_models (it turns this on)"
#: The LoRA flags: the plan sets them from the model's adapters (service_spec.lora_args)
for _flag in ("enable-lora", "lora-modules", "max-lora-rank", "max-loras", "max-cpu-loras"):
    MANAGED[_flag] = "adapters (and max_lora_rank, max_loras, max_cpu_loras) in the model entry of vllm_models"
#: Flags users passed in extra_args before a row made them a key: flag -> row (accepted with a warning).
PROMOTED = {r["flag"]: r for r in FLAG_ROWS if r["promoted"]}


def value_problem(key, value):
    """Why ``value`` cannot be ``key``'s setting (a phrase for "<where>.<key> is <value>; ..."), or None."""
    row = _BY_KEY[key]
    check = row["check"]
    if value is None or check is None:
        return None
    if check == "positive":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"use a positive whole number, e.g. {row['example']}"
    elif check == "seconds":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 86400:
            return f"use a whole number of seconds 0-86400, e.g. {row['example']}"
    elif check == "name":
        if not isinstance(value, str) or not NAME_RE.match(value):
            return f"use a name such as {row['example']}"
    elif check == "bool":
        if not isinstance(value, bool):
            return "use true or false"
    return None


def flag_args(settings):
    """The flag groups of the vLLM settings in ``settings`` (a normalised record), in the rows' order."""
    out = []
    for row in FLAG_ROWS:
        value = settings.get(row["key"])
        if value is None or value == "":
            continue
        flag = "--" + row["flag"]
        if row["form"] == "switch":
            if value:
                out.append([flag])
        elif row["form"] == "tristate":
            out.append([flag if value else "--no-" + row["flag"]])
        else:
            out.extend([["--" + also] for also in row["also"]])
            out.append([flag, str(value)])
    return out


# --------------------------------------------------------------------------- generated documentation

def argument_spec_options():
    """The ``options`` of ``vllm_instances`` in ``roles/vllm_preflight/meta/argument_specs.yml``."""
    out = {}
    for key, (kind, default, doc) in INSTANCE_KEYS.items():
        row = _BY_KEY[key]
        opt = {"type": kind}
        if key in ("name", "model"):
            opt["required"] = True
        if row["elements"]:
            opt["elements"] = row["elements"]
        if default is not None:
            opt["default"] = default
        if row["choices"]:
            opt["choices"] = list(row["choices"])
        opt["description"] = doc
        out[key] = opt
    return out


def models_description():
    """The description of ``vllm_models`` in the argument specs (a dict of dicts: its keys are listed in words)."""
    optional = [k for k in MODEL_KEYS if k not in ("repo_id", "revision")]
    return ["Models by name (lower case, usable in paths). Each value is a dict with C(repo_id) (Hub C(org/name)) and "
            "C(revision) (40-hex commit sha; a branch only with C(allow_unpinned=true)), or C(path), and optionally "
            + ", ".join(f"C({k})" for k in optional if k != "path")
            + ". Each key is one row of the inventory schema (C(docs/plan.md), model keys)."]


def _md(text):
    """Ansible doc markup (C(), I()) as Markdown."""
    return re.sub(r"[CI]\(([^)]*(?:\([^)]*\)[^)]*)*)\)", r"`\1`", text)


def docs_table(level):
    """The Markdown table of the keys of ``vllm_models`` (level "model") or ``vllm_instances`` ("instance")."""
    keys = MODEL_KEYS if level == MODEL else INSTANCE_KEYS
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, (kind, default, doc) in keys.items():
        shown = "" if default is None else f"`{json.dumps(default)}`"
        flag = _BY_KEY[key]
        extra = f" Since {flag['promoted']}." if flag["promoted"] else ""
        lines.append(f"| `{key}` | {kind} | {shown} | {_md(doc)}{extra} |")
    return "\n".join(lines)


def flags_table():
    """The Markdown table of the vLLM settings and the flags they become (a model's; an instance may override)."""
    lines = ["| key | type | flag on the command line |", "|---|---|---|"]
    for row in FLAG_ROWS:
        flag = "--" + row["flag"]
        if row["form"] == "switch":
            unit = f"`{flag}` when true (never by default)"
        elif row["form"] == "tristate":
            unit = f"`{flag}` when true, `--no-{row['flag']}` when false, none when left out (vLLM's default)"
        else:
            unit = " ".join(f"`--{a}`" for a in row["also"]) + (" " if row["also"] else "") + f"`{flag} <value>`"
        since = f" (since {row['promoted']}; the flag in `extra_args` still works, with a warning)" if row["promoted"] else ""
        lines.append(f"| `{row['key']}` | {row['type']} | {unit}{since} |")
    return "\n".join(lines)
