"""Filters inferops.vllm.weights_models / weights_fanout (plugins/plugin_utils/weights_plan.py).

The rules are a table (tests/unit/data/weights_plan_cases.yml); hypothesis checks the fan-out
invariants over random fleets: every needed snapshot has exactly one source, which fetches it from
the endpoint, and every other host that needs it copies it from that source.
"""
from __future__ import annotations

import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.weights_plan import FilterModule

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "..", "..", "data"))
FILTERS = FilterModule().filters()
weights_models = FILTERS["weights_models"]
weights_fanout = FILTERS["weights_fanout"]
SHA = {"A": "a" * 40, "B": "b" * 40, "C": "c" * 40}

with open(os.path.join(DATA, "weights_plan_cases.yml"), encoding="utf-8") as _fh:
    CASES = yaml.safe_load(_fh)


@pytest.mark.parametrize("case", CASES["models"], ids=[c["id"] for c in CASES["models"]])
def test_weights_models(case):
    opts = case.get("options", {})
    if "error" in case:
        with pytest.raises(AnsibleFilterError) as err:
            weights_models(case["models"], case["keys"], **opts)
        for needle in case["error"]:
            assert needle in str(err.value), (needle, str(err.value))
        return
    out = weights_models(case["models"], case["keys"], **opts)
    assert len(out["models"]) == len(case["expect"]["models"]), out
    for got, want in zip(out["models"], case["expect"]["models"]):
        for field, value in want.items():
            assert got[field] == value, (field, got)
    assert [s["key"] for s in out["skipped"]] == case["expect"]["skipped"]


def build_wanted(spec):
    """{host: [[repo, rev-letter, allow_patterns?], ...]} -> {host: weights_models(...).models}."""
    out = {}
    for host, entries in spec.items():
        models = {}
        for n, entry in enumerate(entries):
            settings_ = {"repo_id": entry[0], "revision": SHA[entry[1]]}
            if len(entry) > 2:
                settings_["allow_patterns"] = entry[2]
            models["m%d" % n] = settings_
        out[host] = weights_models(models, sorted(models), host=host)["models"]
    return out


def ids(spec_ids):
    return [i.replace("@" + i.split("@")[1], "@" + SHA[i.split("@")[1]]) for i in spec_ids]


@pytest.mark.parametrize("case", CASES["fanout"], ids=[c["id"] for c in CASES["fanout"]])
def test_weights_fanout(case):
    wanted = build_wanted(case["wanted"])
    opts = dict(case.get("options", {}), hosts=case["hosts"])
    if "error" in case:
        with pytest.raises(AnsibleFilterError) as err:
            weights_fanout(wanted, case["hosts"][0], **opts)
        for needle in case["error"]:
            assert needle in str(err.value), (needle, str(err.value))
        return
    for host, want in case["expect"].items():
        plan = weights_fanout(wanted, host, **opts)
        assert [i["id"] for i in plan["endpoint"]] == ids(want["endpoint"])
        assert [i["id"] for i in plan["endpoint"] if i.get("serve_only")] == ids(want.get("serve_only", []))
        assert {p["item"]["id"]: p["source"] for p in plan["peer"]} == dict(zip(ids(want["peer"]), want["peer"].values()))
        assert plan["clients"] == want["clients"]
        assert plan["serve"] is bool(want["clients"])
        if "via" in want:
            assert {p["item"]["id"]: p["via"] for p in plan["peer"]} == dict(zip(ids(want["via"]), want["via"].values()))
        if "reach" in want:
            assert plan["reach"] == want["reach"]
        if "relay" in want:
            assert plan["relay"] is want["relay"]
        for item in plan["endpoint"]:
            if item.get("serve_only"):
                assert item["model_keys"] == []
                if "serve_only_dir" in want:
                    assert item["repo_dir"] == want["serve_only_dir"]


def test_fanout_input_must_be_a_dict():
    with pytest.raises(AnsibleFilterError, match="must be a dict host"):
        weights_fanout([], "h1")


def test_unknown_host():
    with pytest.raises(AnsibleFilterError, match="do not include h9"):
        weights_fanout({"h1": []}, "h9", fanout=True)


fleets = st.dictionaries(
    keys=st.sampled_from(["h%d" % i for i in range(6)]),
    values=st.lists(st.sampled_from([("acme/a", "A"), ("acme/b", "B"), ("acme/c", "C")]), unique=True, max_size=3),
    min_size=1)


@settings(max_examples=150, deadline=None)
@given(fleet=fleets, source_index=st.one_of(st.none(), st.integers(min_value=0, max_value=5)),
       degree=st.integers(min_value=0, max_value=3))
def test_fanout_invariants(fleet, source_index, degree):
    hosts = sorted(fleet)
    source = hosts[source_index % len(hosts)] if source_index is not None else None
    wanted = build_wanted({h: [list(e) for e in fleet[h]] for h in hosts})
    plans = {h: weights_fanout(wanted, h, fanout=True, source=source, hosts=hosts, degree=degree) for h in hosts}
    # a tree per snapshot: every copying host's ancestors end at the host that fetched it from the endpoint, each
    # ancestor also copies or fetches it, and no host serves one snapshot to more than `degree` hosts
    children = {}
    for h in hosts:
        assert all(plan["routes"] == plans[h]["routes"] for plan in plans.values())  # one tree, the same everywhere
        for p in plans[h]["peer"]:
            via = p["via"]
            assert via[0] == p["source"] and len(set(via)) == len(via) and h not in via
            assert via[-1] == plans[h]["sources"][p["item"]["id"]]
            for a in via:
                assert h in plans[a]["reach"]
            for a in via[1:]:
                assert any(q["item"]["id"] == p["item"]["id"] for q in plans[via[0]]["peer"])
            children.setdefault((p["source"], p["item"]["id"]), []).append(h)
            if not degree:
                assert len(via) == 1  # a star: everyone copies from the source
    if degree:
        assert all(len(c) <= degree for c in children.values()), children
    for h in hosts:
        assert plans[h]["relay"] is any(src == h for (src, _i) in children if any(
            q["item"]["id"] == _i for q in plans[h]["peer"]))
    needed = {i["id"] for h in hosts for i in wanted[h]}
    fetchers = {}
    for h, plan in plans.items():
        for item in plan["endpoint"]:
            fetchers.setdefault(item["id"], []).append(h)
    # each snapshot comes from the endpoint exactly once (Hub bytes = 1x per snapshot)
    assert sorted(fetchers) == sorted(needed)
    assert all(len(v) == 1 for v in fetchers.values()), fetchers
    for h in hosts:
        got = {i["id"] for i in plans[h]["endpoint"] if not i.get("serve_only")} | {p["item"]["id"] for p in plans[h]["peer"]}
        assert got == {i["id"] for i in wanted[h]}  # every host gets exactly what it needs
        for p in plans[h]["peer"]:
            assert p["source"] != h and fetchers[p["item"]["id"]] == [p["via"][-1]]
            assert h in plans[p["source"]]["clients"]
        if source is not None:
            assert plans[h]["endpoint"] == [] or h == source
