# Apache License 2.0 (see LICENSE)
"""The input checks of the later stages' own settings, in one place (controller side, no Ansible imports).

Each role asserts its list before it changes anything (the install role through the filter
``inferops.vllm.vllm_install_input_problems``, the weights role through ``vllm_weights_input_problems``), and the
inventory validation (role ``vllm_validate``, filter ``vllm_inventory_problems``) reports the same sentences for what
the inventory sets, with every other problem of the inventory, before any host is contacted: a bad setting of a late
stage refuses the run before vLLM is installed anywhere, not after.
"""
from __future__ import annotations

import re

from ansible_collections.inferops.vllm.plugins.plugin_utils.values import LOOPBACK, as_bool, as_int

__all__ = ["accepted", "INSTALL_INPUTS", "SERVICE_INPUTS", "VARIANTS", "VERSION_PATTERN", "WEIGHTS_INPUTS",
           "install_input_problems", "service_input_problems", "weights_input_problems"]

#: Exact PEP 440 versions only (a release, optional pre/post/dev part): no ranges, no "latest".
VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$"
#: The builds the install role knows (its vars name what each installs: vllm_install__variants).
VARIANTS = ("cuda", "cpu")
#: The variables checked here; one left out (unset) takes the role's default, which is good.
INSTALL_INPUTS = ("vllm_install_version", "vllm_install_variant", "vllm_install_keep", "vllm_install_wheelhouse")
#: The weights role's settings: whole numbers with their least value (and most, for a port), then the others.
WEIGHTS_BOUNDS = {
    "vllm_weights_keep": (1, None, "snapshots kept per model"),
    "vllm_weights_poll_interval": (1, None, "seconds between two looks at a fetch"),
    "vllm_weights_timeout": (60, None, "seconds a fetch may take"),
    "vllm_weights_fanout_port": (1, 65535, "a TCP port number"),
    "vllm_weights_fanout_degree": (0, None, "hosts each host serves (1: a chain, 0: every host from the source)"),
    "vllm_weights_fanout_stall_timeout": (10, None, "seconds without progress before a copy is given up"),
    "vllm_weights_fanout_max_rate_mib": (0, None, "MiB/s per copy, 0 for no limit"),
}
WEIGHTS_INPUTS = tuple(WEIGHTS_BOUNDS) + ("vllm_weights_source_dir_on", "vllm_weights_source_dir", "vllm_weights_owner")
#: The service role's settings that a unit, its gate or the watchdog reads as whole numbers, with their least value
#: (no most: the same form as WEIGHTS_BOUNDS, checked by the same loop).
SERVICE_BOUNDS = {
    "vllm_service_timeout_start_sec": (1, None, "seconds systemd lets an instance start (TimeoutStartSec=)"),
    "vllm_service_restart_sec": (0, None, "seconds before systemd restarts a failed instance (RestartSec=)"),
    "vllm_service_start_limit_burst": (1, None, "starts allowed in the interval (StartLimitBurst=)"),
    "vllm_service_start_limit_interval_sec": (0, None, "seconds of StartLimitIntervalSec="),
    "vllm_service_limit_nofile": (1024, None, "open files of an instance (LimitNOFILE=)"),
    "vllm_service_health_timeout": (1, None, "seconds the health gate waits"),
    "vllm_service_health_delay": (1, None, "seconds between the gate's polls"),
    "vllm_service_watchdog_interval": (5, None, "seconds between two watchdog passes"),
    "vllm_service_watchdog_fail_after": (1, None, "failed passes before the watchdog heals"),
    "vllm_service_watchdog_probe_timeout": (1, None, "seconds a watchdog probe waits"),
    "vllm_service_watchdog_max_heals": (0, None, "heals per window"),
    "vllm_service_watchdog_heal_window": (60, None, "seconds of the heal window"),
}
#: The secrets (their values are never shown), and what says an API without a key may serve beyond loopback.
SERVICE_SECRETS = ("vllm_service_api_key", "vllm_service_hf_token")
SERVICE_INPUTS = tuple(SERVICE_BOUNDS) + SERVICE_SECRETS + ("vllm_service_allow_unauthenticated",)


def _json(value) -> str:
    """The value as the messages show it: as text, JSON-quoted (Ansible's ``| string | to_json``)."""
    import json  # pylint: disable=import-outside-toplevel
    return json.dumps(str(value))


def _int(value):
    """Ansible's ``| int`` (an unreadable value is 0)."""
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # inf is a float int() refuses with OverflowError
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0


def _bound_problems(values, host, bounds) -> list:
    """The whole numbers of ``values`` outside their ``bounds`` (variable -> (least, most or None, what)), one sentence
    each; a variable left out is not checked."""
    problems = []
    for name, (low, high, what) in bounds.items():
        if name not in values:
            continue
        num = as_int(values[name])  # a whole number written as such: 1.5 or "x" is refused, not truncated
        if num is None or num < low or (high is not None and num > high):
            problems.append(f"host {host}: {name} is {_json(values[name])}; use {accepted(name)} ({what}).")
    return problems


def accepted(name) -> str:
    """What a whole-number setting of WEIGHTS_BOUNDS or SERVICE_BOUNDS accepts, as its message and its role's
    argument spec (a unit test keeps the spec's "Accepted:" sentence equal to it) say it."""
    low, high, _what = {**WEIGHTS_BOUNDS, **SERVICE_BOUNDS}[name]
    return f"a whole number from {low} to {high}" if high is not None else f"a whole number of at least {low}"


def install_input_problems(values, host) -> list:
    """One sentence per problem (the host, the variable, the fix) of the install inputs in ``values`` (variable ->
    value; those left out are not checked); never raises."""
    values = values if isinstance(values, dict) else {}
    problems = []
    if "vllm_install_version" in values:
        version = values["vllm_install_version"]
        if not (isinstance(version, str) and re.match(VERSION_PATTERN, version)):
            problems.append(f"host {host}: vllm_install_version={_json(version)} is not an exact vLLM release. Fix: set "
                            'vllm_install_version to a released version, quoted, for example "0.32.0" (no ranges, no '
                            '"latest").')
    if "vllm_install_variant" in values:
        variant = values["vllm_install_variant"]
        if not isinstance(variant, str) or variant not in VARIANTS:
            problems.append(f"host {host}: vllm_install_variant={_json(variant)} is not supported. Fix: set "
                            f"vllm_install_variant to one of {', '.join(VARIANTS)}.")
    keep, wheelhouse = values.get("vllm_install_keep", 1), values.get("vllm_install_wheelhouse", "")
    if _int(keep) < 1 or not isinstance(wheelhouse, str) or (wheelhouse and not wheelhouse.startswith("/")):
        problems.append(f"host {host}: vllm_install_keep must be at least 1 (got {keep}) and vllm_install_wheelhouse "
                        f"must be an absolute path or \"\" (got {_json(wheelhouse)}).")
    return problems


def weights_input_problems(values, host) -> list:
    """One sentence per problem (the host, the variable, the fix) of the weights role's settings in ``values``
    (variable -> value; those left out are not checked); never raises."""
    values = values if isinstance(values, dict) else {}
    problems = _bound_problems(values, host, WEIGHTS_BOUNDS)
    if "vllm_weights_source_dir_on" in values and values["vllm_weights_source_dir_on"] not in ("host", "controller"):
        problems.append(f"host {host}: vllm_weights_source_dir_on is {_json(values['vllm_weights_source_dir_on'])}; "
                        "use host (the staged directory is on each host) or controller (it is pushed from the "
                        "controller).")
    if "vllm_weights_source_dir" in values:
        source = values["vllm_weights_source_dir"]
        if not isinstance(source, str) or (source and not source.startswith("/")):
            problems.append(f"host {host}: vllm_weights_source_dir is {_json(source)}; use an absolute path to a "
                            'staged directory of snapshots, or "" to fetch from the Hub.')
    if "vllm_weights_owner" in values:
        owner = values["vllm_weights_owner"]
        if not isinstance(owner, str) or not owner.strip():
            problems.append(f"host {host}: vllm_weights_owner is {_json(owner)}; name the user the weights belong "
                            "to, or leave it out (the plan's run_as user).")
    return problems


def service_input_problems(values, host, binds=None) -> list:
    """One sentence per problem (the host, the variable, the fix) of the service role's settings in ``values``
    (variable -> value; those left out are not checked); never raises and never shows a secret.

    ``binds``: the addresses the host's instances listen on (the plan's ``bind_address``, or the plan input
    ``vllm_service_host`` before there is a plan): with no API key, an address other than loopback is refused unless
    ``vllm_service_allow_unauthenticated`` is true."""
    values = values if isinstance(values, dict) else {}
    problems = _bound_problems(values, host, SERVICE_BOUNDS)
    for name in SERVICE_SECRETS:
        if name not in values:
            continue
        secret = values[name]
        if not isinstance(secret, str) or re.search(r"['\n\r]", secret):
            problems.append(f"host {host}: {name} must be a string without single quotes or line breaks (it is "
                            "written literally into a root-only environment file); set it again (its value is not "
                            "shown).")
    allow = as_bool(values.get("vllm_service_allow_unauthenticated", False))
    if allow is None:
        problems.append(f"host {host}: vllm_service_allow_unauthenticated is "
                        f"{_json(values['vllm_service_allow_unauthenticated'])}; use true or false.")
    elif not allow:
        key = values.get("vllm_service_api_key", "")
        open_to = sorted({str(b) for b in (binds or []) if str(b) not in LOOPBACK})
        if isinstance(key, str) and not key and open_to:
            problems.append(f"host {host}: the instances listen on {', '.join(open_to)} (vllm_service_host) but "
                            "vllm_service_api_key is empty, so anyone who reaches that address could use the models. "
                            "Set vllm_service_api_key (kept in a root-only environment file), bind to 127.0.0.1, or "
                            "set vllm_service_allow_unauthenticated: true.")
    return problems
