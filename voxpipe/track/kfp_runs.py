"""Runs that nest as Kubeflow Pipelines' MLflow plugin nests them (KEP-12862).

With the plugin on, KFP's API server makes one MLflow run per pipeline run, tagged
`kfp.pipeline_run_id`; its driver makes a nested run (`mlflow.parentRunId`) for each task and each
loop iteration (iterations under their loop's run) and gives the task's container
`MLFLOW_TRACKING_URI`, `MLFLOW_WORKSPACE` and `MLFLOW_RUN_ID`, the id of *that task's* nested run. So
train, evaluate and register each see a different `MLFLOW_RUN_ID`, and each logs into its own run.

voxpipe tells the plugin's id from another orchestrator's by the run's ancestry (a run above it
tagged `kfp.pipeline_run_id`) or by `MLFLOW_WORKSPACE`. The model version then links to register's
nested run, which carries the lineage and every artifact (the loss curves from metrics.jsonl, the eval
figures, the samples: record.py), and is tagged with the other runs of the pipeline run: train's live
run, the pipeline's run and KFP's run id (docs/cluster.md). Without the plugin nothing here applies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

KFP_RUN_TAG = "kfp.pipeline_run_id"  # KFP's API server tags the pipeline's own MLflow run with it
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests a run under it
TRAIN_RUN_TAG = "voxpipe.kfp.train_run"  # on register's run: train's nested run (the live curves)
PIPELINE_RUN_TAG = "voxpipe.kfp.pipeline_run"  # on register's run: the pipeline's MLflow run
REGISTERED_IN_TAG = "voxpipe.kfp.registered_in"  # on train's run: the run the model version links to
MAX_DEPTH = 4  # task -> (iteration ->) loop -> pipeline: the driver's deepest chain, and then some


@dataclass(frozen=True)
class KfpTask:
    """This task's nested run under KFP's plugin, and the pipeline run it belongs to."""

    run_id: str
    pipeline_run: str | None  # the MLflow run tagged kfp.pipeline_run_id (None: not found above)
    kfp_run_id: str | None  # that tag's value


def kfp_task(client: MlflowClient) -> KfpTask | None:
    """The plugin's task run when $MLFLOW_RUN_ID is one, else None (no id, or another orchestrator's)."""
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        return None
    pipeline = _pipeline_ancestor(client, client.get_run(run_id))
    if pipeline is None and not os.environ.get("MLFLOW_WORKSPACE"):
        return None
    return KfpTask(run_id, pipeline.info.run_id if pipeline else None,
                   pipeline.data.tags[KFP_RUN_TAG] if pipeline else None)


def _pipeline_ancestor(client: MlflowClient, run: Run) -> Run | None:
    for _ in range(MAX_DEPTH):
        parent = run.data.tags.get(PARENT_TAG)
        if not parent:
            return None
        run = client.get_run(parent)
        if KFP_RUN_TAG in run.data.tags:
            return run
    return None


def link_task_runs(client: MlflowClient, task: KfpTask, trained_in: str | None) -> None:
    """Register's nested run points at the others of its pipeline run, and train's back at it."""
    if trained_in and trained_in != task.run_id:
        client.set_tag(task.run_id, TRAIN_RUN_TAG, trained_in)
        client.set_tag(trained_in, REGISTERED_IN_TAG, task.run_id)
    if task.pipeline_run:
        client.set_tag(task.run_id, PIPELINE_RUN_TAG, task.pipeline_run)
        client.set_tag(task.run_id, KFP_RUN_TAG, task.kfp_run_id or "")


def pipeline_tree(client: MlflowClient, experiment_ids: list[str], kfp_run_id: str) -> list[Run]:
    """Every run of one KFP pipeline run: the run tagged with its id and all runs nested below it
    (tasks, loops, iterations), parents before children."""
    quoted = kfp_run_id.replace("'", "")
    roots = client.search_runs(experiment_ids, filter_string=f"tags.`{KFP_RUN_TAG}` = '{quoted}'",
                               max_results=1000)
    roots = [r for r in roots if PARENT_TAG not in r.data.tags]  # the pipeline's own run, not register's
    found, frontier = list(roots), [r.info.run_id for r in roots]
    for _ in range(MAX_DEPTH):
        nested = [r for parent in frontier for r in client.search_runs(
            experiment_ids, filter_string=f"tags.`{PARENT_TAG}` = '{parent}'", max_results=1000)]
        if not nested:
            break
        found += nested
        frontier = [r.info.run_id for r in nested]
    return found
