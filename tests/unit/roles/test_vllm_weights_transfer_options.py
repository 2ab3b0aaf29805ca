"""roles/vllm_weights: the transfer variables reach the fetch module as its options (range_connections,
range_chunk_mib, xet_environment); the module sets xet_environment in its own process
(tests/integration/hf_snapshot/test_hf_snapshot_ranges.py::test_xet_settings_*)."""
import os

import pytest
import yaml

ROLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "roles", "vllm_weights")


def fetch_args():
    with open(os.path.join(ROLE, "tasks", "fetch_one.yml"), encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)
    return next(t["inferops.vllm.hf_snapshot"] for t in tasks if "inferops.vllm.hf_snapshot" in t)


def render(expr, **variables):
    templating = pytest.importorskip("ansible.template")
    from ansible.parsing.dataloader import DataLoader

    if not hasattr(templating, "trust_as_template"):
        pytest.skip("ansible-core before 2.19")
    templar = templating.Templar(loader=DataLoader(), variables=variables)
    return templar.template(templating.trust_as_template(expr))


@pytest.mark.parametrize("high, extra, expected", [
    (False, {}, {}),
    (True, {}, {"HF_XET_HIGH_PERFORMANCE": "1"}),
    (False, {"HF_XET_CHUNK_CACHE_SIZE_BYTES": "0"}, {"HF_XET_CHUNK_CACHE_SIZE_BYTES": "0"}),
    ("yes", {"HF_XET_CHUNK_CACHE_SIZE_BYTES": "0"},
     {"HF_XET_CHUNK_CACHE_SIZE_BYTES": "0", "HF_XET_HIGH_PERFORMANCE": "1"}),
])
def test_xet_variables_become_the_module_option(high, extra, expected):
    got = render(fetch_args()["xet_environment"], vllm_weights_xet_high_performance=high,
                 vllm_weights_xet_environment=extra)
    assert got == expected


def test_range_variables_are_passed():
    args = fetch_args()
    assert render(args["range_connections"], vllm_weights_range_connections=8) == 8
    assert render(args["range_chunk_mib"], vllm_weights_range_chunk_mib=64) == 64
