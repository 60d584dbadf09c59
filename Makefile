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

.PHONY: demo test lint venv clean

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

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	@bash hack/test-deps.sh shellcheck
	shellcheck hack/*.sh

clean:
	rm -rf $(VENV) .gshare staticfiles
