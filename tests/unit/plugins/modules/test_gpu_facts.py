"""gpu_facts: data-driven cases (tests/unit/data/gpu_facts_cases.yml) through the module's main()."""
import copy

import pytest

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi
from ansible_collections.inferops.vllm.plugins.modules import gpu_facts

from gpu_harness import SMI, Runner, assert_subset, expand_cpus, load_cases

CASES = load_cases("gpu_facts_cases.yml")

GPU_KEYS = {
    "index": int, "uuid": str, "name": str, "pci_bus_id": str, "memory_total_mib": int,
    "memory_used_mib": int, "memory_free_mib": int, "memory_reserved_mib": (int, type(None)),
    "mig_mode": (str, type(None)), "numa_node": (int, type(None)), "cpu_affinity": list,
    "compute_mode": (str, type(None)),
}
PROCESS_KEYS = {
    "pid": int, "process_name": str, "gpu_uuid": str, "gpu_index": (int, type(None)),
    "used_mib": (int, type(None)), "unit": (str, type(None)),
}


def _expand(facts):
    """cpu_affinity in the case data is a CPU-list string; expand it for comparison."""
    facts = copy.deepcopy(facts)
    gpus = facts.get("gpus")
    items = gpus.values() if isinstance(gpus, dict) else (gpus or [])
    for gpu in items:
        if "cpu_affinity" in gpu:
            gpu["cpu_affinity"] = expand_cpus(gpu["cpu_affinity"])
    return facts


def check_contract(facts):
    assert set(facts) == {"gpus", "gpu_links", "gpu_driver", "gpu_processes"}
    indices = [g["index"] for g in facts["gpus"]]
    assert indices == sorted(indices)
    for gpu in facts["gpus"]:
        assert set(gpu) == set(GPU_KEYS), sorted(gpu)
        for key, kind in GPU_KEYS.items():
            assert isinstance(gpu[key], kind), (key, gpu[key])
        assert gpu["cpu_affinity"] == sorted(set(gpu["cpu_affinity"]))
    for i, row in facts["gpu_links"].items():
        assert i in [str(x) for x in indices]
        assert i not in row
        for j, link in row.items():
            assert facts["gpu_links"][j][i] == link
    assert set(facts["gpu_driver"]) == {"driver_version", "cuda_version"}
    for proc in facts["gpu_processes"]:
        assert set(proc) == set(PROCESS_KEYS)
        for key, kind in PROCESS_KEYS.items():
            assert isinstance(proc[key], kind), (key, proc[key])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case, monkeypatch, tmp_path):
    runner = Runner(monkeypatch, tmp_path, case["responses"], case.get("sysfs"), case.get("proc"),
                    binary=case.get("binary", SMI))
    outcome, result = runner.run(gpu_facts.main, case.get("args", {}))
    for call in runner.calls:
        assert call["env"].get("LC_ALL") == "C", call
    if "error" in case:
        assert outcome == "fail", result
        for part in case["error"]:
            assert part in result["msg"], (part, result["msg"])
        assert "Traceback" not in result["msg"]
        return
    assert outcome == "exit", result.get("msg")
    assert result["changed"] is False
    facts = result["ansible_facts"]
    check_contract(facts)
    if "facts" in case:
        assert facts == _expand(case["facts"])
    if "facts_subset" in case:
        assert_subset(_expand(case["facts_subset"]), facts, "ansible_facts")
    if "calls" in case:
        assert len(runner.calls) == case["calls"], [c["cmd"] for c in runner.calls]
        assert len(result["nvidia_smi_calls"]) == case["calls"]
    if "query_without" in case:
        queries = [c["cmd"] for c in runner.calls if c["kind"] == "query_gpu"]
        assert case["query_without"] in queries[0][1]
        assert case["query_without"] not in queries[-1][1]
    for part in case.get("warnings", []):
        assert any(part in w for w in runner.warnings), (part, runner.warnings)


def test_commands_are_the_documented_ones(monkeypatch, tmp_path):
    """One --query-gpu with every field, one --query-compute-apps, one topo -m, one --version."""
    case = next(c for c in CASES if c["id"] == "pcie-8x-two-numa-tp4-loaded")
    runner = Runner(monkeypatch, tmp_path, case["responses"])
    outcome, _result = runner.run(gpu_facts.main, {})
    assert outcome == "exit"
    assert [c["cmd"] for c in runner.calls] == [
        [SMI, "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,"
              "memory.reserved,mig.mode.current,compute_mode,driver_version", "--format=csv"],
        [SMI, "--query-compute-apps=pid,process_name,gpu_uuid,gpu_bus_id,used_memory", "--format=csv"],
        [SMI, "topo", "-m"],
        [SMI, "--version"],
    ]
    assert [list(nvidia_smi.QUERY_GPU_ARGS), list(nvidia_smi.QUERY_APPS_ARGS)] == [
        runner.calls[0]["cmd"][1:], runner.calls[1]["cmd"][1:]]


def test_check_mode_gives_the_same_facts(monkeypatch, tmp_path):
    case = next(c for c in CASES if c["id"] == "mig-host")
    results = []
    for check_mode in (False, True):
        runner = Runner(monkeypatch, tmp_path / str(check_mode), case["responses"])
        outcome, result = runner.run(gpu_facts.main, {"_ansible_check_mode": check_mode})
        assert outcome == "exit"
        results.append(result["ansible_facts"])
    assert results[0] == results[1]


def test_explicit_binary_path_is_used(monkeypatch, tmp_path):
    binary = tmp_path / "nvidia-smi"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    case = next(c for c in CASES if c["id"] == "mig-host")
    runner = Runner(monkeypatch, tmp_path, case["responses"], binary=None)
    outcome, _result = runner.run(gpu_facts.main, {"nvidia_smi": str(binary)})
    assert outcome == "exit"
    assert {c["cmd"][0] for c in runner.calls} == {str(binary)}


def test_binary_not_executable(monkeypatch, tmp_path):
    binary = tmp_path / "nvidia-smi"
    binary.write_text("")
    binary.chmod(0o644)
    runner = Runner(monkeypatch, tmp_path, {})
    outcome, result = runner.run(gpu_facts.main, {"nvidia_smi": str(binary)})
    assert outcome == "fail"
    assert "is not executable" in result["msg"]
