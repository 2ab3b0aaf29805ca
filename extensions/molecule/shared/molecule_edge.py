"""The edge probe (tests/edge/edge_probe.py) run on a test host against a front door, for the Molecule scenarios.

``probe(client, address, port, key, model, routes)`` copies the probe onto ``client`` (a testinfra host), writes the
key to a root-only file there, runs the probe with the host's system python3 against ``address:port`` and returns
``(rc, summary, violations, results)``: the probe's exit status (1 when any violation), its summary line, the
violations and every result (one dict per request).
"""
from __future__ import annotations

import base64
import json
import os

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "edge", "edge_probe.py")


def probe(client, address, port, key, model, routes, timeout=120, health=("/health",)):
    health = [health] if isinstance(health, str) else list(health)
    with open(PROBE, "rb") as fh:
        script = base64.b64encode(fh.read()).decode()
    client.check_output(f"echo {script} | base64 -d > /var/tmp/edge_probe.py")
    client.check_output(f"umask 077; echo {base64.b64encode(key.encode()).decode()} | base64 -d > /run/edge-probe.key")
    quoted = " ".join(f"'{r}'" for r in routes)
    out = client.run(f"python3 /var/tmp/edge_probe.py {address} {port} --key-file /run/edge-probe.key "
                     f"--model {model} --timeout {timeout} --json --health {' '.join(health)} --routes {quoted}")
    client.run("rm -f /run/edge-probe.key")
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    lines = out.stderr.strip().splitlines()
    summary = next((line for line in lines if line.startswith("edge_probe ")), out.stderr[-500:])
    violations = [line.strip() for line in lines if "VIOLATION" in line]
    return out.rc, summary, violations, results
