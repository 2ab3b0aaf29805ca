"""roles/vllm_install: defaults/main.yml and meta/argument_specs.yml describe the same variables,
with the same defaults, and every entry point's task file exists."""
import os
import re

import pytest
import yaml

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "roles", "vllm_install")


def load(*parts):
    with open(os.path.join(ROLE, *parts), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


DEFAULTS = load("defaults", "main.yml")
SPECS = load("meta", "argument_specs.yml")["argument_specs"]
TYPES = {"str": str, "bool": bool, "int": int, "list": list, "dict": dict}


@pytest.mark.parametrize("entry_point", sorted(SPECS))
def test_entry_point_options_match_defaults(entry_point):
    options = SPECS[entry_point]["options"]
    assert set(options) == set(DEFAULTS)
    for name, spec in options.items():
        assert spec.get("description"), name
        assert isinstance(DEFAULTS[name], TYPES[spec["type"]]), (name, spec["type"])
        templated = isinstance(DEFAULTS[name], str) and "{{" in DEFAULTS[name]
        if templated:
            assert "default" not in spec, name
        else:
            assert spec["default"] == DEFAULTS[name], name
        if "choices" in spec:
            assert DEFAULTS[name] in spec["choices"], name
        if spec["type"] == "list":
            assert spec.get("elements") == "str", name


@pytest.mark.parametrize("entry_point", sorted(SPECS))
def test_entry_point_task_file_exists(entry_point):
    assert os.path.isfile(os.path.join(ROLE, "tasks", entry_point + ".yml"))


def test_every_default_has_a_comment():
    with open(os.path.join(ROLE, "defaults", "main.yml"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^vllm_install_\w+:", line):
            above = index - 1
            # a comment directly above, or shared with the variable just above it
            while above >= 0 and re.match(r"^vllm_install_\w+:", lines[above]):
                above -= 1
            assert lines[above].startswith("#"), line


def test_variables_used_by_the_tasks_are_declared():
    used = set()
    tasks = os.path.join(ROLE, "tasks")
    for name in os.listdir(tasks):
        with open(os.path.join(tasks, name), encoding="utf-8") as handle:
            # tags (vllm_install_venv, ...) and comments are not variables
            text = "\n".join(line for line in handle.read().splitlines()
                             if not line.strip().startswith(("tags:", "#")))
        used |= set(re.findall(r"(?<![\w.])(vllm_install_[a-z0-9_]+)(?![a-z0-9_]| tag)", text))
    # names the role defines itself: registered results, set_fact exports, task-level vars
    defined = set()
    for name in os.listdir(tasks):
        with open(os.path.join(tasks, name), encoding="utf-8") as handle:
            text = handle.read()
        defined |= set(re.findall(r"register: (vllm_install_\w+)", text))
        defined |= set(re.findall(r"^\s+(vllm_install_\w+):", text, re.M))
    # the role's private constants (vars/main.yml, role__name)
    defined |= set(load("vars", "main.yml"))
    assert used - defined - set(DEFAULTS) == set()
