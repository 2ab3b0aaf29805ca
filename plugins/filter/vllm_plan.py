# Apache License 2.0 (see LICENSE)
"""Filter ``vllm_plan``: the plan of one host, the contract every later stage reads.

The logic lives in ``plugins/plugin_utils/host_plan.py``; this wrapper turns its refusals into
``AnsibleFilterError`` or, with ``on_problems='return'`` (what the preflight role uses), into a result
``{"schema": 1, "host": ..., "problems": [...]}`` that a ``fail`` task reports cleanly. With ``return``
nothing escapes: an unexpected error on odd input becomes one more problem naming the host.
"""
from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleError, AnsibleFilterError
from jinja2.exceptions import TemplateError


ON_PROBLEMS = ("fail", "return")


def unexpected(host, exc, variable=None):
    """One problem line for an error the checks did not foresee (a bug to report, never a traceback)."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import scrub  # pylint: disable=import-outside-toplevel
    if isinstance(exc, (TemplateError, AnsibleError)):
        # reading a value ran one of the inventory's templates, and it failed (an undefined variable, say)
        text = scrub(getattr(exc, "message", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
        what = variable or "a value of vllm_models, vllm_instances or a variable the plan reads"
        return (f"host {host}: {what} could not be templated ({text}); define the variable it names "
                "(group_vars, host_vars or -e) or fix the template")
    return (f"host {host}: the plan could not be computed from vllm_models, vllm_instances and the plan inputs "
            f"({type(exc).__name__}: {scrub(exc)}); check them against docs/plan.md, and please report this "
            "input: it should have been refused with a clear message")


def vllm_plan(models, instances, facts=None, inputs=None, host=None, fleet=None, on_problems="fail"):
    """Normalise the inventory, place the instances, decide their units; see vllm_plan.yml."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import (  # pylint: disable=import-outside-toplevel
        PLAN_SCHEMA_VERSION, PlanContractError, build_plan)
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import scrub  # pylint: disable=import-outside-toplevel
    if on_problems not in ON_PROBLEMS:
        raise AnsibleFilterError(f"vllm_plan: on_problems is {on_problems!r}; use fail or return")
    try:
        return build_plan(models, instances, facts=facts, inputs=inputs, host=host, fleet=fleet)
    except PlanContractError as exc:
        if on_problems == "fail":
            raise AnsibleFilterError(str(exc)) from exc
        return {"schema": PLAN_SCHEMA_VERSION, "host": host, "problems": [scrub(p) for p in exc.lines]}
    except Exception as exc:  # pylint: disable=broad-exception-caught
        if on_problems == "fail":
            raise AnsibleFilterError(unexpected(host, exc)) from exc
        return {"schema": PLAN_SCHEMA_VERSION, "host": host, "problems": [unexpected(host, exc)]}


def vllm_fleet_plan(given, fleet=None):
    """Every host's plan at once, the routers' workers read from the plans; see vllm_fleet_plan.yml. Never raises:
    a host that cannot be planned gets ``{"schema": 1, "host": ..., "problems": [...]}``."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_SCHEMA_VERSION, plan_fleet  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import scrub  # pylint: disable=import-outside-toplevel
    if not isinstance(given, Mapping) or not all(isinstance(v, Mapping) for v in given.values()):
        raise AnsibleFilterError("vllm_fleet_plan: pass a dict of inventory host -> {models, instances, facts, inputs} "
                                 "(what vllm_plan takes for that host)")
    given = {str(h): dict(v) for h, v in given.items()}
    try:
        plans = plan_fleet(given, fleet)
    except Exception as exc:  # pylint: disable=broad-exception-caught
        return {h: {"schema": PLAN_SCHEMA_VERSION, "host": h, "problems": [unexpected(h, exc)]} for h in given}
    return {h: dict(p, schema=PLAN_SCHEMA_VERSION, host=h, problems=[scrub(x) for x in p["problems"]])
            if "problems" in p else p for h, p in plans.items()}


class FilterModule:
    """The plan contract."""

    def filters(self):
        return {"vllm_plan": vllm_plan, "vllm_fleet_plan": vllm_fleet_plan}
