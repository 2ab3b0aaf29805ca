"""The inventory schema (plugins/plugin_utils/schema.py, issue 25): one row per key, everything else derived.

Each vLLM setting reaches the unit's argv through its row alone (the real planner on a captured host); a wrong
value is refused naming the host, the key and the fix; an instance overrides its model's setting; a flag that
became a key still works in extra_args with a warning, and giving both is refused; the argument specs and the
docs' tables are what the schema writes (tools/schema_docs.py --check, also in make lint).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.plugin_utils import schema
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan
from ansible_collections.inferops.vllm.plugins.plugin_utils.inventory import scheduler_problems
from test_plan_contract import ROOT, SHA, host_facts

MODELS = {"m": {"repo_id": "org/m", "revision": SHA}}
#: the six settings users ask for most, with a value and the flags it must give
SIX = [
    ("max_num_seqs", 64, ["--max-num-seqs", "64"]),
    ("max_num_batched_tokens", 8192, ["--max-num-batched-tokens", "8192"]),
    ("enable_prefix_caching", True, ["--enable-prefix-caching"]),
    ("enable_prefix_caching", False, ["--no-enable-prefix-caching"]),
    ("kv_cache_dtype", "fp8", ["--kv-cache-dtype", "fp8"]),
    ("quantization", "fp8", ["--quantization", "fp8"]),
    ("enable_chunked_prefill", True, ["--enable-chunked-prefill"]),
    ("enable_chunked_prefill", False, ["--no-enable-chunked-prefill"]),
]


def plan(models=None, **instance):
    inst = dict({"name": "chat", "model": "m"}, **instance)
    return build_plan(models or MODELS, [inst], host_facts("h200-1gpu"), host="h")


def argv_has(argv, flags):
    """``flags`` appear in ``argv`` as one run of tokens."""
    return any(argv[i:i + len(flags)] == flags for i in range(len(argv)))


@pytest.mark.parametrize("key,value,flags", SIX, ids=[f"{k}={v}" for k, v, _f in SIX])
def test_each_setting_reaches_the_argv_from_the_model_and_from_the_instance(key, value, flags):
    from_model = plan({"m": dict(MODELS["m"], **{key: value})})["instances"][0]["argv"]
    assert argv_has(from_model, flags), from_model
    from_instance = plan(**{key: value})["instances"][0]["argv"]
    assert argv_has(from_instance, flags), from_instance
    # left out: no flag at all (vLLM's own default)
    plain = plan()["instances"][0]["argv"]
    assert not any(t in ("--" + key.replace("_", "-"), "--no-" + key.replace("_", "-")) for t in plain)


def test_an_instance_overrides_its_models_setting():
    models = {"m": dict(MODELS["m"], max_num_seqs=128, enable_prefix_caching=True)}
    argv = plan(models, max_num_seqs=8, enable_prefix_caching=False)["instances"][0]["argv"]
    assert argv_has(argv, ["--max-num-seqs", "8"]) and "128" not in argv
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv


def test_flags_follow_the_rows_order():
    models = {"m": dict(MODELS["m"], max_model_len=4096, enable_chunked_prefill=True, max_num_seqs=4,
                        tool_call_parser="hermes", trust_remote_code=True)}
    argv = plan(models)["instances"][0]["argv"]
    shown = [t for t in argv if t.startswith("--") and t.lstrip("-").removeprefix("no-") in
             {r["flag"] for r in schema.FLAG_ROWS} | {"enable-auto-tool-choice"}]
    assert shown == ["--max-model-len", "--enable-auto-tool-choice", "--tool-call-parser", "--trust-remote-code",
                     "--shutdown-timeout", "--max-num-seqs", "--enable-chunked-prefill"]


@pytest.mark.parametrize("key,value,fix", [
    ("max_num_seqs", 0, "use a positive whole number >= 1"),
    ("max_num_seqs", "lots", "use a positive whole number >= 1"),
    ("max_num_batched_tokens", -5, "use a positive whole number >= 1"),
    ("enable_prefix_caching", "maybe", "use true or false"),
    ("enable_chunked_prefill", 3, "use true or false"),
    ("kv_cache_dtype", "fp 8", "use a name such as 'fp8'"),
])
def test_a_wrong_value_is_refused_naming_host_key_and_fix(key, value, fix):
    with pytest.raises(PlanContractError) as err:
        plan({"m": dict(MODELS["m"], **{key: value})})
    text = str(err.value)
    assert "host h" in text and f"vllm_models.m.{key} is {value!r}" in text and fix in text, text
    with pytest.raises(PlanContractError) as err:
        plan(**{key: value})
    assert f"vllm_instances[0] (chat).{key} is {value!r}" in str(err.value), str(err.value)


def test_a_promoted_flag_in_extra_args_still_works_with_a_warning_naming_the_key():
    result = plan(extra_args=["--max-num-seqs", "32", "--no-enable-prefix-caching"])
    argv = result["instances"][0]["argv"]
    assert argv_has(argv, ["--max-num-seqs", "32"]) and "--no-enable-prefix-caching" in argv
    text = "\n".join(result["warnings"])
    assert ("instance 'chat': extra_args has '--max-num-seqs 32'; since 1.1.0 this is the key max_num_seqs" in text
            and "set max_num_seqs and remove the flag" in text), text
    assert "this is the key enable_prefix_caching" in text
    # a flag the schema sets from before 1.1.0 is still refused, naming its key
    with pytest.raises(PlanContractError) as err:
        plan(extra_args=["--max-model-len", "4096"])
    assert "duplicates a flag the role sets (--max-model-len); remove it and set max_model_len" in str(err.value)


def test_the_key_and_its_flag_together_are_refused():
    with pytest.raises(PlanContractError) as err:
        plan({"m": dict(MODELS["m"], max_num_seqs=64)}, extra_args=["--max-num-seqs=16"])
    text = str(err.value)
    assert "max_num_seqs is 64 and extra_args has '--max-num-seqs 16' too; give it once" in text, text


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from([r["key"] for r in schema.FLAG_ROWS if r["check"] in ("positive", "bool")]),
                       st.one_of(st.booleans(), st.integers(min_value=1, max_value=10 ** 6)), max_size=4))
def test_any_valid_settings_give_exactly_their_flags(values):
    """Property: for settings of the right type, each row gives its flags, and no other row adds one."""
    valid = {k: v for k, v in values.items() if schema.value_problem(k, v) is None}
    if scheduler_problems(valid, "m"):  # valid each, refused together (what vLLM's scheduler refuses at start)
        with pytest.raises(PlanContractError, match="which vLLM refuses at start"):
            plan({"m": dict(MODELS["m"], **valid)})
        return
    argv = plan({"m": dict(MODELS["m"], **valid)})["instances"][0]["argv"]
    for row in schema.FLAG_ROWS:
        flag = "--" + row["flag"]
        value = valid.get(row["key"], row["default"])  # a row with a default (shutdown_timeout) sets it unasked
        if value is None or (row["form"] == "switch" and not value):
            assert flag not in argv
        elif row["form"] == "tristate":
            assert (flag if value else "--no-" + row["flag"]) in argv
        elif row["form"] == "value":
            assert argv_has(argv, [flag, str(value)])


def test_every_row_is_documented_and_derived():
    keys = [r["key"] for r in schema.ROWS]
    assert len(keys) == len(set(keys))
    for row in schema.ROWS:
        assert row["doc"] and row["type"] in ("str", "int", "float", "bool", "raw", "list", "dict", "path"), row
        if row["flag"]:
            assert row["form"] in ("value", "switch", "tristate") and row["check"], row
            assert schema.MANAGED[row["flag"]].startswith(row["key"]), row
    assert set(schema.OVERRIDES) <= set(schema.MODEL_KEYS) & set(schema.INSTANCE_KEYS)


def test_argument_specs_and_docs_are_what_the_schema_writes():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "schema_docs.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
