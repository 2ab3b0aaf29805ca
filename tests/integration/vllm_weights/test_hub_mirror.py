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
import urllib.error
import urllib.request

import pytest

from hf_snapshot_helpers import GOOD_TOKEN, base_params, run_inproc, sha256_of
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
