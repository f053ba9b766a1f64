# Lightrail — `make demo` and `make test` work on a fresh Debian machine.
# They create .venv (pinned requirements.lock) and, when run as root, apt-get install
# the Debian packages they need (etcd-server; python3-venv, without which Debian's python3
# cannot create the venv).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck check proto bench system-deps clean

$(STAMP): requirements.lock pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	@missing=""; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
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

test: $(STAMP) system-deps
	LIGHTRAIL_REQUIRE_ETCD=1 $(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck test

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

bench: $(STAMP) system-deps
	$(PY) bench/hot_path.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
