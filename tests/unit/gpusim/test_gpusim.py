"""Tests of the GPU simulator tests/gpusim/nvidia-smi.

The simulator runs as a subprocess, with the Python of the test hosts (/usr/bin/python3 when
present), and its output is compared byte for byte with real nvidia-smi captures
(tests/fixtures/nvidia-smi/h200-1gpu and h200-1gpu-b). Memory accounting is exercised with real
processes (gpusim-hold, fake vLLM servers); most tests show the simulator a private proc view
(GPUSIM_PROC: a directory of links to /proc/<pid> of the test's own processes) so that nothing
else running on the machine can change the numbers. One test scans the real /proc.
"""

from __future__ import annotations

import datetime
import importlib.machinery
import importlib.util
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPUSIM = os.path.join(ROOT, "tests", "gpusim")
SMI = os.path.join(GPUSIM, "nvidia-smi")
HOLD = os.path.join(GPUSIM, "gpusim-hold")
PROFILES = os.path.join(GPUSIM, "profiles")
FIX = os.path.join(ROOT, "tests", "fixtures", "nvidia-smi")
H200 = os.path.join(FIX, "h200-1gpu")
H200B = os.path.join(FIX, "h200-1gpu-b")
PROFILE_B = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles", "h200-1gpu-b.json")
# the interpreter of the Debian 12 test hosts when this machine has it (stdlib only there)
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def profile_path(name):
    return os.path.join(PROFILES, name + ".json")


def load_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def read(path):
    with open(path, "rb") as handle:
        return handle.read()


def commands(directory):
    """name -> (argv after 'nvidia-smi', exit code) from a capture's commands.tsv."""
    result = {}
    with open(os.path.join(directory, "commands.tsv"), encoding="utf-8") as handle:
        for line in handle.read().splitlines()[1:]:
            name, code, command = line.split("\t")
            result[name] = (shlex.split(command)[1:], int(code))
    return result


def table_time(data):
    """GPUSIM_NOW for a capture of the plain table (its first line is the time), else None."""
    first = data.decode().split("\n", 1)[0].strip()
    try:
        return datetime.datetime.strptime(first, "%a %b %d %H:%M:%S %Y").isoformat()
    except ValueError:
        return None


@pytest.fixture(name="sim")
def fixture_sim(tmp_path):
    """Run the simulator: sim(args, profile, proc=..., env=..., now=...) -> (rc, stdout bytes)."""
    strays = tmp_path / "stray.d"
    strays.mkdir()
    empty = tmp_path / "emptyproc"
    empty.mkdir()

    def run(args, profile, proc=None, env=None, now=None, real_proc=False):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUSIM_")}
        environ.update({"GPUSIM_PROFILE": profile, "GPUSIM_STRAY_DIR": str(strays)})
        if not real_proc:
            environ["GPUSIM_PROC"] = str(proc or empty)
        if now:
            environ["GPUSIM_NOW"] = now
        environ.update(env or {})
        done = subprocess.run([PY, SMI] + list(args), env=environ, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=30, check=False)
        return done.returncode, done.stdout

    run.strays = strays
    return run


class Processes:
    """Real processes started by a test; all killed (whole session) at teardown."""

    def __init__(self, tmp_path):
        self.tmp_path = tmp_path
        self.started = []

    def start(self, argv, argv0=None, env=None, wait_ready=False):
        environ = {k: v for k, v in os.environ.items()
                   if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
        environ.update(env or {})
        proc = subprocess.Popen([argv0 or argv[0]] + list(argv[1:]), executable=argv[0],
                                env=environ, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True, universal_newlines=True)
        self.started.append(proc)
        lines = []
        if wait_ready:
            for line in proc.stdout:
                if line.strip() == "ready":
                    break
                lines.append(line.strip())
        return proc, lines

    def hold(self, mib, argv0="python3", env=None, extra=()):
        # wait for "ready": under load a holder queried before it allocated would show no memory yet
        proc, _lines = self.start([PY, HOLD, "--mib", str(mib)] + list(extra), argv0=argv0,
                                  env=env, wait_ready=True)
        return proc.pid

    def view(self, *pids):
        """A proc root holding only these pids and their descendants (links to /proc/<pid>)."""
        root = self.tmp_path / ("procview%d" % len(list(self.tmp_path.glob("procview*"))))
        root.mkdir()
        wanted = set(pids)
        parents = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open("/proc/%s/stat" % name, encoding="utf-8", errors="replace") as handle:
                        parents[int(name)] = int(handle.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in wanted} - wanted
            grew = bool(more)
            wanted |= more
        for pid in wanted:
            os.symlink("/proc/%d" % pid, str(root / str(pid)))
        return str(root)

    def stop(self):
        started, self.started = self.started, []
        for proc in started:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass
        for proc in started:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
            proc.stdout.close()


@pytest.fixture(name="procs")
def fixture_procs(tmp_path):
    processes = Processes(tmp_path)
    yield processes
    processes.stop()


def query(sim, profile, proc=None, env=None, ids=None, real_proc=False):
    """memory.used / memory.free per GPU index."""
    args = ["--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits"]
    if ids:
        args = ["-i", ids] + args
    code, out = sim(args, profile, proc=proc, env=env, real_proc=real_proc)
    assert code == 0, out
    rows = [line.split(", ") for line in out.decode().splitlines()]
    return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}


def apps(sim, profile, proc=None, real_proc=False, ids=None):
    args = ["--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
            "--format=csv,noheader,nounits"]
    if ids:
        args = ["-i", ids] + args
    code, out = sim(args, profile, proc=proc, real_proc=real_proc)
    assert code == 0, out
    uuids = {g["uuid"]: i for i, g in enumerate(load_json(profile)["gpus"])}
    return [(uuids[u], int(p), n, int(m))
            for u, p, n, m in (line.split(", ") for line in out.decode().splitlines())]


def with_pids(data, mapping):
    """Put our pids where the capture has its pids (CSV cells and the table's PID column)."""
    text = data.decode()
    for real, ours in mapping.items():
        text = re.sub(r"(?m)^%d," % real, "%d," % ours, text)
        text = re.sub(r"(?m), %d, " % real, ", %d, " % ours, text)
        text = text.replace("%16d      C   " % real, "%16d      C   " % ours)
    return text.encode()


def overhead(count, profile_gpu=None):
    """The driver's unattributed memory per GPU with `count` compute processes (README)."""
    gpu = profile_gpu or {}
    base = gpu.get("context_overhead_base_mib", 4)
    per = gpu.get("context_overhead_per_process_mib", 5.5)
    return int(math.floor(base + per * count)) if count else 0


# ------------------------------------------------------------------ byte for byte: h200-1gpu

H200_IDLE = ["smi.out", "smi_L.out", "smi_query.out", "smi_query_nounits.out", "smi_topo.out",
             "smi_apps_idle.out", "smi_bad.out", "smi_badid.out"]


@pytest.mark.parametrize("name", H200_IDLE)
def test_h200_idle_capture_byte_for_byte(sim, name):
    argv, code = commands(H200)[name]
    expected = read(os.path.join(H200, name))
    got_code, got = sim(argv, profile_path("h200-1gpu"), now=table_time(expected))
    assert got == expected
    assert got_code == code


def test_h200_busy_captures_with_a_real_holder(sim, procs):
    """busy_*: one python3 process showing 21090 MiB, memory.used 21099 (+9 MiB driver)."""
    pid = procs.hold(21090, argv0="python3")
    view = procs.view(pid)
    cmds = commands(H200)
    for name in ("busy_query.out", "busy_apps.out", "busy_smi.out"):
        argv, code = cmds[name]
        expected = read(os.path.join(H200, name))
        got_code, got = sim(argv, profile_path("h200-1gpu"), proc=view, now=table_time(expected))
        assert got_code == code
        assert got == with_pids(expected, {495: pid}), name


# ------------------------------------------------------------------ byte for byte: h200-1gpu-b

B_CMDS = commands(H200B)
B_CMDS["q_space.out"] = (["--query-gpu=index, name", "--format=csv"], B_CMDS["q_space.out"][1])
B_IDLE = sorted(name for name in B_CMDS if not name.startswith(("busy", "names", "after")))
# the instant power draw of these two idle captures differs from the one the profile holds
B_NOISY = {"idle_all_nu.out", "idle_all_nhnu.out"}


def mask_power(data, argv):
    fields = [a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")][0].split(",")
    masked = [i for i, f in enumerate(fields) if f.startswith("power.draw")]
    lines = data.decode().splitlines()
    out = []
    for line in lines:
        cells = line.split(", ")
        if len(cells) == len(fields) and not line.startswith("index"):
            cells = ["P" if i in masked else c for i, c in enumerate(cells)]
        out.append(", ".join(cells))
    return "\n".join(out)


@pytest.mark.parametrize("name", B_IDLE)
def test_h200b_idle_capture_byte_for_byte(sim, name):
    argv, code = B_CMDS[name]
    expected = read(os.path.join(H200B, name))
    got_code, got = sim(argv, PROFILE_B, now=table_time(expected))
    assert got_code == code
    if name in B_NOISY:
        assert mask_power(got, argv) == mask_power(expected, argv)
    else:
        assert got == expected


def capture_now(name):
    """GPUSIM_NOW for a b-capture: the table's first line or the timestamp column."""
    data = read(os.path.join(H200B, name))
    now = table_time(data)
    match = re.search(rb"(\d{4})/(\d\d)/(\d\d) (\d\d:\d\d:\d\d)\.(\d{3})", data)
    if not now and match:
        now = "%s-%s-%sT%s.%s000" % tuple(g.decode() for g in match.groups())
    return now


def compare_b(sim, names, profile, view, mapping):
    for name in names:
        argv, code = B_CMDS[name]
        expected = read(os.path.join(H200B, name))
        got_code, got = sim(argv, profile, proc=view, now=capture_now(name))
        assert got_code == code, name
        assert got == with_pids(expected, mapping), name


def test_h200b_one_process(sim, procs):
    pid = procs.hold(10758, argv0="/opt/torch/.venv/bin/python3")
    view = procs.view(pid)
    names = [n for n in B_CMDS if n.startswith("busy1_")
             and n not in ("busy1_all_csv.out", "busy1_all_nh.out", "busy1_all_nu.out")]
    compare_b(sim, names, PROFILE_B, view, {1551: pid})


def test_h200b_two_processes(sim, procs):
    first = procs.hold(10758, argv0="/opt/torch/.venv/bin/python3")
    second = procs.hold(5638, argv0="/opt/torch/.venv/bin/python3")
    if second < first:
        pytest.skip("pid numbers wrapped around")
    view = procs.view(first, second)
    names = [n for n in B_CMDS if n.startswith("busy3_") and "_all_" not in n
             and not n.endswith("_all.out")] + ["busy3_apps_all.out"]
    compare_b(sim, names, PROFILE_B, view, {1551: first, 2166: second})


def test_h200b_process_names_and_three_processes(sim, procs, tmp_path):
    """argv[0] is the process name; the table keeps the last 29 characters of a long one."""
    profile = load_json(PROFILE_B)
    profile["gpus"][0]["busy"]["temperature_gpu"] = 38  # as in that capture
    path = tmp_path / "b38.json"
    path.write_text(json.dumps(profile))
    pids = [procs.hold(1542, argv0="/opt/inferops/vllm/0.11.0-cu128-abcdefghijklmnopqrstuvwxyz/bin/python3.12"),
            procs.hold(2566, argv0="VLLM::EngineCore"),
            procs.hold(3590, argv0="python")]
    if pids != sorted(pids):
        pytest.skip("pid numbers wrapped around")
    view = procs.view(*pids)
    compare_b(sim, ["names_smi.out", "names_apps.out"], str(path), view, dict(zip((417, 418, 419), pids)))
    # memory.used is exact (sum + 20 MiB); memory.free of this capture had 1 MiB less slack
    used, free = read(os.path.join(H200B, "names_mem.out")).decode().strip().split(", ")
    got = query(sim, str(path), proc=view)[0]
    assert got[0] == int(used)
    assert abs(got[1] - int(free)) <= 1


# ------------------------------------------------------------------ accounting on the seed profile

SEED = profile_path("seed-8x-rtxpro6000")
SEED_GPUS = load_json(SEED)["gpus"]
SEED_TOTAL, SEED_RESERVED, SEED_IDLE = 97887, 542, 3


def test_seed_visible_devices_2_3_raise_only_gpus_2_and_3_real_proc(sim, procs):
    """A real process with CUDA_VISIBLE_DEVICES=2,3, found by scanning the real /proc.

    Other processes of the machine (containers included) are visible there too; if one of them
    changes the other GPUs between the two snapshots, the measurement is repeated (a simulator
    that put the memory on the wrong GPUs fails every attempt).
    """
    others = (0, 1, 4, 5, 6, 7)
    for _attempt in range(3):
        before = query(sim, SEED, real_proc=True)
        proc = procs.hold(4096, env={"CUDA_VISIBLE_DEVICES": "2,3"}, extra=["--all-visible"])
        after = query(sim, SEED, real_proc=True)
        mine = [row for row in apps(sim, SEED, real_proc=True) if row[1] == proc]
        procs.stop()
        if all(after[i] == before[i] for i in others):
            break
    rise = {i: after[i][0] - before[i][0] for i in range(8)}
    assert rise[2] >= 4096 and rise[3] >= 4096
    assert {i: r for i, r in rise.items() if i not in (2, 3)} == {i: 0 for i in others}
    assert [(gpu, mib) for gpu, _pid, _name, mib in mine] == [(2, 4096), (3, 4096)]


def test_seed_visible_devices_exact_numbers(sim, procs):
    pid = procs.hold(4096, env={"CUDA_VISIBLE_DEVICES": "2,3"}, extra=["--all-visible"])
    got = query(sim, SEED, proc=procs.view(pid))
    used = SEED_IDLE + 4096 + overhead(1)
    busy = (used, SEED_TOTAL - SEED_RESERVED - used + 2)
    idle = (SEED_IDLE, SEED_TOTAL - SEED_RESERVED - SEED_IDLE + 1)
    assert got == {i: busy if i in (2, 3) else idle for i in range(8)}


def test_holder_without_all_visible_uses_first_visible_gpu(sim, procs):
    pid = procs.hold(1000, env={"CUDA_VISIBLE_DEVICES": "6,2"})
    assert apps(sim, SEED, proc=procs.view(pid)) == [(6, pid, "python3", 1000)]


def test_process_name_option_of_holder(sim, procs):
    pid = procs.hold(10, env={"CUDA_VISIBLE_DEVICES": "1"}, extra=["--process-name", "/usr/bin/stray"])
    assert apps(sim, SEED, proc=procs.view(pid)) == [(1, pid, "/usr/bin/stray", 10)]


@pytest.mark.parametrize("env, expected", [
    ({"CUDA_VISIBLE_DEVICES": "0"}, 1),
    ({"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, 0),
    ({"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, 2),
    ({}, 1),
])
def test_device_order(sim, procs, tmp_path, env, expected):
    profile = load_json(SEED)
    profile["fastest_first_order"] = [1, 0, 3, 2, 4, 5, 6, 7]
    path = tmp_path / "ordered.json"
    path.write_text(json.dumps(profile))
    pid = procs.hold(100, env=env)
    assert [row[0] for row in apps(sim, str(path), proc=procs.view(pid))] == [expected]


FAKE_SERVER = r"""
import os, subprocess, sys, time
workers = int(os.environ.get("FAKE_WORKERS", "0"))
if os.environ.get("FAKE_FORK") and os.fork() == 0:
    time.sleep(120)
    os._exit(0)
for rank in range(workers):
    child = subprocess.Popen(["VLLM::Worker_TP%d" % rank, "-c", "import time; time.sleep(120)"],
                             executable=os.environ["FAKE_PY"])
    # Popen returns once exec began; the kernel sets the new argv a moment later (a loaded machine read the
    # parent's "python3" here): wait until /proc shows it
    for _ in range(500):
        with open("/proc/%d/cmdline" % child.pid, "rb") as fh:
            if fh.read().startswith(b"VLLM::Worker_TP"):
                break
        time.sleep(0.01)
    print(child.pid, flush=True)
print("ready", flush=True)
time.sleep(120)
"""


def fake_vllm(procs, args, env=None):
    """A process whose argv looks like a vLLM server: python3 -c CODE <args...>."""
    environ = dict(env or {}, FAKE_PY=PY)
    proc, lines = procs.start([PY, "-c", FAKE_SERVER] + list(args), argv0="python3", env=environ,
                              wait_ready=True)
    return proc.pid, [int(line) for line in lines]


def test_fake_vllm_api_server_counts_utilization_on_first_tp_gpus(sim, procs):
    pid, _workers = fake_vllm(
        procs, ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
                "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "2"],
        env={"CUDA_VISIBLE_DEVICES": "5,6,7", "FAKE_FORK": "1"})
    view = procs.view(pid)
    children = [int(p) for p in os.listdir(view) if int(p) != pid]
    assert children, "the forked child must be in the view"
    with open("/proc/%d/cmdline" % children[0], "rb") as handle:
        assert b"vllm.entrypoints.openai.api_server" in handle.read()  # looks like a server too
    share = int(math.floor(0.5 * SEED_TOTAL))
    assert apps(sim, SEED, proc=view) == [(5, pid, "python3", share), (6, pid, "python3", share)]
    got = query(sim, SEED, proc=view)
    assert got[5][0] == got[6][0] == SEED_IDLE + share + overhead(1)
    assert got[7][0] == got[4][0] == SEED_IDLE


def test_vllm_serve_shows_its_workers(sim, procs):
    pid, workers = fake_vllm(procs, ["vllm", "serve", "/m", "--gpu-memory-utilization=0.25", "-tp", "2"],
                             env={"FAKE_WORKERS": "2"})
    share = int(math.floor(0.25 * SEED_TOTAL))
    got = apps(sim, SEED, proc=procs.view(pid))
    assert got == [(0, workers[0], "VLLM::Worker_TP0", share), (1, workers[1], "VLLM::Worker_TP1", share)]


def test_vllm_module_serve_default_utilization_and_too_few_gpus(sim, procs):
    pid, _workers = fake_vllm(procs, ["-m", "vllm.entrypoints.cli.main", "serve", "/m", "-pp", "2"],
                              env={"CUDA_VISIBLE_DEVICES": "3"})
    assert apps(sim, SEED, proc=procs.view(pid)) == [(3, pid, "python3", int(math.floor(0.9 * SEED_TOTAL)))]


def test_vllm_with_empty_visible_devices_uses_no_gpu(sim, procs):
    pid, _workers = fake_vllm(procs, ["vllm", "serve", "/m"], env={"CUDA_VISIBLE_DEVICES": ""})
    assert apps(sim, SEED, proc=procs.view(pid)) == []


def test_visible_devices_by_uuid_and_uuid_prefix(sim, procs):
    env = {"CUDA_VISIBLE_DEVICES": "%s,%s" % (SEED_GPUS[6]["uuid"], SEED_GPUS[3]["uuid"][:12])}
    pid, _workers = fake_vllm(procs, ["vllm", "serve", "/m", "--tensor-parallel-size=2",
                                      "--gpu-memory-utilization", "0.3"], env=env)
    share = int(math.floor(0.3 * SEED_TOTAL))
    assert apps(sim, SEED, proc=procs.view(pid)) == [(3, pid, "python3", share), (6, pid, "python3", share)]


# ------------------------------------------------------------------ strays, -i, tables

def test_profile_and_runtime_strays(sim, tmp_path):
    profile = load_json(SEED)
    profile["stray"] = [{"gpu": 5, "used_mib": 20480, "pid": 4242, "process_name": "python3"}]
    path = tmp_path / "stray.json"
    path.write_text(json.dumps(profile))
    (sim.strays / "a.json").write_text(json.dumps(
        {"gpu": SEED_GPUS[1]["uuid"], "used_mib": 512, "pid": 77, "process_name": "/usr/bin/leak"}))
    (sim.strays / "b.json").write_text(json.dumps([{"gpu": 5, "used_mib": 100, "pid": 78}]))
    (sim.strays / "broken.json").write_text("{")
    assert apps(sim, str(path)) == [(1, 77, "/usr/bin/leak", 512), (5, 78, "python3", 100),
                                    (5, 4242, "python3", 20480)]
    got = query(sim, str(path))
    assert got[5][0] == SEED_IDLE + 20480 + 100 + overhead(2)
    assert got[1][0] == SEED_IDLE + 512 + overhead(1)
    assert got[0][0] == SEED_IDLE


def test_an_unlisted_stray_counts_in_memory_only(sim):
    """"listed": false: memory held by a process this nvidia-smi cannot see (another PID namespace)."""
    (sim.strays / "hidden.json").write_text(json.dumps({"gpu": SEED_GPUS[2]["uuid"], "used_mib": 2048,
                                                        "listed": False}))
    assert apps(sim, SEED) == []
    got = query(sim, SEED)
    assert got[2][0] == SEED_IDLE + 2048, "no process, so no context overhead either"
    assert got[1][0] == SEED_IDLE
    code, out = sim([], SEED)
    assert code == 0 and "No running processes found" in out.decode()


def test_id_selection_by_index_uuid_and_bus_id(sim, tmp_path):
    ids = "1,%s,0000:98:00.0,42" % SEED_GPUS[5]["uuid"]
    code, out = sim(["-i", ids, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], SEED)
    assert code == 0
    assert out.decode().splitlines() == ["1, 00000000:38:00.0", "4, 00000000:98:00.0",
                                         "5, 00000000:B8:00.0"]
    code, out = sim(["-i", "8"], SEED)
    assert (code, out) == (6, b"No devices were found\n")


def test_table_of_eight_gpus_with_processes(sim, procs):
    pid, _workers = fake_vllm(procs, ["vllm", "serve", "/m", "-tp", "4"], env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    code, out = sim([], SEED, proc=procs.view(pid), now="2026-12-02T09:05:01")
    text = out.decode()
    lines = text.splitlines()
    assert code == 0
    assert lines[0] == "Wed Dec  2 09:05:01 2026       "
    assert all(len(line) == 91 for line in lines[1:] if line)
    assert text.count("|   0  NVIDIA RTX PRO 6000 Blac...    On  |   00000000:16:00.0 Off |") == 1
    share = int(math.floor(0.9 * SEED_TOTAL))
    used = SEED_IDLE + share + overhead(1)
    assert text.count("%8dMiB /  97887MiB" % used) == 4
    assert text.count("       3MiB /  97887MiB") == 4
    rows = [line for line in lines if line.endswith("%dMiB |" % share)]
    assert rows == ["|%5d   N/A  N/A%16d      C   %-32s%14s |" % (g, pid, "python3", "%dMiB" % share)
                    for g in range(4)]
    code, out = sim(["-i", "5"], SEED, proc=procs.view(pid))
    assert "00000000:B8:00.0" in out.decode() and "00000000:16:00.0" not in out.decode()
    assert "No running processes found" in out.decode()


def test_topo_matrix_of_each_profile_follows_its_links():
    for name in ("seed-8x-rtxpro6000", "hgx-8x-h200", "demo-2numa", "h200-1gpu"):
        profile = load_json(profile_path(name))
        environ = dict(os.environ, GPUSIM_PROFILE=profile_path(name))
        out = subprocess.run([PY, SMI, "topo", "-m"], env=environ, stdout=subprocess.PIPE,
                             check=True).stdout.decode()
        rows = [line.split("\t") for line in out.splitlines() if line.startswith("GPU")]
        assert len(rows) == len(profile["gpus"])
        for i, row in enumerate(rows):
            gpu = profile["gpus"][i]
            links = row[1:1 + len(rows)]
            assert links == [" X " if j == i else profile["links"][i][j] for j in range(len(rows))]
            assert row[-4:] == [gpu["cpu_affinity"], str(gpu["numa_node"]), "", "N/A"]


# ------------------------------------------------------------------ profiles

def test_profiles_have_the_shapes_asked_for():
    seed = load_json(SEED)
    assert [g.get("memory_total_mib", seed["gpu_defaults"]["memory_total_mib"]) for g in seed["gpus"]] == [97887] * 8
    assert seed["gpu_defaults"]["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert [g["numa_node"] for g in seed["gpus"]] == [0] * 4 + [1] * 4
    for i in range(8):
        for j in range(8):
            if i != j:
                same_node = (i < 4) == (j < 4)
                expected = {"PIX", "NODE"} if same_node else {"SYS"}
                assert seed["links"][i][j] in expected
                assert seed["links"][i][j] == seed["links"][j][i]
    hgx = load_json(profile_path("hgx-8x-h200"))
    assert len(hgx["gpus"]) == 8 and hgx["gpu_defaults"]["memory_total_mib"] == 143771
    assert all(hgx["links"][i][j] == "NV18" for i in range(8) for j in range(8) if i != j)
    assert [g["numa_node"] for g in hgx["gpus"]] == [0] * 4 + [1] * 4
    demo = load_json(profile_path("demo-2numa"))
    assert [(g["numa_node"], g["cpu_affinity"]) for g in demo["gpus"]] == [(0, "0"), (0, "0"), (1, "1"), (1, "1")]
    assert demo["links"][0][1] == "PIX" and demo["links"][2][3] == "PIX" and demo["links"][1][2] == "SYS"
    uuids = [g["uuid"] for p in (seed, hgx, demo) for g in p["gpus"]]
    assert len(set(uuids)) == len(uuids)
    assert all(re.match(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", u) for u in uuids)


# ------------------------------------------------------------------ the environment of a pid

def load_sim_module():
    loader = importlib.machinery.SourceFileLoader("gpusim_nvidia_smi", SMI)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(name="mod")
def fixture_mod():
    return load_sim_module()


def fake_proc(root, pid, argv, ppid=1, environ=None, cgroup=None):
    """A /proc/<pid> entry; environ=None makes it unreadable (a directory, like EACCES)."""
    entry = root / str(pid)
    entry.mkdir(parents=True)
    (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (entry / "stat").write_text("%d (%s) S %d 1 1 0 -1" % (pid, os.path.basename(argv[0])[:15], ppid))
    if environ is None:
        (entry / "environ").mkdir()
    else:
        (entry / "environ").write_bytes(b"".join(("%s=%s" % kv).encode() + b"\0" for kv in environ.items()))
    if cgroup is not None:
        (entry / "cgroup").write_text(cgroup)


FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "%(log)s"
case "$*" in
  *vllm-chat.service*)
    echo 'Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID "VLLM_EXTRA=a b" CUDA_VISIBLE_DEVICES=4,5'
    echo 'EnvironmentFiles=%(envfile)s (ignore_errors=no)' ;;
  *vllm-code.service*)
    echo 'Environment=HF_HUB_OFFLINE=1'
    echo 'EnvironmentFiles=%(envfile)s (ignore_errors=yes)' ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture(name="fakehost")
def fixture_fakehost(tmp_path):
    """A fake proc root and a fake systemctl that logs its calls."""
    log = tmp_path / "systemctl.log"
    envfile = tmp_path / "code.env"
    envfile.write_text("# instance code\nCUDA_VISIBLE_DEVICES=6,7\nVLLM_API_KEY='x y'\n")
    script = tmp_path / "systemctl"
    script.write_text(FAKE_SYSTEMCTL % {"log": log, "envfile": envfile})
    script.chmod(0o755)
    root = tmp_path / "proc"
    root.mkdir()
    return {"root": root, "log": log, "systemctl": str(script)}


SERVER = ["/opt/inferops/vllm/current/bin/python3", "-m", "vllm.entrypoints.openai.api_server",
          "--gpu-memory-utilization", "0.4", "--tensor-parallel-size", "2"]


def test_environment_fallback_to_the_systemd_unit(sim, fakehost):
    root = fakehost["root"]
    fake_proc(root, 100, SERVER, cgroup="0::/system.slice/vllm-chat.service\n")
    fake_proc(root, 101, ["VLLM::EngineCore"], ppid=100, cgroup="0::/system.slice/vllm-chat.service\n")
    # cgroup v1 layout, environment from an EnvironmentFile= only
    fake_proc(root, 200, SERVER, cgroup="12:pids:/system.slice/vllm-code.service\n"
              "1:name=systemd:/system.slice/vllm-code.service\n")
    # readable environ: systemctl must not be asked
    fake_proc(root, 300, SERVER, environ={"CUDA_VISIBLE_DEVICES": "2"},
              cgroup="0::/system.slice/vllm-other.service\n")
    env = {"GPUSIM_SYSTEMCTL": fakehost["systemctl"]}
    code, out = sim(["--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader,nounits"],
                    SEED, proc=str(root), env=env)
    assert code == 0
    share = int(math.floor(0.4 * SEED_TOTAL))
    bus = {i: g["pci_bus_id"] for i, g in enumerate(SEED_GPUS)}
    assert out.decode().splitlines() == ["%d, %s, %d" % (pid, bus[gpu], share)
                                         for pid, gpu in ((300, 2), (101, 4), (101, 5), (200, 6), (200, 7))]
    calls = fakehost["log"].read_text().splitlines()
    assert sorted(calls) == sorted(["show -p Environment -p EnvironmentFiles vllm-chat.service",
                                    "show -p Environment -p EnvironmentFiles vllm-code.service"])


def test_environment_unknown_means_cuda_default(mod, fakehost, monkeypatch):
    root = fakehost["root"]
    fake_proc(root, 100, SERVER)  # unreadable environ, no cgroup file
    fake_proc(root, 101, SERVER, cgroup="0::/user.slice/session-1.scope\n")  # no unit
    monkeypatch.setenv("GPUSIM_PROC", str(root))
    monkeypatch.setenv("GPUSIM_SYSTEMCTL", fakehost["systemctl"])
    assert mod.environment_of(100) == (None, "unknown")
    assert mod.environment_of(101) == (None, "unknown")
    assert mod.visible_gpus(None, {"gpus": [{"index": i, "uuid": "GPU-%d" % i} for i in range(3)]}) == [0, 1, 2]


def test_environment_sources(mod, fakehost, monkeypatch):
    root = fakehost["root"]
    fake_proc(root, 100, SERVER, cgroup="0::/system.slice/vllm-chat.service\n")
    fake_proc(root, 200, SERVER, environ={"A": "1", "CUDA_VISIBLE_DEVICES": "0"})
    monkeypatch.setenv("GPUSIM_PROC", str(root))
    monkeypatch.setenv("GPUSIM_SYSTEMCTL", fakehost["systemctl"])
    env, source = mod.environment_of(100)
    assert source == "unit:vllm-chat.service"
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5" and env["VLLM_EXTRA"] == "a b"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert mod.environment_of(200) == ({"A": "1", "CUDA_VISIBLE_DEVICES": "0"}, "environ")


@pytest.mark.parametrize("text, expected", [
    ("", {}),
    ("A=1 B=2", {"A": "1", "B": "2"}),
    ('"X=a b" Y=c', {"X": "a b", "Y": "c"}),
    ("CUDA_VISIBLE_DEVICES=GPU-1,GPU-2", {"CUDA_VISIBLE_DEVICES": "GPU-1,GPU-2"}),
    ('"broken', {}),
])
def test_parse_systemd_environment(mod, text, expected):
    assert mod.parse_systemd_environment(text) == expected


@pytest.mark.parametrize("cgroup, unit", [
    ("0::/system.slice/vllm-chat.service\n", "vllm-chat.service"),
    ("1:name=systemd:/system.slice/a.service\n0::/\n", "a.service"),
    ("0::/system.slice/vllm-x.service/payload\n", "vllm-x.service"),
    ("0::/user.slice/user-0.slice/session-3.scope\n", None),
])
def test_unit_of_pid(mod, tmp_path, monkeypatch, cgroup, unit):
    fake_proc(tmp_path, 9, ["x"], environ={}, cgroup=cgroup)
    monkeypatch.setenv("GPUSIM_PROC", str(tmp_path))
    assert mod.unit_of_pid(9) == unit


FOUR = {"gpus": [{"index": i, "uuid": "GPU-%d%d%d-aaaa" % (i, i, i)} for i in range(4)],
        "fastest_first_order": [2, 3, 0, 1]}


@pytest.mark.parametrize("env, expected", [
    ({}, [2, 3, 0, 1]),
    ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0, 1, 2, 3]),
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ({"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [1, 0]),
    ({"CUDA_VISIBLE_DEVICES": "0"}, [2]),
    ({"CUDA_VISIBLE_DEVICES": "0,7,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [0]),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
    ({"CUDA_VISIBLE_DEVICES": "GPU-333-aaaa,GPU-1"}, [3, 1]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-"}, []),
])
def test_visible_gpus(mod, env, expected):
    assert mod.visible_gpus(env, FOUR) == expected


@pytest.mark.parametrize("argv, server", [
    (["/opt/v/bin/vllm", "serve", "m"], True),
    (["/opt/v/bin/python3", "/opt/v/bin/vllm", "serve", "m", "--port", "8000"], True),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
    (["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"], True),
    (["VLLM::EngineCore"], False),
    (["vllm", "bench", "serve"], False),
    (["python3", "-m", "pip", "install", "vllm"], False),
    (["/usr/bin/vllm-exporter", "serve"], False),
    (["python3", "/opt/v/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py"], True),
    (["sh", "-c", "python3 -m vllm.entrypoints.openai.api_server --model m"], False),
    (["pgrep", "-f", "vllm serve"], False),
    (["grep", "vllm.entrypoints.openai.api_server", "/var/log/x"], False),
])
def test_is_vllm_server(mod, argv, server):
    assert mod.is_vllm_server(argv) is server


def test_vllm_options(mod):
    argv = ["vllm", "serve", "m", "--gpu-memory-utilization=0.7", "-tp", "2", "--tensor-parallel-size", "4"]
    assert mod.option_value(argv, ["--gpu-memory-utilization"]) == "0.7"
    assert mod.option_value(argv, ["--tensor-parallel-size", "-tp"]) == "4"
    assert mod.option_value(argv, ["--pipeline-parallel-size", "-pp"]) is None


# ------------------------------------------------------------------ installation

def test_install_script(tmp_path):
    root = tmp_path / "root"
    done = subprocess.run(["sh", os.path.join(GPUSIM, "install.sh"), "demo-2numa", str(root)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    assert done.returncode == 0, done.stderr
    smi = root / "usr" / "bin" / "nvidia-smi"
    assert smi.read_text().startswith("#!/usr/bin/python3\n")
    assert os.access(str(smi), os.X_OK) and os.access(str(root / "usr/bin/gpusim-hold"), os.X_OK)
    assert load_json(str(root / "etc/gpusim/profile.json")) == load_json(profile_path("demo-2numa"))
    assert sorted(os.listdir(str(root / "etc/gpusim/profiles"))) == sorted(os.listdir(PROFILES))
    assert (root / "run/gpusim/stray.d").is_dir()
    environ = dict(os.environ, GPUSIM_PROFILE=str(root / "etc/gpusim/profile.json"))
    if os.access("/usr/bin/python3", os.X_OK):
        out = subprocess.run([str(smi), "-L"], env=environ, stdout=subprocess.PIPE, check=True).stdout
        assert out.decode().count("NVIDIA L4") == 4
    assert (root / "var/lib/gpusim/kern.log").read_text() == "" and (root / "var/lib/gpusim/nvswitch").is_dir()
    fault = tmp_path / "fault"
    done = subprocess.run(["sh", os.path.join(GPUSIM, "install.sh"), "fault-hgx-fm-mismatch", str(fault)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(str(fault / "var/lib/gpusim/nvswitch"))) == ["0", "1", "2", "3"]
    environ = dict(os.environ, GPUSIM_PROFILE=str(fault / "etc/gpusim/profile.json"))
    out = subprocess.run([PY, str(fault / "usr/bin/gpusim-host"), "fabricmanager", "--version"], env=environ,
                         stdout=subprocess.PIPE, check=True).stdout  # extends resolved via etc/gpusim/profiles/
    assert out == b"Fabric Manager version is : 580.95.05\n"
    bad = subprocess.run(["sh", os.path.join(GPUSIM, "install.sh"), "no-such", str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    assert bad.returncode == 2 and b"no such profile" in bad.stderr


def test_missing_profile_looks_like_a_missing_driver(sim, tmp_path):
    code, out = sim(["-L"], str(tmp_path / "none.json"))
    assert code == 9
    assert out.startswith(b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_holder_exits_on_sigterm_and_after_seconds(tmp_path):
    quick = subprocess.run([PY, HOLD, "--mib", "1", "--seconds", "0.1"], stdout=subprocess.PIPE,
                           timeout=10, check=False)
    assert (quick.returncode, quick.stdout) == (0, b"ready\n")
    proc = subprocess.Popen([PY, HOLD, "--mib", "1"], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    proc.stdout.close()
    started = time.monotonic()
    bad = subprocess.run([PY, HOLD, "--mib", "-5"], stderr=subprocess.PIPE, check=False)
    assert bad.returncode == 2 and time.monotonic() - started < 10


# --------------------------------------------------------------------------- the driver (issue 41: maintenance)

HOST = os.path.join(GPUSIM, "gpusim-host")
MODPROBE = os.path.join(GPUSIM, "gpusim-modprobe")


def test_a_driver_upgrade_breaks_nvml_until_the_modules_are_reloaded(sim, procs, tmp_path):
    """The package upgrade puts the new library on disk while the old modules run: nvidia-smi fails with NVML's
    version mismatch (exit 18); the modules cannot come out while a process holds a GPU (modprobe: in use), nor
    nvidia before the modules that need it; out in the right order, nvidia-smi cannot reach the driver (exit 9);
    loaded again, it reports the new version. A reboot (boot) does the same as the reload."""
    profile = profile_path("h200-1gpu")
    env = {"GPUSIM_DRIVER_DIR": str(tmp_path / "driver"), "GPUSIM_PROFILE": profile,
           "GPUSIM_STRAY_DIR": str(sim.strays)}

    def host(*args, proc=None):
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUSIM_")}
        environ.update(env)
        if proc:
            environ["GPUSIM_PROC"] = proc
        done = subprocess.run([PY, HOST] + list(args), env=environ, capture_output=True, text=True, timeout=30,
                              check=False)
        return done.returncode, done.stdout, done.stderr

    def version(proc=None):
        return sim(["--query-gpu=driver_version", "--format=csv,noheader"], profile, proc=proc, env=env)

    before = load_json(profile)["driver_version"]
    assert version() == (0, (before + "\n").encode())
    assert host("driver", "install", "580.200.01")[0] == 0
    code, out = version()
    assert (code, out.decode()) == (18, "Failed to initialize NVML: Driver/library version mismatch\n"
                                        "NVML library version: 580.200\n")
    holder = procs.hold(1024, env={"CUDA_VISIBLE_DEVICES": "0"})
    busy = procs.view(holder)
    assert host("modprobe", "-r", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", proc=busy)[::2] == (
        1, "modprobe: FATAL: Module nvidia_uvm is in use.\n")
    assert host("modprobe", "-r", "nvidia", proc=str(tmp_path))[::2] == (1, "modprobe: FATAL: Module nvidia is in use.\n")
    procs.stop()
    assert host("modprobe", "-r", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", proc=str(tmp_path))[0] == 0
    code, out = version(proc=str(tmp_path))
    assert code == 9 and out.startswith(b"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")
    assert json.loads(host("driver", "status")[1]) == {"installed": "580.200.01", "loaded": "", "modules": [],
                                                       "fabricmanager": "580.200.01", "boots": 0}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUSIM_")}
    environ.update(env)
    assert subprocess.run([MODPROBE, "nvidia_uvm"], env=environ, check=False, timeout=30).returncode == 0
    assert version(proc=str(tmp_path)) == (0, b"580.200.01\n")
    assert json.loads(host("driver", "status")[1])["modules"] == ["nvidia", "nvidia_uvm"]
    assert host("driver", "install", "580.210.02")[0] == 0 and version()[0] == 18
    boot_id = host("boot-id")[1]
    assert host("boot")[0] == 0 and version() == (0, b"580.210.02\n")
    assert host("boot-id")[1] != boot_id and host("boot-id")[1].startswith("gpusim-boot-"), "a boot changes the boot id"
    # a module brings what it needs, and what that needs: nvidia_drm alone loads nvidia_modeset and nvidia
    assert host("modprobe", "-r", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", proc=str(tmp_path))[0] == 0
    assert host("modprobe", "nvidia_drm")[0] == 0
    assert json.loads(host("driver", "status")[1])["modules"] == ["nvidia", "nvidia_modeset", "nvidia_drm"]
    assert version(proc=str(tmp_path)) == (0, b"580.210.02\n")
