# Apache License 2.0 (see LICENSE)
"""What the vllm_weights role fetches on each host, and from where (controller side).

``wanted_models(models, keys, ...)`` turns the model catalogue (``vllm_models``) and the keys one host
needs (by default the models of its ``vllm_instances``) into one fetch item per snapshot: repository,
revision, patterns, target directories, and the id ``<repo_id>@<revision>`` that hosts compare.

``fanout_plan(wanted_by_host, host, ...)`` decides, for one host, which snapshots it fetches from the
endpoint (the Hub or a mirror) and which it copies from another host of the play ("fetch once, fan
out"), and whether it serves snapshots to others.

Every problem names the host, the variable and the fix; all problems are reported at once.
"""
from __future__ import annotations

from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import normalise
# the layout and the repository rules are the schema's (one place); named here for the weights code
from ansible_collections.inferops.vllm.plugins.plugin_utils.schema import (  # noqa: F401  pylint: disable=unused-import
    REPO_PART_RE,
    SHA_RE,
    VERIFY_MODES,
    repo_id_problem,
    snapshot_dirs,
)


class WeightsPlanError(ValueError):
    """Invalid input; the message lists every problem."""

    def __init__(self, problems, host=None):
        self.problems = list(problems)
        where = "host %s: " % host if host else ""
        ValueError.__init__(self, where + "; ".join(self.problems))


def plan_items(records, keys, models_dir, verify="size", adapters=()):
    """The snapshots of the models ``keys`` from normalised model records (``inventory.normalise``), then those of
    ``adapters`` (``(model key, adapter name)`` pairs: the LoRA adapters the host's instances serve).

    An adapter's item carries ``adapter``: ``{model, name, rank, bases}`` (``bases``: the names its
    ``adapter_config.json`` may give as ``base_model_name_or_path``: the model's ``repo_id``, its key and its
    ``base_aliases``), which the weights role checks against the fetched ``adapter_config.json``.

    Returns ``(items, skipped, problems)``: one item per snapshot (see ``wanted_models``), the models served
    from a ``path`` (not fetched), and what only the snapshots together can show: one repository at two
    revisions on one host (one ``current`` link per repository), or one snapshot fetched with two selections.
    """
    root = (models_dir or "").rstrip("/")
    items, skipped, problems, by_repo = [], [], [], {}
    for key in dict.fromkeys(keys):
        rec = records[key]
        if rec.get("path"):
            skipped.append({"key": key, "reason": "served from path %s, not fetched" % rec["path"]})
            continue
        repo_id, revision = rec["repo_id"], rec["revision"]
        org, name = repo_id.split("/")
        model_verify = rec.get("verify") or verify
        allow, ignore = rec.get("allow_patterns"), rec.get("ignore_patterns")
        item_id = "%s@%s" % (repo_id, revision)
        other = by_repo.get(repo_id)
        if other is not None:
            if other["id"] != item_id:
                problems.append("vllm_models['%s'] and vllm_models['%s'] both use %s, at revisions %s and %s; a host "
                                "serves one revision of a repository (one current link): use one revision"
                                % (other["model_keys"][0], key, repo_id, other["revision"], revision))
            elif (other["allow_patterns"], other["ignore_patterns"], other["verify"]) != (allow, ignore, model_verify):
                problems.append("vllm_models['%s'] and vllm_models['%s'] both fetch %s with different "
                                "allow_patterns/ignore_patterns/verify; use the same values"
                                % (other["model_keys"][0], key, item_id))
            else:
                other["model_keys"].append(key)
            continue
        dirs = snapshot_dirs(root, repo_id)
        item = {"id": item_id, "model_keys": [key], "repo_id": repo_id, "org": org, "name": name,
                "revision": revision, "pinned": bool(SHA_RE.match(revision)), "allow_unpinned": rec["allow_unpinned"],
                "allow_patterns": allow, "ignore_patterns": ignore, "verify": model_verify,
                "repo_dir": dirs["repo_dir"], "current": dirs["current"], "slug": "%s--%s" % (org, name)}
        by_repo[repo_id] = item
        items.append(item)
    for key, name in dict.fromkeys(adapters):
        model, adapter = records[key], records[key]["adapters"][name]
        if not adapter["fetched"]:
            skipped.append({"key": f"{key}/{name}", "reason": "adapter served from path %s, not fetched" % adapter["path"]})
            continue
        repo_id, revision = adapter["repo_id"], adapter["revision"]
        item_id = "%s@%s" % (repo_id, revision)
        check = {"model": key, "name": name, "rank": adapter["rank"],
                 "bases": [b for b in [model.get("repo_id"), key] + list(model.get("base_aliases") or []) if b]}
        other = by_repo.get(repo_id)
        if other is not None:
            if other["id"] != item_id or "adapters" not in other:
                problems.append("%s is %s at revision %s and %s at revision %s; a host keeps one revision of a "
                                "repository (one current link): use one revision, or another repository"
                                % (repo_id, other["model_keys"][0], other["revision"],
                                   f"{key}/{name}", revision))
            else:
                other["model_keys"].append(f"{key}/{name}")
                other["adapters"].append(check)
            continue
        org, repo_name = repo_id.split("/")
        dirs = snapshot_dirs(root, repo_id)
        item = {"id": item_id, "model_keys": [f"{key}/{name}"], "repo_id": repo_id, "org": org, "name": repo_name,
                "revision": revision, "pinned": adapter["pinned"], "allow_unpinned": adapter["allow_unpinned"],
                "allow_patterns": None, "ignore_patterns": None, "verify": model.get("verify") or verify,
                "repo_dir": dirs["repo_dir"], "current": dirs["current"], "slug": "%s--%s" % (org, repo_name),
                "adapters": [check]}
        by_repo[repo_id] = item
        items.append(item)
    return items, skipped, problems


def wanted_models(models, keys, host=None, models_dir="/var/lib/inferops/models", verify="size",
                  variable="vllm_weights_models"):
    """The snapshots one host needs, for the weights role without a plan (with one, the plan's ``weights``).

    Returns ``{"models": [item, ...], "skipped": [{"key", "reason"}, ...]}``. An item is
    ``{id, model_keys, repo_id, org, name, revision, pinned, allow_unpinned, allow_patterns, ignore_patterns,
    verify, repo_dir, current, slug}``; ``allow_patterns``/``ignore_patterns`` are None when the model
    does not set them (the module's defaults apply). Two keys naming the same repository and revision
    share one item; the same repository at two revisions on one host is an error (one ``current``
    link per repository). The models named are checked by the inventory's one normalisation.
    """
    problems = []
    if not isinstance(models, dict):
        raise WeightsPlanError(["vllm_models must be a dict of model key -> settings, got %s" % type(models).__name__],
                               host)
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise WeightsPlanError(["%s must be a list of keys of vllm_models, got %r" % (variable, keys)], host)
    if verify not in VERIFY_MODES:
        problems.append("vllm_weights_verify is %r; use one of %s" % (verify, ", ".join(VERIFY_MODES)))
    root = (models_dir or "").rstrip("/")
    if not root.startswith("/"):
        problems.append("vllm_weights_models_dir %r must be an absolute path" % models_dir)
    wanted = []
    for key in keys:
        if not isinstance(key, str) or not key:
            problems.append("%s holds %r; list keys of vllm_models" % (variable, key))
        elif key not in models:
            known = ", ".join(sorted(str(k) for k in models)) or "none"
            problems.append("model '%s' (from %s or vllm_instances) is not in vllm_models (known: %s); add it there"
                            % (key, variable, known))
        elif key not in wanted:
            wanted.append(key)
    norm = normalise({k: models[k] for k in wanted}, [], models_dir=root or "/")
    problems += norm["problems"]
    if problems:
        raise WeightsPlanError(problems, host)
    items, skipped, problems = plan_items(norm["models"], wanted, root, verify)
    if problems:
        raise WeightsPlanError(problems, host)
    return {"models": items, "skipped": skipped}


def _selection(item):
    return (item.get("allow_patterns"), item.get("ignore_patterns"), item.get("verify"))


def fanout_plan(wanted_by_host, host, fanout=False, source=None, hosts=None, models_dir=None, degree=0):
    """For ``host``: what to fetch from the endpoint, what to copy from which host, whom to serve.

    ``wanted_by_host``: host -> its ``wanted_models(...)["models"]`` (every host of the play batch).
    ``hosts``: the play batch in order (default: the keys of ``wanted_by_host`` in order). Without
    ``fanout`` every host fetches its own models from the endpoint. With it, each snapshot (id) is
    fetched once from the endpoint by ``source`` (when given) or by the first host of ``hosts`` that
    needs it (its root), and copied by the other hosts that need it along a tree: in batch order, the
    k-th host that copies it (k = 1, 2 ...) copies it from the ((k - 1) // ``degree``)-th host of the
    list [root, 1st, 2nd ...]. ``degree`` 1 is a chain, 2 a binary tree, 0 a star (every host copies
    from the root). An inner host relays what it receives while it receives it (files/hub_mirror.py
    ``--relay``), so a chain costs the root one copy and about one host's time.

    Returns ``{"endpoint": [items], "peer": [{"source", "via", "item"}], "serve": bool, "clients": [hosts],
    "reach": [hosts], "relay": bool, "sources": {id: root}, "routes": {id: [[host, from], ...]}}``.
    ``peer[].via`` is the host's ancestors in the tree, nearest first (the parent, then its parent ...
    up to the root): when a host between drops out of the play, the copy comes from the next one.
    ``clients`` are the hosts that copy from this host as planned, ``reach`` every host below it in a
    tree (who may come to it when a host between drops out), ``relay`` whether it serves a snapshot it
    copies itself. ``routes`` is the whole tree of each snapshot, the same on every host. ``endpoint``
    may hold snapshots this host does not need itself (an explicit source fetches whatever any host
    needs); those items carry ``"serve_only": true`` and, with ``models_dir``, this host's directories.
    """
    order = list(hosts) if hosts is not None else list(wanted_by_host)
    problems = []
    if host not in wanted_by_host:
        raise WeightsPlanError(["the play's hosts do not include %s (vllm_weights_wanted missing)" % host], host)
    mine = list(wanted_by_host.get(host) or [])
    if not fanout:
        return {"endpoint": mine, "peer": [], "serve": False, "clients": [], "reach": [], "relay": False,
                "sources": {}, "routes": {}}
    if source and source not in order:
        raise WeightsPlanError(["vllm_weights_fanout_source %s is not a host of this play batch (%s); name one of "
                                "them, or leave it empty for the first host that needs each model"
                                % (source, ", ".join(order))], host)
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 0:
        raise WeightsPlanError(["vllm_weights_fanout_degree must be a whole number >= 0 (1: a chain, 2: a binary "
                                "tree, 0: every host copies from the source), got %r" % (degree,)], host)
    sources, first_item, members = {}, {}, {}
    for h in order:
        for item in wanted_by_host.get(h) or []:
            other = first_item.get(item["id"])
            if other is None:
                first_item[item["id"]] = (h, item)
                sources[item["id"]] = source or h
                members[item["id"]] = [source or h]
            elif _selection(other[1]) != _selection(item):
                problems.append("%s is fetched with different allow_patterns/ignore_patterns/verify on %s and %s; "
                                "fan-out copies one snapshot: use the same values on every host"
                                % (item["id"], other[0], h))
            if h != members[item["id"]][0]:
                members[item["id"]].append(h)
    if problems:
        raise WeightsPlanError(problems, host)
    parents, children, routes = {}, {}, {}
    for item_id, tree in members.items():
        up, down = {}, {}
        for k in range(1, len(tree)):
            up[tree[k]] = tree[(k - 1) // degree] if degree else tree[0]
            down.setdefault(up[tree[k]], []).append(tree[k])
        parents[item_id], children[item_id] = up, down
        routes[item_id] = [[tree[0], ""]] + [[h, up[h]] for h in tree[1:]]

    def ancestors(item_id, h):
        chain, up = [], parents[item_id]
        while h in up:
            h = up[h]
            chain.append(h)
        return chain

    def descendants(item_id, h):
        out, todo = set(), list(children[item_id].get(h, []))
        while todo:
            d = todo.pop()
            out.add(d)
            todo.extend(children[item_id].get(d, []))
        return out

    endpoint, peer = [], []
    for item in mine:
        if sources[item["id"]] == host:
            endpoint.append(item)
        else:
            via = ancestors(item["id"], host)
            peer.append({"source": via[0], "via": via, "item": item})
    mine_ids = {i["id"] for i in mine}
    for item_id, src in sources.items():
        if src == host and item_id not in mine_ids:
            extra = dict(first_item[item_id][1], serve_only=True, model_keys=[])
            if models_dir:
                extra.update(snapshot_dirs(models_dir, extra["repo_id"]))
            endpoint.append(extra)
    direct = set(h for down in children.values() for h in down.get(host, []))
    below = set(h for item_id in children for h in descendants(item_id, host))
    clients = [h for h in order if h in direct]
    return {"endpoint": endpoint, "peer": peer, "serve": bool(clients), "clients": clients,
            "reach": [h for h in order if h in below],
            "relay": any(children[i].get(host) and sources[i] != host for i in children),
            "sources": sources, "routes": routes}


#: What vLLM's PEFTHelper refuses in an adapter_config.json (vllm/lora/peft_helper.py, vLLM 0.32.0): key -> the
#: value that is fine, and what to say.
_REFUSED_FEATURES = {"use_dora": (False, "DoRA"), "lora_bias": (False, "a LoRA bias (lora_bias)"),
                     "use_qalora": (False, "QALoRA"), "layer_replication": (None, "layer_replication"),
                     "alora_invocation_tokens": (None, "Activated LoRA (alora_invocation_tokens)"),
                     "use_bdlora": (None, "block-diagonal LoRA (use_bdlora)")}
#: PEFT's init_lora_weights that leave a plain LoRA (others change the base weights: PiSSA, OLoRA, CorDA, LoftQ).
_PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


def adapter_problems(item, config, host=None):
    """Why the fetched adapter ``item`` (a weights item with ``adapters``, ``plan_items``) cannot serve, read from its
    ``adapter_config.json`` (``config``: the parsed dict, or a string saying why it could not be read): one sentence
    per adapter and reason, naming the adapter, its base and rank, and the fix. An empty list: it serves."""
    where = "host %s: " % host if host else ""
    problems = []
    for use in item.get("adapters") or []:
        name = "adapter %s of model %s (%s)" % (use["name"], use["model"], item["id"])
        if not isinstance(config, dict):
            problems.append("%s%s: its adapter_config.json %s; is the repository a PEFT LoRA adapter?"
                            % (where, name, config if isinstance(config, str) else "is not a JSON object"))
            continue
        peft_type = config.get("peft_type")
        if str(peft_type).upper() != "LORA":
            problems.append("%s%s: peft_type is %r, not LORA; vLLM serves LoRA adapters only" % (where, name, peft_type))
        base = config.get("base_model_name_or_path")
        if base not in use["bases"]:
            problems.append("%s%s: its base_model_name_or_path is %r, not this model (%s); serve it with the model it "
                            "was trained on, or, if %r is that model under another name, add it to "
                            "vllm_models.%s.base_aliases"
                            % (where, name, base, " or ".join(use["bases"]), base, use["model"]))
        ranks = [config.get("r")] + list((config.get("rank_pattern") or {}).values())
        if not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in ranks):
            problems.append("%s%s: its rank (r %r, rank_pattern %r) is not a positive whole number"
                            % (where, name, config.get("r"), config.get("rank_pattern")))
        elif max(ranks) != use["rank"]:
            problems.append("%s%s: its rank is %d (r%s), but vllm_models.%s.adapters.%s.rank says %d; set rank: %d "
                            "(the plan's --max-lora-rank follows it)"
                            % (where, name, max(ranks), " and rank_pattern" if len(ranks) > 1 else "", use["model"],
                               use["name"], use["rank"], max(ranks)))
        for key, (fine, what) in _REFUSED_FEATURES.items():
            if config.get(key) not in (fine, None, [], {}):
                problems.append("%s%s: it uses %s, which vLLM does not serve" % (where, name, what))
        init = config.get("init_lora_weights", True)
        if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
            problems.append("%s%s: init_lora_weights is %r, which changes the base weights when PEFT loads it; vLLM "
                            "does not serve it (convert it to a plain LoRA with PEFT)" % (where, name, init))
        extra = [m for m in (config.get("modules_to_save") or []) if m not in ("classifier", "score")]
        if extra:
            problems.append("%s%s: modules_to_save %s is more than vLLM serves (only classifier or score)"
                            % (where, name, extra))
        if config.get("bias", "none") != "none":
            problems.append("%s%s: bias is %r; vLLM serves adapters without bias (none)" % (where, name, config.get("bias")))
    return problems
