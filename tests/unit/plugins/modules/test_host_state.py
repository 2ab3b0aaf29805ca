"""host_state: record a host, then probe it, on real files in a temporary tree, through main()."""
import json
import os
import socket
import stat
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.modules import host_state

from gpu_harness import run_main  # tests/unit/plugins/modules/gpu_harness.py


def run(args, monkeypatch, check=False):
    """main() with args; ("ok", result) or ("fail", result). Any other exception escapes (a traceback)."""
    return run_main(host_state.main, args, monkeypatch, check=check)


def record(monkeypatch, path, inputs="digest-1", **kwargs):
    args = dict(path=str(path), state="record", inputs=inputs, units=[])
    args.update(kwargs)
    status, result = run(args, monkeypatch)
    assert status == "ok", result
    return result


def probe(monkeypatch, path, inputs="digest-1", check=False, **kwargs):
    args = dict(path=str(path), state="probe", inputs=inputs)
    args.update(kwargs)
    status, result = run(args, monkeypatch, check=check)
    assert status == "ok", result
    return result


def tree(root, files):
    """Write {relative path: text} under root; returns root."""
    for rel, text in files.items():
        target = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
    return root


@pytest.fixture(name="conf")
def conf_fixture(tmp_path):
    """A recorded directory (two files, one in a sub-directory) and the record's path beside it."""
    directory = tree(tmp_path / "etc", {"a.conf": "a = 1\n", "sub/b.conf": "b = 2\n"})
    return directory, tmp_path / "converged.json"


def assert_not_converged_naming(result, needle):
    assert result["converged"] is False
    assert any(needle in reason for reason in result["reasons"]), result["reasons"]


# ---------------------------------------------------------------- record, probe, absent


def test_a_host_probed_with_the_inputs_it_was_recorded_with_is_converged_and_a_second_record_changes_nothing(
        conf, monkeypatch):
    directory, path = conf
    first = record(monkeypatch, path, files=[str(directory)], facts={"vllm_install_installed_version": "0.9.1"},
                   users=["root"], groups=["root"])
    assert first["changed"] is True
    assert first["entries"] == {"files": 2, "large": 0, "units": 0, "users": 1, "groups": 1}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not os.path.exists(str(path) + ".tmp")

    result = probe(monkeypatch, path)
    assert result["converged"] is True and result["reasons"] == [] and result["changed"] is False
    assert result["facts"] == {"vllm_install_installed_version": "0.9.1"}
    assert result["entries"]["files"] == 2
    assert os.path.exists(path), "a converged probe keeps the record"

    again = record(monkeypatch, path, files=[str(directory)], facts={"vllm_install_installed_version": "0.9.1"},
                   users=["root"], groups=["root"])
    assert again["changed"] is False


def test_a_record_in_check_mode_writes_nothing_and_absent_removes_the_record(conf, monkeypatch):
    directory, path = conf
    status, result = run(dict(path=str(path), state="record", inputs="x", files=[str(directory)]), monkeypatch,
                         check=True)
    assert status == "ok" and result["changed"] is True and not os.path.exists(path)
    record(monkeypatch, path, files=[str(directory)])
    status, result = run(dict(path=str(path), state="absent"), monkeypatch, check=True)
    assert status == "ok" and result["changed"] is True and os.path.exists(path)
    status, result = run(dict(path=str(path), state="absent"), monkeypatch)
    assert status == "ok" and result["changed"] is True and not os.path.exists(path)
    status, result = run(dict(path=str(path), state="absent"), monkeypatch)
    assert status == "ok" and result["changed"] is False


def test_other_inputs_are_not_converged_and_the_probe_removes_the_record(conf, monkeypatch):
    directory, path = conf
    record(monkeypatch, path, files=[str(directory)], facts={"k": "v"})
    result = probe(monkeypatch, path, inputs="digest-2")
    assert_not_converged_naming(result, "inputs")
    assert result["facts"] == {} and result["changed"] is True
    assert not os.path.exists(path), "a run that is not a no-op must not find the old record"


def test_other_inputs_in_check_mode_are_not_converged_and_the_record_stays(conf, monkeypatch):
    directory, path = conf
    record(monkeypatch, path, files=[str(directory)])
    result = probe(monkeypatch, path, inputs="digest-2", check=True)
    assert_not_converged_naming(result, "inputs")
    assert os.path.exists(path)


def test_no_record_is_not_converged(tmp_path, monkeypatch):
    result = probe(monkeypatch, tmp_path / "converged.json")
    assert_not_converged_naming(result, "no record")
    assert result["changed"] is False


def test_a_record_that_is_not_json_or_of_another_schema_counts_as_no_record(tmp_path, monkeypatch):
    path = tmp_path / "converged.json"
    for text in ("{not json", json.dumps({"schema": 99, "inputs": "digest-1"}), "[1, 2]"):
        path.write_text(text)
        result = probe(monkeypatch, path)
        assert_not_converged_naming(result, "no record")


# ---------------------------------------------------------------- files


def test_a_file_whose_content_changed_is_not_converged(conf, monkeypatch):
    directory, path = conf
    record(monkeypatch, path, files=[str(directory)])
    (directory / "sub" / "b.conf").write_text("b = 3\n")
    assert_not_converged_naming(probe(monkeypatch, path), str(directory / "sub" / "b.conf"))


def test_a_file_whose_mode_changed_is_not_converged(conf, monkeypatch):
    directory, path = conf
    record(monkeypatch, path, files=[str(directory)])
    os.chmod(directory / "a.conf", 0o600 if stat.S_IMODE(os.stat(directory / "a.conf").st_mode) != 0o600 else 0o644)
    assert_not_converged_naming(probe(monkeypatch, path), str(directory / "a.conf"))


def test_a_removed_file_is_not_converged(conf, monkeypatch):
    directory, path = conf
    record(monkeypatch, path, files=[str(directory)])
    os.unlink(directory / "a.conf")
    result = probe(monkeypatch, path)
    assert_not_converged_naming(result, "file %s is gone" % (directory / "a.conf"))


def test_a_new_file_in_a_recorded_directory_is_not_converged(conf, monkeypatch):
    directory, path = conf
    record(monkeypatch, path, files=[str(directory)])
    (directory / "sub" / "new.conf").write_text("new\n")
    assert_not_converged_naming(probe(monkeypatch, path), "file %s is new" % (directory / "sub" / "new.conf"))


def test_a_new_file_matching_a_recorded_glob_is_not_converged(tmp_path, monkeypatch):
    units = tree(tmp_path / "system", {"vllm-a.service": "[Unit]\n", "other.service": "[Unit]\n"})
    path = tmp_path / "converged.json"
    assert record(monkeypatch, path, files=[str(units / "vllm-*.service")])["entries"]["files"] == 1
    (units / "unrelated.service").write_text("[Unit]\n")
    assert probe(monkeypatch, path)["converged"] is True
    (units / "vllm-b.service").write_text("[Unit]\n")
    assert_not_converged_naming(probe(monkeypatch, path), str(units / "vllm-b.service"))


def test_a_re_pointed_symlink_is_not_converged(tmp_path, monkeypatch):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    current = tmp_path / "current"
    os.symlink("v1", current)
    path = tmp_path / "converged.json"
    record(monkeypatch, path, files=[str(current)])
    assert probe(monkeypatch, path)["converged"] is True
    os.unlink(current)
    os.symlink("v2", current)
    result = probe(monkeypatch, path)
    assert_not_converged_naming(result, str(current))
    assert any("link:v2" in r and "link:v1" in r for r in result["reasons"]), result["reasons"]


def test_a_re_pointed_symlink_to_a_directory_inside_a_recorded_directory_is_not_converged(tmp_path, monkeypatch):
    prefix = tree(tmp_path / "prefix", {"v1/pyvenv.cfg": "1\n", "v2/pyvenv.cfg": "2\n"})
    os.symlink("v1", prefix / "current")
    path = tmp_path / "converged.json"
    record(monkeypatch, path, files=[str(prefix)])
    assert probe(monkeypatch, path)["converged"] is True
    os.unlink(prefix / "current")
    os.symlink("v2", prefix / "current")
    assert_not_converged_naming(probe(monkeypatch, path), str(prefix / "current"))


def test_a_stat_file_with_a_new_mtime_is_not_converged(tmp_path, monkeypatch):
    weights = tree(tmp_path / "weights", {"model-00001.safetensors": "x" * 100, "config.json": "{}"})
    path = tmp_path / "converged.json"
    result = record(monkeypatch, path, stat_files=[str(weights / "*")])
    assert result["entries"]["large"] == 2
    assert probe(monkeypatch, path)["converged"] is True
    shard = weights / "model-00001.safetensors"
    st_ = os.stat(shard)
    os.utime(shard, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
    assert_not_converged_naming(probe(monkeypatch, path), str(shard))


def test_a_stat_file_with_a_new_size_is_not_converged_even_with_its_old_mtime(tmp_path, monkeypatch):
    weights = tree(tmp_path / "weights", {"model-00001.safetensors": "x" * 100})
    shard = weights / "model-00001.safetensors"
    path = tmp_path / "converged.json"
    record(monkeypatch, path, stat_files=[str(weights)])
    st_ = os.stat(shard)
    with open(shard, "a", encoding="utf-8") as handle:
        handle.write("y")
    os.utime(shard, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    assert os.stat(shard).st_mtime_ns == st_.st_mtime_ns
    assert_not_converged_naming(probe(monkeypatch, path), str(shard))


def test_a_stat_file_is_not_read_so_same_size_same_mtime_content_changes_pass(tmp_path, monkeypatch):
    weights = tree(tmp_path / "weights", {"shard": "aaaa"})
    shard = weights / "shard"
    path = tmp_path / "converged.json"
    record(monkeypatch, path, stat_files=[str(shard)])
    st_ = os.stat(shard)
    shard.write_text("bbbb")
    os.utime(shard, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    assert probe(monkeypatch, path)["converged"] is True


def test_a_pycache_directory_change_is_ignored(tmp_path, monkeypatch):
    code = tree(tmp_path / "code", {"mod.py": "x = 1\n", "__pycache__/mod.cpython-313.pyc": "old",
                                    "pkg/__pycache__/a.pyc": "old"})
    path = tmp_path / "converged.json"
    assert record(monkeypatch, path, files=[str(code)])["entries"]["files"] == 1
    (code / "__pycache__" / "mod.cpython-313.pyc").write_text("new")
    (code / "__pycache__" / "other.pyc").write_text("added")
    os.unlink(code / "pkg" / "__pycache__" / "a.pyc")
    result = probe(monkeypatch, path)
    assert result["converged"] is True, result["reasons"]


def test_the_record_file_itself_is_never_listed_even_when_its_directory_is_recorded(tmp_path, monkeypatch):
    config = tree(tmp_path / "config", {"a.conf": "a\n"})
    path = config / "converged.json"
    for files in ([str(config)], [str(config) + "/"], [str(config / "*")], [str(path), str(config)]):
        first = record(monkeypatch, path, files=files)
        assert first["entries"]["files"] == 1, files
        recorded = json.loads(path.read_text())
        assert str(path) not in recorded["files"] and all(not p.endswith("converged.json") for p in recorded["files"])
        assert str(path) not in recorded["globs"]
        # the record now exists and is rewritten by a second record: it must not differ from itself
        assert record(monkeypatch, path, files=files)["changed"] is False, files
        result = probe(monkeypatch, path)
        assert result["converged"] is True, (files, result["reasons"])


def test_the_record_file_itself_is_never_listed_even_when_its_directory_is_a_stat_files_glob(
        tmp_path, monkeypatch):
    config = tree(tmp_path / "config", {"a.conf": "a\n"})
    path = config / "converged.json"
    record(monkeypatch, path, stat_files=[str(config)])
    record(monkeypatch, path, stat_files=[str(config)])
    assert str(path) not in json.loads(path.read_text())["large"]
    assert probe(monkeypatch, path)["converged"] is True


# ---------------------------------------------------------------- users, groups, units


def test_a_user_that_is_gone_is_not_converged_and_an_existing_user_passes(tmp_path, monkeypatch):
    path = tmp_path / "converged.json"
    record(monkeypatch, path, users=["root"], groups=["root"])
    assert probe(monkeypatch, path)["converged"] is True
    record(monkeypatch, path, users=["root", "no-such-user-xyz"])
    result = probe(monkeypatch, path)
    assert result["reasons"] == ["user no-such-user-xyz is gone"]
    assert result["converged"] is False


def test_a_group_that_is_gone_is_not_converged(tmp_path, monkeypatch):
    path = tmp_path / "converged.json"
    record(monkeypatch, path, groups=["root", "no-such-group-xyz"])
    assert probe(monkeypatch, path)["reasons"] == ["group no-such-group-xyz is gone"]


def test_a_unit_that_systemctl_cannot_read_is_a_difference_even_when_it_was_unreadable_at_record_time(
        tmp_path, monkeypatch):
    """No systemd here: ``systemctl show`` answers rc != 0; the probe returns (no traceback), not converged."""
    path = tmp_path / "converged.json"
    assert record(monkeypatch, path, units=["vllm-a.service"])["entries"]["units"] == 1
    recorded = json.loads(path.read_text())["unit_states"]["vllm-a.service"]
    if not recorded.startswith("unreadable"):
        pytest.skip("systemctl reads units on this machine (%s)" % recorded)
    status, result = run(dict(path=str(path), inputs="digest-1"), monkeypatch)
    assert status == "ok", result
    assert_not_converged_naming(result, "unit vllm-a.service is unreadable")


def test_a_unit_recorded_active_that_the_probe_finds_otherwise_is_not_converged(tmp_path, monkeypatch):
    path = tmp_path / "converged.json"
    record(monkeypatch, path, units=["vllm-a.service"])
    data = json.loads(path.read_text())
    data["unit_states"]["vllm-a.service"] = "active/enabled"
    path.write_text(json.dumps(data))
    status, result = run(dict(path=str(path), inputs="digest-1"), monkeypatch)
    assert status == "ok", result
    assert_not_converged_naming(result, "unit vllm-a.service")
    assert any("recorded active/enabled" in reason for reason in result["reasons"]), result["reasons"]


def test_a_probe_without_systemctl_on_the_path_fails_cleanly_or_reports_the_unit(tmp_path, monkeypatch):
    path = tmp_path / "converged.json"
    record(monkeypatch, path, units=["vllm-a.service"])
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    status, result = run(dict(path=str(path), inputs="digest-1"), monkeypatch)
    if status == "fail":  # AnsibleModule.run_command turns the missing binary into fail_json
        assert "systemctl" in json.dumps(result.get("cmd", "")) or "systemctl" in result["msg"]
    else:
        assert_not_converged_naming(result, "unit vllm-a.service")


# ---------------------------------------------------------------- routers


class _Router:
    """A local HTTP server answering GET /list_workers with {"urls": [...]}."""

    def __init__(self, urls):
        self.urls = urls
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  (http.server's name)
                if self.path.rstrip("/") != "/list_workers":
                    self.send_error(404)
                    return
                body = json.dumps({"urls": owner.urls}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(name="no_proxy")
def no_proxy_fixture(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def closed_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


WORKERS = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


def test_a_router_listing_the_planned_workers_in_any_order_with_or_without_a_trailing_slash_is_converged(
        tmp_path, monkeypatch, no_proxy):
    path = tmp_path / "converged.json"
    record(monkeypatch, path)
    with _Router(["http://127.0.0.1:8002/", "http://127.0.0.1:8001"]) as router:
        for url in (router.url, router.url + "/"):
            result = probe(monkeypatch, path, routers=[{"url": url, "workers": WORKERS}], timeout=5)
            assert result["converged"] is True, result["reasons"]


def test_a_router_listing_other_workers_is_not_converged_naming_the_router(tmp_path, monkeypatch, no_proxy):
    path = tmp_path / "converged.json"
    record(monkeypatch, path)
    with _Router(["http://127.0.0.1:8001", "http://127.0.0.1:8003"]) as router:
        result = probe(monkeypatch, path, check=True, routers=[{"url": router.url, "workers": WORKERS}], timeout=5)
        assert_not_converged_naming(result, "router %s lists" % router.url)
        router.urls = ["http://127.0.0.1:8001"]
        assert_not_converged_naming(
            probe(monkeypatch, path, check=True, routers=[{"url": router.url, "workers": WORKERS}], timeout=5),
            router.url)
        router.urls = []
        assert_not_converged_naming(
            probe(monkeypatch, path, routers=[{"url": router.url, "workers": WORKERS}], timeout=5), router.url)
    assert not os.path.exists(path)


def test_a_router_that_does_not_answer_is_not_converged(tmp_path, monkeypatch, no_proxy):
    path = tmp_path / "converged.json"
    record(monkeypatch, path)
    url = "http://127.0.0.1:%d" % closed_port()
    result = probe(monkeypatch, path, routers=[{"url": url, "workers": WORKERS}], timeout=2)
    assert_not_converged_naming(result, "router %s does not answer" % url)


def test_a_router_answering_something_else_than_a_worker_list_is_not_converged(tmp_path, monkeypatch, no_proxy):
    path = tmp_path / "converged.json"
    record(monkeypatch, path)
    with _Router(WORKERS) as router:
        result = probe(monkeypatch, path, routers=[{"url": router.url + "/nothing-here", "workers": WORKERS}],
                       timeout=5)
    assert_not_converged_naming(result, "does not answer")


# ---------------------------------------------------------------- property

NAMES = st.sampled_from(["f1", "f2", "f3", "d1/f1", "d1/f2", "d2/f1", "d1/d3/f1", ".hidden", "d2/.f"])
TREES = st.dictionaries(NAMES, st.binary(max_size=16), min_size=1, max_size=6)


def _write(root, rel, data):
    target = os.path.join(root, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as handle:
        handle.write(data)


@settings(max_examples=30, deadline=None)
@given(files=TREES, mutation=st.sampled_from(["content", "delete", "add", "chmod"]), data=st.data())
def test_any_small_tree_probed_unchanged_is_converged_and_after_one_mutation_is_not(files, mutation, data):
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as monkeypatch:
        root = os.path.join(tmp, "tree")
        os.makedirs(root)
        for rel, content in files.items():
            _write(root, rel, content)
        path = os.path.join(root, "converged.json")  # the record lives in the recorded tree
        result = record(monkeypatch, path, files=[root])
        assert result["entries"]["files"] == len(files)
        assert probe(monkeypatch, path)["converged"] is True

        victim = data.draw(st.sampled_from(sorted(files)), label="victim")
        if mutation == "content":
            new = data.draw(st.binary(max_size=16).filter(lambda b: b != files[victim]), label="new content")
            _write(root, victim, new)
        elif mutation == "delete":
            os.unlink(os.path.join(root, victim))
        elif mutation == "chmod":
            os.chmod(os.path.join(root, victim), stat.S_IMODE(os.stat(os.path.join(root, victim)).st_mode) ^ 0o010)
        else:
            victim = data.draw(NAMES.filter(lambda n: n not in files), label="added")
            _write(root, victim, b"added")
        result = probe(monkeypatch, path)
        assert result["converged"] is False
        assert any(os.path.join(root, victim) in reason for reason in result["reasons"]), result["reasons"]
        assert not os.path.exists(path)
