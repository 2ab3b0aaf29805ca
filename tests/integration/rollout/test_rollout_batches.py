"""rollout.yml's batches: the real playbook over local hosts, only the ordering and batch tasks run.

Every task that would touch a host is left out with ``--tags`` (the ordering, the grouping and the
"This batch upgrades ..." line are tagged ``always``) and the preflight of every host with ``--skip-tags``, so what the test sees is Ansible's own ``serial``
batching of the order the collection computed.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.inferops.vllm.plugins.plugin_utils.rollout import rollout_plan, serial_sizes

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SHA = "5e1f00d0c0ffee0000000000000000000000cafe"


def plan_of(instances):
    """The part of a host's plan the batching reads (what the preflight sets as vllm_preflight_plan): an instance that
    spans hosts names them, rank order, in ``multinode.hosts``."""
    return {"instances": [dict(name=i["name"], **({"multinode": {"hosts": list(i["nodes"])}} if i.get("nodes") else {}))
                          for i in instances]}


def inventory(tmp_path, hosts, canary, instances):
    """hosts: names in inventory order; instances: host -> vllm_instances (each host's plan is given, as the skipped
    preflight would make it)."""
    inv = {"all": {"children": {
        "vllm_nodes": {"hosts": {h: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                     "vllm_models": {"m": {"repo_id": "org/m", "revision": SHA}},
                                     "vllm_instances": instances.get(h, []),
                                     "vllm_preflight_plan": plan_of(instances.get(h, [])),
                                     "vllm_service_network_interface": "eth0"} for h in hosts}},
        "canary": {"hosts": {h: {} for h in canary}},
    }}}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def playbook(args, timeout):
    """ansible-playbook with this checkout's collection (.build), no colour; returns the finished process."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_LOCALHOST_WARNING="false")
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build") + os.pathsep + env.get("ANSIBLE_COLLECTIONS_PATH", "")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook")] + args,
                          capture_output=True, text=True, timeout=timeout, env=env, check=False)


def simulated_host(tmp_path):
    """The variables of a local stand-in host whose GPUs are the simulator's (profile demo-2numa, idle)."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nGPUSIM_PROC={empty} GPUSIM_STRAY_DIR={empty} GPUSIM_PROFILE=demo-2numa "
                   f"exec {sys.executable} {os.path.join(ROOT, 'tests', 'gpusim', 'nvidia-smi')} \"$@\"\n")
    smi.chmod(0o755)
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "vllm_preflight_nvidia_smi": str(smi), "vllm_preflight_min_free_gib": 0}


def batches_of(tmp_path, hosts, canary, instances, batches):
    proc = playbook(["-i", inventory(tmp_path, hosts, canary, instances), os.path.join(ROOT, "playbooks", "rollout.yml"),
                     "--tags", "inferops-none", "--skip-tags", "vllm_preflight",
                     "-e", json.dumps({"vllm_rollout_batches": batches})], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [m.split(", ") for m in re.findall(r'"msg": "This batch upgrades ([^"]+)"', proc.stdout)]


PAIR = {"name": "duo", "model": "m", "nodes": ["n4", "n2"], "tensor_parallel_size": 1, "pipeline_parallel_size": 2}


def test_the_playbook_keeps_the_ranks_of_an_instance_in_one_batch(tmp_path):
    hosts = ["n1", "n2", "n3", "n4", "n5"]
    seen = batches_of(tmp_path, hosts, ["n1"], {"n2": [PAIR], "n4": [PAIR]}, [1, 1, "100%"])
    # Ansible alone would run [n1], [n2], [n3, n4, n5]: rank 1 (n2) without rank 0 (n4)
    assert seen == [["n1"], ["n2", "n4"], ["n3", "n5"]]


def test_a_canary_rank_brings_its_peers_into_the_first_batch(tmp_path):
    hosts = ["n1", "n2", "n3", "n4"]
    seen = batches_of(tmp_path, hosts, ["n4"], {"n2": [PAIR], "n4": [PAIR]}, [1, "100%"])
    assert seen == [["n4", "n2"], ["n1", "n3"]]


def test_without_instances_spanning_hosts_the_batches_are_ansibles(tmp_path):
    hosts = ["n1", "n2", "n3", "n4", "n5"]
    seen = batches_of(tmp_path, hosts, ["n3"], {}, [1, "25%", "100%"])
    assert seen == [["n3"], ["n1"], ["n2", "n4", "n5"]]


@pytest.mark.parametrize("batches,total,sizes", [
    ([1, "25%", "100%"], 3, [1, 1, 1]), ([1, "25%", "100%"], 10, [1, 2, 7]), (["50%"], 5, [2, 2, 1]),
    ([2], 5, [2, 2, 1]), (["100%"], 4, [4]), ([1, 1], 3, [1, 1, 1])])
def test_serial_sizes_follow_ansible(batches, total, sizes):
    assert serial_sizes(batches, total) == sizes


def test_overlapping_instances_make_one_unit_as_the_plans_name_their_hosts():
    plans = {h: {"instances": []} for h in "abcde"}
    plans["b"]["instances"] = plans["c"]["instances"] = [{"name": "x", "multinode": {"hosts": ["b", "c"]}}]
    plans["e"]["instances"] = [{"name": "y", "multinode": {"hosts": ["c", "e"]}}]
    plans["c"]["instances"] = plans["c"]["instances"] + plans["e"]["instances"]
    plan = rollout_plan(plans, list("abcde"), [1, 1, 1])
    assert plan["units"] == [["b", "c", "e"]]
    assert plan["batches"] == [["a"], ["b", "c", "e"], ["d"]] and plan["serial"] == [1, 3, 1]
    assert plan["order"] == list("abced")


def test_the_filter_refuses_hosts_without_a_plan_naming_them():
    from ansible.errors import AnsibleFilterError  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.filter.vllm_fleet_view import vllm_rollout_plan  # pylint: disable=import-outside-toplevel
    hostvars = {"a": {"vllm_preflight_plan": {"instances": []}}, "b": {"vllm_instances": []}, "c": {}}
    with pytest.raises(AnsibleFilterError, match=r"vllm_rollout_plan: b, c have no plan \(vllm_preflight_plan\)"):
        vllm_rollout_plan(hostvars, ["a", "b", "c"])
    assert vllm_rollout_plan(hostvars, ["a"])["batches"] == [["a"]]


def test_every_host_is_planned_before_the_first_batch(tmp_path):
    """Stop 53: a router of model m on r1 and r2 over every host's instance, r1 the canary and alone in the first batch.
    rollout.yml reads every host's GPUs and network and makes every plan before the first batch (a play of its own,
    as site.yml does), so r1's router lists r2's and r3's workers at their ports, and the batches stay one host each.
    Before, the preflight ran inside each batch: r1's plan saw only r1, and refused ("set vllm_router_worker_address
    (or vllm_service_network_interface) on r2", with the interface set), and the canary was rolled back. The
    stand-in hosts are local (simulated GPUs, the loopback interface: every host has its address, so the ports tell
    the workers apart); the run stops after the plans (``--tags vllm_preflight``)."""
    common = {**simulated_host(tmp_path),
              "vllm_models": {"m": {"repo_id": "org/m", "revision": SHA, "router_port": 8300}},
              "vllm_service_api_key": "sk-rollout-plans-0123456789abcdef",
              "vllm_service_network_interface": "lo", "vllm_frontdoor_bind_address": "0.0.0.0"}
    hosts = {h: dict(common, vllm_instances=[{"name": "chat", "model": "m", "port": 8001 + i}])
             for i, h in enumerate(["r1", "r2", "r3"])}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "vllm_nodes": {"hosts": hosts}, "canary": {"hosts": {"r1": {}}},
        "vllm_routers": {"hosts": {"r1": {}, "r2": {}}}}}}))
    proc = playbook(["-i", str(path),
                     os.path.join(ROOT, "playbooks", "rollout.yml"), "--tags", "vllm_preflight",
                     "--skip-tags", "vllm_preflight_health", "-e", "vllm_preflight_show_plan=true",
                     "-e", json.dumps({"vllm_rollout_batches": [1, 1, 1]})],
                    timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m.split(", ") for m in re.findall(r'"msg": "This batch upgrades ([^"]+)"', proc.stdout)] == [
        ["r1"], ["r2"], ["r3"]], out[-4000:]
    workers = ("workers: r1 chat http://127.0.0.1:8001, r2 chat http://127.0.0.1:8002, "
               "r3 chat http://127.0.0.1:8003")
    # the router's line in the plans of both router hosts, made before r1's batch
    assert proc.stdout.count(workers) == 2, out[-4000:]
    assert proc.stdout.index(workers) < proc.stdout.index("This batch upgrades r1")


def test_maintenance_check_orders_its_batches_from_the_plans(tmp_path):
    """maintenance.yml plans every host (read-only), then orders the batches from those plans (canary first,
    vllm_maintenance_max_unavailable hosts at a time) with the settings kept by its first play, says them, and in
    check mode stops before any host is drained. Local stand-in hosts (simulated GPUs), action ``packages``."""
    common = {**simulated_host(tmp_path),
              "vllm_models": {"m": {"repo_id": "org/m", "revision": SHA}},
              "vllm_service_api_key": "sk-maintenance-plans-0123456789ab"}
    hosts = {h: dict(common, vllm_instances=[{"name": "chat", "model": "m", "port": 8001 + i}])
             for i, h in enumerate(["m1", "m2", "m3"])}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {
        "vllm_nodes": {"hosts": hosts}, "canary": {"hosts": {"m3": {}}}}}}))
    proc = playbook(["-i", str(path),
                     os.path.join(ROOT, "playbooks", "maintenance.yml"), "--check",
                     "--skip-tags", "vllm_preflight_health",
                     "-e", json.dumps({"vllm_maintenance_action": "packages",
                                       "vllm_maintenance_max_unavailable": 2, "vllm_maintenance_reboot": False})],
                    timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert ("maintenance (packages), 2 batch(es), each host: cordoned (out of its front door and routers) -> drained "
            "(units stopped) -> upgrading -> no reboot -> validating (GPU health) -> uncordoned (behind the gate)") in out
    assert '"batch: m3, m1"' in out and '"batch: m2"' in out, out[-4000:]
    assert [m.split(", ") for m in re.findall(r'"msg": "This batch maintains ([^"(]+?) \(check mode', out)] == [
        ["m3", "m1"], ["m2"]], out[-4000:]
