"""After the rollout: canary upgraded, fleet-a rolled back and serving, fleet-b untouched."""
import json
import os

import pytest

STATE = os.path.join(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/tmp"), "fleet-rollout.json")


@pytest.fixture(scope="module")
def rollout():
    with open(STATE) as fh:
        return json.load(fh)


def _name(host):
    return host.backend.get_hostname()


def _current(host):
    return host.file("/opt/inferops/vllm/current").linked_to


def _serving(host):
    port = host.check_output("grep -ho -- '--port [0-9]*' /etc/systemd/system/vllm-chat.service | cut -d' ' -f2")
    return host.run(f"curl -sf -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health").stdout


def test_rollout_failed_and_stopped_at_the_bad_batch(rollout):
    assert rollout["rc"] != 0
    out = rollout["stdout"]
    assert "fleet-a was rolled back to its previous venv and is serving again" in out
    assert "should be idle" in out or "held by" in out, "the gate's message names the stray"
    # fleet-b was in the batch after the failed one: the play never reached it
    assert "fleet-b" not in out.split("PLAY RECAP")[0].split("Roll out, batch by batch")[-1]


def test_every_node_serves(host):
    assert _serving(host) == "200"


def test_versions_after_rollout(host, rollout):
    name = _name(host)
    before = rollout["before"][name]
    if name == "fleet-canary":
        assert _current(host) != before["current"], "the canary runs the new venv"
    else:
        assert _current(host) == before["current"], "rolled back / untouched: the old venv"


def test_untouched_node_was_not_restarted(host, rollout):
    if _name(host) != "fleet-b":
        pytest.skip("only fleet-b is outside the failed batch")
    now = host.check_output("systemctl show -p ExecMainStartTimestampMonotonic --value vllm-chat.service")
    assert now == rollout["before"]["fleet-b"]["started"]
