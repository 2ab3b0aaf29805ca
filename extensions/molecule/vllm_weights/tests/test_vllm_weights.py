"""roles/vllm_weights in fan-out mode: host 1 fetched the gated tiny model from the loopback Hub,
host 2 copied it from host 1 through the role's temporary mirror, and host 3 from host 2, which relayed
it while its own copy arrived (a chain).

Checks what the hosts hold and what the Hub and the mirror served, not what the role's files say.
The later tests re-run converge.yml (unchanged, in check mode, after damaging a file, air-gapped
from a staged directory on the host and on the controller); they leave the hosts as converge did, but for
the last (a squatter on the mirror's port), which leaves hosts 2 and 3 without the snapshot.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import testinfra
import yaml

PROJECT = os.environ.get("MOLECULE_PROJECT_DIRECTORY", os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "..")))
SCENARIO = os.environ.get("MOLECULE_SCENARIO_DIRECTORY", os.path.dirname(os.path.dirname(__file__)))
INVENTORY = os.environ.get("MOLECULE_INVENTORY_FILE", "")
EPHEMERAL = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")
sys.path.insert(0, os.path.join(PROJECT, ".build"))

from ansible_collections.inferops.vllm.plugins.module_utils.hf_snapshot import (  # noqa: E402
    DEFAULT_ALLOW_PATTERNS,
    DEFAULT_IGNORE_PATTERNS,
    filter_paths,
)

with open(os.path.join(SCENARIO, "molecule.yml")) as _fh:
    VARS = yaml.safe_load(_fh)["provisioner"]["inventory"]["group_vars"]["all"]
with open(os.path.join(EPHEMERAL, "tiny-llama.sha")) as _fh:
    SHA = _fh.read().strip()
TOKEN = VARS["vllm_weights_hf_token"]
REPO = VARS["vllm_models"]["tiny"]["repo_id"]
SOURCE_DIR = os.path.join(EPHEMERAL, "tiny-llama")
MODELS = "/var/lib/inferops/models"
SNAPSHOT = f"{MODELS}/{REPO}/{SHA}"
H1, H2, H3 = "inferops-weights-1", "inferops-weights-2", "inferops-weights-3"
SHARD = "model-00002-of-00004.safetensors"


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _source_files():
    out = []
    for root, _dirs, names in os.walk(SOURCE_DIR):
        out += [os.path.relpath(os.path.join(root, n), SOURCE_DIR) for n in names]
    return sorted(filter_paths(out, DEFAULT_ALLOW_PATTERNS, DEFAULT_IGNORE_PATTERNS))


SELECTED = _source_files()
EXPECTED = {p: _sha256(os.path.join(SOURCE_DIR, p)) for p in SELECTED}
MODEL_BYTES = sum(os.path.getsize(os.path.join(SOURCE_DIR, p)) for p in SELECTED)


def node(name):
    return testinfra.get_host("podman://" + name)


def hub_stats():
    return json.loads(node("inferops-weights-hub").check_output("curl -sf http://127.0.0.1:8080/_admin/stats"))


def file_bodies(stats):
    return [r for r in stats["requests"] if r["method"] == "GET" and r["kind"] == "resolve"]


def digests(host, top=SNAPSHOT):
    out = host.check_output(f"cd {top} && sha256sum {' '.join(SELECTED)}")
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def mirror_gets(host):
    """GET lines the fan-out mirror logged on host (client address first)."""
    log = host.run("journalctl -u inferops-weights-mirror.service -o cat --no-pager").stdout
    return [ln for ln in log.splitlines() if '"GET /' in ln and "/resolve/" in ln]


def mirror_totals(host):
    """The counters each run of the host's fan-out mirror logged when it stopped, oldest first."""
    log = host.run("journalctl -u inferops-weights-mirror.service -o cat --no-pager").stdout
    return [json.loads(ln.split("stopped; ", 1)[1]) for ln in log.splitlines() if ln.startswith("hub_mirror: stopped; ")]


def address(name):
    return node(name).check_output("getent hosts %s | cut -d' ' -f1" % name).strip()


def converge(*args, **overrides):
    """Re-run converge.yml with extra CLI args and variables overridden.

    Returns (rc, output, seconds, facts): output is stdout and stderr together; facts maps each host to
    what the role registered (vllm_weights__prechecks, vllm_weights_report), saved by a second play that
    changes nothing.
    """
    with tempfile.TemporaryDirectory() as tmp:
        extra = os.path.join(tmp, "vars.json")
        with open(extra, "w") as fh:
            json.dump(overrides, fh)
        playbook = os.path.join(tmp, "run.yml")
        with open(playbook, "w") as fh:
            yaml.safe_dump([
                {"ansible.builtin.import_playbook": os.path.join(SCENARIO, "converge.yml")},
                {"name": "Save what the role registered", "hosts": "weights", "gather_facts": False, "tasks": [{
                    "name": "Save", "delegate_to": "localhost", "changed_when": False,
                    "ansible.builtin.copy": {
                        "dest": tmp + "/{{ inventory_hostname }}.facts.json",
                        "content": "{{ {'prechecks': vllm_weights__prechecks | default({}),"
                                   " 'report': vllm_weights_report | default([])} | to_json }}"}}]},
            ], fh)
        env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
        t0 = time.monotonic()
        proc = subprocess.run(["ansible-playbook", "-i", INVENTORY, playbook, "-e", "@" + extra, *args],
                              capture_output=True, text=True, timeout=600, env=env, check=False)
        seconds = time.monotonic() - t0
        facts = {}
        for name in os.listdir(tmp):
            if name.endswith(".facts.json"):
                with open(os.path.join(tmp, name)) as fh:
                    facts[name[:-len(".facts.json")]] = json.load(fh)
    return proc.returncode, proc.stdout + "\n" + proc.stderr, seconds, facts


def recap(output):
    """PLAY RECAP counters per host, summed over the plays."""
    out = {}
    for host, ok, changed, failed in re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)",
                                                output, re.M):
        c = out.setdefault(host, {"ok": 0, "changed": 0, "failed": 0})
        c["ok"] += int(ok)
        c["changed"] += int(changed)
        c["failed"] += int(failed)
    return out


def squeeze(text):
    return " ".join(text.split())


def corrupt_keep_size_and_mtime(host, path):
    host.check_output(
        "python3 -c \"import os,sys; p=sys.argv[1]; st=os.stat(p); f=open(p,'r+b'); f.seek(4096); b=f.read(1); "
        "f.seek(4096); f.write(bytes([b[0]^255])); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\" "
        + path)


# --------------------------------------------------------------------------- the converged hosts

@pytest.mark.parametrize("path", [MODELS, f"{MODELS}/{REPO.split('/')[0]}", f"{MODELS}/{REPO}", SNAPSHOT])
def test_layout_is_the_service_users(host, path):
    d = host.file(path)
    assert d.is_directory
    assert (d.user, d.group, d.mode) == ("vllm", "vllm", 0o750)


def test_current_link_points_at_the_commit(host):
    link = host.file(f"{MODELS}/{REPO}/current")
    assert link.is_symlink and link.user == "vllm"
    assert host.check_output(f"readlink {MODELS}/{REPO}/current") == SHA, "a relative link to the sha"
    # what vllm_service serves: <models_dir>/<org>/<name>/current, readable by the service user
    assert host.run(f"runuser -u vllm -- cat {MODELS}/{REPO}/current/config.json").rc == 0
    assert host.run(f"runuser -u nobody -- cat {MODELS}/{REPO}/current/config.json").rc != 0


def test_files_identical_to_the_published_model(host):
    listed = sorted(host.check_output(f"cd {SNAPSHOT} && find . -path ./.cache -prune -o -type f -print "
                                      f"| sed 's|^./||' | grep -v '^.inferops-verified.json$'").split())
    assert listed == SELECTED
    assert digests(host) == EXPECTED
    for p in SELECTED:
        f = host.file(f"{SNAPSHOT}/{p}")
        assert (f.user, f.group) == ("vllm", "vllm")


def test_manifest_is_for_this_commit(host):
    doc = json.loads(host.file(f"{SNAPSHOT}/.inferops-verified.json").content_string)
    assert (doc["repo_id"], doc["sha"]) == (REPO, SHA)
    assert sorted(doc["files"]) == SELECTED
    assert all(r["verified"] == "content" for r in doc["files"].values()), "verify: sha256 on both hosts"


def test_the_hub_served_the_model_once():
    stats = hub_stats()
    bodies = file_bodies(stats)
    assert sum(r["sent"] for r in bodies) == MODEL_BYTES, "Hub bytes = 1 x the model, for 2 hosts"
    assert sorted(r["path"] for r in bodies) == SELECTED
    assert sum(1 for r in stats["requests"] if r["kind"] == "tree") == 1
    assert all(r["auth"] for r in stats["requests"]), "the gated repository was read with the token"


def test_the_model_went_down_the_chain_and_host2_relayed_it_as_it_arrived():
    h1, h2, h3 = node(H1), node(H2), node(H3)
    gets1, gets2 = mirror_gets(h1), mirror_gets(h2)
    assert len(gets1) >= len(SELECTED) and len(gets2) >= len(SELECTED)
    assert all(ln.startswith(address(H2) + " ") for ln in gets1), "only host 2 copied from host 1"
    assert all(ln.startswith(address(H3) + " ") for ln in gets2), "only host 3 copied from host 2"
    assert mirror_gets(h3) == [], "host 3 served nobody"
    (first,), (relay,) = mirror_totals(h1), mirror_totals(h2)
    # host 1 sent the model once (host 2's copy), not once per host below it
    assert sum(first["clients"].values()) == MODEL_BYTES, first
    assert sum(relay["clients"].values()) == MODEL_BYTES, relay
    # host 2 sent bytes of files it had not finished receiving: the copies ran at the same time
    assert relay["relayed_bytes"] > 0 and relay["relay_waits"] > 0, relay


def test_mirror_is_stopped(host):
    assert host.run("systemctl is-active inferops-weights-mirror.service").stdout.strip() != "active"
    assert ":8973 " not in host.check_output("ss -ltnH")


def test_no_token_anywhere(host):
    assert not host.file("/run/inferops/weights/hf-token").exists
    found = host.run(f"grep -rlF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev '{TOKEN}' / ")
    assert found.stdout.strip() == "", found.stdout
    assert TOKEN not in host.check_output("ps -efww")
    assert TOKEN not in host.check_output("journalctl --no-pager -q")


# --------------------------------------------------------------------------- re-runs

def test_rerun_is_fast_unchanged_and_makes_no_request():
    before = hub_stats()
    rc, out, seconds, facts = converge("-v")
    assert rc == 0, out[-4000:]
    assert TOKEN not in out
    counts = recap(out)
    assert set(counts) == {H1, H2, H3} and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts
    checks = [res for host in (H1, H2, H3) for res in facts[host]["prechecks"]["results"]]
    assert len(checks) == 3, "one read-only check per host"
    for res in checks:
        assert res["would_download"]["files"] == 0 and res["hub_contacted"] is False, res
        assert res["tree_source"] == "manifest"
        # a bound, not a timing: the figure is printed for docs/weights.md; 10 s holds on a loaded 2-core machine
        assert res["seconds"] < 10, res["seconds"]
    assert hub_stats()["requests"] == before["requests"]
    # figures for docs/weights.md (an ignored path)
    out_dir = os.path.join(PROJECT, ".cache", "molecule-figures")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "vllm_weights.json"), "w") as fh:
        json.dump({"rerun_seconds": round(seconds, 1), "rerun_module_seconds": [r["seconds"] for r in checks],
                   "load": os.getloadavg()[0]}, fh)


def test_check_mode_reports_a_damaged_file_and_changes_nothing():
    h2 = node(H2)
    corrupt_keep_size_and_mtime(h2, f"{SNAPSHOT}/{SHARD}")
    damaged = digests(h2)[SHARD]
    assert damaged != EXPECTED[SHARD]
    served = len(mirror_gets(node(H1)))
    rc, out, _s, _d = converge("--check")
    assert rc == 0, out[-4000:]
    text = squeeze(out)
    assert re.search(r"1 files \([0-9.]+ MiB\) missing or damaged; would fetch from " + H1, text), text[-3000:]
    assert digests(h2)[SHARD] == damaged, "check mode repaired nothing"
    assert len(mirror_gets(node(H1))) == served, "check mode started no mirror"


def test_damaged_file_is_repaired_from_the_peer_only():
    h1, h2 = node(H1), node(H2)
    before, served = hub_stats(), len(mirror_gets(h1))
    rc, out, _s, _d = converge()
    assert rc == 0, out[-4000:]
    text = squeeze(out)
    assert digests(h2) == EXPECTED
    new = mirror_gets(h1)[served:]
    assert len(new) == 1 and f"/resolve/{SHA}/{SHARD}" in new[0], new
    assert hub_stats()["requests"] == before["requests"], "the Hub was not asked"
    # progress lines from the async job, then the result
    assert re.search(r"\(item=(downloading|done) " + re.escape(REPO) + r": [0-9.]+ [KM]iB / [0-9.]+ [KM]iB", text)
    assert "1 repaired; verification sha256 ok" in text


def test_a_host_that_drops_out_of_the_chain_does_not_strand_the_hosts_below_it():
    """Host 2 fails after the plan is made (its tools venv cannot be built: a huggingface_hub release that does
    not exist), so it is not in the play when the copies start; host 3, planned to copy from host 2, copies from
    host 1, the next host up its chain (vllm_weights_plan.peer[].via)."""
    h1, h3 = node(H1), node(H3)
    h3.check_output(f"rm -rf {SNAPSHOT} {MODELS}/{REPO}/current")
    with open(os.path.join(PROJECT, "roles", "vllm_weights", "defaults", "main.yml")) as fh:
        version = yaml.safe_load(fh)["vllm_weights_hf_version"]
    before, served = hub_stats(), len(mirror_gets(h1))
    rc, out, _s, _d = converge(
        vllm_weights_hf_version="{{ '9999.0.0' if inventory_hostname == '%s' else '%s' }}" % (H2, version))
    counts = recap(out)
    assert rc != 0 and counts[H2]["failed"] == 1, out[-4000:]
    assert counts[H1]["failed"] == 0 and counts[H3]["failed"] == 0, counts
    text = squeeze(out)
    assert f"{H2} from {H1}, {H3} from {H2} (a chain)" in text, "the plan was the chain"
    assert digests(h3) == EXPECTED
    new = mirror_gets(h1)[served:]
    assert len(new) >= len(SELECTED) and all(ln.startswith(address(H3) + " ") for ln in new), new
    assert hub_stats()["requests"] == before["requests"], "the Hub was not asked"


def test_air_gapped_from_directories_staged_on_the_controller_and_on_the_host(tmp_path):
    """Host 1 takes the snapshot from a directory on the controller, host 2 from one on its own disk;
    neither may reach the Hub (the endpoint is a closed port). Both verify what they get (sha256)."""
    h1, h2 = node(H1), node(H2)
    stage = tmp_path / "stage"
    os.makedirs(stage / REPO)
    subprocess.run(["podman", "cp", f"{H1}:{SNAPSHOT}", str(stage / REPO / SHA)], check=True)
    shutil.rmtree(stage / REPO / SHA / ".cache", ignore_errors=True)
    h2.check_output(f"rm -rf /srv/stage && mkdir -p /srv/stage/{REPO} && cp -a {SNAPSHOT} /srv/stage/{REPO}/")
    for h in (h1, h2):
        h.check_output(f"rm -rf {SNAPSHOT} {MODELS}/{REPO}/current")
    before = hub_stats()
    rc, out, _s, facts = converge(
        "--limit", f"{H1},{H2}",
        molecule_stage={H1: {"dir": str(stage), "on": "controller"}, H2: {"dir": "/srv/stage", "on": "host"}},
        vllm_weights_source_dir="{{ molecule_stage[inventory_hostname].dir }}",
        vllm_weights_source_dir_on="{{ molecule_stage[inventory_hostname].on }}",
        vllm_weights_fanout=False, vllm_weights_endpoint="http://127.0.0.1:9", vllm_weights_hf_token="")
    assert rc == 0, out[-4000:]
    for h in (h1, h2):
        assert digests(h) == EXPECTED
        assert h.check_output(f"readlink {MODELS}/{REPO}/current") == SHA
        doc = json.loads(h.file(f"{SNAPSHOT}/.inferops-verified.json").content_string)
        assert all(r["verified"] == "content" for r in doc["files"].values()), "verified again on arrival"
    assert hub_stats()["requests"] == before["requests"]
    assert facts[H1]["report"][0]["from"] == f"staged directory {stage} on the controller"
    assert facts[H2]["report"][0]["from"] == "staged directory /srv/stage"
    assert h2.run("systemctl is-active inferops-weights-staged.service").stdout.strip() != "active"
    h2.check_output("rm -rf /srv/stage")


SQUATTER = """
import hashlib, json, os, sys
snap = sys.argv[1]
data = json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "evil.Model"}}).encode()
open(os.path.join(snap, "config.json"), "wb").write(data)
with open(os.path.join(snap, ".inferops-verified.json")) as f:
    doc = json.load(f)
doc["tree"]["config.json"].update(size=len(data), oid=hashlib.sha1(b"blob %d\\0" % len(data) + data).hexdigest())
doc["files"]["config.json"]["size"] = len(data)
json.dump(doc, open(os.path.join(snap, ".inferops-verified.json"), "w"))
"""


def test_a_squatter_on_the_mirror_port_is_refused_by_every_copying_host():
    """A process of the service user takes host 1's mirror port before the run and serves a doctored listing and
    config.json in the mirror's own shape (hub_mirror.py over a doctored copy). Host 1's mirror cannot start and
    says so (a Type=notify unit: no READY from its own process); host 2,
    which copies from that address, refuses the listing (it is not the one host 1 verified); host 3, below host 2,
    gets nothing. Nothing is put in place. Last: it leaves hosts 2 and 3 without the snapshot (the scenario ends).
    test_a_host_that_drops_out_of_the_chain_does_not_strand_the_hosts_below_it shows a copy after a failed run."""
    h1, h2, h3 = node(H1), node(H2), node(H3)
    for h in (h2, h3):
        h.check_output(f"rm -rf {SNAPSHOT} {MODELS}/{REPO}/current")
    subprocess.run(["podman", "cp", os.path.join(PROJECT, "roles", "vllm_weights", "files", "hub_mirror.py"),
                    f"{H1}:/srv/squat-mirror.py"], check=True)
    h1.check_output(f"rm -rf /srv/squat && mkdir -p /srv/squat/{REPO} && cp -a {SNAPSHOT} /srv/squat/{REPO}/ "
                    f"&& python3 -c '{SQUATTER}' /srv/squat/{REPO}/{SHA} && chown -R vllm /srv/squat")
    h1.check_output(f"systemd-run --unit=molecule-squatter --property=User=vllm /usr/bin/python3 /srv/squat-mirror.py "
                    f"--root=/srv/squat --bind={address(H1)} --port=8973 --staged")
    try:
        h1.check_output(f"for i in $(seq 50); do curl -sf http://{address(H1)}:8973/_mirror/stats && exit 0; "
                        "sleep 0.2; done; exit 1")
        squatter_pid = h1.check_output("systemctl show -p MainPID --value molecule-squatter").strip()
        rc, out, _s, _f = converge(vllm_weights_fanout_stall_timeout=10, vllm_weights_retries=0)
        counts = recap(out)
        text = squeeze(out)
        assert rc != 0 and all(counts[h]["failed"] == 1 for h in (H1, H2, H3)), (counts, text[-4000:])
        assert (f"{H1}: the fan-out mirror did not start on {address(H1)}:8973: hub_mirror: cannot serve on "
                f"{address(H1)}:8973: [Errno 98] Address already in use") in text, text[-4000:]
        assert h1.check_output("systemctl show -p MainPID --value molecule-squatter").strip() == squatter_pid
        assert "is not the one its source verified" in text and "nothing was written" in text, text[-4000:]
        for h in (h2, h3):
            assert not h.file(SNAPSHOT).exists, h.check_output(f"ls -la {SNAPSHOT}")
            assert not h.file(f"{MODELS}/{REPO}/current").exists
    finally:
        h1.run("systemctl stop molecule-squatter; rm -rf /srv/squat /srv/squat-mirror.py")
