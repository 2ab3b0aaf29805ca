# Apache License 2.0 (see LICENSE)
"""The install role's input checks, in one place (controller side, no Ansible imports).

The install role asserts them before it changes anything (``tasks/validate.yml``, through the filter
``inferops.vllm.vllm_install_input_problems``), and the inventory validation (role ``vllm_validate``, filter
``vllm_inventory_problems``) reports the same sentences for what the inventory sets, with every other problem of the
inventory, before any host is contacted.
"""
from __future__ import annotations

import re

__all__ = ["INSTALL_INPUTS", "VARIANTS", "VERSION_PATTERN", "install_input_problems"]

#: Exact PEP 440 versions only (a release, optional pre/post/dev part): no ranges, no "latest".
VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)+((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$"
#: The builds the install role knows (its vars name what each installs: vllm_install__variants).
VARIANTS = ("cuda", "cpu")
#: The variables checked here; one left out (unset) takes the role's default, which is good.
INSTALL_INPUTS = ("vllm_install_version", "vllm_install_variant", "vllm_install_keep", "vllm_install_wheelhouse")


def _json(value) -> str:
    """The value as the messages show it: as text, JSON-quoted (Ansible's ``| string | to_json``)."""
    import json  # pylint: disable=import-outside-toplevel
    return json.dumps(str(value))


def _int(value):
    if isinstance(value, bool):
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return 0


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
