"""`voxpipe compare`: an experiment's runs side by side, and their fixed-seed val curves in one png.

Columns: the run, the params that differ between the runs (params equal everywhere say nothing),
then the figures that decide between runs: final fixed-seed val loss, the eval losses of the model
and its base and their delta, speaker similarity and its delta to the base, MFU and tokens/s. A
figure no run has is left out.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.track.plots import val_curves
from voxpipe.track.reglock import LOCK_TAG
from voxpipe.track.tracking import resolve_tracking_uri, session

FIGURES = (
    "val_loss", "eval_loss", "base_loss", "loss_delta", "spk_sim", "spk_sim_delta", "mfu", "tokens_per_s",
)
SUFFIX = {"table": "txt", "markdown": "md", "csv": "csv", "json": "json"}


@dataclass
class CompareResult:
    out: Path
    text: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> str:
        return f"{self.text.rstrip()}\ncompare: {len(self.rows)} runs -> {self.out}"


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def figures(m: dict[str, float]) -> dict[str, float | None]:
    """The deciding figures of one run from its latest metric values (None where it lacks one)."""
    # similarity_to_speaker_* was speaker_similarity_* before eval.json named two similarities: runs
    # logged before the rename still compare
    spk = m.get("eval/similarity_to_speaker_mean", m.get("eval/speaker_similarity_mean"))
    spk_base = m.get("eval/similarity_to_speaker_baseline", m.get("eval/speaker_similarity_baseline"))
    return {
        "val_loss": m.get("val/loss"),  # the last point of the fixed-seed val curve
        "eval_loss": m.get("eval/loss_model"),
        "base_loss": m.get("eval/loss_baseline"),
        "loss_delta": m.get("eval/loss_delta", _delta(m.get("eval/loss_model"), m.get("eval/loss_baseline"))),
        "spk_sim": spk,
        "spk_sim_delta": _delta(spk, spk_base),
        "mfu": m.get("mfu/mfu"),
        "tokens_per_s": m.get("train/tokens_per_s"),
    }


def differing_params(runs: list[dict[str, str]]) -> list[str]:
    keys = sorted(set().union(*runs)) if runs else []
    return [k for k in keys if len({r.get(k) for r in runs}) > 1]


def build_rows(runs: list[Any]) -> list[dict[str, Any]]:
    params = [dict(r.data.params) for r in runs]
    varying = differing_params(params)
    rows = []
    for run, p in zip(runs, params, strict=True):
        row: dict[str, Any] = {"run": run.info.run_name, "run_id": run.info.run_id[:8]}
        row.update({k: p.get(k) for k in varying})
        row.update(figures(run.data.metrics))
        rows.append(row)
    hidden = {name for name in FIGURES if all(r[name] is None for r in rows)}
    return [{k: v for k, v in r.items() if k not in hidden} for r in rows]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    columns = list(rows[0]) if rows else []
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue()
    cells = [[_cell(r[c]) for c in columns] for r in rows]
    if fmt == "markdown":
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def compare(params: Params) -> CompareResult:
    """`compare`: the runs of tracking.experiment, read where train and register logged them."""
    p, tracking = params.compare, params.tracking
    with session(resolve_tracking_uri(tracking.uri, Path(tracking.work))) as client:
        experiment = client.get_experiment_by_name(tracking.experiment)
        if experiment is None:
            raise StepError(
                f"no MLflow experiment {tracking.experiment!r} there (`voxpipe register` creates it)"
            )
        newest = client.search_runs([experiment.experiment_id], max_results=p.max_runs,
                                    order_by=["attributes.start_time DESC"])
        # oldest first, as they happened; the register lock's run (reglock.py) is no pipeline run
        runs = [r for r in reversed(newest) if LOCK_TAG not in r.data.tags]
        if not runs:
            raise StepError(f"MLflow experiment {tracking.experiment!r} has no runs")
        curves = {
            f"{r.info.run_name} ({r.info.run_id[:8]})": sorted(
                (m.step, m.value) for m in client.get_metric_history(r.info.run_id, "val/loss")
            )
            for r in runs
        }
    rows = build_rows(runs)
    text = render(rows, p.format)
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"compare.{SUFFIX[p.format]}").write_text(text)
    val_curves(curves, out / "val_curves.png")
    return CompareResult(out, text, rows)
