"""The fleet-case corpus (issue 39): each case of ``fleet_cases/cases.yml`` is an inventory of several hosts, planned
the way the preflight role plans a play (the fleet view from hostvars, then ``vllm_fleet_plan`` over the play's hosts)
and the rollout units the way ``rollout.yml`` reads them (``vllm_rollout_plan``). Every case is checked against its
expected per-host plans and fleet views, and against the fleet's invariants: each router worker is an instance of
its host's own plan at its planned port; each host's ``router_workers`` are its routers' workers; a cache_aware
router's workers, and only they, serve the render endpoints; the hosts of an instance that spans hosts plan it alike
and roll out in one unit."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from ansible_collections.inferops.vllm.plugins.filter.vllm_fleet_view import vllm_fleet_view, vllm_rollout_plan
from ansible_collections.inferops.vllm.plugins.filter.vllm_plan import vllm_fleet_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS
from test_plan_contract import host_facts

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "fleet_cases", "cases.yml")) as _fh:
    CASES = yaml.safe_load(_fh)["cases"]
SCALE_OUT = "--enable-scale-out"


def inventory(case):
    """hostvars (as Ansible gives them: group_names, the variables by precedence, facts) and groups."""
    hosts = case["hosts"]
    groups = {"all": list(hosts), "ungrouped": []}
    groups.update({g: list(m) for g, m in (case.get("groups") or {}).items()})
    hostvars = {}
    for pos, host in enumerate(hosts):
        names = sorted(g for g, members in groups.items() if host in members and g != "all")
        values = {"vllm_service_host": "0.0.0.0", "vllm_service_network_interface": "eth0"}
        for group, variables in (case.get("vars") or {}).items():
            if group == "all" or group in names:
                values.update(variables)
        values.update((case.get("host_vars") or {}).get(host, {}))
        facts = host_facts(case.get("shape", "seed-8x-rtxpro6000"))
        values["group_names"] = names
        values["ansible_facts"] = dict(facts, interfaces=["lo", "eth0"], eth0={
            "device": "eth0", "ipv4": {"address": f"10.0.0.{pos + 5}", "netmask": "255.255.255.0"}})
        hostvars[host] = values
    return hostvars, groups


def fleet_plan(case):
    hostvars, groups = inventory(case)
    play = case.get("play") or case["hosts"]
    fleet = vllm_fleet_view(hostvars, case["hosts"], play, groups=groups)
    given = {}
    for host in play:
        hv = hostvars[host]
        facts = {k: v for k, v in hv["ansible_facts"].items() if k in ("gpus", "gpu_links")}
        facts.update(host_facts(case.get("shape", "seed-8x-rtxpro6000")))
        given[host] = {"models": hv.get("vllm_models"), "instances": hv.get("vllm_instances"), "facts": facts,
                       "inputs": {k: v for k, v in hv.items() if k in PLAN_INPUTS}}
    return vllm_fleet_plan(given, fleet=fleet), hostvars, groups, play


def ports(plan):
    return {i["name"]: i["port"] for i in plan["instances"]}


def units_of(plans, hostvars, play):
    """The rollout units as rollout.yml reads them: from the plans of the hosts that could be planned."""
    ok = {h: p for h, p in plans.items() if "problems" not in p}
    given = {h: dict(hostvars[h], vllm_preflight_plan=ok[h]) for h in ok}
    return vllm_rollout_plan(given, [h for h in play if h in ok])["units"]


def check_invariants(plans, hostvars, groups, play):
    ok = {h: p for h, p in plans.items() if "problems" not in p}
    for router_host, plan in ok.items():
        for router in plan["routers"]:
            for worker in router["workers"]:
                host, port = worker["host"], int(worker["url"].rsplit(":", 1)[1])
                if host in ok:  # an instance of that host's own plan, at its planned port, serving the API
                    (inst,) = [i for i in ok[host]["instances"] if i["name"] == worker["instance"]]
                    assert inst["port"] == port and inst["url"] is not None, (router_host, worker)
                    assert inst["model"]["key"] == router["model"]
                    # ... and that host knows it is this router's worker, at the same URL
                    assert [w["worker_url"] for w in ok[host]["router_workers"]
                            if w["router_host"] == router_host and w["model"] == router["model"]
                            and w["instance"] == worker["instance"]] == [worker["url"]]
    for host, plan in ok.items():
        for entry in plan["router_workers"]:
            if entry["router_host"] in ok:
                (router,) = [r for r in ok[entry["router_host"]]["routers"] if r["model"] == entry["model"]]
                assert {"host": host, "instance": entry["instance"], "url": entry["worker_url"]} in [
                    {k: w[k] for k in ("host", "instance", "url")} for w in router["workers"]]
        if any(h not in ok for h in groups.get("vllm_routers", [])):
            continue  # a refused router lists no worker; its model's instances still serve what it would ask
        cache_aware = {w["instance"] for w in plan["router_workers"] if w["policy"] == "cache_aware"}
        for inst in plan["instances"]:
            given = any(SCALE_OUT in str(a) for a in (hostvars[host].get("vllm_instances") or [])
                        if isinstance(a, dict) and a.get("name") == inst["name"] for a in a.get("extra_args") or [])
            assert (SCALE_OUT in inst["argv"]) == (inst["name"] in cache_aware or given), (host, inst["name"])
    units = units_of(plans, hostvars, play)
    for host, plan in ok.items():
        for inst in plan["instances"]:
            span = (inst.get("multinode") or {}).get("hosts")
            if not span:
                continue
            for other in span:  # every rank's host plans it, at the same port
                if other in ok:
                    assert ports(ok[other])[inst["name"]] == inst["port"]
            in_play = [h for h in span if h in play]
            assert len(in_play) < 2 or any(set(in_play) <= set(u) for u in units), (inst["name"], units)


@pytest.mark.parametrize("case", CASES, ids=[re.sub(r"\W+", "-", c["name"])[:60] for c in CASES])
def test_fleet_case(case):
    plans, hostvars, groups, play = fleet_plan(case)
    expect = case["expect"]
    problems = {h: " ".join(p["problems"]) for h, p in plans.items() if "problems" in p}
    assert set(problems) == set(expect.get("problems") or {}), problems
    for host, text in (expect.get("problems") or {}).items():
        assert text in problems[host]
    for host, want in (expect.get("ports") or {}).items():
        assert ports(plans[host]) == want, host
    for host, models in (expect.get("workers") or {}).items():
        got = {r["model"]: [f"{w['host']}/{w['instance']} {w['url']}" for w in r["workers"]]
               for r in plans[host]["routers"]}
        assert got == models, host
    for host, want in (expect.get("router_workers") or {}).items():
        got = [f"{w['instance']} {w['router_host']} {w['wave']} {w['worker_url']}" for w in plans[host]["router_workers"]]
        assert got == want, host
    for host, models in (expect.get("backups") or {}).items():
        got = {r["model"]: [f"{b['host']} {b['address']}:{b['port']}" for b in r["backups"]]
               for r in plans[host]["routers"]}
        assert got == models, host
    for host, names in (expect.get("scale_out") or {}).items():
        assert [i["name"] for i in plans[host]["instances"] if SCALE_OUT in i["argv"]] == names, host
    if "units" in expect:
        assert units_of(plans, hostvars, play) == expect["units"]
    check_invariants(plans, hostvars, groups, play)


def test_the_corpus_covers_the_shapes_the_issue_names():
    text = yaml.safe_dump(CASES)
    assert sum(1 for c in CASES if len((c.get("groups") or {}).get("vllm_routers") or []) > 1) >= 1
    assert "base_port" in text and "port: 9000" in text
    assert any(isinstance(i.get("nodes"), list) for c in CASES for i in (c.get("vars") or {}).get("all", {}).get(
        "vllm_instances", []))
    assert any(isinstance(i.get("nodes"), dict) for c in CASES for i in (c.get("vars") or {}).get("all", {}).get(
        "vllm_instances", []))
    assert any(c.get("play") for c in CASES)
