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


def plan_items(records, keys, models_dir, verify="size"):
    """The snapshots of the models ``keys`` from normalised model records (``inventory.normalise``).

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
