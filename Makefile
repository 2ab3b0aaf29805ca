# inferops.vllm — one entry point for the demo, the tests and the toolchain.
#   make demo   run site.yml against a simulated GPU node in a local container
#   make test   yamllint, ansible-lint, ansible-test sanity, unit tests, every Molecule scenario
# Everything it needs is installed by the targets below; state lives in .venv/ and .cache/.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
ROOT := $(CURDIR)
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
PYTHON ?= $(shell $(ROOT)/tools/find-python.sh)
SCENARIOS ?= $(notdir $(patsubst %/molecule.yml,%,$(wildcard extensions/molecule/*/molecule.yml)))

# Podman is pointed at the project's own config and storage; nothing under /etc/containers changes.
export CONTAINERS_CONF := $(ROOT)/tools/testhost/containers.conf
export CONTAINERS_STORAGE_CONF := $(ROOT)/.cache/podman/storage.conf
export ANSIBLE_COLLECTIONS_PATH := $(ROOT)/.build:$(ROOT)/.cache/collections
export ANSIBLE_COLLECTIONS_SCAN_SYS_PATH := false
export ANSIBLE_NOCOLOR := $(if $(CI),1,)
export PATH := $(BIN):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv sysdeps podman collections image lint sanity units molecule test demo clean distclean build
help:
	@sed -n '1,4p' Makefile | sed 's/^# \{0,1\}//'

# ---------------------------------------------------------------- toolchain
$(VENV)/.stamp: requirements/dev.in requirements/constraints.txt tools/find-python.sh
	@echo "== venv: $(PYTHON) ($$($(PYTHON) --version))"
	@if $(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
	  [ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV); \
	  $(BIN)/pip install -q -r requirements/dev.in -c requirements/constraints.txt; \
	else \
	  echo "   Python < 3.12: falling back to the ansible-core 2.19 line (see README)"; \
	  [ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV); \
	  sed 's/^ansible-core==.*/ansible-core>=2.19,<2.20/' requirements/dev.in > $(VENV)/dev-fallback.in; \
	  $(BIN)/pip install -q -r $(VENV)/dev-fallback.in; \
	fi
	@touch $@
venv: $(VENV)/.stamp .build/ansible_collections/inferops/vllm

.build/ansible_collections/inferops/vllm:
	@mkdir -p $(dir $@) && ln -sfn ../../.. $@

# containers.podman (needed by Molecule's podman driver) ships inside the `ansible` wheel; Galaxy is
# not reachable, so extract just that collection from the wheel.
ANSIBLE_WHEEL_VERSION := 14.5.0
collections: .cache/collections/ansible_collections/containers/podman/MANIFEST.json
.cache/collections/ansible_collections/containers/podman/MANIFEST.json: $(VENV)/.stamp
	@mkdir -p .cache/dl .cache/collections
	@ls .cache/dl/ansible-$(ANSIBLE_WHEEL_VERSION)-*.whl >/dev/null 2>&1 || \
	  $(BIN)/pip download -q --no-deps --only-binary=:all: ansible==$(ANSIBLE_WHEEL_VERSION) -d .cache/dl
	@cd .cache/collections && $(BIN)/python -c "import zipfile,glob,sys; z=zipfile.ZipFile(glob.glob('../dl/ansible-$(ANSIBLE_WHEEL_VERSION)-*.whl')[0]); z.extractall('.', [n for n in z.namelist() if n.startswith('ansible_collections/containers/podman/')])"
	@touch $@

SYSDEPS := podman runc debootstrap shellcheck
sysdeps:
	@missing=""; for p in $(SYSDEPS); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	dpkg -s containernetworking-plugins >/dev/null 2>&1 || missing="$$missing containernetworking-plugins"; \
	if [ -n "$$missing" ]; then echo "== installing system packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $$missing containernetworking-plugins iptables uidmap conmon catatonit >/dev/null; fi

podman: sysdeps .cache/podman/storage.conf
.cache/podman/storage.conf: tools/testhost/storage.conf.in
	@mkdir -p .cache/podman && sed 's|@ROOT@|$(ROOT)|g' $< > $@

image: podman
	@tools/testhost/build-image.sh

# ---------------------------------------------------------------- checks
lint: venv collections
	@echo "== yamllint"; $(BIN)/yamllint --strict .
	@echo "== ansible-lint (production profile)"; $(BIN)/ansible-lint --profile production --offline
	@echo "== changelog fragments"; $(BIN)/antsibull-changelog lint

sanity: venv sysdeps
	@echo "== ansible-test sanity"; tools/sanity/run.sh

units: venv
	@echo "== pytest (unit + integration)"; $(BIN)/python -m pytest -q tests/unit tests/integration

molecule: venv collections image
	@mkdir -p .cache/uv .cache/pip-wheelhouse .cache/pip-weights
	@for s in $(SCENARIOS); do echo "== molecule test -s $$s"; \
	  start=$$(date +%s); $(BIN)/molecule test -s $$s; \
	  echo "   molecule $$s: $$(( $$(date +%s) - start )) s"; done

build: venv
	@$(BIN)/ansible-galaxy collection build --force --output-path .cache/dist

# make test: every stage, timed; stops at the first failing stage with its exit code
test:
	@tools/timed.sh venv "$(MAKE) -s venv collections" \
	  sysdeps "$(MAKE) -s sysdeps podman image" \
	  lint "$(MAKE) -s lint" \
	  sanity "$(MAKE) -s sanity" \
	  units "$(MAKE) -s units" \
	  build "$(MAKE) -s build" \
	  molecule "$(MAKE) -s molecule"

demo: venv collections image
	@tools/demo.sh

clean:
	@-podman ps -aq --filter label=inferops.testhost | xargs -r podman rm -f >/dev/null
	rm -rf .cache/sanity .cache/dist .pytest_cache .hypothesis reports
distclean: clean
	rm -rf .venv .cache .build
