"""Helpers for the hf_snapshot tests: a generated tiny Llama published on a loopback Hub (fixtures are
re-exported by conftest.py), and runners that execute the module in-process (AnsibleModule test
pattern), as a plain subprocess, or through real ``ansible`` with ANSIBLE_COLLECTIONS_PATH=.build."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BUILD = os.path.join(ROOT, ".build")
sys.path.insert(0, os.path.join(ROOT, "tests", "hubserver"))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))

from hubserver import HubServer, ServerConfig, publish_repo  # noqa: E402
from make_tiny_model import make_model  # noqa: E402

GOOD_TOKEN = "hf_inferopsTestTokenGood0123456789abcdef"
DENIED_TOKEN = "hf_inferopsTestTokenDenied0123456789abcd"
BULK_MIB = 16
PY = sys.executable


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Repos:
    """What was published: source dirs and commit shas."""

    def __init__(self, root, src_tiny, src_bulk):
        self.root = root
        self.src_tiny = src_tiny
        self.src_bulk = src_bulk
        self.sha = {}


@pytest.fixture(scope="session")
def repos(tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    src_tiny = str(base / "src-tiny")
    make_model(src_tiny, seed=0)
    # Files the default patterns must skip: Meta-style originals, remote code.
    os.makedirs(os.path.join(src_tiny, "original"))
    with open(os.path.join(src_tiny, "original", "consolidated.00.pth"), "wb") as f:
        f.write(os.urandom(4096))
    with open(os.path.join(src_tiny, "original", "params.json"), "w") as f:
        f.write('{"dim": 128}\n')
    with open(os.path.join(src_tiny, "modeling_tiny.py"), "w") as f:
        f.write("# remote code\n")
    src_bulk = str(base / "src-bulk")
    make_model(src_bulk, seed=1, bulk_shards=1, bulk_shard_mib=BULK_MIB)
    root = str(base / "root")
    r = Repos(root, src_tiny, src_bulk)
    r.sha["acme/tiny"] = publish_repo(src_tiny, root, "acme/tiny", refs=("main", "v1.0"))
    r.sha["acme/bulk"] = publish_repo(src_bulk, root, "acme/bulk")
    r.sha["acme/gated"] = publish_repo(src_tiny, root, "acme/gated",
                                       access={"gated": True, "tokens": [GOOD_TOKEN], "denied_tokens": [DENIED_TOKEN]})
    r.sha["acme/private"] = publish_repo(src_tiny, root, "acme/private",
                                         access={"private": True, "tokens": [GOOD_TOKEN]})
    return r


@pytest.fixture(scope="session")
def server(repos):
    srv = HubServer(repos.root).start()
    yield srv
    srv.stop()


@pytest.fixture
def hub(server):
    """The running server with clean counters and no faults."""
    server.config = ServerConfig()
    server.reset_stats()
    yield server
    server.config = ServerConfig()


def base_params(hub, repos, dest, repo="acme/tiny", **kw):
    p = {"repo_id": repo, "revision": repos.sha.get(repo, "0" * 40), "dest": str(dest),
         "endpoint": hub.endpoint, "retries": 1, "retry_backoff": 0.05, "disk_margin_mib": 1}
    p.update(kw)
    return p


def run_inproc(params, check_mode=False):
    """The module's main() with AnsibleModule's test pattern; returns the parsed result."""
    from ansible.module_utils.testing import patch_module_args
    from ansible_collections.inferops.vllm.plugins.modules import hf_snapshot

    args = dict(params)
    if check_mode:
        args["_ansible_check_mode"] = True
    buf = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(buf):
        with pytest.raises(SystemExit):
            hf_snapshot.main()
    return json.loads(buf.getvalue())


def module_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = BUILD
    env.update(extra)
    return env


def start_subprocess(params, tmp_path):
    """The module as its own process (args file), in its own session so a test can kill it."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    module = os.path.join(ROOT, "plugins", "modules", "hf_snapshot.py")
    return subprocess.Popen([PY, module, str(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=module_env(), start_new_session=True, text=True)


def ansible_env(tmp_path, pipelining=True):
    home = tmp_path / "ansible-home"
    home.mkdir(exist_ok=True)
    return module_env(
        ANSIBLE_COLLECTIONS_PATH=BUILD,
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "local-tmp"),
        ANSIBLE_REMOTE_TEMP=str(home / "remote-tmp"),
        ANSIBLE_ASYNC_DIR=str(home / "async"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.minimal",
        ANSIBLE_PIPELINING="1" if pipelining else "0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_HOST_KEY_CHECKING="0",
        ANSIBLE_PYTHON_INTERPRETER=PY,
    )


def ansible_command(params, tmp_path, interpreter=PY, check_mode=False):
    """`ansible localhost -m inferops.vllm.hf_snapshot`; every option comes from a vars file, so the
    token is on no command line (the controller's included)."""
    vars_file = tmp_path / "vars.json"
    vars_file.write_text(json.dumps({"snap": params, "ansible_python_interpreter": interpreter}))
    cmd = [os.path.join(os.path.dirname(PY), "ansible"), "localhost", "-i", "localhost,", "-c", "local",
           "-m", "inferops.vllm.hf_snapshot", "-a", json.dumps({k: "{{ snap.%s }}" % k for k in params}),
           "-e", "@" + str(vars_file)]
    if check_mode:
        cmd.append("--check")
    return cmd


def parse_ansible(stdout: str) -> dict:
    """The result from the minimal callback: `localhost | CHANGED => {...}`."""
    head, sep, body = stdout.partition(" => ")
    if not sep:
        raise AssertionError("no result in ansible output: %r" % stdout[-2000:])
    res = json.loads(body[:body.rindex("}") + 1])
    if "FAILED!" in head.splitlines()[-1]:  # the callback moves `failed` into the header
        res["failed"] = True
    return res


def run_ansible(params, tmp_path, **kw):
    env = ansible_env(tmp_path)
    proc = subprocess.run(ansible_command(params, tmp_path, **kw), capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    return parse_ansible(proc.stdout), proc


def tree_files(top):
    out = {}
    for root, _dirs, names in os.walk(top):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, top)] = p
    return out


def copytree(src, dst):
    shutil.copytree(src, dst, copy_function=shutil.copy2)
