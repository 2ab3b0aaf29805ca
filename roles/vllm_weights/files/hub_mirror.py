# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""Serve verified model snapshots read-only over HTTP, in the shape of the Hugging Face Hub.

The fan-out source of the ``inferops.vllm.vllm_weights`` role runs this (as a transient systemd unit,
only for the duration of the fan-out) so that the other hosts fetch with ``hf_snapshot`` and
``endpoint: http://<source>:<port>`` exactly as they would from the Hub, with the same resume,
verification and progress - and no Hub token.

What it serves, from ``--root`` laid out as ``<root>/<org>/<name>/<sha>/`` (the role's layout):

* only snapshots that carry the ``.inferops-verified.json`` manifest written by ``hf_snapshot``; the
  file listing (sizes, git oids, sha256 of LFS files) comes from that manifest, i.e. from the Hub at
  download time, never from the files themselves;
* only files the manifest records as verified, and only while their size, mtime and inode are the
  ones recorded (a file rewritten since it was verified answers 410 Gone, which ``hf_snapshot`` does
  not retry, so a target fails naming it instead of copying a damaged file). With ``--staged`` (a
  directory copied from the host that verified it, where inodes cannot match) the size alone must
  match; either way the client verifies every file against the listing (size, or sha256);
* ``GET /api/models/<org>/<name>[/revision/<sha>]``, ``GET /api/models/<org>/<name>/tree/<sha>[/<path>]``,
  ``HEAD|GET /<org>/<name>/resolve/<sha>/<path>`` (``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``,
  ``X-Linked-Size``, ``Range`` -> 206) and ``GET /_mirror/stats``. Revisions are commit shas only.
  Copying hosts fetch large files in parallel ranges (``range_connections`` of ``hf_snapshot``),
  one thread per connection here, each answered with ``sendfile`` from the page cache.

With ``--relay`` (a host of a fan-out tree that is itself still copying the snapshot) it also serves a
snapshot while it arrives: the listing comes from the ``listing.json`` that ``hf_snapshot`` writes before its
first byte (the Hub's listing, as the manifest's), a finished file is served as it is, and a file still
arriving is served from its partial file as far as its ``.fill`` sidecar (written by
``module_utils/range_fetch.py`` after the bytes) says the bytes are there, waiting for the rest. A request
for something that has not arrived yet waits up to ``--stall-timeout`` seconds without progress; the
client verifies every file against the listing whatever it was served from.

Clients outside ``--allow`` (addresses or networks; none given = everyone) get 403. Nothing is
written and no path from a URL reaches the file system except through the manifest's keys.

usage: python hub_mirror.py --root DIR [--bind ADDR] [--port N] [--allow ADDR|CIDR ...] [--staged]
                            [--relay [--stall-timeout S]]
"""
from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import re
import signal
import socket
import stat
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

MANIFEST_NAME = ".inferops-verified.json"
MANIFEST_FORMAT = 1
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
CHUNK = 1 << 20
# Written by hf_snapshot (module_utils/hf_snapshot.py, range_fetch.py) while a snapshot arrives.
LISTING_NAME = os.path.join(".cache", "inferops", "listing.json")
PARTIAL_DIR = os.path.join(".cache", "inferops", "partial")
PARTIAL_SUFFIX = ".part"
FILL_SUFFIX = ".fill"
FILL_MAGIC = b"IOPSFIL1"
FILL_HEADER = struct.Struct("<8sQQ")  # magic, file size, chunk size; then one u64 per chunk
FILL_SLOT = struct.Struct("<Q")
RELAY_POLL_S = 0.02


def lfs_pointer_size(sha256, size):
    """Length of the git-lfs pointer file the Hub stores for an LFS file (its listing reports it)."""
    return len("version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256, size))


class Fill(object):
    """The ``.fill`` sidecar of a file still arriving (range_fetch writes it): what has arrived, where.

    The sidecar holds a header (magic, file size, chunk size), then per chunk the bytes written from the
    chunk's start, updated after the bytes themselves. The header is read once, here; ValueError when the
    fd is not a fill file.
    """

    def __init__(self, fd):
        head = os.pread(fd, FILL_HEADER.size, 0)
        if len(head) != FILL_HEADER.size:
            raise ValueError("short fill header")
        magic, self.size, self.chunk = FILL_HEADER.unpack(head)
        if magic != FILL_MAGIC or self.chunk <= 0:
            raise ValueError("not a fill file")
        self.fd = fd

    def available(self, off):
        """Bytes readable at ``off`` without a gap; 0 when the byte at ``off`` has not arrived."""
        if off >= self.size:
            return 0
        i = off // self.chunk
        raw = os.pread(self.fd, FILL_SLOT.size, FILL_HEADER.size + FILL_SLOT.size * i)
        if len(raw) != FILL_SLOT.size:
            return 0
        return max(0, i * self.chunk + min(FILL_SLOT.unpack(raw)[0], self.chunk) - off)


def load_manifest(snapshot_dir, repo_id, sha, name=MANIFEST_NAME):
    """The hf_snapshot manifest (or, with ``name``, listing) of this snapshot; None when absent or not for it."""
    try:
        with open(os.path.join(snapshot_dir, name)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        return None
    if doc.get("repo_id") != repo_id or doc.get("sha") != sha:
        return None
    if not isinstance(doc.get("tree"), dict) or not isinstance(doc.get("files"), dict):
        return None
    return doc


def tree_entry(path, meta):
    entry = {"type": "file", "path": path, "size": int(meta["size"]), "oid": meta.get("oid")}
    if meta.get("sha256"):
        entry["lfs"] = {"oid": meta["sha256"], "size": int(meta["size"]),
                        "pointerSize": lfs_pointer_size(meta["sha256"], int(meta["size"]))}
    return entry


class Pacer(object):
    """Caps the mirror's sending rate over all its connections (``--max-rate``; 0 = no cap)."""

    SLICE = 256 << 10

    def __init__(self, rate_bytes_s=0.0):
        self.rate = float(rate_bytes_s)
        self.lock = threading.Lock()
        self.next = 0.0

    def take(self, n):
        """Wait for the turn of ``n`` more bytes."""
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            at = max(now, self.next)
            self.next = at + n / self.rate
        if at > now:
            time.sleep(at - now)


class Stats(object):
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.files = 0
        self.bytes_sent = 0
        self.clients = {}
        self.refused = 0
        self.relayed_bytes = 0
        self.relay_waits = 0
        self.started = time.time()

    def add(self, client, sent, file_body, first=True, relayed=0, waited=False):
        with self.lock:
            self.relayed_bytes += relayed
            self.relay_waits += 1 if waited else 0
            self.requests += 1
            self.bytes_sent += sent
            if file_body:  # clients: model file bytes per client address
                self.files += 1 if first else 0  # a file fetched in ranges counts once (its first byte)
                self.clients[client] = self.clients.get(client, 0) + sent

    def as_dict(self):
        with self.lock:
            return {"requests": self.requests, "files_sent": self.files, "bytes_sent": self.bytes_sent,
                    "clients": dict(self.clients), "refused": self.refused,
                    "relayed_bytes": self.relayed_bytes, "relay_waits": self.relay_waits,
                    "uptime_s": round(time.time() - self.started, 1)}


class MirrorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, root, bind="127.0.0.1", port=0, allow=None, quiet=False, staged=False, relay=False,
                 stall_timeout=120.0, max_rate=0.0):
        self.root = os.path.realpath(root)
        self.pacer = Pacer(max_rate)
        self.staged = staged
        self.relay = relay
        self.stall_timeout = float(stall_timeout)
        self.allow = [ipaddress.ip_network(a, strict=False) for a in (allow or [])]
        self.stats = Stats()
        self.quiet = quiet
        if bind and ":" in bind:
            self.address_family = socket.AF_INET6
        ThreadingHTTPServer.__init__(self, (bind, port), MirrorHandler)

    @property
    def port(self):
        return self.server_address[1]

    def allowed(self, client):
        if not self.allow:
            return True
        try:
            addr = ipaddress.ip_address(client.split("%")[0])
        except ValueError:
            return False
        if addr.version == 6 and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return addr.is_loopback or any(addr in net for net in self.allow if net.version == addr.version)

    def snapshot(self, org, name, sha):
        """(snapshot dir, manifest or listing, arriving) for a repo and sha, or (None, None, False).

        ``arriving``: the snapshot is still being fetched on this host (``--relay`` only); the document is then
        the listing hf_snapshot wrote before its first byte.
        """
        if not (NAME_RE.match(org) and NAME_RE.match(name) and SHA_RE.match(sha)):
            return None, None, False
        snap = os.path.join(self.root, org, name, sha)
        if not os.path.isdir(snap):
            return None, None, False
        doc = load_manifest(snap, "%s/%s" % (org, name), sha)
        if doc is None and self.relay:
            doc = load_manifest(snap, "%s/%s" % (org, name), sha, LISTING_NAME)
            return snap, doc, doc is not None
        return snap, doc, False

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client that hung up (killed download, dropped link) is not our error
        ThreadingHTTPServer.handle_error(self, request, client_address)


class MirrorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "inferops-hub-mirror/1"

    def log_message(self, format, *args):  # noqa: A002 - the stdlib's signature
        if not self.server.quiet:
            sys.stderr.write("%s %s\n" % (self.client_address[0], format % args))

    # ---- plumbing -------------------------------------------------------------------------
    def _send(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.server.stats.add(self.client_address[0], 0 if self.command == "HEAD" else len(body), False)

    def _json(self, status, data, headers=None):
        self._send(status, json.dumps(data).encode(), headers)

    def _error(self, status, code, message, headers=None):
        h = dict(headers or {})
        if code:
            h["X-Error-Code"] = code
        h["X-Error-Message"] = message
        self._json(status, {"error": message}, h)

    # ---- routing ----------------------------------------------------------------------------
    def do_GET(self):
        self._dispatch()

    def do_HEAD(self):
        self._dispatch()

    def _refuse_method(self):
        self._error(405, None, "read-only mirror")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method

    def _dispatch(self):
        if not self.server.allowed(self.client_address[0]):
            with self.server.stats.lock:
                self.server.stats.refused += 1
            return self._error(403, None, "client %s is not allowed by this mirror" % self.client_address[0])
        try:
            parts = urlsplit(self.path)
            path, query = unquote(parts.path), parse_qs(parts.query)
            if path == "/_mirror/stats":
                return self._json(200, self.server.stats.as_dict())
            m = re.match(r"^/api/models/([^/]+)/([^/]+)(?:/revision/([^/]+))?/?$", path)
            if m:
                return self._model_info(m.group(1), m.group(2), m.group(3), query)
            m = re.match(r"^/api/models/([^/]+)/([^/]+)/tree/([^/]+)(?:/(.*))?$", path)
            if m:
                return self._tree(m.group(1), m.group(2), m.group(3), (m.group(4) or "").strip("/"))
            m = re.match(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$", path)
            if m:
                return self._resolve(m.group(1), m.group(2), m.group(3), m.group(4))
            self._error(404, None, "Not found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _lookup(self, org, name, rev):
        """(snapshot dir, manifest or listing, arriving) for org/name@rev, or None after sending the Hub's error.

        A relay waits up to its stall timeout for a snapshot that has not started arriving: the host that
        copies from it starts at the same time as it does.
        """
        names_ok = bool(NAME_RE.match(org) and NAME_RE.match(name))
        rev_ok = rev is not None and bool(SHA_RE.match(rev))
        deadline = time.monotonic() + (self.server.stall_timeout if self.server.relay else 0)
        while True:
            repo_ok = names_ok and os.path.isdir(os.path.join(self.server.root, org, name))
            snap, manifest, arriving = self.server.snapshot(org, name, rev) if repo_ok and rev_ok else (None, None, False)
            if manifest is not None or not (names_ok and rev_ok) or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not repo_ok:
            self._error(404, "RepoNotFound", "Repository not found on this mirror")
            return None
        if not rev_ok:
            self._error(404, "RevisionNotFound", "Invalid rev id: %s (this mirror serves commit shas only)" % rev)
            return None
        if manifest is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: %s (no verified snapshot of %s/%s on this mirror)"
                        % (rev, org, name))
            return None
        return snap, manifest, arriving

    def _model_info(self, org, name, rev, query):
        found = self._lookup(org, name, rev)
        if found is None:
            return
        _snap, manifest, _arriving = found
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for path, meta in sorted(manifest["tree"].items()):
            s = {"rfilename": path}
            if blobs:
                s.update({"size": int(meta["size"]), "blobId": meta.get("oid")})
                if meta.get("sha256"):
                    s["lfs"] = {"sha256": meta["sha256"], "size": int(meta["size"]),
                                "pointerSize": lfs_pointer_size(meta["sha256"], int(meta["size"]))}
            siblings.append(s)
        repo_id = "%s/%s" % (org, name)
        self._json(200, {"_id": hashlib.md5(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
                         "author": org, "sha": rev, "private": False, "gated": False, "disabled": False,
                         "tags": [], "siblings": siblings})

    def _tree(self, org, name, rev, sub):
        found = self._lookup(org, name, rev)
        if found is None:
            return
        _snap, manifest, _arriving = found
        prefix = sub + "/" if sub else ""
        entries = [tree_entry(p, meta) for p, meta in sorted(manifest["tree"].items()) if p.startswith(prefix)]
        if sub and not entries:
            return self._error(404, "EntryNotFound", "%s does not exist on %s" % (sub, rev))
        dirs = set()
        for e in entries:
            segs = e["path"].split("/")
            dirs.update("/".join(segs[:i]) for i in range(1, len(segs)))
        dirs = sorted(d for d in dirs if d.startswith(prefix))
        listing = [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0}
                   for d in dirs] + entries
        self._json(200, listing)

    def _resolve(self, org, name, rev, rel):
        found = self._lookup(org, name, rev)
        if found is None:
            return
        snap, manifest, arriving = found
        meta = manifest["tree"].get(rel)
        record = manifest["files"].get(rel)
        if meta is None:
            return self._error(404, "EntryNotFound", "%s is not in %s/%s@%s" % (rel, org, name, rev),
                               {"X-Repo-Commit": rev})
        if record is None:
            return self._error(404, "EntryNotFound", "%s is in the repository but was not fetched to this mirror "
                               "(the source's allow_patterns/ignore_patterns exclude it)" % rel, {"X-Repo-Commit": rev})
        full = os.path.join(snap, *rel.split("/"))
        if not os.path.realpath(full).startswith(os.path.realpath(snap) + os.sep):
            return self._error(404, "EntryNotFound", "%s is outside the snapshot" % rel, {"X-Repo-Commit": rev})
        if arriving:
            return self._relay(snap, rel, full, meta, rev)
        try:
            fd = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return self._error(410, None, "%s was verified on the source but is gone; re-run the fetch on the source"
                               % rel, {"X-Repo-Commit": rev})
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            recorded = (record.get("size"), record.get("mtime_ns"), record.get("ino"))
            if st.st_size != int(meta["size"]) or (
                    not self.server.staged and (st.st_size, st.st_mtime_ns, st.st_ino) != recorded):
                return self._error(410, None, "%s changed on the source since it was verified; re-run the fetch on the "
                                   "source" % rel, {"X-Repo-Commit": rev})
            self._serve(f, st.st_size, meta, rev)

    def _open_arriving(self, snap, rel, full, size):
        """(file, Fill or None) of a file of a snapshot still arriving, or None when it has not started.

        The partial file with its fill sidecar while it arrives; the file in place once it has (the fetch renames
        the partial file into place only after it verified it, so a fd opened on either stays valid).
        """
        part = os.path.join(snap, PARTIAL_DIR, *rel.split("/")) + PARTIAL_SUFFIX
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(part, flags)
        except OSError:
            fd = None
        if fd is not None:
            try:
                fill = os.open(part + FILL_SUFFIX, os.O_RDONLY)
            except OSError:
                fill = None
            if fill is not None:
                try:
                    sidecar = Fill(fill)
                    if sidecar.size == size:
                        return os.fdopen(fd, "rb"), sidecar
                except (OSError, ValueError):
                    pass
                os.close(fill)
            os.close(fd)
        try:
            fd = os.open(full, flags)
        except OSError:
            return None
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_size == size:
            return os.fdopen(fd, "rb"), None
        os.close(fd)
        return None

    def _relay(self, snap, rel, full, meta, rev):
        """Serve a file of a snapshot still arriving on this host: as far as it has arrived, then as it arrives."""
        size = int(meta["size"])
        if self.command == "HEAD":  # the listing answers; the client's GET waits for the bytes
            return self._serve(None, size, meta, rev)
        deadline = time.monotonic() + self.server.stall_timeout
        opened = self._open_arriving(snap, rel, full, size)
        waited = opened is None
        while opened is None:
            if time.monotonic() >= deadline:
                return self._error(503, None, "%s has not started arriving on this relay in %d s; its own fetch "
                                   "is stalled or failed" % (rel, self.server.stall_timeout), {"X-Repo-Commit": rev})
            time.sleep(0.2)
            opened = self._open_arriving(snap, rel, full, size)
        f, fill = opened
        try:
            with f:
                self._serve(f, size, meta, rev, fill, waited)
        finally:
            if fill is not None:
                os.close(fill.fd)

    def _send_arriving(self, f, fill, start, length):
        """Send ``length`` bytes from ``start`` as the fill says they have arrived; returns (sent, waited)."""
        off, end, waited = start, start + length, False
        last = time.monotonic()
        while off < end:
            avail = min(fill.available(off), end - off)
            if avail <= 0:
                if time.monotonic() - last >= self.server.stall_timeout:
                    self.close_connection = True  # the client sees a short body and resumes from its last byte
                    break
                waited = True
                time.sleep(RELAY_POLL_S)
                continue
            n = self._sendfile(f, off, avail)
            if not n:
                break
            off += n
            last = time.monotonic()
        return off - start, waited

    def _sendfile(self, f, off, count):
        """sendfile ``count`` bytes from ``off``, paced by ``--max-rate``; returns the bytes sent."""
        pacer = self.server.pacer
        if pacer.rate <= 0:
            return self.connection.sendfile(f, off, count)
        sent = 0
        while sent < count:
            n = min(pacer.SLICE, count - sent)
            pacer.take(n)
            got = self.connection.sendfile(f, off + sent, n)
            if not got:
                break
            sent += got
        return sent

    def _serve(self, f, size, meta, rev, fill=None, waited=False):
        headers = {"X-Repo-Commit": rev, "Accept-Ranges": "bytes"}
        if meta.get("sha256"):
            headers["ETag"] = '"%s"' % meta["sha256"]
            headers["X-Linked-Etag"] = '"%s"' % meta["sha256"]
            headers["X-Linked-Size"] = str(size)
        else:
            headers["ETag"] = '"%s"' % meta.get("oid")
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.match(r"^bytes=(\d*)-(\d*)$", rng.strip())
            if not m or (m.group(1) == "" and m.group(2) == ""):
                return self._error(416, None, "Bad range", {"Content-Range": "bytes */%d" % size})
            if m.group(1) == "":
                start, end = max(0, size - int(m.group(2))), size - 1
            else:
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or start > end:
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
            self.server.stats.add(self.client_address[0], 0, False)
            return
        self.wfile.flush()
        sent = 0
        try:
            if length and fill is not None:
                sent, more = self._send_arriving(f, fill, start, length)
                waited = waited or more
            elif length:
                sent = self._sendfile(f, start, length)
        finally:
            self.server.stats.add(self.client_address[0], sent, True, first=start == 0,
                                  relayed=sent if fill is not None else 0, waited=waited)


def notify_ready(env=None):
    """Tell systemd the mirror serves (sd_notify READY=1) when it runs as a Type=notify unit; False otherwise.

    The role starts the mirror that way, after it has bound its port: systemd-run returns only once the unit's own main
    process said so (NotifyAccess=main), and fails when the process exits first (the port was taken). So a squatter
    that holds the port before the mirror starts makes the start fail, and none can take it after.
    """
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(path)
        sock.sendall(b"READY=1")
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description="Serve verified model snapshots read-only, Hub-compatible")
    ap.add_argument("--root", required=True, help="models directory: <root>/<org>/<name>/<sha>/")
    ap.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    ap.add_argument("--allow", action="append", default=[], metavar="ADDR|CIDR",
                    help="clients allowed (repeatable; loopback always is); none = every client")
    ap.add_argument("--quiet", action="store_true", help="no line per request on stderr")
    ap.add_argument("--staged", action="store_true",
                    help="ROOT holds copies of verified snapshots: serve files whose size matches the listing")
    ap.add_argument("--relay", action="store_true",
                    help="also serve snapshots still arriving on this host (a fan-out tree's inner hosts)")
    ap.add_argument("--stall-timeout", type=float, default=120.0, metavar="S",
                    help="with --relay: longest wait without progress for a snapshot or bytes (default 120)")
    ap.add_argument("--max-rate", type=float, default=0.0, metavar="MIB_S",
                    help="cap on the bytes sent per second over all clients, in MiB/s (default 0: no cap)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.root):
        sys.stderr.write("hub_mirror: --root %s is not a directory\n" % args.root)
        return 2
    try:
        server = MirrorServer(args.root, args.bind, args.port, args.allow, args.quiet, args.staged, args.relay,
                              args.stall_timeout, args.max_rate * (1 << 20))
    except (OSError, ValueError) as e:
        sys.stderr.write("hub_mirror: cannot serve on %s:%s: %s\n" % (args.bind, args.port, e))
        return 2

    def stop(_signum, _frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stdout.write("%d\n" % server.port)
    sys.stdout.flush()
    notify_ready()
    sys.stderr.write("hub_mirror: serving %s on %s:%d, clients %s\n"
                     % (server.root, args.bind, server.port, ", ".join(args.allow) or "any"))
    try:
        server.serve_forever()
    finally:
        server.server_close()
        sys.stderr.write("hub_mirror: stopped; %s\n" % json.dumps(server.stats.as_dict(), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
