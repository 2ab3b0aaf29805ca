# Apache License 2.0 (see LICENSE)
"""Probe a front door as an attacker would: raw request lines on raw sockets (no client that normalises a path).

    edge_probe.py HOST PORT --key-file FILE --model NAME --routes 'POST /v1/completions' 'GET /v1/models' ... [--json]

Sends every request form of ``forms()`` twice, without a key and with the key of ``--key-file``: every route vLLM 0.32.0
and vllm-router 0.1.17 register, the encodings and dot-segment tricks a server behind the front door could read as
another path, methods, absolute-form targets, HTTP/1.0, long and odd paths, doubled and odd Authorization headers.

What must hold (``violations()``; the exit status is 1 when any does not):
* without a key, nothing but ``/health`` answers 2xx (or 3xx);
* with the key, only the listed ``--routes`` (and ``/health``) answer 2xx (or 3xx), and each listed route is served
  (not refused by the front door: no 400, 401, 403, 404 or 405 from it).

Standard library only: it runs on a test host's system python3 as well as in the unit tests.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time

#: Every route the servers behind a front door register (vLLM 0.32.0's API server and its optional routers,
#: vllm-router 0.1.17), "METHOD /path", from their sources. A front door must pass none of them but its model's routes.
SERVER_ROUTES = [
    # vLLM: OpenAI-compatible and others under /v1 (its --api-key guards these only)
    "POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models", "POST /v1/embeddings", "POST /v1/responses",
    "GET /v1/responses/x", "POST /v1/responses/x/cancel", "POST /v1/audio/transcriptions",
    "POST /v1/audio/translations", "POST /v1/score", "POST /v1/rerank", "POST /v2/rerank", "POST /v1/messages",
    "POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter", "POST /v1/completions/render",
    "POST /v1/chat/completions/render", "POST /v1/classify", "POST /v1/pooling",
    # vLLM: outside /v1 (no key checked by vLLM)
    "POST /invocations", "GET /ping", "POST /ping", "POST /tokenize", "POST /detokenize", "POST /pooling", "POST /score",
    "POST /rerank", "POST /classify", "GET /version", "GET /metrics", "GET /load", "POST /pause", "POST /resume",
    "GET /is_paused", "POST /sleep", "POST /wake_up", "GET /is_sleeping", "POST /reset_prefix_cache",
    "POST /reset_mm_cache", "POST /scale_elastic_ep", "POST /is_scaling_elastic_ep", "POST /collective_rpc",
    "POST /start_profile", "POST /stop_profile", "GET /server_info", "POST /update_weights", "GET /docs",
    "GET /openapi.json", "GET /redoc", "POST /generate", "POST /inference/v1/generate", "GET /get_tokenizer_info",
    # vllm-router: probes, info and its worker admin API
    "GET /liveness", "GET /readiness", "GET /health_generate", "GET /get_model_info", "GET /get_server_info",
    "POST /add_worker?url=http://10.66.0.1:8000", "POST /remove_worker?url=http://10.66.0.1:8000",
    "GET /list_workers", "POST /flush_cache", "GET /get_loads", "POST /finish_session", "GET /scheduling/diagnostics",
    "GET /workers", "POST /workers", "DELETE /workers/x",
]

#: Paths that a server behind could read as /invocations (or another route) after decoding or normalising.
TRICKS = [
    "/v1/..\\invocations", "/v1\\..\\invocations", "/v1/%2e%2e/invocations", "/v1/%2E%2E%2Finvocations",
    "/v1%2f..%2finvocations", "/v1/..%5cinvocations", "/v1/%5c..%5cinvocations", "/v1/models/../../invocations",
    "/v1/../invocations", "/./invocations", "/v1/./completions", "//v1/completions", "/v1//completions",
    "/v1/completions/", "/v1/completions;x=1", "/v1/completions;/../../invocations", "/v1/completions%00",
    "/v1/completions%20", "/v1/completions%3f", "/%76%31/completions", "/v1/%63ompletions", "/V1/completions",
    "/v1/completions/..", "/v1/completions/.", "/v1/models/..%2f..%2finvocations", "/v1/%252e%252e/invocations",
    "/v1/..%c0%afinvocations", "/v1/..%u2216invocations", "/v1/completions\\", "/v1/.%2e/invocations",
    "/v1/models?x=/../invocations", "/health/../invocations", "/health\\..\\invocations", "/health;/invocations",
    "/health%2f..%2finvocations", "/v1/models#/../../invocations",
]
#: Raw bytes in the request target (control characters, spaces, a high byte).
RAW_TARGETS = [b"/v1/completions\x01", b"/v1/compl\tetions", b"/v1/\x7fcompletions", b"/v1/completions\xc0\xae",
               b"/v1/models /invocations"]


def forms(routes, health=("/health",)):
    """[(label, method, target bytes, version, extra headers, kind)]; kind: "health" (answers without a key: GET of
    the ``health`` paths), "route" (a listed route: answers with the key), "other" (never 2xx)."""
    listed = {tuple(r.split(" ", 1)) for r in routes}
    out = []
    for text in SERVER_ROUTES:
        method, target = text.split(" ", 1)
        kind = "route" if (method, target) in listed else "health" if (method == "GET" and target in health) else "other"
        out.append((f"route {text}", method, target.encode(), "HTTP/1.1", {}, kind))
    for method, target in sorted(listed - {tuple(t.split(" ", 1)) for t in SERVER_ROUTES}):
        out.append((f"route {method} {target}", method, target.encode(), "HTTP/1.1", {}, "route"))
    for path in TRICKS:
        out.append((f"trick POST {path}", "POST", path.encode(), "HTTP/1.1", {}, "other"))
    for raw in RAW_TARGETS:
        out.append((f"raw POST {raw!r}", "POST", raw, "HTTP/1.1", {}, "other"))
    out += [
        ("health GET", "GET", b"/health", "HTTP/1.1", {}, "health"),
        # vLLM answers HEAD /health with 405: the front doors pass GET only
        ("health HEAD", "HEAD", b"/health", "HTTP/1.1", {}, "other"),
        ("health HTTP/1.0", "GET", b"/health", "HTTP/1.0", {}, "health"),
        ("health absolute-form", "GET", b"http://frontdoor/health", "HTTP/1.1", {}, "health"),
        ("health with X-Original-URL", "GET", b"/health", "HTTP/1.1",
         {"X-Original-URL": "/invocations", "X-Rewrite-URL": "/invocations"}, "health"),
        ("health POST", "POST", b"/health", "HTTP/1.1", {}, "other"),
        ("health query", "GET", b"/health?x=1", "HTTP/1.1", {}, "health"),
        ("absolute-form invocations", "POST", b"http://frontdoor/invocations", "HTTP/1.1", {}, "other"),
        ("absolute-form backslash", "POST", b"http://frontdoor/v1/..\\invocations", "HTTP/1.1", {}, "other"),
        ("absolute-form userinfo", "POST", b"http://x@frontdoor/invocations", "HTTP/1.1", {}, "other"),
        ("absolute-form authority backslash", "POST", b"http://frontdoor\\invocations?/v1/completions", "HTTP/1.1",
         {}, "other"),
        ("absolute-form encoded", "POST", b"http://frontdoor/v1/%2e%2e/invocations", "HTTP/1.1", {}, "other"),
        ("asterisk OPTIONS", "OPTIONS", b"*", "HTTP/1.1", {}, "other"),
        ("CONNECT", "CONNECT", b"frontdoor:443", "HTTP/1.1", {}, "other"),
        ("TRACE models", "TRACE", b"/v1/models", "HTTP/1.1", {}, "other"),
        ("PUT completions", "PUT", b"/v1/completions", "HTTP/1.1", {}, "other"),
        ("DELETE models", "DELETE", b"/v1/models", "HTTP/1.1", {}, "other"),
        ("PATCH completions", "PATCH", b"/v1/completions", "HTTP/1.1", {}, "other"),
        ("GET completions", "GET", b"/v1/completions", "HTTP/1.1", {}, "other"),
        ("HTTP/1.0 invocations", "POST", b"/invocations", "HTTP/1.0", {}, "other"),
        ("HTTP/1.0 version", "GET", b"/version", "HTTP/1.0", {}, "other"),
        ("long path", "POST", b"/v1/" + b"a" * 9000, "HTTP/1.1", {}, "other"),
        ("long dot path", "POST", b"/v1" + b"/." * 3000 + b"/../invocations", "HTTP/1.1", {}, "other"),
        ("empty path", "GET", b"", "HTTP/1.1", {}, "other"),
        ("no slash", "GET", b"health", "HTTP/1.1", {}, "other"),
        ("X-Original-URL on a denied path", "POST", b"/x", "HTTP/1.1", {"X-Original-URL": "/v1/completions"}, "other"),
        ("X-HTTP-Method-Override", "POST", b"/v1/models", "HTTP/1.1", {"X-HTTP-Method-Override": "GET"}, "other"),
    ]
    return out


def send(host, port, method, target, version, headers, body, timeout):
    """One raw request on a new connection: (status or None, first 300 bytes of the answer, seconds)."""
    lines = [method.encode() + b" " + target + b" " + version.encode(), b"Host: frontdoor", b"Connection: close"]
    for name, value in headers:
        lines.append(f"{name}: {value}".encode())
    if body is not None:
        lines += [b"Content-Type: application/json", b"Content-Length: " + str(len(body)).encode()]
    raw = b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
    start = time.monotonic()
    data = b""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(raw)
            while len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data and method == "HEAD":
                    break
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}", time.monotonic() - start
    status = None
    first = data.split(b"\r\n", 1)[0].split()
    if len(first) >= 2 and first[0].startswith(b"HTTP/") and first[1].isdigit():
        status = int(first[1])
    return status, data[:300].decode("latin-1"), time.monotonic() - start


def probe(host, port, key, model, routes, timeout=60.0, health=("/health",)):
    """Every form without and with the key: [{label, kind, keyed, status, answer, seconds}]. ``health``: the paths
    the front door answers without a key (a router's front door: /health and /liveness)."""
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}], "input": "hi", "temperature": 0}).encode()
    results = []
    for label, method, target, version, extra, kind in forms(routes, health):
        for keyed in (False, True):
            headers = list(extra.items()) + ([("Authorization", f"Bearer {key}")] if keyed else [])
            payload = body if method in ("POST", "PUT", "PATCH") else None
            status, answer, seconds = send(host, port, method, target, version, headers, payload, timeout)
            results.append({"label": label, "kind": kind, "keyed": keyed, "status": status,
                            "answer": answer, "seconds": round(seconds, 3)})
    # the header tricks: doubled, odd or foreign credentials are no key
    for label, headers in (
            ("two Authorization headers (valid first)", [("Authorization", f"Bearer {key}"),
                                                         ("Authorization", "Bearer x")]),
            ("two Authorization headers (valid last)", [("Authorization", "Bearer x"),
                                                        ("Authorization", f"Bearer {key}")]),
            ("key and a second credential in one header", [("Authorization", f"Bearer {key}, Bearer x")]),
            ("key without the Bearer scheme", [("Authorization", key)]),
            ("key in X-Api-Key", [("X-Api-Key", key)]),
            ("key in the query", [])):
        target = b"/v1/completions" + (f"?api_key={key}".encode() if "query" in label else b"")
        status, answer, seconds = send(host, port, "POST", target, "HTTP/1.1", headers, body, timeout)
        results.append({"label": label, "kind": "other", "keyed": False, "status": status, "answer": answer,
                        "seconds": round(seconds, 3)})
    return results


def violations(results):
    """The results that break the promise (see the module docstring)."""
    bad = []
    for r in results:
        ok = r["status"] is not None and 200 <= r["status"] < 400
        if r["kind"] == "health":
            if not ok:
                bad.append(dict(r, why="/health must answer without a key"))
        elif not r["keyed"] or r["kind"] == "other":
            if ok:
                bad.append(dict(r, why="answered " + ("without a key" if not r["keyed"] else "a route not listed")))
        elif r["status"] in (None, 401, 404, 405) or (r["status"] in (400, 403) and "<html>" in r["answer"]):
            # HAProxy's refusals are HTML; a server's own 400 (a body it does not like) is JSON and counts as served
            bad.append(dict(r, why="a listed route, with the key, was not served"))
    return bad


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--routes", nargs="+", required=True, help="the listed routes, each 'METHOD /path'")
    parser.add_argument("--health", nargs="+", default=["/health"], help="paths answered without a key")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--json", action="store_true", help="print every result as JSON lines")
    args = parser.parse_args(argv)
    with open(args.key_file, encoding="ascii") as fh:
        key = fh.read().strip()
    results = probe(args.host, args.port, key, args.model, args.routes, args.timeout, tuple(args.health))
    bad = violations(results)
    if args.json:
        for r in results:
            print(json.dumps(r))
    forms_sent = len({r["label"] for r in results})
    print(f"edge_probe {args.host}:{args.port}: {len(results)} requests, {forms_sent} forms, "
          f"{len(bad)} violations", file=sys.stderr)
    for r in bad:
        print(f"  VIOLATION {r['label']} (key: {r['keyed']}): {r['status']} {r['why']}: {r['answer'][:120]!r}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
