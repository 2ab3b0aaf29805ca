# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""Fetch a pinned Hugging Face model snapshot into a directory, verified, resumable, disk-checked.

Target-side logic of the ``inferops.vllm.hf_snapshot`` module. Pure helpers (patterns, manifest,
disk math, retry classification, hashing) need the standard library only; ``huggingface_hub`` is
imported lazily by :func:`import_hf` so the helpers stay unit-testable and the module can name the
interpreter when the library is missing.

Design in brief (details in docs/weights.md):

* The Hub's tree listing at a commit is immutable. It is stored, with the local state of every
  verified file (size, mtime_ns, ctime_ns, inode), in ``<dest>/.inferops-verified.json``. A re-run
  for the same pinned sha whose files still carry the recorded stat makes no HTTP request at all.
  ``ctime`` cannot be set from user space, so a file rewritten in place with its old size and mtime
  put back is still noticed and re-verified.
* Files are downloaded in a thread pool, each verified right after its download (size; sha256 for
  LFS files and the git blob sha1 for the others with ``verify=sha256``), re-downloaded once on a
  mismatch, then reported by name. From an endpoint other than the Hub that serves byte ranges
  (the fan-out mirror), a file comes in parallel ranges hashed in the same pass and resumable per
  chunk (module_utils/range_fetch.py); otherwise, and from the Hub itself (Xet), with
  ``hf_hub_download`` (``local_dir`` mode).
"""
from __future__ import annotations

import errno
import fnmatch
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from ansible_collections.inferops.vllm.plugins.module_utils import range_fetch

MANIFEST_NAME = ".inferops-verified.json"
MANIFEST_FORMAT = 1
LOCK_NAME = os.path.join(".cache", "inferops-hf_snapshot.lock")
HF_DOWNLOAD_DIR = os.path.join(".cache", "huggingface", "download")
# Partial files of the parallel-range path (range_fetch), with their chunk state; kept across runs.
PARTIAL_DIR = os.path.join(".cache", "inferops", "partial")
PARTIAL_SUFFIX = ".part"
# The listing of a snapshot being fetched (the manifest's shape, no records): a fan-out mirror on this host
# relays the snapshot to the next host from it while the files arrive (files/hub_mirror.py --relay).
LISTING_NAME = os.path.join(".cache", "inferops", "listing.json")
DEFAULT_RANGE_CONNECTIONS = 4
DEFAULT_RANGE_CHUNK_MIB = 32
# Endpoints served through huggingface_hub (Xet) even when given explicitly.
HUB_HOSTS = ("huggingface.co", "hf.co")
XET_ENV_RE = re.compile(r"^HF_XET_[A-Z0-9_]+$")

# Weights (*.safetensors), configs (*.json: config, generation_config, index, tokenizer_config,
# preprocessor...), tokenizers (tokenizer.json / tokenizer.model / *.model sentencepiece files,
# *.tiktoken, vocab/merges *.txt) and chat templates (chat_template.jinja; chat_template.json is
# covered by *.json). Not *.bin/*.pth/*.pt (pickle duplicates of the safetensors), not *.py
# (remote code: opt in), not *.gguf/*.onnx (other runtimes).
DEFAULT_ALLOW_PATTERNS = ["*.safetensors", "*.json", "tokenizer*", "*.model", "*.tiktoken", "*.jinja", "*.txt"]
# original/: Meta's consolidated checkpoints next to the HF ones; consolidated*.safetensors:
# Mistral's native-format copy of the same weights. Both would double the download.
DEFAULT_IGNORE_PATTERNS = ["original/*", "consolidated*.safetensors"]

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
HASH_CHUNK = 1 << 20
# huggingface_hub's plain-HTTP download assembles 10 MiB chunks from 64 KiB reads before each write;
# 1 MiB chunks halve its CPU cost per byte (measured: 256 MiB in 0.52 s of CPU instead of 0.72-1.7 s),
# which is what bounds a download on few cores, and make partial files (progress, in-process
# resume) advance in 1 MiB steps. Only this process is affected.
HTTP_CHUNK = 1 << 20

# Errors that a retry cannot fix (class names, matched along the MRO so this module needs no
# huggingface_hub import). LocalEntryNotFoundError is the odd one: huggingface_hub raises it when
# the Hub could not be reached, so it is retried although it derives from EntryNotFoundError.
NEVER_RETRY = ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError",
               "RemoteEntryNotFoundError", "EntryNotFoundError", "DisabledRepoError",
               "SnapshotError", "PermissionError", "ValueError")
ALWAYS_RETRY = ("LocalEntryNotFoundError",)
NO_RETRY_HTTP = (400, 401, 403, 404, 410, 416)


class SnapshotError(Exception):
    """A failure to report with ``fail_json``: a message plus result fields."""

    def __init__(self, msg, **fields):
        super(SnapshotError, self).__init__(msg)
        self.msg = msg
        self.fields = fields


# --------------------------------------------------------------------------------------------
# Pure helpers
# --------------------------------------------------------------------------------------------

def is_commit_sha(revision):
    return bool(revision) and SHA_RE.match(revision) is not None


def _norm_pattern(p):
    p = p.replace("\\", "/")
    return p + "*" if p.endswith("/") else p


def filter_paths(paths, allow_patterns=None, ignore_patterns=None):
    """Select repo paths exactly like ``huggingface_hub.utils.filter_repo_objects``.

    fnmatch (case sensitive, ``*`` crosses ``/``), a trailing ``/`` means "everything below",
    ``None`` means no filter, an empty allow list selects nothing.
    """
    allow = None if allow_patterns is None else [_norm_pattern(p) for p in allow_patterns]
    ignore = None if ignore_patterns is None else [_norm_pattern(p) for p in ignore_patterns]
    out = []
    for path in paths:
        p = path.replace("\\", "/")
        if allow is not None and not any(fnmatch.fnmatchcase(p, a) for a in allow):
            continue
        if ignore is not None and any(fnmatch.fnmatchcase(p, i) for i in ignore):
            continue
        out.append(path)
    return out


def safe_relpath(path):
    """A repo path usable under dest: relative, no '..', not inside our bookkeeping dirs."""
    if not path or path.startswith("/") or "\\" in path:
        return False
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    return parts[0] != ".cache" and path != MANIFEST_NAME


def tree_from_entries(entries):
    """Normalise tree listing entries (dicts or RepoFile-like objects) to {path: {size, oid, sha256}}."""
    tree = {}
    for e in entries:
        if isinstance(e, dict):
            if e.get("type", "file") != "file":
                continue
            lfs = e.get("lfs") or None
            tree[e["path"]] = {
                "size": int(e["size"]),
                "oid": e.get("oid") or e.get("blob_id"),
                "sha256": (lfs.get("oid") or lfs.get("sha256")) if lfs else None,
            }
        else:
            if not hasattr(e, "blob_id"):  # RepoFolder
                continue
            lfs = getattr(e, "lfs", None)
            sha = None
            if lfs is not None:
                sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
            tree[e.path] = {"size": int(e.size), "oid": e.blob_id, "sha256": sha}
    return tree


def disk_check(free_bytes, missing_bytes, reclaimable_bytes, margin_bytes):
    """Return (ok, need, available): need = missing + margin, available = free + reclaimable.

    ``reclaimable`` counts what the run deletes before it downloads: stale partial files and local
    files that fail verification (they are replaced, not kept next to the new copy).
    """
    need = int(missing_bytes) + int(margin_bytes)
    available = int(free_bytes) + int(reclaimable_bytes)
    return (missing_bytes == 0 or available >= need), need, available


def free_bytes_at(path):
    """Free bytes for unprivileged users on the filesystem that holds ``path`` (or its nearest parent)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def human_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%.1f TiB" % n  # pragma: no cover


def auto_workers():
    """Default thread count for downloads and hashing: the CPUs, at most 8 (both are CPU-bound here)."""
    return max(1, min(8, os.cpu_count() or 1))


def is_fatal(exc):
    """True when retrying ``exc`` cannot help (missing/gated repo, unknown revision or file, auth, disk full)."""
    names = [c.__name__ for c in type(exc).__mro__]
    if any(n in ALWAYS_RETRY for n in names):
        return False
    if any(n in NEVER_RETRY for n in names):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        return True
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status in NO_RETRY_HTTP


def backoff_delays(retries, base, cap=60.0):
    """Delays before retry 1..retries: base, 2*base, 4*base ... capped."""
    return [min(cap, base * (2 ** i)) for i in range(max(0, retries))]


def call_with_retries(fn, retries, backoff, fatal=is_fatal, sleep=time.sleep, on_retry=None):
    """Call ``fn`` and retry it on transient errors with exponential backoff."""
    delays = backoff_delays(retries, backoff)
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below
            if fatal(e) or attempt >= len(delays):
                raise
            if on_retry is not None:
                on_retry(e, attempt + 1, delays[attempt])
            sleep(delays[attempt])
            attempt += 1


def stat_key(st):
    """What must stay the same for a verified file to stay trusted without re-reading it."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino, "dev": st.st_dev}


def content_kind(meta):
    """How a file's content is checked: 'sha256' (LFS) or 'git-sha1' (git blob id of a small file)."""
    return "sha256" if meta.get("sha256") else "git-sha1"


def is_trusted(record, st, meta, verify):
    """A manifest record still vouches for the file: same stat, same Hub size, strong enough check."""
    if not record or st is None:
        return False
    if stat_key(st) != {k: record.get(k) for k in ("size", "mtime_ns", "ctime_ns", "ino", "dev")}:
        return False
    if st.st_size != meta["size"]:
        return False
    if verify == "sha256":
        return record.get("verified") == "content"
    return record.get("verified") in ("size", "content")


def classify(selected, tree, records, stat_fn, verify, reverify=False):
    """Sort the selected files into trusted / to_hash / bad (wrong size) / missing.

    ``stat_fn(path)`` returns an ``os.stat_result`` or None when the file does not exist.
    """
    trusted, to_hash, bad, missing, present_ok = [], [], [], [], []
    for path in selected:
        meta = tree[path]
        st = stat_fn(path)
        if st is None:
            missing.append(path)
        elif st.st_size != meta["size"]:
            bad.append(path)
        elif not reverify and is_trusted(records.get(path), st, meta, verify):
            trusted.append(path)
        elif verify == "sha256":
            to_hash.append(path)
        else:
            present_ok.append(path)  # size matches; size mode asks no more
    return {"trusted": trusted, "to_hash": to_hash, "bad": bad, "missing": missing, "present_ok": present_ok}


def index_completeness(index_docs, tree, selected):
    """Check every shard named by the weight indexes against the repo tree and the selection.

    ``index_docs``: {index path: parsed JSON}. Returns (problems, shards) where problems is a list
    of messages and shards the set of shard paths named.
    """
    problems, shards = [], set()
    selected = set(selected)
    for index_path, doc in sorted(index_docs.items()):
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            problems.append("%s has no weight_map" % index_path)
            continue
        base = index_path.rsplit("/", 1)[0] + "/" if "/" in index_path else ""
        for shard in sorted(set(weight_map.values())):
            path = base + shard
            shards.add(path)
            if path not in tree:
                problems.append("%s names %s, which the repository does not contain" % (index_path, path))
            elif path not in selected:
                problems.append("%s names %s, which allow_patterns/ignore_patterns exclude" % (index_path, path))
    return problems, shards


def read_token_file(path):
    """A token from a file: a bare token, or an env file with HF_TOKEN= / HUGGING_FACE_HUB_TOKEN=."""
    with open(path, "r") as f:
        text = f.read()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    for ln in lines:
        m = re.match(r"^(?:export\s+)?(HF_TOKEN|HUGGING_FACE_HUB_TOKEN)\s*=\s*(.*)$", ln)
        if m:
            return m.group(2).strip().strip("'\"")
    if len(lines) == 1 and "=" not in lines[0]:
        return lines[0]
    raise SnapshotError("token_file %s holds neither a bare token nor an HF_TOKEN= line" % path)


def xet_environment(settings):
    """Validated {HF_XET_*: str} from the ``xet_environment`` option (hf_xet reads them at start)."""
    out = {}
    for key, value in sorted((settings or {}).items()):
        if not XET_ENV_RE.match(str(key)):
            raise SnapshotError("xet_environment: %s is not an HF_XET_* variable" % key)
        if isinstance(value, bool):
            value = "1" if value else "0"
        out[str(key)] = str(value)
    return out


def ranged_endpoint(endpoint):
    """True when ``endpoint`` may be fetched with parallel ranges: given, http(s), not the Hub itself."""
    if not endpoint:
        return False
    from urllib.parse import urlsplit
    parts = urlsplit(endpoint)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        return False
    return not any(host == h or host.endswith("." + h) for h in HUB_HOSTS)


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------

def load_manifest(dest, repo_id, sha=None):
    """The manifest for repo_id (and sha when given), or None if absent/foreign/unreadable."""
    try:
        with open(os.path.join(dest, MANIFEST_NAME), "r") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or doc.get("repo_id") != repo_id:
        return None
    if sha is not None and doc.get("sha") != sha:
        return None
    if not isinstance(doc.get("tree"), dict) or not isinstance(doc.get("files"), dict):
        return None
    return doc


def tree_digest(tree, paths):
    """sha256 of the listing of ``paths`` (size, git oid, LFS sha256 of each), in a canonical JSON form.

    The fan-out hands the digest the tree's root got (from the Hub, or its own verified manifest) to the
    hosts that copy from a mirror, so they refuse a listing that differs from it (O(expect_tree_digest)).
    """
    doc = [[p, int(tree[p]["size"]), tree[p].get("oid"), tree[p].get("sha256")] for p in sorted(paths)]
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode("utf-8")).hexdigest()


def build_manifest(repo_id, sha, tree, records):
    return {"format": MANIFEST_FORMAT, "tool": "inferops.vllm.hf_snapshot", "repo_id": repo_id, "sha": sha,
            "tree": tree, "files": records}


def write_json_atomic(path, doc, mode=0o644):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------------------------

def hash_file(path, kind, on_bytes=None, chunk=HASH_CHUNK):
    """sha256 of the content, or the git blob sha1 ('blob <size>\\0' + content). 1 MiB reads."""
    if kind == "git-sha1":
        h = hashlib.sha1(b"blob %d\0" % os.path.getsize(path))
    else:
        h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])  # releases the GIL: threads hash in parallel
            if on_bytes is not None:
                on_bytes(n)
    return h.hexdigest()


def expected_digest(meta):
    return meta["sha256"] if meta.get("sha256") else meta["oid"]


def hash_many(jobs, workers, on_bytes=None):
    """Hash [(path, kind)] in a thread pool, largest first. Returns {path: hexdigest}."""
    jobs = sorted(jobs, key=lambda j: -os.path.getsize(j[0]))
    if not jobs:
        return {}
    out = {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        futs = {pool.submit(hash_file, p, k, on_bytes): p for p, k in jobs}
        for fut in as_completed(futs):
            out[futs[fut]] = fut.result()
    return out


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------

class Progress(object):
    """Counters shared by the workers, written as JSON to ``path`` about once a second."""

    def __init__(self, path, repo_id, interval=1.0, incomplete_dir=None):
        self.path = path
        self.repo_id = repo_id
        self.interval = interval
        self.incomplete_dir = incomplete_dir
        self.lock = threading.Lock()
        self.phase = "starting"
        self.sha = None
        self.files_total = self.files_done = 0
        self.bytes_total = self.bytes_done = 0
        self.hash_total = self.hash_done = 0
        self.bytes_partial = 0  # bytes of files still being fetched by the parallel-range path
        self.started = time.time()
        self._samples = []
        self._stop = threading.Event()
        self._thread = None

    def add_done(self, n_bytes, n_files=1):
        with self.lock:
            self.bytes_done += n_bytes
            self.files_done += n_files

    def add_hashed(self, n):
        with self.lock:
            self.hash_done += n

    def add_partial(self, n):
        """Bytes written by a parallel-range fetch (any connection, any offset)."""
        with self.lock:
            self.bytes_partial += n

    def add_resumed(self, n):
        """Bytes a resumed file already had: counted as done, but not as transferred (rate, ETA)."""
        with self.lock:
            self.bytes_partial += n
            self._samples = [(t, b + n) for t, b in self._samples]

    def drop_partial(self, n):
        """A ranged file ended (done: add_done follows; failed: its bytes no longer count)."""
        with self.lock:
            self.bytes_partial -= n

    def _partial_bytes(self):
        total = 0
        if not self.incomplete_dir or self.phase != "downloading":
            return 0
        for root, _dirs, names in os.walk(self.incomplete_dir):
            for name in names:
                if name.endswith(".incomplete"):
                    try:
                        total += os.path.getsize(os.path.join(root, name))
                    except OSError:
                        pass
        return total

    def snapshot(self):
        now = time.time()
        with self.lock:
            done = self.bytes_done + self.bytes_partial + self._partial_bytes()
            hashing = self.phase in ("hashing", "verifying")
            cur, tot = (self.hash_done, self.hash_total) if hashing else (done, self.bytes_total)
            self._samples.append((now, cur))
            self._samples = [s for s in self._samples if now - s[0] <= 5.0]
            t0, b0 = self._samples[0]
            rate = (cur - b0) / (now - t0) if now > t0 else 0.0
            eta = (tot - cur) / rate if rate > 0 and tot > cur else None
            doc = {
                "repo_id": self.repo_id, "sha": self.sha, "phase": self.phase, "pid": os.getpid(),
                "files_total": self.files_total, "files_done": self.files_done,
                "bytes_total": self.bytes_total, "bytes_done": done,
                "hash_bytes_total": self.hash_total, "hash_bytes_done": self.hash_done,
                "rate_bytes_per_s": int(rate), "eta_s": None if eta is None else int(eta),
                "elapsed_s": round(now - self.started, 1), "updated": now,
            }
        pct = (100.0 * cur / tot) if tot else 100.0
        doc["summary"] = "%s %s: %s / %s (%.1f%%) at %s/s%s, files %d/%d" % (
            self.phase, self.repo_id, human_bytes(cur), human_bytes(tot), pct, human_bytes(rate),
            "" if eta is None else ", ETA %ds" % int(eta), self.files_done, self.files_total)
        return doc

    def write(self):
        if not self.path:
            return
        try:
            d = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(d):
                os.makedirs(d)
            write_json_atomic(self.path, self.snapshot())
        except OSError:
            pass  # progress is best effort; never fail a download over it

    def set_phase(self, phase):
        with self.lock:
            self.phase = phase
        self.write()

    def start(self):
        if not self.path:
            return self
        self.write()

        def loop():
            while not self._stop.wait(self.interval):
                self.write()
        self._thread = threading.Thread(target=loop, name="hf_snapshot-progress")
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self, phase):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.phase = phase
        self.write()


# --------------------------------------------------------------------------------------------
# huggingface_hub glue
# --------------------------------------------------------------------------------------------

def import_hf():
    """Import huggingface_hub with telemetry and progress bars off; SnapshotError if it is missing."""
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    os.environ.setdefault("DO_NOT_TRACK", "1")
    try:
        import huggingface_hub
        from huggingface_hub import HfApi, constants, hf_hub_download
    except ImportError as e:
        raise SnapshotError(
            "huggingface_hub cannot be imported by %s (%s). Run this module with an interpreter that has it, "
            "e.g. ansible_python_interpreter pointing at a tools venv with huggingface_hub installed."
            % (sys.executable, e),
            interpreter=sys.executable)
    if isinstance(getattr(constants, "DOWNLOAD_CHUNK_SIZE", None), int):
        constants.DOWNLOAD_CHUNK_SIZE = HTTP_CHUNK
    return {"version": getattr(huggingface_hub, "__version__", "unknown"), "HfApi": HfApi,
            "hf_hub_download": hf_hub_download}


def describe_error(exc, repo_id, revision):
    """A short operator-facing message for a huggingface_hub failure (no token, no traceback)."""
    names = [c.__name__ for c in type(exc).__mro__]
    status = getattr(getattr(exc, "response", None), "status_code", None)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "GatedRepoError" in names:
        return "repository %s is gated and the token has no access to it (HTTP %s)" % (repo_id, status)
    if "RepositoryNotFoundError" in names:
        return ("repository %s not found, or private and not readable with the given token (HTTP %s)"
                % (repo_id, status))
    if "RevisionNotFoundError" in names:
        return "revision %s not found in repository %s" % (revision, repo_id)
    if "RemoteEntryNotFoundError" in names:
        return "file not found in %s at %s: %s" % (repo_id, revision, first)
    if status == 401:
        return "the Hub rejected the token for %s (HTTP 401: %s)" % (repo_id, first)
    if status == 403:
        return "access to %s forbidden (HTTP 403: %s)" % (repo_id, first)
    return "%s: %s" % (type(exc).__name__, first)


class _QuietStdout(object):
    """Send stray prints of the library to stderr: a module's stdout must hold only its JSON."""

    def __enter__(self):
        self._old = sys.stdout
        sys.stdout = sys.stderr
        return self

    def __exit__(self, *a):
        sys.stdout = self._old


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

class Snapshot(object):
    """One run of the module. ``params`` are the module options; ``warn`` collects warnings."""

    def __init__(self, params, check_mode=False, warn=None, hf=None, sleep=time.sleep, on_secret=None):
        self.on_secret = on_secret or (lambda value: None)
        self.p = params
        self.check_mode = check_mode
        self.warn = warn or (lambda msg: None)
        self.hf = hf
        self.sleep = sleep
        self.dest = os.path.abspath(params["dest"])
        self.repo_id = params["repo_id"]
        self.revision = params["revision"]
        self.verify = params.get("verify") or "size"
        self.expect_digest = params.get("expect_tree_digest") or None
        if self.expect_digest:
            # the listing is vouched for by its digest; the files are only as good as their check against it
            self.verify = "sha256"
        self.token = params.get("token")
        self.allow = params.get("allow_patterns")
        if self.allow is None:
            self.allow = list(DEFAULT_ALLOW_PATTERNS)
        self.ignore = params.get("ignore_patterns")
        if self.ignore is None:
            self.ignore = list(DEFAULT_IGNORE_PATTERNS)
        self.hash_workers = int(params.get("hash_workers") or 0) or auto_workers()
        self.retries = params.get("retries", 5)
        self.backoff = params.get("retry_backoff", 2.0)
        self.retry_log = []
        self.lock_fd = None
        self.progress = Progress(None if check_mode else params.get("progress_file"), self.repo_id,
                                 incomplete_dir=os.path.join(self.dest, HF_DOWNLOAD_DIR))
        self.hub_contacted = False
        self.range_connections = max(0, int(params.get("range_connections", DEFAULT_RANGE_CONNECTIONS)))
        self.range_chunk = max(1, int(params.get("range_chunk_mib", DEFAULT_RANGE_CHUNK_MIB))) << 20
        self.ranged = self.range_connections > 0 and ranged_endpoint(params.get("endpoint"))
        self.tree = {}
        self.transfer = {"method": "none", "range_connections": self.range_connections,
                         "range_chunk_bytes": self.range_chunk, "files_ranged": 0, "files_library": 0,
                         "resumed_bytes": 0, "range_requests": 0, "range_retries": 0, "fallback": None,
                         "xet_environment": {}}
        self._tlock = threading.Lock()

    # ---- small utilities ---------------------------------------------------------------
    def _abs(self, rel):
        return os.path.join(self.dest, *rel.split("/"))

    def _stat(self, rel):
        try:
            st = os.stat(self._abs(rel))
        except OSError:
            return None
        return st if _is_regular(st) else _NotRegular(st)

    def _on_retry(self, what):
        def cb(exc, attempt, delay):
            self.retry_log.append({"what": what, "attempt": attempt, "delay_s": delay,
                                   "error": "%s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0])})
        return cb

    def _retry(self, what, fn):
        return call_with_retries(fn, self.retries, self.backoff, sleep=self.sleep, on_retry=self._on_retry(what))

    def _hf(self):
        if self.hf is None:
            self.hf = import_hf()
        return self.hf

    def _api(self):
        hf = self._hf()
        return hf["HfApi"](endpoint=self.p.get("endpoint"), token=self._token_arg(),
                           library_name="inferops-vllm")

    def _token_arg(self):
        # False, not None: never pick up a token file or HF_TOKEN the operator did not hand us.
        return self.token if self.token else False

    # ---- locking -------------------------------------------------------------------------
    def acquire_lock(self):
        import fcntl
        path = os.path.join(self.dest, LOCK_NAME)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.time() + float(self.p.get("lock_timeout", 600))
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.time() >= deadline:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
                    os.close(fd)
                    raise SnapshotError("another hf_snapshot run (pid %s) holds %s; waited %ss"
                                        % (holder or "?", path, self.p.get("lock_timeout", 600)))
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.lock_fd = fd

    def release_lock(self):
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    # ---- phases ----------------------------------------------------------------------------
    def resolve_and_list(self, manifest_any):
        """(sha, tree, source): from the manifest when the pinned sha matches, else from the Hub."""
        pinned = is_commit_sha(self.revision)
        if pinned and manifest_any is not None and manifest_any.get("sha") == self.revision:
            return self.revision, manifest_any["tree"], "manifest"
        api = self._api()
        sha = self.revision
        if not pinned:
            self.hub_contacted = True
            info = self._retry("resolve revision", lambda: api.model_info(self.repo_id, revision=self.revision))
            sha = info.sha
            if not is_commit_sha(sha or ""):
                raise SnapshotError("the Hub returned no commit sha for %s@%s" % (self.repo_id, self.revision))
            manifest = load_manifest(self.dest, self.repo_id, sha)
            if manifest is not None:
                return sha, manifest["tree"], "manifest"

        def listing():
            return list(api.list_repo_tree(self.repo_id, recursive=True, revision=sha))
        self.hub_contacted = True
        entries = self._retry("list files", listing)
        return sha, tree_from_entries(entries), "hub"

    def _part(self, rel):
        return os.path.join(self.dest, PARTIAL_DIR, *rel.split("/")) + PARTIAL_SUFFIX

    def remove_stale(self, keep=()):
        """Delete .incomplete leftovers of earlier (killed) processes, and the library's .lock files.

        Runs under our own lock, so no other hf_snapshot process is writing there. Returns the count
        and bytes of partial files (the empty .lock files are not worth reporting). Partial files of
        the parallel-range path are kept for the paths in ``keep`` (they resume); others go.
        """
        top = os.path.join(self.dest, HF_DOWNLOAD_DIR)
        count = size = 0
        keep_parts = set(self._part(rel) for rel in keep)
        ptop = os.path.join(self.dest, PARTIAL_DIR)
        for root, _dirs, names in os.walk(ptop):
            for name in names:
                p = os.path.join(root, name)
                base = p
                for side in (".json", range_fetch.FILL_SUFFIX):
                    if name.endswith(PARTIAL_SUFFIX + side):
                        base = p[:-len(side)]
                if base in keep_parts:
                    continue
                n = self._remove_counted(p)
                if n is not None and name.endswith(PARTIAL_SUFFIX):
                    count += 1
                    size += n
        if not self.check_mode and os.path.isdir(ptop):
            for root, _dirs, _names in sorted(os.walk(ptop), key=lambda w: -len(w[0])):
                if root != ptop:
                    try:
                        os.rmdir(root)  # only empty ones go
                    except OSError:
                        pass
        for root, _dirs, names in os.walk(top):
            for name in names:
                partial = name.endswith(".incomplete")
                if partial or name.endswith(".lock"):
                    n = self._remove_counted(os.path.join(root, name))
                    if n is not None and partial:
                        count += 1
                        size += n
        return count, size

    def _remove_counted(self, path):
        """Remove ``path`` (not in check mode); its size, or None when it cannot be read or removed."""
        try:
            size = os.path.getsize(path)
            if not self.check_mode:
                os.remove(path)
        except OSError:
            return None
        return size

    def _forget_local(self, rel):
        """Remove the file and huggingface_hub's metadata for it, so the library downloads it anew."""
        for p in (self._abs(rel), os.path.join(self.dest, HF_DOWNLOAD_DIR, *rel.split("/")) + ".metadata"):
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)  # a directory where the repo has a file
                continue
            try:
                os.remove(p)
            except FileNotFoundError:
                pass

    def _count(self, key, n=1):
        with self._tlock:
            self.transfer[key] += n

    def _download_file(self, sha, rel):
        """Fetch one file into place. Returns its digest when it was computed in the same pass, else None."""
        meta = self.tree.get(rel)
        if self.ranged and meta is not None:
            try:
                digest = self._fetch_ranges(sha, rel, meta)
                self._count("files_ranged")
                return digest
            except range_fetch.RangeUnsupported as e:
                with self._tlock:
                    self.ranged = False  # the rest of the run goes through the library
                    self.transfer["fallback"] = "%s: %s" % (rel, e)
            except range_fetch.HTTPStatusError as e:
                # the library names the endpoint's errors in the Hub's terms (RepoNotFound, 410 ...)
                with self._tlock:
                    self.transfer["fallback"] = "%s: %s" % (rel, e)
        self._download_file_hf(sha, rel)
        self._count("files_library")
        return None

    def _fetch_ranges(self, sha, rel, meta):
        """The parallel-range path (module_utils/range_fetch.py): probe, fetch + hash, rename into place."""
        url = range_fetch.file_url(self.p["endpoint"], self.repo_id, sha, rel)
        headers = {"User-Agent": "inferops-vllm/hf_snapshot"}
        if self.token:
            headers["Authorization"] = "Bearer %s" % self.token
        timeout = float(self.p.get("timeout", 10))
        size = int(meta["size"])
        part = self._part(rel)
        # an HTTP error answer is not retried here: the library's path takes the file and names the error
        got = call_with_retries(lambda: range_fetch.probe(url, size, headers, timeout, sha), self.retries, self.backoff,
                                fatal=lambda e: isinstance(e, range_fetch.HTTPStatusError) or is_fatal(e),
                                sleep=self.sleep, on_retry=self._on_retry("probe %s" % rel))
        if not got["ranged"]:
            range_fetch.remove_partial(part)
            raise range_fetch.RangeUnsupported(got["reason"])
        kind = content_kind(meta) if self.verify == "sha256" else None
        counted = [0]

        def on_bytes(n):
            counted[0] += n
            self.progress.add_partial(n)

        def on_resumed(n):
            counted[0] += n
            self.progress.add_resumed(n)
        self._forget_local(rel)
        try:
            stats = range_fetch.fetch(url, part, size, kind, expected_digest(meta), headers=headers,
                                      connections=self.range_connections, chunk=self.range_chunk, timeout=timeout,
                                      retries=self.retries, backoff=self.backoff, on_bytes=on_bytes,
                                      on_resumed=on_resumed, on_retry=self._on_retry("download %s" % rel),
                                      sleep=self.sleep)
        except range_fetch.RangeUnsupported:
            range_fetch.remove_partial(part)
            raise
        finally:
            self.progress.drop_partial(counted[0])
        with self._tlock:
            self.transfer["resumed_bytes"] += stats["resumed_bytes"]
            self.transfer["range_requests"] += stats["requests"]
            self.transfer["range_retries"] += stats["retries"]
        digest = stats["digest"]
        if digest is not None and digest != expected_digest(meta):
            range_fetch.remove_partial(part)  # the next attempt fetches the whole file again
            return digest
        final = self._abs(rel)
        parent = os.path.dirname(final)
        if not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        os.replace(part, final)
        range_fetch.remove_partial(part)  # its sidecars (the part itself is now the final file)
        return digest

    def _download_file_hf(self, sha, rel):
        hf = self._hf()

        def once():
            self._forget_local(rel)
            hf["hf_hub_download"](
                self.repo_id, rel, revision=sha, local_dir=self.dest,
                cache_dir=os.path.join(self.dest, ".cache", "huggingface", "hub"),
                endpoint=self.p.get("endpoint"), token=self._token_arg(),
                etag_timeout=float(self.p.get("timeout", 10)), library_name="inferops-vllm")
        self._retry("download %s" % rel, once)

    def _check_file(self, rel, meta, content, digest=None):
        """(ok, detail) for a file on disk against the Hub metadata.

        ``digest``: computed while the file was fetched (parallel-range path); then the file is not
        read again. A wrong digest means the file was never renamed into place.
        """
        if content and digest is not None and digest != expected_digest(meta):
            kind = content_kind(meta)
            return False, {"path": rel, "reason": kind, "expected": expected_digest(meta), "actual": digest}
        st = self._stat(rel)
        if st is None or isinstance(st, _NotRegular):
            return False, {"path": rel, "reason": "missing after download"}
        if st.st_size != meta["size"]:
            return False, {"path": rel, "reason": "size", "expected": meta["size"], "actual": st.st_size}
        if content and digest is None:
            kind = content_kind(meta)
            digest = hash_file(self._abs(rel), kind, self.progress.add_hashed)
            if digest != expected_digest(meta):
                return False, {"path": rel, "reason": kind, "expected": expected_digest(meta), "actual": digest}
        return True, None

    def download_all(self, sha, tree, paths, content):
        """Download + verify each path in a pool; a mismatch gets one re-download. Returns stats."""
        done, mismatches = [], []
        failures = []
        stop = threading.Event()

        def work(rel):
            meta = tree[rel]
            for attempt in (1, 2):
                if stop.is_set():
                    return
                digest = self._download_file(sha, rel)
                ok, detail = self._check_file(rel, meta, content, digest)
                if ok:
                    self.progress.add_done(meta["size"])
                    done.append((rel, attempt))
                    return
                detail["attempt"] = attempt
                mismatches.append(detail)
            self._forget_local(rel)
            raise SnapshotError("%s does not match the Hub's metadata after a re-download (%s: expected %s, got %s)"
                                % (rel, detail["reason"], detail.get("expected"), detail.get("actual")),
                                mismatches=mismatches)

        workers = int(self.p.get("max_workers") or 0) or auto_workers()
        workers = max(1, min(workers, len(paths) or 1))
        # Big files first: the pool then ends with small files instead of one long straggler.
        order = sorted(paths, key=lambda r: -tree[r]["size"])
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            futs = {pool.submit(work, rel): rel for rel in order}
            for fut in as_completed(futs):
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001
                    stop.set()
                    failures.append((futs[fut], e))
        finally:
            pool.shutdown(wait=True)
        if failures:
            rel, exc = failures[0]
            if isinstance(exc, SnapshotError):
                raise exc
            raise SnapshotError("download of %s from %s failed: %s" % (rel, self.repo_id,
                                                                       describe_error(exc, self.repo_id, self.revision)),
                                failed_file=rel, mismatches=mismatches, retries=self.retry_log)
        return done, mismatches

    def _chown_tree(self):
        owner, group = self.p.get("owner"), self.p.get("group")
        if owner is None and group is None:
            return 0
        uid = _uid(owner) if owner is not None else -1
        gid = _gid(group) if group is not None else -1
        changed = 0
        for root, dirs, names in os.walk(self.dest):
            for name in [None] + dirs + names:
                p = root if name is None else os.path.join(root, name)
                st = os.lstat(p)
                if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
                    changed += 1
                    if not self.check_mode:
                        os.lchown(p, uid, gid)
        return changed

    # ---- main --------------------------------------------------------------------------------
    def run(self):
        t_start = time.time()
        if not is_commit_sha(self.revision) and not self.p.get("allow_unpinned"):
            raise SnapshotError("revision %r is not a 40-hex commit sha; pin the commit, or set allow_unpinned: true "
                                "to resolve a branch or tag (the resolved sha is returned)" % self.revision)
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise SnapshotError("dest %s exists and is not a directory" % self.dest)
        if self.p.get("token") is not None and self.p.get("token_file"):
            raise SnapshotError("token and token_file are mutually exclusive")
        if self.p.get("token_file"):
            try:
                self.token = read_token_file(self.p["token_file"])
            except (OSError, UnicodeDecodeError) as e:
                raise SnapshotError("cannot read token_file %s: %s" % (self.p["token_file"], getattr(e, "strerror", None) or e))
            self.on_secret(self.token)
        xet_env = xet_environment(self.p.get("xet_environment"))
        os.environ.update(xet_env)  # before huggingface_hub (and hf_xet) are imported
        self.transfer["xet_environment"] = xet_env

        manifest_any = load_manifest(self.dest, self.repo_id)
        if not is_commit_sha(self.revision) or manifest_any is None or manifest_any.get("sha") != self.revision:
            self._hf()  # fail early and clearly when the library is missing and the network is needed

        quiet = _QuietStdout()
        quiet.__enter__()
        created = not os.path.exists(self.dest)
        try:
            if not self.check_mode:
                os.makedirs(self.dest, exist_ok=True)
                self.acquire_lock()
                self.progress.start()
            return self._run_locked(manifest_any, t_start)
        except SnapshotError:
            self._failed(created)
            raise
        except Exception as e:  # noqa: BLE001 - a library error becomes a clear message
            self._failed(created)
            raise SnapshotError(describe_error(e, self.repo_id, self.revision), error_type=type(e).__name__,
                                retries=self.retry_log)
        finally:
            self.release_lock()
            quiet.__exit__()

    def _failed(self, created):
        self.progress.stop("failed")
        if created and not self.check_mode:
            self.release_lock()
            self._remove_if_empty()

    def _remove_if_empty(self):
        """Remove dest when this run created it and wrote nothing into it but the lock (a refused listing, a
        mirror that had nothing): no empty snapshot directory is left to look like one. Partial files stay
        (a later run resumes them)."""
        lock = os.path.join(self.dest, LOCK_NAME)
        for root, _dirs, names in os.walk(self.dest):
            if any(os.path.join(root, n) != lock for n in names):
                return
        shutil.rmtree(self.dest, ignore_errors=True)

    def _run_locked(self, manifest_any, t_start):
        self.progress.set_phase("listing")
        sha, tree, tree_source = self.resolve_and_list(manifest_any)
        self.progress.sha = sha
        selected = self._select(sha, tree)
        digest = tree_digest(tree, selected)
        if self.expect_digest and digest != self.expect_digest:
            raise SnapshotError(
                "the listing of %s@%s from %s is not the one its source verified (its digest is %s, the source's %s): "
                "refused, nothing was written. Something other than the fan-out mirror answers on that address, or "
                "the source's snapshot changed since the run began; check the port on the source and re-run"
                % (self.repo_id, sha, self.p.get("endpoint") or "the local manifest", digest[:16],
                   self.expect_digest[:16]), sha=sha, tree_digest=digest, refused="listing")
        manifest = load_manifest(self.dest, self.repo_id, sha)
        total_bytes = sum(tree[p]["size"] for p in selected)

        # 1. Where do we stand? Stat only; hash what the manifest cannot vouch for (sha256 mode).
        verification, new_records, repaired, missing = self._check_present(selected, tree, manifest)
        to_download = sorted(missing + repaired)
        missing_bytes = sum(tree[p]["size"] for p in to_download)
        reclaimable = sum(max(0, getattr(self._stat(p), "st_size", 0)) for p in repaired)
        self.tree = tree

        # 2. Stale partial downloads of killed runs (never resumed by huggingface_hub); the partial
        # files of the parallel-range path resume, for the files still to fetch, and hold their space.
        keep = to_download if self.ranged else ()
        stale_count, stale_bytes = self.remove_stale(keep)
        reclaimable += sum(range_fetch.partial_bytes(self._part(p), tree[p]["size"]) for p in keep)

        # 3. Disk space, before a single byte is fetched.
        disk = self._check_disk(sha, missing_bytes, reclaimable + (stale_bytes if self.check_mode else 0))

        result = {"sha": sha, "revision": self.revision, "resolved": sha != self.revision, "dest": self.dest,
                  "files": len(selected), "total_bytes": total_bytes, "disk": disk, "tree_source": tree_source,
                  "tree_digest": digest,
                  "stale_removed": {"files": stale_count, "bytes": stale_bytes}}

        if self.check_mode:
            return self._check_mode_result(result, to_download, missing_bytes, stale_count, verification, t_start)

        # 4. Download what is missing or bad; verify each file as it lands.
        if to_download:
            os.makedirs(os.path.dirname(os.path.join(self.dest, LISTING_NAME)), exist_ok=True)
            write_json_atomic(os.path.join(self.dest, LISTING_NAME), build_manifest(
                self.repo_id, sha, tree, {p: {"size": tree[p]["size"]} for p in selected}))
        done, dl_seconds = self._download_missing(sha, tree, to_download, repaired, missing_bytes, verification, new_records)

        # 5. Completeness against the weight index(es).
        index_docs, shards = self._check_complete(sha, tree, selected)

        # 6. Ownership, then the manifest (its stat must be taken after any chown: chown moves ctime).
        chown_count = self._save_manifest(sha, tree, selected, new_records, manifest)

        bytes_downloaded = sum(tree[p]["size"] for p, _a in done)
        verification["result"] = "ok"
        verification["hash_seconds"] = round(verification["hash_seconds"], 3)
        self.progress.stop("done")
        result.update({
            "changed": bool(done) or stale_count > 0 or chown_count > 0,
            "downloaded_files": len(done), "bytes_downloaded": bytes_downloaded,
            "downloaded": sorted(p for p, _a in done), "repaired": sorted(repaired),
            "verification": verification,
            "completeness": {"indexes": sorted(index_docs), "shards": len(shards), "ok": True},
            "seconds": round(time.time() - t_start, 3),
            "download_seconds": round(dl_seconds, 3),
            "throughput_mib_s": round(bytes_downloaded / dl_seconds / 1048576.0, 1) if dl_seconds > 0 else 0.0,
            "hub_contacted": self.hub_contacted or bool(done),
            "retries": self.retry_log,
            "transfer": self.transfer,
        })
        return result

    def _select(self, sha, tree):
        """The sorted paths of ``tree`` that the patterns select and dest can store; warns about the others."""
        bad_paths = [p for p in tree if not safe_relpath(p)]
        if bad_paths:
            self.warn("skipped repository paths that cannot be stored under dest: %s" % ", ".join(sorted(bad_paths)[:5]))
        selected = sorted(p for p in filter_paths(list(tree), self.allow, self.ignore) if p not in bad_paths)
        if not selected:
            raise SnapshotError("no file of %s@%s matches allow_patterns %s / ignore_patterns %s"
                                % (self.repo_id, sha, self.allow, self.ignore), sha=sha)
        if any(p.endswith(".safetensors") for p in tree) and not any(p.endswith(".safetensors") for p in selected):
            self.warn("the repository has *.safetensors files but the patterns select none of them")
        return selected

    def _check_present(self, selected, tree, manifest):
        """Check the selected files already on disk: (verification, new_records, repaired, missing)."""
        records = dict(manifest["files"]) if manifest else {}
        plan = classify(selected, tree, records, self._stat, self.verify, bool(self.p.get("reverify")))
        verification = {"mode": self.verify, "files": len(selected), "trusted": len(plan["trusted"]),
                        "content_checked": 0, "bytes_hashed": 0, "hash_seconds": 0.0, "mismatches": []}
        new_records = {p: records[p] for p in plan["trusted"]}
        for p in plan["present_ok"]:
            new_records[p] = dict(stat_key(self._stat(p)), verified="size")

        repaired = list(plan["bad"])
        for p in plan["bad"]:
            st = self._stat(p)
            verification["mismatches"].append({"path": p, "reason": "size", "expected": tree[p]["size"],
                                               "actual": getattr(st, "st_size", None), "phase": "before"})
        if plan["to_hash"]:
            self._hash_present(plan["to_hash"], tree, verification, new_records, repaired)
        return verification, new_records, repaired, plan["missing"]

    def _hash_present(self, to_hash, tree, verification, new_records, repaired):
        """Hash files the manifest cannot vouch for: a match gets a record, a mismatch joins ``repaired``."""
        self.progress.hash_total = sum(tree[p]["size"] for p in to_hash)
        self.progress.set_phase("hashing")
        t0 = time.time()
        digests = hash_many([(self._abs(p), content_kind(tree[p])) for p in to_hash],
                            self.hash_workers, self.progress.add_hashed)
        verification["hash_seconds"] += time.time() - t0
        verification["bytes_hashed"] += self.progress.hash_total
        verification["content_checked"] += len(to_hash)
        for p in to_hash:
            digest = digests[self._abs(p)]
            if digest == expected_digest(tree[p]):
                new_records[p] = dict(stat_key(self._stat(p)), verified="content")
            else:
                repaired.append(p)
                verification["mismatches"].append({"path": p, "reason": content_kind(tree[p]),
                                                   "expected": expected_digest(tree[p]), "actual": digest,
                                                   "phase": "before"})

    def _check_disk(self, sha, missing_bytes, reclaimable):
        """Raise unless dest has room for ``missing_bytes`` and the margin; returns the ``disk`` result."""
        free = free_bytes_at(self.dest)
        margin = int(self.p.get("disk_margin_mib", 1024)) << 20
        ok, need, available = disk_check(free, missing_bytes, reclaimable, margin)
        disk = {"free_bytes": free, "missing_bytes": missing_bytes, "margin_bytes": margin,
                "need_bytes": need, "available_bytes": available}
        if not ok:
            raise SnapshotError(
                "not enough disk space at %s for %s@%s: need %d bytes (%s missing + %s margin), %d bytes available (%s)"
                % (self.dest, self.repo_id, sha, need, human_bytes(missing_bytes), human_bytes(margin), available,
                   human_bytes(available)), sha=sha, disk=disk)
        return disk

    def _check_mode_result(self, result, to_download, missing_bytes, stale_count, verification, t_start):
        """Complete ``result`` for check mode: what would be downloaded; nothing is."""
        chown_count = self._chown_tree() if os.path.isdir(self.dest) else 0
        result.update({
            "changed": bool(to_download) or stale_count > 0 or chown_count > 0,
            "would_download": {"files": len(to_download), "bytes": missing_bytes, "paths": to_download},
            "downloaded_files": 0, "bytes_downloaded": 0, "downloaded": [], "repaired": [],
            "verification": dict(verification, result="not run (check mode)"),
            "seconds": round(time.time() - t_start, 3), "throughput_mib_s": 0.0,
            "hub_contacted": self.hub_contacted,
        })
        return result

    def _download_missing(self, sha, tree, to_download, repaired, missing_bytes, verification, new_records):
        """Download and verify ``to_download``, recording each file that lands; returns (done, seconds)."""
        content_level = "content" if self.verify == "sha256" else "size"
        if not to_download:
            return [], 0.0
        for p in repaired:
            self._forget_local(p)
        if self.hf is None:
            self._hf()
        self.progress.files_total = len(to_download)
        self.progress.bytes_total = missing_bytes
        self.progress.set_phase("downloading")
        t0 = time.time()
        try:
            done, mismatches = self.download_all(sha, tree, to_download, content_level == "content")
        except SnapshotError as e:
            e.fields["mismatches"] = verification["mismatches"] + e.fields.get("mismatches", [])
            e.fields.setdefault("sha", sha)
            raise
        dl_seconds = time.time() - t0
        for m in mismatches:
            m["phase"] = "after download"
        verification["mismatches"].extend(mismatches)
        if content_level == "content":
            verification["content_checked"] += len(done) + len(mismatches)
            verification["bytes_hashed"] += sum(tree[p]["size"] for p, _a in done)
        for p, _attempt in done:
            new_records[p] = dict(stat_key(self._stat(p)), verified=content_level)
        self.remove_stale()  # the library leaves its .lock files behind
        t = self.transfer
        t["method"] = ("ranges" if not t["files_library"] else
                       "huggingface_hub" if not t["files_ranged"] else "mixed")
        return done, dl_seconds

    def _check_complete(self, sha, tree, selected):
        """Check the weight index(es) against the tree and the disk; returns (index_docs, shards)."""
        self.progress.set_phase("verifying")
        index_docs = {}
        for p in selected:
            if p.endswith(".safetensors.index.json"):
                try:
                    with open(self._abs(p)) as f:
                        index_docs[p] = json.load(f)
                except (OSError, ValueError) as e:
                    raise SnapshotError("cannot read %s: %s" % (p, e), sha=sha)
        problems, shards = index_completeness(index_docs, tree, selected)
        for shard in shards:
            if shard in tree and shard in selected and self._stat(shard) is None:
                problems.append("%s is missing on disk" % shard)
        if problems:
            raise SnapshotError("incomplete snapshot of %s@%s: %s" % (self.repo_id, sha, "; ".join(problems)),
                                sha=sha, problems=problems)
        return index_docs, shards

    def _save_manifest(self, sha, tree, selected, new_records, manifest):
        """Apply owner/group, then write the manifest when it changed; returns the count of paths chowned."""
        chown_count = self._chown_tree()
        if chown_count:
            for p in list(new_records):
                st = self._stat(p)
                new_records[p] = dict(stat_key(st), verified=new_records[p]["verified"])
        missing_records = [p for p in selected if p not in new_records]
        if missing_records:  # cannot happen; guards the manifest's promise
            raise SnapshotError("internal: unverified files left: %s" % ", ".join(missing_records[:5]))
        new_manifest = build_manifest(self.repo_id, sha, tree, {p: new_records[p] for p in selected})
        try:
            os.remove(os.path.join(self.dest, LISTING_NAME))  # the manifest now speaks for the snapshot
        except FileNotFoundError:
            pass
        if manifest != new_manifest:
            path = os.path.join(self.dest, MANIFEST_NAME)
            write_json_atomic(path, new_manifest)
            if self.p.get("owner") is not None or self.p.get("group") is not None:
                os.chown(path, _uid(self.p["owner"]) if self.p.get("owner") is not None else -1,
                         _gid(self.p["group"]) if self.p.get("group") is not None else -1)
        return chown_count


class _NotRegular(object):
    """A path that exists but is not a regular file (a directory, a socket...): treated as bad."""

    def __init__(self, st):
        self.st_size = -1
        self._st = st


def _is_regular(st):
    import stat as _stat
    return _stat.S_ISREG(st.st_mode)


def _uid(owner):
    import pwd
    if isinstance(owner, int) or str(owner).isdigit():
        return int(owner)
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise SnapshotError("owner %s does not exist" % owner)


def _gid(group):
    import grp
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise SnapshotError("group %s does not exist" % group)


def run_snapshot(params, check_mode=False, warn=None, on_secret=None):
    """Entry point for the module: returns the result dict or raises SnapshotError."""
    return Snapshot(params, check_mode=check_mode, warn=warn, on_secret=on_secret).run()
