# voxpipe: every target goes through the same `voxpipe` CLI and params.yaml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# dvc.yaml's stages call `voxpipe` and `torchrun`: the venv's, wherever make is run from
DVC := PATH="$(abspath $(BIN)):$$PATH" DVC_NO_ANALYTICS=1 $(BIN)/dvc
# the figures `make demo` shows (`dvc metrics show`: all of eval.json and mfu.json)
# pytest workers (pytest-xdist): the 2 cores CI has (a third worker made the longest modules, the critical
# path, slower). test-fast steals work between them; test keeps a module on one worker, so a module's
# training-run fixture is built once, longest modules first (tests/conftest.py)
PYTEST_WORKERS ?= 2
HEADLINE := 'Experiment|train.lr$$|train.max_steps$$|loss_model$$|loss_baseline$$|similarity_to_speaker_mean$$|similarity_gain$$|stop_failure_rate$$|^wer$$|^mfu$$|^tokens_per_s$$'

# RECIPE=NAME (demo, repro, compile): recipes/NAME.yaml layered on params.yaml. For DVC it is written into
# params.yaml first, so `dvc repro` tracks every value it sets (`git diff params.yaml` shows them,
# `git checkout params.yaml` undoes it).
RECIPE ?=
APPLY_RECIPE := $(if $(RECIPE),$(BIN)/voxpipe params --recipe $(RECIPE) --write params.yaml,@true)

.PHONY: help install test test-fast lint generate generate-check record demo demo-raw sweep repro compile images image-test mlflow-ui clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# the committed pins (images/constraints.txt) hold here too, so a fresh venv is the one the suite and the
	# images ran with, whatever PyPI serves that day; a dependency not pinned yet resolves and `make generate` pins it
	$(BIN)/pip install --quiet --constraint images/constraints.txt -e '.[dev,cluster,eval,pipeline]'
	$(BIN)/pip install --quiet --no-deps voxcpm==2.0.3  # parity reference for tests only
	$(BIN)/pip install --quiet --no-deps resemblyzer==0.1.4  # GE2E speaker encoder; its deps: the eval extra
	touch $(STAMP)

install: $(STAMP)  ## create .venv: voxpipe, its dev tools, DVC and the KFP SDK

lint: $(STAMP)  ## ruff over the code, the import layers (pyproject's import-linter contracts), hadolint over images/
	$(BIN)/ruff check voxpipe components pipelines tests benchmarks tools data/sample
	$(BIN)/lint-imports
	$(BIN)/hadolint images/Dockerfile

generate: $(STAMP)  ## rewrite every committed generated file that is stale (tools/generate.py lists them)
	$(BIN)/python tools/generate.py

generate-check: $(STAMP)  ## fail, in one line, when a committed generated file is stale
	@$(BIN)/python tools/generate.py --check

record: $(STAMP)  ## BENCH=NAME [ARGS="..."]: run benchmarks/NAME.py, keep its JSON as benchmarks/results/NAME.json, regenerate docs/measurements.md
	$(BIN)/python benchmarks/$(BENCH).py $(ARGS) \
	  | $(BIN)/python tools/measurements.py record $(BENCH) --command 'benchmarks/$(BENCH).py $(ARGS)'
	$(BIN)/python tools/generate.py

test: lint generate-check  ## ruff + the generated files + the whole pytest suite
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile

test-fast: generate-check  ## the inner loop: ruff + the generated files + every test not marked slow (no dvc repro, kfp.local, server, torchrun)
	$(BIN)/ruff check voxpipe components pipelines tests benchmarks tools data/sample
	$(BIN)/lint-imports
	$(BIN)/pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist worksteal

demo: $(STAMP)  ## dvc repro on the shipped sample, tiny model, 2 CPU processes; then where the results are
	$(APPLY_RECIPE)
	@start=$$(date +%s); $(DVC) repro && echo "dvc repro took $$(( $$(date +%s) - start )) s"
	@echo; $(DVC) exp show --md --drop ".*" --keep $(HEADLINE)
	@$(BIN)/python -c 'import json; r = json.load(open("work/register/registered.json")); \
	print("\nregistered:", r["model_uri"], " ".join("@" + a for a in r["aliases"]), "- MLflow run", r["run_id"])'
	@echo "samples: work/eval/samples/*.wav, work/eval/eval.png; MFU: work/mfu/mfu.md"
	@echo "blind listening test: work/eval/listen.html, then voxpipe listen-record --answers FILE (docs/evaluation.md)"
	@echo "loss curves: $(BIN)/dvc plots show, then open dvc_plots/index.html"
	@echo "MLflow UI: make mlflow-ui, then open http://127.0.0.1:5000/#/experiments?workflowType=machine_learning (runs, metrics, audio, the model registry)"

demo-raw: $(STAMP)  ## the demo from raw recordings: long sessions from the sample, cut at pauses, the other voice set aside, transcribed (pocketsphinx), trained
	$(BIN)/python data/sample/make_sessions.py work/sessions
	$(MAKE) demo RECIPE=demo-raw
	@echo; echo "against the script: $$($(BIN)/python data/sample/make_sessions.py --score work/sessions/spk_m work/ingest)"

# GRID reaches tools/sweep.py as data: in the environment, unexpanded ($(value)), never in a shell line; exec
# makes make its parent, so a killed make stops it (tools/sweep.py: PR_SET_PDEATHSIG)
unexport GRID YES  # make would expand them (a `$(shell ...)` in them run) to put them in every recipe's env
sweep: export VOXPIPE_SWEEP_GRID = $(value GRID)
sweep: $(STAMP)  ## GRID="train.lr=5e-5,1e-4 train.lora.r=16,32" [YES=1 past 16 points]: one DVC experiment per point, then the best registered (tools/sweep.py)
	PATH="$(abspath $(BIN)):$$PATH" exec $(BIN)/python tools/sweep.py --grid-env VOXPIPE_SWEEP_GRID $(if $(value YES),--yes)

repro: $(STAMP)  ## dvc repro: rerun the stages whose code, data or params changed (RECIPE=NAME: a recipe)
	$(APPLY_RECIPE)
	$(DVC) repro

compile: $(STAMP)  ## compile the Kubeflow pipeline to pipelines/finetune.yaml (RECIPE=NAME: work/finetune-NAME.yaml)
	$(BIN)/python -m pipelines.finetune $(if $(RECIPE),--recipe $(RECIPE) work/finetune-$(RECIPE).yaml,pipelines/finetune.yaml)

images:  ## docker build the cpu, cuda and npu images from images/Dockerfile (needs a container engine)
	for device in cpu cuda npu; do \
	  docker build -f images/Dockerfile --build-arg DEVICE=$$device \
	    --build-arg VOXPIPE_GIT_COMMIT=$$(git rev-parse HEAD) -t voxpipe:$(VERSION)-$$device . || exit 1; \
	done

image-test: $(STAMP)  ## build the cpu image with buildah (no engine needed), run the steps inside it
	@start=$$(date +%s); images/buildah-build.sh cpu voxpipe:$(VERSION)-cpu \
	  && echo "image build took $$(( $$(date +%s) - start )) s"
	@buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' localhost/voxpipe:$(VERSION)-cpu
	VOXPIPE_IMAGE=localhost/voxpipe:$(VERSION)-cpu $(BIN)/pytest -q --durations=0 tests/test_image.py

mlflow-ui: $(STAMP)  ## MLflow UI over the local runs and registry (work/mlflow.db) on port 5000
	$(BIN)/mlflow ui --backend-store-uri sqlite:///work/mlflow.db --host 127.0.0.1 --port 5000

clean:  ## remove the venv, the work folder and DVC's cache of it
	rm -rf $(VENV) work dvc_plots .dvc/cache .dvc/tmp
