# Apache License 2.0 (see LICENSE)
"""The inventory schema and its one normalisation (controller side, pure Python, no Ansible imports).

``vllm_models`` (model key -> settings) and ``vllm_instances`` (a list per host) are declared here,
once: every key with its type, default and meaning (``MODEL_KEYS``, ``INSTANCE_KEYS``). The roles'
``meta/argument_specs.yml`` and ``docs/plan.md`` are tested against these tables, so the documented
keys and the accepted keys cannot drift.

``normalise(models, instances, host=...)`` checks both against the tables and everything types
cannot express (references between them, pinned revisions, names usable in unit names and paths,
unique names and ports, flags the roles set, secrets in the environment) and returns typed records
plus one sentence per problem, each naming the host, the variable and the fix. Later stages read the
records (through the plan) and never look at the raw inventory again.
"""
from __future__ import annotations

import math
import re

from ansible_collections.inferops.vllm.plugins.plugin_utils.edge import TASKS, route_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import key_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.schema import (
    FLAG_ROWS,
    INSTANCE_KEYS,
    MODEL_KEYS,
    OVERRIDES,
    PROMOTED,
    SHA_RE,
    VERIFY_MODES,
    repo_id_problem,
    snapshot_dirs,
    value_problem,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_choices import LORA_RANKS
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_args import (
    canonical_flag,
    check_extra_args,
    env_problems,
    parse_extra_args,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import (
    as_bool as _as_bool,
    as_float as _as_float,
    as_int as _as_int,
    kind as _kind,
    plain,
    suggest,
)

__all__ = ["MODEL_KEYS", "INSTANCE_KEYS", "DEPRECATED_KEYS", "normalise", "model_path", "NAME_RE", "SHA_RE",
           "LOWEST_PORT", "adapter_pins", "lora_settings"]

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
#: The lowest port an instance can listen on: its unit drops every capability (no CAP_NET_BIND_SERVICE).
LOWEST_PORT = 1024

# MODEL_KEYS, INSTANCE_KEYS and OVERRIDES are the rows of plugins/plugin_utils/schema.py (one table).

#: Old spellings still accepted: old key -> (new key, note). None yet: a key that is renamed keeps
#: its old name here, with a deprecation note.
DEPRECATED_KEYS = {}


def _where(host):
    return f"host {host}: " if host else ""


def _served_names(value, where, problems):
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(s, str) and s and not any(c.isspace() for c in s) for s in names):
        problems.append(f"{where}.served_model_name is {value!r}; use a name without spaces (or a list of them)")
        return None
    return list(names)


def _typed(value, kind, where, key, problems):
    """Coerce one setting to its schema type; None (and a problem) when it cannot be."""
    if kind == "int":
        num = _as_int(value)
        if num is None or num < 1:
            problems.append(f"{where}.{key} is {value!r} ({_kind(value)}); use a positive whole number >= 1 "
                            "or leave it out")
        return num
    if kind == "float":
        num = _as_float(value)
        if num is None or math.isnan(num):
            problems.append(f"{where}.{key} is {value!r}; use a number")
        return num
    if kind == "bool":
        flag = _as_bool(value)
        if flag is None:
            problems.append(f"{where}.{key} is {value!r}; use true or false")
        return flag
    if kind == "str":
        if not isinstance(value, str) or not value:
            problems.append(f"{where}.{key} is {value!r} ({_kind(value)}); use a non-empty string or leave it out")
            return None
        return value
    if kind == "path":
        if not isinstance(value, str) or not value.startswith("/"):
            problems.append(f"{where}.{key} is {value!r}; use an absolute path")
            return None
        return value.rstrip("/") or "/"
    if kind == "dict":
        if not isinstance(value, dict):
            problems.append(f"{where}.{key} must be a dict of NAME: value, got {_kind(value)} ({value!r})")
            return None
        return dict(value)
    if kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            example = "['--enable-prefix-caching']" if key == "extra_args" else "['*.safetensors', '*.json']"
            problems.append(f"{where}.{key} must be a list of strings, e.g. {example}, got {_kind(value)} ({value!r})")
            return None
        return list(value)
    return value


def _read(raw, schema, where, problems, as_given=()):
    """One dict of settings -> {key: typed value or default}; unknown keys are problems.

    ``as_given``: keys the caller checks itself (kept as they are, no type problem here).
    """
    out = {}
    for key in raw:
        if key in schema:
            continue
        if key in DEPRECATED_KEYS and DEPRECATED_KEYS[key][0] in schema:
            continue
        problems.append(f"{where}: unknown key {key!r}{suggest(key, schema)} "
                        f"(known: {', '.join(schema)})")
    for key, (kind, default, _doc) in schema.items():
        value = raw.get(key)
        if value is None:
            for old, (new, _note) in DEPRECATED_KEYS.items():
                if new == key and raw.get(old) is not None:
                    value = raw[old]
        if value is None:
            out[key] = default if not isinstance(default, (list, dict)) else type(default)(default)
            continue
        if kind == "raw" or key in as_given:
            out[key] = value
            continue
        out[key] = _typed(value, kind, where, key, problems)
    return out


def model_path(models_dir, record):
    """Where a model is served from: its ``path``, else ``<models_dir>/<repo_id>/current``."""
    if record.get("path"):
        return record["path"]
    return snapshot_dirs(models_dir, record["repo_id"])["current"]


def _settings(rec, where, problems):
    """The vLLM settings of a record (schema.FLAG_ROWS) checked beyond their type; a refused one becomes None."""
    for row in FLAG_ROWS:
        key = row["key"]
        reason = value_problem(key, rec[key])
        if reason:
            problems.append(f"{where}.{key} is {rec[key]!r}; {reason}")
            rec[key] = None


def _base_flag(flag):
    """``--no-enable-prefix-caching`` and ``--enable_prefix_caching`` are one flag."""
    name = canonical_flag(flag)
    return name[3:] if name.startswith("no-") else name


def _extra_groups(value, where, problems):
    """One source of extra_args parsed into flag groups and checked on its own; None when it cannot be parsed."""
    if value is None:
        return []
    try:
        groups = parse_extra_args(value, where)
    except ValueError as exc:
        problems.append(str(exc))
        return None
    problems.extend(check_extra_args(groups, where))
    return groups


def _model(key, raw, host, models_dir, problems):
    w = _where(host)
    if not isinstance(key, str):
        problems.append(f"{w}vllm_models: the model key {key!r} is {_kind(key)}, not a name; quote it in YAML "
                        f"('{key}':) or use a lower-case name such as 'llama-8b' (instances name it in model)")
        return None
    where = f"{w}vllm_models.{key}"
    if not NAME_RE.match(key):
        problems.append(f"{where}: the model name must match {NAME_RE.pattern} (lower case, digits, '._-'); rename it")
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a dict with at least repo_id and revision (or path), got {_kind(raw)}"
                        + (f" ({raw!r})" if raw is not None else "") + "; e.g. {repo_id: org/name, revision: <sha>}")
        return None
    rec = _read(raw, MODEL_KEYS, where, problems)
    rec["key"] = key
    repo = raw.get("repo_id")
    if rec["path"] is None or repo is not None:
        msg = repo_id_problem(repo)
        if msg:
            problems.append(f"{where}.repo_id is {repo!r}: {msg}; set it to the Hub repository as 'org/name'"
                            + (" or give an absolute path" if rec["path"] is None else ""))
        rev = raw.get("revision")
        if not isinstance(rev, str) or not rev:
            problems.append(f"{where}.revision is missing; pin the 40-hex commit sha of the repository "
                            "(HfApi().model_info(repo_id).sha) or set allow_unpinned: true with a branch name")
        elif not SHA_RE.match(rev) and not rec["allow_unpinned"]:
            problems.append(f"{where}.revision is {rev!r}, not a 40-hex commit sha; pin the commit "
                            "(a branch moves under a running fleet) or set allow_unpinned: true")
    if rec["frontdoor_port"] is not None and not 1 <= rec["frontdoor_port"] <= 65535:
        problems.append(f"{where}.frontdoor_port is {rec['frontdoor_port']!r}; use a TCP port number 1-65535 "
                        "or leave it out for no front door")
    if rec["router_port"] is not None and not 1 <= rec["router_port"] <= 65535:
        problems.append(f"{where}.router_port is {rec['router_port']!r}; use a TCP port number 1-65535 "
                        "or leave it out for no router")
    if rec["router_port"] is not None and rec["router_port"] == rec["frontdoor_port"]:
        problems.append(f"{where}.router_port and frontdoor_port are both {rec['router_port']}; give the router "
                        "its own port (both listen on the router hosts' front door)")
    if rec["task"] is not None and rec["task"] not in TASKS:
        problems.append(f"{where}.task is {rec['task']!r}; use one of {', '.join(TASKS)} (it picks the routes the "
                        "front doors pass)")
        rec["task"] = None
    problems.extend(route_problems(rec["routes"], f"{where}.routes"))
    if rec["verify"] is not None and rec["verify"] not in VERIFY_MODES:
        problems.append(f"{where}.verify is {rec['verify']!r}; use one of {', '.join(VERIFY_MODES)}")
    _settings(rec, where, problems)
    if rec["served_model_name"] is not None:
        rec["served_model_name"] = _served_names(rec["served_model_name"], where, problems)
    # checked here, once per model (an instance's own are checked with the instance)
    _extra_groups(rec["extra_args"], f"{where}.extra_args", problems)
    rec["env"] = env_problems(rec["env"], f"{where}.env", problems)
    _model_adapters(rec, where, models_dir, problems)
    rec["pinned"] = isinstance(rec["revision"], str) and bool(SHA_RE.match(rec["revision"]))
    rec["fetched"] = rec["path"] is None
    try:
        rec["local_path"] = model_path(models_dir, rec) if (rec["path"] or not repo_id_problem(repo)) else None
    except ValueError:
        rec["local_path"] = None
    return rec


#: The keys of one adapter of a model's ``adapters``.
ADAPTER_KEYS = ("repo_id", "revision", "allow_unpinned", "path", "rank")
#: What clients give in ``model`` to ask for an adapter (vLLM takes the name as it is; no spaces, no '/').
ADAPTER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _adapter(name, raw, where, models_dir, problems):
    """One entry of a model's ``adapters`` -> its record, or None (problems)."""
    here = f"{where}.adapters.{name}"
    if not isinstance(name, str) or not ADAPTER_NAME_RE.match(name):
        problems.append(f"{where}.adapters: the adapter name {name!r} cannot be a model name clients give; use letters, "
                        "digits, '_', '.' and '-', starting with a letter or digit (e.g. sql-lora)")
        return None
    if not isinstance(raw, dict):
        problems.append(f"{here} must be a dict, {{repo_id: org/name, revision: <sha>, rank: 8}} or {{path: /dir, "
                        f"rank: 8}}, got {_kind(raw)}")
        return None
    before = len(problems)
    for key in raw:
        if key not in ADAPTER_KEYS:
            problems.append(f"{here}: unknown key {key!r}{suggest(key, ADAPTER_KEYS)} (known: {', '.join(ADAPTER_KEYS)})")
    repo, rev, path = raw.get("repo_id"), raw.get("revision"), raw.get("path")
    unpinned = _as_bool(raw.get("allow_unpinned", False))
    if unpinned is None:
        problems.append(f"{here}.allow_unpinned is {raw.get('allow_unpinned')!r}; use true or false")
    rank = _as_int(raw.get("rank"))
    if raw.get("rank") is None:
        problems.append(f"{here}.rank is missing; give the adapter's r from its adapter_config.json (the largest "
                        "value of its rank_pattern, if it has one)")
    elif rank is None or not 1 <= rank <= max(LORA_RANKS):
        problems.append(f"{here}.rank is {raw.get('rank')!r}; use the adapter's r, a whole number 1-{max(LORA_RANKS)} "
                        "(the largest rank vLLM serves)")
    if (repo is None) == (path is None):
        problems.append(f"{here}: give either repo_id and revision (a Hub repository, fetched) or path (a directory on "
                        "the host)" + (", not both" if repo is not None else ""))
    elif path is not None:
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(f"{here}.path is {path!r}; use an absolute path")
        if rev is not None:
            problems.append(f"{here}: revision is for a Hub adapter (repo_id); remove it with path")
    else:
        msg = repo_id_problem(repo)
        if msg:
            problems.append(f"{here}.repo_id is {repo!r}: {msg}; set it to the Hub repository as 'org/name'")
        if not isinstance(rev, str) or not rev:
            problems.append(f"{here}.revision is missing; pin the 40-hex commit sha of the adapter's repository")
        elif not SHA_RE.match(rev) and not unpinned:
            problems.append(f"{here}.revision is {rev!r}, not a 40-hex commit sha; pin the commit (a branch moves "
                            "under a running fleet) or set allow_unpinned: true")
    if len(problems) > before:
        return None
    fetched = path is None
    return {"name": name, "repo_id": repo if fetched else None, "revision": rev if fetched else None,
            "allow_unpinned": bool(unpinned), "pinned": bool(fetched and SHA_RE.match(rev)), "fetched": fetched,
            "rank": rank, "path": snapshot_dirs(models_dir, repo)["current"] if fetched else path.rstrip("/") or "/"}


def _model_adapters(rec, where, models_dir, problems):
    """A model's ``adapters`` (name -> record) and its LoRA settings, checked; in place on ``rec``."""
    raw = rec["adapters"]
    rec["adapters"] = {}
    if raw is not None and not isinstance(raw, dict):
        problems.append(f"{where}.adapters must be a dict of adapter name -> {{repo_id, revision, rank}} or "
                        f"{{path, rank}}, got {_kind(raw)}")
        raw = None
    for name, entry in (raw or {}).items():
        adapter = _adapter(name, entry, where, models_dir, problems)
        if adapter is not None:
            if adapter["fetched"] and adapter["repo_id"] == rec.get("repo_id"):
                problems.append(f"{where}.adapters.{name}.repo_id is the model's own repository ({adapter['repo_id']}); "
                                "an adapter is a repository of its own")
                continue
            rec["adapters"][name] = adapter
    if not raw:
        for key in ("max_lora_rank", "max_loras", "max_cpu_loras"):
            if rec[key] is not None:
                problems.append(f"{where}.{key} is set but the model has no adapters; remove it, or declare the "
                                "adapters in adapters")
        return
    rank = rec["max_lora_rank"]
    if rank is not None and rank not in LORA_RANKS:
        problems.append(f"{where}.max_lora_rank is {rank}; vLLM accepts {', '.join(map(str, LORA_RANKS))}: use the "
                        "smallest of them that holds your largest adapter's rank, or leave it out for that")
    if rec["max_loras"] is not None and rec["max_cpu_loras"] is not None and rec["max_cpu_loras"] < rec["max_loras"]:
        problems.append(f"{where}.max_cpu_loras is {rec['max_cpu_loras']}, below max_loras {rec['max_loras']}, which "
                        f"vLLM refuses at start; raise it to {rec['max_loras']} or more, or leave it out")


def adapter_pins(lora):
    """What an instance's adapters are, pinned (``inventory.lora_settings`` or the plan's ``lora``): ``name=repo@revision``
    for a fetched adapter, ``name=path <dir>`` for one served from a path; in the instance's order."""
    return [f"{a['name']}={a['repo_id']}@{a['revision']}" if a.get("fetched") else f"{a['name']}=path {a['path']}"
            for a in (lora or {}).get("adapters", [])]


def lora_settings(model, names):
    """The LoRA settings of an instance serving ``names`` (adapters of ``model``, a normalised record), or None when
    it serves none: ``{adapters, max_lora_rank, max_loras, max_cpu_loras}`` plus ``problems`` (what vLLM refuses)."""
    if not names:
        return None
    adapters = [model["adapters"][n] for n in names]
    largest = max(a["rank"] for a in adapters)
    rank = model["max_lora_rank"] or min(r for r in LORA_RANKS if r >= largest)
    loras = model["max_loras"] or len(adapters)
    cpu = model["max_cpu_loras"] or max(loras, len(adapters))
    problems = []
    if rank < largest:
        big = [a["name"] for a in adapters if a["rank"] > rank]
        problems.append(f"max_lora_rank {rank} is below the rank of {', '.join(big)} ({largest}), which vLLM refuses "
                        f"to load; raise vllm_models.{model['key']}.max_lora_rank to "
                        f"{min(r for r in LORA_RANKS if r >= largest)} or leave it out")
    return {"adapters": adapters, "max_lora_rank": rank, "max_loras": loras, "max_cpu_loras": max(cpu, loras),
            "problems": problems}


def _promoted_twice(rec, model, groups, where, problems):
    """A setting given both as its key and as its flag in extra_args (a key that was a flag before): refused.

    ``groups``: the instance's own and its model's extra_args, parsed."""
    for group in groups:
        row = PROMOTED.get(_base_flag(group[0]))
        if row is None:
            continue
        key = row["key"]
        value = rec[key] if rec.get(key) is not None else model.get(key)
        if value is not None:
            problems.append(f"{where}: {key} is {value!r} and extra_args has '{' '.join(group)}' too; give it once: "
                            f"keep {key} and remove the flag from extra_args")


def _instance(pos, raw, models, host, problems, refused=()):
    w = _where(host)
    if not isinstance(raw, dict):
        problems.append(f"{w}vllm_instances[{pos}] must be a dict with at least name and model, "
                        f"got {_kind(raw)}" + (f" ({raw!r})" if raw is not None else "")
                        + "; e.g. {name: chat, model: <a key of vllm_models>}")
        return None
    name = raw.get("name")
    where = f"{w}vllm_instances[{pos}]" + (f" ({name})" if isinstance(name, str) and name else "")
    before = len(problems)
    rec = _read(raw, INSTANCE_KEYS, where, problems, as_given=("name", "model"))
    if name is None or name == "":
        problems.append(f"{where}: 'name' is required (a short name such as 'chat'; the unit becomes "
                        "vllm-<name>.service)")
    elif not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 200:
        text = str(name)
        fixed = re.sub(r"[^a-z0-9_.-]+", "-", text.lower()).strip("-_.")[:200] or "chat"
        problems.append(f"{where}: name {name!r} cannot be used in a systemd unit name; use lower-case letters, "
                        f"digits, '_', '.' and '-', starting with a letter or digit, at most 200 (e.g. '{fixed}')")
    model_key = raw.get("model")
    model = models.get(model_key) if isinstance(model_key, str) else None
    declared = ", ".join(sorted(models)) or "(none declared: add it to vllm_models)"
    if model_key is None:
        problems.append(f"{where}.model is missing; set it to one of vllm_models: {declared}")
    elif not isinstance(model_key, str):
        problems.append(f"{where}.model is {model_key!r} ({_kind(model_key)}); set it to the key of a model in "
                        "vllm_models, as a string" + (f" (quote it, '{model_key}', and the model's key too)"
                                                      if model_key in refused else f": {declared}"))
    elif model_key in refused:
        problems.append(f"{where}.model is {model_key!r}, whose entry vllm_models.{model_key} is refused (see its "
                        "problem); fix that entry")
    elif model is None:
        problems.append(f"{where}.model is {model_key!r}, which vllm_models does not declare; use one of: {declared}")
    util = rec["gpu_memory_utilization"]
    if util is not None and not 0 < util <= 1:
        problems.append(f"{where}.gpu_memory_utilization is {util!r}; it must be a fraction in (0, 1], e.g. 0.9")
    port = rec["port"]
    if port is not None and not LOWEST_PORT <= port <= 65535:
        problems.append(f"{where}.port is {port!r}; use a TCP port number {LOWEST_PORT}-65535, or leave it out to get "
                        "one from the plan's base port"
                        + (": the unit runs without capabilities (no CAP_NET_BIND_SERVICE), so vLLM cannot bind a "
                           "port below 1024; give the model a front door (frontdoor_port) on the low port instead"
                           if port < LOWEST_PORT else ""))
    port = rec["vllm_port"]
    if port is not None and not LOWEST_PORT <= port <= 65535:
        problems.append(f"{where}.vllm_port is {port!r}; use a TCP port number {LOWEST_PORT}-65535")
    _settings(rec, where, problems)
    if rec["served_model_name"] is not None:
        rec["served_model_name"] = _served_names(rec["served_model_name"], where, problems)
    problems.extend(key_problems(rec, where))
    # the instance's own extra_args and env (the model's are checked with the model); a flag in both is refused
    own = _extra_groups(rec["extra_args"], f"{where}.extra_args", problems)
    # the model's own were checked with the model; parsed once more here, for the checks across the two
    inherited = (_extra_groups(model.get("extra_args"), "", []) or []) if model is not None else []
    if own and model is not None:
        theirs = {_base_flag(g[0]): g[0] for g in inherited}
        for group in own:
            flag = _base_flag(group[0])
            if flag in theirs:
                problems.append(f"{where}.extra_args: '{group[0]}' is also in vllm_models.{model_key}.extra_args "
                                f"(as '{theirs[flag]}'); give it once: remove it from one of the two")
    rec["env"] = env_problems(rec["env"], f"{where}.env", problems)
    if model is not None:
        _promoted_twice(rec, model, (own or []) + inherited, where, problems)
    if len(problems) > before or model is None:
        return None
    # the instance's own record: the model's settings with the instance's overrides on top
    for key in OVERRIDES:
        if rec.get(key) is None and model.get(key) is not None:
            rec[key] = model[key]
    rec["trust_remote_code"] = bool(rec["trust_remote_code"])
    cross = scheduler_problems(rec, where)
    if cross:
        problems.extend(cross)
        return None
    # the names clients ask for; the plan's served_model_name is the first
    rec["served_model_name"] = rec["served_model_name"] or [
        model["repo_id"] if model.get("repo_id") else model["key"]]
    rec["lora"] = _instance_adapters(rec, model, where, problems)
    if rec["lora"] is False:
        return None
    return rec


def _instance_adapters(rec, model, where, problems):
    """The adapters the instance serves (its ``adapters``, default all of its model's) and their LoRA settings; None
    for none, False when refused."""
    own = rec["adapters"]
    known = model.get("adapters") or {}
    if own is None:
        names = list(known)
    elif not isinstance(own, list) or not all(isinstance(n, str) for n in own):
        problems.append(f"{where}.adapters must be a list of names of vllm_models.{model['key']}.adapters "
                        f"({', '.join(known) or 'it declares none'}), or [] for none; got {_kind(own)}")
        return False
    else:
        names = list(dict.fromkeys(own))
        unknown = [n for n in names if n not in known]
        if unknown:
            problems.append(f"{where}.adapters names {', '.join(repr(n) for n in unknown)}, not an adapter of "
                            f"vllm_models.{model['key']}" + (f" (it has {', '.join(known)})" if known else
                                                             " (it declares none: add them there)"))
            return False
    clash = [n for n in names if n in rec["served_model_name"]]
    if clash:
        problems.append(f"{where}: adapter {clash[0]!r} has the name the instance serves the model as "
                        "(served_model_name); clients could not tell them apart: rename the adapter")
        return False
    lora = lora_settings(model, names)
    if lora and lora["problems"]:
        problems.extend(f"{where}: {p}" for p in lora["problems"])
        return False
    if lora:
        lora.pop("problems")
    return lora


def scheduler_problems(rec, where):
    """What vLLM's scheduler refuses at start, refused in the plan: the rules of ``SchedulerConfig.verify_max_model_len``
    (vllm/config/scheduler.py, vLLM 0.32.0) between the settings an instance (with its model's) gives. A rule is
    checked when the inventory gives both of its sides (vLLM's own defaults depend on the device it finds)."""
    problems = []
    tokens, seqs, length = rec.get("max_num_batched_tokens"), rec.get("max_num_seqs"), rec.get("max_model_len")
    if tokens is not None and length is not None and tokens < length and rec.get("enable_chunked_prefill") is False:
        problems.append(f"{where}: max_num_batched_tokens {tokens} is smaller than max_model_len {length} with "
                        "enable_chunked_prefill false, which vLLM refuses at start (a prompt could never fit one "
                        f"step); raise max_num_batched_tokens to {length} or more, lower max_model_len, or leave "
                        "chunked prefill on")
    if tokens is not None and seqs is not None and tokens < seqs:
        problems.append(f"{where}: max_num_batched_tokens {tokens} is smaller than max_num_seqs {seqs}, which vLLM "
                        f"refuses at start (every running sequence needs a token of each step); raise "
                        f"max_num_batched_tokens to {seqs} or more, or lower max_num_seqs")
    return problems


def normalise(models, instances, host=None, models_dir="/var/lib/inferops/models"):
    """Check and type the inventory of one host.

    Returns ``{"models": {key: record}, "instances": [record, ...], "problems": [sentence, ...]}``.
    Records hold every schema key (defaults filled in); an instance record also carries its model's
    settings (overrides applied; ``served_model_name`` as a list). ``extra_args`` and ``env`` stay the
    instance's own (checked here together with the model's; the plan merges them).
    Instances with problems are left out of ``instances``; ``problems`` is empty when all is well.
    Any input (any nesting of dicts, lists, numbers, strings, nulls) gives records or problems, never an
    exception; the values are read as Python's own types (``values.plain``), so no message names an
    internal class.
    """
    w = _where(host)
    problems = []
    models, instances = plain(models), plain(instances)
    if models is None:
        models = {}
    if not isinstance(models, dict):
        return {"models": {}, "instances": [], "problems": [
            f"{w}vllm_models must be a dict of model name -> settings (repo_id, revision, ...), "
            f"got {_kind(models)} ({models!r})"]}
    recs = {}
    for key, raw in models.items():
        rec = _model(key, raw, host, models_dir, problems)
        if rec is not None:
            recs[key] = rec
    refused = [key for key in models if key not in recs]
    if instances is None:
        instances = []
    if not isinstance(instances, list):
        return {"models": recs, "instances": [], "problems": problems + [
            f"{w}vllm_instances must be a list of dicts (name, model, tensor_parallel_size, ...), "
            f"got {_kind(instances)}" + (
                f"; write it as a list: [{instances!r}]" if isinstance(instances, dict) else f" ({instances!r})")]}
    out = []
    for pos, raw in enumerate(instances):
        rec = _instance(pos, raw, recs, host, problems, refused)
        if rec is not None:
            rec["position"] = pos
            out.append(rec)
    names, ports = {}, {}
    for rec in out:
        names.setdefault(rec["name"], []).append(rec["position"])
        if rec["port"] is not None:
            ports.setdefault(rec["port"], []).append(rec)
    for name, where in names.items():
        if len(where) > 1:
            problems.append(f"{w}vllm_instances[{', '.join(map(str, where))}]: name '{name}' is used "
                            f"{len(where)} times; instance names must be unique (each becomes its own systemd unit)")
    for port, users in ports.items():
        if len(users) > 1:
            problems.append(f"{w}vllm_instances[{', '.join(str(u['position']) for u in users)}]: port {port} is "
                            f"given to {', '.join(repr(u['name']) for u in users)}; give each instance its own port "
                            "or leave port out to get one from the plan's base port")
    return {"models": recs, "instances": out, "problems": problems}
