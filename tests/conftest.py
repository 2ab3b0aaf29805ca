"""Make the collection importable as ``ansible_collections.inferops.vllm`` for plain pytest.

The checkout itself is the collection root; a symlink under ``.build/`` gives it the
``ansible_collections/<namespace>/<name>`` path that Ansible's import machinery expects.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, ".build")
LINK = os.path.join(BUILD, "ansible_collections", "inferops", "vllm")

if not os.path.islink(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(os.path.relpath(ROOT, os.path.dirname(LINK)), LINK)
if BUILD not in sys.path:
    sys.path.insert(0, BUILD)

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
