"""host_files: directories and files on the real file system (a temporary tree), through main()."""
import grp
import os
import pwd
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.inferops.vllm.plugins.modules import host_files

from gpu_harness import run_main

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


def run(args, monkeypatch, check=False, diff=False):
    return run_main(host_files.main, dict(args, _ansible_check_mode=check, _ansible_diff=diff), monkeypatch)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_creates_directories_with_parents_then_files_and_is_idempotent(tmp_path, monkeypatch):
    top = tmp_path / "a" / "b" / "c"
    args = {
        "directories": [{"path": str(top), "owner": ME, "group": MY_GROUP, "mode": "0750"}],
        "files": [
            {"path": str(top / "x.sh"), "content": "#!/bin/sh\necho x\n", "mode": "0755"},
            {"path": str(top / "y.conf"), "content": "y = 1\n"},
        ],
    }
    status, result = run(args, monkeypatch)
    assert status == "ok" and result["changed"]
    assert result["changed_paths"] == [str(top), str(top / "x.sh"), str(top / "y.conf")]
    assert result["content_changed"] == [str(top / "x.sh"), str(top / "y.conf")]
    # the parents it created got the same mode, like ansible.builtin.file
    assert mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == mode(top) == 0o750
    assert (top / "x.sh").read_text() == "#!/bin/sh\necho x\n" and mode(top / "x.sh") == 0o755
    assert mode(top / "y.conf") == 0o600, "a new file without a mode is private"
    assert not [p for p in os.listdir(top) if p.startswith(".")], "no temporary file left behind"

    status, again = run(args, monkeypatch)
    assert status == "ok" and not again["changed"] and again["changed_paths"] == []


def test_corrects_mode_without_rewriting_same_content(tmp_path, monkeypatch):
    target = tmp_path / "unit.service"
    target.write_text("[Unit]\n")
    os.chmod(target, 0o600)
    inode = os.stat(target).st_ino
    status, result = run({"files": [{"path": str(target), "content": "[Unit]\n", "mode": "0644"}]},
                         monkeypatch, diff=True)
    assert status == "ok" and result["changed_paths"] == [str(target)] and result["content_changed"] == []
    assert mode(target) == 0o644 and os.stat(target).st_ino == inode
    assert result["diff"] == [{"before": {"path": str(target), "mode": "0600"},
                               "after": {"path": str(target), "mode": "0644"}}]


def test_changed_content_is_replaced_atomically_keeping_the_mode(tmp_path, monkeypatch):
    target = tmp_path / "env"
    target.write_text("OLD=1\n")
    os.chmod(target, 0o640)
    inode = os.stat(target).st_ino
    status, result = run({"files": [{"path": str(target), "content": "NEW=2\n"}]}, monkeypatch, diff=True)
    assert status == "ok" and result["content_changed"] == [str(target)]
    assert target.read_text() == "NEW=2\n" and mode(target) == 0o640
    assert os.stat(target).st_ino != inode, "a new inode: the old file was replaced, not truncated"
    assert result["diff"][0]["before"] == "OLD=1\n" and result["diff"][0]["after"] == "NEW=2\n"


def test_show_content_false_keeps_secrets_out_of_the_diff(tmp_path, monkeypatch):
    target = tmp_path / "secret.env"
    target.write_text("TOKEN=old-secret\n")
    status, result = run({"files": [{"path": str(target), "content": "TOKEN=new-secret\n", "mode": "0600"}],
                          "show_content": False}, monkeypatch, diff=True)
    assert status == "ok" and target.read_text() == "TOKEN=new-secret\n"
    assert "secret" not in repr(result["diff"]).replace("secret.env", "")


def test_check_mode_reports_and_changes_nothing(tmp_path, monkeypatch):
    existing = tmp_path / "keep.txt"
    existing.write_text("same\n")
    os.chmod(existing, 0o600)
    args = {
        "directories": [{"path": str(tmp_path / "new" / "dir"), "mode": "0755"}],
        "files": [
            {"path": str(existing), "content": "other\n", "mode": "0644"},
            {"path": str(tmp_path / "new" / "dir" / "f"), "content": "f\n"},
            # an owner created later in the same run does not fail check mode
            {"path": str(tmp_path / "owned"), "content": "", "owner": "no-such-user-inferops"},
        ],
    }
    status, result = run(args, monkeypatch, check=True, diff=True)
    assert status == "ok", result
    assert result["changed_paths"] == [str(tmp_path / "new" / "dir"), str(existing),
                                       str(tmp_path / "new" / "dir" / "f"), str(tmp_path / "owned")]
    assert not (tmp_path / "new").exists() and not (tmp_path / "owned").exists()
    assert existing.read_text() == "same\n" and mode(existing) == 0o600


def test_validate_failure_leaves_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "unit.service"
    target.write_text("good\n")
    status, result = run({"files": [{"path": str(target), "content": "bad\n",
                                     "validate": "/bin/grep -q good %s"}]}, monkeypatch)
    assert status == "fail" and "failed validation" in result["msg"] and str(target) in result["msg"]
    assert target.read_text() == "good\n"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")], "temporary file removed"

    status, result = run({"files": [{"path": str(target), "content": "still good\n",
                                     "validate": "/bin/grep -q good %s"}]}, monkeypatch)
    assert status == "ok" and target.read_text() == "still good\n"


@pytest.mark.parametrize("args, message", [
    ({"files": [{"path": "relative/file", "content": ""}]}, "not an absolute path"),
    ({"files": [{"path": "/tmp", "content": ""}]}, "not a regular file"),
    ({"files": [{"path": "/nonexistent-inferops/x", "content": ""}]}, "does not exist"),
    ({"directories": [{"path": "/etc/hostname"}]}, "not a directory"),
    ({"files": [{"path": "/tmp/inferops-host-files-v", "content": "", "validate": "true"}]}, "must contain %s"),
])
def test_refuses_bad_input_with_the_path_named(args, message, monkeypatch):
    status, result = run(args, monkeypatch)
    assert status == "fail" and message in result["msg"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.text(st.characters(blacklist_categories=["Cs"]), max_size=300))
def test_any_text_round_trips_and_the_second_call_is_a_no_op(content, tmp_path, monkeypatch):
    target = tmp_path / "f"
    if target.exists():
        target.unlink()
    args = {"files": [{"path": str(target), "content": content, "mode": "0644"}]}
    status, first = run(args, monkeypatch)
    assert status == "ok" and first["changed"]
    assert target.read_bytes() == content.encode("utf-8")
    status, second = run(args, monkeypatch)
    assert status == "ok" and not second["changed"]
