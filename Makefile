# `make run`: set up and run the main job (dvc repro) on the embedded default.
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
	touch $@

run: setup
	$(BIN)/dvc repro dvc.yaml
	$(BIN)/dvc metrics show

test: setup
	$(BIN)/pytest -q

lint: setup
	$(BIN)/ruff check .
