# Apache License 2.0 (see LICENSE)
"""Filters that check and resolve the inventory's model and instance declarations.

``vllm_inventory_problems`` returns every problem the plan can see before any host is contacted: the one
normalisation of the models and instances (``plugins/plugin_utils/inventory.py``), the plan inputs
(``host_plan.input_problems``) and, given an argument spec, the role's other variables
(``role_options.option_problems``): one sentence per problem, each naming the host, the variable and the
fix. It never raises: an unexpected error on odd input becomes one more problem.
The plan itself (normalisation, placement with or without GPUs, units) is the ``vllm_plan`` filter's.
"""
from __future__ import annotations

from ansible_collections.inferops.vllm.plugins.filter.vllm_plan import unexpected


def _read(variables, names, host):
    """The variables of ``names`` that are set, each read (templated) on its own: a template that fails names its
    variable instead of failing the whole check. ``variables``: a dict, or a host's ``hostvars`` (lazy)."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain  # pylint: disable=import-outside-toplevel
    values, problems, failed = {}, [], set()
    for name in names:
        try:
            if name in variables:
                values[name] = plain(variables[name])
        except Exception as exc:  # pylint: disable=broad-exception-caught
            problems.append(unexpected(host, exc, name))
            failed.add(name)
    return values, problems, failed


#: The front doors' keys (role vllm_frontdoor), checked with the inventory so that a bad key stops the run before any
#: host changes; the sentences name models and client names, never a key.
KEY_VARIABLES = ("vllm_frontdoor_api_keys", "vllm_frontdoor_instance_api_key", "vllm_service_api_key",
                 "vllm_frontdoor_allow_unauthenticated")


def _key_problems(variables, models, host):
    from ansible_collections.inferops.vllm.plugins.plugin_utils.edge import key_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import as_bool  # pylint: disable=import-outside-toplevel
    keys, problems, failed = _read(variables, KEY_VARIABLES, host)
    if failed:
        return problems
    instance_key = keys.get("vllm_frontdoor_instance_api_key", keys.get("vllm_service_api_key", ""))
    allow = as_bool(keys.get("vllm_frontdoor_allow_unauthenticated", False)) is True
    return key_problems(keys.get("vllm_frontdoor_api_keys"), "vllm_frontdoor_api_keys", models, instance_key, allow)


def vllm_inventory_problems(models, instances, host=None, variables=None, spec=None):
    """Return a list of problems (empty when the declarations are consistent); never raises.

    ``variables``: the variables that are set (name -> value, or a host's ``hostvars``): the plan inputs among them
    are checked as the plan reads them, the others named in ``spec`` (the ``options`` of an argument spec entry
    point) against their types. With ``models`` and ``instances`` null, ``vllm_models`` and ``vllm_instances`` are
    read from ``variables`` too. Each variable is read on its own.
    """
    from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS, inventory_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.role_options import option_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.stage_inputs import (  # pylint: disable=import-outside-toplevel
        INSTALL_INPUTS, SERVICE_INPUTS, WEIGHTS_INPUTS, install_input_problems, service_input_problems,
        weights_input_problems)
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain, scrub  # pylint: disable=import-outside-toplevel
    try:
        names = ["vllm_models", "vllm_instances"] + list(PLAN_INPUTS)
        names += [n for n in INSTALL_INPUTS + WEIGHTS_INPUTS + SERVICE_INPUTS if n not in names]
        names += [n for n in (plain(spec) or {}) if n not in names]
        values, problems, failed = _read(variables if variables is not None else {}, names, host)
        if models is None and instances is None:
            models, instances = values.get("vllm_models"), values.get("vllm_instances")
            if failed & {"vllm_models", "vllm_instances"}:
                # one of them could not be read (named above): checking the other against it would only add noise
                models, instances = {}, []
        inputs = {k: v for k, v in values.items() if k in PLAN_INPUTS}
        problems += inventory_problems(models, instances, inputs, host)
        where = f"host {host}: " if host else ""
        skip = set(PLAN_INPUTS) | {"vllm_models", "vllm_instances"}
        problems += [where + p for p in option_problems(spec, values, skip=skip)] if spec else []
        problems += [where + p for p in _key_problems(variables if variables is not None else {}, models, host)]
        problems += install_input_problems({k: v for k, v in values.items() if k in INSTALL_INPUTS}, host)
        problems += weights_input_problems({k: v for k, v in values.items() if k in WEIGHTS_INPUTS}, host)
        # the instances listen on vllm_service_host (the plan's bind_address of every instance)
        bind = values.get("vllm_service_host", PLAN_INPUTS["vllm_service_host"][1])
        problems += service_input_problems({k: v for k, v in values.items() if k in SERVICE_INPUTS}, host, [bind])
        return [scrub(p) for p in problems]
    except Exception as exc:  # pylint: disable=broad-exception-caught
        return [unexpected(host, exc)]


def vllm_install_input_problems(values, host=None):
    """The install role's input checks (version, variant, keep count, wheelhouse) of ``values`` (variable -> value),
    one sentence per problem; the install role asserts this list is empty, the inventory validation reports it."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.stage_inputs import install_input_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain  # pylint: disable=import-outside-toplevel
    return install_input_problems(plain(values), host)


def vllm_weights_input_problems(values, host=None):
    """The weights role's settings checks (counts, timeouts, the fan-out's port and degree, the staged directory, the
    owner) of ``values`` (variable -> value), one sentence per problem; the weights role asserts this list is empty,
    the inventory validation reports it."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.stage_inputs import weights_input_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain  # pylint: disable=import-outside-toplevel
    return weights_input_problems(plain(values), host)


def vllm_service_input_problems(values, host=None, binds=None):
    """The service role's settings checks (the units' and the watchdog's whole numbers, the secrets' form, an API
    without a key beyond loopback) of ``values`` (variable -> value), one sentence per problem, never a secret; the
    service role asserts this list is empty, the inventory validation reports it. ``binds``: the addresses the
    instances listen on."""
    from ansible_collections.inferops.vllm.plugins.plugin_utils.stage_inputs import service_input_problems  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.plugin_utils.values import plain  # pylint: disable=import-outside-toplevel
    return service_input_problems(plain(values), host, plain(binds))


class FilterModule:
    """Inventory checks for inferops.vllm."""

    def filters(self):
        return {"vllm_inventory_problems": vllm_inventory_problems,
                "vllm_install_input_problems": vllm_install_input_problems,
                "vllm_weights_input_problems": vllm_weights_input_problems,
                "vllm_service_input_problems": vllm_service_input_problems}
