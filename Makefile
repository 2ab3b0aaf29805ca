# inferops.vllm — one entry point for the demo, the tests and the toolchain.
#   make demo   run site.yml against a simulated GPU node in a local container
#   make test   yamllint, ansible-lint, ansible-test sanity, unit tests (also on the oldest ansible-core),
#               the built tarball (galaxy-importer, installed and checked, docs lint, EE context), Molecule
#   make docs   HTML docs site (antsibull-docs) in .cache/docsite/build/html
#   make role-readmes   regenerate roles/*/README.md from meta/argument_specs.yml
#   make release        after merging: antsibull-changelog release (CHANGELOG.md) for galaxy.yml's version
# Everything it needs is installed by the targets below; state lives in .venv/ and .cache/.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
ROOT := $(CURDIR)
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
PYTHON ?= $(shell $(ROOT)/tools/find-python.sh)
VERSION := $(shell sed -n 's/^version: *//p' galaxy.yml)
TARBALL := $(ROOT)/.cache/dist/inferops-vllm-$(VERSION).tar.gz
# the collection as installed from the built tarball: Molecule and the demo run this copy
INSTALLED := $(ROOT)/.cache/installed
TOOLS := $(ROOT)/.cache/tools
SCENARIOS ?= $(notdir $(patsubst %/molecule.yml,%,$(wildcard extensions/molecule/*/molecule.yml)))

# Podman is pointed at the project's own config and storage; nothing under /etc/containers changes.
export CONTAINERS_CONF := $(ROOT)/tools/testhost/containers.conf
export CONTAINERS_STORAGE_CONF := $(ROOT)/.cache/podman/storage.conf
export ANSIBLE_COLLECTIONS_PATH := $(ROOT)/.build:$(ROOT)/.cache/collections
export ANSIBLE_COLLECTIONS_SCAN_SYS_PATH := false
export ANSIBLE_NOCOLOR := $(if $(CI),1,)
export PATH := $(BIN):$(PATH)
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv sysdeps podman collections image lint sanity units molecule test demo clean distclean build \
  role-readmes units-oldest install-artifact test-checks test-light check-artifact importer docs-lint docs ee-context release
help:
	@sed -n '1,9p' Makefile | sed 's/^# \{0,1\}//'

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

# Tools with their own venv, each from a full pip freeze in requirements/<name>.txt: importer
# (galaxy-importer, ansible-builder), docs (antsibull-docs, Sphinx), core-oldest (the oldest
# ansible-core meta/runtime.yml allows, with pytest and hypothesis for the unit tests).
$(TOOLS)/%/.stamp: requirements/%.txt tools/find-python.sh
	@echo "== tool venv $*: $(PYTHON) ($$($(PYTHON) --version))"
	@rm -rf $(TOOLS)/$* && $(PYTHON) -m venv $(TOOLS)/$*
	@$(TOOLS)/$*/bin/pip install -q -r $<
	@touch $@

SYSDEPS := podman runc debootstrap shellcheck prometheus haproxy
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
	@echo "== role READMEs match meta/argument_specs.yml"; $(BIN)/python tools/role_readme.py --check --strict-defaults
	@echo "== argument specs and docs tables match the inventory schema"; $(BIN)/python tools/schema_docs.py --check

role-readmes: venv
	@$(BIN)/python tools/role_readme.py

sanity: venv sysdeps
	@echo "== ansible-test sanity"; tools/sanity/run.sh

units: venv
	@echo "== pytest (unit + integration)"; $(BIN)/python -m pytest -q tests/unit tests/integration

# The unit tests on the oldest ansible-core that meta/runtime.yml allows (README: supported versions)
# what runs through Ansible (filters, modules, templates, roles); not the pure-Python parsers of module_utils, the GPU
# simulator, or the tests of HAProxy's and promtool's own behaviour, which no ansible-core version changes (make units
# runs them; about 60 s of this lane's 140 s)
OLDEST_IGNORE := tests/unit/gpusim tests/unit/plugins/module_utils tests/unit/roles/test_frontdoor_edge.py \
  tests/unit/roles/test_prometheus_rules.py
units-oldest: $(TOOLS)/core-oldest/.stamp venv
	@echo "== pytest tests/unit on ansible-core $$($(TOOLS)/core-oldest/bin/python -c 'from ansible.release import __version__ as v; print(v)') (not $(OLDEST_IGNORE))"
	@$(TOOLS)/core-oldest/bin/python -m pytest -q -p no:cacheprovider tests/unit $(addprefix --ignore=,$(OLDEST_IGNORE))

# Molecule and the demo run the collection installed from the built tarball, not the checkout
molecule demo: export ANSIBLE_COLLECTIONS_PATH := $(INSTALLED):$(ROOT)/.cache/collections
# Each scenario's output is also kept in .cache/logs/molecule-NAME.log; when one fails, its failing lines go to
# .cache/logs/molecule-NAME.failed, which tools/timed.sh prints after the stage timings (CI shows only the tail).
molecule: venv collections image install-artifact
	@mkdir -p .cache/uv .cache/pip-wheelhouse .cache/pip-weights .cache/logs
	@for s in $(SCENARIOS); do echo "== molecule test -s $$s"; rm -f .cache/logs/molecule-$$s.failed; \
	  start=$$(date +%s); rc=0; $(BIN)/molecule test -s $$s 2>&1 | tee .cache/logs/molecule-$$s.log || rc=$$?; \
	  echo "   molecule $$s: $$(( $$(date +%s) - start )) s"; \
	  if [ $$rc -ne 0 ]; then tools/failing-lines.sh .cache/logs/molecule-$$s.log "molecule $$s" \
	    > .cache/logs/molecule-$$s.failed; exit $$rc; fi; done

# The tarball is rebuilt when a file it may contain changed (what git would ship: tracked and
# untracked, not ignored), so the stages below share one build and one install.
# KEEP_ARTIFACT=1 (make test's lanes): build the tarball only when it is missing, so no lane rebuilds it
# while another one reads it.
COLLECTION_FILES := $(if $(KEEP_ARTIFACT),,$(wildcard $(shell git ls-files -co --exclude-standard 2>/dev/null | grep -v ' ' || find . -path ./.cache -prune -o -path ./.venv -prune -o -type f -print)))
build: $(TARBALL)
$(TARBALL): $(COLLECTION_FILES) | $(VENV)/.stamp
	@rm -f .cache/dist/*.tar.gz
	@$(BIN)/ansible-galaxy collection build --force --output-path .cache/dist

# Install the tarball the way a user does, into an empty collections path (.cache/installed)
install-artifact: $(INSTALLED)/.stamp
$(INSTALLED)/.stamp: $(TARBALL)
	@echo "== ansible-galaxy collection install $(notdir $(TARBALL)) -p .cache/installed"
	@rm -rf $(INSTALLED) && ANSIBLE_COLLECTIONS_PATH=$(INSTALLED) $(BIN)/ansible-galaxy collection install \
	  --offline -p $(INSTALLED) $(TARBALL) | tail -n 1
	@touch $@
check-artifact: install-artifact
	@echo "== the installed copy: ansible-doc, playbook syntax, files the roles read"
	@tools/release/check-artifact.sh $(INSTALLED) inventories/demo
	@echo "== pytest tests/unit/plugins on the installed copy"
	@INFEROPS_TEST_COLLECTIONS=$(INSTALLED) ANSIBLE_COLLECTIONS_PATH=$(INSTALLED) \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests/unit/plugins

# galaxy-importer, as Galaxy and Automation Hub run it on upload (ansible-lint on): no error, no warning
importer: $(TARBALL) $(TOOLS)/importer/.stamp
	@echo "== galaxy-importer $(notdir $(TARBALL))"
	@rm -rf .cache/importer-out && mkdir -p .cache/importer-out
	@cd .cache/importer-out && PATH=$(TOOLS)/importer/bin:$$PATH ANSIBLE_COLLECTIONS_PATH= \
	  GALAXY_IMPORTER_CONFIG=$(ROOT)/tools/release/galaxy-importer.cfg \
	  $(TOOLS)/importer/bin/python -m galaxy_importer.main $(TARBALL) 2>&1 | grep -v '^Loading ' | tee log.txt
	@! grep -E '^(WARNING|ERROR)' .cache/importer-out/log.txt
	@grep -q '^Importer processing completed successfully' .cache/importer-out/log.txt

# antsibull-docs' collection docs lint (plugin docs, role argument specs, references) on the tarball's
# files, extracted outside this git work tree (inside it, antsibull-docs copies only files git tracks,
# so it would see no plugin at all under the ignored .cache/)
docs-lint: $(TARBALL) $(TOOLS)/docs/.stamp
	@echo "== antsibull-docs lint-collection-docs --plugin-docs"
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && coll=$$tmp/ansible_collections/inferops/vllm && mkdir -p $$coll && \
	  tar -xzf $(TARBALL) -C $$coll && cd $$coll && PATH=$(TOOLS)/docs/bin:$$PATH ANSIBLE_COLLECTIONS_PATH=$$tmp \
	  antsibull-docs lint-collection-docs --plugin-docs --validate-collection-refs all --disallow-unknown-collection-refs .
	@echo "   no problems"

# Static HTML docs site of the installed copy. antsibull-docs fails on any error; Sphinx fails on any
# warning except those of being offline (intersphinx inventories of docs.python.org and
# docs.ansible.com unreachable, so links to ansible.builtin and Ansible's own pages stay unresolved).
DOCS_OFFLINE_WARNINGS := failed to reach any of the inventories|undefined label: .(ansible_collections\.ansible\.builtin\.|common_return_values|ansible_configuration_settings)
docs: install-artifact $(TOOLS)/docs/.stamp
	@rm -rf .cache/docsite && mkdir -p .cache/docsite
	@PATH=$(TOOLS)/docs/bin:$$PATH ANSIBLE_COLLECTIONS_PATH=$(INSTALLED) antsibull-docs sphinx-init --use-current \
	  --fail-on-error --dest-dir .cache/docsite inferops.vllm >/dev/null
	@sed -i 's/ -W --keep-going$$//' .cache/docsite/build.sh
	@PATH=$(TOOLS)/docs/bin:$$PATH ANSIBLE_COLLECTIONS_PATH=$(INSTALLED) .cache/docsite/build.sh > .cache/docsite/build.log 2>&1 \
	  || { tail -n 30 .cache/docsite/build.log; exit 1; }
	@if grep 'WARNING' .cache/docsite/build.log | grep -vE "$(DOCS_OFFLINE_WARNINGS)"; then \
	  echo "docs: Sphinx warnings above (.cache/docsite/build.log)"; exit 1; fi
	@grep -E '^build (succeeded|finished)' .cache/docsite/build.log
	@echo "   docs site: .cache/docsite/build/html/index.html"

# Build context of an execution environment with the collection from the tarball (ansible-builder
# create writes the context only; no image is built): the collection's meta/execution-environment.yml
# is read by ansible-builder introspect, the same step the image build runs
ee-context: install-artifact $(TOOLS)/importer/.stamp
	@echo "== ansible-builder introspect + create"
	@$(TOOLS)/importer/bin/ansible-builder introspect --sanitize $(INSTALLED)
	@rm -rf .cache/ee && mkdir -p .cache/ee && cp tools/release/execution-environment.yml tools/release/ee-requirements.yml .cache/ee/
	@cp $(TARBALL) .cache/ee/inferops-vllm.tar.gz
	@cd .cache/ee && $(TOOLS)/importer/bin/ansible-builder create --file execution-environment.yml --context context >/dev/null
	@test -s .cache/ee/context/Containerfile && ls .cache/ee/context/_build
	@echo "   EE build context: .cache/ee/context"

# After merging (consumes changelogs/fragments/): the release notes for galaxy.yml's version
release: venv
	@$(BIN)/antsibull-changelog release --version $(VERSION)
	@$(BIN)/antsibull-changelog lint
	@echo "release $(VERSION): commit changelogs/ and CHANGELOG.md, then make build"

# make test: every stage, timed; stops at the first failing stage with its exit code. The static checks
# and the unit tests (also on the oldest ansible-core) run beside the Molecule scenarios that serve no
# long-lived vLLM (two lanes, each keeping about one core busy; measured at stop 34, units-old still in the
# second lane: 478 s + its tail and 792 s side by side, hence units-old moved to the first); the scenarios
# that serve with vLLM, whose tests measure latency, throughput and seconds to heal, run after them with the
# machine to themselves. Every lane uses the tarball built
# first, and none rebuilds it (KEEP_ARTIFACT) while another reads it.
LIGHT_SCENARIOS := default gpu_footprint vllm_weights vllm_install
# the light scenarios' lane: all but gpu_footprint, which ends the checks lane (stop 50: checks 869 s, light 965 s;
# its 51 s move from the longer lane to the shorter)
# its 51 s move from the longer lane to the shorter); docs-lint ends the light lane (stop 55: checks 821 s with it,
# light 754 s without)
CHECKS_LANE_SCENARIOS := gpu_footprint
LIGHT_LANE_SCENARIOS := $(filter-out $(CHECKS_LANE_SCENARIOS),$(LIGHT_SCENARIOS))
SERVING_SCENARIOS := $(filter-out $(LIGHT_SCENARIOS),$(SCENARIOS))
test:
	@tools/timed.sh venv "$(MAKE) -s venv collections" \
	  sysdeps "$(MAKE) -s sysdeps podman image" \
	  build "$(MAKE) -s install-artifact" \
	  lanes "tools/lanes.sh checks 'KEEP_ARTIFACT=1 $(MAKE) -s test-checks' light 'KEEP_ARTIFACT=1 $(MAKE) -s test-light'" \
	  molecule "KEEP_ARTIFACT=1 $(MAKE) -s molecule SCENARIOS='$(SERVING_SCENARIOS)'"

# the lanes of make test, each stage timed
test-checks:
	@tools/timed.sh lint "$(MAKE) -s lint" \
	  sanity "$(MAKE) -s sanity" \
	  units "$(MAKE) -s units" \
	  artifact "$(MAKE) -s check-artifact" \
	  importer "$(MAKE) -s importer" \
	  ee "$(MAKE) -s ee-context" \
	  units-old "$(MAKE) -s units-oldest" \
	  mol-check "$(MAKE) -s molecule SCENARIOS='$(CHECKS_LANE_SCENARIOS)'"
test-light:
	@tools/timed.sh mol-light "$(MAKE) -s molecule SCENARIOS='$(LIGHT_LANE_SCENARIOS)'" \
	  docs-lint "$(MAKE) -s docs-lint"

demo: venv collections image install-artifact
	@tools/demo.sh

clean:
	@-podman ps -aq --filter label=inferops.testhost | xargs -r podman rm -f >/dev/null
	rm -rf .cache/sanity .cache/dist .cache/installed .cache/importer-out .cache/docsite .cache/ee .pytest_cache .hypothesis reports
distclean: clean
	rm -rf .venv .cache .build
