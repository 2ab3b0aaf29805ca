"""Run the GPU modules' main() against canned nvidia-smi outputs (the AnsibleModule unit-test pattern).

A case names, per kind of nvidia-smi call the module makes, the response: a fixture file under
tests/fixtures/nvidia-smi/ (with its exit code from that directory's commands.tsv) or inline text.
``run_command`` is patched to answer by kind: ``query_gpu`` (``--query-gpu=...``), ``apps``
(``--query-compute-apps=...``), ``topo`` (``topo -m``), ``version`` (``--version``) and ``plain``
(no arguments). A list of responses is served in order (one per call; the last one repeats), for
retries and for polling.

A response may be ``{capture: <file>, add_header: true}`` for the real noheader,nounits captures:
the header that ``--format=csv,nounits`` prints for the captured command (its fields from
commands.tsv, ``[MiB]`` on memory columns) is put in front, so the module (which asks with a
header) can be fed real values.
"""
import csv
import json
import os

import yaml
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.inferops.vllm.plugins.module_utils import nvidia_smi

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "nvidia-smi")
DATA = os.path.join(ROOT, "tests", "unit", "data")
SMI = "/usr/bin/nvidia-smi"

_MIB_HEADERS = {"memory.total", "memory.used", "memory.free", "memory.reserved"}


class AnsibleExitJson(Exception):
    pass


class AnsibleFailJson(Exception):
    pass


def load_cases(name):
    with open(os.path.join(DATA, name)) as handle:
        return yaml.safe_load(handle)


def commands_tsv(directory):
    with open(os.path.join(FIXTURES, directory, "commands.tsv")) as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    return dict((r[0], (int(r[1]), r[2])) for r in rows[1:])


def header_for(command):
    """The header nvidia-smi --format=csv,nounits prints for a --query-* command."""
    for arg in command.split():
        if arg.startswith("--query-gpu=") or arg.startswith("--query-compute-apps="):
            fields = arg.split("=", 1)[1].split(",")
            cells = []
            for f in fields:
                if f in _MIB_HEADERS:
                    cells.append(f + " [MiB]")
                elif f == "used_memory":
                    cells.append("used_gpu_memory [MiB]")
                else:
                    cells.append(f)
            return ", ".join(cells)
    raise ValueError("no --query-* in %r" % command)


def response(spec):
    """A case's response spec -> (rc, out, err)."""
    if isinstance(spec, str):
        spec = {"file": spec}
    if "text" in spec:
        return spec.get("rc", 0), spec["text"], spec.get("err", "")
    rel = spec.get("file") or spec["capture"]
    directory, name = os.path.split(rel)
    rc, command = commands_tsv(directory)[name]
    with open(os.path.join(FIXTURES, rel)) as handle:
        out = handle.read()
    if spec.get("add_header"):
        out = header_for(command) + "\n" + out
    return spec.get("rc", rc), out, spec.get("err", "")


def command_kind(cmd):
    args = cmd[1:]
    if not args:
        return "plain"
    if args[0].startswith("--query-gpu="):
        return "query_gpu"
    if args[0].startswith("--query-compute-apps="):
        return "apps"
    if args == ["topo", "-m"]:
        return "topo"
    if args == ["--version"]:
        return "version"
    raise AssertionError("unexpected nvidia-smi call %r" % (cmd,))


def build_tree(root, files):
    """Write {relative path: content} under root; returns root."""
    for rel, content in (files or {}).items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(str(content))
    return root


def sysfs_files(sysfs):
    """{bus id as sysfs names it: {numa_node: n, local_cpulist: "0-31"}} -> file map."""
    files = {}
    for bus, attrs in (sysfs or {}).items():
        for attr, value in attrs.items():
            files["bus/pci/devices/%s/%s" % (bus, attr)] = "%s\n" % value
    return files


def proc_files(proc):
    return dict(("%s/cgroup" % pid, text) for pid, text in (proc or {}).items())


class Runner(object):
    """Patches AnsibleModule and answers nvidia-smi calls from a case's responses."""

    def __init__(self, monkeypatch, tmp_path, responses, sysfs=None, proc=None, binary=SMI):
        self.responses = dict((k, v if isinstance(v, list) else [v]) for k, v in (responses or {}).items())
        self.used = dict((k, 0) for k in self.responses)
        self.calls = []
        self.clock = [0.0]
        self.sleeps = []
        self.warnings = []
        sys_root = build_tree(str(tmp_path / "sys"), sysfs_files(sysfs))
        proc_root = build_tree(str(tmp_path / "proc"), proc_files(proc))
        monkeypatch.setattr(nvidia_smi, "SYSFS_ROOT", sys_root)
        monkeypatch.setattr(nvidia_smi, "PROC_ROOT", proc_root)
        monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
        monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)
        monkeypatch.setattr(basic.AnsibleModule, "run_command", self._run_command)
        monkeypatch.setattr(basic.AnsibleModule, "warn", lambda _self, text: self.warnings.append(text))
        monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                            lambda _self, name, required=False, opt_dirs=None: binary)

    def _run_command(self, cmd, environ_update=None, **_kwargs):
        kind = command_kind(cmd)
        self.calls.append({"cmd": list(cmd), "kind": kind, "env": dict(environ_update or {})})
        if kind not in self.responses:
            raise AssertionError("case has no response for %s call %r" % (kind, cmd))
        seq = self.responses[kind]
        i = min(self.used[kind], len(seq) - 1)
        self.used[kind] += 1
        return response(seq[i])

    def fake_time(self, module, monkeypatch):
        """Replace the module's clock and sleep so polling takes no real time."""
        monkeypatch.setattr(module, "_now", lambda: self.clock[0])

        def sleep(seconds):
            self.sleeps.append(seconds)
            self.clock[0] += seconds
        monkeypatch.setattr(module, "_sleep", sleep)

    def run(self, main, args):
        with patch_module_args(args):
            try:
                main()
            except AnsibleExitJson as exc:
                return "exit", exc.args[0]
            except AnsibleFailJson as exc:
                return "fail", exc.args[0]
        raise AssertionError("module returned without exit_json/fail_json")


def run_main(main, args, monkeypatch, check=False):
    """Run a module's main() with args (in check mode with ``check``); returns ("ok", result) or ("fail", result)."""
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail_json)
    with patch_module_args(dict(args, _ansible_check_mode=check) if check else args):
        try:
            main()
        except AnsibleExitJson as exc:
            return "ok", exc.args[0]
        except AnsibleFailJson as exc:
            return "fail", exc.args[0]
    raise AssertionError("main() returned without exit_json/fail_json")


def _exit_json(_self, **kwargs):
    kwargs.setdefault("changed", False)
    raise AnsibleExitJson(json.loads(json.dumps(kwargs)))


def _fail_json(_self, msg, **kwargs):
    kwargs["failed"] = True
    kwargs["msg"] = msg
    # run_command passes the OSError itself as ``exception``: keep it readable
    raise AnsibleFailJson(json.loads(json.dumps(kwargs, default=str)))


def expand_cpus(text):
    """Test-side expansion of a CPU list like "0-3,8" (independent of the parser)."""
    if text == "":
        return []
    out = []
    for part in str(text).split(","):
        lo, _sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def assert_subset(expected, actual, path="result"):
    """Every key/value of expected is in actual; lists given as {index: subset} check elements."""
    if isinstance(expected, dict) and isinstance(actual, list):
        for key, sub in expected.items():
            assert int(key) < len(actual), "%s[%s] missing (len %d)" % (path, key, len(actual))
            assert_subset(sub, actual[int(key)], "%s[%s]" % (path, key))
    elif isinstance(expected, dict):
        assert isinstance(actual, dict), "%s: expected a dict, got %r" % (path, actual)
        for key, sub in expected.items():
            assert key in actual, "%s: missing key %r (has %s)" % (path, key, sorted(actual))
            assert_subset(sub, actual[key], "%s.%s" % (path, key))
    else:
        assert expected == actual, "%s: expected %r, got %r" % (path, expected, actual)
