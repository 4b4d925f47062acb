# voxpipe: every target goes through the same `voxpipe` CLI and params.yaml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help install test lint demo clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,cluster]'
	$(BIN)/pip install --quiet --no-deps voxcpm==2.0.3  # parity reference for tests only
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install voxpipe with its dev tools

lint: $(STAMP)  ## ruff over the code, hadolint over images/
	$(BIN)/ruff check voxpipe tests benchmarks data/sample
	$(BIN)/hadolint images/Dockerfile.*

test: lint  ## ruff + the whole pytest suite
	$(BIN)/pytest -q

demo: $(STAMP)  ## run the pipeline on the shipped sample with the tiny model
	$(BIN)/voxpipe ingest
	$(BIN)/voxpipe manifest

clean:  ## remove the venv and the work folder
	rm -rf $(VENV) work
