"""The base of every params section: unknown keys refused, types strict, floats finite.

Each section's model lives in voxpipe/steps/ with the steps that read it; voxpipe/params.py composes them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # allow_inf_nan=False: every float key must be finite (`train.lr=.inf` would export NaN weights)
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)
