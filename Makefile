# Two entry points, each usable on a fresh clone:
#   make bench  - set up, then run the benchmark scenarios on this machine's hardware
#   make test   - set up, lint (ruff, mypy), then run perfsuite's own tests and the cpu benchmark gate
# ARGS passes extra pytest arguments, e.g. make bench ARGS="-k mixed_precision".

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines get the local CPU wheel; an unpinned torch would pull CUDA packages.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= deepspeed,fairscale,test

.PHONY: setup lint bench test clean

setup: $(VENV)/.installed

# A GPU runner's own CUDA torch is reused through --system-site-packages rather
# than replaced; elsewhere the pinned CPU wheel is installed first.
$(VENV)/.installed: pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q $(TORCH_SPEC); \
	fi
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

bench: setup
	$(PY) -m pytest bench_tests -p no:cacheprovider --perf-json perf-results.json $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(PY) -m pytest tests $(ARGS)
	$(PY) -m pytest bench_tests -p no:cacheprovider --perf-profile=cpu --perf-json perf-results-cpu.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache perf-results*.json
