# Apache License 2.0 (see LICENSE)
"""The metric names a Prometheus rules file or a Grafana dashboard reads, and whether a scrape has them.

``metric_names(path)`` parses every ``expr`` of the rules file and returns the metric names it selects
(not functions, keywords, label names, durations or strings; the file's own recording rules are left
out, as the file defines them). ``recorded_names(path)`` are those recording rules;
``dashboard_names(path)`` the metrics a dashboard's panels and variables query. ``scraped_names(text)`` are the sample names of a Prometheus text
exposition. Used by tests/unit/roles/test_prometheus_rules.py (captured scrapes) and the vllm_service
Molecule scenario (a live scrape of the pinned vLLM, HAProxy's exporter and the watchdog's textfile):
a rule on a metric that was renamed or removed fails there, not silently in production.

    python tools/rule_metrics.py roles/vllm_service/files/prometheus/inferops-vllm-rules.yml
"""
from __future__ import annotations

import json
import re
import sys

import yaml

_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "bottomk", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "count", "count_over_time", "count_values", "delta", "deriv", "exp", "floor", "group",
    "histogram_quantile", "holt_winters", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time",
    "ln", "log2", "log10", "max", "max_over_time", "min", "min_over_time", "predict_linear", "quantile",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev",
    "stddev_over_time", "stdvar", "sum", "sum_over_time", "time", "timestamp", "topk", "vector",
}
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "inf", "nan"}
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def expr_names(expr):
    """Metric names selected by one PromQL expression."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # strings
    text = re.sub(r"\{[^}]*\}", " ", text)                      # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                     # range durations
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    names = set()
    for match in _NAME.finditer(text):
        word = match.group(0)
        before = text[:match.start()]
        if before and (before[-1].isdigit() or before[-1] == "."):
            continue  # part of a number (1e3, 0.95)
        if word.lower() in _KEYWORDS or word in _FUNCTIONS:
            continue
        names.add(word)
    return names


def metric_names(path):
    """Every metric name the rules of ``path`` read, without the names the file records itself."""
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    recorded, read = set(), set()
    for group in doc["groups"]:
        for rule in group["rules"]:
            read |= expr_names(str(rule["expr"]))
            if "record" in rule:
                recorded.add(rule["record"])
    return read - recorded


def recorded_names(path):
    """The series the recording rules of ``path`` write."""
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    return {rule["record"] for group in doc["groups"] for rule in group["rules"] if "record" in rule}


def dashboard_names(path):
    """Every metric name the panels (``targets[].expr``) and query variables (``label_values(<metric>, ...)``) of a
    Grafana dashboard read."""
    with open(path) as fh:
        dash = json.load(fh)
    names = set()
    for panel in dash.get("panels", []):
        for target in panel.get("targets", []):
            names |= expr_names(target.get("expr", ""))
    for var in dash.get("templating", {}).get("list", []):
        query = var.get("query") if var.get("type") == "query" else None
        match = re.match(r"\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)", str(query or ""))
        if match:
            names.add(match.group(1))
    return names


def scraped_names(text):
    """Sample names of a Prometheus text exposition (``name{...} value`` and ``name value`` lines)."""
    return {m.group(0) for line in text.splitlines() if line and not line.startswith("#")
            for m in [_NAME.match(line)] if m}


if __name__ == "__main__":
    for name in sorted(dashboard_names(sys.argv[1]) if sys.argv[1].endswith(".json") else metric_names(sys.argv[1])):
        print(name)
