"""`tracking`: where runs and models are recorded (no step of its own; train, register, compare)."""

from __future__ import annotations

from pydantic import Field

from voxpipe.section import Section


class TrackingParams(Section):
    """MLflow, as train (`train.track`), register and compare see it: one run, one experiment."""

    uri: str | None = Field(
        None, description="None: $MLFLOW_TRACKING_URI, else sqlite:///<work>/mlflow.db. No credentials here: "
        "they come from MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN",
        json_schema_extra={"wired": True},
    )
    experiment: str = Field("voxpipe", description="MLflow experiment of the runs")
    parent_run: str | None = Field(
        None, description="a sweep's MLflow parent run id (`voxpipe sweep-open` makes it): register logs the "
        "run as its child (`mlflow.parentRunId`, the swept keys tagged) and registers no model version; "
        "`voxpipe sweep-close` registers the sweep's best. None: no sweep, register registers the run"
    )
    work: str = Field(
        "work", description="mlflow_run.json (the pipeline run's MLflow run); with no tracking URI also "
        "mlflow.db and mlruns/",
        json_schema_extra={"wired": True},
    )


ORDER = 170
SECTIONS = {"tracking": TrackingParams}
