# Lightrail — `make demo` and `make test` work on a fresh Debian machine.
# They create .venv (pinned requirements.lock) and, when run as root, apt-get install
# the Debian packages they need (etcd-server; openssl, whose CLI makes the TLS certificates of
# the etcd cluster tests; python3-venv, without which Debian's python3 cannot create the venv).

# The interpreter .venv is made with: the distribution's /usr/bin/python3 when it is 3.11 (the
# version requirements.lock is tested on) and can make a venv (or python3-venv can be installed:
# root), else the first python3 on PATH. Debian builds its python3 with profile-guided
# optimisation and LTO, libpython linked into the executable; a default pyenv build (shared
# libpython, neither) runs the controller's hot path with 12 % more instructions (README,
# "Benchmarks"). `make PYTHON=...` chooses another;
# a .venv made with a different interpreter is made again (the stamp names the interpreter).
SYSTEM_PYTHON := /usr/bin/python3
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell $(SYSTEM_PYTHON) -c 'import sys; raise SystemExit(sys.version_info[:2] != (3, 11))' \
	>/dev/null 2>&1 && { $(SYSTEM_PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1 \
	|| [ "$$(id -u)" = 0 ]; } && echo $(SYSTEM_PYTHON) || echo python3)
endif
PYTHON_REAL := $(shell $(PYTHON) -c 'import os, sys; print(os.path.realpath(sys.executable))' 2>/dev/null)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed$(subst /,-,$(PYTHON_REAL))

.PHONY: demo test lint typecheck check proto bench system-deps clean loadgen loadgen-deps nccl-plugin

$(STAMP): requirements.lock pyproject.toml | system-deps
	@test -n "$(PYTHON_REAL)" || { echo "make: $(PYTHON) does not run (set PYTHON=/path/to/python3, 3.11 or newer)" >&2; exit 1; }
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	# the optional extra lightrail[torch], for the PyTorch backend's tests (CPU build on this disk)
	$(PY) -m pip install --quiet "torch==2.13.0"
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v openssl >/dev/null 2>&1 || missing="$$missing openssl"; \
	command -v mosquitto >/dev/null 2>&1 || command -v /usr/sbin/mosquitto >/dev/null 2>&1 \
	  || missing="$$missing mosquitto"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v systemd-analyze >/dev/null 2>&1 || missing="$$missing systemd"; \
	command -v taskset >/dev/null 2>&1 || missing="$$missing util-linux"; \
	command -v $(CC) >/dev/null 2>&1 || missing="$$missing gcc"; \
	$(PYTHON) -c "import ensurepip, venv" >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages:$$missing — run: sudo apt-get install$$missing" >&2; exit 1; \
	  fi; \
	fi

demo: $(STAMP) system-deps
	$(VENV)/bin/lightrail demo

test: $(STAMP) system-deps nccl-plugin
	LIGHTRAIL_REQUIRE_ETCD=1 LIGHTRAIL_REQUIRE_SYSTEMD=1 $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck test

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

# The NCCL profiler plugin (agents/nccl/, plain C, no CUDA): NCCL loads it with
# NCCL_PROFILER_PLUGIN=lightrail when agents/nccl/build is on LD_LIBRARY_PATH, or with the path
# of the .so. tests/integration/test_nccl_plugin.py builds it through this target too.
NCCL_PLUGIN_DIR := agents/nccl
NCCL_PLUGIN := $(NCCL_PLUGIN_DIR)/build/libnccl-profiler-lightrail.so
NCCL_PLUGIN_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Wpedantic -Werror -fPIC -fvisibility=hidden

nccl-plugin: $(NCCL_PLUGIN)

NCCL_PLUGIN_SRC := $(NCCL_PLUGIN_DIR)/plugin.c $(NCCL_PLUGIN_DIR)/tuner.c

# one library, two plugins: the profiler (the phase gate) and the tuner (Ring on gated
# communicators); NCCL_TUNER_PLUGIN=lightrail finds it through the libnccl-tuner-lightrail.so link
$(NCCL_PLUGIN): $(NCCL_PLUGIN_SRC) $(wildcard $(NCCL_PLUGIN_DIR)/*.h)
	mkdir -p $(dir $@)
	$(CC) $(NCCL_PLUGIN_CFLAGS) -shared -pthread $(NCCL_PLUGIN_SRC) -o $@
	ln -sf $(notdir $@) $(dir $@)libnccl-tuner-lightrail.so

# The compiled load generator of bench/hot_path.py (bench/loadgen/loadgen.cc, gRPC C++ from
# Debian). `make loadgen` fails naming the packages when they are missing; `make bench` builds
# it when they are there and otherwise runs the Python generator.
LOADGEN_DIR := bench/loadgen
LOADGEN_BUILD := $(LOADGEN_DIR)/build
LOADGEN := $(LOADGEN_BUILD)/loadgen
LOADGEN_PROTO := lightrail/v1/agent.proto
LOADGEN_GEN := $(LOADGEN_BUILD)/lightrail/v1/agent
LOADGEN_OBJS := $(LOADGEN_BUILD)/loadgen.o $(LOADGEN_GEN).pb.o $(LOADGEN_GEN).grpc.pb.o
LOADGEN_APT := libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler pkg-config
LOADGEN_CXXFLAGS := -std=c++17 -O2 -Wall -Wextra -I$(LOADGEN_BUILD)
LOADGEN_HAVE := command -v protoc >/dev/null 2>&1 && command -v grpc_cpp_plugin >/dev/null 2>&1 \
	&& command -v pkg-config >/dev/null 2>&1 && pkg-config --exists grpc++ protobuf

loadgen: $(LOADGEN)

loadgen-deps:
	@if ! { $(LOADGEN_HAVE); }; then \
	  echo "make loadgen: gRPC C++ / protobuf not found (protoc, grpc_cpp_plugin, pkg-config grpc++ protobuf) - run: sudo apt-get install -y $(LOADGEN_APT)" >&2; \
	  exit 1; \
	fi

$(LOADGEN_GEN).pb.cc $(LOADGEN_GEN).grpc.pb.cc $(LOADGEN_GEN).pb.h $(LOADGEN_GEN).grpc.pb.h &: \
		proto/$(LOADGEN_PROTO) | loadgen-deps
	mkdir -p $(LOADGEN_BUILD)
	protoc -Iproto --cpp_out=$(LOADGEN_BUILD) --grpc_out=$(LOADGEN_BUILD) \
	  --plugin=protoc-gen-grpc="$$(command -v grpc_cpp_plugin)" $(LOADGEN_PROTO)

$(LOADGEN_BUILD)/%.o: $(LOADGEN_BUILD)/%.cc | loadgen-deps
	$(CXX) $(LOADGEN_CXXFLAGS) $$(pkg-config --cflags grpc++ protobuf) -c $< -o $@

$(LOADGEN_BUILD)/loadgen.o: $(LOADGEN_DIR)/loadgen.cc $(LOADGEN_GEN).pb.h $(LOADGEN_GEN).grpc.pb.h \
		| loadgen-deps
	$(CXX) $(LOADGEN_CXXFLAGS) $$(pkg-config --cflags grpc++ protobuf) -c $< -o $@

$(LOADGEN): $(LOADGEN_OBJS) | loadgen-deps
	$(CXX) -O2 -pthread $^ -o $@ $$(pkg-config --libs grpc++ protobuf)

bench: $(STAMP) system-deps
	@if { $(LOADGEN_HAVE); }; then $(MAKE) --no-print-directory loadgen; \
	else echo "make bench: gRPC C++ not installed, the Python load generator runs (sudo apt-get install -y $(LOADGEN_APT); make loadgen)"; fi
	$(PY) bench/hot_path.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache $(LOADGEN_BUILD) $(NCCL_PLUGIN_DIR)/build
