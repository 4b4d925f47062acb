"""The trainer's live MLflow run (`train.track`): params at the start, each step's metrics as it ends.

It is the pipeline run's MLflow run from the first step on: tracking URI and experiment resolve as for
`register`, params are redacted and keyed as `register` logs them (`train.*`), metrics keyed as it
keys metrics.jsonl. The run id goes into the train report, so `register` completes this run instead
of starting another (tracking.py) and adds only the points it lacks (record.py).

Which run: $MLFLOW_RUN_ID (an orchestrator made it), else on resume the run `<out>/mlflow_run.json`
names if it was started in the same place with the same params, else a new one (recorded there). A
rejoined run gets only the steps after the last one it holds: steps redone after a crash keep their
first values in MLflow (metrics.jsonl has the redone ones). MLflow errors at the start stop training
(tracking was asked for), and so does an experiment that another user owns or can edit
(ownership.py, as for `register`); later ones warn once and end live logging, since metrics.jsonl is the
record and `register` logs what the run lacks. The run stays RUNNING until `register` finishes it.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.exceptions import MlflowException

from voxpipe.report import write_json
from voxpipe.steps.tracking import TrackingParams
from voxpipe.steps.train import TrainParams
from voxpipe.track.ownership import check_experiment_owned
from voxpipe.track.record import flatten, log_metrics, log_params, numbers
from voxpipe.track.tracking import (
    RUN_FILE,
    experiment_id,
    local_artifact_root,
    orchestrator_run,
    pipeline_key,
    recorded_run,
    redact_params,
    redact_uri,
    resolve_tracking_uri,
    scrub,
    session,
)

if TYPE_CHECKING:
    from mlflow import MlflowClient

EVERY_STEP = "lr"  # finite on every step: its history says which steps a run holds


class LiveRun:
    def __init__(self, tracking: TrackingParams, p: TrainParams, folder: Path, resume_step: int):
        work = Path(tracking.work)
        self.uri = resolve_tracking_uri(tracking.uri, work)
        params = redact_params(flatten(p.model_dump(), "train."))  # tracking.*: where it logs, not what ran
        place = {"tracking_uri": redact_uri(self.uri), "params": pipeline_key(params)}
        with session(self.uri) as client:
            root = local_artifact_root(self.uri, work)
            place["experiment_id"] = experiment_id(client, tracking.experiment, root)
            # as register does: never log into an experiment another user owns or can edit
            check_experiment_owned(self.uri, place["experiment_id"], tracking.experiment)
            self.run_id = _join_or_create(client, folder / RUN_FILE, place, resume_step)
            log_params(client, self.run_id, params)
            held = client.get_metric_history(self.run_id, EVERY_STEP)
            self._through = max((m.step for m in held), default=0)
        self._client: MlflowClient | None = client

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        if self._client is None or step <= self._through:
            return
        fields = {k: v for k, v in record.items() if k != "step"}
        try:
            log_metrics(self._client, self.run_id, [(k, v, step) for k, v in numbers(fields, "").items()])
        except MlflowException as e:
            self._client = None
            warnings.warn(
                f"MLflow at {redact_uri(self.uri)}, step {step}: {scrub(e.message)}. Live logging stops; "
                "metrics.jsonl keeps every step and `voxpipe register` logs the rest into the run",
                stacklevel=2,
            )


def _join_or_create(client: MlflowClient, record_path: Path, place: dict[str, str], resume_step: int) -> str:
    """The orchestrator's run, this training's run on resume, else a new one."""
    explicit = orchestrator_run(client)
    if explicit is not None:
        return explicit.run_id
    resumed = recorded_run(client, record_path, place) if resume_step else None
    if resumed is not None:
        return resumed
    run_id = client.create_run(place["experiment_id"]).info.run_id
    write_json(record_path, {"run_id": run_id, **place})
    return run_id
