"""The pods' SIGTERM-to-SIGKILL grace: long enough for the last checkpoint of this run, from the plan.

A constant is wrong both ways: a full fine-tune's checkpoint on a slow network volume outlasts it in a
small world, and a big world waits for nothing. `launch.grace_seconds: auto` sizes it from the plan's
per-rank checkpoint bytes over `plan.checkpoint_write_gbps` (voxpipe.train.plan), with a margin for the
step in flight, the manifest and the barriers; a number is taken as it is.
"""

from __future__ import annotations

import math

from voxpipe.params import Params
from voxpipe.train.plan import Setup, checkpoint_save_seconds, compute_dtype_name, model_config_or_preset

MARGIN_SECONDS = 120  # the step in flight when SIGTERM comes, the signed manifest, the barriers
FACTOR = 1.5  # the plan's bandwidth is one figure; a volume shared by the ranks varies around it


def planned_grace(params: Params, world: int) -> int:
    """The auto grace of a train job in a world of `world` ranks: planned save time x FACTOR + margin."""
    t = params.train
    setup = Setup(model_config_or_preset(params), world, t.lora, t.activation_checkpointing,
                  compute_dtype_name(params), t.max_tokens)
    seconds = checkpoint_save_seconds(setup, params.plan.checkpoint_write_gbps)
    return MARGIN_SECONDS + math.ceil(FACTOR * seconds)


def grace_seconds(params: Params, step: str, world: int) -> int:
    """The grace of a job running `step`: launch.grace_seconds when a number; auto = the plan's for train,
    the margin alone for a step that saves no checkpoint (encode)."""
    grace = params.launch.grace_seconds
    if grace != "auto":
        return grace
    return planned_grace(params, world) if step == "train" else MARGIN_SECONDS
