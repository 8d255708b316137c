# Nimbus: the two commands that matter are `make run` and `make test`.
PY      ?= python3
VENV    ?= .venv
TOOLS   ?= .venv-tools
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup run test test-fast bench lint fmt migrate clean conformance

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,semantic]'
	touch $(STAMP)

# checkov pins its own dependency set, so it lives in a separate virtualenv.
$(TOOLS)/bin/checkov:
	test -x $(TOOLS)/bin/python || $(PY) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install -q checkov

setup: $(STAMP) $(TOOLS)/bin/checkov  ## install everything the platform and its tests need

run: $(STAMP)  ## bring the whole platform up on this machine (embedded, no external services)
	$(BIN)/python -m controlplane.embedded

test: setup  ## run the whole test suite (needs Postgres, Redis, RabbitMQ on localhost)
	$(BIN)/pytest -q -p no:cacheprovider

# The engine conformance suite: a simulator by default; NIMBUS_ENGINE_URL=http://gpu-node:30000
# points the same assertions at a real SGLang server (dataplane/sim/CONFORMANCE.md).
conformance: $(STAMP)  ## engine conformance (NIMBUS_ENGINE_URL=http://host:30000 for a real SGLang node)
	$(BIN)/pytest -q -p no:cacheprovider tests/conformance

bench: $(STAMP)  ## reproducible benchmarks; each prints its own table
	$(BIN)/python -m bench.controlplane.api_latency
	$(BIN)/python -m bench.sim.calibration
	$(BIN)/python -m bench.sim.efficiency

lint: $(STAMP)
	$(BIN)/ruff check controlplane infra dataplane migrations tests bench

fmt: $(STAMP)
	$(BIN)/ruff format controlplane infra dataplane migrations tests bench

migrate: $(STAMP)  ## upgrade the configured database (NIMBUS_DATABASE_URL) to the latest schema
	$(BIN)/nimbus db upgrade

clean:
	rm -rf .nimbus .pytest_cache .ruff_cache
