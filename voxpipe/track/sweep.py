"""A sweep in MLflow: one parent run, a child run per grid point, and only the best child registered.

A person tries a few settings and keeps one voice. Registering every point would fill the registry with
versions nobody chose and let the first lucky point take `@champion` before the others ran. So:
`voxpipe sweep-open` makes the parent run (the grid recorded on it) and writes its id to
`<sweep.out>/sweep.json`; each point runs the pipeline with `tracking.parent_run` set, and its
`register` logs the run as the parent's child (`mlflow.parentRunId`, the swept keys tagged `sweep.<key>`;
under KFP's MLflow plugin the sweep-open task's own nested run is the parent and a child stays nested
under its loop iteration's run, `voxpipe.sweep_parent` naming the parent: kfp_runs.py)
and logs the export as a pyfunc model in it, but makes no model version (`child_record`);
`voxpipe sweep-close` ranks the children as `voxpipe compare` does (the promotion rule's verdict, then
the fixed-seed val loss), tags the winner on the parent (`voxpipe.sweep_best`) and registers only it,
through the same code as `register` (registry.register_logged): it becomes `@champion` only by beating
the current one. The grid's parsing and checks live here too: the DVC driver (tools/sweep.py) and the
KFP sweep (pipelines/sweep.py) both take it from here.
"""

from __future__ import annotations

import itertools
import json
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.errors import StepError, quoted
from voxpipe.params import Params, load_params
from voxpipe.paramspec import keys
from voxpipe.report import write_json
from voxpipe.track.cards import carry_cards
from voxpipe.track.headline import VERDICT_TAG, promoted
from voxpipe.track.kfp_runs import kfp_task
from voxpipe.track.ownership import check_owned
from voxpipe.track.registry import (
    CHAMPION,
    EXPORT_TAG,
    LoggedModel,
    Place,
    alias_version,
    ensure_registered_model,
    log_model,
    register_logged,
)
from voxpipe.track.tracking import pipeline_experiments, redact_uri, resolve_tracking_uri, session
from voxpipe.track.voices import LOCALE_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

    from voxpipe.track.artifacts import PipelineArtifacts

PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests a child under its parent
GRID_TAG = "voxpipe.sweep.grid"  # on the parent: the grid as JSON
SWEEP_TAG = "voxpipe.sweep"  # on the parent: "open", then "closed", or "killed" / "failed" (end_sweep)
ENDED_TAG = "voxpipe.sweep.ended"  # on a parent that did not close: why (a signal, a failed point)
LEFT_TAG = "voxpipe.sweep.left"  # on a child whose point did not finish: the parent it was taken out of
BEST_TAG = "voxpipe.sweep_best"  # on the parent: the winning child's run id
MODEL_TAG = "voxpipe.sweep.model"  # on a child: its logged model as JSON (uri, model_id, export_md5)
SWEEP_PARENT_TAG = "voxpipe.sweep_parent"  # on a child: the sweep's parent (KFP nests it elsewhere)
SWEPT_PREFIX = "sweep."  # on a child: `sweep.<key>` = its value of a swept key
SWEEP_FILE = "sweep.json"


# -- the grid ------------------------------------------------------------------------------------
def parse_grid(entries: list[str], params_file: str | Path | None = None) -> dict[str, list[Any]]:
    """`["train.lr=5e-5,1e-4", "train.lora.r=16,32"]` -> {key: [values]}, each value checked against the
    schema (layered on `params_file` as `--set key=value` would be): an unknown key, a key without values
    or a value the schema refuses stops the sweep before anything runs."""
    known = {k.key for k in keys()}
    grid: dict[str, list[Any]] = {}
    for entry in entries:
        key, sep, raw = entry.partition("=")
        key = key.strip()
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if key not in known:
            close = sorted(k for k in known if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1])
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise StepError(f"sweep grid {quoted(entry)}: {quoted(key)} is no params key{hint}; name one "
                            "as section.key "
                            "(docs/params.md lists them), e.g. --grid train.lr=5e-5,1e-4")
        if not sep or not values:
            raise StepError(f"sweep grid {quoted(entry)}: no values for {key}; give them after '=', "
                            "separated by "
                            f"commas: --grid {key}=A,B")
        if key in grid:
            raise StepError(f"sweep grid: {key} is given twice; put all its values in one --grid {key}=A,B")
        typed = []
        for raw_value in values:
            try:
                loaded = load_params(params_file, [f"{key}={raw_value}"])
            except StepError as e:
                why = " ".join(str(e).split())  # the schema's message, on one line
                raise StepError(f"sweep grid {quoted(entry)}: {key}={raw_value} is refused by the "
                                f"schema: {why}. "
                                f"Fix that value (`voxpipe {key.split('.')[0]} --help` says what {key} takes)"
                                ) from None
            typed.append(loaded.flat()[key])
        grid[key] = typed
    if not grid:
        raise StepError("sweep: the grid is empty; give at least one --grid section.key=A,B "
                        "(e.g. --grid train.lr=5e-5,1e-4)")
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, one {key: value} per point, in a stable order."""
    return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]


def set_value(value: Any) -> str:
    """A value as `-S key=value` / `--set key=value` spell it (YAML: 5e-05, true, null)."""
    return json.dumps(value) if not isinstance(value, str) else value


# -- open ----------------------------------------------------------------------------------------
@dataclass
class SweepResult:
    out: Path
    record: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        r = self.record
        if r.get("best") is None:
            points = len(r["points"])
            return f"sweep: parent run {r['parent_run']} ({points} points) -> {self.out / SWEEP_FILE}"
        reg = r["registered"]
        if reg.get("version") is None:
            return (f"sweep-close: best of {r['children']} runs is {r['best']}: {reg['reason']} -> "
                    f"{self.out / SWEEP_FILE}")
        aliases = " ".join(f"@{a}" for a in reg["aliases"]) or "no alias"
        return (f"sweep-close: best of {r['children']} runs is {r['best']}, registered as {reg['name']} "
                f"v{reg['version']} ({aliases}); {reg['reason']} -> {self.out / SWEEP_FILE}")


def sweep_open(params: Params) -> SweepResult:
    """The sweep's parent run in tracking.experiment, the grid recorded on it; its id in sweep.json."""
    tracking, out = params.tracking, Path(params.sweep.out)
    grid = parse_grid(params.sweep.grid)
    uri = resolve_tracking_uri(tracking.uri, Path(tracking.work))
    with session(uri) as client:
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, Path(tracking.work))
        check_owned(uri, experiment, tracking.experiment, params.registered_model_name(), locks)
        name = "sweep " + " ".join(f"{k}={','.join(map(set_value, v))}" for k, v in grid.items())
        tags = {SWEEP_TAG: "open", GRID_TAG: json.dumps(grid)}
        task = kfp_task(client)
        if task is not None:  # KFP made this task's run under the pipeline's: it is the parent
            run = client.get_run(task.run_id)
            for tag, value in tags.items():
                client.set_tag(task.run_id, tag, value)
        else:
            run = client.create_run(experiment, run_name=name[:250], tags=tags)
        for key, values in grid.items():
            client.log_param(run.info.run_id, key, json.dumps(values))
    record = {"parent_run": run.info.run_id, "experiment_id": experiment, "tracking_uri": redact_uri(uri),
              "grid": grid, "points": grid_points(grid)}
    write_json(out / SWEEP_FILE, record)
    return SweepResult(out, record)


# -- a child: what register does in a sweep -------------------------------------------------------
def child_record(client: MlflowClient, run_id: str, parent: str, art: PipelineArtifacts,
                 logged: dict[str, str]) -> dict[str, Any]:
    """Make `run_id` a child of the sweep's parent, tag the swept keys' values, and log its export as a
    pyfunc model (once per export) for sweep-close to register if it wins; no model version here."""
    from mlflow.exceptions import MlflowException

    try:
        grid = json.loads(client.get_run(parent).data.tags.get(GRID_TAG, "{}"))
    except MlflowException:
        raise StepError(f"tracking.parent_run {quoted(parent)}: no such run in this MLflow store; "
                        "open the sweep "
                        "with `voxpipe sweep-open` and pass the id it prints (sweep.json), or set "
                        "tracking.parent_run to null to register this run on its own") from None
    if kfp_task(client) is None:  # under KFP the run stays nested under its loop iteration's run
        client.set_tag(run_id, PARENT_TAG, parent)
    client.set_tag(run_id, SWEEP_PARENT_TAG, parent)
    for key in grid:
        client.set_tag(run_id, SWEPT_PREFIX + key, logged.get(key, ""))
    model = json.loads(client.get_run(run_id).data.tags.get(MODEL_TAG, "{}"))
    if model.get("export_md5") != art.export_md5:
        uri, model_id = log_model(run_id, art)
        model = {"uri": uri, "model_id": model_id, "export_md5": art.export_md5}
        client.set_tag(run_id, MODEL_TAG, json.dumps(model))
    return {"parent_run": parent, "swept": {k: logged.get(k) for k in grid}, "logged_model": model["uri"]}


# -- close ---------------------------------------------------------------------------------------
def children(client: MlflowClient, experiment: str, parent: str) -> list[Run]:
    """The parent's children: nested under it, or (KFP) naming it, in this experiment or the parent's."""
    from mlflow.exceptions import MlflowException

    try:
        experiments = list(dict.fromkeys([experiment, client.get_run(parent).info.experiment_id]))
    except MlflowException:  # no such parent: it has no children here either
        experiments = [experiment]
    found = {r.info.run_id: r for tag in (PARENT_TAG, SWEEP_PARENT_TAG)
             for r in client.search_runs(experiments, filter_string=f"tags.`{tag}` = '{parent}'",
                                         max_results=1000)}
    return list(found.values())


def rank(run: Run) -> tuple[int, float]:
    """The order `voxpipe compare` sorts by: promoted first, then no verdict last, then the val loss."""
    order = {True: 0, False: 1, None: 2}[promoted(run.data.tags.get(VERDICT_TAG))]
    loss = run.data.metrics.get("val_loss")
    return order, loss if loss is not None and math.isfinite(loss) else math.inf


def sweep_close(params: Params) -> SweepResult:
    """Rank the parent's children, tag the best on the parent, register only it (register's rule)."""
    tracking, out = params.tracking, Path(params.sweep.out)
    parent = tracking.parent_run or _recorded_parent(out)
    uri = resolve_tracking_uri(tracking.uri, Path(tracking.work))
    name = params.registered_model_name()
    import mlflow

    with session(uri) as client:
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, Path(tracking.work))
        ensure_registered_model(client, name)
        check_owned(uri, experiment, tracking.experiment, name, locks)
        runs = [r for r in children(client, experiment, parent) if MODEL_TAG in r.data.tags]
        if not runs:
            raise StepError(f"sweep-close: parent run {parent} has no child with a logged model in "
                            f"experiment {tracking.experiment!r} at {redact_uri(uri)}; run the points (each "
                            f"with --set tracking.parent_run={parent}) through register first")
        best = min(runs, key=rank)
        model = LoggedModel(**json.loads(best.data.tags[MODEL_TAG]))
        with tempfile.TemporaryDirectory(prefix="voxpipe-sweep-") as tmp:
            local = mlflow.artifacts.download_artifacts(run_id=best.info.run_id, dst_path=tmp,
                                                        artifact_path="eval/eval.json", tracking_uri=uri)
            evaluation = json.loads(Path(local).read_text())
        champion = alias_version(client, name, CHAMPION)
        if champion is not None and champion.tags.get(EXPORT_TAG) == model.export_md5:
            # the same bytes as the champion (a sweep of the champion's own settings): a second version of
            # them would be a twin nobody can tell apart, so none is made
            registered = {"name": name, "version": None, "aliases": [], "promoted": None,
                          "reason": f"the same model as {name} v{champion.version} (@{CHAMPION}, export md5 "
                                    f"{model.export_md5}): no new version",
                          "model_uri": f"models:/{name}/{champion.version}"}
        else:
            place = Place(uri, locks, params.register_.lock_timeout_s)
            carried = {LOCALE_TAG: best.data.tags[LOCALE_TAG]} if LOCALE_TAG in best.data.tags else {}
            reg = register_logged(client, place, name, best.info.run_id, model, evaluation,
                                  {"voxpipe.sweep": parent, **carried})
            carry_cards(client, uri, best.info.run_id, reg, model.model_id)
            registered = {"name": reg.name, "version": reg.version, "aliases": reg.aliases,
                          "promoted": reg.decision.promoted, "reason": reg.decision.reason,
                          "model_uri": f"models:/{reg.name}/{reg.version}"}
        client.set_tag(parent, BEST_TAG, best.info.run_id)
        client.set_tag(parent, SWEEP_TAG, "closed")
        client.set_terminated(parent, "FINISHED")
    record = {"parent_run": parent, "children": len(runs), "best": best.info.run_id,
              "ranking": [r.info.run_id for r in sorted(runs, key=rank)], "registered": registered,
              "state": "closed", "closed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_json(out / SWEEP_FILE, {**_read(out), **record})
    return SweepResult(out, record)


# -- a sweep that did not close -------------------------------------------------------------------
def end_sweep(uri: str, parent: str, status: str, why: str) -> None:
    """Close a sweep that stops before sweep-close (a signal, a failed point): the parent ends as
    `status` (KILLED / FAILED), tagged `voxpipe.sweep` killed / failed and why. A parent left RUNNING and
    `open` would look like a sweep still under way, forever. A child still RUNNING is a point whose
    register did not finish: it ends `status` too and leaves the sweep (its parent tag moved to
    `voxpipe.sweep.left`), so neither `voxpipe compare --sweep` nor a later sweep-close counts it."""
    with session(uri) as client:
        client.set_tag(parent, SWEEP_TAG, status.lower())
        client.set_tag(parent, ENDED_TAG, why[:500])
        experiment = client.get_run(parent).info.experiment_id
        for child in children(client, experiment, parent):
            if child.info.status == "RUNNING":
                client.set_tag(child.info.run_id, LEFT_TAG, parent)
                client.delete_tag(child.info.run_id, PARENT_TAG)
                client.set_terminated(child.info.run_id, status)
        client.set_terminated(parent, status)


def reopen_sweep(uri: str, parent: str) -> None:
    """A stopped sweep run again with the same grid on the same workspace: its parent runs on (RUNNING,
    `open`), so the points that finished stay its children and only the others run again."""
    with session(uri) as client:
        client.update_run(parent, status="RUNNING")
        client.set_tag(parent, SWEEP_TAG, "open")
        if ENDED_TAG in client.get_run(parent).data.tags:
            client.delete_tag(parent, ENDED_TAG)


def _read(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / SWEEP_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _recorded_parent(out: Path) -> str:
    parent = _read(out).get("parent_run")
    if not isinstance(parent, str):
        raise StepError(f"sweep-close: no parent run: tracking.parent_run is null and {out / SWEEP_FILE} "
                        "names none; pass --set tracking.parent_run=ID (what sweep-open printed) or the "
                        "sweep.out that sweep-open wrote to")
    return parent
