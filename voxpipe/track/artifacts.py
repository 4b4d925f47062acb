"""The pipeline run's outputs on disk, read and checked once before anything is sent to MLflow.

Logging from these files (not live from each step) keeps one writer per MLflow run, makes the
record reproducible from the work folder alone, and lets `register` rerun without duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxpipe.data.jsonl import read_jsonl
from voxpipe.errors import StepError
from voxpipe.files import read_json_object
from voxpipe.lineage import dvc_md5, md5_file
from voxpipe.steps.register import RegisterParams

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")


@dataclass(frozen=True)
class DataLineage:
    folder: Path
    version: str  # DVC md5 of the ingest folder
    report: dict[str, Any]  # the ingest report.json: rows_in, rows_kept, ...
    rows: list[dict[str, Any]]  # raw.jsonl


@dataclass(frozen=True)
class PipelineArtifacts:
    export: Path
    export_md5: str
    model_config: dict[str, Any]
    train_dir: Path
    train_report: dict[str, Any]
    metrics: list[dict[str, Any]]
    eval_path: Path
    eval: dict[str, Any]
    samples: list[Path]
    mfu_path: Path
    mfu: dict[str, Any]
    data: DataLineage | None

    @property
    def train_digest(self) -> str:
        return md5_file(self.train_dir / "report.json") + md5_file(self.train_dir / "metrics.jsonl")

    @property
    def live_run_id(self) -> str | None:
        """The MLflow run the trainer logged into while training (`train.track`), as its report names it."""
        run_id = self.train_report.get("mlflow_run_id")
        return run_id if isinstance(run_id, str) and run_id else None

    @property
    def eval_digest(self) -> str:
        return md5_file(self.eval_path) + "".join(md5_file(s) for s in self.samples)


def _check_metrics(path: Path, rows: list[dict[str, Any]]) -> None:
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get("step"), int):
            raise StepError(f"{path}, line {number}: no integer 'step'")


def _data_lineage(folder: Path) -> DataLineage:
    report = read_json_object(folder / "report.json", "ingest report")
    rows = read_jsonl(folder / "raw.jsonl", "ingest raw.jsonl")
    return DataLineage(folder, dvc_md5(folder), report, rows)


def _export(p: RegisterParams, evaluation: dict[str, Any], eval_path: Path) -> Path:
    """register.model, or (None) the checkpoint evaluate chose: the best of its exports."""
    if p.model:
        return Path(p.model)
    chosen = evaluation.get("chosen")
    if not isinstance(chosen, dict) or not isinstance(chosen.get("path"), str):
        raise StepError(f"{eval_path}: no chosen.path (the checkpoint evaluate judged); set register.model")
    return Path(chosen["path"])


def load_artifacts(p: RegisterParams) -> PipelineArtifacts:
    eval_path = Path(p.eval)
    evaluation = read_json_object(eval_path, "eval.json")
    if not isinstance(evaluation.get("loss_model"), int | float):
        raise StepError(f"{eval_path}: no numeric 'loss_model' (the fine-tuned model's fixed-seed loss)")
    export = _export(p, evaluation, eval_path)
    model_config = read_json_object(export / "config.json", "exported model config.json")
    train_dir = Path(p.train)
    metrics_path = train_dir / "metrics.jsonl"
    metrics = read_jsonl(metrics_path, "training metrics.jsonl")
    _check_metrics(metrics_path, metrics)
    samples_dir = eval_path.parent / "samples"
    samples = sorted(f for f in samples_dir.rglob("*") if f.suffix.lower() in AUDIO_SUFFIXES and f.is_file())
    return PipelineArtifacts(
        export=export,
        export_md5=dvc_md5(export),
        model_config=model_config,
        train_dir=train_dir,
        train_report=read_json_object(train_dir / "report.json", "train report.json"),
        metrics=metrics,
        eval_path=eval_path,
        eval=evaluation,
        samples=samples,
        mfu_path=Path(p.mfu),
        mfu=read_json_object(Path(p.mfu), "mfu.json"),
        data=_data_lineage(Path(p.ingest)) if p.ingest else None,
    )
