"""Faults through a model's fleet endpoint (issue 38): requests sent, failed, and the seconds until the faulty part is
out of rotation and back, per kind of fault, from one run. A benchmark that prints figures, not a test.

It runs against two hosts the collection converged with a router of the model on the first (or on both) and a
single-host worker on each - the `multinode` Molecule scenario after `molecule converge -s multinode` - reached with
`podman exec` (the hosts are containers; give other names with --router-host and --client-host). A client on the
client host sends a real OpenAI completion every --pause seconds, each on a new connection, through the router
host's front door (its router_port); then, one after another:

* worker SIGKILL: the main process of a worker on the client host (systemd restarts it); out = the router counts it
  unhealthy (vllm_router_worker_health 0), back = healthy again (the client stops 20 s after out: on a 2-core
  machine its load starves vLLM's restart);
* worker SIGSTOP: the same worker frozen for --freeze seconds, then SIGCONT; out and back as above;
* front door reload: `systemctl reload` of the router host's front door (HAProxy's seamless reload);
* router SIGKILL: the router host's router (systemd restarts it); out = its front door marks it DOWN (or the kill
  itself when it never does), back = UP;
* router restart: `systemctl restart` of the router, what an upgrade does to it (the router role drains it first
  when the model has a second router host: the `multinode` test measures that path).

    python tests/benchmarks/bench_faults.py [--router-host inferops-mn-0] [--client-host inferops-mn-1]
        [--model tiny] [--served tiny-llama] [--worker solo] [--pause 1.0] [--freeze 20] [--faults a,b,...]

Printed per fault: requests in the window (from a second before the fault to the end of recovery plus 5 s, or to
the client's stop), failed, the errors, seconds to out and back. Each fault starts from a healthy fleet. Measured figures: docs/operate.md, "The router".
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "..", "..", "extensions", "molecule", "vllm_service", "files", "openai_clients.py")
LOG = "/var/tmp/bench-faults-clients.jsonl"
SOCKET = "/run/inferops-vllm-frontdoor/admin.sock"
FAULTS = ("worker-sigkill", "worker-sigstop", "frontdoor-reload", "router-sigkill", "router-restart")


def sh(host, command, check=True):
    proc = subprocess.run(["podman", "exec", host, "sh", "-c", command], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{host}: {command}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()


def plan(host):
    return json.loads(sh(host, "cat /etc/inferops/vllm/plan.json"))


def door_status(host, backend, server):
    code = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect('%s'); s.sendall(b'show stat\\n'); "
            "print(s.makefile().read())" % SOCKET)
    text = sh(host, "python3 -c \"%s\"" % code)
    head = text.splitlines()[0][2:].split(",")
    for line in text.splitlines()[1:]:
        row = dict(zip(head, line.split(",")))
        if row.get("pxname") == backend and row.get("svname") == server:
            return row.get("status", "")
    return ""


def worker_health(host, metrics_url, worker_url):
    text = sh(host, f"curl -sS -m 5 {metrics_url}", check=False)
    for line in text.splitlines():
        if line.startswith("vllm_router_worker_health{") and f'"{worker_url}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def start_clients(client_host, url, served, pause, key):
    with open(CLIENTS, "rb") as fh:
        script = base64.b64encode(fh.read()).decode()
    sh(client_host, "systemctl stop bench-fault-clients", check=False)
    sh(client_host, f"rm -f {LOG}; echo {script} | base64 -d > /var/tmp/bench-fault-clients.py")
    sh(client_host, f"umask 077; echo {base64.b64encode(key.encode()).decode()} | base64 -d > /run/bench-faults.key")
    venv = sh(client_host, "readlink -f /opt/inferops/vllm/current")
    sh(client_host, f"systemd-run --unit bench-fault-clients {venv}/bin/python /var/tmp/bench-fault-clients.py {url} "
                    f"/run/bench-faults.key {served} {LOG} 1 {pause}")


def stop_clients(client_host):
    sh(client_host, "systemctl stop bench-fault-clients", check=False)
    text = sh(client_host, f"cat {LOG}", check=False)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def wait_for(pred, deadline_s, step=0.5):
    start = time.time()
    while time.time() - start < deadline_s:
        if pred():
            return time.time()
        time.sleep(step)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--router-host", default="inferops-mn-0")
    ap.add_argument("--client-host", default="inferops-mn-1")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--served", default="tiny-llama")
    ap.add_argument("--worker", default="solo", help="the worker instance on the client host")
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--freeze", type=float, default=20.0)
    ap.add_argument("--key", default=os.environ.get("BENCH_FAULTS_KEY", "sk-molecule-mn-5c1d"))
    ap.add_argument("--faults", default=",".join(FAULTS))
    args = ap.parse_args(argv)
    rhost, chost = args.router_host, args.client_host
    (router,) = [r for r in plan(rhost)["routers"] if r["model"] == args.model]
    (worker,) = [w for w in router["workers"] if w["host"] == chost and w["instance"] == args.worker]
    address = sh(rhost, "ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n 1")
    url = f"http://{address}:{router['port']}/v1"
    unit = next(i["unit"] for i in plan(chost)["instances"] if i["name"] == args.worker)

    def health():
        return worker_health(rhost, router["metrics"]["url"], worker["url"])

    def door():
        return door_status(rhost, router["frontdoor"], "router")

    print(f"fleet endpoint {url} (router {router['unit']} on {rhost}, backups "
          f"{[b['host'] for b in router.get('backups') or []]}); worker {worker['url']} ({unit} on {chost}); "
          f"one client, a completion every {args.pause} s on a new connection")
    rows = []
    for fault in [f for f in args.faults.split(",") if f]:
        # every fault starts from a healthy fleet: the worker back in the router's rotation, the router UP
        if wait_for(lambda: health() == 1.0 and door() == "UP", 900, 2.0) is None:
            raise SystemExit(f"before {fault}: the worker or the router is not back after 900 s")
        start_clients(chost, url, args.served, args.pause, args.key)
        time.sleep(5)
        t0 = time.time()
        baseline = [json.loads(line) for line in sh(chost, f"cat {LOG}", check=False).splitlines() if line.strip()]
        if not any(r["ok"] for r in baseline):
            stop_clients(chost)
            raise SystemExit(f"the client gets no answer before any fault: {baseline[:1]}")
        out_at = back_at = None
        records = None
        if fault == "worker-sigkill":
            sh(chost, f"kill -KILL $(systemctl show --property=MainPID --value {unit})")
            out_at = wait_for(lambda: health() == 0.0, 60)
            # the client stops 20 s after the worker is out: on a 2-core machine its load starves vLLM's restart
            time.sleep(20)
            records = stop_clients(chost)
            back_at = wait_for(lambda: health() == 1.0, 900, 1.0)
        elif fault == "worker-sigstop":
            pid = sh(chost, f"systemctl show --property=MainPID --value {unit}")
            sh(chost, f"kill -STOP {pid}")
            out_at = wait_for(lambda: health() == 0.0, args.freeze)
            time.sleep(max(0.0, args.freeze - (time.time() - t0)))
            sh(chost, f"kill -CONT {pid}")
            back_at = wait_for(lambda: health() == 1.0, 300, 1.0)
        elif fault == "frontdoor-reload":
            sh(rhost, "systemctl reload inferops-vllm-frontdoor.service")
            back_at = time.time()
        elif fault in ("router-sigkill", "router-restart"):
            if fault == "router-sigkill":
                sh(rhost, f"systemctl kill --signal=KILL {router['unit']}")
            else:
                sh(rhost, f"systemctl restart {router['unit']}")
            out_at = wait_for(lambda: door() not in ("UP", ""), 10, 0.2)
            back_at = wait_for(lambda: door() == "UP" and time.time() > t0 + 2, 120)
        else:
            raise SystemExit(f"unknown fault {fault}; one of {', '.join(FAULTS)}")
        if records is None:
            time.sleep(5)
            records = stop_clients(chost)
        window = [r for r in records if r["t"] >= t0 - 1]
        failed = [r for r in window if not r["ok"]]
        row = {"fault": fault, "requests": len(window), "failed": len(failed),
               "errors": sorted({str(r.get("error", r.get("status")))[:80] for r in failed})[:3],
               "out_s": None if out_at is None else round(out_at - t0, 1),
               "back_s": None if back_at is None else round(back_at - t0, 1)}
        rows.append(row)
        print(f"{fault:17} {row['requests']:4} requests {row['failed']:3} failed; out of rotation after "
              f"{row['out_s'] if row['out_s'] is not None else '-'} s, back after "
              f"{row['back_s'] if row['back_s'] is not None else '-'} s {row['errors'] or ''}", flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
