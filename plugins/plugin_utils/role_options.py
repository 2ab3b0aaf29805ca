# Apache License 2.0 (see LICENSE)
"""A role's variables checked against its argument spec, in the project's words (controller side, no Ansible imports).

Ansible checks a role's ``meta/argument_specs.yml`` itself, but its messages name neither the host nor
the fix ("unable to convert to int", "Supported parameters include ..."). The inventory validation
(role ``inferops.vllm.vllm_validate``) runs first and reads the same spec: ``option_problems`` checks
each variable's type and choices and says what to write instead. The spec stays the one place that
knows the types; Ansible's own check runs after it, as the second line.
"""
from __future__ import annotations

import math

from ansible_collections.inferops.vllm.plugins.plugin_utils.values import (
    as_bool,
    as_float,
    as_int,
    kind,
    plain,
    shown,
)

__all__ = ["option_problems"]

#: What to write instead, per argument spec type.
_WANTED = {"bool": "true or false", "int": "a whole number", "float": "a number", "str": "a string",
           "path": "a path (a string)", "dict": "a dict (NAME: value)", "list": "a list"}
_PLURAL = {"bool": "true/false values", "int": "whole numbers", "float": "numbers", "str": "strings", "path": "paths",
           "dict": "dicts", "list": "lists"}


def _fits(kind_name, value) -> bool:
    """Whether Ansible's conversion for ``kind_name`` accepts ``value`` (the same leniency: "8" is an int)."""
    if kind_name == "bool":
        return as_bool(value) is not None
    if kind_name == "int":
        return as_int(value) is not None
    if kind_name == "float":
        num = as_float(value)
        return num is not None and not math.isnan(num)
    if kind_name in ("str", "path"):
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
    if kind_name == "dict":
        return isinstance(value, dict)
    if kind_name == "list":
        return isinstance(value, list)
    return True


def option_problems(options, values, skip=()) -> list:
    """Problems of ``values`` (variable -> value; unset ones left out or None) against ``options``.

    ``options``: the ``options`` of one entry point of an argument spec (name -> type, elements, choices).
    ``skip``: variables another check reads (the inventory's models and instances, the plan inputs).
    One sentence per problem: the variable, what it is, what to write instead. Never raises.
    """
    options, values = plain(options), plain(values)
    if not isinstance(options, dict) or not isinstance(values, dict):
        return []
    problems = []
    for name, spec in options.items():
        if name in skip or not isinstance(spec, dict) or values.get(name) is None:
            continue
        value = values[name]
        wanted = spec.get("type", "str")
        choices = spec.get("choices")
        if wanted in _WANTED and not _fits(wanted, value):
            problems.append(f"{name} is {shown(value)} ({kind(value)}); use {_WANTED[wanted]}"
                            + (f": one of {', '.join(map(str, choices))}" if isinstance(choices, list) else ""))
            continue
        if isinstance(choices, list) and value not in choices and str(value) not in map(str, choices):
            problems.append(f"{name} is {shown(value)}; use one of {', '.join(map(str, choices))}")
            continue
        elements = spec.get("elements")
        if wanted == "list" and elements in _WANTED:
            bad = [item for item in value if item is None or not _fits(elements, item)]
            if bad:
                problems.append(f"{name} has {shown(bad[0])} ({kind(bad[0])}) among its items; use a list of "
                                f"{_PLURAL.get(elements, elements)}")
    return problems
