# The two commands of the README, plus lint. Everything installs into .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench mutants screenshots

# The demo is a distribution of its own (examples/demo), installed beside the library: the
# tests run it and make lint checks it, so every target has it.
$(STAMP): pyproject.toml examples/demo/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all,dev]' -e examples/demo
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/loomflow-demo

test: $(STAMP)
	dev/test.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) -m bench.checkpoints

# mutation testing of one file on the offline tests that exercise it (RELIABILITY.md):
# make mutants FILE=loomflow/projections/fold.py [TESTS="tests/... tests/..."]
mutants: $(STAMP)
	$(PY) dev/mutants.py $(FILE) $(TESTS)

# the console's screenshots in docs/ (README), taken of the real pages by their test
screenshots: $(STAMP)
	dev/chromium.sh >/dev/null
	LOOMFLOW_SCREENSHOTS=docs $(PY) -m pytest -q tests/ui/test_browser.py -k screenshots
