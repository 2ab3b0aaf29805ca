#!/usr/bin/env bash
# ansible-test sanity on the collection, offline-safe.
# ansible-test wants the collection at .../ansible_collections/inferops/vllm inside a git work
# tree: we copy the files git would ship (tracked + untracked, not ignored) to .cache/sanity/ and
# commit them there. HOME points into .cache so its pip bootstrap cache (filled with our
# stand-in, see get_pip_standin.py) stays inside the project.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$root/.cache/sanity
dest=$work/ansible_collections/inferops/vllm
export HOME=$work/home
pip_version=$("$root/.venv/bin/python" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import PythonConfig
import sys
class P:  # only .version is read
    version = "%d.%d" % sys.version_info[:2]
print(get_venv_packages(P())["pip"])
PY
)
mkdir -p "$HOME/.ansible/test/cache"
cp "$root/tools/sanity/get_pip_standin.py" "$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
rm -rf "$dest" && mkdir -p "$dest"
(cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$dest" -xf -
cd "$dest"
git init -q && git add -A && git -c user.name=sanity -c user.email=sanity@localhost commit -qm sanity
py=$("$root/.venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
exec "$root/.venv/bin/ansible-test" sanity --color no --python "$py" --requirements "$@"
