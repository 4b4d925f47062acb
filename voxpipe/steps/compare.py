"""`compare`'s section and step: runs side by side, and compare.html to hear them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from voxpipe.section import Section
from voxpipe.steps import Step


class CompareParams(Section):
    """`compare`: the runs of an experiment (or of one sweep) side by side: a table of the settings that
    differ, the headline figures and the verdict, and compare.html to hear the same sentence from each."""

    format: Literal["table", "markdown", "csv", "json"] = Field(
        "table", description="output format of compare.<format> (csv/json: every column on one line)"
    )
    out: str = Field("work/compare", description="compare.<format>, compare.html and val_curves.png",
                     json_schema_extra={"result": False})
    max_runs: int = Field(50, gt=0, description="newest runs with figures compared (lock runs, sweep parents "
                          "and runs still training count not)")
    sweep: str | None = Field(
        None, description="compare only this sweep's runs: the MLflow run id of its parent (the children's "
        "`mlflow.parentRunId`); the table and compare.html are also logged to the parent")
    kfp_run: str | None = Field(
        None, description="compare only the runs of this KFP pipeline run (its id), as KFP's MLflow plugin "
        "nests them: the run tagged kfp.pipeline_run_id and every run below it (tasks, loop iterations), "
        "in any experiment (docs/cluster.md)")


ORDER = 130
SECTIONS = {"compare": CompareParams}

STEPS = (
    Step("compare", "runs side by side (differing settings, headline figures, verdict) + compare.html to "
         "hear the same sentence from each", target="voxpipe.track.compare:compare",
         reads=("compare", "tracking")),
)
