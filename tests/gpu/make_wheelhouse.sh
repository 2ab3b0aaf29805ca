#!/usr/bin/env bash
# Apache License 2.0 (see LICENSE)
# Download ansible-core and its dependencies as wheels for CPython 3.12 on x86-64 Linux into
# .cache/device-wheels (or $1), for tests/gpu/device_check.sh on a GPU machine without network.
#
#   tests/gpu/make_wheelhouse.sh [DEST]
#
# Uses the project venv's pip (any pip works: PIP="python3 -m pip"). The wheels are about 10 MB.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=${1:-$ROOT/.cache/device-wheels}
PIP=${PIP:-$ROOT/.venv/bin/python -m pip}
ANSIBLE_CORE=${ANSIBLE_CORE:-ansible-core==2.21.5}
mkdir -p "$DEST"
# shellcheck disable=SC2086  # PIP is a command line
$PIP download --quiet --disable-pip-version-check --dest "$DEST" \
  --only-binary=:all: --implementation cp --python-version 3.12 \
  --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "$ANSIBLE_CORE"
echo "wheels in $DEST:"
ls -1 "$DEST"
du -sh "$DEST" | cut -f1
