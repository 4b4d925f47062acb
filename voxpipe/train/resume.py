"""Honest resume: a checkpoint continues only the run that wrote it.

Resuming a folder with a different `lr` used to train 0 steps, keep the old export and write the
new lr into report.json: a report that lies. Every checkpoint therefore records the params its
weights depend on, and resume refuses when they differ, naming the keys. What may change between
attempts is what does not change the weights: how long to train (`max_steps`), checkpointing, and
logging/tracking. When `max_steps` grows, the learning-rate plan stays the one the run started
with (its decay lands on min_lr at the planned step and stays there), so nothing jumps back up.
`train.fresh_on_change` (for `dvc repro`, which reruns train when a tracked param changes) starts
fresh instead of refusing: the old checkpoints are moved aside, never deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voxpipe.params import Params
from voxpipe.paramspec import fields

# train keys that may differ between the run that wrote a checkpoint and the one resuming it: those the
# schema marks as not changing the weights (voxpipe/params.py): max_steps (train longer or stop earlier),
# checkpointing, logging (the fixed-seed val has its own RNG), exports (written from the weights), how the
# same math runs (activation checkpointing, compile: fix an OOM and resume), guards, the folders
RESUME_FREE = frozenset(name.split(".")[1] for name, leaves in fields("train").items()
                        if not any(k.changes_weights for k in leaves))


def result_params(params: Params) -> dict[str, Any]:
    """The keys a run's weights depend on, flat (`train.lr`, `model.base`, ...), paths resolved."""
    result = {
        f"train.{k}": v
        for k, v in params.section("train").model_dump().items()
        if k not in RESUME_FREE
    }
    result["train.data"] = str(Path(params.train.data).resolve())
    result["model.base"] = str(Path(params.model.base).resolve())
    if hasattr(params.model, "kernels"):
        result["model.kernels"] = params.model.kernels
    return result


def why_not_resume(
    saved: dict[str, Any], now: dict[str, Any], max_steps: int, checkpoint: Path
) -> str | None:
    """Why `checkpoint` (its trainer.json is `saved`) cannot continue this run, or None if it can."""
    keys = sorted(k for k in saved["params"].keys() | now.keys() if saved["params"].get(k) != now.get(k))
    if keys:
        changes = "; ".join(f"{k}: {saved['params'].get(k)!r} -> {now.get(k)!r}" for k in keys)
        return (
            f"{checkpoint} was trained with other values of keys that change the result ({changes}). "
            "Resuming would mix two runs in one model and one report. Rerun with the checkpoint's values, "
            "or start fresh with --no-resume (the old checkpoints are moved aside, not deleted); only "
            "train.max_steps and checkpoint/logging keys may change on resume"
        )
    if saved["step"] > max_steps:
        return (
            f"{checkpoint} is at step {saved['step']}, past train.max_steps={max_steps}; raise "
            "train.max_steps to at least that to continue, or start fresh with --no-resume"
        )
    return None
