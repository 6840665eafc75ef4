# Two commands: `make serve` and `make test`. Both build .venv from scratch when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HOST ?= 127.0.0.1
PORT ?= 8000
MODEL ?= tiny

.PHONY: serve test venv install install-test clean gpu-wheels

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the CPU wheel: a bare `torch` would pull a CUDA build. pyproject.toml declares ranges;
# constraints.txt holds the tested exact versions.
$(VENV)/.installed: $(VENV)/bin/activate pyproject.toml constraints.txt
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml constraints.txt
	$(PIP) install -q -c constraints.txt -e '.[test]'
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

# The packages the GPU machine's image lacks and scripts/gpu_check.sh imports, as cp312 manylinux wheels in .whl/
# (ignored; carried with the call: docs/gpu.md). The versions are pyproject's pins.
GPU_WHEELS := msgspec==0.23.0 pyzmq==27.3.0
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $(GPU_WHEELS)
	@du -sh .whl
