"""The fleet report templates, rendered by the real vllm_verify role (report entry) with ansible-playbook.

Two hosts: the seed box (two TP=4 instances planned by the real vllm_plan filter over the seed
host's facts) and a host that failed earlier in the play (no summary).
"""
import json
import os
import re
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
                   throughput_tokens_per_s: 2510.4, concurrency: 4, ttft_p50_ms: 40.5, ttft_p99_ms: 90.25,
                   tpot_p50_ms: 11.9, tpot_p99_ms: 12.5}]
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
    # the benchmark's latencies, as in the HTML report; chat-b has no benchmark: dashes
    header = next(line for line in md.splitlines() if line.startswith("| host |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[-2:] == ["TTFT p50/p99 ms", "TPOT p50/p99 ms"], header
    assert rows[0].endswith("| 2510.4 (x4) | 40.5 / 90.25 | 11.9 / 12.5 |"), rows[0]
    assert rows[1].endswith("| - | - | - / - | - / - |"), rows[1]
    for line in rows + [header, next(line for line in md.splitlines() if line.startswith("| broken |"))]:
        assert len(line.strip("|").split("|")) == len(cells), line
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


# --------------------------------------------------------------------------- benchmark history and the gate

HISTORY_PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: A verified host with one benchmarked instance
      ansible.builtin.set_fact:
        vllm_verify_summary:
          plan: [{name: chat-a, model: {key: big, repo_id: org/big-moe, revision: "{{ 'a' * 40 }}"}, gpus: [],
                  numa_node: 0, tensor_parallel_size: 1, pipeline_parallel_size: 1}]
          gpus: []
          footprint: []
          vllm_version: 0.11.0
          bench: [{vllm_verify_instance: {name: chat-a}, single_stream_tokens_per_s: "{{ single }}",
                   throughput_tokens_per_s: "{{ single * 30 }}", concurrency: 4, ttft_p50_ms: 40.5,
                   ttft_p99_ms: 90.25, tpot_p50_ms: 11.9, tpot_p99_ms: 12.5}]
    - name: Write the report
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_verify
        tasks_from: report
"""


def _playbook(tmp_path, playbook, extra):
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    (tmp_path / "site.yml").write_text(playbook)
    (tmp_path / "hosts.ini").write_text("seed ansible_connection=local\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1")
    return subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "site.yml"),
                           "-e", "@" + str(tmp_path / "extra.json")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
                          executable=os.path.join(os.path.dirname(sys.executable), "ansible-playbook"))


def _points(html, metric):
    found = re.findall(r'<polyline data-metric="%s"[^>]*points="([^"]*)"' % metric, html)
    return [p.split(" ") for p in found]


def test_each_report_appends_to_the_history_and_the_html_draws_the_trend(tmp_path):
    reports = tmp_path / "reports"
    for single in (84.0, 80.5, 42.0):
        res = _playbook(tmp_path, HISTORY_PLAYBOOK, {"single": single, "vllm_verify_report_dir": str(reports),
                                                     "vllm_verify_history_points": 2})
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        history = [json.loads(line) for line in (reports / "bench-history.jsonl").read_text().splitlines()]
        html = (reports / "fleet-report.html").read_text()
        if single == 80.5:
            # two runs, two lines, two points per line of the chart
            assert len(history) == 2
            assert [h["single_stream_tokens_per_s"] for h in history] == [84.0, 80.5]
            assert all(h["host"] == "seed" and h["instance"] == "chat-a" and h["vllm_version"] == "0.11.0"
                       and h["model"] == "org/big-moe" and h["ttft_p99_ms"] == 90.25
                       and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", h["time"]) for h in history), history
            assert [len(p) for p in _points(html, "single_stream_tokens_per_s")] == [2]
            assert 'data-points="2"' in html
    # three runs kept, the chart shows the last two (vllm_verify_history_points): 80.5 high, 42 low
    assert len(history) == 3
    (points,) = _points(html, "single_stream_tokens_per_s")
    assert len(points) == 2 and float(points[0].split(",")[1]) < float(points[1].split(",")[1])
    assert len(_points(html, "throughput_tokens_per_s")[0]) == 2
    assert "90.25" in html and "<script" not in html
    parser = _Collect()
    parser.feed(html)
    assert parser.stack in (["html"], []), parser.stack


GATE_PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Figures as the benchmark task registers them
      ansible.builtin.set_fact:
        vllm_verify__bench_results:
          results:
            - {vllm_verify_instance: {name: alpha}, single_stream_tokens_per_s: 60.0, throughput_tokens_per_s: 3000,
               ttft_p99_ms: 100}
            - {vllm_verify_instance: {name: beta}, single_stream_tokens_per_s: 84.0, throughput_tokens_per_s: 2600,
               ttft_p99_ms: 500}
    - name: The gate
      ansible.builtin.include_role:
        name: inferops.vllm.vllm_verify
        tasks_from: perf_gate
"""


def test_the_gate_names_host_instance_metric_measured_and_baseline(tmp_path):
    base = {"single_stream_tokens_per_s": 84, "throughput_tokens_per_s": 2500, "ttft_p99_ms": 200}
    res = _playbook(tmp_path, GATE_PLAYBOOK, {"vllm_verify_perf_baseline": base})
    assert res.returncode != 0
    out = " ".join(res.stdout.split())
    assert ("host seed, instance alpha: single_stream_tokens_per_s 60.0 is below the baseline 84 - 20 % (67.2)"
            in out), out[-3000:]
    assert "host seed, instance beta: ttft_p99_ms 500 is above the baseline 200 + 20 % (240.0)" in out
    assert "instance alpha: throughput" not in out and "instance beta: single" not in out
    # a wider tolerance and a per-instance override: passes
    res = _playbook(tmp_path, GATE_PLAYBOOK, {"vllm_verify_perf_baseline": dict(base, tolerance=0.3),
                                              "vllm_verify_perf_baseline_instances": {"beta": {"ttft_p99_ms": 450}}})
    assert res.returncode == 0, res.stdout[-3000:]
