"""Make the collection importable as ``ansible_collections.inferops.vllm`` for plain pytest.

The checkout itself is the collection root; a symlink under ``.build/`` gives it the
``ansible_collections/<namespace>/<name>`` path that Ansible's import machinery expects.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# INFEROPS_TEST_COLLECTIONS: test a collection installed elsewhere (make check-artifact points it at
# the copy installed from the built tarball) instead of the checkout
INSTALLED = os.environ.get("INFEROPS_TEST_COLLECTIONS")
BUILD = os.path.abspath(INSTALLED) if INSTALLED else os.path.join(ROOT, ".build")
LINK = os.path.join(BUILD, "ansible_collections", "inferops", "vllm")

if not INSTALLED and not os.path.islink(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(os.path.relpath(ROOT, os.path.dirname(LINK)), LINK)
if BUILD not in sys.path:
    sys.path.insert(0, BUILD)
if INSTALLED:
    # the properties ran in full on the checkout (make units); here they show the shipped copy works
    from hypothesis import settings as _settings

    _settings.register_profile("installed-copy", max_examples=25, deadline=None)
    _settings.load_profile("installed-copy")
    import ansible_collections.inferops.vllm.plugins as _plugins  # noqa: E402

    if not os.path.realpath(_plugins.__path__[0]).startswith(os.path.realpath(LINK) + os.sep):
        raise RuntimeError(f"inferops.vllm imported from {_plugins.__path__[0]}, not from {LINK}")

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
