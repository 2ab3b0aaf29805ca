"""The fleet report templates, rendered by the real vllm_verify role (report entry) with ansible-playbook.

Two hosts: the seed box (two TP=4 instances planned by the real vllm_plan filter over the seed
host's facts) and a host that failed earlier in the play (no summary).
"""
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HOSTS = os.path.join(ROOT, "tests", "unit", "data", "hosts")

PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Plan the seed host with the real planner
      ansible.builtin.set_fact:
        vllm_verify_summary:
          plan: >-
            {{ (models | inferops.vllm.vllm_plan(instances, facts={'gpus': gpus, 'gpu_links': links},
                 inputs={'vllm_service_network_interface': 'eth1'}, host='seed', fleet=fleet | default(none))).instances }}
          gpus: "{{ gpus }}"
          footprint: "{{ footprint }}"
          bench: [{vllm_verify_instance: {name: chat-a}, single_stream_tokens_per_s: 84.2,
                   throughput_tokens_per_s: 2510.4, concurrency: 4}]
      when: inventory_hostname == 'seed'
    - name: Write the report
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_verify
        tasks_from: report
"""


def _seed_host():
    for name in sorted(os.listdir(HOSTS)):
        if "seed" in name or "pcie-8x" in name or "rtxpro" in name:
            with open(os.path.join(HOSTS, name)) as fh:
                return json.load(fh)
    raise AssertionError("no seed host facts in %s" % HOSTS)


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.text = [], []

    def handle_starttag(self, tag, attrs):
        if tag not in ("br", "meta"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack[-5:], tag)
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_report_renders_rows_and_gpu_grid(tmp_path):
    host = _seed_host()
    gpus = host["gpus"] if "gpus" in host else host["ansible_facts"]["gpus"]
    links = host.get("gpu_links", host.get("links", {}))
    # chat-b's GPUs read idle: the report must say so instead of "healthy"
    footprint = [{"index": g["index"], "used_mib": 88000 if g["index"] < 4 else 3, "ok": g["index"] < 4,
                  "expected_min_mib": 87074, "expected_max_mib": 89122} for g in gpus]
    extra = {
        "gpus": gpus, "links": links, "footprint": footprint,
        "instances": [{"name": "chat-a", "model": "big", "tensor_parallel_size": 4},
                      {"name": "chat-b", "model": "big", "tensor_parallel_size": 4}],
        "models": {"big": {"repo_id": "org/big-moe", "revision": "a" * 40}},
        "vllm_verify_report_dir": str(tmp_path / "reports"),
    }
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.ini").write_text("seed ansible_connection=local\nbroken ansible_connection=local\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "site.yml"),
                          "-e", "@" + str(tmp_path / "extra.json")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
                         executable=os.path.join(os.path.dirname(sys.executable), "ansible-playbook"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    md = (tmp_path / "reports" / "fleet-report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| seed |")]
    assert len(rows) == 2, md
    assert "| chat-a | org/big-moe @ aaaaaaaaaaaa | 0,1,2,3 | 0 | 4 x 1 |" in rows[0], rows[0]
    assert "| chat-b | org/big-moe @ aaaaaaaaaaaa | 4,5,6,7 | 1 | 4 x 1 |" in rows[1], rows[1]
    assert "84.2" in rows[0] and "2510.4 (x4)" in rows[0]
    assert "| ok |" in rows[0] and "**footprint off**" in rows[1]
    assert "| broken | - |" in md and "not verified" in md
    assert "NUMA 0: [GPU0=chat-a GPU1=chat-a GPU2=chat-a GPU3=chat-a]" in md
    html = (tmp_path / "reports" / "fleet-report.html").read_text()
    parser = _Collect()
    parser.feed(html)
    assert parser.stack == ["html"] or parser.stack == [], parser.stack
    text = " ".join(parser.text)
    assert "NUMA node 0" in text and "NUMA node 1" in text
    assert text.count("chat-b") >= 5  # table row, legend, four GPU tiles
    assert text.count("healthy") == 1 and "footprint off" in text


def test_an_instance_across_hosts_shows_its_rank_and_hosts(tmp_path):
    host = _seed_host()
    gpus = host["gpus"] if "gpus" in host else host["ansible_facts"]["gpus"]
    links = host.get("gpu_links", host.get("links", {}))
    fleet = {name: {"groups": ["seed"], "interface": "eth1", "gpu_count": len(gpus),
                    "addresses": {"eth1": {"address": f"10.0.0.{pos + 5}", "prefix": 24}}}
             for pos, name in enumerate(("seed", "seed-2"))}
    extra = {
        "gpus": gpus, "links": links, "fleet": fleet,
        "footprint": [{"index": g["index"], "used_mib": 3, "ok": True} for g in gpus],
        "instances": [{"name": "m2", "model": "big", "nodes": ["seed", "seed-2"], "tensor_parallel_size": 4,
                       "pipeline_parallel_size": 2, "numa_node": 0}],
        "models": {"big": {"repo_id": "org/big-moe", "revision": "a" * 40}},
        "vllm_verify_report_dir": str(tmp_path / "reports"),
    }
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.ini").write_text("seed ansible_connection=local\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
    res = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "site.yml"),
                          "-e", "@" + str(tmp_path / "extra.json")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
                         executable=os.path.join(os.path.dirname(sys.executable), "ansible-playbook"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    md = (tmp_path / "reports" / "fleet-report.md").read_text()
    assert "| seed | m2 (rank 0/2 api of seed + seed-2) | org/big-moe @ aaaaaaaaaaaa | 0,1,2,3 | 0 | 4 x 2 |" in md, md
    html = (tmp_path / "reports" / "fleet-report.html").read_text()
    assert "rank 0/2 (api) of seed + seed-2" in html
