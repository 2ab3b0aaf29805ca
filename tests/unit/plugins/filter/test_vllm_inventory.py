"""Inventory checks: every problem names the host, the variable and the fix."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.vllm.plugins.filter.vllm_inventory import (
    vllm_cpu_plan,
    vllm_instances_resolved,
    vllm_inventory_problems,
)

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


def test_resolved_instances_take_model_facts_without_overriding():
    out = vllm_instances_resolved(
        [{"name": "a", "model": "tiny"}, {"name": "b", "model": "tiny", "num_attention_heads": 8}], GOOD_MODELS)
    assert out[0]["weights_bytes"] == 2_000_000 and out[0]["num_attention_heads"] == 4
    assert out[1]["num_attention_heads"] == 8
    assert "repo_id" not in out[0]


def test_resolved_rejects_wrong_types():
    with pytest.raises(AnsibleFilterError):
        vllm_instances_resolved({"a": 1}, GOOD_MODELS)


def test_cpu_plan_assigns_free_ports_and_no_gpus():
    plan = vllm_cpu_plan([{"name": "a", "model": "tiny"}, {"name": "b", "model": "tiny", "port": 8000}])
    assert [p["port"] for p in plan] == [8001, 8000]
    assert all(p["gpus"] == [] and p["expected"] == [] and p["cuda_visible_devices"] == "" for p in plan)
    assert plan[0]["unit"] == "vllm-a.service" and plan[0]["model"] == "tiny"
