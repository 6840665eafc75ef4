# Two commands: `make serve` and `make test`. Both build .venv from scratch when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?= tiny

.PHONY: serve test venv install install-test clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU wheel: a bare `torch` would pull a CUDA build.
$(VENV)/.installed: $(VENV)/bin/activate pyproject.toml
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e '.[test]'
	touch $@

venv install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

# `make serve MODEL=medium PORT=8001 HOST=0.0.0.0`; an embedded model is made on first use.
serve: $(VENV)/.installed
	$(VENV)/bin/omnistage serve $(MODEL) --host $(HOST) --port $(PORT)

test: $(VENV)/.installed-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
