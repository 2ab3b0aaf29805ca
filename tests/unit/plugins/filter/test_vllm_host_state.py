"""vllm_inputs_digest (the plan, the host's variables, the collection's code) and vllm_converged_hosts."""
import os

import pytest
from ansible.errors import AnsibleFilterError
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.filter.vllm_host_state import (
    FilterModule,
    vllm_converged_hosts,
    vllm_inputs_digest,
)

PLAN = {"instances": [{"name": "a", "port": 8000, "gpus": [0, 1]}], "routers": [], "paths": {"config_dir": "/etc/x"}}
VARS = {"vllm_models": {"tiny": {"revision": "abc"}}, "inferops_site": "lab", "ansible_host": "10.0.0.1"}
CODE = {
    "roles/vllm_install/tasks/main.yml": "- name: install\n",
    "roles/vllm_install/defaults/main.yml": "vllm_install_version: 0.9.1\n",
    "plugins/filter/f.py": "X = 1\n",
    "playbooks/site.yml": "- hosts: all\n",
    "meta/runtime.yml": "requires_ansible: '>=2.15'\n",
    "galaxy.yml": "version: 1.0.0\n",
}


def collection(root, files=None):
    """A small collection tree (fresh per case: the code digest is cached per root)."""
    for rel, text in (CODE if files is None else files).items():
        target = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
    return str(root)


@pytest.fixture(name="code")
def code_fixture(tmp_path):
    return collection(tmp_path / "collection")


def test_the_filters_are_registered():
    assert set(FilterModule().filters()) == {"vllm_inputs_digest", "vllm_converged_hosts"}


def test_the_digest_is_stable_for_equal_inputs_whatever_the_order_of_the_dicts(code):
    digest = vllm_inputs_digest(VARS, PLAN, code)
    assert len(digest) == 64 and int(digest, 16) >= 0
    reordered_vars = dict(reversed(list(VARS.items())))
    reordered_plan = {k: PLAN[k] for k in reversed(list(PLAN))}
    reordered_plan["instances"] = [dict(reversed(list(PLAN["instances"][0].items())))]
    assert vllm_inputs_digest(reordered_vars, reordered_plan, code) == digest
    assert vllm_inputs_digest(dict(VARS), dict(PLAN), code + "/") == digest


def test_the_same_code_in_another_directory_gives_the_same_digest(tmp_path):
    assert (vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "one"))
            == vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "two")))


def test_the_digest_changes_when_the_plan_changes(code):
    digest = vllm_inputs_digest(VARS, PLAN, code)
    other = dict(PLAN, instances=[dict(PLAN["instances"][0], port=8001)])
    assert vllm_inputs_digest(VARS, other, code) != digest
    assert vllm_inputs_digest(VARS, dict(PLAN, routers=[{"url": "http://127.0.0.1:9000"}]), code) != digest


@pytest.mark.parametrize("change", [
    {"vllm_models": {"tiny": {"revision": "def"}}},
    {"inferops_site": "prod"},
    {"vllm_new_knob": True},
    {"inferops_token": None},
], ids=["vllm_var_changed", "inferops_var_changed", "vllm_var_added", "inferops_var_added_as_none"])
def test_the_digest_changes_when_a_vllm_or_inferops_variable_changes(code, change):
    assert vllm_inputs_digest(dict(VARS, **change), PLAN, code) != vllm_inputs_digest(VARS, PLAN, code)


def test_a_removed_vllm_variable_changes_the_digest(code):
    less = {k: v for k, v in VARS.items() if k != "inferops_site"}
    assert vllm_inputs_digest(less, PLAN, code) != vllm_inputs_digest(VARS, PLAN, code)


@pytest.mark.parametrize("name", [
    "vllm_frontdoor__active", "vllm_preflight__inputs", "inferops_x__y", "vllm__x", "__vllm_x",
    "ansible_host", "groups", "myvllm_x", "vllm", "inferops", "VLLM_X", "hostvars", "omit",
])
def test_variables_with_a_double_underscore_or_not_named_vllm_or_inferops_are_left_out(code, name):
    assert vllm_inputs_digest(dict(VARS, **{name: "anything"}), PLAN, code) == vllm_inputs_digest(VARS, PLAN, code)


@pytest.mark.parametrize("rel", ["roles/vllm_install/tasks/main.yml", "plugins/filter/f.py", "playbooks/site.yml",
                                 "galaxy.yml", "meta/runtime.yml"])
def test_the_digest_changes_when_a_file_of_the_collection_changes(tmp_path, rel):
    before = vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "before"))
    after = vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "after", dict(CODE, **{rel: CODE[rel] + "# x\n"})))
    assert after != before


def test_the_digest_changes_when_a_file_is_added_to_or_renamed_in_the_roles(tmp_path):
    before = vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "before"))
    added = dict(CODE, **{"roles/vllm_install/files/helper.py": "pass\n"})
    assert vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "added", added)) != before
    renamed = dict(CODE)
    renamed["roles/vllm_install/tasks/other.yml"] = renamed.pop("roles/vllm_install/tasks/main.yml")
    assert vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "renamed", renamed)) != before


def test_compiled_python_and_files_outside_the_code_trees_are_left_out(tmp_path):
    before = vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "before"))
    noise = dict(CODE, **{"plugins/filter/__pycache__/f.cpython-313.pyc": "bytecode", "plugins/filter/g.pyc": "bc",
                          "roles/vllm_install/__pycache__/x": "y", "docs/noop.md": "# docs\n",
                          "tests/unit/test_x.py": "pass\n", "README.md": "readme\n"})
    assert vllm_inputs_digest(VARS, PLAN, collection(tmp_path / "noise", noise)) == before


def test_the_code_digest_is_cached_per_root_for_the_controller_process(tmp_path):
    root = collection(tmp_path / "cached")
    before = vllm_inputs_digest(VARS, PLAN, root)
    with open(os.path.join(root, "roles/vllm_install/tasks/main.yml"), "a", encoding="utf-8") as handle:
        handle.write("# changed after the first digest\n")
    assert vllm_inputs_digest(VARS, PLAN, root) == before, "hashed once per controller process (documented)"


class Raising(dict):
    """Host variables where one variable does not template (its access raises)."""

    def __getitem__(self, key):
        if key == "vllm_broken":
            raise ValueError("'undefined_thing' is undefined")
        return super().__getitem__(key)


def test_a_variable_whose_access_raises_is_tolerated(code):
    variables = Raising(VARS, vllm_broken="{{ undefined_thing }}")
    digest = vllm_inputs_digest(variables, PLAN, code)
    assert len(digest) == 64
    assert vllm_inputs_digest(Raising(VARS, vllm_broken="other text"), PLAN, code) == digest
    assert digest != vllm_inputs_digest(VARS, PLAN, code), "the variable still counts (by its failure)"


@pytest.mark.parametrize("plan", [None, [], "plan", 3, [PLAN]])
def test_a_plan_that_is_not_a_dict_is_refused(code, plan):
    with pytest.raises(AnsibleFilterError, match="plan must be"):
        vllm_inputs_digest(VARS, plan, code)


def test_an_unreadable_file_of_the_collection_is_a_filter_error(tmp_path):
    root = collection(tmp_path / "broken")
    os.symlink("no-such-target", os.path.join(root, "roles", "vllm_install", "tasks", "dangling.yml"))
    with pytest.raises(AnsibleFilterError, match="cannot read the collection"):
        vllm_inputs_digest(VARS, PLAN, root)


# ---------------------------------------------------------------- vllm_converged_hosts

YES = {"converged": True, "reasons": []}
NO = {"converged": False, "reasons": ["the inputs changed"]}
SKIPPED = {"skipped": True, "changed": False}


def spanning(name, hosts):
    return {"name": name, "multinode": {"hosts": list(hosts), "node_rank": 0}}


def test_the_hosts_whose_probe_is_converged_sorted():
    probes = {"c": YES, "a": YES, "b": NO, "d": SKIPPED, "e": {"converged": "true"}, "f": None}
    plans = {h: {"instances": [{"name": "solo"}]} for h in probes}
    assert vllm_converged_hosts(probes, plans) == ["a", "c"]


def test_a_converged_host_sharing_a_spanning_instance_with_a_host_that_is_not_is_excluded():
    group = spanning("duo", ["a", "b"])
    plans = {"a": {"instances": [group, {"name": "solo"}]}, "b": {"instances": [group]}, "c": {"instances": []}}
    assert vllm_converged_hosts({"a": YES, "b": NO, "c": YES}, plans) == ["c"]
    assert vllm_converged_hosts({"a": YES, "b": YES, "c": YES}, plans) == ["a", "b", "c"]
    # a rank whose host has no probe (not in the play) is not converged either
    assert vllm_converged_hosts({"a": YES, "c": YES}, plans) == ["c"]


def test_hosts_without_a_plan_or_instances_are_judged_by_their_probe_alone():
    assert vllm_converged_hosts({"a": YES, "b": YES}, {"b": {}}) == ["a", "b"]
    assert vllm_converged_hosts({"a": YES}, {"a": {"instances": [{"multinode": None}, "junk"]}}) == ["a"]


@pytest.mark.parametrize("probes, plans", [([], {}), ({}, []), (None, {}), ("a", "b")])
def test_converged_hosts_refuses_what_is_not_two_dicts(probes, plans):
    with pytest.raises(AnsibleFilterError):
        vllm_converged_hosts(probes, plans)


HOSTS = ["h%d" % i for i in range(7)]


@st.composite
def fleets(draw, overlapping):
    """Probes and plans of a small fleet; every rank's plan lists the instance spanning it (as the preflight
    plan does). Groups are disjoint unless ``overlapping``."""
    hosts = draw(st.lists(st.sampled_from(HOSTS), min_size=1, max_size=len(HOSTS), unique=True))
    groups = []
    free = list(hosts)
    for _round in range(draw(st.integers(0, 3))):
        pool = hosts if overlapping else free
        if len(pool) < 2:
            break
        span = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=min(4, len(pool)), unique=True))
        groups.append(span)
        free = [h for h in free if h not in span]
    plans = {h: {"instances": [{"name": "solo-%s" % h}]} for h in hosts}
    for pos, span in enumerate(groups):
        for host in span:
            plans[host]["instances"].append(spanning("g%d" % pos, span))
    probes = {h: draw(st.sampled_from([YES, NO, SKIPPED])) for h in hosts}
    for host in draw(st.lists(st.sampled_from(hosts), unique=True, max_size=2)):
        probes.pop(host, None)  # not in the play's probes
    return probes, plans, groups


def _check(probes, plans, groups):
    out = vllm_converged_hosts(probes, plans)
    assert out == sorted(set(out))
    assert set(out) <= {h for h, res in probes.items() if res.get("converged") is True}
    for span in groups:
        assert set(span) <= set(out) or not set(span) & set(out), (span, out)
    return out


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(overlapping=False))
def test_the_converged_hosts_are_converged_probes_and_never_split_a_group(fleet):
    probes, plans, groups = fleet
    out = _check(probes, plans, groups)
    # and nothing is left out needlessly: a converged host outside every group that is not whole is kept
    broken = {h for span in groups if not all(probes.get(m, {}).get("converged") is True for m in span)
              for h in span}
    assert set(out) == {h for h, res in probes.items() if res.get("converged") is True} - broken


@settings(max_examples=300, deadline=None)
@given(fleet=fleets(overlapping=True))
def test_the_converged_hosts_never_split_a_group_even_when_groups_share_a_host(fleet):
    _check(*fleet)


def test_a_host_in_two_groups_that_runs_takes_both_groups_with_it():
    """h1 runs (its group with h2 is not whole), so its group with h0 runs whole: h0 runs too."""
    x, y = spanning("x", ["h0", "h1"]), spanning("y", ["h1", "h2"])
    plans = {"h0": {"instances": [x]}, "h1": {"instances": [x, y]}, "h2": {"instances": [y]}}
    out = vllm_converged_hosts({"h0": YES, "h1": YES, "h2": NO}, plans)
    assert out == []
