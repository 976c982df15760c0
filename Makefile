# The two commands of the README: `make demo` and `make test`.
# Each creates the virtual environment it needs from the package registries.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-fast check lint typecheck pytest pytest-pg15 bench clean mutation-check system-packages

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("pgcounters needs Python 3.11+" if sys.version_info < (3, 11) else 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(BIN)/pgcounters demo

# the whole suite: the system packages its tests need (installed with apt-get when this runs
# as root or with sudo, else named), lint, strict typing (tests included), the tests on the
# embedded PostgreSQL 18, again on the distribution's PostgreSQL 15 (the oldest supported;
# not the benchmarks' smoke tests, the browser and the package build, which do not depend on
# the server's version), then the faults the tests must catch (mutation-check)
test: system-packages check pytest pytest-pg15 mutation-check

PG15_BIN := /usr/lib/postgresql/15/bin
PG15_SKIP := --ignore-glob='tests/test_bench_*' --ignore=tests/test_browser.py \
	--ignore=tests/test_package.py --ignore=tests/test_plproxy.py --ignore=tests/test_mutants.py

pytest-pg15: $(STAMP)
	PGCOUNTERS_TEST_PG_BIN=$(PG15_BIN) $(BIN)/pytest $(PG15_SKIP) $(PYTEST_ARGS)

system-packages:
	@scripts/system-packages

# the fast lane while you work (under a minute): lint, then the tests marked `fast`;
# `make test` stays the whole suite, the one CI runs
test-fast: lint
	$(BIN)/pytest -m "fast and not slow" $(PYTEST_ARGS)

check: lint typecheck

lint: $(STAMP)
	$(BIN)/ruff check src tests examples
	$(BIN)/ruff format --check src tests examples

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

# Faults of tests/mutants.py (the trigger compiler, the SQL engine, the Python side) put one
# at a time into a copy of the package: the tests each names must fail. Part of `make test`
# (about 4 minutes); tests/test_mutants.py also checks in the suite that every fault still
# applies. MUTATION_ARGS: --list, --only NAME
mutation-check: $(STAMP)
	$(BIN)/python scripts/mutation_check.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) pgcounters-data .mypy_cache .ruff_cache .pytest_cache

bench: $(STAMP)
	$(BIN)/pgcounters bench $(BENCH_ARGS)

# The blog example (examples/blog): migrate, load sample data, serve on http://127.0.0.1:8000/
# (an embedded PostgreSQL in examples/blog/pgcounters-data unless PGCOUNTERS_DSN is set).
.PHONY: blog
blog: $(STAMP)
	cd examples/blog && ../../$(BIN)/python manage.py migrate
	cd examples/blog && ../../$(BIN)/python manage.py blog_seed
	cd examples/blog && ../../$(BIN)/python manage.py runserver

# The example service (examples/service): FastAPI + async SQLAlchemy + Alembic. Migrates, then
# serves on http://127.0.0.1:8000/ (an embedded PostgreSQL in examples/service/pgcounters-data
# unless PGCOUNTERS_DSN is set).
.PHONY: service
service: $(STAMP)
	cd examples/service && ../../$(BIN)/python -m newsroom $(SERVICE_ARGS)
