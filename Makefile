# The two commands a newcomer needs: `make run` and `make test`.
# Both set up what they need themselves (a virtualenv in .venv, Debian packages when root).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= etc/edgegw
STAMP := $(VENV)/.installed
# A second virtualenv with the oldest versions setup.py's ranges allow (Twisted, treq and the
# rest: tests/constraints-oldest.txt); .venv gets the newest. `make test` runs the trial
# suite in both, so that a range claims only versions the suite has passed on.
OLDEST := .venv-oldest
OLDEST_CONSTRAINTS := tests/constraints-oldest.txt
OLDEST_STAMP := $(OLDEST)/.installed
# The OpenID provider the tests log in through (tests/e2e/provider.mjs): node's oidc-provider,
# pinned by tests/e2e/package-lock.json and installed in tests/e2e/node_modules.
E2E := tests/e2e
E2E_STAMP := $(E2E)/node_modules/.installed

.PHONY: run test check lint typecheck layers unit unit-oldest venv clean bench redis \
	chromium systemd-tools deb

# $(call debian,TEST,PACKAGES,WHO): when the shell command TEST fails, install Debian's
# PACKAGES when root, else say what to run and stop.
define debian
@if ! ( $(1) ) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(2); \
		else \
			echo "$(3) $(2): run 'sudo apt-get install $(2)' first"; exit 1; \
		fi; \
	fi
endef

# Stock Debian ships python3 without venv/ensurepip.
VENV_CHECK = $(PYTHON) -c "import ensurepip, venv"
need_venv = $(call debian,$(VENV_CHECK),python3-venv,edgegw needs)

$(STAMP): setup.py pyproject.toml
	$(need_venv)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

# After .venv (order only): both editable installs write edgegw.egg-info here.
$(OLDEST_STAMP): setup.py pyproject.toml $(OLDEST_CONSTRAINTS) | $(STAMP)
	$(need_venv)
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --upgrade pip
	$(OLDEST)/bin/pip install -q --constraint $(OLDEST_CONSTRAINTS) -e '.[test]' \
		--config-settings editable_mode=compat
	touch $(OLDEST_STAMP)

# Stock Debian has no node: the e2e provider needs Debian's nodejs and npm.
need_node = $(call debian,command -v node && command -v npm,nodejs npm,edgegw's tests need)

# The end-to-end suite drives Debian's chromium through its chromium-driver
# (tests/e2e/browser.py); never a downloaded browser.
need_chromium = $(call debian,test -x /usr/bin/chromium && test -x /usr/bin/chromedriver,\
	chromium chromium-driver,edgegw's tests need)

chromium:
	$(need_chromium)

# The state-store tests start their own redis-server (tests/support/redis.py), and
# Sentinels with it (tests/support/sentinel.py).
need_redis = $(call debian,command -v redis-server && command -v redis-sentinel,\
	redis-server redis-sentinel,edgegw's tests need)

redis:
	$(need_redis)

# The unit-file tests run systemd's own checks (systemd-analyze verify and security).
need_systemd = $(call debian,command -v systemd-analyze,systemd,edgegw's tests need)

systemd-tools:
	$(need_systemd)

# The Debian package (debian/), built from a copy of the tree into build/deb/ and
# checked by lintian; the package tests (tests/test_debian_package.py) inspect it.
DEB_DIR := build/deb
DEB_STAMP := $(DEB_DIR)/.built
DEB_TOOLS = command -v dpkg-buildpackage && command -v dh && command -v lintian \
	&& command -v fakeroot && /usr/bin/python3.11 -c "import ensurepip, venv"
need_deb_tools = $(call debian,$(DEB_TOOLS),dpkg-dev debhelper lintian fakeroot python3-venv,\
	edgegw's package build needs)

## Build the Debian package: build/deb/edgegw_VERSION_ARCH.deb (lintian-clean).
deb: $(DEB_STAMP)

$(DEB_STAMP): $(wildcard $(shell git ls-files 2>/dev/null))
	$(need_deb_tools)
	rm -rf $(DEB_DIR) && mkdir -p $(DEB_DIR)/src
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t $(DEB_DIR)/src
	cd $(DEB_DIR)/src && dpkg-buildpackage -us -uc -b
	lintian --fail-on error,warning $(DEB_DIR)/*.deb
	rm -rf $(DEB_DIR)/src
	touch $(DEB_STAMP)

$(E2E_STAMP): $(E2E)/package-lock.json
	$(need_node)
	npm ci --prefix $(E2E) --no-audit --no-fund
	touch $(E2E_STAMP)

venv: $(STAMP)

## Run the gateway in the foreground on the example configuration, with the demo backend
## (examples/demo/backend.py, on EDGEGW_DEMO_PORT, default 8081) behind its api routes and
## a demo OpenID provider (tests/e2e/provider.mjs, on EDGEGW_DEMO_IDP_PORT, default 8082)
## for its login, and a redis-server (on EDGEGW_DEMO_REDIS_PORT, default 8083, nothing
## saved to disk) for its server-side sessions; the session key is a random one unless
## EDGEGW_SESSION_KEY is set.
run: $(STAMP) $(E2E_STAMP) redis
	@listen=$${EDGEGW_LISTEN:-127.0.0.1:8080}; port=$${listen##*:}; \
	$(BIN)/python examples/demo/backend.py --port $${EDGEGW_DEMO_PORT:-8081} & demo=$$!; \
	redis-server --bind 127.0.0.1 --port $${EDGEGW_DEMO_REDIS_PORT:-8083} --save '' \
		--appendonly no --loglevel warning & redis=$$!; \
	node $(E2E)/provider.mjs --port $${EDGEGW_DEMO_IDP_PORT:-8082} \
		--client-secret $${EDGEGW_DEMO_IDP_SECRET:-edgegw-demo-secret} \
		--redirect-uri http://127.0.0.1:$$port/auth/callback \
		--redirect-uri http://localhost:$$port/auth/callback \
		--post-logout-redirect-uri http://127.0.0.1:$$port/auth/logout \
		--post-logout-redirect-uri http://localhost:$$port/auth/logout \
		--backchannel-logout-uri http://127.0.0.1:$$port/auth/backchannel-logout \
		>/dev/null 2>&1 & idp=$$!; \
	trap 'kill $$demo $$idp $$redis 2>/dev/null' EXIT INT TERM; \
	EDGEGW_SESSION_KEY=$${EDGEGW_SESSION_KEY:-$$(head -c 24 /dev/urandom | base64)} \
		$(BIN)/twistd -n --pidfile= edgegw --config $(CONFIG)

## Validate a configuration and print its route table (like nginx -t).
check: $(STAMP)
	EDGEGW_SESSION_KEY=$${EDGEGW_SESSION_KEY:-$$(head -c 24 /dev/urandom | base64)} \
		$(BIN)/edgegw check $(CONFIG)

lint: $(STAMP)
	$(BIN)/ruff check edgegw tests twisted bench examples
	$(BIN)/ruff format --check edgegw tests twisted bench examples

typecheck: $(STAMP)
	$(BIN)/mypy

## The layering rule of docs/architecture.md (import-linter).
layers: $(STAMP)
	$(BIN)/lint-imports

## The trial suite on the daemon's own reactor (edgegw.reactor, what twistd edgegw runs).
unit: $(STAMP) $(E2E_STAMP) redis chromium systemd-tools $(DEB_STAMP)
	$(BIN)/trial --reactor=edgegw --jobs=2 tests

## The trial suite again, on the oldest versions the dependency ranges allow, on
## Twisted's default reactor.
unit-oldest: $(OLDEST_STAMP) $(E2E_STAMP) redis chromium systemd-tools $(DEB_STAMP)
	$(OLDEST)/bin/trial --jobs=2 --temp-directory=_trial_temp_oldest tests

## Set up and pass the whole suite: lint, types, layers, tests (newest and oldest versions).
test: lint typecheck layers unit unit-oldest

## Benchmarks (never part of the tests): every scenario in one interleaved run (wrk
## against the backend, nginx, Caddy, an Agent proxy and edgegw;
## bench/results/suite-*.md), the memory figures, HTTPS beside nginx and Caddy (h2load
## and wrk; bench/results/tls-*.md),
## compression's CPU per response beside nginx's gzip (bench/results/compression-*.md)
## and a single-page app's load in headless Chromium through an emulated 100 ms,
## 10 Mbit/s link (bench/results/pageload-*.md). Installs wrk, nginx, h2load, Caddy,
## Chromium and its driver and npm as root, and redis-server (`make redis`: the suite's
## shared rate-limit rows). The feature benchmarks
## (python -m bench proxy|api|authz|telemetry|session|bearer|plugins|metrics|workers|reload)
## measure one feature each in more depth.
bench: $(STAMP) redis
	$(BIN)/python -m bench suite
	$(BIN)/python -m bench memory
	$(BIN)/python -m bench tls
	$(BIN)/python -m bench compression --app
	$(BIN)/python -m bench pageload

clean:
	rm -rf $(VENV) $(OLDEST) _trial_temp* build *.egg-info .mypy_cache .ruff_cache
