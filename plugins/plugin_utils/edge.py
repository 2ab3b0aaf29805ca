# Apache License 2.0 (see LICENSE)
"""The edge: which requests a front door lets through to a model (controller side, pure Python, no Ansible imports).

Deny by default (docs/operate.md, "Security model"). A front door (the host's, per model, and a router's) passes:

* ``GET /health``, without a key (vLLM answers ``HEAD`` with 405);
* with a valid key (``Authorization: Bearer <key>``, one of the model's named keys), the model's **routes**: those
  of its ``task`` (``TASK_ROUTES``: chat, completions and models for a generative model, embeddings for an
  embedding model, ...) plus the model's own ``routes`` (``'POST /tokenize'``, say);
* nothing else: every other path, and every request target that a server behind it could read as another path
  (``REFUSED``, ``NON_CANONICAL``, an asterisk or authority form), is refused before the key is even looked at.

vLLM's ``--api-key`` guards only the paths under ``/v1`` (its authentication middleware): ``/invocations``,
``/tokenize``, ``/pooling``, ``/metrics``, ``/version`` and, with some settings, ``/pause``, ``/sleep`` and
``/reset_prefix_cache`` answer without a key; vllm-router forwards a path it does not know to a worker, turning a raw
``\\`` into ``/`` and resolving ``..`` on the way. So the route list is exact paths, and a route that changes a
server's state (``ADMIN_PATHS``) cannot be added to it.

``model_routes(record)`` gives a normalised model's routes as ``[{"method", "path"}]`` (the plan's front doors
carry them); ``route_problems(value, where)`` checks a model's ``routes``; ``edge_policy`` is what a front door's
configuration is rendered from. No regular expression: HAProxy compiles them with PCRE2's JIT, which the front door's
unit forbids (``MemoryDenyWriteExecute``); what passes is matched exactly against the route list and sent on in origin
form (``set-uri %[pathq]``), so a server behind sees exactly the path that was matched.
"""
from __future__ import annotations

import re

__all__ = ["edge_policy", "TASKS", "TASK_ROUTES", "HEALTH_PATH", "ADMIN_PATHS", "REFUSED", "NON_CANONICAL", "model_routes", "route_problems",
           "parse_route", "KEY_NAME_RE", "key_problems"]

#: The routes of each ``task`` of a model (the model key ``task``), as "METHOD /path".
TASK_ROUTES = {
    "generate": ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models"),
    "embed": ("POST /v1/embeddings", "GET /v1/models"),
    "score": ("POST /v1/score", "POST /v1/rerank", "GET /v1/models"),
    "classify": ("POST /classify", "GET /v1/models"),
}
TASKS = tuple(TASK_ROUTES)
#: Answered without a key (a load balancer's check): GET only.
HEALTH_PATH = "/health"

#: Paths that change what a server does or does not serve, or read its internals: never a client route, whatever
#: the inventory says (vLLM 0.32.0's development and administration routes, vllm-router 0.1.17's worker admin
#: routes). The front door refuses them like any path that is not listed; ``routes`` may not list them.
ADMIN_PATHS = (
    # vLLM: LoRA at run time, sleep mode, pause, caches, elastic EP, profiling, RPC, server internals
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up", "/is_sleeping", "/pause", "/resume",
    "/is_paused", "/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/collective_rpc",
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/start_profile", "/stop_profile", "/server_info", "/update_weights",
    "/init_weight_transfer_engine", "/get_world_size",
    # vllm-router: the worker list and its caches
    "/add_worker", "/remove_worker", "/list_workers", "/flush_cache", "/get_loads", "/workers",
    # metrics have their own listeners (an instance's is reached by the service role and Prometheus on the host)
    "/metrics",
)

#: Characters a request target may not hold anywhere (path or query): ``\\`` (a separator to some servers and to
#: vllm-router's client), ``%`` (so no encoding of ``.``, ``/`` or ``\\`` survives to a server that decodes), ``;``
#: (path parameters). HAProxy itself refuses control bytes and spaces in the request line.
REFUSED = ("\\", "%", ";")
#: Path pieces that make a path another one on the way to a server: refused anywhere in the path (``/./``, ``/../``,
#: ``//``) or at its end (``/.``, ``/..``), though no listed route could match them either.
NON_CANONICAL = {"within": ("/./", "/../", "//"), "end": ("/.", "/..")}

_ROUTE_RE = re.compile(r"^(GET|POST) (/[A-Za-z0-9_-]+(?:/[A-Za-z0-9_.-]+)*)$")
#: A client key's name (it appears in the front door's log instead of the key).
KEY_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A key: printable ASCII without spaces, at least 16 characters (a Bearer token's characters).
_KEY_RE = re.compile(r"^[\x21-\x7e]{16,512}$")


def parse_route(text):
    """``"POST /tokenize"`` -> ``{"method": "POST", "path": "/tokenize"}``, or None when it is not one."""
    match = _ROUTE_RE.match(text) if isinstance(text, str) else None
    if not match or ".." in match.group(2):
        return None
    return {"method": match.group(1), "path": match.group(2)}


def route_problems(value, where):
    """Problems of a model's ``routes`` (a list of "METHOD /path"); ``where`` names it (``vllm_models.m.routes``)."""
    if value is None:
        return []
    if not isinstance(value, list):
        return [f"{where} must be a list of 'METHOD /path' strings, e.g. ['POST /tokenize']"]
    problems = []
    for pos, item in enumerate(value):
        route = parse_route(item)
        if route is None:
            problems.append(f"{where}[{pos}] is {item!r}; write a route as 'GET /path' or 'POST /path' (letters, "
                            "digits, '_', '-', '.' between single slashes, no query), e.g. 'POST /tokenize'")
        elif route["path"] in ADMIN_PATHS:
            problems.append(f"{where}[{pos}] is {item!r}, a route that changes or reads a server's state; the front "
                            "door never passes it to clients (docs/operate.md, \"Security model\"): remove it")
        elif route["path"] == HEALTH_PATH:
            problems.append(f"{where}[{pos}] is {item!r}; {HEALTH_PATH} always passes (without a key): remove it")
    return problems


def model_routes(record):
    """The routes of a normalised model (its ``task``'s and its own ``routes``), sorted and unique."""
    task = record.get("task") or "generate"
    texts = list(TASK_ROUTES.get(task, TASK_ROUTES["generate"])) + list(record.get("routes") or [])
    routes = {(r["path"], r["method"]): r for r in (parse_route(t) for t in texts) if r is not None}
    return [routes[k] for k in sorted(routes)]


def key_problems(keys, where, models, instance_key="", allow_unauthenticated=False):
    """Problems of the front doors' client keys: ``{<model key or '*'>: {<name>: <key>}}``; ``models``: the inventory's
    ``vllm_models`` (a model with ``frontdoor_port`` or ``router_port`` must end up with a key, the instances'
    ``instance_key`` counting, unless ``allow_unauthenticated``). The messages name models and key names, never a key."""
    if keys is None:
        keys = {}
    if not isinstance(keys, dict):
        return [f"{where} must be a dict of model key (or '*' for every model) -> {{client name: key}}"]
    models = models if isinstance(models, dict) else {}
    problems = []
    if not allow_unauthenticated and not (isinstance(instance_key, str) and instance_key) and "*" not in keys:
        for model in sorted(m for m in models if isinstance(m, str)):
            entry = models[model] if isinstance(models[model], dict) else {}
            if model not in keys and any(entry.get(k) not in (None, "") for k in ("frontdoor_port", "router_port")):
                problems.append(f"{where}: model '{model}' has a front door (frontdoor_port or router_port) but no key, "
                                "so anyone who reaches it could use the model; give it keys in "
                                f"{where}.{model} (or '*'), set vllm_service_api_key, or set "
                                "vllm_frontdoor_allow_unauthenticated: true")
    for model, named in keys.items():
        if model != "*" and model not in models:
            problems.append(f"{where}: {model!r} is not a model of vllm_models ({', '.join(sorted(models)) or 'none'}) "
                            "nor '*' (every model); fix the model key")
            continue
        if not isinstance(named, dict) or not named:
            problems.append(f"{where}.{model} must be a dict of client name -> key (from vault), e.g. "
                            "{alice: !vault ...}")
            continue
        for name, key in named.items():
            if not isinstance(name, str) or not KEY_NAME_RE.match(name):
                problems.append(f"{where}.{model}: the client name {name!r} must be letters, digits, '_', '.' and "
                                "'-' (it is what the front door logs instead of the key)")
            if not isinstance(key, str) or not _KEY_RE.match(key):
                problems.append(f"{where}.{model}.{name}: the key must be 16-512 printable ASCII characters without "
                                "spaces (a Bearer token); generate one with `openssl rand -hex 32`")
    return problems


#: What a cache_aware vllm-router asks every worker before it routes (the prompt's tokens): a worker listener for such
#: a router passes them too (vLLM serves them with ``--enable-scale-out``, behind its key).
RENDER_ROUTES = ("POST /v1/completions/render", "POST /v1/chat/completions/render")


#: A router's front door also answers vllm-router's liveness without a key: the other router hosts' front doors check
#: it there (this router is their backup).
LIVENESS_PATH = "/liveness"


def edge_policy(record, render=False, router=False):
    """What a front door of the normalised model ``record`` passes (the plan's ``frontdoors[].edge``): ``routes``
    (with a key; with ``render``, the render routes a cache_aware router asks its workers for), ``health`` (the paths
    answered without one, GET only: ``/health``, and for a ``router``'s front door ``/liveness`` too), what a
    request target may not hold:
    ``refuse`` (``REFUSED``) and ``non_canonical`` (``NON_CANONICAL``)."""
    if render:
        record = dict(record, routes=list(record.get("routes") or []) + list(RENDER_ROUTES))
    return {"routes": model_routes(record), "health": [HEALTH_PATH] + ([LIVENESS_PATH] if router else []),
            "refuse": list(REFUSED), "non_canonical": {k: list(v) for k, v in NON_CANONICAL.items()}}
