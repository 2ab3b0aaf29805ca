"""The GPU-idle pre-start check that roles/vllm_service installs (files/vllm-gpu-idle).

Each case (tests/unit/data/vllm_gpu_idle_cases.yml) feeds recorded nvidia-smi outputs and
/proc/<pid>/cgroup contents to the script's main() and checks its exit code and message. The script
imports the collection's nvidia_smi module_utils the way it does on a host (installed next to it).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

import pytest
import yaml

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "roles", "vllm_service", "files", "vllm-gpu-idle")
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "nvidia-smi")
with open(os.path.join(ROOT, "tests", "unit", "data", "vllm_gpu_idle_cases.yml")) as fh:
    CASES = yaml.safe_load(fh)


def load_script():
    # on a host the script finds nvidia_smi.py next to itself; here it is the collection's copy
    sys.modules.setdefault("nvidia_smi", nvidia_smi)
    loader = importlib.machinery.SourceFileLoader("vllm_gpu_idle", SCRIPT)
    spec = importlib.util.spec_from_loader("vllm_gpu_idle", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


IDLE = load_script()


def exit_codes(fixture):
    codes = {}
    path = os.path.join(FIXTURES, fixture, "commands.tsv")
    with open(path) as fh:
        for line in fh.read().splitlines()[1:]:
            name, code, _cmd = line.split("\t", 2)
            codes.setdefault(name, int(code))
    return codes


class FakeRunner(object):
    """Serves the case's recorded outputs for the two queries the check makes."""

    def __init__(self, case):
        self.case = case
        self.dir = os.path.join(FIXTURES, case["fixture"])
        self.codes = exit_codes(case["fixture"])
        self.calls = []

    def run_command(self, cmd, environ_update=None):
        assert environ_update and environ_update.get("LC_ALL") == "C"
        self.calls.append(cmd[1:])
        if cmd[1].startswith("--query-gpu="):
            name = self.case["query"]
        elif cmd[1].startswith("--query-compute-apps="):
            name = self.case["apps"]
        else:
            raise AssertionError("unexpected nvidia-smi call: %r" % (cmd,))
        with open(os.path.join(self.dir, name)) as fh:
            return self.codes.get(os.path.basename(name), 0), fh.read(), ""

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return "/usr/bin/" + name


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case(case, tmp_path, capsys):
    for pid, text in (case.get("cgroups") or {}).items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    runner = FakeRunner(case)
    rc = IDLE.main(case["args"], runner=runner, proc_root=str(tmp_path))
    out, err = capsys.readouterr()
    text = out if case["rc"] == 0 else err
    assert rc == case["rc"], (out, err)
    for needle in case.get("say", []):
        assert needle in text, (needle, text)
    for needle in case.get("never", []):
        assert needle not in text, (needle, text)
    # two queries at most, never anything that changes a GPU
    assert len(runner.calls) <= 2


def test_every_case_id_is_unique():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))


def test_the_unit_pinning_does_not_narrow_the_check(monkeypatch):
    # ExecStartPre inherits the unit's CUDA_VISIBLE_DEVICES; nvidia-smi must still see every GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-x")
    seen = {}

    def fake_run(cmd, env=None, **_kw):
        seen.update(env)

        class Done(object):
            returncode, stdout, stderr = 0, "", ""
        return Done()

    monkeypatch.setattr(IDLE.host_runner.subprocess, "run", fake_run)
    IDLE._Runner().run_command(["nvidia-smi"], environ_update={"LC_ALL": "C"})
    assert "CUDA_VISIBLE_DEVICES" not in seen and seen["LC_ALL"] == "C"
