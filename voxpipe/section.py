"""The base of every params section: unknown keys refused, types strict, floats finite.

Each section's model lives in voxpipe/steps/ with the steps that read it; voxpipe/params.py composes them.

A field's `json_schema_extra` says what kind of setting it is; every list of keys that depends on it is
derived from these marks (voxpipe/paramspec.py), never written down again:
- unmarked: the value changes the step's result (DVC tracks it as a param: voxpipe/dvcgen.py);
- `{"result": False}`: it does not: logging, progress, worker counts, guards that only fail a run, and
  paths (what a path holds is a DVC dep or out; the path itself is not). A checkpoint resumes across it;
- `{"weights": False}`: it changes the outputs but not the weights at a step (`train.max_steps`,
  `train.export_dtype`), so a checkpoint still resumes across it (voxpipe/train/resume.py);
- `{"wired": True}`: an orchestrator sets it from earlier steps' outputs (KFP: no pipeline parameter);
- `{"shard": True}`: one shard's setting (`ingest-shard`, `ingest-merge`; no flag of `voxpipe ingest`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # allow_inf_nan=False: every float key must be finite (`train.lr=.inf` would export NaN weights)
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

    def file_values(self) -> dict[str, Any]:
        """The section as a params file holds it; a section whose keys follow others overrides this."""
        return self.model_dump(by_alias=True)
