"""Pure helpers of plugins/module_utils/hf_snapshot.py: cases in tests/unit/data/hf_snapshot_cases.yml,
plus property tests against huggingface_hub's own pattern filter."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.module_utils import hf_snapshot as hs

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "hf_snapshot_cases.yml")
with open(DATA) as f:
    CASES = yaml.safe_load(f)


def ids(cases):
    return [c["id"] for c in cases]


# ------------------------------------------------------------------------------------------------
# Patterns
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES["patterns"], ids=ids(CASES["patterns"]))
def test_pattern_cases(case):
    allow = case["allow"] if "allow" in case else hs.DEFAULT_ALLOW_PATTERNS
    ignore = case["ignore"] if "ignore" in case else hs.DEFAULT_IGNORE_PATTERNS
    assert sorted(hs.filter_paths(case["paths"], allow, ignore)) == sorted(case["expected"])


def test_module_defaults_match_module_utils_defaults():
    from ansible_collections.inferops.vllm.plugins.modules import hf_snapshot as mod

    doc = yaml.safe_load(mod.DOCUMENTATION)["options"]
    assert doc["allow_patterns"]["default"] == hs.DEFAULT_ALLOW_PATTERNS
    assert doc["ignore_patterns"]["default"] == hs.DEFAULT_IGNORE_PATTERNS


SEGMENT = st.sampled_from(["a", "b", "model", "original", "x.json", "m-1.safetensors", "T.Model", ".hidden", "sub"])
PATHS = st.lists(st.lists(SEGMENT, min_size=1, max_size=4).map("/".join), max_size=12)
PATTERN = st.sampled_from(["*", "*.json", "*.safetensors", "original/*", "original/", "sub/", "a*", "*/b",
                           "m-?.safetensors", "[ab]", "*.Model", ".*", "x.json", "[!a]*"])


@settings(max_examples=300, deadline=None)
@given(PATHS, st.none() | st.lists(PATTERN, max_size=3), st.none() | st.lists(PATTERN, max_size=3))
def test_filter_paths_agrees_with_huggingface_hub(paths, allow, ignore):
    from huggingface_hub.utils import filter_repo_objects

    assert hs.filter_paths(paths, allow, ignore) == list(filter_repo_objects(paths, allow_patterns=allow,
                                                                             ignore_patterns=ignore))


@pytest.mark.parametrize("path", CASES["safe_paths"]["ok"])
def test_safe_relpath_accepts(path):
    assert hs.safe_relpath(path)


@pytest.mark.parametrize("path", CASES["safe_paths"]["bad"])
def test_safe_relpath_refuses(path):
    assert not hs.safe_relpath(path)


@pytest.mark.parametrize("rev,ok", [("a" * 40, True), ("0123456789abcdef0123456789abcdef01234567", True),
                                    ("A" * 40, False), ("a" * 39, False), ("main", False), ("v1.0", False),
                                    ("", False), (None, False)])
def test_is_commit_sha(rev, ok):
    assert hs.is_commit_sha(rev) is ok


# ------------------------------------------------------------------------------------------------
# Disk, retries
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES["disk"], ids=ids(CASES["disk"]))
def test_disk_check(case):
    assert hs.disk_check(case["free"], case["missing"], case["reclaimable"], case["margin"]) == (
        case["ok"], case["need"], case["available"])


def test_free_bytes_at_walks_up_to_an_existing_parent(tmp_path):
    st = os.statvfs(tmp_path)
    got = hs.free_bytes_at(str(tmp_path / "not" / "yet" / "there"))
    assert abs(got - st.f_bavail * st.f_frsize) < 64 << 20  # same filesystem, give or take other writers


def _exc(mro, status=None, err=None):
    """An exception whose class chain has the given names (no huggingface_hub import needed)."""
    base = OSError if "OSError" in mro or "FileNotFoundError" in mro else Exception
    cls = base
    for name in reversed(mro):
        if name in ("OSError", "Exception"):
            continue
        cls = type(name, (cls,), {})
    e = cls(getattr(errno, err), "boom") if err else cls("boom")
    if status is not None:
        e.response = SimpleNamespace(status_code=status)
    return e


@pytest.mark.parametrize("case", CASES["fatal"], ids=ids(CASES["fatal"]))
def test_is_fatal(case):
    assert hs.is_fatal(_exc(case["mro"], case.get("status"), case.get("errno"))) is case["fatal"]


def test_is_fatal_with_the_real_library_classes():
    from huggingface_hub import errors

    assert hs.is_fatal(errors.LocalEntryNotFoundError("offline")) is False
    for cls in (errors.RepositoryNotFoundError, errors.GatedRepoError, errors.RevisionNotFoundError,
                errors.RemoteEntryNotFoundError):
        assert hs.is_fatal(cls.__new__(cls)) is True, cls


def test_backoff_delays():
    assert hs.backoff_delays(0, 2) == []
    assert hs.backoff_delays(5, 2) == [2, 4, 8, 16, 32]
    assert hs.backoff_delays(8, 10) == [10, 20, 40, 60, 60, 60, 60, 60]


def test_call_with_retries_retries_transient_then_succeeds():
    slept, seen = [], []
    outcomes = [_exc(["HfHubHTTPError", "OSError"], 503), _exc(["ConnectError"]), "ok"]

    def fn():
        o = outcomes.pop(0)
        if isinstance(o, Exception):
            raise o
        return o

    assert hs.call_with_retries(fn, 5, 0.5, sleep=slept.append, on_retry=lambda e, a, d: seen.append(a)) == "ok"
    assert slept == [0.5, 1.0] and seen == [1, 2]


def test_call_with_retries_gives_up_after_retries():
    calls = []

    def fn():
        calls.append(1)
        raise _exc(["HfHubHTTPError", "OSError"], 500)

    with pytest.raises(OSError):
        hs.call_with_retries(fn, 3, 1, sleep=lambda s: None)
    assert len(calls) == 4


def test_call_with_retries_never_retries_fatal():
    calls = []

    def fn():
        calls.append(1)
        raise _exc(["GatedRepoError", "RepositoryNotFoundError", "HfHubHTTPError", "OSError"], 403)

    with pytest.raises(OSError):
        hs.call_with_retries(fn, 5, 1, sleep=lambda s: pytest.fail("slept"))
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------
# Trust, classification, manifest
# ------------------------------------------------------------------------------------------------

def _st(size=10, mtime=1, ctime=2, ino=3, dev=4):
    return SimpleNamespace(st_size=size, st_mtime_ns=mtime, st_ctime_ns=ctime, st_ino=ino, st_dev=dev)


def _rec(verified="content", **kw):
    return dict(hs.stat_key(_st(**kw)), verified=verified)


@pytest.mark.parametrize("st,rec,verify,trusted", [
    (_st(), _rec(), "sha256", True),
    (_st(), _rec(), "size", True),
    (_st(), _rec("size"), "size", True),
    (_st(), _rec("size"), "sha256", False),          # only size-checked before: hash now
    (_st(mtime=9), _rec(), "sha256", False),         # touched
    (_st(ctime=9), _rec(), "sha256", False),         # rewritten with size and mtime put back
    (_st(ino=9), _rec(), "sha256", False),           # replaced (rsync, cp)
    (_st(dev=9), _rec(), "sha256", False),           # another filesystem
    (_st(size=11), _rec(size=11), "size", False),    # the Hub says 10 bytes
    (_st(), None, "size", False),
    (None, _rec(), "size", False),
])
def test_is_trusted(st, rec, verify, trusted):
    assert hs.is_trusted(rec, st, {"size": 10}, verify) is trusted


def test_classify_sorts_files():
    tree = {n: {"size": 10, "oid": "o", "sha256": "s"} for n in "abcdef"}
    stats = {"a": _st(), "b": _st(ctime=5), "c": _st(size=3), "e": _st(), "f": _st()}
    records = {"a": _rec(), "b": _rec(), "e": _rec("size"), "f": _rec()}
    got = hs.classify(sorted(tree), tree, records, stats.get, "sha256")
    assert got == {"trusted": ["a", "f"], "to_hash": ["b", "e"], "bad": ["c"], "missing": ["d"], "present_ok": []}
    got = hs.classify(sorted(tree), tree, records, stats.get, "size")
    assert got == {"trusted": ["a", "e", "f"], "to_hash": [], "bad": ["c"], "missing": ["d"], "present_ok": ["b"]}
    got = hs.classify(sorted(tree), tree, records, stats.get, "sha256", reverify=True)
    assert got["trusted"] == [] and got["to_hash"] == ["a", "b", "e", "f"]
    got = hs.classify(sorted(tree), tree, records, stats.get, "size", reverify=True)
    assert got["trusted"] == [] and got["to_hash"] == [] and got["present_ok"] == ["a", "b", "e", "f"]


def test_manifest_roundtrip_and_rejections(tmp_path):
    tree = {"config.json": {"size": 2, "oid": "ab", "sha256": None}}
    doc = hs.build_manifest("acme/x", "a" * 40, tree, {"config.json": _rec()})
    hs.write_json_atomic(str(tmp_path / hs.MANIFEST_NAME), doc)
    assert hs.load_manifest(str(tmp_path), "acme/x") == doc
    assert hs.load_manifest(str(tmp_path), "acme/x", "a" * 40) == doc
    assert hs.load_manifest(str(tmp_path), "acme/x", "b" * 40) is None
    assert hs.load_manifest(str(tmp_path), "acme/other") is None
    (tmp_path / hs.MANIFEST_NAME).write_text(json.dumps(dict(doc, format=99)))
    assert hs.load_manifest(str(tmp_path), "acme/x") is None
    (tmp_path / hs.MANIFEST_NAME).write_text("{not json")
    assert hs.load_manifest(str(tmp_path), "acme/x") is None
    assert hs.load_manifest(str(tmp_path / "absent"), "acme/x") is None


def test_tree_from_entries_dicts_and_library_objects():
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    raw = [
        {"type": "directory", "oid": "d", "size": 0, "path": "sub"},
        {"type": "file", "oid": "o1", "size": 5, "path": "config.json"},
        {"type": "file", "oid": "o2", "size": 9, "path": "m.safetensors",
         "lfs": {"oid": "f" * 64, "size": 9, "pointerSize": 130}},
    ]
    want = {"config.json": {"size": 5, "oid": "o1", "sha256": None},
            "m.safetensors": {"size": 9, "oid": "o2", "sha256": "f" * 64}}
    assert hs.tree_from_entries(raw) == want
    objs = [RepoFolder(**raw[0]), RepoFile(**raw[1]), RepoFile(**raw[2])]
    assert hs.tree_from_entries(objs) == want


@pytest.mark.parametrize("case", CASES["index"], ids=ids(CASES["index"]))
def test_index_completeness(case):
    problems, shards = hs.index_completeness(case["indexes"], set(case["tree"]), case["selected"])
    assert len(shards) == case["shards"]
    assert len(problems) == len(case["problems"])
    for want, got in zip(case["problems"], problems):
        assert want in got


@pytest.mark.parametrize("case", CASES["token_files"], ids=ids(CASES["token_files"]))
def test_read_token_file(case, tmp_path):
    p = tmp_path / "t"
    p.write_text(case["text"])
    if "error" in case:
        with pytest.raises(hs.SnapshotError, match=case["error"]):
            hs.read_token_file(str(p))
    else:
        assert hs.read_token_file(str(p)) == case["token"]


# ------------------------------------------------------------------------------------------------
# Hashing, progress
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"hello\n", os.urandom(3 << 20 | 7)])
def test_hash_file_sha256_and_git_blob(tmp_path, data):
    p = tmp_path / "f"
    p.write_bytes(data)
    seen = []
    assert hs.hash_file(str(p), "sha256", seen.append) == hashlib.sha256(data).hexdigest()
    assert sum(seen) == len(data)
    git = subprocess.run(["git", "hash-object", str(p)], capture_output=True, text=True, check=False)
    expected = git.stdout.strip() if git.returncode == 0 else \
        hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert hs.hash_file(str(p), "git-sha1") == expected


def test_hash_many_uses_a_pool_and_returns_every_file(tmp_path):
    jobs = []
    for i in range(5):
        p = tmp_path / ("f%d" % i)
        p.write_bytes(bytes([i]) * (i * 1000 + 1))
        jobs.append((str(p), "sha256"))
    got = hs.hash_many(jobs, 3)
    assert got == {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p, _k in jobs}
    assert hs.hash_many([], 3) == {}


def test_progress_snapshot_and_file(tmp_path):
    path = tmp_path / "p" / "progress.json"
    pr = hs.Progress(str(path), "acme/x", incomplete_dir=str(tmp_path / "dl"))
    pr.bytes_total, pr.files_total = 4 << 20, 2
    pr.set_phase("downloading")
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "abc.etag.1234.incomplete").write_bytes(b"x" * (1 << 20))
    pr.add_done(2 << 20)
    doc = pr.snapshot()
    assert doc["bytes_done"] == 3 << 20 and doc["files_done"] == 1 and doc["phase"] == "downloading"
    assert "3.0 MiB / 4.0 MiB (75.0%)" in doc["summary"]
    pr.stop("done")
    assert json.loads(path.read_text())["phase"] == "done"


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 << 30, "3.0 GiB"),
                                    (215 * 10 ** 9, "200.2 GiB")])
def test_human_bytes(n, text):
    assert hs.human_bytes(n) == text
