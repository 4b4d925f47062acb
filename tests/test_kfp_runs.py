"""Issue 47 part 1: runs that nest as KFP's MLflow plugin nests them (KEP-12862), against a real MLflow
server. The test plays KFP's part as its API server and driver do: a pipeline run tagged
`kfp.pipeline_run_id`, a nested run per task (`mlflow.parentRunId`), and per task the variables the
driver sets (MLFLOW_TRACKING_URI, MLFLOW_WORKSPACE, MLFLOW_RUN_ID = that task's run). train and
register then run for real, each with its own task's environment."""

from __future__ import annotations

import json
import os
import time

import pytest
from mlflow import MlflowClient
from test_track import LIVE_SETTINGS, SECRETS, pipeline_runs, run_register, write_eval, write_mfu

from voxpipe.cli import main
from voxpipe.params import Params
from voxpipe.steps.train import TrainParams
from voxpipe.track.kfp_runs import (
    KFP_RUN_TAG,
    PARENT_TAG,
    PIPELINE_RUN_TAG,
    REGISTERED_IN_TAG,
    TRAIN_RUN_TAG,
    kfp_task,
)
from voxpipe.track.live import LiveRun
from voxpipe.track.reglock import LOCK_TAG
from voxpipe.track.sweep import SWEEP_PARENT_TAG, children, sweep_open
from voxpipe.train.loop import train

EXPERIMENT = "voxpipe-kfp"
WORKSPACE = "default"  # KFP maps the namespace to an MLflow workspace; the server's own first one here
KFP_RUN = "5f0c2a8e-kfp-run"


class FakeKfp:
    """What KFP's API server and driver do with the plugin on: the pipeline's run, then per task a nested
    run and that task's environment."""

    def __init__(self, client: MlflowClient, server: str, monkeypatch: pytest.MonkeyPatch):
        self.client, self.server, self.mp = client, server, monkeypatch
        found = client.get_experiment_by_name(EXPERIMENT)
        self.experiment = found.experiment_id if found else client.create_experiment(EXPERIMENT)
        self.root = client.create_run(self.experiment, run_name="finetune",
                                      tags={KFP_RUN_TAG: KFP_RUN}).info.run_id

    def task(self, name: str, under: str | None = None, workspace: str | None = WORKSPACE) -> str:
        run = self.client.create_run(self.experiment, run_name=name,
                                     tags={PARENT_TAG: under or self.root}).info.run_id
        self.mp.setenv("MLFLOW_TRACKING_URI", self.server)
        self.mp.setenv("MLFLOW_RUN_ID", run)
        if workspace:
            self.mp.setenv("MLFLOW_WORKSPACE", workspace)
        else:
            self.mp.delenv("MLFLOW_WORKSPACE", raising=False)
        return run


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real MLflow server with workspaces on, as KFP's plugin expects (MLflow >= 3.10)."""
    from servers import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow_ws"), "--enable-workspaces") as uri:
        yield uri


@pytest.fixture
def kfp(server, monkeypatch):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    return FakeKfp(MlflowClient(server), server, monkeypatch)


def test_each_step_logs_into_its_task_run_and_the_version_reaches_the_training_history(
        kfp, server, encoded_sample, tmp_path):
    client = kfp.client
    train_run = kfp.task("train")
    out = tmp_path / "train"
    train(Params(model={"base": str(encoded_sample.base_model)},
                 tracking={"uri": server, "experiment": EXPERIMENT, "work": str(tmp_path / "work")},
                 train=TrainParams(data=str(encoded_sample.encoded), out=str(out), track=True,
                                   **LIVE_SETTINGS)),
          live=LiveRun)
    report = json.loads((out / "report.json").read_text())
    assert report["mlflow_run_id"] == train_run  # train logged live into its own task's run
    register_run = kfp.task("register")
    files = {"model": str(out / "export"), "train": str(out),
             "eval": str(write_eval(tmp_path / "eval", 1.9, 2.0)),
             "mfu": str(write_mfu(tmp_path / "mfu", 0.01)), "ingest": str(encoded_sample.ingest),
             "out": str(tmp_path / "register"), "work": str(tmp_path / "work")}
    reg = run_register(files, tracking_uri=server, experiment=EXPERIMENT, model_name=EXPERIMENT)
    assert reg["run_id"] == register_run
    # one tree: the pipeline's run on top, the two task runs under it, no extra top-level run
    runs = {r.info.run_id: r for r in pipeline_runs(client, EXPERIMENT)}
    top = [r for r in runs.values() if PARENT_TAG not in r.data.tags]
    assert [r.info.run_id for r in top] == [kfp.root]
    nested = {i for i, r in runs.items() if r.data.tags.get(PARENT_TAG) == kfp.root}
    assert nested == {train_run, register_run}
    # the version links to register's run, which holds the training history and points at the others
    version = client.get_model_version(EXPERIMENT, reg["version"])
    assert version.run_id == register_run
    held = client.get_run(register_run)
    loss = client.get_metric_history(register_run, "loss")
    assert [m.step for m in loss] == list(range(1, LIVE_SETTINGS["max_steps"] + 1))
    assert "eval/loss_model" in held.data.metrics
    artifacts = {a.path for a in client.list_artifacts(register_run)}
    assert {"train", "eval", "plots"} <= artifacts
    assert held.data.tags[TRAIN_RUN_TAG] == train_run and held.data.tags[PIPELINE_RUN_TAG] == kfp.root
    assert held.data.tags[KFP_RUN_TAG] == KFP_RUN
    assert client.get_run(train_run).data.tags[REGISTERED_IN_TAG] == register_run
    # compare --kfp-run lines up that pipeline run's runs: register's carries train's history
    assert main(["compare", "--set", f"compare.kfp_run={KFP_RUN}", "--set", f"tracking.uri={server}",
                 "--set", f"tracking.experiment={EXPERIMENT}", "--set", f"compare.out={tmp_path / 'cmp'}",
                 "--set", "compare.format=json"]) == 0
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [row["id"] for row in rows] == [register_run[:8]]


def test_the_plugin_is_told_by_the_parent_tag_or_the_workspace_and_nothing_else_changes(kfp, monkeypatch):
    client = kfp.client
    assert kfp_task(client) is None  # no MLFLOW_RUN_ID
    task = kfp.task("evaluate", workspace=None)  # told by the pipeline run's tag above it
    found = kfp_task(client)
    assert (found.run_id, found.pipeline_run, found.kfp_run_id) == (task, kfp.root, KFP_RUN)
    loop = kfp.task("for-loop-1")  # an iteration's run nests under its loop's run
    iteration = kfp.task("register", under=loop)
    assert kfp_task(client).run_id == iteration and kfp_task(client).pipeline_run == kfp.root
    # another orchestrator's run: no KFP parent, no workspace -> not the plugin's (today's behaviour)
    other = client.create_run(kfp.experiment).info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", other)
    monkeypatch.delenv("MLFLOW_WORKSPACE")
    assert kfp_task(client) is None
    monkeypatch.setenv("MLFLOW_WORKSPACE", WORKSPACE)
    assert kfp_task(client).run_id == other and kfp_task(client).pipeline_run is None


def test_compare_refuses_a_kfp_run_id_that_is_no_id_and_names_one_with_no_runs(kfp, server, tmp_path, capsys):
    args = ["compare", "--set", f"tracking.uri={server}", "--set", f"tracking.experiment={EXPERIMENT}",
            "--set", f"compare.out={tmp_path}"]
    assert main([*args, "--set", "compare.kfp_run=x' OR 1=1"]) != 0
    assert "is no KFP run id" in capsys.readouterr().err
    assert main([*args, "--set", "compare.kfp_run=no-such-run"]) != 0
    assert "KFP run 'no-such-run' has no runs" in capsys.readouterr().err



def test_sweep_open_under_the_plugin_makes_its_task_run_the_parent_not_a_new_top_level_run(kfp, server,
                                                                                        tmp_path):
    client = kfp.client
    task = kfp.task("sweep-open")
    before = {r.info.run_id for r in client.search_runs([kfp.experiment])}
    params = Params.model_validate({"sweep": {"grid": ["train.lr=1e-4,2e-4"], "out": str(tmp_path)},
                                    "tracking": {"uri": server, "experiment": EXPERIMENT,
                                                 "work": str(tmp_path / "work")}})
    record = sweep_open(params).record
    assert record["parent_run"] == task
    assert {r.info.run_id for r in client.search_runs([kfp.experiment])} == before  # no run made
    # a point's run under its loop iteration, naming the parent: sweep-close and compare find it
    loop = kfp.task("for-loop-2")
    point = client.create_run(kfp.experiment, tags={PARENT_TAG: loop, SWEEP_PARENT_TAG: task}).info.run_id
    assert [r.info.run_id for r in children(client, kfp.experiment, task)] == [point]

# what KFP's driver would do per task, done in the task's own process: sitecustomize runs first in every
# Python process, and a kfp.local task's process names its component function in its argv
SITECUSTOMIZE = '''
import json, os, sys
if "--function_to_execute" in sys.argv:
    runs = json.loads(os.environ.get("VOXPIPE_TEST_KFP_TASK_RUNS", "{}"))
    name = sys.argv[sys.argv.index("--function_to_execute") + 1]
    if name in runs:
        os.environ["MLFLOW_RUN_ID"] = runs[name]
'''
TASKS = ("ingest_plan", "ingest_shard", "ingest_merge", "manifest", "init_model", "validate", "encode",
         "train", "evaluate", "mfu", "register")


@pytest.mark.slow
def test_under_kfp_local_each_task_logs_into_its_nested_run_and_the_version_has_the_lineage(
        server, local_runner, monkeypatch, tmp_path):
    from test_kfp import small_run

    from pipelines import finetune as pipeline

    client = MlflowClient(server)
    started_ms = int(time.time() * 1000)  # the module's other tests share the server: their runs are older
    experiment = client.create_experiment("kfp-plugin")
    root = client.create_run(experiment, run_name="finetune", tags={KFP_RUN_TAG: "local-run"}).info.run_id
    runs = {name: client.create_run(experiment, run_name=name, tags={PARENT_TAG: root}).info.run_id
            for name in TASKS}
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", f"{site}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("VOXPIPE_TEST_KFP_TASK_RUNS", json.dumps(runs))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.setenv("MLFLOW_WORKSPACE", WORKSPACE)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    args = {**small_run(local_runner, "kfp-local-plugin"), "mlflow_tracking_uri": server}
    registered = pipeline.finetune_pipeline()(**args).output.metadata
    version = client.get_model_version(registered["name"], registered["version"])
    assert version.run_id == registered["run_id"] == runs["register"]  # register logged into its task's run
    held = client.get_run(runs["register"])
    assert held.data.tags[PIPELINE_RUN_TAG] == root and held.data.tags[KFP_RUN_TAG] == "local-run"
    assert [m.step for m in client.get_metric_history(runs["register"], "loss")] == [1, 2, 3]  # the history
    assert {"train", "eval", "plots", "data"} <= {a.path for a in client.list_artifacts(runs["register"])}
    # one tree: no run outside it but the register lock's
    everything = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    top = [r.info.run_id for r in everything if PARENT_TAG not in r.data.tags and LOCK_TAG not in r.data.tags
           and r.info.start_time >= started_ms]
    assert top == [root]
