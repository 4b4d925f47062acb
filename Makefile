# voxpipe: every target goes through the same `voxpipe` CLI and params.yaml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# dvc.yaml's stages call `voxpipe` and `torchrun`: the venv's, wherever make is run from
DVC := PATH="$(abspath $(BIN)):$$PATH" DVC_NO_ANALYTICS=1 $(BIN)/dvc
# the figures `make demo` shows (`dvc metrics show`: all of eval.json and mfu.json)
HEADLINE := 'Experiment|train.lr$$|train.max_steps$$|loss_model$$|loss_baseline$$|speaker_similarity_mean$$|stop_failure_rate$$|^wer$$|^mfu$$|tokens_per_s_per_device$$'

.PHONY: help install test lint demo repro compile images mlflow-ui clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,cluster,eval,pipeline]'
	$(BIN)/pip install --quiet --no-deps voxcpm==2.0.3  # parity reference for tests only
	$(BIN)/pip install --quiet --no-deps resemblyzer==0.1.4  # GE2E speaker encoder; its deps: the eval extra
	touch $(STAMP)

install: $(STAMP)  ## create .venv: voxpipe, its dev tools, DVC and the KFP SDK

lint: $(STAMP)  ## ruff over the code, hadolint over images/
	$(BIN)/ruff check voxpipe components pipelines tests benchmarks data/sample
	$(BIN)/hadolint images/Dockerfile.*

test: lint  ## ruff + the whole pytest suite
	$(BIN)/pytest -q

demo: $(STAMP)  ## dvc repro on the shipped sample, tiny model, 2 CPU processes; then where the results are
	@start=$$(date +%s); $(DVC) repro && echo "dvc repro took $$(( $$(date +%s) - start )) s"
	@echo; $(DVC) exp show --md --drop ".*" --keep $(HEADLINE)
	@$(BIN)/python -c 'import json; r = json.load(open("work/register/registered.json")); \
	print("\nregistered:", r["model_uri"], " ".join("@" + a for a in r["aliases"]), "- MLflow run", r["run_id"])'
	@echo "samples: work/eval/samples/*.wav, work/eval/eval.png; MFU: work/mfu/mfu.md"
	@echo "loss curves: $(BIN)/dvc plots show, then open dvc_plots/index.html"
	@echo "MLflow UI: make mlflow-ui, then open http://127.0.0.1:5000 (runs, metrics, audio, the model registry)"

repro: $(STAMP)  ## dvc repro: rerun the stages whose code, data or params changed
	$(DVC) repro

compile: $(STAMP)  ## compile the Kubeflow pipeline to pipelines/finetune.yaml (commit it)
	$(BIN)/python -m pipelines.finetune pipelines/finetune.yaml

images:  ## docker build the cpu, cuda and npu images (needs a container engine)
	for device in cpu cuda npu; do \
	  docker build -f images/Dockerfile.$$device -t voxpipe:$(VERSION)-$$device . || exit 1; \
	done

mlflow-ui: $(STAMP)  ## MLflow UI over the local runs and registry (work/mlflow.db) on port 5000
	$(BIN)/mlflow ui --backend-store-uri sqlite:///work/mlflow.db --host 127.0.0.1 --port 5000

clean:  ## remove the venv, the work folder and DVC's cache of it
	rm -rf $(VENV) work dvc_plots .dvc/cache .dvc/tmp
