# gShare: `make demo` runs the whole system on embedded defaults, `make test` runs the test suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_ARGS ?=
PYTEST_ARGS ?=
# In parallel by default (pytest-xdist: one worker per CPU,
# at most four, each with its own test database and Redis database, gshare/settings/test.py); `make test
# TEST_WORKERS=0` runs it in one process. See README, Development.
TEST_WORKERS ?= auto

.PHONY: demo test test-clock lint venv clean

$(STAMP): requirements.txt requirements-dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 (or run make PYTHON=/path/to/python3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@bash hack/test-deps.sh nginx
	$(PY) manage.py demo $(DEMO_ARGS)

test: $(STAMP)
	@bash hack/test-deps.sh
	$(PY) -m pytest -n $(TEST_WORKERS) --maxprocesses=4 --dist loadgroup $(PYTEST_ARGS)

# The billing and period tests on a pinned clock (tests/clock.py): the product's "now" a minute before midnight at a
# month's end, then ten days after a year's last hour (the tests' T0 is then 2026-12-31 23:00, so their periods end in
# the next year).
CLOCK_INSTANTS ?= 2026-11-30T23:59:30Z 2027-01-10T23:59:30Z
CLOCK_TESTS ?= tests/billing
test-clock: $(STAMP)
	@bash hack/test-deps.sh
	@for now in $(CLOCK_INSTANTS); do \
		echo "GSHARE_TEST_NOW=$$now"; \
		GSHARE_TEST_NOW=$$now $(PY) -m pytest -n $(TEST_WORKERS) --maxprocesses=4 --dist loadgroup -q $(CLOCK_TESTS) $(PYTEST_ARGS) || exit 1; \
	done

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	@bash hack/test-deps.sh shellcheck
	shellcheck hack/*.sh

clean:
	rm -rf $(VENV) .gshare staticfiles
