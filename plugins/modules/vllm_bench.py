#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache License 2.0 (see LICENSE)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Short smoke benchmark of an OpenAI-compatible vLLM server
version_added: 1.0.0
description:
  - Sends completion requests to a running vLLM server (its OpenAI-compatible C(/v1/completions) API)
    and measures single-stream decode speed and aggregate throughput at a given concurrency.
  - Meant as a smoke test after a (re)start, with figures recorded in the fleet report; it is not a
    load test. Request loops are bounded in count and time.
  - Read-only towards the host; runs the same in check mode.
options:
  url:
    description: Base URL of the server, for example C(http://127.0.0.1:8000).
    type: str
    required: true
  model:
    description: Served model name to ask for.
    type: str
    required: true
  api_key:
    description: API key (sent as a bearer token), when the server requires one.
    type: str
  prompt:
    description: Prompt text of every request.
    type: str
    default: "Write a short story about a GPU that loved numbers."
  max_tokens:
    description: Tokens to generate per request.
    type: int
    default: 64
  requests:
    description: Requests in the concurrent phase.
    type: int
    default: 8
  concurrency:
    description: Parallel requests in the concurrent phase.
    type: int
    default: 4
  timeout:
    description: Seconds allowed for each request.
    type: float
    default: 120
  check_health:
    description:
      - Before measuring, wait up to O(health_timeout) seconds for C(GET /health) to answer 200, then
        check that C(GET /v1/models) (with O(api_key)) lists O(model); fail with what the server said
        otherwise. Saves the separate health tasks (one round trip per instance instead of three).
    type: bool
    default: false
  health_timeout:
    description: Seconds to wait for C(GET /health) with O(check_health).
    type: float
    default: 60
  measure:
    description: Run the benchmark. False with O(check_health) checks the server's health only.
    type: bool
    default: true
author: inferops maintainers (@inferops)
"""

EXAMPLES = r"""
- name: Smoke-benchmark the chat instance
  inferops.vllm.vllm_bench:
    url: http://127.0.0.1:8000
    model: tiny-llama
    max_tokens: 32
    requests: 8
    concurrency: 4
  register: bench

- name: Show single-stream speed
  ansible.builtin.debug:
    msg: "{{ bench.single_stream_tokens_per_s }} tokens/s"
"""

RETURN = r"""
single_stream_tokens_per_s:
  description: Completion tokens per second of one request alone.
  returned: success and O(measure)
  type: float
  sample: 84.2
single_stream_latency_s:
  description: Wall time of that single request.
  returned: success and O(measure)
  type: float
  sample: 0.76
throughput_tokens_per_s:
  description: Completion tokens per second over all requests of the concurrent phase.
  returned: success and O(measure)
  type: float
  sample: 2510.4
concurrency:
  description: Parallel requests used in the concurrent phase.
  returned: success
  type: int
  sample: 4
requests:
  description: Requests made in the concurrent phase.
  returned: success
  type: int
  sample: 8
completion_tokens:
  description: Completion tokens counted over the concurrent phase (from the server's usage report).
  returned: success and O(measure)
  type: int
  sample: 512
served_models:
  description: The model ids C(GET /v1/models) listed.
  returned: success and O(check_health)
  type: list
  elements: str
  sample: [tiny-llama]
health_wait_s:
  description: Seconds C(GET /health) took to answer 200.
  returned: success and O(check_health)
  type: float
  sample: 0.004
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url


def _complete(params):
    """One completion request; returns (completion tokens, seconds)."""
    body = json.dumps({
        "model": params["model"],
        "prompt": params["prompt"],
        "max_tokens": params["max_tokens"],
        "temperature": 0,
        "ignore_eos": True,
    })
    headers = _headers(params)
    start = time.monotonic()
    resp = open_url(params["url"].rstrip("/") + "/v1/completions", data=body, headers=headers,
                    method="POST", timeout=params["timeout"])
    data = json.loads(resp.read())
    elapsed = time.monotonic() - start
    tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
    if tokens <= 0:
        raise ValueError("the server's answer has no completion_tokens in usage: %r" % (data,))
    return tokens, elapsed


def _headers(params):
    headers = {"Content-Type": "application/json"}
    if params.get("api_key"):
        headers["Authorization"] = "Bearer %s" % params["api_key"]
    return headers


def check_health(params):
    """Wait for GET /health = 200, then GET /v1/models must list the model. Returns (seconds, ids)."""
    base = params["url"].rstrip("/")
    start = time.monotonic()
    deadline = start + params["health_timeout"]
    last = None
    while True:
        try:
            resp = open_url(base + "/health", timeout=min(10.0, params["timeout"]))
            if resp.getcode() == 200:
                break
            last = "HTTP %s" % resp.getcode()
        except Exception as exc:  # refused while starting, HTTP 503 while loading: keep waiting
            last = str(exc)
        if time.monotonic() >= deadline:
            raise RuntimeError("GET %s/health did not answer 200 within %g s (last: %s)"
                               % (base, params["health_timeout"], last))
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
    waited = time.monotonic() - start
    try:
        data = json.loads(open_url(base + "/v1/models", headers=_headers(params), timeout=params["timeout"]).read())
    except Exception as exc:
        raise RuntimeError("GET %s/v1/models failed: %s" % (base, exc))
    ids = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]
    if params["model"] not in ids:
        raise RuntimeError("GET %s/v1/models lists %s, not the served model %s" % (base, ids, params["model"]))
    return waited, ids


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            model=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            prompt=dict(type="str", default="Write a short story about a GPU that loved numbers."),
            max_tokens=dict(type="int", default=64, no_log=False),
            requests=dict(type="int", default=8),
            concurrency=dict(type="int", default=4),
            timeout=dict(type="float", default=120),
            check_health=dict(type="bool", default=False),
            health_timeout=dict(type="float", default=60),
            measure=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for key in ("max_tokens", "requests", "concurrency"):
        if p[key] < 1:
            module.fail_json(msg="%s must be at least 1, got %d" % (key, p[key]))
    result = {"changed": False}
    if p["check_health"]:
        try:
            waited, ids = check_health(p)
        except Exception as exc:
            module.fail_json(msg=str(exc))
        result.update(health_wait_s=round(waited, 3), served_models=ids)
    if not p["measure"]:
        module.exit_json(**result)
    try:
        _complete(dict(p, max_tokens=1))  # warm-up: first request pays for lazy initialisation
        tokens, secs = _complete(p)
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=p["concurrency"]) as pool:
            results = list(pool.map(lambda _i: _complete(p), range(p["requests"])))
        wall = time.monotonic() - start
    except Exception as exc:  # urllib errors, timeouts, bad JSON: all are a failed smoke test
        module.fail_json(msg="benchmark request to %s failed: %s" % (p["url"], exc))
    total = sum(tokens_done for tokens_done, _secs in results)
    module.exit_json(
        single_stream_tokens_per_s=round(tokens / secs, 2),
        single_stream_latency_s=round(secs, 3),
        throughput_tokens_per_s=round(total / wall, 2),
        concurrency=p["concurrency"],
        requests=p["requests"],
        completion_tokens=total,
        **result
    )


if __name__ == "__main__":
    main()
