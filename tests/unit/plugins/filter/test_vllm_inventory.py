"""Inventory checks: every problem names the host, the variable and the fix."""
import json
import os

import pytest

from ansible_collections.inferops.vllm.plugins.filter.vllm_inventory import vllm_inventory_problems
from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PlanContractError, build_plan

HOSTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "hosts")

SHA = "0123456789abcdef0123456789abcdef01234567"
GOOD_MODELS = {"tiny": {"repo_id": "inferops/tiny-llama", "revision": SHA, "weights_bytes": 2_000_000,
                        "num_attention_heads": 4}}
GOOD_INSTANCES = [{"name": "chat", "model": "tiny", "tensor_parallel_size": 2}]


def test_consistent_inventory_has_no_problems():
    assert vllm_inventory_problems(GOOD_MODELS, GOOD_INSTANCES, host="gpu1") == []


@pytest.mark.parametrize("models,instances,needles", [
    ({"tiny": {"repo_id": "inferops/tiny", "revision": "main"}}, [],
     ["host gpu1", "vllm_models.tiny.revision", "'main'", "40-hex", "allow_unpinned"]),
    ({"tiny": {"repo_id": "no-slash", "revision": SHA}}, [], ["vllm_models.tiny.repo_id", "org/name"]),
    ({"Bad Name": {"repo_id": "a/b", "revision": SHA}}, [], ["vllm_models.Bad Name", "rename"]),
    ({"tiny": {"repo_id": "a/b"}}, [], ["vllm_models.tiny.revision is missing", "pin"]),
    ({"tiny": {"repo_id": "a/b", "revision": SHA, "weights_bytes": -1}}, [], ["weights_bytes", "positive"]),
    (GOOD_MODELS, [{"name": "chat", "model": "big"}], ["vllm_instances[0] (chat).model", "'big'", "tiny"]),
    (GOOD_MODELS, [{"name": "chat"}], ["vllm_instances[0] (chat).model is missing", "tiny"]),
    (GOOD_MODELS, [{"name": "chat", "model": "tiny", "extra_args": "--x"}], ["extra_args", "list of strings"]),
    ("nope", [], ["vllm_models must be a dict"]),
    (GOOD_MODELS, {"name": "x"}, ["vllm_instances must be a list"]),
])
def test_problems_name_host_variable_and_fix(models, instances, needles):
    problems = vllm_inventory_problems(models, instances, host="gpu1")
    assert len(problems) == 1, problems
    for needle in needles:
        assert needle in problems[0], (needle, problems[0])


def test_unpinned_branch_allowed_when_asked():
    models = {"tiny": {"repo_id": "a/b", "revision": "main", "allow_unpinned": True}}
    assert vllm_inventory_problems(models, [], host="h") == []


def h200_8x():
    with open(os.path.join(HOSTS, "h200-8x-nvlink.json")) as fh:
        return json.load(fh)


def test_model_facts_reach_the_planner_and_an_instance_overrides_them():
    """The model's num_attention_heads (4) refuses TP 8; an instance that says 8 heads is planned on 8 GPUs."""
    with pytest.raises(PlanContractError) as err:
        build_plan(GOOD_MODELS, [{"name": "a", "model": "tiny", "tensor_parallel_size": 8}], h200_8x(), host="h")
    assert "num_attention_heads" in str(err.value) and "vllm_instances[0] 'a'" in str(err.value)
    plan = build_plan(GOOD_MODELS, [{"name": "b", "model": "tiny", "tensor_parallel_size": 8,
                                     "num_attention_heads": 8}], h200_8x(), host="h")
    assert plan["instances"][0]["gpus"] == list(range(8))


def test_a_host_without_gpus_gets_free_ports_and_no_gpus():
    plan = build_plan(GOOD_MODELS, [{"name": "a", "model": "tiny"}, {"name": "b", "model": "tiny", "port": 8000}],
                      {"online_cpus": "0-3"}, {"vllm_preflight_gpu": False}, host="cpu1")
    inst = plan["instances"]
    assert [i["port"] for i in inst] == [8001, 8000]
    assert all(i["gpus"] == [] and i["expected"] == [] and i["cuda_visible_devices"] == "" for i in inst)
    assert inst[0]["unit"] == "vllm-a.service" and inst[0]["model"]["key"] == "tiny"
    assert plan["footprint"] is None
