"""The later stages' own settings (install, weights, service): one function each, asserted by the role and run by the
inventory validation before any host changes."""
from __future__ import annotations

import os
import re

import yaml
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_inventory import vllm_inventory_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.stage_inputs import (
    SERVICE_BOUNDS, SERVICE_INPUTS, VARIANTS, WEIGHTS_BOUNDS, WEIGHTS_INPUTS, accepted, install_input_problems,
    service_input_problems, weights_input_problems)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def test_the_variants_are_those_the_install_role_installs():
    with open(os.path.join(ROOT, "roles", "vllm_install", "vars", "main.yml")) as handle:
        variants = yaml.safe_load(handle)["vllm_install__variants"]
    with open(os.path.join(ROOT, "roles", "vllm_install", "meta", "argument_specs.yml")) as handle:
        spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]["vllm_install_variant"]
    assert tuple(variants) == VARIANTS and tuple(spec["choices"]) == VARIANTS


def test_the_defaults_and_good_values_pass():
    assert install_input_problems({}, "h") == []
    assert install_input_problems({"vllm_install_version": "0.32.0", "vllm_install_variant": "cpu",
                                   "vllm_install_keep": "3", "vllm_install_wheelhouse": "/srv/wheels"}, "h") == []
    for version in ("0.11.1rc2", "1.0.0.post1", "0.9.2.dev3"):
        assert install_input_problems({"vllm_install_version": version}, "h") == [], version


def test_each_bad_value_names_the_host_the_variable_and_the_fix():
    got = install_input_problems({"vllm_install_version": 0.32, "vllm_install_variant": "rocm",
                                  "vllm_install_keep": 0, "vllm_install_wheelhouse": "wheels"}, "gpu-1")
    assert got == [
        'host gpu-1: vllm_install_version="0.32" is not an exact vLLM release. Fix: set vllm_install_version to a '
        'released version, quoted, for example "0.32.0" (no ranges, no "latest").',
        'host gpu-1: vllm_install_variant="rocm" is not supported. Fix: set vllm_install_variant to one of cuda, cpu.',
        'host gpu-1: vllm_install_keep must be at least 1 (got 0) and vllm_install_wheelhouse must be an absolute '
        'path or "" (got "wheels").']
    for version in (">=0.32", "latest", "0.32.x", "v0.32.0", None, ["0.32.0"], 32):
        assert "vllm_install_version" in install_input_problems({"vllm_install_version": version}, "h")[0], version


def test_odd_numbers_are_refused_not_raised():
    """What hypothesis found: an infinite keep count (int() raises OverflowError) is a sentence like any other."""
    for keep in (float("inf"), float("-inf"), float("nan"), "1e999"):
        got = install_input_problems({"vllm_install_keep": keep}, "h")
        assert len(got) == 1 and got[0].startswith("host h: vllm_install_keep must be at least 1"), (keep, got)
    for port in (float("inf"), float("nan"), 1e300):
        got = weights_input_problems({"vllm_weights_fanout_port": port}, "h")
        assert len(got) == 1 and "vllm_weights_fanout_port" in got[0], (port, got)


def test_the_inventory_validation_reports_them_with_every_other_problem():
    """What the inventory sets reaches the check through vllm_inventory_problems (one task for the batch)."""
    got = vllm_inventory_problems(None, None, host="gpu-1", variables={
        "vllm_models": {}, "vllm_instances": [], "vllm_install_version": "latest"})
    assert any(p.startswith('host gpu-1: vllm_install_version="latest" is not an exact vLLM release') for p in got), got


@given(st.dictionaries(st.sampled_from(["vllm_install_version", "vllm_install_variant", "vllm_install_keep",
                                        "vllm_install_wheelhouse"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                      st.integers(), max_size=2))))
def test_any_value_gives_sentences_never_an_exception(values):
    for problem in install_input_problems(values, "h"):
        assert problem.startswith("host h: vllm_install_") and problem.endswith(".")


def test_each_roles_argument_spec_says_the_bound_its_check_uses():
    """issue 39: the bound a role's docs (its argument spec, and the README written from it) give a whole-number
    setting is the one the check uses: the spec's "Accepted:" sentence is ``accepted(name)``, from the same row, and
    the ends of the range pass the check while one step outside fails."""
    for role, bounds, check in (("vllm_weights", WEIGHTS_BOUNDS, weights_input_problems),
                                ("vllm_service", SERVICE_BOUNDS, service_input_problems)):
        with open(os.path.join(ROOT, "roles", role, "meta", "argument_specs.yml")) as handle:
            options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
        for name, (low, high, _what) in bounds.items():
            doc = options[name]["description"]
            doc = " ".join(doc) if isinstance(doc, list) else doc
            assert f"Accepted: {accepted(name)}." in doc, (role, name, doc)
            assert options[name]["type"] == "int", name
            for good in (low, high if high is not None else low * 10 + 1000):
                assert check({name: good}, "h") == [], (name, good)
            for bad in (low - 1,) + ((high + 1,) if high is not None else ()):
                assert check({name: bad}, "h") == [f'host h: {name} is "{bad}"; use {accepted(name)} ({_what}).']


def test_the_weights_defaults_are_good_and_each_bad_setting_is_named_with_its_bound():
    with open(os.path.join(ROOT, "roles", "vllm_weights", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    given = {k: defaults[k] for k in WEIGHTS_INPUTS if k != "vllm_weights_owner"}
    assert weights_input_problems(dict(given, vllm_weights_owner="vllm"), "h") == []
    got = weights_input_problems({"vllm_weights_keep": 0, "vllm_weights_fanout_port": 70000,
                                  "vllm_weights_timeout": "30", "vllm_weights_fanout_degree": 1.5,
                                  "vllm_weights_source_dir_on": "both", "vllm_weights_source_dir": "stage",
                                  "vllm_weights_owner": " "}, "gpu-1")
    assert got == [
        'host gpu-1: vllm_weights_keep is "0"; use a whole number of at least 1 (snapshots kept per model).',
        'host gpu-1: vllm_weights_timeout is "30"; use a whole number of at least 60 (seconds a fetch may take).',
        'host gpu-1: vllm_weights_fanout_port is "70000"; use a whole number from 1 to 65535 (a TCP port number).',
        'host gpu-1: vllm_weights_fanout_degree is "1.5"; use a whole number of at least 0 (hosts each host serves '
        '(1: a chain, 0: every host from the source)).',
        'host gpu-1: vllm_weights_source_dir_on is "both"; use host (the staged directory is on each host) or '
        'controller (it is pushed from the controller).',
        'host gpu-1: vllm_weights_source_dir is "stage"; use an absolute path to a staged directory of snapshots, '
        'or "" to fetch from the Hub.',
        'host gpu-1: vllm_weights_owner is " "; name the user the weights belong to, or leave it out (the plan\'s '
        'run_as user).']


def test_a_bad_weights_setting_in_the_inventory_is_refused_before_any_host_changes():
    got = vllm_inventory_problems(None, None, host="gpu-1", variables={
        "vllm_models": {}, "vllm_instances": [], "vllm_weights_fanout_port": "eighty"})
    assert any(p.startswith('host gpu-1: vllm_weights_fanout_port is "eighty"') for p in got), got


@given(st.dictionaries(st.sampled_from(WEIGHTS_INPUTS),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                                 st.lists(st.integers(), max_size=2))))
def test_any_weights_setting_gives_sentences_never_an_exception(values):
    for problem in weights_input_problems(values, "h"):
        assert problem.startswith("host h: vllm_weights_") and problem.endswith(".")


def _service_defaults():
    with open(os.path.join(ROOT, "roles", "vllm_service", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    return {k: defaults[k] for k in SERVICE_INPUTS if "{{" not in str(defaults[k])}


def test_the_service_defaults_are_good_and_each_bad_setting_is_named_never_a_secret():
    defaults = _service_defaults()
    assert set(SERVICE_INPUTS) - set(defaults) == {"vllm_service_health_timeout"}  # a template: the start timeout
    assert service_input_problems(defaults, "h", ["127.0.0.1"]) == []
    got = service_input_problems({"vllm_service_timeout_start_sec": 0, "vllm_service_limit_nofile": "many",
                                  "vllm_service_api_key": "sk-it's\nsecret", "vllm_service_hf_token": 42},
                                 "gpu-1", ["127.0.0.1"])
    assert got == [
        'host gpu-1: vllm_service_timeout_start_sec is "0"; use a whole number of at least 1 (seconds systemd lets '
        'an instance start (TimeoutStartSec=)).',
        'host gpu-1: vllm_service_limit_nofile is "many"; use a whole number of at least 1024 (open files of an '
        'instance (LimitNOFILE=)).',
        "host gpu-1: vllm_service_api_key must be a string without single quotes or line breaks (it is written "
        "literally into a root-only environment file); set it again (its value is not shown).",
        "host gpu-1: vllm_service_hf_token must be a string without single quotes or line breaks (it is written "
        "literally into a root-only environment file); set it again (its value is not shown)."]
    assert not any("secret" in p for p in got)


@given(bind=st.sampled_from(["0.0.0.0", "10.0.0.5", "::", "127.0.0.1", "::1", "localhost"]),
       key=st.sampled_from(["", "sk-1"]), allow=st.sampled_from([None, True, False, "yes", "no"]))
def test_an_api_without_a_key_is_refused_beyond_loopback_unless_allowed(bind, key, allow):
    values = {"vllm_service_api_key": key}
    if allow is not None:
        values["vllm_service_allow_unauthenticated"] = allow
    got = service_input_problems(values, "h", [bind])
    refused = not key and bind not in ("127.0.0.1", "::1", "localhost") and allow not in (True, "yes")
    assert bool(got) == refused, got
    if refused:
        assert got == [f"host h: the instances listen on {bind} (vllm_service_host) but vllm_service_api_key is "
                       "empty, so anyone who reaches that address could use the models. Set vllm_service_api_key "
                       "(kept in a root-only environment file), bind to 127.0.0.1, or set "
                       "vllm_service_allow_unauthenticated: true."]


def test_a_bad_service_setting_in_the_inventory_is_refused_before_any_host_changes():
    """The inventory's vllm_service_host is the bind the validation checks (the plan's rule: every instance binds
    it); the secret itself is never in a sentence."""
    got = vllm_inventory_problems(None, None, host="gpu-1", variables={
        "vllm_models": {}, "vllm_instances": [], "vllm_service_host": "0.0.0.0", "vllm_service_watchdog_interval": 1,
        "vllm_service_hf_token": "hf_abc'def"})
    assert any(p.startswith("host gpu-1: the instances listen on 0.0.0.0 (vllm_service_host)") for p in got), got
    assert any(p.startswith('host gpu-1: vllm_service_watchdog_interval is "1"') for p in got), got
    assert any(p.startswith("host gpu-1: vllm_service_hf_token must be a string") for p in got), got
    assert not any("hf_abc" in p for p in got), got
    assert vllm_inventory_problems(None, None, host="gpu-1", variables={
        "vllm_models": {}, "vllm_instances": [], "vllm_service_host": "0.0.0.0", "vllm_service_api_key": "k"}) == []


def test_the_service_roles_check_reads_exactly_these_settings():
    """roles/vllm_service/tasks/validate.yml picks the settings by a pattern of variable names: it must name exactly
    SERVICE_INPUTS among the role's variables (its defaults and its argument spec)."""
    with open(os.path.join(ROOT, "roles", "vllm_service", "tasks", "validate.yml")) as handle:
        task = next(t for t in yaml.safe_load(handle) if t.get("name") == "Check the settings, the secrets and the bind address")
    pattern = "".join(re.findall(r"'([^']*)'", task["vars"]["_names"].split("varnames',", 1)[1]))
    with open(os.path.join(ROOT, "roles", "vllm_service", "meta", "argument_specs.yml")) as handle:
        names = set(yaml.safe_load(handle)["argument_specs"]["main"]["options"])
    with open(os.path.join(ROOT, "roles", "vllm_service", "defaults", "main.yml")) as handle:
        names |= set(yaml.safe_load(handle))
    assert {n for n in names if re.search(pattern, n)} == set(SERVICE_INPUTS)


@given(st.dictionaries(st.sampled_from(SERVICE_INPUTS),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                                 st.lists(st.integers(), max_size=2))),
       st.lists(st.one_of(st.text(max_size=8), st.none(), st.integers()), max_size=3))
def test_any_service_setting_gives_sentences_never_an_exception(values, binds):
    for problem in service_input_problems(values, "h", binds):
        assert problem.startswith("host h: ") and problem.endswith(".")
