# The two commands a user needs (see README.md):
#   make demo   run the main job: train, snapshot mid-epoch, crash, restore, prove the stream
#   make test   lint, type-check and run the whole test suite
# Each creates or reuses the virtualenv .venv by itself; nothing else is needed but python3.
# `make test` also makes (or reuses) .venv-torchdata, where torchdata >= 0.10 replaces the
# main environment's torchdata 0.9 (they cannot share one), for the tests of that version.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# two stamps: the demo needs the runtime (torch, dill, tqdm) and numpy; the tests need the dev set.
# The full install also makes the demo's stamp, and a demo-only venv is upgraded by `make test`.
DEMO_STAMP := $(VENV)/.installed-runtime
STAMP      := $(VENV)/.installed
TD_VENV  ?= .venv-torchdata
TD_STAMP := $(TD_VENV)/.installed
# An editable install that type checkers can follow: a static .pth entry instead of
# setuptools' default import hook, which mypy and pyright cannot see through.
EDITABLE := --config-settings editable_mode=compat -e
# The index torch is installed from: pip's own (PyPI unless pip is configured otherwise) when
# unset. Which build that is depends on the index: PyPI serves a CUDA build on Linux x86-64 and
# a CPU build on macOS and Windows. Choose one, e.g.
#   make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH_INDEX_URL ?=
TORCH_INDEX := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
# the distribution's former name (an older checkout installed it as `snapshot`): removed first,
# so that one installation provides the package
UNINSTALL_OLD = -m pip uninstall --quiet -y snapshot >/dev/null 2>&1 || true

.PHONY: demo test lint typecheck unit unit-torchdata bench docs venv clean

# torch first, then everything with torch pinned: pip must never replace the CPU build
$(DEMO_STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "torch==2.13.0" $(TORCH_INDEX)
	$(BIN)/python $(UNINSTALL_OLD)
	$(BIN)/python -m pip install --quiet "torch==2.13.0" $(EDITABLE) ".[demo]"
	touch $(DEMO_STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "torch==2.13.0" $(TORCH_INDEX)
	$(BIN)/python $(UNINSTALL_OLD)
	$(BIN)/python -m pip install --quiet "torch==2.13.0" $(EDITABLE) ".[dev]"
	touch $(DEMO_STAMP) $(STAMP)

$(TD_STAMP): setup.py
	$(PYTHON) -m venv $(TD_VENV)
	$(TD_VENV)/bin/python -m pip install --quiet "torch==2.13.0" $(TORCH_INDEX)
	$(TD_VENV)/bin/python $(UNINSTALL_OLD)
	$(TD_VENV)/bin/python -m pip install --quiet "torch==2.13.0" $(EDITABLE) ".[dev-torchdata-nodes]"
	touch $(TD_STAMP)

venv: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check snapshot tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy snapshot

# two pytest processes, each test file whole in one (--dist loadfile: a file's fixtures are set up once),
# the longest files first (tests/conftest.py's LONGEST_FIRST; xdist would start the files with most tests first)
unit: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# torchdata >= 0.10: StatefulDataLoader and torchdata.nodes (tests/torchdata_new is skipped in .venv)
unit-torchdata: $(TD_STAMP)
	$(TD_VENV)/bin/python -m pytest -p no:cacheprovider tests/torchdata_new tests/integrations/test_torchdata.py

test: lint typecheck unit unit-torchdata

bench: $(STAMP)
	$(BIN)/python -m benchmarks all

# NO_MKDOCS_2_WARNING: mkdocs-material's end-of-life notice, printed on every build, is news, not a problem
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(TD_VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
