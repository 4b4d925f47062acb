"""Per-step metrics: metrics.jsonl (one JSON object per optimizer step) and, optionally, MLflow.

Only rank 0 writes. On resume the lines after the resumed step are dropped, so the file reads
as one uninterrupted history. MLflow is a tiny optional hook here (used only when
MLFLOW_TRACKING_URI is set and mlflow is importable); proper run tracking lives elsewhere.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

from voxpipe.report import atomic_write_text


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: non-finite floats become null (the skipped-step counter tells why)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _flatten(tree: dict[str, Any], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class MetricsLog:
    def __init__(self, path: Path, enabled: bool, resume_step: int, params: dict[str, Any]):
        self.path = path
        self.enabled = enabled
        self._mlflow = None
        self._owns_run = False
        if not enabled:
            return
        kept = []
        if resume_step and path.is_file():
            kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= resume_step]
        atomic_write_text(path, "".join(line + "\n" for line in kept))
        self._file = path.open("a")
        if os.environ.get("MLFLOW_TRACKING_URI") and importlib.util.find_spec("mlflow") is not None:
            self._mlflow = importlib.import_module("mlflow")
            if self._mlflow.active_run() is None:
                self._mlflow.start_run()
                self._owns_run = True
            self._mlflow.log_params(_flatten(params, "train."))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: finite_or_none(v) for k, v in record.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        if self._mlflow is not None:
            numbers = {k: v for k, v in clean.items() if isinstance(v, int | float) and k != "step"}
            self._mlflow.log_metrics(numbers, step=record["step"])

    def close(self) -> None:
        if self.enabled:
            self._file.close()
        if self._owns_run:
            self._mlflow.end_run()
