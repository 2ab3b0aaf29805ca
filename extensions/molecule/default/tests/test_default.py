"""The simulated GPU node boots systemd and its nvidia-smi answers as its profile says."""
import json

PROFILE = "/etc/gpusim/profile.json"


def _profile(host):
    """The profile with gpu_defaults merged into each GPU, as the simulator reads it."""
    profile = json.loads(host.file(PROFILE).content_string)
    profile["gpus"] = [dict(profile.get("gpu_defaults", {}), **gpu) for gpu in profile["gpus"]]
    return profile


def test_systemd_is_pid_1_and_running(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state in ("running", "degraded"), state


def test_nvidia_smi_lists_profile_gpus(host):
    profile = _profile(host)
    out = host.check_output("nvidia-smi -L")
    lines = out.splitlines()
    assert len(lines) == len(profile["gpus"])
    for line, gpu in zip(lines, profile["gpus"]):
        assert gpu["uuid"] in line and gpu["name"] in line


def test_query_gpu_matches_profile_when_idle(host):
    profile = _profile(host)
    out = host.check_output(
        "nvidia-smi --query-gpu=index,uuid,memory.total,memory.used --format=csv,noheader,nounits"
    )
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines()]
    assert [r[1] for r in rows] == [g["uuid"] for g in profile["gpus"]]
    assert [int(r[2]) for r in rows] == [g["memory_total_mib"] for g in profile["gpus"]]
    assert all(int(r[3]) < 100 for r in rows), rows


def test_a_pinned_process_shows_up_on_its_gpus_only(host):
    unit = "gpusim-probe"
    host.run(f"systemctl stop {unit}.service")
    res = host.run(
        f"systemd-run --unit {unit} -p Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID "
        f"-p Environment=CUDA_VISIBLE_DEVICES=2,3 /usr/bin/gpusim-hold --mib 4096 --all-visible"
    )
    assert res.rc == 0, res.stderr
    try:
        out = host.check_output("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
        used = {int(i): int(m) for i, m in (line.split(",") for line in out.splitlines())}
        busy = sorted(i for i, m in used.items() if m >= 4096)
        assert busy == [2, 3], used
        apps = host.check_output("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader")
        assert len(apps.splitlines()) == 2, apps
    finally:
        host.run(f"systemctl stop {unit}.service")


def test_topology_reports_sys_across_numa_nodes(host):
    out = host.check_output("nvidia-smi topo -m")
    gpu0 = next(line for line in out.splitlines() if line.startswith("GPU0\t"))
    cells = gpu0.split("\t")
    assert cells[5].strip() == "SYS", cells
