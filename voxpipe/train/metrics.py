"""Per-step metrics: metrics.jsonl (one JSON object per optimizer step) and, with `train.track`, MLflow.

Only rank 0 writes. On resume the lines after the resumed step are dropped, so the file reads
as one uninterrupted history. metrics.jsonl is the record; live logging (the pipeline run's MLflow run
that `register` completes) goes through `LiveLog`, which train owns and voxpipe/track/live.py implements.
Train never imports it: `voxpipe train` passes it in (voxpipe/cli.py, `Step.wires`), so a change to the
tracking code is no change to training (DVC does not retrain for it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from voxpipe.data.jsonl import read_jsonl
from voxpipe.files import atomic_write_text
from voxpipe.steps.tracking import TrackingParams
from voxpipe.steps.train import TrainParams


class LiveLog(Protocol):
    """Each step's metrics as training runs, somewhere a person watches them (an MLflow run)."""

    run_id: str  # recorded in the train report, so `register` completes this run

    def log(self, record: dict[str, Any]) -> None: ...


class LiveLogFactory(Protocol):
    def __call__(self, tracking: TrackingParams, p: TrainParams, folder: Path,
                 resume_step: int) -> LiveLog: ...


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: non-finite floats become null (the skipped-step counter tells why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    def __init__(self, path: Path, enabled: bool, resume_step: int, p: TrainParams, tracking: TrackingParams,
                 live: LiveLogFactory | None = None):
        self.path = path
        self.enabled = enabled
        self.live: LiveLog | None = None
        if not enabled:
            return
        if p.track and live is not None:
            self.live = live(tracking, p, path.parent, resume_step)
        kept = []
        if resume_step and path.is_file():
            rows = read_jsonl(path, "metrics.jsonl")
            kept = [json.dumps(row) for row in rows if row["step"] <= resume_step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))
        self._file = path.open("a")

    @property
    def run_id(self) -> str | None:
        """The MLflow run this training logs into (None: tracking off, or not rank 0)."""
        return self.live.run_id if self.live is not None else None

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: finite_or_none(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self.live is not None:
            self.live.log(clean)

    def close(self) -> None:
        if self.enabled:
            self._file.close()
            write_curve_csv(self.path, self.path.with_name(CURVE_CSV))


CURVE_CSV = "train_curve.csv"
CURVE_COLUMNS = ("step", "loss", "loss/diff", "loss/stop", "lr", "grad_norm")


def write_curve_csv(metrics: Path, out: Path) -> None:
    """The per-step training curve as CSV (`dvc plots` reads CSV, not JSON lines); empty cell = non-finite."""
    lines = [",".join(CURVE_COLUMNS)]
    for row in read_jsonl(metrics, "metrics.jsonl"):
        if "loss" in row:  # an optimizer step, not a validation-only line
            lines.append(",".join("" if row.get(k) is None else str(row[k]) for k in CURVE_COLUMNS))
    atomic_write_text(out, "\n".join(lines) + "\n")
