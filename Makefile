# The two commands a user needs (see README.md):
#   make demo   run the main job: train, snapshot mid-epoch, crash, restore, prove the stream
#   make test   lint, type-check and run the whole test suite
# Each creates or reuses the virtualenv .venv by itself; nothing else is needed but python3.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench docs venv clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check snapshot tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy snapshot

unit: $(STAMP)
	$(BIN)/python -m pytest

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m benchmarks all

docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
