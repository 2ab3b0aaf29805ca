"""tools/role_readme.py: READMEs follow the specs, the hand-written part survives, --check catches drift."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("antsibull_docs_parser")  # the project venv has it (antsibull-changelog); core-oldest does not

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TOOL = os.path.join(ROOT, "tools", "role_readme.py")
spec = importlib.util.spec_from_file_location("role_readme", TOOL)
role_readme = importlib.util.module_from_spec(spec)
spec.loader.exec_module(role_readme)


@pytest.fixture
def tree(tmp_path):
    """A copy of the tool and of one role, so the tool can rewrite it."""
    shutil.copytree(os.path.join(ROOT, "roles", "vllm_verify"), tmp_path / "roles" / "vllm_verify")
    (tmp_path / "tools").mkdir()
    shutil.copy(TOOL, tmp_path / "tools" / "role_readme.py")
    return tmp_path


def run(tree, *args):
    return subprocess.run([sys.executable, str(tree / "tools" / "role_readme.py"), *args],
                          capture_output=True, text=True, check=False)


def test_committed_readmes_are_up_to_date():
    assert subprocess.run([sys.executable, TOOL, "--check"], capture_output=True, text=True, check=False).returncode == 0


def test_spec_change_fails_check_and_regenerates_keeping_the_hand_written_part(tree):
    readme = tree / "roles" / "vllm_verify" / "README.md"
    hand = readme.read_text().split(role_readme.BEGIN)[1].split(role_readme.END)[0]
    specs = tree / "roles" / "vllm_verify" / "meta" / "argument_specs.yml"
    specs.write_text(specs.read_text().replace("options:", "options:\n      vllm_verify_new_option:\n"
                                               "        type: int\n        default: 7\n"
                                               "        description: A new O(vllm_verify_new_option) C(a|b).", 1))
    checked = run(tree, "--check")
    assert checked.returncode == 1 and "out of date" in checked.stdout
    assert run(tree).returncode == 0
    text = readme.read_text()
    assert "| `vllm_verify_new_option` | int | `7` | A new `vllm_verify_new_option` `a\\|b`. |" in text
    assert text.split(role_readme.BEGIN)[1].split(role_readme.END)[0] == hand
    assert run(tree, "--check").returncode == 0


def test_readme_without_markers_gets_a_stub(tree):
    readme = tree / "roles" / "vllm_verify" / "README.md"
    readme.unlink()
    assert run(tree).returncode == 0
    assert role_readme.STUB in readme.read_text()


def test_markup():
    assert role_readme.markup(["C(x) and I(y)", "L(text,https://e.x) U(https://u.x)"]) == \
        "`x` and *y*<br>[text](https://e.x) <https://u.x>"
    assert role_readme.markup("C(vllm_service_models_dir)C(/<org>)") == "`vllm_service_models_dir/<org>`"
    assert role_readme.fmt_default("") == '`""`'
    assert role_readme.fmt_default({"a": 1}) == '`{"a": 1}`'
