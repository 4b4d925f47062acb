"""The fanned-out ingest under kfp.local: the pipeline's own components (plan → one task per shard in a
`dsl.ParallelFor` → merge over `dsl.Collected`) write the raw.jsonl a single `voxpipe ingest` writes."""

# no `from __future__ import annotations`: KFP reads the pipeline's annotations at import time
import hashlib
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kfp import dsl, local

from tests.test_ingest import SAMPLE
from voxpipe.data.ingest_step import ingest
from voxpipe.lineage import dvc_md5
from voxpipe.steps.ingest import IngestParams

pytestmark = [
    pytest.mark.slow,  # the pipeline under kfp.local
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:.*have no effect in the current local runner:UserWarning"),
]


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_fanned_out_ingest_under_kfp_local_matches_a_single_ingest(tmp_path, monkeypatch):
    from pipelines import common as pipeline  # here, not at collection: KFP builds graphs when decorating

    @dsl.pipeline
    def fanned_out_ingest(workspace: str, data_version: str, params: dict) -> dsl.Dataset:
        """The pipeline's ingest tasks alone."""
        return pipeline.fan_out_ingest(workspace, data_version, params)[2].outputs["data"]

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    workspace = tmp_path / "workspace"
    data = workspace / "datasets" / "sample"
    data.mkdir(parents=True)
    rows = pq.read_table(sorted(SAMPLE.glob("*.parquet"))[0]).slice(0, 8)
    pq.write_table(rows, data / "train.parquet", row_group_size=2)  # 4 row groups: room for 2 shards
    shutil.copy(SAMPLE / "voices.yaml", data)  # the voices' consent records, read by the plan task
    with monkeypatch.context() as m:  # in the workspace, as the tasks run: raw.jsonl names inputs as given
        m.chdir(workspace)
        single = ingest(IngestParams(input=["datasets/sample"], out=str(tmp_path / "single"), workers=1))
    params = {**pipeline.DICT_DEFAULTS["ingest"], "input": ["datasets/sample"], "workers": 1, "shards": 2}
    run = fanned_out_ingest(workspace=str(workspace), data_version=dvc_md5(data), params=params)
    merged = Path(run.output.metadata["path"])
    assert md5(merged / "raw.jsonl") == md5(tmp_path / "single" / "raw.jsonl")
    assert run.output.metadata["data_version"] == dvc_md5(data)
    shards = sorted(p.name.rsplit("-", 1)[0] for p in (workspace / "voxpipe").iterdir() if p.is_dir())
    assert shards == ["ingest", "ingest-plan", "ingest-shard", "ingest-shard"]  # two shard tasks ran
    assert single.rows_kept == 8
    assert (merged / "report.json").read_bytes() == (tmp_path / "single" / "report.json").read_bytes()
    # the data report: the merge's page equals a single run's, and the task hands it to the UI as HTML
    page = (tmp_path / "single" / "data-report.html").read_bytes()
    assert (merged / "data-report.html").read_bytes() == page
    shown = [f for f in (tmp_path / "kfp").rglob("report") if f.is_file()]
    assert [f.read_bytes() for f in shown] == [page]

