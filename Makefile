# One variable picks the torch build. The default is the CPU wheel this kind of machine keeps on disk;
# a GPU user runs e.g. `make demo TORCH="torch --index-url https://download.pytorch.org/whl/cu126"`.
TORCH ?= torch==2.13.0
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint install browser docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test,lint]'

demo: install
	$(BIN)/opscope profile examples/mlp.py

# The browser tests (tests/render/test_browser.py) need Chromium (Debian's `chromium` package): installed here
# when missing and this is root with apt-get; otherwise they are skipped, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
		echo "opscope: could not install chromium; the browser tests will be skipped"; \
	else \
		echo "opscope: chromium is not installed (installing needs root and apt-get); the browser tests will be skipped"; \
	fi

# The whole gate (what CI runs): lint, the docs build, then the suite in two phases: everything else 2-wide, then the
# `serial` tests (CPU hogs, quiet-machine checks) alone, so they neither slow the others down nor read
# the other worker as noise.
test: lint docs browser
	$(BIN)/python -m pytest -n 2 -q -m "not serial"
	$(BIN)/python -m pytest -q -m serial

# The edit loop: the tests not marked slow or serial (under 3 minutes on 2 cores); `make test` before
# pushing.
test-fast: install
	$(BIN)/python -m pytest -n 2 -q -m "not slow and not serial"

# ruff, mypy (pyproject [tool.mypy]) and the architecture's import contracts (pyproject [tool.importlinter]).
lint: install
	$(BIN)/ruff check opscope reference_kernels tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on any broken link or anchor.
# docs/generated (the run format's JSON Schema and columns) is written by
# `python -m opscope.run.schema docs/generated`; tests/run/test_schema.py fails when it is stale.
docs: install
	$(BIN)/pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
