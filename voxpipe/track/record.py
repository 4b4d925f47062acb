"""What one pipeline run's MLflow record holds, logged from the artifacts on disk.

- params: the resolved params (register/compare left out: they say where the record goes, not what
  ran), `train.*` as the trainer recorded them, the exported model's config (`model_config.*`),
  how training ran (`run.*`: world size, devices, dtype) and the data (`data.*`: version, counts);
- data lineage: the ingest rows as an MLflow dataset whose source is the ingest folder and whose
  digest is its DVC md5; tags: git commit, KFP run id;
- metrics: every numeric field of metrics.jsonl by step, the fixed-seed val curve (`val/*`, from
  step 0 = the base model), training totals (`train/*`), eval.json (`eval/*`), mfu.json (`mfu/*`);
- the headline (headline.py): the figures a person decides by, once more under short names
  (`val_loss`, `similarity`, `wer`, `mfu`, ...), the verdict and the val set as tags, and `set.<key>`
  tags for the params that differ from the schema's defaults;
- artifacts: train report + metrics, eval and mfu folders, the samples (playable in the UI), the
  fine-tuned model's samples once more as `audio/<val row id>-<ref|noref>.wav` (the same name in
  every run: MLflow's compare view and `compare.html` line the same sentence up), and
  plots/loss_curve.png.

Each part is logged once: a `voxpipe.logged.<part>` tag holds the digest it was logged for, so
rerunning `register` (also after a failure half-way) adds nothing twice. Training points go only
where the run has no point of that metric at that step yet: with `train.track` the trainer logged
most of them live into this run (live.py), and a step keeps one point.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.evaluate.exports import sample_tag
from voxpipe.lineage import git_commit, kfp_run_id, md5_file
from voxpipe.params import Params
from voxpipe.secrets import scrub_shapes
from voxpipe.track.artifacts import DataLineage, PipelineArtifacts
from voxpipe.track.headline import (
    KIND_TAG,
    VAL_SET_TAG,
    VERDICT_TAG,
    gain_tags,
    headline,
    recipe_changes,
    verdict,
)
from voxpipe.track.plots import loss_curve
from voxpipe.track.tracking import active_run, redact_params, scrub

if TYPE_CHECKING:
    from mlflow import MlflowClient

TRACKING_SECTIONS = ("register", "compare", "sweep", "synthesize", "tracking")  # where it logs, not what ran
RUN_FIELDS = ("world_size", "device_type", "device_name", "dtype", "lora", "kernels", "compile")
DATA_COUNTS = ("rows_in", "rows_kept", "rows_quarantined", "hours_kept")
TRAIN_TOTALS = (
    "steps", "tokens", "samples", "tokens_per_s", "samples_per_s", "train_seconds", "wall_seconds",
    "skipped_steps", "peak_memory_gib",
)
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value
BATCH = 1000  # MLflow's limit on metrics per log_batch (params/tags: 100)
TEXT_SUFFIXES = (".json", ".jsonl", ".md", ".txt", ".yaml", ".html")
# the listening test's key stays off the run until listen-record: listeners may read the run
SEALED = ("listen-key.json",)
_BAD_KEY_CHARS = re.compile(r"[^\w\-. /]")


def flatten(tree: dict[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}{sep}", sep))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_params(params: Params, art: PipelineArtifacts) -> dict[str, Any]:
    flat = {k: v for k, v in params.flat().items() if k.split(".")[0] not in TRACKING_SECTIONS}
    recorded = art.train_report.get("params")
    if isinstance(recorded, dict):  # `--set` overrides given to `train` are only visible here
        flat.update(flatten(recorded, "train."))
    flat.update(flatten(art.model_config, "model_config."))
    flat.update({f"run.{k}": art.train_report[k] for k in RUN_FIELDS if k in art.train_report})
    if art.data is not None:
        flat["data.version"] = art.data.version
        flat.update({f"data.{k}": art.data.report[k] for k in DATA_COUNTS if k in art.data.report})
    return flat


def run_title(model_name: str, flat: dict[str, Any]) -> str:
    """What the run is, for the runs list (MLflow would name it `bemused-owl-123`): the voice's model,
    LoRA or full, the steps and the learning rate, from the params the run trained with."""
    mode = f"LoRA r{flat.get('train.lora.r')}" if flat.get("train.lora.enabled") else "full"
    lr = flat.get("train.lr")
    return " · ".join([model_name, mode, f"{flat.get('train.max_steps')} steps",
                       f"lr {lr:g}" if isinstance(lr, int | float) else "lr default"])


def run_tags(art: PipelineArtifacts) -> dict[str, str]:
    commit, dirty = git_commit()
    tags = {"voxpipe.export_md5": art.export_md5}
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["voxpipe.git_dirty"] = str(dirty).lower()
    if kfp := kfp_run_id():
        tags["voxpipe.kfp_run_id"] = kfp
    r = art.train_report
    if "world_size" in r and "device_name" in r:
        tags["voxpipe.devices"] = f"{r['world_size']} x {r['device_name']}"
    return tags


def metric_key(key: str) -> str:
    return _BAD_KEY_CHARS.sub("_", key)


def numbers(fields: dict[str, Any], prefix: str) -> dict[str, float]:
    """The finite numbers (bools as 0/1) among the top-level fields, as `prefix + key` → value.

    Nested parts (eval.json's per-utterance details, mfu.json's conventions) stay in the files."""
    out = {}
    for key, value in fields.items():
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, int | float) and math.isfinite(value):
            out[metric_key(prefix + key)] = float(value)
    return out


def step_metrics(art: PipelineArtifacts) -> list[tuple[str, float, int]]:
    """(key, value, step): metrics.jsonl per step, the val curve from the train report, training totals."""
    points = []
    for row in art.metrics:
        fields = {k: v for k, v in row.items() if k != "step" and not k.startswith("val/")}
        points += [(k, v, row["step"]) for k, v in numbers(fields, "").items()]
    for point in art.train_report.get("val_curve") or []:
        points += [(k, v, point["step"]) for k, v in numbers(point, "").items() if k.startswith("val/")]
    totals = {k: art.train_report[k] for k in TRAIN_TOTALS if k in art.train_report}
    last = art.metrics[-1]["step"] if art.metrics else 0
    points += [(k, v, last) for k, v in numbers(totals, "train/").items()]
    return points


def export_points(art: PipelineArtifacts) -> list[tuple[str, float, int]]:
    """evaluate's table of scored exports as metrics against the training step (`eval/export/*`; the EMA
    and averaged candidates `eval/export_ema/*`, `eval/export_average/*`): the metric-vs-step view of which
    checkpoint was best."""
    points = []
    for row in art.eval.get("exports") or []:
        if isinstance(row.get("step"), int):
            scores = {k: v for k, v in row.items() if k != "step"}
            kind = row.get("kind", "live")
            prefix = "eval/export/" if kind == "live" else f"eval/export_{kind}/"
            points += [(k, v, row["step"]) for k, v in numbers(scores, prefix).items()]
    return points


def log_metrics(client: MlflowClient, run_id: str, points: Iterable[tuple[str, float, int]]) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v, step in points]
    for start in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[start : start + BATCH], synchronous=True)


def unheld(
    client: MlflowClient, run_id: str, points: list[tuple[str, float, int]]
) -> list[tuple[str, float, int]]:
    """The points whose metric has no value at their step in the run yet."""
    keys = {k for k, _, _ in points}
    held = {key: {m.step for m in client.get_metric_history(run_id, key)} for key in keys}
    return [(k, v, step) for k, v, step in points if step not in held[k]]


def chosen_sample_tag(evaluation: dict[str, Any]) -> str:
    """The tag evaluate named the chosen export's samples with (`step-40`, `step-40-ema`, `average`, or
    `model` for one checkpoint): eval.json's `chosen.tag`, else (an older eval.json) from `chosen.step`."""
    chosen = evaluation.get("chosen")
    if isinstance(chosen, dict) and isinstance(chosen.get("tag"), str):
        return chosen["tag"]
    step = chosen.get("step") if isinstance(chosen, dict) else None
    return sample_tag(step if isinstance(step, int) and not isinstance(step, bool) else None)


def audio_by_text(art: PipelineArtifacts) -> dict[str, Path]:
    """The fine-tuned model's samples by the name they are logged under: `<val row id>-<ref|noref>.wav`.
    evaluate names a sample `<tag>-<index>-<speaker>-<ref|noref>.wav`: the tag is the checkpoint's
    (`step-40`; the chosen export's clips are the ones its `utterances.model` describe), the index its
    place in this run's plan; the row id is the val text's, the same in every run scored on the same val
    set."""
    by_file = {f.name: f for f in art.samples}
    tag = chosen_sample_tag(art.eval)
    utterances = art.eval.get("utterances")
    records = utterances.get("model") if isinstance(utterances, dict) else None
    out = {}
    for record in records if isinstance(records, list) else []:
        if not isinstance(record, dict):
            continue
        wav = by_file.get(f"{tag}-{record.get('name')}.wav")
        if wav is not None and isinstance(record.get("row_id"), str) and record["row_id"]:
            out[f"{record['row_id']}-{'ref' if record.get('with_reference') else 'noref'}.wav"] = wav
    return out


def _log_renamed(client: MlflowClient, run_id: str, files: dict[str, Path], artifact_path: str) -> None:
    if not files:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in files.items():
            shutil.copyfile(path, Path(tmp) / name)
        client.log_artifacts(run_id, tmp, artifact_path)


def log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    """Params as given (already `redact_params`'d) and once more scrubbed by value shape: the last gate
    before MLflow, for a caller that forgot (the `allowing` in force lets launch.env_not_secret's through)."""
    from mlflow.entities import Param

    items = [Param(k, scrub_shapes(v)[:MAX_PARAM_CHARS]) for k, v in sorted(params.items())]
    for start in range(0, len(items), 100):
        client.log_batch(run_id, params=items[start : start + 100], synchronous=True)


def log_tags(client: MlflowClient, run_id: str, tags: dict[str, str]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(k, scrub_shapes(v)[:MAX_PARAM_CHARS]) for k, v in sorted(tags.items())]  # as params
    for start in range(0, len(items), 100):
        client.log_batch(run_id, tags=items[start : start + 100], synchronous=True)


def _log_dataset(data: DataLineage) -> None:
    """The ingest rows (id, speaker, text, duration) as a training dataset: schema and row count in MLflow,
    source = the ingest folder, digest = its DVC md5. Runs inside `active_run`."""
    import mlflow
    import pandas as pd
    from mlflow.data.sources import LocalArtifactDatasetSource

    columns = ["id", "speaker", "text", "duration"]
    frame = pd.DataFrame([{c: row.get(c) for c in columns} for row in data.rows], columns=columns)
    source = LocalArtifactDatasetSource(data.folder.resolve().as_uri())
    dataset = mlflow.data.from_pandas(frame, source=source, name=data.folder.name, digest=data.version)
    counts = {k: str(data.report[k]) for k in DATA_COUNTS if k in data.report}
    mlflow.log_input(dataset, context="training", tags=counts)


def _log_folder_files(
    client: MlflowClient, run_id: str, folder: Path, artifact_path: str, secrets: list[str]
) -> None:
    """Top-level report files of a step folder (json, md, png); not its large outputs."""
    for f in sorted(folder.glob("*")):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".md", ".png") and f.name not in SEALED:
            log_file(client, run_id, f, artifact_path, secrets)


def log_file(client: MlflowClient, run_id: str, path: Path, artifact_path: str, secrets: list[str]) -> None:
    """One file as a run artifact; a text file holding a secret value goes up scrubbed (a copy)."""
    if path.suffix in TEXT_SUFFIXES:
        text = path.read_text(encoding="utf-8", errors="replace")
        clean = scrub(text, secrets)
        if clean != text:
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / path.name
                copy.write_text(clean, encoding="utf-8")
                client.log_artifact(run_id, str(copy), artifact_path)
            return
    client.log_artifact(run_id, str(path), artifact_path)


def _once(client: MlflowClient, run_id: str, part: str, digest: str, log: Callable[[], None]) -> bool:
    tag = f"voxpipe.logged.{part}"
    if client.get_run(run_id).data.tags.get(tag) == digest:
        return False
    log()
    client.set_tag(run_id, tag, digest)
    return True


def log_pipeline_run(
    client: MlflowClient, run_id: str, art: PipelineArtifacts, params: dict[str, str], key: str, plots: Path,
    secrets: list[str],
) -> list[str]:
    """Log every part not yet logged for its current content; returns the parts logged now. `secrets`:
    the values scrubbed from tags and text artifacts (tracking.run_secrets)."""

    def setup() -> None:
        log_params(client, run_id, params)
        for k, v in run_tags(art).items():
            client.set_tag(run_id, k, scrub(v, secrets))
        # the few choices of this run beside the 200-odd params: the compare view's tags read short
        log_tags(client, run_id, recipe_changes(params, redact_params(Params().flat(), secrets)))
        if art.data is not None:
            with active_run(run_id):
                _log_dataset(art.data)
            for name in ("report.json", "data-report.html", "data-report.png"):  # the page ingest wrote
                if (art.data.folder / name).is_file():
                    log_file(client, run_id, art.data.folder / name, "data", secrets)

    def train() -> None:
        log_metrics(client, run_id, unheld(client, run_id, step_metrics(art)))
        log_file(client, run_id, art.train_dir / "report.json", "train", secrets)
        log_file(client, run_id, art.train_dir / "metrics.jsonl", "train", secrets)
        png = loss_curve(art.metrics, art.train_report.get("val_curve") or [], plots / "loss_curve.png")
        client.log_artifact(run_id, str(png), "plots")

    def evaluation() -> None:
        figures = [(k, v, 0) for k, v in numbers(art.eval, "eval/").items()]
        log_metrics(client, run_id, figures + export_points(art))
        _log_folder_files(client, run_id, art.eval_path.parent, "eval", secrets)
        samples = art.eval_path.parent / "samples"
        if art.samples:
            client.log_artifacts(run_id, str(samples), "eval/samples")

    def audio() -> None:
        _log_renamed(client, run_id, audio_by_text(art), "audio")

    def glance() -> None:
        figures = [(k, v, 0) for k, v in headline(art).items() if v is not None]
        log_metrics(client, run_id, figures)
        client.set_tag(run_id, VERDICT_TAG, verdict(art.eval))
        log_tags(client, run_id, gain_tags(art.eval))
        client.set_tag(run_id, KIND_TAG, str(art.eval.get("candidate_kind", "live")))
        if isinstance(art.eval.get("val_digest"), str):
            client.set_tag(run_id, VAL_SET_TAG, art.eval["val_digest"])

    def mfu() -> None:
        log_metrics(client, run_id, [(k, v, 0) for k, v in numbers(art.mfu, "mfu/").items()])
        _log_folder_files(client, run_id, art.mfu_path.parent, "mfu", secrets)

    parts = (
        ("setup", key, setup),
        ("train", art.train_digest, train),
        ("eval", art.eval_digest, evaluation),
        # a part of its own: rerunning `register` adds the clips to a run logged before they were found
        ("audio", art.eval_digest, audio),
        ("mfu", md5_file(art.mfu_path), mfu),
        ("headline", art.train_digest + art.eval_digest + md5_file(art.mfu_path), glance),
    )
    return [name for name, digest, log in parts if _once(client, run_id, name, digest, log)]
