# Apache License 2.0 (see LICENSE)
"""Write what the inventory schema (plugins/plugin_utils/schema.py) documents, between markers:

- the ``vllm_instances`` options of ``roles/vllm_preflight/meta/argument_specs.yml`` (both entry points share
  them through a YAML anchor);
- the key tables of ``docs/plan.md`` (instance keys, model keys) and the settings -> flags table of
  ``docs/service.md``;
- the plan inputs (``plugins/plugin_utils/host_plan.py`` PLAN_INPUTS, one row each: default, doc, and the checks'
  choices): their options in the argument spec's main entry point, their table in ``docs/plan.md`` and the list of
  their names in ``roles/vllm_preflight/vars/main.yml``.

    python tools/schema_docs.py           rewrite the blocks
    python tools/schema_docs.py --check   exit 1 (with a diff) when a block differs from what the schema gives

``make lint`` runs ``--check``; a new key (or plan input) is one row of the schema (or of PLAN_INPUTS), then this
script.
"""
from __future__ import annotations

import argparse
import difflib
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".build"))

from ansible_collections.inferops.vllm.plugins.plugin_utils import schema  # noqa: E402
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import (  # noqa: E402
    PLAN_INPUTS, plan_inputs_spec, plan_inputs_table)

SPEC = os.path.join(ROOT, "roles", "vllm_preflight", "meta", "argument_specs.yml")
PLAN_MD = os.path.join(ROOT, "docs", "plan.md")
SERVICE_MD = os.path.join(ROOT, "docs", "service.md")
PREFLIGHT_VARS = os.path.join(ROOT, "roles", "vllm_preflight", "vars", "main.yml")
INPUTS_BEGIN = "# BEGIN schema: plan inputs, written by tools/schema_docs.py from plugins/plugin_utils/host_plan.py"
INPUTS_END = "# END schema: plan inputs"
YAML_BEGIN = "# BEGIN schema: vllm_instances options, written by tools/schema_docs.py from plugins/plugin_utils/schema.py"
YAML_END = "# END schema"
MODELS_BEGIN = "# BEGIN schema: vllm_models description, written by tools/schema_docs.py from plugins/plugin_utils/schema.py"


def _md_block(name, body):
    return (f"<!-- BEGIN schema: {name}, written by tools/schema_docs.py from plugins/plugin_utils/schema.py -->\n"
            f"{body}\n<!-- END schema: {name} -->")


def _replace(text, begin, end, block, path):
    """``text`` with the lines from the one starting with ``begin`` to the one starting with ``end`` replaced."""
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(begin)]
    if len(starts) != 1:
        raise SystemExit(f"{path}: expected one line starting with {begin!r}, found {len(starts)}")
    stop = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].strip().startswith(end)), None)
    if stop is None:
        raise SystemExit(f"{path}: no {end!r} after {begin!r}")
    return "\n".join(lines[:starts[0]] + block.split("\n") + lines[stop + 1:])


class _Dumper(yaml.SafeDumper):
    """Block sequences indented under their key (yamllint's indent-sequences)."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def spec_text(text):
    text = _yaml_block(text, YAML_BEGIN, YAML_END, schema.argument_spec_options(), SPEC)
    text = _yaml_block(text, MODELS_BEGIN, YAML_END, schema.models_description(), SPEC)
    return _yaml_block(text, INPUTS_BEGIN, INPUTS_END, plan_inputs_spec(), SPEC)


def _yaml_block(text, begin, end, data, path):
    """``text`` with the YAML of ``data`` between the lines ``begin`` and ``end``, at their indentation."""
    indent = next(line for line in text.split("\n") if line.strip().startswith(begin))
    pad = indent[:len(indent) - len(indent.lstrip())]
    dumped = yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=110, default_flow_style=False)
    body = "\n".join(pad + line if line else line for line in dumped.rstrip("\n").split("\n"))
    return _replace(text, begin, end, f"{pad}{begin}\n{body}\n{pad}{end}", path)


def vars_text(text):
    return _yaml_block(text, INPUTS_BEGIN, INPUTS_END, {"vllm_preflight__plan_inputs": list(PLAN_INPUTS)},
                       PREFLIGHT_VARS)


def plan_text(text):
    for name, level in (("instance keys", schema.INSTANCE), ("model keys", schema.MODEL)):
        text = _replace(text, f"<!-- BEGIN schema: {name}", f"<!-- END schema: {name}",
                        _md_block(name, schema.docs_table(level)), PLAN_MD)
    block = _md_block("plan inputs", plan_inputs_table())
    block = block.replace("plugins/plugin_utils/schema.py", "plugins/plugin_utils/host_plan.py")
    return _replace(text, "<!-- BEGIN schema: plan inputs", "<!-- END schema: plan inputs", block, PLAN_MD)


def service_text(text):
    return _replace(text, "<!-- BEGIN schema: flags", "<!-- END schema: flags",
                    _md_block("flags", schema.flags_table()), SERVICE_MD)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--check", action="store_true", help="fail when a block is out of date")
    args = ap.parse_args()
    stale = 0
    for path, render in ((SPEC, spec_text), (PLAN_MD, plan_text), (SERVICE_MD, service_text),
                         (PREFLIGHT_VARS, vars_text)):
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
        new = render(current)
        if new == current:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), new.splitlines(True),
                                                       path, path + " (from the schema)"))
        else:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(new)
            print(f"wrote {os.path.relpath(path, ROOT)}")
    if stale:
        print(f"\n{stale} file(s) differ from plugins/plugin_utils/schema.py: run python tools/schema_docs.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
