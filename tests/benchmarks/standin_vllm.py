"""A stand-in for vLLM's OpenAI API server, for the no-op fleet benchmark's clone hosts (bench_noop_fleet.py).

Not a test double for the collection's tests: a real converged host runs real vLLM (2.1 GB resident for the tiny
model), and 64 of them do not fit the 24 GiB machine the benchmark runs on. The benchmark converges one real host,
then puts this file in its venv as ``vllm/entrypoints/openai/api_server.py`` (and a ``vllm/__init__.py`` that does
not import torch), so the instance units the converge wrote, unchanged, start this server instead of vLLM; every
other file, unit, link and process of the host is the converge's own. It answers what a site.yml run, the front
door, the router and the watchdog ask an instance, as vLLM 0.32.0 does:

* ``GET /health`` 200 (no key), ``GET /ping`` 200, ``GET /version``, ``GET /metrics`` (a few ``vllm:`` series);
* with the key (``--api-key`` or ``VLLM_API_KEY``, checked for ``/v1/*`` as vLLM does, 401 otherwise):
  ``GET /v1/models`` (the served names, then each ``--lora-modules`` adapter with its parent),
  ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed or not, usage in the last chunk with
  ``stream_options.include_usage``; the text is one word per token), ``POST /v1/completions/render``;
* anything else 404.

The GPU simulator (tests/gpusim) counts a process whose argv holds ``-m vllm.entrypoints.openai.api_server`` as a
vLLM server, from its ``--gpu-memory-utilization`` and tensor-parallel size, so the footprint the host shows is the
one real vLLM gives. Standard library only.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "0.32.0"


def parse(argv):
    """The options this server needs from vLLM's command line; every other one is accepted and ignored."""
    opts = {"host": "0.0.0.0", "port": 8000, "model": None, "served": [], "api_key": None, "lora": [],
            "max_model_len": 2048}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, _eq, inline = arg.partition("=")
        values = [inline] if _eq else []
        j = i + 1
        if not _eq:
            while j < len(argv) and not argv[j].startswith("--"):
                values.append(argv[j])
                j += 1
        if name == "--host" and values:
            opts["host"] = values[0]
        elif name == "--port" and values:
            opts["port"] = int(values[0])
        elif name == "--model" and values:
            opts["model"] = values[0]
        elif name == "--served-model-name":
            opts["served"] = values
        elif name == "--api-key" and values:
            opts["api_key"] = values[0]
        elif name == "--max-model-len" and values:
            opts["max_model_len"] = int(values[0])
        elif name == "--lora-modules":
            for value in values:
                try:
                    item = json.loads(value)
                except ValueError:
                    lora_name, _sep, path = value.partition("=")
                    item = {"name": lora_name, "path": path}
                opts["lora"].append(item)
        elif not arg.startswith("--") and opts["model"] is None:
            opts["model"] = arg
        i = j if not _eq else i + 1
    opts["served"] = opts["served"] or [opts["model"]]
    opts["api_key"] = opts["api_key"] or os.environ.get("VLLM_API_KEY") or None
    return opts


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    opts: dict = {}
    counts = {"requests": 0, "tokens": 0}

    def log_message(self, *_args):  # quiet, as vLLM is with --disable-uvicorn-access-log
        pass

    def _send(self, status, body=b"", ctype="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self, path):
        key = self.opts.get("api_key")
        if not key or not path.startswith("/v1"):
            return True
        if self.headers.get("Authorization", "") == "Bearer " + key:
            return True
        self._send(401, {"error": "Unauthorized"})
        return False

    def _models(self):
        now = int(time.time())
        data = [{"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": self.opts["model"],
                 "parent": None, "max_model_len": self.opts["max_model_len"]} for name in self.opts["served"]]
        data += [{"id": item.get("name"), "object": "model", "created": now, "owned_by": "vllm",
                  "root": item.get("path"), "parent": item.get("base_model_name") or self.opts["served"][0],
                  "max_model_len": self.opts["max_model_len"]} for item in self.opts["lora"]]
        return {"object": "list", "data": data}

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/ping"):
            self._send(200)
        elif path == "/version":
            self._send(200, {"version": VERSION})
        elif path == "/metrics":
            names = self.opts["served"]
            lines = ["# TYPE vllm:num_requests_running gauge", "# TYPE vllm:num_requests_waiting gauge",
                     "# TYPE vllm:request_success_total counter", "# TYPE vllm:generation_tokens_total counter"]
            for name in names:
                lines += [f'vllm:num_requests_running{{model_name="{name}"}} 0.0',
                          f'vllm:num_requests_waiting{{model_name="{name}"}} 0.0',
                          f'vllm:request_success_total{{finished_reason="length",model_name="{name}"}} '
                          f'{float(self.counts["requests"])}',
                          f'vllm:generation_tokens_total{{model_name="{name}"}} {float(self.counts["tokens"])}']
            self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif not self._authorized(path):
            return
        elif path == "/v1/models":
            self._send(200, self._models())
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._authorized(path):
            return
        if path not in ("/v1/completions", "/v1/chat/completions", "/v1/completions/render"):
            self._send(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, {"error": {"message": "body is not JSON", "type": "BadRequestError", "code": 400}})
            return
        known = {m["id"] for m in self._models()["data"]}
        if body.get("model") not in known:
            self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                       "type": "NotFoundError", "param": "model", "code": 404}})
            return
        if path.endswith("/render"):
            self._send(200, {"prompt_token_ids": list(range(len(str(body.get("prompt", "")).split())))})
            return
        chat = path == "/v1/chat/completions"
        tokens = max(1, min(int(body.get("max_tokens") or body.get("max_completion_tokens") or 16), 256))
        prompt = body.get("messages") if chat else body.get("prompt")
        usage = {"prompt_tokens": len(json.dumps(prompt).split()), "completion_tokens": tokens}
        usage["total_tokens"] = usage["prompt_tokens"] + tokens
        Handler.counts["requests"] += 1
        Handler.counts["tokens"] += tokens
        kind, rid = ("chat.completion", "chatcmpl-standin") if chat else ("text_completion", "cmpl-standin")
        if not body.get("stream"):
            text = " ".join(["token"] * tokens)
            choice = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            self._send(200, {"id": rid, "object": kind, "created": int(time.time()), "model": body["model"],
                             "choices": [choice], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(payload):
            data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        for n in range(tokens):
            delta = {"delta": {"content": " token"}} if chat else {"text": " token"}
            chunk({"id": rid, "object": kind + ".chunk" if chat else kind, "model": body["model"],
                   "choices": [dict(index=0, finish_reason="length" if n == tokens - 1 else None, **delta)]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk({"id": rid, "object": kind, "model": body["model"], "choices": [], "usage": usage})
        chunk(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")


def main(argv=None):
    opts = parse(sys.argv[1:] if argv is None else argv)
    Handler.opts = opts
    server = ThreadingHTTPServer((opts["host"], opts["port"]), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_a: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"stand-in vLLM {VERSION} API server on {opts['host']}:{opts['port']} serving {opts['served']}",
          flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
