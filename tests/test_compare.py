"""`voxpipe compare`'s table on MLflow's own run entities (no server: the rows a search returns): which
columns it keeps, its order, val sets kept apart, wide tables wrapped. The end-to-end check on real
registered runs (and compare.html in Chromium) is in tests/test_track.py."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag

from voxpipe.track.compare import WIDTH, build_rows, differing_settings, render
from voxpipe.track.headline import VAL_SET_TAG, VERDICT_TAG, recipe_changes, verdict_line

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, params: dict[str, str], metrics: dict[str, float], verdict: str | None,
        val_set: str = "v1") -> Run:
    tags = {"mlflow.runName": name, VAL_SET_TAG: val_set, **({VERDICT_TAG: verdict} if verdict else {})}
    info = RunInfo(run_id=f"{name:0<32}", experiment_id="1", user_id="u", status="FINISHED", start_time=0,
                   end_time=1, lifecycle_stage="active", run_name=name)
    data = RunData(metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                   params=[Param(k, v) for k, v in params.items()],
                   tags=[RunTag(k, v) for k, v in tags.items()])
    return Run(info, data)


COMMON = {"train.max_steps": "40", "train.out": "work/train",
          "data.version": "d41d8cd98f00b204e9800998ecf8427e.dir"}


def test_only_the_settings_that_differ_and_no_paths_ids_or_results():
    runs = [{**COMMON, "train.lr": "0.0001", "train.out": "work/a", "evaluate.whisper_model": "models/w-a",
             "evaluate.wavlm_model": "0123456789abcdef01", "data.rows_kept": "60", "run.world_size": "1"},
            {**COMMON, "train.lr": "0.0003", "train.out": "work/b", "evaluate.whisper_model": "models/w-b",
             "evaluate.wavlm_model": "fedcba9876543210ff", "data.rows_kept": "64", "run.world_size": "2"}]
    # an output path, a path-valued and a hash-valued setting, a data count and the devices: none is a column
    assert differing_settings(runs) == ["train.lr"]


def test_rows_sort_by_verdict_then_loss_with_the_verdict_and_error_rates():
    promote, reject = "PROMOTE (against baseline)", "do not promote (against baseline)"
    runs = [run("worse", {"train.lr": "1e-3"}, {"val_loss": 1.5, "similarity": 0.5}, reject),
            run("best", {"train.lr": "1e-4"}, {"val_loss": 1.2, "similarity": 0.7, "wer": 0.3}, promote),
            run("good", {"train.lr": "3e-4"}, {"val_loss": 1.1, "similarity": 0.6}, reject),
            run("unjudged", {"train.lr": "5e-4"}, {"val_loss": 1.0}, None)]
    rows = build_rows(runs)
    assert [r["run"] for r in rows] == ["best", "good", "worse", "unjudged"]
    assert list(rows[0]) == ["run", "id", "train.lr", "val_loss", "similarity", "wer", "verdict", "val_set"]
    assert rows[0]["wer"] == 0.3 and rows[1]["wer"] is None  # a figure some run has stays, '-' elsewhere
    table = render(rows, "table")
    header = ["run", "id", "train.lr", "val_loss", "similarity", "wer", "verdict"]
    assert table.splitlines()[0].split() == header
    assert "val_set" not in table and "v1" not in table  # one val set: nothing to say


def test_runs_scored_on_different_val_sets_are_grouped_and_said_so():
    runs = [run("a", {"train.lr": "1e-4"}, {"val_loss": 1.2}, "PROMOTE (against baseline)", "v1"),
            run("b", {"train.lr": "2e-4"}, {"val_loss": 0.9}, "PROMOTE (against baseline)", "v2"),
            run("c", {"train.lr": "3e-4"}, {"val_loss": 1.1}, "PROMOTE (against baseline)", "v1")]
    rows = build_rows(runs)
    assert [(r["run"], r["val_set"]) for r in rows] == [("b", "v2"), ("c", "v1"), ("a", "v1")]
    table = render(rows, "table")
    assert table.startswith("these runs were scored on 2 different val sets")
    assert "val set v2 (1 runs)" in table and "val set v1 (2 runs)" in table
    markdown = render(rows, "markdown")
    assert markdown.count("| run | id | train.lr |") == 2  # one table per val set
    parsed = list(csv.DictReader(io.StringIO(render(rows, "csv"))))
    assert [r["val_set"] for r in parsed] == ["v2", "v1", "v1"]
    assert [r["val_set"] for r in json.loads(render(rows, "json"))] == ["v2", "v1", "v1"]


def test_a_wide_table_wraps_into_blocks_that_start_with_the_run():
    keys = ["train.clip_norm", "train.dtype", "train.export_dtype", "train.grad_accum", "train.lora.alpha",
            "train.lora.dropout", "train.lora.r", "train.lr", "train.max_steps", "train.max_tokens",
            "train.min_lr", "train.seed", "train.warmup_steps", "train.weight_decay"]
    runs = [run(name, {k: f"{value}-{k}" for k in keys}, {"val_loss": 1.0}, None)
            for name, value in (("a", "one"), ("b", "two"))]
    rows = build_rows(runs)
    table = render(rows, "table")
    lines = table.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    headers = [line for line in lines if line.startswith("run ")]
    assert len(headers) > 1 and all(h.split()[:2] == ["run", "id"] for h in headers)
    assert all(k in table for k in keys)
    assert len(render(rows, "csv").splitlines()) == 3  # csv: a run per line, however wide


def test_verdict_line_and_the_chosen_settings():
    figures = {"promotion": {"promoted": False, "against": "champion v2", "criteria": [
        {"name": "loss", "passed": True}, {"name": "similarity[spk]", "passed": False}]}}
    assert verdict_line(figures) == "do not promote (against champion v2): fails similarity[spk]"
    assert verdict_line({}) == "no verdict in eval.json"
    defaults = {"train.lr": "1e-05", "train.out": "work/train", "train.seed": "0"}
    logged = {"train.lr": "0.0003", "train.out": "work/other", "train.seed": "0", "data.rows_kept": "64"}
    assert recipe_changes(logged, defaults) == {"set.train.lr": "0.0003"}  # paths and results are no choice


def test_samples_are_named_by_the_val_text_on_what_evaluate_writes(tmp_path):
    """On the demo's committed eval.json (evaluate's own output, exports of step-N): each sample of the
    chosen export gets the name of its val row and condition, one name per sample; none of the baseline's
    or of another export's. A single checkpoint's samples are evaluate's `model-...`."""
    from dataclasses import replace

    from voxpipe.track.artifacts import PipelineArtifacts
    from voxpipe.track.record import audio_by_text

    figures = json.loads((ROOT / "work/eval/eval.json").read_text())
    records = figures["utterances"]["model"]
    step = figures["chosen"]["step"]
    assert isinstance(step, int)  # the demo scores the exports of train.export_every
    tags = (f"step-{step}", f"step-{step + 1}", "baseline")
    samples = [tmp_path / f"{tag}-{r['name']}.wav" for r in records for tag in tags]
    art = PipelineArtifacts(export=tmp_path, export_md5="", model_config={}, train_dir=tmp_path,
                            train_report={}, metrics=[], eval_path=tmp_path / "eval.json", eval=figures,
                            samples=samples, mfu_path=tmp_path, mfu={}, data=None)
    named = audio_by_text(art)
    assert len(named) == len(records) == 8
    assert all(p.name.startswith(f"step-{step}-") for p in named.values())
    first = records[0]
    assert named[f"{first['row_id']}-ref.wav"].name == f"step-{step}-{first['name']}.wav"
    one = {**figures, "chosen": {**figures["chosen"], "step": None, "tag": "model"}}  # one checkpoint
    single = replace(art, eval=one, samples=[tmp_path / f"model-{r['name']}.wav" for r in records])
    assert sorted(audio_by_text(single)) == sorted(named)
    assert audio_by_text(replace(art, eval={})) == {}  # an eval.json without utterances: nothing renamed
