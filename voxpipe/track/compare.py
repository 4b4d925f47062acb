"""`voxpipe compare`: runs side by side as a person compares them, a table and a page to listen to.

Which runs: the experiment's newest `compare.max_runs` that have figures (register logged them), or one
sweep's children (`compare.sweep`: the parent run's id, found through MLflow's `mlflow.parentRunId`
tag); never the register lock's run, a sweep's parent or a run still training. A run whose logged
artifacts are malformed is left out, named with the reason; names and tags are shown as text
(untrusted.py).

The table (compare.<format>): one row per run, sorted by the promotion rule's verdict (promoted first)
and then by fixed-seed val loss. Its columns: the run, then only the *settings* that differ between the
runs (keys that change a result, voxpipe/paramspec.py: no output paths, folders, worker counts; no
id- or hash-like values), then the headline figures (headline.py) a run has, WER/CER among them, and
the verdict. Runs scored on different val sets (evaluate's val_digest) have losses that do not compare:
the table says so and shows each val set's runs as a group of their own. A table wider than a
terminal wraps into blocks; csv and json keep each run on one line.

compare.html (compare_page.py) beside it: the figures, the val curves overlaid, and the same val
sentence from every run in one row of players. With `compare.sweep`, the table, the page and the
curves are also logged to the sweep's parent run (`compare/`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.track.compare_page import BadArtifact, RunMedia, compare_page, run_media
from voxpipe.track.headline import NAMES, VAL_SET_TAG, VERDICT_TAG, promoted, setting_keys
from voxpipe.track.kfp_runs import REGISTERED_IN_TAG, pipeline_tree
from voxpipe.track.plots import val_curves
from voxpipe.track.reglock import LOCK_TAG
from voxpipe.track.sweep import SWEEP_TAG, children
from voxpipe.track.tracking import resolve_tracking_uri, session
from voxpipe.track.untrusted import printable, spreadsheet_cell

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

SUFFIX = {"table": "txt", "markdown": "md", "csv": "csv", "json": "json"}
WIDTH = 150  # characters of a table line before it wraps into another block
KEY_COLUMNS = ("run", "id")
_ID_LIKE = re.compile(r'^"?[0-9a-f]{12,}(\.dir)?"?$')  # md5s, run ids, digests
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # MLflow's run ids; compare.sweep goes into a search filter
PAGE = 200  # runs a search returns at a time
LABEL_CHARS = 60  # of a run's name in the curves' legend and in a skipped run's line


@dataclass
class CompareResult:
    out: Path
    text: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    table: str = "compare.txt"
    skipped: list[str] = field(default_factory=list)  # `<run id>: <why>` of the runs left out

    def summary(self) -> str:
        left_out = "".join(f"\ncompare: left out run {why}" for why in self.skipped)
        text = (f"{self.text.rstrip()}{left_out}\ncompare: {len(self.rows)} runs -> {self.out / self.table}, "
                f"{self.out / 'compare.html'} (listen), {self.out / 'val_curves.png'}")
        return printable(text, keep="\n")


def _is_setting_value(value: str | None) -> bool:
    return value is None or not ("/" in value or _ID_LIKE.match(value))


def differing_settings(runs: list[dict[str, str]]) -> list[str]:
    """The settings whose value is not the same in every run, id- and path-like values left out."""
    settings = setting_keys()
    found = sorted({k for r in runs for k in r if k in settings})
    return [k for k in found if len({r.get(k) for r in runs}) > 1
            and all(_is_setting_value(r.get(k)) for r in runs)]


def _sort_key(row: dict[str, Any]) -> tuple[int, float]:
    rank = {True: 0, False: 1, None: 2}[promoted(row["verdict"])]
    loss = row.get("val_loss")
    return rank, loss if isinstance(loss, float) else math.inf


def build_rows(runs: list[Run]) -> list[dict[str, Any]]:
    """One row per run: run, differing settings, headline figures some run has, verdict, val set; sorted
    by val set (the group with the best run first), then verdict, then loss."""
    params = [dict(r.data.params) for r in runs]
    varying = differing_settings(params)
    rows = []
    for run, p in zip(runs, params, strict=True):
        row: dict[str, Any] = {"run": run.info.run_name, "id": run.info.run_id[:8]}
        row.update({k: p.get(k) for k in varying})
        row.update({name: run.data.metrics.get(name) for name in NAMES})
        row["verdict"] = run.data.tags.get(VERDICT_TAG)
        row["val_set"] = run.data.tags.get(VAL_SET_TAG)
        rows.append(row)
    hidden = {name for name in NAMES if all(r[name] is None for r in rows)}
    rows = [{k: v for k, v in r.items() if k not in hidden} for r in rows]
    best = {}
    for row in sorted(rows, key=_sort_key):
        best.setdefault(row["val_set"], len(best))
    return sorted(rows, key=lambda r: (best[r["val_set"]], *_sort_key(r)))


def val_sets(rows: list[dict[str, Any]]) -> list[str | None]:
    """The val sets of the rows, in the rows' order."""
    return list(dict.fromkeys(r["val_set"] for r in rows))


def _json_value(value: Any) -> Any:
    """A figure as strict JSON has it: NaN and infinity (which MLflow stores) as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _csv_value(value: Any) -> Any:
    """Text without escapes or line breaks (a spreadsheet shows them as junk, `cat` runs them)."""
    return printable(value) if isinstance(value, str) else value


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return printable(str(value))


def _markdown_cell(value: Any) -> str:
    return _cell(value).replace("|", "\\|")


def _blocks(columns: list[str], widths: dict[str, int]) -> list[list[str]]:
    """The columns in blocks that fit WIDTH, each starting with the run's name and id."""
    head = [c for c in columns if c in KEY_COLUMNS]
    blocks: list[list[str]] = [list(head)]
    for c in columns:
        if c in KEY_COLUMNS:
            continue
        if len(blocks[-1]) > len(head) and sum(widths[x] + 2 for x in [*blocks[-1], c]) > WIDTH:
            blocks.append(list(head))
        blocks[-1].append(c)
    return blocks


def _plain(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    cells = [{c: _cell(r[c]) for c in columns} for r in rows]
    widths = {c: max(len(c), *(len(row[c]) for row in cells)) for c in columns}
    lines = []
    for number, block in enumerate(_blocks(columns, widths)):
        if number:
            lines.append("")
        lines.append("  ".join(c.ljust(widths[c]) for c in block).rstrip())
        lines += ["  ".join(row[c].ljust(widths[c]) for c in block).rstrip() for row in cells]
    return lines


def _markdown(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return lines + ["| " + " | ".join(_markdown_cell(r[c]) for c in columns) + " |" for r in rows]


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows as table, markdown, csv or json. csv and json carry each run's val set in a column; the
    table and markdown show one group per val set under a line that says which, when there are several."""
    if fmt == "json":
        return json.dumps([{k: _json_value(v) for k, v in r.items()} for r in rows], indent=2) + "\n"
    columns = list(rows[0]) if rows else []
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: spreadsheet_cell(_csv_value(v)) for k, v in r.items()} for r in rows)
        return buf.getvalue()
    shown = [c for c in columns if c != "val_set"]
    draw = _markdown if fmt == "markdown" else _plain
    groups = val_sets(rows)
    if len(groups) == 1:
        return "\n".join(draw(rows, shown)) + "\n"
    lines = [f"these runs were scored on {len(groups)} different val sets: their losses and figures compare "
             "only within a group (re-run `evaluate` on one val set to line them all up)"]
    for group in groups:
        mine = [r for r in rows if r["val_set"] == group]
        lines += ["", f"val set {group or 'unknown'} ({len(mine)} runs)", *draw(mine, shown)]
    return "\n".join(lines) + "\n"


def _compared(run: Run) -> bool:
    """A pipeline run that register logged: it has headline figures. Not the register lock's run, not a
    sweep's parent, not a run the trainer is still logging into."""
    tags = run.data.tags
    return LOCK_TAG not in tags and SWEEP_TAG not in tags and any(n in run.data.metrics for n in NAMES)


def _runs(client: MlflowClient, experiment_id: str, max_runs: int, sweep: str | None) -> list[Run]:
    """The runs compared, oldest first: a sweep's children, or the newest `max_runs` runs of the experiment
    that have figures (pages are read until that many are found: lock runs and sweep parents count not)."""
    if sweep:  # nested under the parent, or (KFP) naming it: sweep.children
        picked = [r for r in children(client, experiment_id, sweep) if _compared(r)]
        return sorted(picked, key=lambda r: r.info.start_time)[-max_runs:]
    found: list[Run] = []
    token = None
    while len(found) < max_runs:
        page = client.search_runs([experiment_id], max_results=PAGE,
                                  order_by=["attributes.start_time DESC"], page_token=token)
        found += [r for r in page if _compared(r)]
        token = page.token
        if not token:
            break
    return list(reversed(found[:max_runs]))


def _kfp_runs(client: MlflowClient, kfp_run: str, max_runs: int) -> list[Run]:
    """The runs with figures of one KFP pipeline run, as KFP's MLflow plugin nests them, oldest first; a
    train run whose history register carried into its own run is that run's row, not one of its own."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = [r for r in pipeline_tree(client, experiments, kfp_run)
             if _compared(r) and REGISTERED_IN_TAG not in r.data.tags]
    return sorted(found, key=lambda r: r.info.start_time)[-max_runs:]


def _curve_label(row: dict[str, Any]) -> str:
    """The id first: matplotlib's legend leaves out a label that starts with `_`."""
    return f"{row['id']} {printable(row['run'] or '')[:LABEL_CHARS]}"


def _media(client: MlflowClient, runs: list[Run], tmp: Path) -> tuple[dict[str, RunMedia], list[str]]:
    """Each run's samples and texts by its full id; a run whose artifacts are malformed is left out and
    named with the reason (one bad run never stops the comparison of the others)."""
    media, skipped = {}, []
    for run in runs:
        run_id = run.info.run_id
        try:
            media[run_id] = run_media(client, run_id, tmp / run_id)
        except BadArtifact as e:
            name = printable(run.info.run_name or "")[:LABEL_CHARS]
            skipped.append(f"{run_id} ({name}): {e}")
    return media, skipped


def compare(params: Params) -> CompareResult:
    """`compare`: the runs of tracking.experiment (or of one sweep), read where register logged them."""
    p, tracking = params.compare, params.tracking
    if p.sweep is not None and not _RUN_ID.fullmatch(p.sweep):
        raise StepError(f"compare.sweep {p.sweep[:80]!r} is no MLflow run id (letters, digits, '-' and '_'); "
                        "give the sweep's parent run id, as `voxpipe sweep-open` wrote it to sweep.json")
    if p.kfp_run is not None and not _RUN_ID.fullmatch(p.kfp_run):
        raise StepError(f"compare.kfp_run {p.kfp_run[:80]!r} is no KFP run id (letters, digits, '-' and "
                        "'_'); give the pipeline run's id as the KFP UI shows it (MLflow's "
                        "kfp.pipeline_run_id tag)")
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    with session(resolve_tracking_uri(tracking.uri, Path(tracking.work))) as client, \
            tempfile.TemporaryDirectory() as tmp:
        experiment = client.get_experiment_by_name(tracking.experiment)
        if experiment is None:
            raise StepError(
                f"no MLflow experiment {tracking.experiment!r} there (`voxpipe register` creates it)"
            )
        if p.kfp_run:
            found = _kfp_runs(client, p.kfp_run, p.max_runs)
        else:
            found = _runs(client, experiment.experiment_id, p.max_runs, p.sweep)
        if not found:
            which = f"sweep {p.sweep!r} (its parent run's id) has no child runs" if p.sweep else "has no runs"
            if p.kfp_run:
                which = (f"KFP run {p.kfp_run!r} has no runs (none tagged kfp.pipeline_run_id with it, or "
                         "none below that one)")
            raise StepError(f"MLflow experiment {tracking.experiment!r}: {which} with figures (logged by "
                            "`voxpipe register`)")
        by_id, skipped = _media(client, found, Path(tmp))
        runs = [r for r in found if r.info.run_id in by_id]
        if not runs:
            raise StepError(f"MLflow experiment {tracking.experiment!r}: every run has a malformed artifact, "
                            f"none is compared: {'; '.join(skipped)}")
        rows = build_rows(runs)
        full_id = {r.info.run_id[:8]: r.info.run_id for r in runs}
        history = {row["id"]: client.get_metric_history(full_id[row["id"]], "val/loss") for row in rows}
        curves = {_curve_label(row): sorted((m.step, m.value) for m in history[row["id"]]) for row in rows}
        png = val_curves(curves, out / "val_curves.png")
        media = {row["id"]: by_id[full_id[row["id"]]] for row in rows}
        page = compare_page(rows, media, png, skipped)
        text = render(rows, p.format)
        table = f"compare.{SUFFIX[p.format]}"
        (out / table).write_text(text)
        (out / "compare.html").write_text(page)
        if p.sweep:
            for name in (table, "compare.html", "val_curves.png"):
                client.log_artifact(p.sweep, str(out / name), "compare")
    return CompareResult(out, text, rows, table, skipped)
