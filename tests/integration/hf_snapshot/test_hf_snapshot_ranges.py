"""hf_snapshot's parallel-range path (module_utils/range_fetch.py) against the loopback Hub.

The test Hub is given as ``endpoint`` and answers ``Range``, so the module fetches with parallel
ranges: hashed in the same pass, resumed per chunk after a kill, a dropped connection resumed at the
byte, a wrong range caught by the file's sha256 and the file fetched again, and the library's path
when the endpoint refuses ranges. Byte counts come from the server's own log.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from hf_snapshot_helpers import (
    BULK_MIB,
    GOOD_TOKEN,
    base_params,
    run_ansible,
    run_inproc,
    sha256_of,
    start_subprocess,
)

BULK = "bulk-00001-of-00001.safetensors"
MiB = 1 << 20


def ranged(hub, repos, dest, **kw):
    kw.setdefault("verify", "sha256")
    kw.setdefault("range_chunk_mib", 1)
    return base_params(hub, repos, dest, repo="acme/bulk", **kw)


def body_bytes(hub, path):
    return sum(r["sent"] for r in hub.stats.requests
               if r["method"] == "GET" and r["kind"] == "resolve" and r["path"] == path)


def gets(hub, path):
    return [r for r in hub.stats.requests if r["method"] == "GET" and r["kind"] == "resolve" and r["path"] == path]


def partial_dir(dest):
    return os.path.join(str(dest), ".cache", "inferops", "partial")


def test_ranged_fetch_is_one_pass_and_verified(hub, repos, tmp_path, monkeypatch):
    from ansible_collections.inferops.vllm.plugins.module_utils import hf_snapshot as mu

    def no_second_read(*_a, **_k):
        raise AssertionError("a fetched file was read again to hash it")

    monkeypatch.setattr(mu, "hash_file", no_second_read)
    dest = tmp_path / "m"
    res = run_inproc(ranged(hub, repos, dest, range_connections=4))
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    t = res["transfer"]
    assert t["method"] == "ranges" and t["files_ranged"] == res["downloaded_files"] == res["files"], t
    assert t["fallback"] is None and t["resumed_bytes"] == 0
    size = os.path.getsize(os.path.join(repos.src_bulk, BULK))
    assert size > BULK_MIB * MiB
    assert body_bytes(hub, BULK) == size  # one copy, no byte twice
    assert len(gets(hub, BULK)) == -(-size // MiB)  # one GET per 1 MiB chunk, each a Range
    assert all(r["status"] == 206 and r["range"] for r in gets(hub, BULK))
    assert res["verification"]["content_checked"] == res["files"]
    assert res["verification"]["bytes_hashed"] == res["total_bytes"]
    for name in os.listdir(repos.src_bulk):
        if os.path.exists(dest / name):
            assert sha256_of(str(dest / name)) == sha256_of(os.path.join(repos.src_bulk, name))
    assert not os.listdir(partial_dir(dest))  # nothing left behind
    again = run_inproc(ranged(hub, repos, dest))
    assert again["changed"] is False and again["hub_contacted"] is False


def test_killed_parallel_fetch_resumes_without_refetching_finished_ranges(hub, repos, tmp_path):
    from ansible_collections.inferops.vllm.plugins.module_utils.range_fetch import plan_chunks

    dest = tmp_path / "m"
    hub.config.fault_glob = "bulk-*"
    hub.config.throttle_bps = 2 * MiB  # per response: 2 connections x 2 MiB/s, about 4 s for the shard
    params = ranged(hub, repos, dest, range_connections=2, allow_patterns=[BULK])
    proc = start_subprocess(params, tmp_path)
    state = os.path.join(partial_dir(dest), BULK + ".part.json")
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with open(state) as f:
                if len(json.load(f)["done"]) >= 3:
                    break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("no range finished: %s" % (proc.communicate(),))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    with open(state) as f:
        done = set(json.load(f)["done"])
    size = os.path.getsize(os.path.join(repos.src_bulk, BULK))
    chunks = plan_chunks(size, MiB)
    assert 3 <= len(done) < len(chunks), "killed after some ranges, before the end"
    assert not (dest / BULK).exists()
    done_bytes = sum(end - start for i, start, end in chunks if i in done)

    hub.config.throttle_bps = 0
    quiet_since, seen = time.time(), -1  # let the server's answers to the killed process end
    while time.time() - quiet_since < 1.0:
        if len(hub.stats.requests) != seen:
            seen, quiet_since = len(hub.stats.requests), time.time()
        time.sleep(0.05)
    hub.reset_stats()
    res = run_inproc(params)
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    assert res["transfer"]["resumed_bytes"] == done_bytes
    assert res["stale_removed"]["files"] == 0  # the partial file was resumed, not thrown away
    assert body_bytes(hub, BULK) == size - done_bytes  # the finished ranges were not fetched again
    for r in gets(hub, BULK):
        start = int(r["range"].split("=")[1].split("-")[0])
        assert start // MiB not in done, r
    assert sha256_of(str(dest / BULK)) == sha256_of(os.path.join(repos.src_bulk, BULK))
    assert not os.listdir(partial_dir(dest))


def test_dropped_connection_resumes_the_range_at_the_byte(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.fault_glob = "bulk-*"
    hub.config.die_after_bytes = 300000
    hub.config.die_times = 1
    res = run_inproc(ranged(hub, repos, dest, range_connections=3, allow_patterns=[BULK]))
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    assert hub.stats.dropped == 1
    assert [r["what"] for r in res["retries"]] == ["download " + BULK]
    assert res["transfer"]["range_retries"] == 1
    size = os.path.getsize(os.path.join(repos.src_bulk, BULK))
    assert body_bytes(hub, BULK) == size  # the 300000 bytes before the drop were kept
    assert sha256_of(str(dest / BULK)) == sha256_of(os.path.join(repos.src_bulk, BULK))


def test_a_wrong_range_is_caught_and_the_file_fetched_again(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.fault_glob = "bulk-*"
    hub.config.corrupt_times = 1  # one range answer has a flipped byte, once
    res = run_inproc(ranged(hub, repos, dest, range_connections=4, allow_patterns=[BULK]))
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    mism = res["verification"]["mismatches"]
    assert [(m["path"], m["reason"], m["phase"], m["attempt"]) for m in mism] == [
        (BULK, "sha256", "after download", 1)], mism
    size = os.path.getsize(os.path.join(repos.src_bulk, BULK))
    # The Hub's listing has one sha256 per file: a mismatch cannot name the range, the file comes again.
    assert body_bytes(hub, BULK) == 2 * size
    assert sha256_of(str(dest / BULK)) == sha256_of(os.path.join(repos.src_bulk, BULK))


def test_a_wrong_range_twice_fails_naming_the_file_and_leaves_nothing(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.fault_glob = "bulk-*"
    hub.config.corrupt_times = 2
    # one range per attempt (32 MiB chunks), so both attempts get a wrong byte
    res = run_inproc(ranged(hub, repos, dest, allow_patterns=[BULK], range_chunk_mib=32))
    assert res.get("failed") and BULK in res["msg"], res
    assert not (dest / BULK).exists()
    assert not os.listdir(partial_dir(dest))


def test_endpoint_without_ranges_falls_back_to_the_library(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.ranges = False
    res = run_inproc(ranged(hub, repos, dest))
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    t = res["transfer"]
    assert t["method"] == "huggingface_hub" and t["files_ranged"] == 0, t
    assert "Accept-Ranges" in t["fallback"], t
    assert not any(r["range"] for r in gets(hub, BULK))
    assert sha256_of(str(dest / BULK)) == sha256_of(os.path.join(repos.src_bulk, BULK))


def test_redirecting_endpoint_goes_through_the_library_and_drops_the_token(hub, repos, tmp_path):
    dest = tmp_path / "m"
    hub.config.lfs_redirect = True
    res = run_inproc(base_params(hub, repos, dest, repo="acme/private", token=GOOD_TOKEN))
    assert res["changed"] is True and not res.get("failed"), res
    assert res["transfer"]["files_library"] >= 4 and "redirect" in res["transfer"]["fallback"]
    assert not any(r["auth"] for r in hub.stats.requests if r["kind"] == "cdn")


def test_ranged_fetch_sends_the_token_to_a_gated_endpoint(hub, repos, tmp_path):
    dest = tmp_path / "m"
    res = run_inproc(base_params(hub, repos, dest, repo="acme/gated", token=GOOD_TOKEN, verify="sha256"))
    assert res["transfer"]["method"] == "ranges", res
    assert all(r["auth"] for r in hub.stats.requests if r["kind"] == "resolve")


@pytest.mark.parametrize("endpoint, ranged_ok", [
    ("", False), (None, False), ("https://huggingface.co", False), ("https://hf.co/", False),
    ("https://eu.huggingface.co", False), ("http://10.0.0.5:8973", True), ("http://[fd00::1]:8973", True),
    ("https://mirror.example.org/hf", True), ("file:///srv/models", False),
])
def test_which_endpoints_are_fetched_in_ranges(endpoint, ranged_ok):
    from ansible_collections.inferops.vllm.plugins.module_utils.hf_snapshot import ranged_endpoint

    assert ranged_endpoint(endpoint) is ranged_ok


def test_range_connections_zero_is_the_library(hub, repos, tmp_path):
    res = run_inproc(ranged(hub, repos, tmp_path / "m", range_connections=0))
    assert res["transfer"]["method"] == "huggingface_hub" and res["transfer"]["fallback"] is None


def test_xet_settings_reach_the_module_process(hub, repos, tmp_path, monkeypatch):
    for k in ("HF_XET_HIGH_PERFORMANCE", "HF_XET_CHUNK_CACHE_SIZE_BYTES"):
        monkeypatch.delenv(k, raising=False)  # restored (removed) after the test
    xet = {"HF_XET_HIGH_PERFORMANCE": True, "HF_XET_CHUNK_CACHE_SIZE_BYTES": 0}
    res = run_inproc(base_params(hub, repos, tmp_path / "m", xet_environment=xet))
    assert res["transfer"]["xet_environment"] == {"HF_XET_HIGH_PERFORMANCE": "1", "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0"}
    assert os.environ["HF_XET_HIGH_PERFORMANCE"] == "1" and os.environ["HF_XET_CHUNK_CACHE_SIZE_BYTES"] == "0"
    bad = run_inproc(base_params(hub, repos, tmp_path / "n", xet_environment={"LD_PRELOAD": "/tmp/x.so"}))
    assert bad.get("failed") and "LD_PRELOAD is not an HF_XET_* variable" in bad["msg"], bad
    assert "LD_PRELOAD" not in os.environ or os.environ["LD_PRELOAD"] != "/tmp/x.so"


def test_xet_settings_through_ansible(hub, repos, tmp_path):
    """As the role passes them: a module option, set in the module's own process by the module."""
    params = base_params(hub, repos, tmp_path / "m", xet_environment={"HF_XET_HIGH_PERFORMANCE": "1"})
    res, proc = run_ansible(params, tmp_path)
    assert not res.get("failed"), proc.stdout[-2000:]
    assert res["transfer"]["xet_environment"] == {"HF_XET_HIGH_PERFORMANCE": "1"}
    assert res["transfer"]["method"] == "ranges"


def test_an_http_error_to_the_probe_goes_to_the_library_without_retries(hub, repos, tmp_path, monkeypatch):
    """A mirror that refuses HEAD (405) is not retried for a minute: the library takes the file at once."""
    from ansible_collections.inferops.vllm.plugins.module_utils import range_fetch as rf

    def refuse(url, *_a, **_k):
        raise rf.HTTPStatusError(405, "Method Not Allowed", url)

    monkeypatch.setattr(rf, "probe", refuse)
    t0 = time.time()
    res = run_inproc(ranged(hub, repos, tmp_path / "m", retry_backoff=5.0))
    assert res["changed"] is True and res["verification"]["result"] == "ok", res
    assert res["retries"] == [] and time.time() - t0 < 5.0
    assert res["transfer"]["method"] == "huggingface_hub" and "405" in res["transfer"]["fallback"], res["transfer"]


def test_progress_file_counts_every_connection(hub, repos, tmp_path):
    """The async progress file: bytes, rate and ETA of all parallel ranges together."""
    dest, progress = tmp_path / "m", tmp_path / "progress.json"
    hub.config.fault_glob = "bulk-*"
    hub.config.throttle_bps = 1 * MiB  # per response: 4 connections, about 4 MiB/s together
    params = ranged(hub, repos, dest, range_connections=4, allow_patterns=[BULK], progress_file=str(progress))
    proc = start_subprocess(params, tmp_path)
    samples = []
    while proc.poll() is None:
        try:
            with open(progress) as f:
                doc = json.load(f)
            if not samples or doc["updated"] != samples[-1]["updated"]:
                samples.append(doc)
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    out, err = proc.communicate()
    assert json.loads(out)["transfer"]["method"] == "ranges", (out, err)
    with open(progress) as f:
        samples.append(json.load(f))
    size = os.path.getsize(os.path.join(repos.src_bulk, BULK))
    moving = [s for s in samples if s["phase"] == "downloading" and 0 < s["bytes_done"] < size]
    assert moving, samples
    assert [s["bytes_done"] for s in moving] == sorted(s["bytes_done"] for s in moving)
    assert all(s["bytes_total"] == size for s in moving)
    rated = [s for s in moving if s["rate_bytes_per_s"] > 0]
    assert rated and all(s["eta_s"] is not None for s in rated), moving
    # more than one connection's worth (each answer is throttled to 1 MiB/s): every connection's bytes are
    # counted; not 4 MiB/s exactly, the machine may be busy with other tests (the lanes of make test)
    assert 1.5 * MiB < max(s["rate_bytes_per_s"] for s in rated) < 6 * MiB, rated
    assert samples[-1]["phase"] == "done" and samples[-1]["bytes_done"] == size
