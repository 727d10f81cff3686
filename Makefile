# `make run`: set up and run the main job (`calo run`: dvc.yaml's stages as a Prefect flow, then
# each target's promotion and the summary) on the embedded default.
# `make test`: set up and run the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1

.PHONY: setup run test lint

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -m calo.native
	touch $@

run: setup
	$(BIN)/calo run

# Two workers, one per core of CI (one pytest process leaves the second mostly idle), each
# taking whole test files: each worker builds the session's tiny pipeline for its own files.
test: setup
	$(BIN)/pytest -q -n 2 --dist loadfile

lint: setup
	$(BIN)/ruff check .
