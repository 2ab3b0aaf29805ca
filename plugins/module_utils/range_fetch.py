# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
"""Fetch one file over HTTP with parallel Range requests, hashed in the same pass, resumable per chunk.

Used by ``hf_snapshot`` (module_utils/hf_snapshot.py) against Hub-compatible endpoints that accept
``Range`` (the role's fan-out mirror, ``hubserver``, plain mirrors), instead of huggingface_hub's
single-stream HTTP. Standard library only (Python >= 3.9).

How a file is fetched (details and measurements in docs/weights.md):

* The file is cut into chunks of ``chunk`` bytes; ``connections`` threads each keep one persistent
  HTTP/1.1 connection and take the next chunk in file order, ``GET`` it with ``Range``, ``readinto``
  a reused buffer and ``os.pwrite`` it at its offset into a preallocated ``.part`` file.
* sha256 is sequential, so one hasher thread follows the contiguous written prefix of the file and
  hashes it from the page cache (``os.preadv`` into a reused buffer; hashlib releases the GIL on big
  buffers). Chunks are handed out in order, so the hasher is never more than about
  ``connections x chunk`` bytes behind: the bytes it reads are still in the page cache, and the
  digest is ready when the last byte lands - no second read of the file.
* A sidecar ``.part.json`` records finished chunks (written after their bytes). A later process
  resumes with only the missing chunks; the hasher re-reads the finished prefix from disk (no
  network). A dropped connection is retried from the last byte written, within the chunk.
* A sidecar ``.part.fill`` (binary: a header, then one little-endian u64 per chunk, the bytes written
  from the chunk's start) is updated after every write. It lets a fan-out mirror on this host relay
  the file to the next host while it is still arriving (roles/vllm_weights/files/hub_mirror.py,
  ``--relay``), which reads it.
* A 200 answer to a Range request, a redirect, or a wrong ``Content-Range`` raises
  :class:`RangeUnsupported`: the caller falls back to huggingface_hub.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import struct
import threading
import time

import http.client as httplib
from urllib.parse import quote, urlsplit

STATE_FORMAT = 1
READ_BUF = 1 << 20
HASH_BUF = 4 << 20
CONTENT_RANGE_RE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
NO_RETRY_HTTP = (400, 401, 403, 404, 410, 416)
FILL_MAGIC = b"IOPSFIL1"
FILL_HEADER = struct.Struct("<8sQQ")  # magic, file size, chunk size
FILL_SLOT = struct.Struct("<Q")
FILL_SUFFIX = ".fill"


class RangeUnsupported(Exception):
    """The endpoint does not serve this file with byte ranges (fall back to the library)."""


class HTTPStatusError(Exception):
    """An HTTP error answer; ``status`` and the server's ``X-Error-Message`` if any."""

    def __init__(self, status, message, url):
        super(HTTPStatusError, self).__init__("HTTP %d from %s: %s" % (status, url, message))
        self.status = status
        self.message = message
        self.response = _Resp(status)  # shaped like requests/httpx errors for hf_snapshot.is_fatal


class _Resp(object):
    def __init__(self, status):
        self.status_code = status


class TransferError(Exception):
    """The transfer failed after the retries (the last error is in ``__cause__``)."""


def plan_chunks(size, chunk):
    """[(index, start, end_exclusive)] covering [0, size) in order; none for an empty file."""
    chunk = max(1, int(chunk))
    return [(i, start, min(size, start + chunk)) for i, start in enumerate(range(0, size, chunk))]


def file_url(endpoint, repo_id, sha, rel):
    return "%s/%s/resolve/%s/%s" % (endpoint.rstrip("/"), repo_id, sha, quote(rel))


class Conn(object):
    """One persistent HTTP/1.1 connection to the endpoint's origin."""

    def __init__(self, url, timeout, headers):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise RangeUnsupported("scheme %s" % parts.scheme)
        self.scheme, self.netloc = parts.scheme, parts.netloc
        self.path = parts.path + ("?" + parts.query if parts.query else "")
        self.timeout = timeout
        self.headers = dict(headers)
        self.conn = None

    def _connect(self):
        if self.scheme == "https":
            import ssl
            self.conn = httplib.HTTPSConnection(self.netloc, timeout=self.timeout,
                                                context=ssl.create_default_context())
        else:
            self.conn = httplib.HTTPConnection(self.netloc, timeout=self.timeout)

    def request(self, method, extra=None):
        if self.conn is None:
            self._connect()
        h = dict(self.headers)
        h.update(extra or {})
        try:
            self.conn.request(method, self.path, headers=h)
            return self.conn.getresponse()
        except Exception:
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass
            self.conn = None


def _error_message(resp):
    msg = resp.getheader("X-Error-Message") or resp.reason or ""
    try:
        resp.read()
    except Exception:  # noqa: BLE001
        pass
    return msg


def probe(url, size, headers, timeout, sha=None):
    """HEAD the file: {'ranged': bool, 'reason': str}. Never follows a redirect."""
    c = Conn(url, timeout, headers)
    try:
        resp = c.request("HEAD")
        resp.read()
        status = resp.status
        if 300 <= status < 400:
            return {"ranged": False, "reason": "the endpoint redirects the file (HTTP %d)" % status}
        if status != 200:
            raise HTTPStatusError(status, resp.getheader("X-Error-Message") or resp.reason or "", url)
        if resp.getheader("X-Xet-Hash"):
            return {"ranged": False, "reason": "the endpoint serves the file through Xet"}
        if (resp.getheader("Accept-Ranges") or "").strip().lower() != "bytes":
            return {"ranged": False, "reason": "the endpoint does not announce Accept-Ranges: bytes"}
        commit = resp.getheader("X-Repo-Commit")
        if sha and commit and commit != sha:
            return {"ranged": False, "reason": "the endpoint answers for commit %s, not %s" % (commit, sha)}
        length = resp.getheader("X-Linked-Size") or resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) != size:
            return {"ranged": False, "reason": "the endpoint reports %s bytes, the listing %d" % (length, size)}
        return {"ranged": True, "reason": ""}
    finally:
        c.close()


class _State(object):
    """Chunks finished, kept in ``<part>.json`` next to the partial file."""

    def __init__(self, path, key):
        self.path = path
        self.key = key
        self.done = set()
        self.lock = threading.Lock()
        self.save_lock = threading.Lock()  # one writer at a time: an older list never replaces a newer one

    def load(self):
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return False
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or doc.get("key") != self.key:
            return False
        self.done = set(int(i) for i in doc.get("done", []))
        return True

    def save(self):
        with self.save_lock:
            with self.lock:
                doc = {"format": STATE_FORMAT, "key": self.key, "done": sorted(self.done)}
            tmp = "%s.tmp.%d" % (self.path, os.getpid())
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)

    def mark(self, index):
        with self.lock:
            self.done.add(index)
        self.save()


def remove_partial(part_path):
    for p in (part_path, part_path + ".json", part_path + FILL_SUFFIX):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def partial_bytes(part_path, size):
    """Bytes of disk a partial file already holds (it is reused, so they need no new space)."""
    try:
        st = os.stat(part_path)
    except OSError:
        return 0
    return min(size, getattr(st, "st_blocks", 0) * 512)


def _open_state(part_path, size, chunk, expected):
    """The chunk state of ``part_path`` and whether it resumes; a partial file that cannot resume is removed."""
    state = _State(part_path + ".json", {"size": size, "chunk": int(chunk), "expected": expected})
    resumed = False
    if os.path.exists(part_path) and state.load():
        try:
            resumed = os.path.getsize(part_path) == size
        except OSError:
            resumed = False
    if not resumed:
        remove_partial(part_path)
        state.done = set()
    return state, resumed


def _open_part(part_path):
    """Open the partial file for reading and writing (creating it and its directory); returns the fd."""
    d = os.path.dirname(part_path)
    if d and not os.path.isdir(d):
        os.makedirs(d, exist_ok=True)
    return os.open(part_path, os.O_RDWR | os.O_CREAT, 0o644)


def _open_fill(part_path, size, chunk, written):
    """Create ``<part>.fill`` afresh with the bytes written of each chunk; returns its fd (None if it cannot)."""
    path = part_path + FILL_SUFFIX
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = None
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, FILL_HEADER.pack(FILL_MAGIC, size, int(chunk)) + b"".join(FILL_SLOT.pack(w) for w in written))
        os.replace(tmp, path)
        return fd
    except OSError:  # the relay is an extra: a fetch without it still works
        if fd is not None:
            os.close(fd)
        try:
            os.remove(tmp)
        except OSError:
            pass
        return None


def _preallocate(fd, size):
    """Reserve ``size`` bytes for the file, with ftruncate where fallocate is unsupported (never on a full disk)."""
    try:
        os.posix_fallocate(fd, 0, size) if size else None
    except (AttributeError, OSError) as e:
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            raise
        os.ftruncate(fd, size)


def _final_error(exc):
    """The exception that ``fetch`` raises for the first failure of a thread."""
    if isinstance(exc, (RangeUnsupported, HTTPStatusError)):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        return exc
    return TransferError("%s: %s" % (type(exc).__name__, exc))


class _Transfer(object):
    """One ``fetch`` in flight: the chunks, the bytes written of each, the connection threads and the hasher."""

    def __init__(self, url, part_path, fd, size, chunks, state, stats, headers, chunk, timeout, retries, backoff,
                 on_bytes, on_retry, sleep, stop):
        """Take the fetch's options; chunks already in ``state`` count as written, the others are pending."""
        self.url, self.part_path, self.fd, self.size = url, part_path, fd, size
        self.chunks, self.state, self.stats = chunks, state, stats
        self.headers, self.chunk, self.timeout = headers, chunk, timeout
        self.retries, self.backoff, self.sleep, self.stop = retries, backoff, sleep, stop
        self.on_bytes, self.on_retry = on_bytes, on_retry
        self.fill_fd = None  # set by fetch() once ``written`` is known (the sidecar starts from it)
        self.written = [0] * len(chunks)  # bytes written from each chunk's start
        for i in state.done:
            if 0 <= i < len(chunks):
                self.written[i] = chunks[i][2] - chunks[i][1]
        self.pending = [c for c in chunks if c[0] not in state.done]
        self.pending.reverse()  # pop() from the end hands them out in file order
        self.cond = threading.Condition()
        self.failure = []
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.result = {}

    # ---- the hasher: follows the contiguous written prefix ---------------------------------
    def _frontier(self):
        """The end of the contiguous prefix of the file written so far (call with ``cond`` held)."""
        off = 0
        for (i, start, end) in self.chunks:
            w = self.written[i]
            if w < end - start:
                return start + w
            off = end
        return off

    def _hash_loop(self, h):
        """Hash the written prefix into ``h`` as it grows; the hex digest goes to ``result``."""
        buf = bytearray(HASH_BUF)
        view = memoryview(buf)
        done_to = 0
        try:
            while done_to < self.size:
                with self.cond:
                    while True:
                        top = self._frontier()
                        if top > done_to or self.halt.is_set():
                            break
                        self.cond.wait(0.5)
                if self.halt.is_set():
                    return
                while done_to < top:
                    n = os.preadv(self.fd, [view[:min(HASH_BUF, top - done_to)]], done_to)
                    if n <= 0:
                        raise IOError("short read of %s at %d" % (self.part_path, done_to))
                    h.update(view[:n])
                    done_to += n
            self.result["digest"] = h.hexdigest()
        except Exception as e:  # noqa: BLE001
            self.failure.append(e)
            self.halt.set()

    def _start_hasher(self, kind):
        """Start the hasher thread for ``kind``; None without a kind."""
        if not kind:
            return None
        h = hashlib.sha1(b"blob %d\0" % self.size) if kind == "git-sha1" else hashlib.sha256()
        hasher = threading.Thread(target=self._hash_loop, args=(h,), name="range_fetch-hash")
        hasher.daemon = True
        hasher.start()
        return hasher

    # ---- the connections ----------------------------------------------------------------
    def _take(self):
        """The next pending chunk in file order, or None."""
        with self.lock:
            return self.pending.pop() if self.pending else None

    def _check_response(self, conn, resp, off, end):
        """Raise unless ``resp`` is the 206 answer for bytes ``off``..``end - 1`` of the file."""
        if resp.status == 200 or 300 <= resp.status < 400:
            conn.close()
            raise RangeUnsupported("the endpoint answered a Range request with HTTP %d" % resp.status)
        if resp.status != 206:
            msg = _error_message(resp)
            raise HTTPStatusError(resp.status, msg, self.url)
        m = CONTENT_RANGE_RE.match((resp.getheader("Content-Range") or "").strip())
        if not m or int(m.group(1)) != off or int(m.group(2)) != end - 1 or (
                m.group(3) != "*" and int(m.group(3)) != self.size):
            conn.close()
            raise RangeUnsupported("the endpoint answered bytes=%d-%d with Content-Range %r"
                                   % (off, end - 1, resp.getheader("Content-Range")))

    def _write_body(self, conn, resp, buf, view, index, off, end):
        """Read the answer's body through ``buf`` and write it at ``off``, counting it in ``written``."""
        left = end - off
        while left:
            if self.halt.is_set():
                conn.close()
                return
            want = min(left, len(buf))
            n = resp.readinto(view[:want])
            if not n:
                raise httplib.IncompleteRead(b"", left)
            p = 0
            while p < n:
                p += os.pwrite(self.fd, view[p:n], off + p)
            off += n
            left -= n
            with self.cond:
                self.written[index] += n
                w = self.written[index]
                self.cond.notify_all()
            if self.fill_fd is not None:  # after the bytes: a reader of the fill never sees a byte not written
                os.pwrite(self.fill_fd, FILL_SLOT.pack(w), FILL_HEADER.size + FILL_SLOT.size * index)
            with self.lock:
                self.stats["fetched_bytes"] += n
            if self.on_bytes is not None:
                self.on_bytes(n)

    def _pause(self, err, attempt):
        """Count a retry of a request that failed with ``err``, tell ``on_retry`` and sleep the backoff."""
        delay = min(60.0, self.backoff * (2 ** attempt))
        with self.lock:
            self.stats["retries"] += 1
        if self.on_retry is not None:
            self.on_retry(err, attempt + 1, delay)
        self.sleep(delay)

    def _get_chunk(self, conn, buf, view, index, start, end):
        """Fetch the rest of one chunk over ``conn``, from its last byte written, retrying transient errors."""
        attempt = 0
        while True:
            off = start + self.written[index]
            if off >= end:
                return
            try:
                with self.lock:
                    self.stats["requests"] += 1
                resp = conn.request("GET", {"Range": "bytes=%d-%d" % (off, end - 1)})
                self._check_response(conn, resp, off, end)
                self._write_body(conn, resp, buf, view, index, off, end)
                return
            except RangeUnsupported:
                raise
            except HTTPStatusError as e:
                conn.close()
                if e.status in NO_RETRY_HTTP or attempt >= self.retries:
                    raise
                err = e
            except OSError as e:
                conn.close()
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES) or attempt >= self.retries:
                    raise
                err = e
            except (httplib.HTTPException, ValueError) as e:
                conn.close()
                if attempt >= self.retries:
                    raise
                err = e
            self._pause(err, attempt)
            attempt += 1

    def _worker(self):
        """One connection thread: take chunks in order until none is left, a failure or ``stop``."""
        conn = Conn(self.url, self.timeout, self.headers)
        buf = bytearray(min(READ_BUF, max(1, int(self.chunk))))
        view = memoryview(buf)
        try:
            while not self.halt.is_set() and (self.stop is None or not self.stop.is_set()):
                c = self._take()
                if c is None:
                    return
                index, start, end = c
                self._get_chunk(conn, buf, view, index, start, end)
                if self.written[index] == end - start:
                    self.state.mark(index)
        except Exception as e:  # noqa: BLE001
            self.failure.append(e)
            self.halt.set()
            with self.cond:
                self.cond.notify_all()
        finally:
            conn.close()

    def run(self, kind, connections):
        """Fetch the pending chunks on up to ``connections`` threads while hashing; raises the first failure."""
        n_conn = max(1, min(int(connections), len(self.pending))) if self.pending else 0
        self.stats["connections"] = n_conn
        hasher = self._start_hasher(kind)
        threads = [threading.Thread(target=self._worker, name="range_fetch-%d" % k) for k in range(n_conn)]
        for t in threads:
            t.daemon = True
            t.start()
        for t in threads:
            t.join()
        if self.stop is not None and self.stop.is_set() and not self.failure:
            self.failure.append(TransferError("stopped"))
        if self.failure:
            self.halt.set()
        if hasher is not None:
            with self.cond:
                self.cond.notify_all()
            hasher.join()
        if self.failure:
            raise _final_error(self.failure[0])


def fetch(url, part_path, size, kind, expected, headers=None, connections=4, chunk=64 << 20, timeout=10.0,
          retries=5, backoff=2.0, on_bytes=None, on_resumed=None, on_retry=None, sleep=time.sleep, stop=None):
    """Fetch ``url`` (``size`` bytes) into ``part_path`` with parallel ranges; returns a stats dict.

    ``kind``: 'sha256', 'git-sha1' (git blob id) or None (no hash). The returned ``digest`` is the
    hex digest of the bytes written (None without ``kind``); the caller compares it with ``expected``
    and renames the part file into place. ``expected`` (with size and chunk) keys the state file: a
    partial file of another content or layout is discarded, never resumed. ``on_retry(exc, attempt,
    delay)`` is told of every retried request.
    """
    headers = dict(headers or {})
    chunks = plan_chunks(size, chunk)
    state, resumed = _open_state(part_path, size, chunk, expected)
    fd = _open_part(part_path)
    fill_fd = None
    stats = {"connections": 0, "chunks": len(chunks), "chunk_bytes": int(chunk), "resumed_bytes": 0,
             "fetched_bytes": 0, "requests": 0, "retries": 0, "digest": None}
    try:
        if not resumed:
            _preallocate(fd, size)
            state.save()
        transfer = _Transfer(url, part_path, fd, size, chunks, state, stats, headers=headers, chunk=chunk,
                             timeout=timeout, retries=retries, backoff=backoff, on_bytes=on_bytes,
                             on_retry=on_retry, sleep=sleep, stop=stop)
        fill_fd = transfer.fill_fd = _open_fill(part_path, size, chunk, transfer.written)
        resumed_bytes = sum(transfer.written)
        stats["resumed_bytes"] = resumed_bytes
        if resumed_bytes and on_resumed is not None:
            on_resumed(resumed_bytes)
        transfer.run(kind, connections)
        stats["digest"] = transfer.result.get("digest") if kind else None
        return stats
    finally:
        os.close(fd)
        if fill_fd is not None:
            os.close(fill_fd)
