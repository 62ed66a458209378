# The two commands a newcomer needs: `make run` and `make test`.
# Both set up what they need themselves (a virtualenv in .venv, Debian packages when root).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= etc/edgegw
STAMP := $(VENV)/.installed

.PHONY: run test check lint typecheck layers unit venv clean bench

$(STAMP): setup.py pyproject.toml
	@# Stock Debian ships python3 without venv/ensurepip: install it when root.
	@if ! $(PYTHON) -c "import ensurepip, venv" 2>/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; \
		else \
			echo "edgegw needs python3-venv: run 'sudo apt-get install python3-venv' first"; exit 1; \
		fi; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

venv: $(STAMP)

## Run the gateway in the foreground on the example configuration.
run: $(STAMP)
	$(BIN)/twistd -n --pidfile= edgegw --config $(CONFIG)

## Validate a configuration and print its route table (like nginx -t).
check: $(STAMP)
	$(BIN)/edgegw check $(CONFIG)

lint: $(STAMP)
	$(BIN)/ruff check edgegw tests twisted bench
	$(BIN)/ruff format --check edgegw tests twisted bench

typecheck: $(STAMP)
	$(BIN)/mypy

## The layering rule of docs/architecture.md (import-linter).
layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/trial --jobs=2 tests

## Set up and pass the whole suite: lint, types, layers, tests.
test: lint typecheck layers unit

## Benchmarks (never part of the tests): wrk against the backend, nginx, an Agent proxy
## and edgegw, interleaved; then the proxy's memory figures. Installs wrk and nginx as root.
bench: $(STAMP)
	$(BIN)/python -m bench proxy
	$(BIN)/python -m bench memory
	$(BIN)/python -m bench api
	$(BIN)/python -m bench authz
	$(BIN)/python -m bench telemetry

clean:
	rm -rf $(VENV) _trial_temp* build *.egg-info .mypy_cache .ruff_cache
