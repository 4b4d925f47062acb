"""The KFP sweep (pipelines/sweep.py) under kfp.local: a module of its own, so that pytest-xdist's
loadfile schedule can run it beside test_kfp.py's whole-pipeline run instead of after it."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient
from test_kfp import small_run

pytestmark = [
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning"),
]


@pytest.mark.slow
def test_sweep_runs_under_kfp_local_one_encode_a_child_per_point_and_only_the_best_registered(local_runner):
    """pipelines/sweep.py on the demo: two learning rates, one ingest and encode for both."""
    from pipelines import sweep

    args = small_run(local_runner, "kfp-sweep")
    workspace, tracking = Path(args["workspace"]), args["mlflow_tracking_uri"]
    run = sweep.sweep_pipeline()(grid=["train.lr=1e-4,3e-4"], **args)
    best = run.output.metadata
    assert best["children"] == 2
    client = MlflowClient(tracking)
    experiment = client.get_experiment_by_name("kfp-sweep").experiment_id
    parent = client.get_run(best["best_run"]).data.tags["mlflow.parentRunId"]
    children = client.search_runs([experiment], f"tags.`mlflow.parentRunId` = '{parent}'")
    assert sorted(r.data.tags["sweep.train.lr"] for r in children) == ["0.0001", "0.0003"]
    assert client.get_run(parent).data.tags["voxpipe.sweep_best"] == best["best_run"]
    versions = client.search_model_versions(f"name='{best['name']}'")
    assert [v.run_id for v in versions] == [best["best_run"]]  # only the best is a model version
    folders = [p.name.rsplit("-", 1)[0] for p in (workspace / "voxpipe").iterdir() if p.is_dir()]
    assert folders.count("encode") == 1 and folders.count("ingest") == 1  # reused by both points
    assert folders.count("train") == 2 and folders.count("register") == 2
