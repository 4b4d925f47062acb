"""Can this base move at all? The first fixed-seed validation after step 0 against the base's own.

A fine-tune whose weights do not change trains for hours and then "keeps the voice" perfectly: its
figures equal the base's. The trainer's fixed-seed validation uses the same batches, flow-matching t and
noise at every step (fixed_seed_loss.py), so between step 0 (the untrained base) and the first
validation after it only the weights differ: a change within float rounding means they did not move.
The floor is that rounding, `MOVE_FLOOR` of the base's val loss (relative): a fixed seed has no other
noise. Training goes on either way; the report's `moved` records the check, and a warning names the
likely causes.
"""

from __future__ import annotations

from typing import Any

MOVE_FLOOR = 1e-4  # relative change of the fixed-seed val loss below which the weights did not move
FIGURES = ("val/loss", "val/diff", "val/stop")


def move_check(base: dict[str, float], first: dict[str, float], lr: float, lora: bool) -> dict[str, Any]:
    """The check on the first validation after step 0 (`first`) against step 0's (`base`): the largest
    relative change of the val figures, the floor, whether it moved, and the warning when it did not."""
    changes = {k: abs(first[k] - base[k]) / max(abs(base[k]), 1e-12)
               for k in FIGURES if k in base and k in first}
    change = max(changes.values(), default=0.0)
    moved = change > MOVE_FLOOR
    warning = None if moved else (
        f"step {first['step']}: the fixed-seed val figures are where the base's were (largest relative "
        f"change {change:.2e}, floor {MOVE_FLOOR:g}; same batches, t and noise, so only the weights could "
        "move them): "
        "the model is not learning. Likely causes: "
        + ("LoRA adapters on modules that do not reach the output, or too few (train.lora.target_* and "
           "target_modules_*); " if lora else "")
        + f"a learning rate too small to change the weights at this dtype (lr at this step {lr:.2e}: "
        "train.lr, train.warmup_steps; bf16 weights ignore updates below about 1/256 of their size); "
        "a frozen part (the parameters the optimizer holds: train.lora.enabled freezes the base); or every "
        "step skipped (report skipped_steps). Training goes on")
    return {"step": first["step"], "base_step": base["step"], "change": change, "changes": changes,
            "floor": MOVE_FLOOR, "floor_source": "default: float rounding of a fixed-seed loss (MOVE_FLOOR)",
            "moved": moved, "warning": warning}
