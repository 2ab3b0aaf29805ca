"""inferops.vllm.hf_snapshot against a loopback Hub that real huggingface_hub 2.4.0 talks to.

Runs the module three ways: in-process (AnsibleModule test pattern), as a plain subprocess (for the
kill test) and through real `ansible localhost -m inferops.vllm.hf_snapshot`.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import signal
import subprocess
import time

import pytest

from hf_snapshot_helpers import (
    BULK_MIB,
    DENIED_TOKEN,
    GOOD_TOKEN,
    ansible_command,
    ansible_env,
    base_params,
    parse_ansible,
    run_ansible,
    run_inproc,
    sha256_of,
    start_subprocess,
)

MANIFEST = ".inferops-verified.json"
# What the default patterns must take from the published tiny repo (and nothing else).
EXPECTED_DEFAULT = sorted([
    "config.json", "generation_config.json", "model.safetensors.index.json", "special_tokens_map.json",
    "tokenizer.json", "tokenizer_config.json",
    "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
    "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors",
])


def model_files(dest):
    return sorted(p for p in os.listdir(dest) if not p.startswith(".") and os.path.isfile(os.path.join(dest, p)))


def partials(dest):
    return glob.glob(os.path.join(str(dest), ".cache", "huggingface", "download", "**", "*.incomplete"), recursive=True)


def same_as_source(dest, src, names):
    return all(sha256_of(os.path.join(str(dest), n)) == sha256_of(os.path.join(src, n)) for n in names)


def body_gets(hub):
    return [r for r in hub.stats.requests if r["method"] == "GET" and r["kind"] in ("resolve", "cdn")]


def corrupt_keep_size_and_mtime(path, offset=4096):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


# ------------------------------------------------------------------------------------------------
# Download, re-run, repair
# ------------------------------------------------------------------------------------------------

def test_first_download_then_rerun_is_offline_and_unchanged(hub, repos, tmp_path):
    dest = tmp_path / "m"
    res = run_inproc(base_params(hub, repos, dest, verify="sha256"))
    assert res["changed"] is True and not res.get("failed"), res
    assert model_files(dest) == EXPECTED_DEFAULT  # default patterns: no original/, no *.py, no README
    assert res["files"] == len(EXPECTED_DEFAULT) == res["downloaded_files"]
    assert res["total_bytes"] == res["bytes_downloaded"] == sum(
        os.path.getsize(os.path.join(repos.src_tiny, n)) for n in EXPECTED_DEFAULT)
    assert res["verification"]["result"] == "ok" and res["verification"]["content_checked"] == len(EXPECTED_DEFAULT)
    assert res["completeness"] == {"indexes": ["model.safetensors.index.json"], "shards": 4, "ok": True}
    assert res["sha"] == repos.sha["acme/tiny"] and res["resolved"] is False
    assert same_as_source(dest, repos.src_tiny, EXPECTED_DEFAULT)
    assert not partials(dest)
    assert len(body_gets(hub)) == len(EXPECTED_DEFAULT)

    hub.reset_stats()
    again = run_inproc(base_params(hub, repos, dest, verify="sha256"))
    assert again["changed"] is False, again
    assert again["tree_source"] == "manifest" and again["hub_contacted"] is False
    assert hub.stats.requests == []  # pinned sha + unchanged files: not a single request
    assert again["verification"]["trusted"] == len(EXPECTED_DEFAULT)
    assert again["verification"]["bytes_hashed"] == 0
    assert again["seconds"] < 2


def test_rerun_without_manifest_lists_but_fetches_no_body(hub, repos, tmp_path):
    dest = tmp_path / "m"
    run_inproc(base_params(hub, repos, dest))
    os.remove(dest / MANIFEST)  # e.g. files copied from elsewhere
    hub.reset_stats()
    res = run_inproc(base_params(hub, repos, dest))
    assert res["changed"] is False and res["tree_source"] == "hub", res
    assert hub.stats.count("GET", "tree") == 1
    assert body_gets(hub) == [] and hub.stats.count("HEAD") == 0
    assert (dest / MANIFEST).exists()


def test_corrupted_shard_with_same_size_and_mtime_is_found_by_sha256_and_repaired(hub, repos, tmp_path):
    from huggingface_hub import snapshot_download

    dest = tmp_path / "m"
    # through the library, so that its own bookkeeping (.metadata) is there for the control below
    run_inproc(base_params(hub, repos, dest, verify="sha256", range_connections=0))
    shard = "model-00002-of-00004.safetensors"
    corrupt_keep_size_and_mtime(str(dest / shard))

    # Control: the library alone trusts size+mtime and keeps the corrupt shard.
    snapshot_download("acme/tiny", revision=repos.sha["acme/tiny"], local_dir=str(dest), endpoint=hub.endpoint,
                      token=False, allow_patterns=[shard])
    assert sha256_of(str(dest / shard)) != sha256_of(os.path.join(repos.src_tiny, shard))

    hub.reset_stats()
    res = run_inproc(base_params(hub, repos, dest, verify="sha256"))
    assert res["changed"] is True and res["repaired"] == [shard], res
    assert res["downloaded"] == [shard]
    assert [m["path"] for m in res["verification"]["mismatches"]] == [shard]
    assert res["verification"]["mismatches"][0]["reason"] == "sha256"
    assert [r["path"] for r in body_gets(hub)] == [shard]
    assert same_as_source(dest, repos.src_tiny, EXPECTED_DEFAULT)


def test_reverify_finds_damage_the_stat_tuple_cannot_see(hub, repos, tmp_path):
    """Bit rot below the filesystem keeps the stat: simulated by re-recording the damaged file's stat."""
    dest = tmp_path / "m"
    run_inproc(base_params(hub, repos, dest, verify="sha256"))
    shard = "model-00001-of-00004.safetensors"
    corrupt_keep_size_and_mtime(str(dest / shard))
    doc = json.loads((dest / MANIFEST).read_text())
    st = os.stat(dest / shard)
    doc["files"][shard].update(mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino, dev=st.st_dev)
    (dest / MANIFEST).write_text(json.dumps(doc))

    res = run_inproc(base_params(hub, repos, dest, verify="sha256"))
    assert res["changed"] is False and res["verification"]["trusted"] == len(EXPECTED_DEFAULT), res  # the limit
    res = run_inproc(base_params(hub, repos, dest, verify="sha256", reverify=True))
    # every file hashed, plus the repaired one again after its download
    assert res["repaired"] == [shard] and res["verification"]["content_checked"] == len(EXPECTED_DEFAULT) + 1, res
    assert same_as_source(dest, repos.src_tiny, [shard])


def test_truncated_shard_is_found_by_size_check(hub, repos, tmp_path):
    dest = tmp_path / "m"
    run_inproc(base_params(hub, repos, dest))
    shard = dest / "model-00001-of-00004.safetensors"
    st = os.stat(shard)
    os.truncate(shard, st.st_size // 2)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    res = run_inproc(base_params(hub, repos, dest, verify="size"))
    assert res["changed"] is True and res["repaired"] == [shard.name], res
    assert res["verification"]["mismatches"][0]["reason"] == "size"
    assert os.path.getsize(shard) == st.st_size
    assert same_as_source(dest, repos.src_tiny, [shard.name])


def test_missing_shard_is_the_only_download(hub, repos, tmp_path):
    dest = tmp_path / "m"
    run_inproc(base_params(hub, repos, dest))
    os.remove(dest / "model-00003-of-00004.safetensors")
    hub.reset_stats()
    res = run_inproc(base_params(hub, repos, dest))
    assert res["changed"] is True and res["downloaded"] == ["model-00003-of-00004.safetensors"], res
    assert [r["path"] for r in body_gets(hub)] == ["model-00003-of-00004.safetensors"]
    assert hub.stats.count("GET", "tree") == 0  # the listing came from the manifest


def test_copied_snapshot_verifies_locally_without_the_hub(hub, repos, tmp_path):
    """Fan-out: a copy (new inodes) plus the manifest verifies with no Hub at all; damage is named."""
    src = tmp_path / "m"
    run_inproc(base_params(hub, repos, src, verify="sha256"))
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(src), str(copy)], check=True)
    subprocess.run(["rm", "-rf", str(copy / ".cache")], check=True)
    offline = dict(base_params(hub, repos, copy, verify="sha256"), endpoint="http://127.0.0.1:9")  # nothing there
    hub.reset_stats()
    res = run_inproc(offline)
    assert res["changed"] is False and res["hub_contacted"] is False, res
    assert res["verification"]["content_checked"] == len(EXPECTED_DEFAULT) and res["verification"]["trusted"] == 0
    assert hub.stats.requests == []

    # A damaged copy: only that file comes from the Hub (or mirror), the listing still does not.
    subprocess.run(["cp", "-a", str(src), str(tmp_path / "copy2")], check=True)
    copy2 = tmp_path / "copy2"
    corrupt_keep_size_and_mtime(str(copy2 / "tokenizer.json"), offset=100)
    res = run_inproc(base_params(hub, repos, copy2, verify="sha256"))
    assert res["repaired"] == ["tokenizer.json"] and res["verification"]["mismatches"][0]["reason"] == "git-sha1", res
    assert [r["path"] for r in body_gets(hub)] == ["tokenizer.json"] and hub.stats.count("GET", "tree") == 0


def test_bad_download_is_refetched_once_then_named(hub, repos, tmp_path, monkeypatch):
    """A file that is wrong after download (here: the mirror serves other bytes) fails by name."""
    from ansible_collections.inferops.vllm.plugins.module_utils import hf_snapshot as mu

    dest = tmp_path / "m"
    real = mu.Snapshot._download_file
    calls = []

    def download_then_damage(self, sha, rel):
        real(self, sha, rel)
        calls.append(rel)
        if rel == "model-00004-of-00004.safetensors":
            corrupt_keep_size_and_mtime(self._abs(rel))

    monkeypatch.setattr(mu.Snapshot, "_download_file", download_then_damage)
    res = run_inproc(base_params(hub, repos, dest, verify="sha256"))
    assert res.get("failed") and "model-00004-of-00004.safetensors" in res["msg"], res
    assert calls.count("model-00004-of-00004.safetensors") == 2
    assert not (dest / "model-00004-of-00004.safetensors").exists()
    assert not (dest / MANIFEST).exists()


# ------------------------------------------------------------------------------------------------
# Kill, resume, faults
# ------------------------------------------------------------------------------------------------

def test_killed_run_leaves_partials_that_the_rerun_removes(hub, repos, tmp_path):
    """The library's path (range_connections: 0): its partial files cannot resume, so they go."""
    dest = tmp_path / "m"
    bulk = "bulk-00001-of-00001.safetensors"
    hub.config.throttle_bps = 8 << 20  # the 16 MiB shard takes 2 s
    hub.config.fault_glob = "bulk-*"
    proc = start_subprocess(base_params(hub, repos, dest, repo="acme/bulk", verify="sha256", range_connections=0),
                            tmp_path)
    deadline = time.time() + 20
    while time.time() < deadline:
        sizes = []
        for part in partials(dest):
            try:  # the library may rename or remove a partial file between the listing and the stat
                sizes.append(os.path.getsize(part))
            except OSError:
                pass
        if sizes and max(sizes) >= 1 << 20:
            break
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("the throttled shard never started: %s" % (proc.communicate(),))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    left = partials(dest)
    assert left, "a killed download should leave a partial file (the scenario under test)"
    assert not (dest / bulk).exists()

    hub.config.throttle_bps = 0
    res = run_inproc(base_params(hub, repos, dest, repo="acme/bulk", verify="sha256", range_connections=0))
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    assert res["stale_removed"]["files"] >= 1 and res["stale_removed"]["bytes"] >= 1 << 20
    assert partials(dest) == []
    assert not glob.glob(str(dest / ".cache" / "huggingface" / "download" / "*.lock"))
    assert os.path.getsize(dest / bulk) == os.path.getsize(os.path.join(repos.src_bulk, bulk)) > BULK_MIB << 20
    assert same_as_source(dest, repos.src_bulk, [bulk, "model-00001-of-00004.safetensors"])


def test_dropped_connection_resumes_with_range(hub, repos, tmp_path):
    """The library's path (range_connections: 0) resumes a dropped connection itself."""
    from ansible_collections.inferops.vllm.plugins.module_utils.hf_snapshot import HTTP_CHUNK

    dest = tmp_path / "m"
    hub.config.fault_glob = "bulk-*"
    hub.config.die_after_bytes = 3 * HTTP_CHUNK + 1000  # the library writes, and resumes, whole chunks
    hub.config.die_times = 1
    res = run_inproc(base_params(hub, repos, dest, repo="acme/bulk", verify="sha256", range_connections=0))
    assert res["changed"] is True and not res.get("failed"), res
    assert hub.stats.dropped == 1
    ranged = [r for r in body_gets(hub) if r["path"].startswith("bulk-") and r["range"]]
    assert ranged and ranged[0]["status"] == 206 and ranged[0]["range"] == "bytes=%d-" % (3 * HTTP_CHUNK)
    assert same_as_source(dest, repos.src_bulk, ["bulk-00001-of-00001.safetensors"])


def test_transient_http_error_is_retried(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.fault_glob = "tokenizer.json"
    hub.config.error_status = 500
    hub.config.error_times = 1
    res = run_inproc(base_params(hub, repos, dest, retries=2))
    assert res["changed"] is True and not res.get("failed"), res
    assert [r["what"] for r in res["retries"]] == ["download tokenizer.json"]
    assert same_as_source(dest, repos.src_tiny, ["tokenizer.json"])


def test_lfs_redirect_to_cdn_drops_the_token(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.lfs_redirect = True
    res = run_inproc(base_params(hub, repos, dest, repo="acme/private", token=GOOD_TOKEN))
    assert res["changed"] is True and not res.get("failed"), res
    cdn = [r for r in hub.stats.requests if r["kind"] == "cdn"]
    assert len(cdn) == 4 and not any(r["auth"] for r in cdn)  # 4 shards via the "CDN", without auth
    assert all(r["auth"] for r in hub.stats.requests if r["kind"] in ("tree", "resolve"))


# ------------------------------------------------------------------------------------------------
# Refusals
# ------------------------------------------------------------------------------------------------

def test_not_enough_disk_fails_before_downloading(hub, repos, tmp_path, monkeypatch):
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                             capture_output=True, check=False).returncode == 0
    if not mounted:  # no privileges: pretend the filesystem is small
        from ansible_collections.inferops.vllm.plugins.module_utils import hf_snapshot as mu
        monkeypatch.setattr(mu, "free_bytes_at", lambda path: 3 << 20)
    try:
        dest = mnt / "m"
        res = run_inproc(base_params(hub, repos, dest, disk_margin_mib=1))
        assert res.get("failed"), res
        need = res["disk"]["need_bytes"]
        assert need == res["disk"]["missing_bytes"] + (1 << 20)
        assert str(need) in res["msg"] and str(res["disk"]["available_bytes"]) in res["msg"]
        assert body_gets(hub) == [] and hub.stats.count("HEAD") == 0
        assert not dest.exists(), "a directory the failed run created and wrote nothing into is removed"
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("repo,token,expect", [
    ("acme/gated", None, "gated"),
    ("acme/gated", DENIED_TOKEN, "gated"),
    ("acme/gated", "hf_someone_else_entirely_0000000000000", "rejected the token"),
    ("acme/private", None, "not found"),
    ("acme/nonexistent", None, "not found"),
])
def test_access_errors_fail_clearly_without_retries(hub, repos, tmp_path, repo, token, expect):
    dest = tmp_path / "m"
    p = base_params(hub, repos, dest, repo=repo, retries=3, retry_backoff=0.05)
    if token:
        p["token"] = token
    res = run_inproc(p)
    assert res.get("failed") and expect in res["msg"], res
    assert len(hub.stats.requests) == 1  # never retried
    assert not dest.exists(), "the failed run wrote nothing and left no directory"


def test_gated_repo_with_token_works(hub, repos, tmp_path):
    res = run_inproc(base_params(hub, repos, tmp_path / "m", repo="acme/gated", token=GOOD_TOKEN))
    assert res["changed"] is True and not res.get("failed"), res


def test_unknown_revision(hub, repos, tmp_path):
    res = run_inproc(base_params(hub, repos, tmp_path / "m", revision="1" * 40, retries=3))
    assert res.get("failed") and "revision %s not found" % ("1" * 40) in res["msg"], res
    assert len(hub.stats.requests) == 1


def test_unpinned_revision_is_refused_before_any_request(hub, repos, tmp_path):
    res = run_inproc(base_params(hub, repos, tmp_path / "m", revision="main"))
    assert res.get("failed") and "allow_unpinned" in res["msg"], res
    assert hub.stats.requests == [] and not (tmp_path / "m").exists()


@pytest.mark.parametrize("ref", ["main", "v1.0"])
def test_allow_unpinned_resolves_branch_and_tag(hub, repos, tmp_path, ref):
    res = run_inproc(base_params(hub, repos, tmp_path / "m", revision=ref, allow_unpinned=True))
    assert res["sha"] == repos.sha["acme/tiny"] and res["resolved"] is True and res["revision"] == ref, res
    assert hub.stats.count("GET", "revision") == 1


def test_index_naming_an_excluded_shard_fails(hub, repos, tmp_path):
    res = run_inproc(base_params(hub, repos, tmp_path / "m", ignore_patterns=["model-00002-*"]))
    assert res.get("failed") and "model-00002-of-00004.safetensors" in res["msg"] and "exclude" in res["msg"], res


def test_concurrent_run_waits_for_the_lock_then_fails(hub, repos, tmp_path):
    dest = tmp_path / "m"
    os.makedirs(dest / ".cache")
    with open(dest / ".cache" / "inferops-hf_snapshot.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("4242")
        f.flush()
        res = run_inproc(base_params(hub, repos, dest, lock_timeout=1))
    assert res.get("failed") and "4242" in res["msg"], res
    assert hub.stats.requests == []


# ------------------------------------------------------------------------------------------------
# Check mode, ownership
# ------------------------------------------------------------------------------------------------

def test_check_mode_reports_and_writes_nothing(hub, repos, tmp_path):
    dest = tmp_path / "m"
    res = run_inproc(base_params(hub, repos, dest), check_mode=True)
    assert res["changed"] is True and res["would_download"]["files"] == len(EXPECTED_DEFAULT), res
    assert res["would_download"]["bytes"] == res["total_bytes"]
    assert not dest.exists() and body_gets(hub) == []

    run_inproc(base_params(hub, repos, dest))
    os.remove(dest / "tokenizer.json")
    before = {p: os.stat(os.path.join(dest, p)).st_mtime_ns for p in model_files(dest)}
    res = run_inproc(base_params(hub, repos, dest), check_mode=True)
    assert res["would_download"]["paths"] == ["tokenizer.json"], res
    assert res["would_download"]["bytes"] == os.path.getsize(os.path.join(repos.src_tiny, "tokenizer.json"))
    assert {p: os.stat(os.path.join(dest, p)).st_mtime_ns for p in model_files(dest)} == before
    assert not (dest / "tokenizer.json").exists()


def test_owner_and_group_are_applied_and_idempotent(hub, repos, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    dest = tmp_path / "m"
    res = run_inproc(base_params(hub, repos, dest, owner="65534", group="65534"))
    assert res["changed"] is True, res
    for root, dirs, names in os.walk(dest):
        for n in [root] + [os.path.join(root, x) for x in dirs + names]:
            st = os.lstat(n)
            assert (st.st_uid, st.st_gid) == (65534, 65534), n
    again = run_inproc(base_params(hub, repos, dest, owner="65534", group="65534"))
    assert again["changed"] is False and again["tree_source"] == "manifest", again


# ------------------------------------------------------------------------------------------------
# Through real ansible
# ------------------------------------------------------------------------------------------------

def test_ansible_download_token_stays_secret_progress_is_written(hub, repos, tmp_path):
    """Real `ansible -m`, throttled so it runs a while: watch every process's argv and environment,
    the module's files and the progress file for the token; then a second run is unchanged."""
    dest = tmp_path / "m"
    progress = tmp_path / "progress.json"
    hub.config.throttle_bps = 2 << 20
    hub.config.fault_glob = "model-0000[12]-*"
    params = base_params(hub, repos, dest, repo="acme/private", token=GOOD_TOKEN, verify="sha256",
                         progress_file=str(progress))
    env = ansible_env(tmp_path)
    proc = subprocess.Popen(ansible_command(params, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    needle = GOOD_TOKEN.encode()
    leaks, phases = [], set()
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue  # pytest itself holds the token in memory (it is the test), not in argv/env
            for what in ("cmdline", "environ"):
                try:
                    with open("/proc/%s/%s" % (pid, what), "rb") as f:
                        if needle in f.read():
                            leaks.append((pid, what))
                except OSError:
                    pass
        if progress.exists():
            try:
                phases.add(json.loads(progress.read_text())["phase"])
            except ValueError:
                pass
        time.sleep(0.1)
    out, err = proc.communicate()
    res = parse_ansible(out)
    assert res["changed"] is True and not res.get("failed"), res
    assert leaks == []
    assert GOOD_TOKEN not in out and GOOD_TOKEN not in err
    for path, _dirs, names in os.walk(tmp_path):
        for n in names:
            p = os.path.join(path, n)
            if p.endswith("vars.json"):
                continue  # the controller-side secret source of this test
            with open(p, "rb") as f:
                assert needle not in f.read(), p
    assert "downloading" in phases
    final = json.loads(progress.read_text())
    assert final["phase"] == "done" and final["bytes_done"] == final["bytes_total"] > 0

    hub.reset_stats()
    res2, _proc = run_ansible(params, tmp_path)
    assert res2["changed"] is False and hub.stats.requests == [], res2


def test_ansible_wrong_token_and_check_mode(hub, repos, tmp_path):
    res, proc = run_ansible(base_params(hub, repos, tmp_path / "m", repo="acme/private",
                                        token="hf_wrong_token_value_00000000000000"), tmp_path)
    assert res.get("failed") and "rejected the token" in res["msg"], res
    assert "hf_wrong_token_value" not in proc.stdout + proc.stderr

    res, _proc = run_ansible(base_params(hub, repos, tmp_path / "c"), tmp_path, check_mode=True)
    assert res["changed"] is True and res["would_download"]["files"] == len(EXPECTED_DEFAULT), res
    assert not (tmp_path / "c").exists()


def test_ansible_names_interpreter_without_huggingface_hub(hub, repos, tmp_path):
    py = "/usr/bin/python3"
    probe = subprocess.run([py, "-c", "import huggingface_hub"], capture_output=True, check=False)
    if not os.path.exists(py) or probe.returncode == 0:
        pytest.skip("needs a python without huggingface_hub")
    res, _proc = run_ansible(base_params(hub, repos, tmp_path / "m"), tmp_path, interpreter=py)
    assert res.get("failed") and "huggingface_hub cannot be imported by %s" % py in res["msg"], res
    assert hub.stats.requests == []
