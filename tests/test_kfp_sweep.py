"""The KFP sweep (pipelines/sweep.py) under kfp.local: a module of its own, so that pytest-xdist's
loadfile schedule can run it beside test_kfp.py's whole-pipeline run instead of after it."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from small_sample import write_small_sample
from test_kfp import SMALL

from pipelines import finetune as pipeline
from voxpipe.lineage import dvc_md5

pytestmark = [
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning"),
]


@pytest.mark.slow
def test_sweep_runs_under_kfp_local_one_encode_a_child_per_point_and_only_the_best_registered(local_runner):
    """pipelines/sweep.py on the demo: two learning rates, one ingest and encode for both."""
    from pipelines import sweep

    workspace = local_runner / "workspace"
    data = write_small_sample(workspace / "datasets" / "sample", per_speaker=6)
    tracking = f"sqlite:///{local_runner / 'mlflow.db'}"
    run = sweep.sweep_pipeline()(
        data_version=dvc_md5(data),
        grid=["train.lr=1e-4,3e-4"],
        workspace=str(workspace),
        launch_backend="in-task",
        ingest={**pipeline.INGEST, "input": ["datasets/sample"], "workers": 1},
        encode={**pipeline.ENCODE, "device": "cpu"},
        train={**pipeline.TRAIN, **SMALL["train"]},
        evaluate={**pipeline.EVALUATE, **SMALL["evaluate"]},
        tracking={**pipeline.TRACKING, "experiment": "kfp-sweep"},
        mlflow_tracking_uri=tracking,
    )
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
