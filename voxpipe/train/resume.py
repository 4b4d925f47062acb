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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voxpipe.params import Params
from voxpipe.paramspec import fields
from voxpipe.train.identity import LOCATIONS

# train keys that may differ between the run that wrote a checkpoint and the one resuming it: those the
# schema marks as not changing the weights (voxpipe/section.py): max_steps (train longer or stop earlier),
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


@dataclass(frozen=True)
class Refusal:
    """Why a checkpoint cannot continue this run: `changed` for the one line a fresh start logs, `paragraph`
    for the error that stops a run without train.fresh_on_change."""

    changed: str
    paragraph: str


_WAYS_OUT = (
    "Start fresh with --set train.fresh_on_change=true (what `dvc repro` does) or --no-resume: the old "
    "checkpoints and exports are moved aside, not deleted"
)

# what a version names, for the user: which input changed
_VERSIONS = {"data_version": ("train.data", "the encoded data (ingest.input or its recordings changed)"),
             "base_version": ("model.base", "the base checkpoint")}


def _version_changes(saved: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """The inputs whose content (DVC md5) differs between the checkpoint's run and this one."""
    found = []
    for key, (param, what) in _VERSIONS.items():
        before, now = saved.get(key), identity.get(key)
        if before and now and before != now:
            found.append(f"{param}: {what}, md5 {before[:12]} -> {now[:12]}")
    return found


def why_not_resume(
    saved: dict[str, Any], now: dict[str, Any], identity: dict[str, Any], max_steps: int, checkpoint: Path
) -> Refusal | None:
    """Why `checkpoint` (its trainer.json is `saved`) cannot continue this run (its result params `now`,
    its `identity`: voxpipe/train/identity.py), or None if it can.

    Inputs are compared by content, as the run's identity names them: a checkpoint that recorded its data
    and base versions resumes from wherever they now lie, and refuses once either changed, before any file
    of it is loaded (the data sampler's own fingerprint would only fail inside its load_state_dict)."""
    by_content = "identity" in saved
    ignored = LOCATIONS if by_content else ()
    params = saved["params"]
    keys = sorted(k for k in params.keys() | now.keys() if k not in ignored and params.get(k) != now.get(k))
    changes = [f"{k}: {params.get(k)!r} -> {now.get(k)!r}" for k in keys]
    if by_content:
        changes += _version_changes(saved["identity"], identity)
    if changes:
        return Refusal(
            "; ".join(changes),
            f"{checkpoint} was trained with other inputs or values of keys that change the result "
            f"({'; '.join(changes)}). Resuming would mix two runs in one model and one report. {_WAYS_OUT}; "
            "or rerun with the checkpoint's data and values. Only train.max_steps and checkpoint/logging "
            "keys may change on resume",
        )
    if saved["step"] > max_steps:
        return Refusal(
            f"train.max_steps {max_steps} < the checkpoint's step {saved['step']}",
            f"{checkpoint} is at step {saved['step']}, past train.max_steps={max_steps}; raise "
            f"train.max_steps to at least that to continue. {_WAYS_OUT}",
        )
    return None
