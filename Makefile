# One variable picks the torch build. The default is the CPU wheel this kind of machine keeps on disk;
# a GPU user runs e.g. `make demo TORCH="torch --index-url https://download.pytorch.org/whl/cu126"`.
TORCH ?= torch==2.13.0
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install: $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test]'

demo: install
	$(BIN)/opscope profile examples/mlp.py

# Two phases: everything else 2-wide, then the `serial` tests (CPU hogs, quiet-machine checks) alone, so
# they neither slow the others down nor read the other worker as noise.
test: install
	$(BIN)/ruff check opscope tests benchmarks examples
	$(BIN)/python -m pytest -n 2 -q -m "not serial"
	$(BIN)/python -m pytest -q -m serial

lint: install
	$(BIN)/ruff check opscope tests benchmarks examples
