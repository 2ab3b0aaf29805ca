"""module_utils/range_fetch.py: chunk layouts, and fetches from a small in-memory Range server.

The property: whatever the file size (0 and 1 byte included), chunk size, connection count, and
wherever one connection is dropped, the fetched file and its digest are exactly the served bytes;
a second process resumes from the state file without fetching a finished chunk again.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.module_utils import range_fetch as rf
from ansible_collections.inferops.vllm.plugins.module_utils.hf_snapshot import Progress


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.data = b""
        self.ranges = True
        self.drop_after = -1  # drop the next body after that many bytes (once)
        self.lock = threading.Lock()
        self.log = []  # (start, end_inclusive, sent)

    def handle_error(self, request, client_address):
        pass  # a client that hung up on a dropped answer is the scenario, not an error

    @property
    def url(self):
        return "http://127.0.0.1:%d/f" % self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.data)))
        if self.server.ranges:
            self.send_header("Accept-Ranges", "bytes")
        self.end_headers()

    def do_GET(self):
        data = self.server.data
        m = re.match(r"^bytes=(\d+)-(\d+)$", self.headers.get("Range") or "")
        if m and self.server.ranges:
            start, end = int(m.group(1)), min(int(m.group(2)), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, len(data)))
        else:
            start, end = 0, len(data) - 1
            self.send_response(200)
        body = data[start:end + 1]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with self.server.lock:
            cut, self.server.drop_after = self.server.drop_after, -1
        # logged before the body is sent: the client may be done before this thread runs again
        if 0 <= cut < len(body):
            self.server.log.append((start, end, cut))
            self.wfile.write(body[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.server.log.append((start, end, len(body)))
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    srv = Server()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def no_sleep(_s):
    pass


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 10 ** 7), chunk=st.integers(1, 10 ** 7))
def test_chunks_cover_the_file_once_in_order(size, chunk):
    chunks = rf.plan_chunks(size, chunk)
    assert [c[0] for c in chunks] == list(range(len(chunks)))
    pos = 0
    for _i, start, end in chunks:
        assert start == pos and start < end <= size and end - start <= chunk
        pos = end
    assert pos == size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.one_of(st.sampled_from([0, 1, 2, 4095, 4096, 4097]), st.integers(0, 300000)),
       chunk=st.one_of(st.sampled_from([1, 7, 4096]), st.integers(1, 400000)),
       connections=st.integers(1, 6), drop=st.one_of(st.none(), st.integers(0, 300000)),
       kind=st.sampled_from(["sha256", "git-sha1", None]), seed=st.integers(0, 2 ** 32 - 1))
def test_any_layout_gives_exactly_the_served_bytes(server, tmp_path_factory, size, chunk, connections, drop,
                                                   kind, seed):
    import random

    chunk = max(chunk, -(-size // 40))  # at most 40 requests per example (the layouts, not the count, vary)
    rng = random.Random(seed)
    server.data = bytes(rng.getrandbits(8) for _byte in range(size)) if size < 5000 else os.urandom(size)
    server.drop_after = -1 if drop is None else drop
    server.log = []
    part = str(tmp_path_factory.mktemp("rf") / "x.part")
    expected = hashlib.sha256(server.data).hexdigest()
    stats = rf.fetch(server.url, part, size, kind, expected, connections=connections, chunk=chunk, timeout=5,
                     retries=2, backoff=0, sleep=no_sleep)
    with open(part, "rb") as f:
        assert f.read() == server.data
    if kind == "sha256":
        assert stats["digest"] == expected
    elif kind == "git-sha1":
        assert stats["digest"] == hashlib.sha1(b"blob %d\0" % size + server.data).hexdigest()
    else:
        assert stats["digest"] is None
    assert stats["fetched_bytes"] == size == sum(sent for _s, _e, sent in server.log)
    with open(part + ".json") as f:
        assert json.load(f)["done"] == list(range(stats["chunks"]))


def test_a_second_process_resumes_only_the_missing_chunks(server, tmp_path):
    server.data = os.urandom(100000)
    server.log = []
    part = str(tmp_path / "x.part")
    expected = hashlib.sha256(server.data).hexdigest()
    first = rf.fetch(server.url, part, 100000, "sha256", expected, connections=3, chunk=10000, timeout=5,
                     sleep=no_sleep)
    assert first["digest"] == expected
    # as if killed after some chunks: forget chunks 3 and 7 and damage their bytes on disk
    with open(part + ".json") as f:
        doc = json.load(f)
    doc["done"] = [i for i in doc["done"] if i not in (3, 7)]
    with open(part + ".json", "w") as f:
        json.dump(doc, f)
    with open(part, "r+b") as f:
        for i in (3, 7):
            f.seek(i * 10000)
            f.write(b"\0" * 10000)
    server.log = []
    resumed = []
    second = rf.fetch(server.url, part, 100000, "sha256", expected, connections=3, chunk=10000, timeout=5,
                      on_resumed=resumed.append, sleep=no_sleep)
    assert second["digest"] == expected and resumed == [80000] and second["resumed_bytes"] == 80000
    assert sorted((s, e) for s, e, _n in server.log) == [(30000, 39999), (70000, 79999)]


def test_a_state_of_other_content_is_not_resumed(server, tmp_path):
    server.data = os.urandom(50000)
    part = str(tmp_path / "x.part")
    rf.fetch(server.url, part, 50000, None, "old-digest", connections=2, chunk=10000, timeout=5)
    server.log = []
    stats = rf.fetch(server.url, part, 50000, "sha256", "new-digest", connections=2, chunk=10000, timeout=5)
    assert stats["resumed_bytes"] == 0 and sum(n for _s, _e, n in server.log) == 50000


def test_a_server_without_ranges(server, tmp_path):
    server.data = os.urandom(30000)
    server.ranges = False
    try:
        assert rf.probe(server.url, 30000, {}, 5)["ranged"] is False
        with pytest.raises(rf.RangeUnsupported):
            rf.fetch(server.url, str(tmp_path / "x.part"), 30000, "sha256", "x", connections=2, chunk=10000,
                     timeout=5)
    finally:
        server.ranges = True
    assert rf.probe(server.url, 30000, {}, 5) == {"ranged": True, "reason": ""}
    assert rf.probe(server.url, 30001, {}, 5)["ranged"] is False  # not the size the listing says


def test_progress_counts_parallel_bytes_and_rates_only_what_moved():
    p = Progress(None, "acme/x")
    p.bytes_total = 1000
    p.phase = "downloading"
    p._samples = [(0.0, 0)]
    p.add_resumed(600)  # an earlier run's bytes: done, but not transferred now
    assert p._samples == [(0.0, 600)]
    for _conn in range(4):
        p.add_partial(50)  # four connections
    doc = p.snapshot()
    assert doc["bytes_done"] == 800
    p.drop_partial(800)
    p.add_done(1000)
    assert p.snapshot()["bytes_done"] == 1000
