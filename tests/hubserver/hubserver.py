"""A loopback stand-in for the Hugging Face Hub, good enough for real ``huggingface_hub`` 2.4.0.

Serves a directory of repositories laid out as ``<root>/<org>/<name>/<sha>/<files...>`` with the
endpoints ``snapshot_download``/``hf_hub_download``/``HfApi`` call (checked against the 2.4.0
sources: ``file_download.get_hf_file_metadata``, ``http_get``, ``HfApi.model_info``,
``HfApi.list_repo_tree``, ``utils._http.hf_raise_for_status``):

* ``GET /api/models/<org>/<name>[/revision/<rev>]`` -> model info (``sha``, ``siblings``;
  ``?blobs=true`` adds ``size``/``blobId``/``lfs``).
* ``GET /api/models/<org>/<name>/tree/<rev>[/<path>]?recursive=..`` -> ``[{type, oid, size, path,
  lfs: {oid, size, pointerSize}}]``, paginated with a ``Link: <..>; rel="next"`` header.
* ``HEAD|GET /<org>/<name>/resolve/<rev>/<path>`` -> ``X-Repo-Commit``, ``ETag`` (git blob sha1, or
  the sha256 for LFS files), ``X-Linked-Etag``/``X-Linked-Size`` for LFS files, ``Accept-Ranges``;
  ``Range: bytes=a-[b]`` -> 206 + ``Content-Range``. With ``lfs_redirect`` LFS files answer 302 to a
  "CDN" origin (``localhost`` instead of ``127.0.0.1``), like the Hub's signed URLs.
* Errors as the Hub sends them: 404 + ``X-Error-Code: RepoNotFound | RevisionNotFound |
  EntryNotFound``; 401/403 + ``X-Error-Code: GatedRepo``; 401 + ``X-Error-Message: Invalid
  credentials in Authorization header`` for an unknown token.

Per repository (all optional):
* ``<root>/<org>/<name>/refs.json``: ``{"main": "<sha>", "v1": "<sha>"}`` (branches and tags).
* ``<root>/<org>/<name>/access.json``: ``{"private": bool, "gated": bool, "tokens": [..],
  "denied_tokens": [..]}``. ``tokens`` may read it; ``denied_tokens`` are valid users without access
  (gated -> 403 GatedRepo, private -> 404 RepoNotFound); any other token -> 401 invalid credentials;
  no token -> 401 (GatedRepo or RepoNotFound).

Fault injection (``ServerConfig``, changeable at run time through ``POST /_admin/config``):
``throttle_bps`` (per response body), ``die_after_bytes``/``die_times`` (send that many body bytes,
then drop the connection, ``die_times`` times), ``error_status``/``error_times`` (answer a file GET
with that HTTP status), ``corrupt_times`` (flip the first body byte of that many file GET answers:
one wrong range), each limited to paths matching ``fault_glob``; ``ranges: false`` serves every
file whole, without ``Accept-Ranges`` (an endpoint that does not do ranges).
``GET /_admin/stats`` returns request counters; ``POST /_admin/reset`` clears them.

CLI: ``python hubserver.py --root DIR --port 0 [--publish org/name=SRC_DIR ...]`` prints the port
on the first stdout line, then one ``published <org/name> <sha>`` line per ``--publish``.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

SHA_RE = re.compile(r"^[0-9a-f]{40}$")
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".model", ".onnx", ".msgpack", ".h5",
                ".npy", ".npz", ".zip", ".tiktoken")
LFS_MIN_SIZE = 10 * 1024 * 1024  # the Hub refuses non-LFS files above 10 MB
META_NAME = ".hubserver-meta-%s.json"


# --------------------------------------------------------------------------------------------
# Repository store
# --------------------------------------------------------------------------------------------

def is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return ("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256, size)).encode()


def file_meta(full: str, rel: str) -> dict:
    """Hub metadata of one file: size, git oid, and for LFS files sha256 + pointer size."""
    size = os.path.getsize(full)
    if is_lfs(rel, size):
        h = hashlib.sha256()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with open(full, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                h.update(view[:n])
        sha = h.hexdigest()
        pointer = lfs_pointer(sha, size)
        return {"size": size, "oid": git_blob_sha1(pointer), "lfs": {"oid": sha, "size": size, "pointerSize": len(pointer)}}
    with open(full, "rb") as f:
        data = f.read()
    return {"size": size, "oid": git_blob_sha1(data)}


def walk_files(top: str) -> list[str]:
    out = []
    for root, dirs, names in os.walk(top):
        dirs.sort()
        for name in sorted(names):
            out.append(os.path.relpath(os.path.join(root, name), top).replace(os.sep, "/"))
    return out


def repo_metadata(snapshot_dir: str, workers: int = 4) -> dict:
    files = walk_files(snapshot_dir)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        metas = list(pool.map(lambda rel: file_meta(os.path.join(snapshot_dir, rel), rel), files))
    out = {}
    for rel, meta in zip(files, metas):
        st = os.stat(os.path.join(snapshot_dir, rel))
        meta["mtime_ns"] = st.st_mtime_ns
        out[rel] = meta
    return out


def commit_sha_for(snapshot_dir: str, salt: str = "") -> str:
    """A stable fake commit id: sha1 over the file list, sizes and the files' first/last 64 KiB."""
    h = hashlib.sha1(salt.encode())
    for rel in walk_files(snapshot_dir):
        full = os.path.join(snapshot_dir, rel)
        size = os.path.getsize(full)
        h.update(b"%s\0%d\0" % (rel.encode(), size))
        with open(full, "rb") as f:
            h.update(f.read(65536))
            if size > 65536:
                f.seek(max(65536, size - 65536))
                h.update(f.read(65536))
    return h.hexdigest()


def publish_repo(src: str, root: str, repo_id: str, refs=("main",), sha: str | None = None,
                 link: bool = True, access: dict | None = None, workers: int = 4) -> str:
    """Copy (hard-link where possible) ``src`` to ``<root>/<repo_id>/<sha>/`` and point ``refs`` at it.

    Also precomputes the Hub metadata (sha256 of LFS files) into a side file so the first request
    is fast. Returns the commit sha.
    """
    sha = sha or commit_sha_for(src, salt=repo_id)
    repo_dir = os.path.join(root, *repo_id.split("/"))
    dst = os.path.join(repo_dir, sha)
    if os.path.isdir(dst):
        shutil.rmtree(dst)
    for rel in walk_files(src):
        s, d = os.path.join(src, rel), os.path.join(dst, rel)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        if link:
            try:
                os.link(s, d)
                continue
            except OSError:
                pass
        shutil.copy2(s, d)
    meta = repo_metadata(dst, workers)
    with open(os.path.join(repo_dir, META_NAME % sha), "w") as f:
        json.dump(meta, f)
    refs_path = os.path.join(repo_dir, "refs.json")
    current = {}
    if os.path.exists(refs_path):
        with open(refs_path) as f:
            current = json.load(f)
    for ref in refs or ():
        current[ref] = sha
    with open(refs_path, "w") as f:
        json.dump(current, f, indent=1)
    if access is not None:
        with open(os.path.join(repo_dir, "access.json"), "w") as f:
            json.dump(access, f, indent=1)
    return sha


class RepoStore:
    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._meta: dict = {}
        self._lock = threading.Lock()

    def repo_dir(self, repo_id: str) -> str | None:
        parts = repo_id.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            return None
        d = os.path.join(self.root, *parts)
        return d if os.path.isdir(d) else None

    def _json(self, repo_dir: str, name: str) -> dict:
        p = os.path.join(repo_dir, name)
        if not os.path.exists(p):
            return {}
        with open(p) as f:
            return json.load(f)

    def access(self, repo_dir: str) -> dict:
        return self._json(repo_dir, "access.json")

    def resolve(self, repo_dir: str, rev: str) -> str | None:
        if SHA_RE.match(rev) and os.path.isdir(os.path.join(repo_dir, rev)):
            return rev
        sha = self._json(repo_dir, "refs.json").get(rev)
        if sha and os.path.isdir(os.path.join(repo_dir, sha)):
            return sha
        return None

    def files(self, repo_dir: str, sha: str) -> dict:
        """path -> {size, oid, lfs?}; memoised, and read from the publish side file when it is current."""
        snap = os.path.join(repo_dir, sha)
        key = snap
        with self._lock:
            cached = self._meta.get(key)
        current = {rel: os.stat(os.path.join(snap, rel)) for rel in walk_files(snap)}
        if cached is None:
            side = os.path.join(repo_dir, META_NAME % sha)
            if os.path.exists(side):
                with open(side) as f:
                    cached = json.load(f)
        if cached is not None and set(cached) == set(current) and all(
            cached[rel]["size"] == st.st_size and cached[rel].get("mtime_ns") == st.st_mtime_ns
            for rel, st in current.items()
        ):
            meta = cached
        else:
            meta = repo_metadata(snap)
        with self._lock:
            self._meta[key] = meta
        return meta


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------

@dataclass
class ServerConfig:
    throttle_bps: int = 0          # 0 = unlimited; per response body
    die_after_bytes: int = -1      # <0 = never; else drop the connection after that many body bytes
    die_times: int = 0             # how many responses get dropped
    fault_glob: str = "*"          # which resolve paths (repo-relative file paths) the faults apply to
    error_status: int = 0          # answer GET /resolve with this status (e.g. 500) ...
    error_times: int = 0           # ... that many times
    corrupt_times: int = 0         # that many file GET responses get their first body byte flipped
    ranges: bool = True            # False: no Accept-Ranges, a Range header is ignored (200, whole file)
    lfs_redirect: bool = False     # LFS files: HEAD/GET /resolve answer 302 to a "CDN" origin
    page_size: int = 1000          # tree listing page size (the Hub caps at 1000)
    chunk: int = 1 << 20


@dataclass
class Stats:
    requests: list = field(default_factory=list)   # dicts: method, kind, path, status, range, sent, auth
    bytes_sent: int = 0
    dropped: int = 0

    def count(self, method: str | None = None, kind: str | None = None, path: str | None = None) -> int:
        return sum(1 for r in self.requests
                   if (method is None or r["method"] == method) and (kind is None or r["kind"] == kind)
                   and (path is None or r["path"] == path))


class HubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0, config: ServerConfig | None = None):
        self.store = RepoStore(root)
        self.config = config or ServerConfig()
        self._stats = Stats()
        self.lock = threading.Lock()
        self._busy = 0                       # GET/HEAD answers not yet recorded in the stats
        self._idle = threading.Condition(self.lock)
        self.secret = os.urandom(16)
        super().__init__((host, port), HubHandler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def endpoint(self) -> str:
        return "http://%s:%d" % (self.server_address[0], self.port)

    def handle_error(self, request, client_address):
        # Clients that hang up (a killed download, a dropped connection we caused) are not errors.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    @property
    def stats(self) -> Stats:
        """The stats, once every answer under way is recorded (at most 2 s of waiting).

        A client can have read a whole body before the server's thread records it; a test that reads
        the stats right after its download would then miss that request (seen once in CI, under load).
        """
        self.settle(2.0)
        return self._stats

    def settle(self, timeout: float = 5.0) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def reset_stats(self) -> None:
        self.settle(2.0)
        with self.lock:
            self._stats = Stats()

    def start(self) -> "HubServer":
        threading.Thread(target=self.serve_forever, name="hubserver", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Drop(Exception):
    pass


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hubserver/1"
    server: HubServer

    def log_message(self, format, *args):  # noqa: A002 - quiet by default
        if os.environ.get("HUBSERVER_LOG"):
            sys.stderr.write("hubserver: " + (format % args) + "\n")

    # ---- plumbing -------------------------------------------------------------------------
    def _record(self, kind: str, path: str, status: int, sent: int = 0) -> None:
        with self.server.lock:
            self.server._stats.requests.append({
                "method": self.command, "kind": kind, "path": path, "status": status,
                "range": self.headers.get("Range"), "sent": sent,
                "auth": bool(self.headers.get("Authorization")),
            })
            self.server._stats.bytes_sent += sent

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, ctype: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _json(self, status: int, data, headers: dict | None = None):
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status: int, code: str | None, message: str, headers: dict | None = None):
        h = dict(headers or {})
        if code:
            h["X-Error-Code"] = code
        h["X-Error-Message"] = message
        self._json(status, {"error": message}, h)

    def _check_access(self, repo_dir: str) -> bool:
        """Apply access.json like the Hub does; sends the error and returns False when refused."""
        access = self.server.store.access(repo_dir)
        if not access.get("private") and not access.get("gated"):
            return True
        auth = self.headers.get("Authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else None
        gated = bool(access.get("gated"))
        if token is None:
            if gated:
                self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it and be authenticated to access it. Please log in.")
            else:
                self._error(401, "RepoNotFound", "Repository not found")
            return False
        if any(hmac.compare_digest(token, t) for t in access.get("tokens", [])):
            return True
        if any(hmac.compare_digest(token, t) for t in access.get("denied_tokens", [])):
            if gated:
                self._error(403, "GatedRepo", "Access to model is restricted and you are not in the authorized list.")
            else:
                self._error(404, "RepoNotFound", "Repository not found")
            return False
        self._error(401, None, "Invalid credentials in Authorization header")
        return False

    # ---- routing ----------------------------------------------------------------------------
    def do_HEAD(self):
        self._counted(self._dispatch)

    def do_GET(self):
        self._counted(self._dispatch)

    def _counted(self, answer) -> None:
        with self.server.lock:
            self.server._busy += 1
        try:
            answer()
        finally:
            with self.server._idle:
                self.server._busy -= 1
                self.server._idle.notify_all()

    def do_POST(self):
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if path == "/_admin/config":
            data = json.loads(body or b"{}")
            with self.server.lock:
                for k, v in data.items():
                    if hasattr(self.server.config, k):
                        setattr(self.server.config, k, v)
            self._json(200, asdict(self.server.config))
        elif path == "/_admin/reset":
            self.server.reset_stats()
            self._json(200, {"ok": True})
        else:
            self._error(405, None, "Method not allowed")

    def _dispatch(self):
        try:
            parts = urlsplit(self.path)
            path, query = unquote(parts.path), parse_qs(parts.query)
            if path == "/_admin/stats":
                with self.server.lock:
                    stats = {"requests": list(self.server._stats.requests), "bytes_sent": self.server._stats.bytes_sent,
                             "dropped": self.server._stats.dropped}
                return self._json(200, stats)
            m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?/?$", path)
            if m:
                return self._model_info(m.group(1), m.group(2) or "main", query)
            m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
            if m:
                return self._tree(m.group(1), m.group(2), (m.group(3) or "").strip("/"), query)
            m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if m:
                return self._resolve(m.group(1), m.group(2), m.group(3))
            m = re.match(r"^/_cdn/([^/]+/[^/]+)/([0-9a-f]{40})/(.+)$", path)
            if m:
                return self._cdn(m.group(1), m.group(2), m.group(3), query)
            self._record("other", path, 404)
            self._error(404, None, "Not found")
        except _Drop:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _repo(self, repo_id: str, kind: str, path: str):
        repo_dir = self.server.store.repo_dir(repo_id)
        if repo_dir is None:
            self._record(kind, path, 404)
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if not self._check_access(repo_dir):
            self._record(kind, path, 401)
            return None
        return repo_dir

    def _model_info(self, repo_id: str, rev: str, query: dict):
        repo_dir = self._repo(repo_id, "revision", rev)
        if repo_dir is None:
            return
        sha = self.server.store.resolve(repo_dir, rev)
        if sha is None:
            self._record("revision", rev, 404)
            return self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
        files = self.server.store.files(repo_dir, sha)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for rel, meta in files.items():
            s = {"rfilename": rel}
            if blobs:
                s.update({"size": meta["size"], "blobId": meta["oid"]})
                if "lfs" in meta:
                    s["lfs"] = {"sha256": meta["lfs"]["oid"], "size": meta["size"], "pointerSize": meta["lfs"]["pointerSize"]}
            siblings.append(s)
        access = self.server.store.access(repo_dir)
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
            "author": repo_id.split("/")[0], "sha": sha, "private": bool(access.get("private")),
            "gated": "manual" if access.get("gated") else False, "disabled": False,
            "lastModified": "2026-01-01T00:00:00.000Z", "tags": [], "library_name": "transformers",
            "siblings": siblings,
        }
        self._record("revision", rev, 200)
        self._json(200, info)

    def _tree(self, repo_id: str, rev: str, sub: str, query: dict):
        repo_dir = self._repo(repo_id, "tree", rev)
        if repo_dir is None:
            return
        sha = self.server.store.resolve(repo_dir, rev)
        if sha is None:
            self._record("tree", rev, 404)
            return self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        files = self.server.store.files(repo_dir, sha)
        prefix = sub + "/" if sub else ""
        entries, dirs = [], set()
        for rel, meta in files.items():
            if not rel.startswith(prefix):
                continue
            rest = rel[len(prefix):]
            if "/" in rest:
                segs = rest.split("/")
                upto = len(segs) - 1 if recursive else 1
                for i in range(1, upto + 1):
                    dirs.add(prefix + "/".join(segs[:i]))
                if not recursive:
                    continue
            e = {"type": "file", "oid": meta["oid"], "size": meta["size"], "path": rel}
            if "lfs" in meta:
                e["lfs"] = dict(meta["lfs"])
            entries.append(e)
        if sub and not entries and not dirs:
            self._record("tree", rev, 404)
            return self._error(404, "EntryNotFound", "%s does not exist on %s" % (sub, rev))
        listing = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                   for d in sorted(dirs)] + sorted(entries, key=lambda e: e["path"])
        cursor = int(query.get("cursor", ["0"])[0] or 0)
        page = listing[cursor:cursor + self.server.config.page_size]
        headers = {}
        if cursor + self.server.config.page_size < len(listing):
            host = self.headers.get("Host") or "%s:%d" % self.server.server_address[:2]
            nxt = "http://%s%s?recursive=%s&expand=false&cursor=%d" % (
                host, quote(urlsplit(self.path).path), str(recursive), cursor + self.server.config.page_size)
            headers["Link"] = '<%s>; rel="next"' % nxt
        self._record("tree", rev, 200)
        self._json(200, page, headers)

    def _file_headers(self, sha: str, meta: dict) -> dict:
        h = {"X-Repo-Commit": sha}
        if self.server.config.ranges:
            h["Accept-Ranges"] = "bytes"
        if "lfs" in meta:
            h["ETag"] = '"%s"' % meta["lfs"]["oid"]
            h["X-Linked-Etag"] = '"%s"' % meta["lfs"]["oid"]
            h["X-Linked-Size"] = str(meta["size"])
        else:
            h["ETag"] = '"%s"' % meta["oid"]
        return h

    def _resolve(self, repo_id: str, rev: str, rel: str):
        repo_dir = self._repo(repo_id, "resolve", rel)
        if repo_dir is None:
            return
        sha = self.server.store.resolve(repo_dir, rev)
        if sha is None:
            self._record("resolve", rel, 404)
            return self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
        meta = self.server.store.files(repo_dir, sha).get(rel)
        if meta is None:
            self._record("resolve", rel, 404)
            return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": sha})
        headers = self._file_headers(sha, meta)
        cfg = self.server.config
        if self.command == "GET" and cfg.error_status and fnmatch.fnmatch(rel, cfg.fault_glob):
            with self.server.lock:
                fire = cfg.error_times > 0
                if fire:
                    cfg.error_times -= 1
            if fire:
                self._record("resolve", rel, cfg.error_status)
                return self._error(cfg.error_status, None, "Injected failure")
        if self.server.config.lfs_redirect and "lfs" in meta:
            sig = hmac.new(self.server.secret, ("%s/%s/%s" % (repo_id, sha, rel)).encode(), "sha256").hexdigest()
            host = "localhost" if self.server.server_address[0] == "127.0.0.1" else "127.0.0.1"
            headers["Location"] = "http://%s:%d/_cdn/%s/%s/%s?sig=%s" % (host, self.server.port, repo_id, sha, quote(rel), sig)
            self._record("resolve", rel, 302)
            return self._send(302, b"", headers, ctype="text/plain")
        self._serve_file(os.path.join(repo_dir, sha, *rel.split("/")), rel, meta, headers, "resolve")

    def _cdn(self, repo_id: str, sha: str, rel: str, query: dict):
        repo_dir = self.server.store.repo_dir(repo_id)
        sig = hmac.new(self.server.secret, ("%s/%s/%s" % (repo_id, sha, rel)).encode(), "sha256").hexdigest()
        if repo_dir is None or not hmac.compare_digest(query.get("sig", [""])[0], sig):
            self._record("cdn", rel, 403)
            return self._error(403, None, "Signature mismatch")
        meta = self.server.store.files(repo_dir, sha)[rel]
        headers = {"ETag": '"%s"' % meta["lfs"]["oid"], "Accept-Ranges": "bytes"}
        self._serve_file(os.path.join(repo_dir, sha, *rel.split("/")), rel, meta, headers, "cdn")

    def _serve_file(self, full: str, rel: str, meta: dict, headers: dict, kind: str):
        size = meta["size"]
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range") if self.server.config.ranges else None
        if rng:
            m = re.match(r"^bytes=(\d*)-(\d*)$", rng.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                self._record(kind, rel, 416)
                return self._error(416, None, "Bad range", {"Content-Range": "bytes */%d" % size})
            if m.group(1) == "":  # suffix range: last N bytes
                start, end = max(0, size - int(m.group(2))), size - 1
            else:
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or start > end:
                self._record(kind, rel, 416)
                return self._error(416, None, "Range not satisfiable", {"Content-Range": "bytes */%d" % size})
            status = 206
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, end, size)
        length = end - start + 1 if size else 0
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            self._record(kind, rel, status)
            return
        cfg = self.server.config
        faulty = fnmatch.fnmatch(rel, cfg.fault_glob)
        die_at = -1
        if faulty and cfg.die_after_bytes >= 0:
            with self.server.lock:
                if cfg.die_times > 0:
                    cfg.die_times -= 1
                    die_at = cfg.die_after_bytes
        corrupt = False
        if faulty and cfg.corrupt_times > 0 and length:
            with self.server.lock:
                if cfg.corrupt_times > 0:
                    cfg.corrupt_times -= 1
                    corrupt = True
        rate = cfg.throttle_bps if faulty else 0
        sent = 0
        try:
            with open(full, "rb") as f:
                f.seek(start)
                if rate <= 0 and die_at < 0 and not corrupt:
                    sent = self.connection.sendfile(f, start, length) if length else 0
                    f.seek(start + sent)
                else:
                    t0 = time.monotonic()
                    chunk = min(cfg.chunk, max(4096, rate // 10)) if rate > 0 else cfg.chunk
                    while sent < length:
                        n = min(chunk, length - sent)
                        if die_at >= 0:
                            n = min(n, die_at - sent)
                        if n <= 0:
                            break
                        data = f.read(n)
                        if corrupt and sent == 0:
                            data = bytes([data[0] ^ 0xFF]) + data[1:]
                        self.wfile.write(data)
                        sent += len(data)
                        if rate > 0:
                            ahead = sent / rate - (time.monotonic() - t0)
                            if ahead > 0:
                                time.sleep(ahead)
                                rate = self.server.config.throttle_bps if faulty else 0
                                if rate <= 0:  # throttle lifted while sending
                                    chunk = cfg.chunk
                    if die_at >= 0 and sent < length:
                        self.wfile.flush()
                        with self.server.lock:
                            self.server._stats.dropped += 1
                        self._record(kind, rel, status, sent)
                        try:
                            self.connection.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                        raise _Drop()
        except (BrokenPipeError, ConnectionResetError):
            self._record(kind, rel, status, sent)
            raise
        self._record(kind, rel, status, sent)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Loopback Hugging Face Hub for tests")
    ap.add_argument("--root", required=True, help="directory of repos: <root>/<org>/<name>/<sha>/...")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    ap.add_argument("--publish", action="append", default=[], metavar="ORG/NAME=SRC_DIR",
                    help="publish SRC_DIR as ORG/NAME (ref main) before serving")
    ap.add_argument("--throttle-bps", type=int, default=0)
    ap.add_argument("--die-after-bytes", type=int, default=-1)
    ap.add_argument("--die-times", type=int, default=0)
    ap.add_argument("--fault-glob", default="*")
    ap.add_argument("--lfs-redirect", action="store_true")
    ap.add_argument("--page-size", type=int, default=1000)
    args = ap.parse_args(argv)
    published = []
    for spec in args.publish:
        repo_id, _sep, src = spec.partition("=")
        published.append((repo_id, publish_repo(src, args.root, repo_id)))
    cfg = ServerConfig(throttle_bps=args.throttle_bps, die_after_bytes=args.die_after_bytes,
                       die_times=args.die_times, fault_glob=args.fault_glob, lfs_redirect=args.lfs_redirect,
                       page_size=args.page_size)
    server = HubServer(args.root, args.host, args.port, cfg)
    print(server.port, flush=True)
    for repo_id, sha in published:
        print("published %s %s" % (repo_id, sha), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
