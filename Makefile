# raftlog developer commands. Everything installs into .venv inside the repo.
# The interpreter .venv is made from: the distribution's CPython 3.11 when the machine
# has one, else python3. Debian builds it with PGO and LTO and links libpython into the
# executable; a default pyenv build (shared libpython, no PGO) costs the nodes about 7 %
# more CPU per write (docs/node.md, "The interpreter"). Any other: make PYTHON=...
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) python3)
VENV := .venv
PY := $(VENV)/bin/python
# Named after the interpreter, so choosing another one reinstalls (into a new .venv).
STAMP := $(VENV)/.installed-$(subst /,_,$(PYTHON))
SEEDS ?= 5000
START ?= 0
PYTEST_ARGS ?=

.PHONY: install test test-fast sim lint bench run run-tls clean

# Idempotent: reinstalls only when the package metadata changed.
$(STAMP): setup.cfg pyproject.toml
	@if test -x $(PY) && [ "$$($(PY) -c 'import os, sys; print(os.path.realpath(sys._base_executable))')" \
	    != "$$($(PYTHON) -c 'import os, sys; print(os.path.realpath(sys.executable))')" ]; then \
	  echo "install: $(VENV) was made from another interpreter than $(PYTHON); making it anew"; \
	  rm -rf $(VENV); \
	fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,spark]'
	touch $(STAMP)

install: $(STAMP)

# The whole suite: unit, interaction scripts, a fixed simulation seed set, negative controls,
# then the short chaos run. The chaos packages come first: without them the fault tests
# of tests/chaos skip (a fresh machine skipped three before they were installed).
test: install chaos-deps
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory chaos-smoke

# Unit and interaction tests only (seconds), for the edit loop.
test-fast: install
	$(PY) -m pytest -m "not slow and not sim" -q $(PYTEST_ARGS)

# Deep fuzzing: the fuzz tests of `make test` with FUZZ_SCALE times their examples
# (hypothesis over the batch codec and the transport decoders, schemathesis over the API);
# each test's own budget grows with the scale, so pytest's per-test timeout is lifted.
FUZZ_SCALE ?= 20
.PHONY: fuzz
fuzz: install
	RAFTLOG_FUZZ_SCALE=$(FUZZ_SCALE) $(PY) -m pytest -q -p no:cacheprovider --timeout=0 tests/storage/test_batch.py \
	  tests/transport/test_decoders_fuzz.py tests/unit/test_wire.py tests/http/test_fuzz.py $(PYTEST_ARGS)

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

# The same with HTTPS and mutual TLS between nodes, a throwaway CA in ./data-tls/tls
# (clients: --ca ./data-tls/tls/ca.pem or RAFTLOG_CA). Its own directory: a cluster
# directory keeps TLS on once it has been used with it.
run-tls: install
	$(PY) -m multiraft.cli cluster up --nodes 3 --dir ./data-tls --tls

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

# Debian packages the chaos runner injects faults with: iptables (nft-backed) for
# partitions and loss, nftables, libfaketime (package faketime) for clock bumps.
# Idempotent: installs only what is missing, when root with apt-get; otherwise it
# names what is missing and carries on (the runner detects capabilities and skips
# the fault kinds it cannot inject, and says so in its report).
CHAOS_DEBS := iptables nftables faketime
.PHONY: chaos-deps
chaos-deps:
	@missing=""; \
	for package in $(CHAOS_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'ok installed' \
	    || missing="$$missing $$package"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "chaos-deps: installing$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
	    || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; } \
	    || echo "chaos-deps: could not install$$missing; the runner will skip what needs them"; \
	else \
	  echo "chaos-deps: missing$$missing (needs root and apt-get); the runner will skip what needs them"; \
	fi

# Chaos (docs/chaos.md): real processes in their own network and mount namespaces,
# faults from a seed, a Jepsen-style check of the history. Each prints `chaos:` lines
# and fails on any anomaly. Reports go under chaos-runs/ (index.html per run).
CHAOS_SEED ?=
CHAOS_OUT ?= chaos-runs
CHAOS_SEED_ARG := $(if $(CHAOS_SEED),--seed $(CHAOS_SEED),)
.PHONY: chaos chaos-smoke chaos-controls chaos-mirror
# The short run `make test` includes (about 70 s).
chaos-smoke: install chaos-deps
	$(PY) -m chaos suite smoke --duration 45 --out $(CHAOS_OUT) $(CHAOS_SEED_ARG)

# The standard set: six runs of different fault mixes on 3 nodes, one with moves
# (decommissions) on 5 nodes, one with consumer groups, one with far-horizon catch-up
# driven hard (--far-catchup), one with a mirror (--mirror) (about 15 minutes).
chaos: install chaos-deps
	$(PY) -m chaos suite standard --duration 60 --out $(CHAOS_OUT) $(CHAOS_SEED_ARG)

# One mirror run (docs/chaos.md, "Mirrors"): a sink cluster copies the topics under
# sink kills and pauses, link cuts and pauses; logs compared, one topic promoted (about 2 minutes).
chaos-mirror: install chaos-deps
	$(PY) -m chaos suite mirror --duration 60 --out $(CHAOS_OUT) $(CHAOS_SEED_ARG)

# Testing the tests: each unsafe server switch must be caught.
chaos-controls: install chaos-deps
	$(PY) -m chaos suite controls --duration 45 --out $(CHAOS_OUT) $(CHAOS_SEED_ARG)

# Soak (docs/chaos.md, "Soak"): chaos runs back to back for HOURS, on 3 and 5 nodes, fault
# mixes and seeds rotating, 60 s to 15 min each; one aggregate report under
# $(CHAOS_OUT)/soak-<time>/ (report.html), rewritten after every run. Only failed runs'
# directories are kept. Ctrl-C or SIGTERM ends the run in progress and writes the report.
HOURS ?= 3
SOAK_SEED ?=
.PHONY: soak chaos-soak
soak: install chaos-deps
	$(PY) -m chaos soak --hours $(HOURS) --out $(CHAOS_OUT) $(if $(SOAK_SEED),--seed $(SOAK_SEED),)
chaos-soak: soak  # the name ../shared/CHAOS.md uses
