# aotc: the two set-up commands. Both are idempotent and install everything a fresh Debian 12 machine lacks.
#   make demo   export the example models, serve them from C++, check parity over HTTP
#   make test   C++ unit tests (ctest) and the Python test suite
# TORCH picks the torch requirement (default: the CPU build this machine has on disk).

TORCH     ?= torch==2.13.0
PYTHON    ?= python3
VENV      := .venv
PY        := $(VENV)/bin/python
PIP       := $(PY) -m pip
BUILD_DIR := build/py
APT_PKGS  := libboost1.81-dev rapidjson-dev libgtest-dev zlib1g-dev libssl-dev curl
PY_DEPS   := numpy pybind11 scikit-build-core cmake ninja fastapi uvicorn 'tritonclient[http]' \
             pytest pytest-timeout hypothesis httpx matplotlib triton

.PHONY: all deps build demo test test-cpp test-py bench clean

all: build

# --- system packages (apt) -------------------------------------------------------------------------------
$(VENV)/.apt-stamp: Makefile
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

# --- Python environment -------------------------------------------------------------------------------------
$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps-stamp: $(PY) pyproject.toml Makefile
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q $(PY_DEPS)
	@touch $@

deps: $(VENV)/.apt-stamp $(VENV)/.deps-stamp

# Editable installs: Python code runs from the source tree. The client (python_client/, package aotc-client)
# installs on its own first; then scikit-build-core compiles the C++ runtime (incrementally, in $(BUILD_DIR))
# and installs aotc, aotc-run, aotc-server and aotc._runtime into the venv.
build: deps
	$(PIP) install -q --no-deps -e python_client
	$(PIP) install -q --no-build-isolation --no-deps -e . \
	  -Cbuild-dir=$(BUILD_DIR) -Ccmake.define.CMAKE_PREFIX_PATH=$$($(PY) -c 'import torch;print(torch.utils.cmake_prefix_path)')

test-cpp: build
	$(VENV)/bin/ctest --test-dir $(BUILD_DIR) --output-on-failure

test-py: build
	$(PY) -m pytest -q -m "not cuda and not slow" --timeout=900 tests

test: test-cpp test-py

demo: build
	bash scripts/demo.sh

bench: build
	$(PY) bench/runtime.py

clean:
	rm -rf build .cache
