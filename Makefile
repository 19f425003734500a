# The two commands a new user runs: `make demo` and `make test`. Both set up .venv themselves.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo lint test test-unit rules bench bench-peers clean

$(STAMP): pyproject.toml
	@echo "Installing candor and its dependencies into $(VENV) (first run, or pyproject.toml changed: about a minute)..."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m examples.demo

# Lint and types (configured in pyproject.toml): fails on any finding. src/ and tools/ are checked strictly; tests,
# bench and examples with the looser set of [tool.ruff.lint.per-file-ignores]. mypy checks src/, tools/, tests/,
# bench/ and examples/ (all but src/ and tools/ without annotation rules, see [tool.mypy]; bench/peers runs in its
# own venv).

lint: $(STAMP)
	$(VENV)/bin/ruff check src tools tests bench examples
	$(VENV)/bin/ruff format --check src tools tests bench examples
	$(VENV)/bin/mypy

# The suite runs on TEST_WORKERS processes (pytest-xdist): most tests wait on child processes, sockets and databases,
# so more workers than the 2 cores of the reference machine pay. `--dist loadfile` hands a worker one test file at a
# time and runs its tests in order (the service benchmarks' smoke runs, all in tests/e2e/bench/test_bench_smoke.py,
# must not run side by side); the files with `slow` tests start first (tests/conftest.py). TEST_WORKERS=0 runs
# everything in one process; PYTEST_ARGS adds options, e.g. PYTEST_ARGS="-k crash_matrix" or
# PYTEST_ARGS="--durations=30". The tree is split by what a test needs (CONTRIBUTING.md): tests/unit, tests/integration
# (a database), tests/e2e (real processes); `make test` runs all three.
TEST_WORKERS ?= 4

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit tests only (`-m unit`, the marker tests/conftest.py gives everything under tests/unit): no database, no
# child process, no network server, so no PostgreSQL is needed; about a minute on 2 workers.
UNIT_WORKERS ?= 2

test-unit: $(STAMP)
	$(PY) -m pytest -m unit -n $(UNIT_WORKERS) $(PYTEST_ARGS) tests/unit

# docs/rules.md: regenerate the generated columns (and rows for newly cited ids) from the citations in src/ and tests/.
rules: $(STAMP)
	$(PY) -m tools.rules_doc

# Benchmarks (docs/benchmarks.md). The peers they compare against (LangGraph and its checkpointers) live in their own
# venv, bench/.venv-peers, never in candor's; if it cannot be built, the LangGraph figures are reported as skipped.
# The service benchmarks start real `candor serve` processes on scratch PostgreSQL databases
# ($CANDOR_BENCH_POSTGRES_URL, default postgresql://postgres@127.0.0.1:5432/test); without PostgreSQL they are
# reported as skipped. BENCH_ARGS passes options to bench.run_all, e.g. BENCH_ARGS="--only failover_latency".
PEERS_VENV := bench/.venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): bench/peers/requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV) || python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	@touch $@

bench-peers: $(PEERS_STAMP)

bench: $(STAMP)
	@$(MAKE) --no-print-directory bench-peers || echo "bench-peers failed: the LangGraph side will be reported as skipped"
	$(PY) -m bench.run_all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
