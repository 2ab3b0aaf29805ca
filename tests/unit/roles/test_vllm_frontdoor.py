"""The front door per model (issue 15): the plan's ``frontdoors`` and HAProxy's configuration made from them.

The plan comes from the real planner (``build_plan``) over recorded host facts; the configuration and
the unit from the role's own templates, rendered by Ansible's templar the way the role's template
lookup does it (role defaults and vars, ansible_managed, trim_blocks). Where HAProxy is installed on
this machine (``make sysdeps`` installs it), every rendered configuration is checked by the real
``haproxy -c``, as the role checks it on the host before putting it in place.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from ansible.module_utils import basic
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, generate_ansible_template_vars, trust_as_template
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.plugin_utils.host_plan import PLAN_INPUTS, PlanContractError, build_plan
from systemd_unit import directives
from test_plan_contract import SHA, load_yaml
from test_plan_multinode import BIG, fleet_of, plan_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(ROOT, "roles", "vllm_frontdoor")
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed here (make sysdeps installs it)")

MODELS = {"tiny": {"repo_id": "org/tiny", "revision": SHA, "served_model_name": "tiny-llama", "frontdoor_port": 9000},
          "other": {"repo_id": "org/other", "revision": SHA, "frontdoor_port": 9001},
          "plain": {"repo_id": "org/plain", "revision": SHA}}
CPU = {"systemd_version": 252, "online_cpus": "0-7"}


def plan(instances, models=None, **inputs):
    return build_plan(models or MODELS, instances, CPU, dict({"vllm_preflight_gpu": False}, **inputs), host="node-1")


def refused(instances, models=None, **inputs):
    with pytest.raises(PlanContractError) as err:
        plan(instances, models, **inputs)
    return str(err.value)


#: Where render() puts the key maps a rendered configuration names (haproxy -c loads them), unless told
KEYS_DIR = tempfile.mkdtemp(prefix="inferops-frontdoor-keys-")
#: The instances' key of the rendered configurations (vllm_service_api_key)
INSTANCE_KEY = "sk-instances-0123456789abcdef"


def render(template, fd_plan, **knobs):
    """Render a template of the role as its template lookup does (defaults, vars, the role's set_facts). For
    frontdoor.cfg.j2, the key maps it names are rendered too (clients.map.j2, instances.map.j2) into
    ``vllm_frontdoor_keys_dir`` (default ``KEYS_DIR``), as the role writes them before the configuration."""
    knobs = dict({"vllm_frontdoor_keys_dir": KEYS_DIR, "vllm_service_api_key": INSTANCE_KEY}, **knobs)
    if template == "frontdoor.cfg.j2":
        keys_dir = knobs["vllm_frontdoor_keys_dir"]
        os.makedirs(keys_dir, exist_ok=True)
        models = {fd["model"] for fd in fd_plan["frontdoors"]}
        for model in models:
            with open(os.path.join(keys_dir, f"{model}.clients.map"), "w") as fh:
                fh.write(_render("clients.map.j2", fd_plan, dict(knobs, vllm_frontdoor__model=model)))
        with open(os.path.join(keys_dir, "instances.map"), "w") as fh:
            fh.write(_render("instances.map.j2", fd_plan, knobs))
    return _render(template, fd_plan, knobs)


def _render(template, fd_plan, knobs):
    loader = DataLoader()
    variables = dict(loader.load_from_file(os.path.join(ROLE, "defaults", "main.yml"), trusted_as_template=True))
    variables.update(loader.load_from_file(os.path.join(ROLE, "vars", "main.yml"), trusted_as_template=True))
    variables.update(knobs)
    frontdoors = fd_plan["frontdoors"]
    metrics = fd_plan.get("frontdoor_metrics")
    variables.update({"vllm_frontdoor_plan": fd_plan, "vllm_frontdoor__frontdoors": frontdoors,
                      "vllm_frontdoor__metrics": metrics, "vllm_frontdoor__systemd_version": 252,
                      "vllm_frontdoor__low_port": any(fd["port"] < 1024 for fd in frontdoors)
                      or (metrics or {}).get("port", 1024) < 1024})
    src = os.path.join(ROLE, "templates", template)
    variables.update(generate_ansible_template_vars(path=template, fullpath=src, dest_path=None))
    with open(src) as fh:
        text = trust_as_template(fh.read())
    return Templar(loader=loader, variables=variables).template(
        text, escape_backslashes=False, overrides=dict(trim_blocks=True, lstrip_blocks=False))


def haproxy_check(tmp_path, text):
    cfg = tmp_path / "frontdoor.cfg"
    cfg.write_text(text)
    out = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr + "\n" + text
    return out


def sections(text):
    """{'frontend tiny': [lines], 'backend tiny': [lines], ...} of an HAProxy configuration."""
    out, cur = {}, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not raw.startswith(" "):
            cur = line
            out[cur] = []
        else:
            out[cur].append(line.strip())
    return out


# --------------------------------------------------------------------------- the plan's front doors

def test_two_instances_of_one_model_are_the_backends_of_one_front_door():
    p = plan([{"name": "alpha", "model": "tiny"}, {"name": "beta", "model": "tiny"}])
    assert p["frontdoors"] == [{
        "name": "tiny", "model": "tiny", "served_model_name": "tiny-llama", "served_model_names": ["tiny-llama"],
        "bind_address": "127.0.0.1", "port": 9000, "url": "http://127.0.0.1:9000",
        "edge": {"routes": [{"method": "POST", "path": "/v1/chat/completions"},
                            {"method": "POST", "path": "/v1/completions"}, {"method": "GET", "path": "/v1/models"}],
                 "health": ["/health"], "refuse": ["\\", "%", ";"],
                 "non_canonical": {"within": ["/./", "/../", "//"], "end": ["/.", "/.."]}},
        "backends": [
            {"instance": "alpha", "unit": "vllm-alpha.service", "address": "127.0.0.1", "port": 8000,
             "url": "http://127.0.0.1:8000"},
            {"instance": "beta", "unit": "vllm-beta.service", "address": "127.0.0.1", "port": 8001,
             "url": "http://127.0.0.1:8001"}]}]


def test_two_models_get_two_front_doors_and_a_model_without_frontdoor_port_none():
    p = plan([{"name": "a", "model": "tiny"}, {"name": "b", "model": "other"}, {"name": "c", "model": "plain"},
              {"name": "d", "model": "tiny"}])
    assert [(fd["name"], fd["port"], [b["instance"] for b in fd["backends"]]) for fd in p["frontdoors"]] == [
        ("other", 9001, ["b"]), ("tiny", 9000, ["a", "d"])]
    assert p["frontdoors"][0]["served_model_name"] == "org/other"


def test_no_frontdoor_port_no_front_door_and_the_plan_is_otherwise_unchanged():
    models = {"m": {"repo_id": "org/m", "revision": SHA}}
    p = plan([{"name": "a", "model": "m"}], models)
    assert p["frontdoors"] == []
    with_fd = plan([{"name": "a", "model": "m"}], {"m": dict(models["m"], frontdoor_port=9000)})
    assert with_fd["instances"] == p["instances"] and with_fd["footprint"] == p["footprint"]


def test_the_front_door_listens_where_the_instances_do_unless_told():
    p = plan([{"name": "a", "model": "tiny"}], vllm_service_host="0.0.0.0")
    (fd,) = p["frontdoors"]
    assert fd["bind_address"] == "0.0.0.0" and fd["url"] == "http://127.0.0.1:9000"
    assert fd["backends"][0]["address"] == "127.0.0.1"
    p = plan([{"name": "a", "model": "tiny"}], vllm_service_host="0.0.0.0", vllm_frontdoor_bind_address="10.0.0.5")
    assert p["frontdoors"][0]["bind_address"] == "10.0.0.5" and p["frontdoors"][0]["url"] == "http://10.0.0.5:9000"
    p = plan([{"name": "a", "model": "tiny"}], vllm_service_host="::")
    assert p["frontdoors"][0]["url"] == "http://[::1]:9000" and p["frontdoors"][0]["backends"][0]["address"] == "::1"


def test_multi_node_rank_0_is_a_backend_and_a_headless_rank_is_not():
    models = {"minimax-m2": {"repo_id": "MiniMaxAI/MiniMax-M2", "revision": SHA, "served_model_name": "minimax-m2",
                             "frontdoor_port": 9000}}
    head = plan_of("seed-1", models=models)
    (fd,) = head["frontdoors"]
    assert [b["instance"] for b in fd["backends"]] == ["m2"] and fd["served_model_name"] == "minimax-m2"
    assert plan_of("seed-2", models=models)["frontdoors"] == []


def test_collisions_are_refused_naming_host_variable_and_fix():
    text = refused([{"name": "a", "model": "tiny", "port": 9000}])
    assert "host node-1" in text and "vllm_models.tiny.frontdoor_port is 9000, which is the HTTP port of instance 'a'" in text
    assert "give the front door a port no instance uses" in text
    text = refused([{"name": "a", "model": "tiny", "vllm_port": 8950}])
    assert "VLLM_PORT range 8950-9049 of instance 'a'" in text
    models = dict(MODELS, other=dict(MODELS["other"], frontdoor_port=9000))
    text = refused([{"name": "a", "model": "tiny"}, {"name": "b", "model": "other"}], models)
    assert "also the front door of model" in text and "give each model its own frontdoor_port" in text
    text = refused([{"name": "a", "model": "tiny"}, {"name": "b", "model": "tiny", "served_model_name": "x"}])
    assert "serve different names" in text and "'a': tiny-llama; 'b': x" in text
    text = refused([{"name": "a", "model": "tiny"}], dict(MODELS, tiny=dict(MODELS["tiny"], frontdoor_port=70000)))
    assert "vllm_models.tiny.frontdoor_port is 70000; use a TCP port number 1-65535" in text


def test_a_master_port_is_refused_as_front_door_on_its_rank_0_host():
    models = {"minimax-m2": {"repo_id": "MiniMaxAI/MiniMax-M2", "revision": SHA, "frontdoor_port": 29500}}
    with pytest.raises(PlanContractError) as err:
        plan_of("seed-1", [dict(BIG, master_port=29500)], models=models, fleet=fleet_of(["seed-1", "seed-2"]))
    assert "the master_port of instance 'm2'" in str(err.value)


def test_one_metrics_listener_per_host_with_front_doors_where_the_front_doors_listen():
    p = plan([{"name": "a", "model": "tiny"}, {"name": "b", "model": "other"}])
    assert p["frontdoor_metrics"] == {"bind_address": "127.0.0.1", "port": 9101,
                                      "url": "http://127.0.0.1:9101/metrics"}
    p = plan([{"name": "a", "model": "tiny"}], vllm_service_host="0.0.0.0", vllm_frontdoor_metrics_port=9200)
    assert p["frontdoor_metrics"] == {"bind_address": "0.0.0.0", "port": 9200, "url": "http://127.0.0.1:9200/metrics"}
    p = plan([{"name": "a", "model": "tiny"}], vllm_frontdoor_bind_address="::", vllm_frontdoor_metrics_port="9300")
    assert p["frontdoor_metrics"] == {"bind_address": "::", "port": 9300, "url": "http://[::1]:9300/metrics"}
    # 0: none; no front door on the host: none (no HAProxy runs there)
    assert plan([{"name": "a", "model": "tiny"}], vllm_frontdoor_metrics_port=0)["frontdoor_metrics"] is None
    assert plan([{"name": "a", "model": "plain"}])["frontdoor_metrics"] is None
    assert plan([{"name": "a", "model": "plain", "port": 9101}])["frontdoor_metrics"] is None


def test_a_metrics_port_in_use_is_refused_naming_host_variable_and_fix():
    text = refused([{"name": "a", "model": "tiny", "port": 9101}])
    assert "host node-1" in text and ("vllm_frontdoor_metrics_port is 9101, which is the HTTP port of instance 'a'; "
                                      "give the front doors' metrics listener a port no instance uses") in text
    text = refused([{"name": "a", "model": "tiny", "vllm_port": 9050}])
    assert "vllm_frontdoor_metrics_port is 9101, which is the VLLM_PORT range 9050-9149 of instance 'a'" in text
    text = refused([{"name": "a", "model": "tiny"}, {"name": "b", "model": "other"}], vllm_frontdoor_metrics_port=9001)
    assert ("vllm_frontdoor_metrics_port is 9001, which is the front door of model 'other' "
            "(vllm_models.other.frontdoor_port); give the metrics listener another port") in text
    # the default VLLM_PORT ranges (20000 + 100 per instance)
    text = refused([{"name": "a", "model": "tiny"}], vllm_frontdoor_metrics_port=20042)
    assert "VLLM_PORT range 20000-20099 of instance 'a'" in text
    for bad in (70000, -1, "x", True, 9101.5):
        text = refused([{"name": "a", "model": "tiny"}], vllm_frontdoor_metrics_port=bad)
        assert f"vllm_frontdoor_metrics_port is {bad!r}; use a TCP port number 1-65535, or 0 for no metrics" in text


def test_a_master_port_is_refused_as_metrics_port_on_its_rank_0_host():
    models = {"minimax-m2": {"repo_id": "MiniMaxAI/MiniMax-M2", "revision": SHA, "frontdoor_port": 9000}}
    with pytest.raises(PlanContractError) as err:
        plan_of("seed-1", [dict(BIG, master_port=9101)], models=models, fleet=fleet_of(["seed-1", "seed-2"]))
    assert "vllm_frontdoor_metrics_port is 9101, which is the master_port of instance 'm2'" in str(err.value)


def test_the_documented_keys_and_inputs():
    with open(os.path.join(ROOT, "docs", "plan.md")) as fh:
        text = fh.read()
    assert "`frontdoor_port`" in text and "`vllm_frontdoor_bind_address`" in text and "`frontdoors`" in text
    assert "`vllm_frontdoor_metrics_port`" in text and "`frontdoor_metrics`" in text
    # the role reads the plan only: no plan input is one of its variables
    assert not set(load_yaml("roles", "vllm_frontdoor", "defaults", "main.yml")) & set(PLAN_INPUTS)


# --------------------------------------------------------------------------- the configuration

def test_the_configuration_has_one_frontend_and_backend_per_model(tmp_path):
    p = plan([{"name": "alpha", "model": "tiny"}, {"name": "beta", "model": "tiny"}, {"name": "o", "model": "other"}])
    text = render("frontdoor.cfg.j2", p)
    sec = sections(text)
    edge = [
        "http-request deny deny_status 400 unless { url_beg / } || { url_beg -i http:// https:// }",
        "http-request deny deny_status 400 if { url_sub \\\\ % ; }",
        "http-request deny deny_status 400 if { path_sub /./ /../ // } || { path_end /. /.. }",
        "http-request deny deny_status 400 if { req.hdr_cnt(authorization) gt 1 }",
        "acl health path /health", "acl health_method method GET"]
    keyed = [
        f"http-request set-var(txn.client) req.fhdr(authorization),sha2(256),hex,lower,map_str({KEYS_DIR}/tiny.clients.map)"
        " if { req.hdr_cnt(authorization) eq 1 }",
        "http-request return status 401 content-type application/json string '{\"error\":{\"message\":\"a valid API key"
        " is required (Authorization: Bearer <key>)\",\"type\":\"authentication_error\",\"code\":401}}' hdr "
        "WWW-Authenticate Bearer unless health health_method || { var(txn.client) -m found }"]
    routes = ["acl route_get path /v1/models", "acl route_post path /v1/chat/completions /v1/completions",
              "http-request deny deny_status 404 unless health health_method || { method GET } route_get || "
              "{ method POST } route_post", "http-request set-uri %[pathq]"]
    assert sec["frontend tiny"] == ["bind 127.0.0.1:9000"] + edge + keyed + routes + ["default_backend tiny"]
    assert sec["backend tiny"] == [
        "balance leastconn", "option httpchk GET /health", "http-check expect status 200",
        f"http-request set-header Authorization \"Bearer %[str(instances),map_str({KEYS_DIR}/instances.map)]\"",
        "http-response set-header X-Inferops-Instance %s",
        "server alpha 127.0.0.1:8000 check inter 2s fall 3 rise 2",
        "server beta 127.0.0.1:8001 check inter 2s fall 3 rise 2"]
    assert sec["frontend other"][0] == "bind 127.0.0.1:9001" and sec["frontend other"][-1] == "default_backend other"
    assert "stats socket /run/inferops-vllm-frontdoor/admin.sock mode 600 level admin expose-fd listeners" in sec["global"]
    assert "timeout server 10m" in sec["defaults"] and "option redispatch" in sec["defaults"]
    # no regular expression: HAProxy compiles them with PCRE2's JIT, which the unit's MemoryDenyWriteExecute forbids
    # (haproxy -c then fails in ExecStartPre: found in Molecule)
    assert not re.search(r"-m reg|_reg\b|regsub|\breg\(", text), re.findall(r".*reg.*", text)
    # no key anywhere in the configuration: the maps hold digests of the client keys and the instances' key
    assert INSTANCE_KEY not in text
    with open(os.path.join(KEYS_DIR, "instances.map")) as fh:
        assert fh.read() == f"instances {INSTANCE_KEY}\n"
    with open(os.path.join(KEYS_DIR, "tiny.clients.map")) as fh:
        digest = hashlib.sha256(f"Bearer {INSTANCE_KEY}".encode()).hexdigest()
        assert fh.read().splitlines()[-1] == f"{digest} vllm_service_api_key"
    models_only = text.split("\nfrontend _metrics\n", 1)[0]
    assert re.findall(r"^\s*http-response .*", models_only, re.M) == ["    http-response set-header X-Inferops-Instance %s"] * 2
    # the metrics of every front door: HAProxy's exporter on /metrics, where the front doors listen
    assert sec["frontend _metrics"] == ["bind 127.0.0.1:9101", "option dontlog-normal",
                                        "http-request use-service prometheus-exporter if { path /metrics }",
                                        "http-request return status 404"]
    assert list(sec)[-1] == "frontend _metrics"
    if HAPROXY:
        out = haproxy_check(tmp_path, text)
        assert "WARNING" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_no_served_by_header_when_it_is_empty(tmp_path):
    p = plan([{"name": "alpha", "model": "tiny"}])
    text = render("frontdoor.cfg.j2", p, vllm_frontdoor_served_by_header="")
    assert "http-response" not in text
    if HAPROXY:
        out = haproxy_check(tmp_path, text)
        assert "WARNING" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_no_metrics_listener_when_the_port_is_0():
    text = render("frontdoor.cfg.j2", plan([{"name": "a", "model": "tiny"}], vllm_frontdoor_metrics_port=0))
    assert "_metrics" not in text and "prometheus-exporter" not in text


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@needs_haproxy
def test_a_running_haproxy_serves_its_metrics_and_404_elsewhere(tmp_path):
    """haproxy -c accepts use-service; this runs it: /metrics has the front doors' counters, / is 404."""
    fd_port, metrics_port = _free_port(), _free_port()
    models = {"tiny": dict(MODELS["tiny"], frontdoor_port=fd_port)}
    p = plan([{"name": "a", "model": "tiny", "port": _free_port()}], models, vllm_frontdoor_metrics_port=metrics_port)
    text = render("frontdoor.cfg.j2", p)
    cfg = tmp_path / "run.cfg"
    cfg.write_text("\n".join(line for line in text.splitlines() if "stats socket" not in line) + "\n")
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url, status, body = p["frontdoor_metrics"]["url"], None, ""
        for _attempt in range(50):
            try:
                status, body = _get(url)
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200 and 'haproxy_frontend_http_requests_total{proxy="tiny"} 0' in body
        assert _get(f"http://127.0.0.1:{fd_port}/v1/models")[0] == 401  # no key
        assert _get(f"http://127.0.0.1:{fd_port}/health")[0] == 503  # its one backend is down
        assert 'haproxy_frontend_http_requests_total{proxy="tiny"} 2' in _get(url)[1]
        assert _get(url.replace("/metrics", "/"))[0] == 404
        assert _get(url.replace("/metrics", "/stats"))[0] == 404
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@needs_haproxy
def test_haproxy_accepts_ipv6_wildcard_and_knobs(tmp_path):
    p = plan([{"name": "a", "model": "tiny"}], vllm_service_host="::", vllm_frontdoor_check_interval="500ms")
    text = render("frontdoor.cfg.j2", p, vllm_frontdoor_timeout_server="1h",
                  vllm_frontdoor_log_level="info")
    assert "bind :::9000" in text and "server a ::1:8000 check inter 500ms" in text
    haproxy_check(tmp_path, text)


@needs_haproxy
def test_haproxy_refuses_a_broken_configuration(tmp_path):
    """The role's validate step is worth having: a broken file is refused, not loaded."""
    p = plan([{"name": "a", "model": "tiny"}])
    cfg = tmp_path / "broken.cfg"
    cfg.write_text(render("frontdoor.cfg.j2", p, vllm_frontdoor_timeout_server="ten minutes"))
    out = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, check=False)
    assert out.returncode != 0


def test_the_unit_is_hardened_and_unprivileged():
    p = plan([{"name": "a", "model": "tiny"}])
    unit = directives(render("frontdoor.service.j2", p))
    assert unit["User"] == ["haproxy"] and unit["Type"] == ["notify"]
    assert unit["ExecStart"] == ["/usr/sbin/haproxy -Ws -f /etc/haproxy/inferops-vllm-frontdoor.cfg "
                                 "-p /run/inferops-vllm-frontdoor/haproxy.pid"]
    # a reload checks the file first: a broken file never replaces the running workers
    assert unit["ExecReload"] == ["/usr/sbin/haproxy -c -q -f /etc/haproxy/inferops-vllm-frontdoor.cfg",
                                  "/bin/kill -USR2 $MAINPID"]
    assert unit["RuntimeDirectory"] == ["inferops-vllm-frontdoor"]
    assert unit["CapabilityBoundingSet"] == [""] and unit["AmbientCapabilities"] == [""]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices", "MemoryDenyWriteExecute",
                "ProtectKernelTunables", "RestrictNamespaces", "ProtectProc"):
        assert key in unit, key
    assert unit["ProtectSystem"] == ["strict"]
    low = plan([{"name": "a", "model": "tiny"}], dict(MODELS, tiny=dict(MODELS["tiny"], frontdoor_port=80)))
    unit = directives(render("frontdoor.service.j2", low))
    assert unit["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"] == unit["AmbientCapabilities"]
    low = plan([{"name": "a", "model": "tiny"}], vllm_frontdoor_metrics_port=910)
    unit = directives(render("frontdoor.service.j2", low))
    assert unit["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"] == unit["AmbientCapabilities"]


# --------------------------------------------------------------------------- the property

ports = st.integers(1, 65535)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(fd_ports=st.lists(st.one_of(st.none(), ports), min_size=1, max_size=3),
       instances=st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(1024, 65000))),
                          min_size=1, max_size=4),
       host_addr=st.sampled_from(["127.0.0.1", "0.0.0.0", "::", "::1"]),
       metrics_port=st.one_of(st.just(0), st.just(9101), st.integers(1, 65535)))
def test_every_accepted_plan_renders_a_configuration_haproxy_accepts(tmp_path, fd_ports, instances, host_addr,
                                                                     metrics_port):
    models = {f"m{i}": {"repo_id": f"org/m{i}", "revision": SHA, "frontdoor_port": port}
              for i, port in enumerate(fd_ports)}
    insts = [dict({"name": f"i{n}", "model": f"m{m % len(fd_ports)}"}, **({"port": port} if port else {}))
             for n, (m, port) in enumerate(instances)]
    try:
        p = build_plan(models, insts, CPU, {"vllm_preflight_gpu": False, "vllm_service_host": host_addr,
                                            "vllm_frontdoor_metrics_port": metrics_port}, host="h")
    except PlanContractError:
        return
    served = {i["model"]["key"] for i in p["instances"]}
    assert {fd["model"] for fd in p["frontdoors"]} == {k for k in served if models[k]["frontdoor_port"]}
    used = {i["port"] for i in p["instances"]}
    for fd in p["frontdoors"]:
        assert fd["port"] not in used
        assert [b["instance"] for b in fd["backends"]] == [i["name"] for i in p["instances"]
                                                           if i["model"]["key"] == fd["model"]]
    metrics = p["frontdoor_metrics"]
    assert (metrics is not None) == bool(p["frontdoors"] and metrics_port)
    if metrics:
        assert metrics["port"] == metrics_port and metrics["port"] not in used | {fd["port"] for fd in p["frontdoors"]}
        assert not any(i["vllm_port"] <= metrics_port < i["vllm_port"] + 100 for i in p["instances"])
    text = render("frontdoor.cfg.j2", p)
    assert text.count("use-service prometheus-exporter") == (1 if metrics else 0)
    servers = re.findall(r"^    server (\S+) ", text, re.M)
    assert servers == [b["instance"] for fd in p["frontdoors"] for b in fd["backends"]]
    if HAPROXY and p["frontdoors"]:
        haproxy_check(tmp_path, text)


# --------------------------------------------------------------------------- the frontdoor_server module

class _Instance:
    """A stand-in for one vLLM instance behind the front door: /health answers 200 while ``healthy``, /metrics
    shows ``load`` requests running (vLLM's gauge, with its labels)."""

    def __init__(self):
        import http.server  # pylint: disable=import-outside-toplevel
        import threading  # pylint: disable=import-outside-toplevel
        owner = self
        self.healthy, self.load = True, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path == "/health":
                    code, body = (200 if owner.healthy else 503), b""
                elif self.path == "/metrics":
                    code = 200
                    body = (f'vllm:num_requests_running{{engine="0",model_name="tiny-llama"}} {owner.load}.0\n'
                            'vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 0.0\n').encode()
                else:
                    code, body = 404, b""
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="frontdoor")
def fixture_frontdoor(tmp_path):
    """A real HAProxy from the role's configuration (its runtime API socket under tmp_path) with one backend
    server, instance ``a`` of model tiny, in front of a stand-in instance."""
    if HAPROXY is None:
        pytest.skip("haproxy is not installed here (make sysdeps installs it)")
    inst = _Instance()
    sock = str(tmp_path / "admin.sock")
    models = {"tiny": dict(MODELS["tiny"], frontdoor_port=_free_port())}
    p = plan([{"name": "a", "model": "tiny", "port": inst.port}], models, vllm_frontdoor_metrics_port=0,
             vllm_frontdoor_check_interval="200ms")
    cfg = tmp_path / "run.cfg"
    cfg.write_text(render("frontdoor.cfg.j2", p, vllm_frontdoor__socket=sock))
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _attempt in range(50):
            if os.path.exists(sock):
                break
            time.sleep(0.1)
        yield {"socket": sock, "instance": inst, "url": f"http://127.0.0.1:{inst.port}"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        inst.close()


WARNINGS = []


def _server(monkeypatch, check_mode=False, **args):
    """Run the module's main() (tests/unit/plugins/modules/gpu_harness.py's AnsibleModule harness)."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "modules"))
    from gpu_harness import run_main  # pylint: disable=import-outside-toplevel
    from ansible_collections.inferops.vllm.plugins.modules import frontdoor_server  # pylint: disable=import-outside-toplevel
    args = dict({"backend": "tiny", "server": "a", "interval": 0.2}, **args)
    if check_mode:
        args["_ansible_check_mode"] = True
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda _self, warning: WARNINGS.append(warning))
    return run_main(frontdoor_server.main, args, monkeypatch)


def test_frontdoor_server_drains_waits_for_the_requests_and_puts_back_until_up(frontdoor, monkeypatch):
    """The module on a real HAProxy (the role's configuration): ready waits for UP; a drain waits while the
    instance still runs requests (and warns at the deadline), a second drain changes nothing; check mode
    reports a put-back without doing it; ready puts it back and waits until HAProxy's checks see it UP."""
    sock, inst = frontdoor["socket"], frontdoor["instance"]
    status, res = _server(monkeypatch, socket=sock, state="ready", timeout=20)
    assert status == "ok" and res["present"] and res["status"] == "UP" and not res["changed"], res

    inst.load = 2
    status, res = _server(monkeypatch, socket=sock, state="drain", wait_url=frontdoor["url"], timeout=1)
    assert status == "ok" and res["changed"] and res["before"] == "UP" and res["status"] == "DRAIN", res
    assert res["drained"] is False and res["waited"] >= 1
    assert any("a still had 2 request(s) after 1 s of draining" in w for w in WARNINGS), WARNINGS

    inst.load = 0
    status, res = _server(monkeypatch, socket=sock, state="drain", wait_url=frontdoor["url"], timeout=5)
    assert status == "ok" and not res["changed"] and res["drained"] is True and res["status"] == "DRAIN", res

    status, res = _server(monkeypatch, check_mode=True, socket=sock, state="ready")
    assert status == "ok" and res["changed"] and res["status"] == "DRAIN", res
    assert server_states_of(sock)["tiny/a"]["status"] == "DRAIN"

    status, res = _server(monkeypatch, socket=sock, state="ready", timeout=20)
    assert status == "ok" and res["changed"] and res["before"] == "DRAIN" and res["status"] == "UP", res


def test_frontdoor_server_fails_naming_the_state_when_the_instance_stays_down(frontdoor, monkeypatch):
    """Drained, then its /health fails (its restart did not come back): put back, HAProxy's checks keep it DOWN,
    and the module fails at the deadline naming the state and the last check."""
    sock, inst = frontdoor["socket"], frontdoor["instance"]
    status, res = _server(monkeypatch, socket=sock, state="drain")
    assert status == "ok" and res["changed"] and res["drained"] is True, res
    inst.healthy = False
    time.sleep(1.5)  # three failed checks 200 ms apart
    status, res = _server(monkeypatch, socket=sock, state="ready", timeout=3)
    assert status == "fail", res
    assert "front door server tiny/a is not UP 3 s after it was put back: it is DOWN" in res["msg"], res["msg"]
    assert "(last check L7STS)" in res["msg"] and "fails its /health check" in res["msg"]


def test_frontdoor_server_has_nothing_to_do_without_a_front_door_or_the_server(frontdoor, monkeypatch, tmp_path):
    status, res = _server(monkeypatch, socket=frontdoor["socket"], server="new", state="drain",
                          wait_url=frontdoor["url"])
    assert status == "ok" and not res["changed"] and not res["present"], res
    assert "has no server tiny/new" in res["msg"]
    status, res = _server(monkeypatch, socket=str(tmp_path / "none.sock"), state="ready")
    assert status == "ok" and not res["changed"] and not res["present"] and "no front door runs here" in res["msg"]


def test_frontdoor_server_adds_a_new_instance_to_the_running_backend(frontdoor, monkeypatch):
    """A renamed or new instance (gamma) is not in the running front door until the role's reload at the end of the
    run; its put-back adds it (HAProxy's `add server`, checks as the plan's, then `enable health` and `enable server`)
    and waits until it is UP, so that the model's last other instance (a) can drain while gamma serves. Check mode
    says it would add it and adds nothing; a second call finds it present; a backend HAProxy does not run yet (a model
    new in this run) is left to the reload; a new instance that fails its checks fails the call, named."""
    sock = frontdoor["socket"]
    gamma, sick = _Instance(), _Instance()
    sick.healthy = False
    check = {"inter": "200ms", "fall": 2, "rise": 1}
    try:
        args = {"socket": sock, "server": "gamma", "state": "ready", "address": "127.0.0.1", "port": gamma.port,
                "check": check, "timeout": 20}
        status, res = _server(monkeypatch, check_mode=True, **args)
        assert status == "ok" and res["changed"] and res["added"] and not res["present"], res
        assert "tiny/gamma" not in server_states_of(sock)

        status, res = _server(monkeypatch, **args)
        assert status == "ok" and res["changed"] and res["added"] and res["status"] == "UP", res
        assert server_states_of(sock)["tiny/gamma"]["address"] == f"127.0.0.1:{gamma.port}"
        # a can drain now: the backend still has a server UP (the gap this closes: 503s while a restarted)
        status, res = _server(monkeypatch, socket=sock, state="drain", wait_url=frontdoor["url"])
        assert status == "ok" and res["status"] == "DRAIN", res
        assert [k for k, v in server_states_of(sock).items() if v["status"] == "UP"] == ["tiny/gamma"]

        status, res = _server(monkeypatch, **args)
        assert status == "ok" and not res["changed"] and not res["added"] and res["status"] == "UP", res

        status, res = _server(monkeypatch, **dict(args, backend="other"))  # (a backend not running yet)
        assert status == "ok" and not res["changed"] and not res["added"] and not res["present"], res
        assert "no backend other yet" in res["msg"], res["msg"]

        args.update(server="sick", port=sick.port, timeout=2)
        status, res = _server(monkeypatch, **args)
        assert status == "fail" and res["added"], res
        assert "front door server tiny/sick, added to the running front door, is not UP 2 s later" in res["msg"]
        assert "fails its /health check" in res["msg"]
    finally:
        gamma.close()
        sick.close()


def server_states_of(sock):
    from ansible_collections.inferops.vllm.plugins.module_utils.haproxy_runtime import (  # pylint: disable=import-outside-toplevel
        runtime_command, server_states)
    return server_states(runtime_command(sock, "show stat"))
