# Two commands for a fresh machine:  `make bench`  and  `make test`.
# Both create a local virtualenv (.venv), install loaderlib editable with its
# dependencies, build the Cython extensions, and run.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.loaderlib-installed
TORCH_WHEELS ?= /opt/wheels
WITH_TORCH   ?= 1

.PHONY: all install build test test-fast bench bench-decode clean

all: build

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Dependencies change rarely: reinstall only when the packaging files change.
$(STAMP): $(BIN)/python pyproject.toml setup.py
	$(BIN)/python -m pip install --upgrade "pip>=23" "setuptools>=68" wheel "cython>=3.0" "numpy>=1.24"
	$(BIN)/python -m pip install --no-build-isolation -e ".[test]"
	@# PyTorch is optional: the benchmarks compare against its DataLoader and a few tests check
	@# zero-copy conversion. Install it only from a local CPU wheel (never a multi-GB CUDA
	@# download); WITH_TORCH=0 skips it.
	@whl=$$(ls $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ "$(WITH_TORCH)" = "0" ]; then echo "WITH_TORCH=0: PyTorch not installed"; \
	elif [ -n "$$whl" ]; then $(BIN)/python -m pip install "$$whl"; \
	else echo "no local PyTorch CPU wheel in $(TORCH_WHEELS): PyTorch comparisons will be skipped"; fi
	touch $(STAMP)

install: $(STAMP)

# Rebuild the extensions in place whenever a .pyx/.pxd/.h changed (a no-op otherwise).
build: $(STAMP)
	$(BIN)/python setup.py -q build_ext --inplace

test: build
	$(BIN)/python -m pytest -q tests

test-fast: build
	$(BIN)/python -m pytest -q tests -m "not slow"

bench: build
	$(BIN)/python -m loaderlib bench

bench-decode: build
	$(BIN)/python benchmarks/decode.py

clean:
	rm -rf build loaderlib/_ext/*.so pyx/*.c *.egg-info
