"""gpu_facts: data-driven cases (tests/unit/data/gpu_facts_cases.yml) through the module's main()."""
import copy
import json

import pytest

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi, plan_record
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS
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


HOST = {"systemd_version": 252, "kernel_numa_nodes": [0, 1], "online_cpus": "0-63", "free_kib": None}


@pytest.fixture(autouse=True)
def _host_part(request, monkeypatch):
    """The cases are nvidia-smi captures: the host part (systemctl, sysfs, statvfs) is tested on its own below."""
    if "host_resources" not in request.node.name:
        monkeypatch.setattr(gpu_facts, "host_resources", lambda _module, _path=None, _config=None: dict(HOST))


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
    assert set(facts) == {"gpus", "gpu_links", "gpu_driver", "gpu_processes", "host_resources"}
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
        assert facts == dict(_expand(case["facts"]), host_resources=HOST)
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


# systemctl --version on Debian 12 (captured)
SYSTEMCTL_VERSION = """systemd 252 (252.38-1~deb12u1)
+PAM +AUDIT +SELINUX +APPARMOR +IMA +SMACK +SECCOMP +GCRYPT -GNUTLS +OPENSSL +ACL +BLKID +CURL +ELFUTILS +FIDO2 +IDN2 \
-IDN +IPTC +KMOD +LIBCRYPTSETUP +LIBFDISK +PCRE2 -PWQUALITY +P11KIT +QRENCODE +TPM2 +BZIP2 +LZ4 +XZ +ZLIB +ZSTD -BPF_FRAMEWORK \
-XKBCOMMON +UTMP +SYSVINIT default-hierarchy=unified
"""


class _Host:
    """The AnsibleModule calls host_resources makes: systemctl found or not, and its answer."""

    def __init__(self, systemctl="/usr/bin/systemctl", answer=(0, SYSTEMCTL_VERSION, "")):
        self.systemctl, self.answer, self.calls = systemctl, answer, []

    def get_bin_path(self, name, required=False, opt_dirs=None):
        assert name == "systemctl"
        return self.systemctl

    def run_command(self, cmd, environ_update=None, **_kwargs):
        self.calls.append((list(cmd), dict(environ_update or {})))
        return self.answer


def _sysfs(monkeypatch, tmp_path, nodes, online):
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    for name in nodes:
        (node_dir / name).mkdir()
    (tmp_path / "online").write_text(online + "\n")
    monkeypatch.setattr(gpu_facts, "SYS_NODES", str(node_dir))
    monkeypatch.setattr(gpu_facts, "SYS_ONLINE", str(tmp_path / "online"))


def test_host_resources_reads_systemd_numa_nodes_online_cpus_and_free_space(monkeypatch, tmp_path):
    """The values the preflight's plan reads, from one call; the free space is df's Available column (KiB) of the
    nearest existing parent of a path not made yet."""
    import subprocess  # pylint: disable=import-outside-toplevel

    _sysfs(monkeypatch, tmp_path, ["node0", "node1", "node10", "possible", "power"], "0-63")
    host = _Host()
    models = tmp_path / "var" / "lib" / "models"

    def available():
        df = subprocess.run(["df", "-Pk", str(tmp_path)], capture_output=True, text=True, check=True).stdout
        return int(df.splitlines()[1].split()[3])

    # read df just before and just after: the same file system, but other work writes to it meanwhile (make test's
    # Molecule lane moved it by 16 MiB between two readings a moment apart)
    before = available()
    found = gpu_facts.host_resources(host, str(models), str(tmp_path / "no-config"))
    after = available()
    assert host.calls == [(["/usr/bin/systemctl", "--version"], {"LC_ALL": "C"})]
    free = found.pop("free_kib")
    assert min(before, after) - 1024 <= free <= max(before, after) + 1024, (before, free, after)
    assert found == {"systemd_version": 252, "kernel_numa_nodes": [0, 1, 10], "online_cpus": "0-63", "slots": {}}


def test_host_resources_says_unknown_never_guesses(monkeypatch, tmp_path):
    """No systemctl, no NUMA directory, no online file: 0, [], '' - and no free space without a path."""
    monkeypatch.setattr(gpu_facts, "SYS_NODES", str(tmp_path / "absent"))
    monkeypatch.setattr(gpu_facts, "SYS_ONLINE", str(tmp_path / "absent-online"))
    assert gpu_facts.host_resources(_Host(systemctl=None), None, str(tmp_path / "no-config")) == {
        "systemd_version": 0, "kernel_numa_nodes": [], "online_cpus": "", "free_kib": None, "slots": {}}
    failing = _Host(answer=(1, "", "Failed to connect to bus"))
    assert gpu_facts.host_resources(failing)["systemd_version"] == 0


def test_gpus_false_reads_the_host_only_host_resources(monkeypatch, tmp_path):
    """A CPU-only host: no nvidia-smi is looked for or run (the case has no response: any call would fail)."""
    _sysfs(monkeypatch, tmp_path, ["node0"], "0-1")
    runner = Runner(monkeypatch, tmp_path, {}, binary=None)
    monkeypatch.setattr(gpu_facts.AnsibleModule, "get_bin_path", lambda _self, name, required=False, opt_dirs=None: None)
    outcome, result = runner.run(gpu_facts.main, {"gpus": False, "free_space_of": str(tmp_path / "models"),
                                                  "config_dir": str(tmp_path / "config")})
    assert outcome == "exit", result
    assert runner.calls == [] and result["nvidia_smi_calls"] == []
    facts = result["ansible_facts"]
    assert list(facts) == ["host_resources"]
    assert facts["host_resources"]["kernel_numa_nodes"] == [0] and facts["host_resources"]["online_cpus"] == "0-1"
    assert isinstance(facts["host_resources"]["free_kib"], int) and facts["host_resources"]["free_kib"] > 0


SLOTS = {"base_port": 8000, "vllm_port_base": 20000, "vllm_port_stride": 100,
         "auto": {"chat": {"port": 8001, "vllm_port": 20100, "gpu_uuids": ["GPU-84ea54cb-4767-0e6a-8104-87422151c222"]}}}


@pytest.mark.parametrize("content, slots", [
    (json.dumps({"schema": 1, "instances": [], "slots": SLOTS}), SLOTS),
    (json.dumps({"schema": 1, "instances": []}), {}),  # recorded before plans had slots
    (json.dumps({"schema": 1, "slots": ["not", "a", "dict"]}), {}),
    (json.dumps([1, 2]), {}),
    ('{"slots": {"auto": ', {}),  # cut short: a record half written is no record
    (None, {}),  # no record: a host never configured
])
def test_host_resources_reads_the_recorded_plans_slots_or_nothing(monkeypatch, tmp_path, content, slots):
    """What the recorded plan gave its instances automatically comes back as the plan wrote it; a record that is
    missing, cut short or of another shape gives nothing (the next plan works every port out afresh), never an
    error."""
    monkeypatch.setattr(gpu_facts, "SYS_NODES", str(tmp_path / "absent"))
    config = tmp_path / "etc" / "inferops" / "vllm"
    config.mkdir(parents=True)
    if content is not None:
        (config / "plan.json").write_text(content)
    assert gpu_facts.host_resources(_Host(systemctl=None), None, str(config) + "/")["slots"] == slots


def test_the_recorded_plans_path_is_the_plans_own():
    """gpu_facts reads the file the service stage writes: the plan's paths.plan_file, from one function."""
    assert plan_record.plan_file(None) == PLAN_INPUTS["vllm_service_config_dir"][1] + "/plan.json"
    assert plan_record.plan_file("/srv/cfg/") == "/srv/cfg/plan.json"
