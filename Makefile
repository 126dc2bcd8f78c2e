# raftlog developer commands. Everything installs into .venv inside the repo.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
SEEDS ?= 5000
START ?= 0
PYTEST_ARGS ?=

.PHONY: install test test-fast sim lint bench run clean

# Idempotent: reinstalls only when the package metadata changed.
$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The whole suite: unit, interaction scripts, a fixed simulation seed set, negative controls.
test: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# Unit and interaction tests only (seconds), for the edit loop.
test-fast: install
	$(PY) -m pytest -m "not slow and not sim" -q $(PYTEST_ARGS)

# Long simulation sweep: make sim SEEDS=10000 START=0
sim: install
	$(PY) -m tests.sim.sweep --seeds $(SEEDS) --start $(START)

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) bench/raft_core.py
	$(PY) bench/storage.py
	$(PY) bench/node.py

# A local 3-node cluster on 127.0.0.1-3 (data in ./data); Ctrl-C stops it.
run: install
	$(PY) -m multiraft.cli cluster up --nodes 3 --dir ./data

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
