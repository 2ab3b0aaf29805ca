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
    and measures single-stream decode speed and aggregate throughput at a given concurrency, and the
    time to first token (TTFT) and time per output token (TPOT) of streamed requests.
  - "The method: a warm-up request, then O(repeats) rounds of two phases - one request alone (concurrency 1),
    then O(requests) requests O(concurrency) at a time - and the median of the rounds is reported. Every
    request streams (C(stream: true), usage in the last chunk): TTFT is the time to the first streamed
    token, TPOT is (total time - TTFT) / (completion tokens - 1); their p50 and p99 are taken over the
    requests of a round's concurrent phase."
  - "Prompts are fixed-seed random: O(prompt_words) words drawn with O(seed) from a small built-in word
    list, different per request but the same in every run. A word is about one token for Llama-style
    tokenizers, so O(prompt_words) approximates the prompt's length in tokens; the server's tokenizer
    decides the exact count. O(prompt) replaces them by one fixed text."
  - Meant as a short gate after a (re)start, with figures recorded in the fleet report; it is not a
    load test. Request loops are bounded in count and time. Standard library only on the target.
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
    description: Prompt text of every request, instead of the fixed-seed random prompts.
    type: str
  prompt_words:
    description: Words of each fixed-seed random prompt (about as many prompt tokens).
    type: int
    default: 32
  seed:
    description: Seed of the random prompts; the same seed gives the same prompts in every run.
    type: int
    default: 0
  repeats:
    description: Rounds of both phases; the figures are the median over the rounds.
    type: int
    default: 3
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
  completion:
    description:
      - Without O(measure), ask one completion of a single token and fail unless it answers (the proof that
        an instance serves, for a run that measures nothing, such as C(site.yml) on a converged host).
    type: bool
    default: false
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
  description: Completion tokens per second of one request alone (median of the rounds).
  returned: success and O(measure)
  type: float
  sample: 84.2
single_stream_latency_s:
  description: Wall time of that single request.
  returned: success and O(measure)
  type: float
  sample: 0.76
throughput_tokens_per_s:
  description: Completion tokens per second over all requests of the concurrent phase (median of the rounds).
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
ttft_p50_ms:
  description: Median time to first token in milliseconds, in the concurrent phase (median of the rounds).
  returned: success and O(measure)
  type: float
  sample: 41.3
ttft_p99_ms:
  description: 99th percentile of the time to first token in milliseconds (concurrent phase, median of the rounds).
  returned: success and O(measure)
  type: float
  sample: 120.5
tpot_p50_ms:
  description: Median time per output token after the first, in milliseconds (concurrent phase, median of the rounds).
  returned: success and O(measure)
  type: float
  sample: 12.1
tpot_p99_ms:
  description: 99th percentile of the time per output token in milliseconds (concurrent phase, median of the rounds).
  returned: success and O(measure)
  type: float
  sample: 15.8
single_stream_ttft_ms:
  description: Time to first token of the request alone, in milliseconds (median of the rounds).
  returned: success and O(measure)
  type: float
  sample: 30.2
repeats:
  description: Rounds measured.
  returned: success and O(measure)
  type: int
  sample: 3
rounds:
  description: The figures of every round (keys as above), before the median.
  returned: success and O(measure)
  type: list
  elements: dict
completion_tokens:
  description:
    - Completion tokens counted over the concurrent phase of the last round (from the server's usage report).
    - With O(completion) and without O(measure), the tokens of the one-token completion.
  returned: success and (O(measure) or O(completion))
  type: int
  sample: 512
completion_s:
  description: Seconds the one-token completion took (O(completion) without O(measure)).
  returned: success and O(completion) and not O(measure)
  type: float
  sample: 0.21
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
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

WORDS = ("the of and to in is was for on that with as by at from his her an were which this be are had not "
         "but one all their there been has more when who will would can if into no time about only new some "
         "could these two may first then do any like my now over such our man me even most made after also "
         "did many before must through back years where much your way well down should because each just "
         "those people how too little state good very make world still own see men work long get here between "
         "both life being under never day same another know while last might us great old year off come since "
         "against go came right used take three").split()


def prompts(params, count):
    """``count`` prompts: the fixed text, or fixed-seed random words (the same in every run)."""
    if params.get("prompt"):
        return [params["prompt"]] * count
    rng = random.Random(params["seed"])
    return [" ".join(rng.choice(WORDS) for _w in range(params["prompt_words"])) for _i in range(count)]


def percentile(values, pct):
    """Linear-interpolated percentile (``pct`` in 0-100) of a non-empty list."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _complete(params, prompt, max_tokens=None):
    """One streamed completion request; returns (completion tokens, seconds, seconds to first token)."""
    body = json.dumps({
        "model": params["model"],
        "prompt": prompt,
        "max_tokens": max_tokens or params["max_tokens"],
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    })
    start = time.monotonic()
    resp = open_url(params["url"].rstrip("/") + "/v1/completions", data=body, headers=_headers(params),
                    method="POST", timeout=params["timeout"])
    first = None
    usage = None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        chunk = json.loads(payload)
        if first is None and any(c.get("text") for c in chunk.get("choices") or []):
            first = time.monotonic() - start
        if chunk.get("usage"):
            usage = chunk["usage"]
    elapsed = time.monotonic() - start
    tokens = int((usage or {}).get("completion_tokens") or 0)
    if tokens <= 0:
        raise ValueError("the server's stream has no completion_tokens in usage (last usage: %r)" % (usage,))
    return tokens, elapsed, elapsed if first is None else first


def _tpot(tokens, secs, ttft):
    return (secs - ttft) / (tokens - 1) if tokens > 1 else 0.0


def one_round(params, texts):
    """One round: a request alone, then the concurrent phase. Returns the round's figures."""
    tokens, secs, ttft = _complete(params, texts[0])
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=params["concurrency"]) as pool:
        results = list(pool.map(lambda text: _complete(params, text), texts[1:]))
    wall = time.monotonic() - start
    total = sum(r[0] for r in results)
    ttfts = [r[2] * 1000 for r in results]
    tpots = [_tpot(*r) * 1000 for r in results]
    return {
        "single_stream_tokens_per_s": tokens / secs,
        "single_stream_latency_s": secs,
        "single_stream_ttft_ms": ttft * 1000,
        "throughput_tokens_per_s": total / wall,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p99_ms": percentile(ttfts, 99),
        "tpot_p50_ms": percentile(tpots, 50),
        "tpot_p99_ms": percentile(tpots, 99),
        "completion_tokens": total,
    }


def benchmark(params):
    """Warm-up, then ``repeats`` rounds; returns the median figures and the rounds."""
    texts = prompts(params, 2 + params["repeats"] * (1 + params["requests"]))
    _complete(params, texts[0], max_tokens=1)  # warm-up: the first request pays for lazy initialisation
    rounds = []
    per_round = 1 + params["requests"]
    for i in range(params["repeats"]):
        rounds.append(one_round(params, texts[1 + i * per_round:1 + (i + 1) * per_round]))
    figures = {}
    for key in rounds[0]:
        if key == "completion_tokens":
            continue
        digits = 3 if key.endswith("_s") and not key.endswith("per_s") else 2
        figures[key] = round(statistics.median(r[key] for r in rounds), digits)
    figures["completion_tokens"] = rounds[-1]["completion_tokens"]
    figures["rounds"] = [dict((k, round(v, 3)) for k, v in r.items()) for r in rounds]
    return figures


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
            prompt=dict(type="str"),
            prompt_words=dict(type="int", default=32),
            seed=dict(type="int", default=0),
            repeats=dict(type="int", default=3),
            max_tokens=dict(type="int", default=64, no_log=False),
            requests=dict(type="int", default=8),
            concurrency=dict(type="int", default=4),
            timeout=dict(type="float", default=120),
            check_health=dict(type="bool", default=False),
            health_timeout=dict(type="float", default=60),
            measure=dict(type="bool", default=True),
            completion=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    for key in ("max_tokens", "requests", "concurrency", "repeats", "prompt_words"):
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
        if p["completion"]:
            try:
                tokens, secs, _ttft = _complete(p, "Hello", max_tokens=1)
            except Exception as exc:  # urllib errors, timeouts, bad JSON: the instance does not serve
                module.fail_json(msg="a one-token completion from %s failed: %s" % (p["url"], exc))
            result.update(completion_tokens=tokens, completion_s=round(secs, 3))
        module.exit_json(**result)
    try:
        figures = benchmark(p)
    except Exception as exc:  # urllib errors, timeouts, bad JSON: all are a failed benchmark
        module.fail_json(msg="benchmark request to %s failed: %s" % (p["url"], exc))
    result.update(figures)
    module.exit_json(concurrency=p["concurrency"], requests=p["requests"], repeats=p["repeats"], **result)


if __name__ == "__main__":
    main()
