"""The exported checkpoint as a registered MLflow pyfunc model version, and who gets `@champion`.

Every registered version gets `@candidate`. `@champion` moves to it only when its fixed-seed eval
loss is lower than the current champion's (recorded on that version as `voxpipe.eval_loss`), or,
with no champion yet, lower than the base model's loss from the same evaluation. The decision and
both numbers are tags on the version. A version is identified by (run id, export md5): registering
the same export from the same run again returns the existing version and leaves aliases alone.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from importlib.metadata import requires, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import voxpipe
from voxpipe.track.artifacts import PipelineArtifacts
from voxpipe.track.tracking import active_run

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.models import ModelSignature

CANDIDATE, CHAMPION = "candidate", "champion"
LOSS_TAG = "voxpipe.eval_loss"
EXPORT_TAG = "voxpipe.export_md5"
SERVING_CODE = Path(__file__).with_name("serving.py")


@dataclass(frozen=True)
class Decision:
    promoted: bool
    eval_loss: float
    compared_to: str  # "champion v3" or "base model"
    compared_loss: float | None
    reason: str

    def tags(self) -> dict[str, str]:
        return {
            "voxpipe.decision": "promoted" if self.promoted else "not promoted",
            "voxpipe.decision_reason": self.reason,
            LOSS_TAG: repr(self.eval_loss),
            "voxpipe.compared_to": self.compared_to,
            "voxpipe.compared_loss": repr(self.compared_loss),
        }

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Decision:
        compared = tags.get("voxpipe.compared_loss", "None")
        return cls(
            promoted=tags.get("voxpipe.decision") == "promoted",
            eval_loss=float(tags.get(LOSS_TAG, "nan")),
            compared_to=tags.get("voxpipe.compared_to", ""),
            compared_loss=None if compared == "None" else float(compared),
            reason=tags.get("voxpipe.decision_reason", ""),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def pinned_requirements() -> list[str]:
    """voxpipe's runtime dependencies at the versions installed here (local tags like +cpu dropped:
    the serving image picks its own torch build)."""
    from packaging.requirements import Requirement

    pins = []
    for spec in requires("voxpipe") or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra (dev tools)
        pins.append(f"{req.name}=={version(req.name).split('+')[0]}")
    return sorted(pins)


def signature() -> ModelSignature:
    """Input: texts (one string column). Params: seed, cfg_value, inference_timesteps, max_len.
    Output: per text the 48 kHz float32 waveform, its sample rate and whether it hit max_len."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

    from voxpipe.track.serving import GENERATION_DEFAULTS as d

    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string)]),
        outputs=Schema([
            ColSpec(Array(DataType.float), "audio"),
            ColSpec(DataType.long, "sample_rate"),
            ColSpec(DataType.boolean, "hit_length_limit"),
        ]),
        params=ParamSchema([
            ParamSpec("seed", DataType.long, d["seed"]),
            ParamSpec("cfg_value", DataType.double, d["cfg_value"]),
            ParamSpec("inference_timesteps", DataType.long, d["inference_timesteps"]),
            ParamSpec("max_len", DataType.long, d["max_len"]),
        ]),
    )


def find_version(client: MlflowClient, name: str, run_id: str, export_md5: str) -> ModelVersion | None:
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    except MlflowException:
        return None
    return next((v for v in versions if v.tags.get(EXPORT_TAG) == export_md5), None)


def log_model(run_id: str, art: PipelineArtifacts) -> tuple[str, str]:
    """The pyfunc model in the run; returns its model URI (models:/<model id>) and model id."""
    import mlflow

    with active_run(run_id), warnings.catch_warnings():
        # no input example on purpose: validating one would load and run the full model at log time
        warnings.filterwarnings("ignore", message=".*input example was not provided.*")
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=str(SERVING_CODE),
            artifacts={"checkpoint": str(art.export.resolve())},
            code_paths=[str(Path(voxpipe.__file__).parent)],
            signature=signature(),
            pip_requirements=pinned_requirements(),
            model_config={"device": "auto", "dtype": "float32"},
            tags={EXPORT_TAG: art.export_md5},
        )
    return info.model_uri, info.model_id


def _alias_version(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def decide(client: MlflowClient, name: str, eval_loss: float, baseline_loss: float | None) -> Decision:
    champion = _alias_version(client, name, CHAMPION)
    if not math.isfinite(eval_loss):
        return Decision(False, eval_loss, "nothing", None, "eval loss is not finite")
    if champion is not None:
        label = f"champion v{champion.version}"
        recorded = champion.tags.get(LOSS_TAG)
        if recorded is None:
            return Decision(False, eval_loss, label, None, f"{label} has no recorded {LOSS_TAG} to beat")
        reference = float(recorded)
    else:
        label = "base model"
        if baseline_loss is None:
            return Decision(False, eval_loss, label, None, "no champion and eval.json has no loss_baseline")
        reference = baseline_loss
    promoted = eval_loss < reference
    reason = f"eval loss {eval_loss:.6g} {'<' if promoted else '>='} {label}'s {reference:.6g}"
    return Decision(promoted, eval_loss, label, reference, reason)


def _ensure_registered_model(client: MlflowClient, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


@dataclass(frozen=True)
class Registration:
    name: str
    version: str
    created: bool
    decision: Decision
    model_source: str
    aliases: list[str]


def register_export(
    client: MlflowClient, name: str, run_id: str, art: PipelineArtifacts, extra_tags: dict[str, str]
) -> Registration:
    existing = find_version(client, name, run_id, art.export_md5)
    if existing is not None:
        current = client.get_model_version(name, existing.version)
        return Registration(name, current.version, False, Decision.from_tags(current.tags), current.source,
                            sorted(current.aliases))
    baseline = art.eval.get("loss_baseline")
    decision = decide(client, name, float(art.eval["loss_model"]),
                      float(baseline) if isinstance(baseline, int | float) else None)
    model_uri, model_id = log_model(run_id, art)
    _ensure_registered_model(client, name)
    tags = {EXPORT_TAG: art.export_md5, **extra_tags, **decision.tags()}
    mv = client.create_model_version(name, model_uri, run_id=run_id, tags=tags, model_id=model_id)
    client.set_registered_model_alias(name, CANDIDATE, mv.version)
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION, mv.version)
    current = client.get_model_version(name, mv.version)
    return Registration(name, current.version, True, decision, current.source, sorted(current.aliases))
