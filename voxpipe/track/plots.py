"""PNG figures for the MLflow run and for `compare` (matplotlib's Figure API: no global pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure


def _columns(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [x for x, _ in points], [y for _, y in points]


def loss_curve(metrics: list[dict[str, Any]], val_curve: list[dict[str, Any]], path: Path) -> Path:
    """Training loss per step, the fixed-seed val loss at its steps, and the learning rate."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    losses = [(m["step"], m["loss"]) for m in metrics if m.get("loss") is not None]
    ax.plot(*_columns(losses), lw=0.8, alpha=0.6, label="train loss (per step)")
    if val_curve:
        val = [(v["step"], v["val/loss"]) for v in val_curve]
        ax.plot(*_columns(val), "o-", label="val loss (fixed seed)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (diffusion + stop)")
    ax.grid(alpha=0.3)
    lrs = [(m["step"], m["lr"]) for m in metrics if m.get("lr") is not None]
    if lrs:
        lr_ax = ax.twinx()
        lr_ax.plot(*_columns(lrs), color="grey", lw=0.8, ls=":", label="learning rate")
        lr_ax.set_ylabel("learning rate")
        lr_ax.legend(loc="lower left")
    ax.legend(loc="upper right")
    ax.set_title("Training loss and fixed-seed validation loss")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def val_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    """One fixed-seed val-loss curve per run, overlaid; the labels are drawn as plain text."""
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    for label, points in curves.items():
        if points:
            ax.plot(*_columns(points), "o-", ms=3, label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("val loss (fixed seed)")
    ax.grid(alpha=0.3)
    if any(curves.values()):
        for text in ax.legend(fontsize="small").get_texts():
            text.set_parse_math(False)  # a run's name as written: a `$` in it is no mathtext
    ax.set_title("Fixed-seed validation loss per run")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
