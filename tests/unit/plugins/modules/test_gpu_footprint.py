"""gpu_footprint: data-driven cases (tests/unit/data/gpu_footprint_cases.yml) through main(),
plus the pure planning / evaluation functions."""
import pytest

from ansible_collections.inferops.vllm.plugins.modules import gpu_footprint

from gpu_harness import SMI, Runner, assert_subset, load_cases

CASES = load_cases("gpu_footprint_cases.yml")

RESULT_KEYS = {"index", "uuid", "used_mib", "total_mib", "expected_mib", "expected_min_mib",
               "expected_max_mib", "expectation", "ok", "checked", "processes"}


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case, monkeypatch, tmp_path):
    runner = Runner(monkeypatch, tmp_path, case["responses"], case.get("sysfs"), case.get("proc"),
                    binary=case.get("binary", SMI))
    runner.fake_time(gpu_footprint, monkeypatch)
    outcome, result = runner.run(gpu_footprint.main, case.get("args", {}))
    assert {c["kind"] for c in runner.calls} <= {"query_gpu", "apps"}
    for call in runner.calls:
        assert call["env"].get("LC_ALL") == "C"
    assert "Traceback" not in result.get("msg", "")
    if "error" in case:
        assert outcome == "fail", result
        for part in case["error"]:
            assert part in result["msg"], (part, result["msg"])
        return
    expect = case["expect"]
    assert result["changed"] is False
    assert (outcome == "fail") is expect["failed"], result["msg"]
    assert bool(result["deviations"]) is expect["failed"]
    for part in expect.get("msg", []):
        assert part in result["msg"], (part, result["msg"])
    for part in expect.get("msg_absent", []):
        assert part not in result["msg"], (part, result["msg"])
    for sentence in result["deviations"]:
        assert sentence in result["msg"]
    if "deviations" in expect:
        assert len(result["deviations"]) == expect["deviations"], result["deviations"]
    if "polls" in expect:
        assert result["polls"] == expect["polls"]
        assert len(runner.calls) == 2 * expect["polls"]
    if "sleeps" in expect:
        assert runner.sleeps == expect["sleeps"]
    for gpu in result["gpus"]:
        assert set(gpu) == RESULT_KEYS, sorted(gpu)
        if gpu["checked"] and gpu["expected_max_mib"] is not None and gpu["used_mib"] is not None:
            inside = gpu["expected_min_mib"] <= gpu["used_mib"] <= gpu["expected_max_mib"]
            if not inside:
                assert gpu["ok"] is False
    assert [g["index"] for g in result["gpus"]] == sorted(g["index"] for g in result["gpus"])
    assert_subset(expect.get("gpus", {}), result["gpus"], "gpus")


def test_check_mode_runs_the_same(monkeypatch, tmp_path):
    case = next(c for c in CASES if c["id"] == "seed-stray-process-on-an-idle-gpu")
    outputs = []
    for check_mode in (False, True):
        runner = Runner(monkeypatch, tmp_path / str(check_mode), case["responses"], proc=case["proc"])
        args = dict(case["args"], _ansible_check_mode=check_mode)
        kind, result = runner.run(gpu_footprint.main, args)
        for call in result.get("nvidia_smi_calls", []):
            call.pop("seconds")  # wall time of each command: differs between runs on a busy machine
        outputs.append((kind, result))
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == "fail"


GPUS = [
    {"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000", "pci_bus_id": "00000000:18:00.0",
     "memory_total_mib": 1000, "memory_used_mib": 500, "memory_reserved_mib": 100, "mig_mode": "Disabled"},
    {"index": 1, "uuid": "GPU-11111111-1111-1111-1111-111111111111", "pci_bus_id": "00000000:19:00.0",
     "memory_total_mib": 2000, "memory_used_mib": 0, "memory_reserved_mib": None, "mig_mode": None},
]


@pytest.mark.parametrize("used, ok", [(500, True), (400, True), (600, True), (399, False), (601, False)])
def test_range_edges_are_inclusive(used, ok):
    gpus = [dict(GPUS[0], memory_used_mib=used), GPUS[1]]
    plan = gpu_footprint.plan_expectations([{"gpus": [0], "used_mib": 500, "tolerance_mib": 100}], gpus)
    results, deviations = gpu_footprint.evaluate(gpus, [], plan)
    assert results[0]["ok"] is ok
    assert bool(deviations) is not ok


@pytest.mark.parametrize("used, ok", [(256, True), (257, False)])
def test_idle_limit_is_inclusive(used, ok):
    gpus = [GPUS[0], dict(GPUS[1], memory_used_mib=used)]
    plan = gpu_footprint.plan_expectations([{"gpus": [0], "used_mib": 500}], gpus)
    results, _dev = gpu_footprint.evaluate(gpus, [], plan, idle_max_mib=256)
    assert results[1]["ok"] is ok


def test_fraction_base_is_total_minus_reserved():
    plan = gpu_footprint.plan_expectations(
        [{"gpus": [0, 1], "used_fraction": 0.5, "tolerance_pct": 10}], GPUS)
    assert plan[0]["expected_mib"] == 450       # (1000 - 100) / 2
    assert plan[1]["expected_mib"] == 1000      # no reserved figure: 2000 / 2
    assert plan[0]["tolerance_mib"] == 45
    assert plan[1]["tolerance_mib"] == 100


def test_unknown_memory_figure_is_a_deviation():
    gpus = [dict(GPUS[0], memory_used_mib=None), GPUS[1]]
    plan = gpu_footprint.plan_expectations([{"name": "x", "gpus": [0], "used_mib": 500}], gpus)
    results, deviations = gpu_footprint.evaluate(gpus, [], plan)
    assert results[0]["ok"] is False
    assert "nvidia-smi reports no memory figure for it (expected 0-1524 MiB (500 +/- 1024))" in deviations[0]
