"""roles/vllm_weights/files/hub_mirror.py: a host's verified snapshots served to real huggingface_hub.

A snapshot is fetched from the loopback Hub with the hf_snapshot module into the role's layout,
then served by the mirror; a second host (another directory) fetches it through the module with
``endpoint`` = the mirror. The Hub must see no request for the second fetch, the mirror must send
the model's bytes once, and what the mirror refuses (changed files, files it never fetched, other
clients, other methods, paths outside the snapshot) must fail the module clearly.
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

from hf_snapshot_helpers import BULK_MIB, GOOD_TOKEN, base_params, run_inproc, sha256_of, start_subprocess
from hub_mirror import MirrorServer
from hub_mirror import main as mirror_main
from weights_progress import poll

MANIFEST = ".inferops-verified.json"


def model_files(dest):
    return sorted(p for p in os.listdir(dest) if not p.startswith("."))


@pytest.fixture
def source(hub, repos, tmp_path_factory):
    """The layout of a source host after fetching acme/gated (with a token) from the Hub."""
    models = tmp_path_factory.mktemp("source-models")
    sha = repos.sha["acme/gated"]
    dest = models / "acme" / "gated" / sha
    res = run_inproc(base_params(hub, repos, dest, repo="acme/gated", token=GOOD_TOKEN, verify="sha256"))
    assert not res.get("failed") and res["changed"], res
    return {"models": str(models), "dest": str(dest), "sha": sha, "result": res}


@pytest.fixture
def mirror(source):
    srv = MirrorServer(source["models"], "127.0.0.1", 0, quiet=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def url(srv, path):
    return "http://127.0.0.1:%d%s" % (srv.port, path)


def get(srv, path, method="GET", headers=None):
    req = urllib.request.Request(url(srv, path), method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def fetch_from_mirror(mirror, source, dest, **kw):
    params = {"repo_id": "acme/gated", "revision": source["sha"], "dest": str(dest),
              "endpoint": "http://127.0.0.1:%d" % mirror.port, "retries": 1, "retry_backoff": 0.05,
              "disk_margin_mib": 1}
    params.update(kw)
    return run_inproc(params)


def test_second_host_fetches_from_the_mirror_without_the_hub(hub, source, mirror, tmp_path):
    hub.reset_stats()
    dest = tmp_path / "host2" / "acme" / "gated" / source["sha"]
    res = fetch_from_mirror(mirror, source, dest, verify="sha256")
    assert not res.get("failed") and res["changed"], res
    assert hub.stats.requests == [], "the Hub saw a request during the fan-out"
    names = model_files(source["dest"])
    assert model_files(dest) == names
    assert all(sha256_of(os.path.join(dest, n)) == sha256_of(os.path.join(source["dest"], n)) for n in names)
    assert res["verification"]["result"] == "ok" and res["verification"]["content_checked"] == len(names)
    stats = mirror.stats.as_dict()
    assert stats["bytes_sent"] >= res["total_bytes"]
    assert stats["files_sent"] == res["files"]
    # body bytes are the model exactly once; the rest is the listing
    listing = get(mirror, "/api/models/acme/gated/tree/%s?recursive=true" % source["sha"])[2]
    assert stats["bytes_sent"] - res["total_bytes"] == len(listing)
    # the copy carries the same listing, so it is self-sufficient afterwards: no request at all
    again = fetch_from_mirror(mirror, source, dest, verify="sha256")
    assert again["changed"] is False and again["hub_contacted"] is False, again


def test_listing_matches_the_hub(hub, repos, source, mirror):
    path = "/api/models/acme/gated/tree/%s?recursive=true" % source["sha"]
    hub_req = urllib.request.Request(hub.endpoint + path, headers={"Authorization": "Bearer " + GOOD_TOKEN})
    with urllib.request.urlopen(hub_req, timeout=10) as r:
        at_hub = {e["path"]: e for e in json.load(r) if e["type"] == "file"}
    status, _h, body = get(mirror, path)
    assert status == 200
    at_mirror = {e["path"]: e for e in json.loads(body) if e["type"] == "file"}
    assert at_mirror.keys() == at_hub.keys()  # the whole repository, not only the fetched files
    for p, e in at_hub.items():
        assert at_mirror[p]["size"] == e["size"] and at_mirror[p]["oid"] == e["oid"]
        assert at_mirror[p].get("lfs") == e.get("lfs")


def test_file_headers_and_ranges(source, mirror):
    manifest = json.load(open(os.path.join(source["dest"], MANIFEST)))
    shard = "model-00001-of-00004.safetensors"
    meta = manifest["tree"][shard]
    status, headers, body = get(mirror, "/acme/gated/resolve/%s/%s" % (source["sha"], shard), method="HEAD")
    assert status == 200 and body == b""
    assert headers["X-Repo-Commit"] == source["sha"]
    assert headers["X-Linked-Etag"] == '"%s"' % meta["sha256"]
    assert int(headers["X-Linked-Size"]) == meta["size"] == int(headers["Content-Length"])
    status, headers, body = get(mirror, "/acme/gated/resolve/%s/%s" % (source["sha"], shard),
                                headers={"Range": "bytes=10-19"})
    assert status == 206 and headers["Content-Range"] == "bytes 10-19/%d" % meta["size"]
    with open(os.path.join(source["dest"], shard), "rb") as f:
        f.seek(10)
        assert body == f.read(10)
    status, headers, _b = get(mirror, "/acme/gated/resolve/%s/config.json" % source["sha"], method="HEAD")
    assert headers["ETag"] == '"%s"' % manifest["tree"]["config.json"]["oid"] and "X-Linked-Etag" not in headers


def test_a_file_changed_on_the_source_is_refused_and_the_target_fails_naming_it(source, mirror, tmp_path):
    shard = os.path.join(source["dest"], "model-00002-of-00004.safetensors")
    with open(shard, "r+b") as f:
        f.seek(100)
        f.write(b"\0")
    status, headers, _b = get(mirror, "/acme/gated/resolve/%s/model-00002-of-00004.safetensors" % source["sha"])
    assert status == 410 and "changed on the source" in headers["X-Error-Message"]
    res = fetch_from_mirror(mirror, source, tmp_path / "h2" / source["sha"])
    assert res.get("failed") and "model-00002-of-00004.safetensors" in res["msg"], res
    assert not os.path.exists(tmp_path / "h2" / source["sha"] / "model-00002-of-00004.safetensors")


def test_a_staged_copy_is_served_only_with_staged(source, tmp_path):
    """A snapshot copied elsewhere (air-gapped staging) keeps its manifest, not its inodes."""
    import shutil
    staged = tmp_path / "stage"
    shutil.copytree(os.path.join(source["models"], "acme"), staged / "acme")
    strict = MirrorServer(str(staged), "127.0.0.1", 0, quiet=True)
    threading.Thread(target=strict.serve_forever, daemon=True).start()
    try:
        status, headers, _b = get(strict, "/acme/gated/resolve/%s/config.json" % source["sha"])
        assert status == 410 and "changed on the source" in headers["X-Error-Message"]
    finally:
        strict.shutdown()
        strict.server_close()
    relaxed = MirrorServer(str(staged), "127.0.0.1", 0, quiet=True, staged=True)
    threading.Thread(target=relaxed.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "h2" / source["sha"]
        res = fetch_from_mirror(relaxed, source, dest, verify="sha256")
        assert not res.get("failed") and res["verification"]["result"] == "ok", res
        # a staged file of the wrong size is still refused
        shard = staged / "acme" / "gated" / source["sha"] / "model-00001-of-00004.safetensors"
        with open(shard, "ab") as f:
            f.write(b"x")
        status, _h, _b = get(relaxed, "/acme/gated/resolve/%s/model-00001-of-00004.safetensors" % source["sha"])
        assert status == 410
    finally:
        relaxed.shutdown()
        relaxed.server_close()


def test_files_the_source_did_not_fetch(source, mirror, tmp_path):
    # the default patterns skipped the repository's original/ and *.py files
    status, headers, _b = get(mirror, "/acme/gated/resolve/%s/modeling_tiny.py" % source["sha"])
    assert status == 404 and "allow_patterns" in headers["X-Error-Message"]
    res = fetch_from_mirror(mirror, source, tmp_path / "h2", allow_patterns=["*"], ignore_patterns=[])
    assert res.get("failed") and ("modeling_tiny.py" in res["msg"] or "original/" in res["msg"]), res


@pytest.mark.parametrize("path,status,code", [
    ("/api/models/acme/nope/tree/%s", 404, "RepoNotFound"),
    ("/api/models/acme/gated/tree/main", 404, "RevisionNotFound"),
    ("/api/models/acme/gated/tree/" + "0" * 40, 404, "RevisionNotFound"),
    ("/acme/gated/resolve/%s/..%%2F..%%2F..%%2Fetc%%2Fpasswd", 404, "EntryNotFound"),
    ("/acme/gated/resolve/%s/.inferops-verified.json", 404, "EntryNotFound"),
    ("/acme/gated/resolve/%s/.cache/inferops-hf_snapshot.lock", 404, "EntryNotFound"),
    ("/..%%2F..%%2Fetc/passwd/resolve/%s/x", 404, None),
    ("/acme/..%%2Fgated/resolve/%s/config.json", 404, None),
    ("/acme/.gated/resolve/%s/config.json", 404, "RepoNotFound"),
])
def test_refusals(source, mirror, path, status, code):
    full = path % source["sha"] if "%s" in path else path
    got, headers, _b = get(mirror, full)
    assert got == status and headers.get("X-Error-Code") == code, (got, headers)


def test_read_only_and_client_allowlist(source, mirror):
    req = urllib.request.Request(url(mirror, "/acme/gated/resolve/%s/config.json" % source["sha"]), data=b"x",
                                 method="PUT")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 405
    strict = MirrorServer(source["models"], "127.0.0.1", 0, allow=["10.0.0.0/8"], quiet=True)
    assert strict.allowed("10.1.2.3") and strict.allowed("127.0.0.1") and strict.allowed("::ffff:10.0.0.1")
    assert not strict.allowed("192.168.1.1") and not strict.allowed("junk")
    strict.server_close()


def test_cli_refuses_a_missing_root(tmp_path, capsys):
    assert mirror_main(["--root", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err


# ---------------------------------------------------------------------------- weights_progress.py

def write(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f)


def test_progress_poll_states(tmp_path):
    prog, job = str(tmp_path / "progress.json"), str(tmp_path / "job")
    write(job, {"started": True, "finished": False, "ansible_job_id": "1"})
    assert poll(prog, job) == {"finished": False, "job": "running", "phase": "starting",
                               "summary": "starting (running)", "bytes_done": None, "bytes_total": None,
                               "rate_bytes_per_s": None}
    write(prog, {"phase": "downloading", "summary": "downloading acme/x: 1.0 MiB / 2.0 MiB", "bytes_done": 1,
                 "bytes_total": 2, "rate_bytes_per_s": 3, "updated": os.stat(job).st_mtime + 5})
    out = poll(prog, job)
    assert out["finished"] is False and out["summary"].startswith("downloading acme/x") and out["bytes_done"] == 1
    write(job, {"changed": True, "sha": "x"})  # the module's result: the job is over
    assert poll(prog, job)["finished"] is True
    os.remove(job)
    assert poll(prog, job)["finished"] is True and poll(prog, job)["job"] == "job results file missing"


def test_progress_of_an_earlier_run_is_ignored(tmp_path):
    prog, job = str(tmp_path / "progress.json"), str(tmp_path / "job")
    write(prog, {"phase": "done", "summary": "done", "updated": 1000.0})
    write(job, {"started": True, "finished": False})
    out = poll(prog, job)
    assert out["phase"] == "starting" and out["finished"] is False


# ---- a squatter on the mirror's port: the copying host checks the listing against its source's digest ----

def squatter_root(source, tmp_path, doctor):
    """A copy of the source's models dir, doctored by ``doctor(snapshot_dir, manifest)``, for a staged mirror
    (a squatter serving whatever it likes in the mirror's shape)."""
    import shutil
    root = tmp_path / "squat"
    shutil.copytree(os.path.join(source["models"], "acme"), root / "acme")
    snap = root / "acme" / "gated" / source["sha"]
    with open(snap / MANIFEST) as fh:
        manifest = json.load(fh)
    doctor(snap, manifest)
    with open(snap / MANIFEST, "w") as fh:
        json.dump(manifest, fh)
    return start_mirror(root, staged=True)


def git_blob_sha1(data):
    import hashlib
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def doctor_listing(snap, manifest):
    """config.json rewritten with a matching listing entry: consistent in itself, not what the source verified."""
    data = json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "evil.Model"}}).encode()
    (snap / "config.json").write_bytes(data)
    manifest["tree"]["config.json"].update({"size": len(data), "oid": git_blob_sha1(data)})
    manifest["files"]["config.json"]["size"] = len(data)


def doctor_file(snap, _manifest):
    """A shard's bytes changed, its size kept: the listing is the true one."""
    shard = snap / "model-00001-of-00004.safetensors"
    with open(shard, "r+b") as fh:
        fh.seek(200)
        fh.write(b"\xff" * 8)


def test_a_doctored_listing_is_accepted_without_the_digest_and_refused_with_it(source, tmp_path):
    """Without expect_tree_digest a copying host trusts the mirror's listing (what the check is for); with the
    digest its source returned, it refuses before writing, and leaves no directory."""
    squat = squatter_root(source, tmp_path, doctor_listing)
    try:
        fooled = fetch_from_mirror(squat, source, tmp_path / "fooled" / source["sha"], verify="sha256")
        assert not fooled.get("failed"), fooled
        assert b"evil.Model" in (tmp_path / "fooled" / source["sha"] / "config.json").read_bytes()
        assert fooled["tree_digest"] != source["result"]["tree_digest"]

        dest = tmp_path / "h2" / source["sha"]
        sent = squat.stats.as_dict()["files_sent"]
        res = fetch_from_mirror(squat, source, dest, expect_tree_digest=source["result"]["tree_digest"])
        assert res.get("failed") and res["refused"] == "listing", res
        assert "is not the one its source verified" in res["msg"] and "nothing was written" in res["msg"], res["msg"]
        assert not dest.exists(), os.listdir(dest)
        assert squat.stats.as_dict()["files_sent"] == sent, "no file was asked for"
    finally:
        stop_mirror(squat)


def test_a_doctored_file_under_the_true_listing_is_refused_even_with_verify_size(source, tmp_path):
    squat = squatter_root(source, tmp_path, doctor_file)
    try:
        dest = tmp_path / "h2" / source["sha"]
        res = fetch_from_mirror(squat, source, dest, verify="size", expect_tree_digest=source["result"]["tree_digest"])
        assert res.get("failed") and "model-00001-of-00004.safetensors" in res["msg"], res
        assert not (dest / "model-00001-of-00004.safetensors").exists()
        assert not (dest / MANIFEST).exists()
    finally:
        stop_mirror(squat)


def test_the_true_listing_passes_the_digest_and_the_copy_is_hashed(source, mirror, tmp_path):
    dest = tmp_path / "h2" / source["sha"]
    res = fetch_from_mirror(mirror, source, dest, verify="size", expect_tree_digest=source["result"]["tree_digest"])
    assert not res.get("failed"), res
    assert res["tree_digest"] == source["result"]["tree_digest"]
    assert res["verification"]["mode"] == "sha256"
    doc = json.loads((dest / MANIFEST).read_text())
    assert all(r["verified"] == "content" for r in doc["files"].values())


def test_the_mirror_says_ready_only_once_it_holds_its_port_and_exits_when_a_squatter_has_it(source, tmp_path):
    """The role runs the mirror as a Type=notify unit: READY=1 on $NOTIFY_SOCKET after the bind (systemd-run then
    returns), never when the port is taken - also by a wildcard listener, though the mirror sets SO_REUSEADDR."""
    import socket
    import subprocess
    import sys as _sys
    notify = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sd, socket.socket() as probe:
        sd.bind(str(notify))
        sd.settimeout(20)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        script = os.path.join(os.path.dirname(os.path.abspath(__import__("hub_mirror").__file__)), "hub_mirror.py")
        env = dict(os.environ, NOTIFY_SOCKET=str(notify))
        mirror = subprocess.Popen([_sys.executable, script, "--root", source["models"], "--port", str(port), "--quiet"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert sd.recv(64) == b"READY=1"
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # it listens when it says so
        finally:
            mirror.terminate()
            mirror.wait(timeout=10)
        squatter = subprocess.Popen([_sys.executable, "-c", (
            "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('0.0.0.0', %d)); s.listen(); print('up', flush=True); time.sleep(60)") % port],
            stdout=subprocess.PIPE, text=True)
        try:
            assert squatter.stdout.readline().strip() == "up"
            sd.settimeout(0.5)
            late = subprocess.run([_sys.executable, script, "--root", source["models"], "--port", str(port)], env=env,
                                  capture_output=True, text=True, timeout=30, check=False)
            assert late.returncode == 2 and "cannot serve on 127.0.0.1:%d" % port in late.stderr, late.stderr
            assert "Address already in use" in late.stderr
            with pytest.raises(socket.timeout):
                sd.recv(64)
        finally:
            squatter.kill()
            squatter.wait()


# ---- relay: a fan-out tree's inner host serves what is still arriving -----------------------------------

BULK_FILE = "bulk-00001-of-00001.safetensors"


def start_mirror(root, **kw):
    srv = MirrorServer(str(root), "127.0.0.1", 0, quiet=True, **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def stop_mirror(srv):
    srv.shutdown()
    srv.server_close()


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert out.strip(), err
    return json.loads(out)


def test_a_relay_serves_a_snapshot_while_it_arrives(hub, repos, tmp_path):
    """root (verified, paced to 8 MiB/s) -> A (copying, relays) -> B: B copies from A while A's copy arrives.

    The root sends the model once; A relays most of the big file from its partial file; B ends with a snapshot
    verified by sha256 against the listing, and no host asked the Hub for anything after the root's fetch.
    """
    sha = repos.sha["acme/bulk"]
    root_models = tmp_path / "root"
    res = run_inproc(base_params(hub, repos, root_models / "acme" / "bulk" / sha, repo="acme/bulk", verify="sha256"))
    assert not res.get("failed"), res
    model_bytes = res["total_bytes"]
    hub.reset_stats()
    root = start_mirror(root_models, max_rate=8 << 20)
    a_models, b_models = tmp_path / "a", tmp_path / "b"
    a_models.mkdir()
    relay = start_mirror(a_models, relay=True, stall_timeout=20)
    try:
        common = {"repo_id": "acme/bulk", "revision": sha, "verify": "sha256", "retries": 2, "retry_backoff": 0.2,
                  "disk_margin_mib": 1, "range_chunk_mib": 1, "timeout": 30}
        (tmp_path / "pa").mkdir()
        (tmp_path / "pb").mkdir()
        b = start_subprocess(dict(common, dest=str(b_models / "acme" / "bulk" / sha),
                                  endpoint="http://127.0.0.1:%d" % relay.port), tmp_path / "pb")
        time.sleep(0.5)  # B asks first: the relay waits for A's listing
        a = start_subprocess(dict(common, dest=str(a_models / "acme" / "bulk" / sha),
                                  endpoint="http://127.0.0.1:%d" % root.port), tmp_path / "pa")
        res_a, res_b = finish(a), finish(b)
    finally:
        stop_mirror(root)
        stop_mirror(relay)
    assert not res_a.get("failed") and not res_b.get("failed"), (res_a, res_b)
    assert res_b["verification"]["result"] == "ok" and res_b["verification"]["mode"] == "sha256"
    assert hub.stats.requests == [], "a copying host asked the Hub"
    names = model_files(root_models / "acme" / "bulk" / sha)
    for host in (a_models, b_models):
        dest = host / "acme" / "bulk" / sha
        assert model_files(dest) == names
        assert sha256_of(dest / BULK_FILE) == sha256_of(root_models / "acme" / "bulk" / sha / BULK_FILE)
        assert not os.path.exists(dest / ".cache" / "inferops" / "listing.json")
        assert not os.listdir(dest / ".cache" / "inferops" / "partial") if os.path.isdir(
            dest / ".cache" / "inferops" / "partial") else True
    sent_root, sent_relay = root.stats.as_dict(), relay.stats.as_dict()
    # the root's clients: A only, one copy of the files (ranges may be retried, never the whole file twice)
    assert list(sent_root["clients"]) == ["127.0.0.1"]
    assert model_bytes <= sent_root["clients"]["127.0.0.1"] < model_bytes * 1.5
    assert sent_relay["clients"]["127.0.0.1"] >= model_bytes
    # streamed, not stored and forwarded: most of the big file left A before A had it whole
    assert sent_relay["relayed_bytes"] >= (BULK_MIB << 20) // 2, sent_relay
    assert sent_relay["relay_waits"] > 0, sent_relay


def test_a_relay_whose_upstream_never_starts_gives_up_after_its_stall_timeout(hub, repos, tmp_path):
    sha = repos.sha["acme/bulk"]
    (tmp_path / "a").mkdir()
    relay = start_mirror(tmp_path / "a", relay=True, stall_timeout=1)
    try:
        t0 = time.monotonic()
        status, headers, _body = get(relay, "/api/models/acme/bulk/revision/%s" % sha)
        waited = time.monotonic() - t0
    finally:
        stop_mirror(relay)
    assert status == 404 and headers.get("X-Error-Code") == "RepoNotFound"
    assert 1 <= waited < 10


def test_the_fill_sidecar_tells_the_relay_what_has_arrived(tmp_path):
    """range_fetch writes the sidecar after the bytes; hub_mirror.Fill reads it (one wire format)."""
    from ansible_collections.inferops.vllm.plugins.module_utils import range_fetch
    from hub_mirror import Fill

    part = str(tmp_path / "f.part")
    written = [4, 10, 0]
    fd = range_fetch._open_fill(part, 25, 10, written)
    try:
        fill = Fill(fd)
        assert fill.size == 25
        assert fill.available(0) == 4 and fill.available(4) == 0
        assert fill.available(10) == 10 and fill.available(15) == 5
        assert fill.available(20) == 0 and fill.available(25) == 0
        os.pwrite(fd, range_fetch.FILL_SLOT.pack(5), range_fetch.FILL_HEADER.size + 2 * range_fetch.FILL_SLOT.size)
        assert fill.available(20) == 5 and fill.available(22) == 3
    finally:
        os.close(fd)
    with open(part + ".fill", "r+b") as f:
        f.write(b"garbage!")
    with open(part + ".fill", "rb") as f:
        with pytest.raises(ValueError):
            Fill(f.fileno())


def test_the_relay_reads_the_files_hf_snapshot_writes_where_it_writes_them():
    """hub_mirror.py runs on the hosts without module_utils, so it names the paths and the format again."""
    import hub_mirror
    from ansible_collections.inferops.vllm.plugins.module_utils import hf_snapshot, range_fetch

    assert hub_mirror.MANIFEST_NAME == hf_snapshot.MANIFEST_NAME
    assert hub_mirror.LISTING_NAME == hf_snapshot.LISTING_NAME
    assert (hub_mirror.PARTIAL_DIR, hub_mirror.PARTIAL_SUFFIX) == (hf_snapshot.PARTIAL_DIR, hf_snapshot.PARTIAL_SUFFIX)
    assert hub_mirror.FILL_SUFFIX == range_fetch.FILL_SUFFIX and hub_mirror.FILL_MAGIC == range_fetch.FILL_MAGIC
    assert hub_mirror.FILL_HEADER.format == range_fetch.FILL_HEADER.format
    assert hub_mirror.FILL_SLOT.format == range_fetch.FILL_SLOT.format
