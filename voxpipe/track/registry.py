"""The exported checkpoint as a registered MLflow pyfunc model version, and who gets `@champion`.

Every registered version gets `@candidate`. `@champion` moves to it only when the promotion rule
(voxpipe/evaluate/promotion.py) holds: the voice criteria as `evaluate` judged them against the
baseline, and the loss criterion against the current champion's fixed-seed loss (recorded on that
version), or the baseline's when there is no champion yet. A champion is challenged only on the
val set it was scored on (same `voxpipe.val_digest`); otherwise the candidate is refused, with the
reason. Every criterion, its numbers and its verdict are tags on the version.

Races: the upload (seconds) happens first, outside any lock; then reading the champion, deciding
and moving the aliases happen under a registry-wide lock (reglock.py: a write-once param of a run in
the pipeline-owned experiment, which only the pipeline's account may write), and the champion is
re-read right before the alias moves (compare-and-set). What `register` reports is read back from
the registry. A version is identified by (run id, export md5): registering the same export from the same run
again returns the existing version and leaves aliases alone.
"""

from __future__ import annotations

import math
import re
import tempfile
import warnings
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import requires, version
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import voxpipe
from voxpipe.errors import StepError
from voxpipe.evaluate.promotion import LossReference, Scores, Verdict, with_loss_reference
from voxpipe.steps.synthesize import SynthesizeParams
from voxpipe.track.artifacts import PipelineArtifacts
from voxpipe.track.headline import KIND_TAG
from voxpipe.track.listening_gate import AWAITS_TAG, MODE_TAG, NO_CHAMPION, WAITS, listening_mode
from voxpipe.track.reglock import register_lock
from voxpipe.track.tracking import active_run
from voxpipe.track.voices import training_locale, voice_consent, write_training_voices

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.models import ModelSignature

CANDIDATE, CHAMPION = "candidate", "champion"
LOSS_TAG = "voxpipe.eval_loss"
LOSS_STD_TAG = "voxpipe.eval_loss_std"
VAL_TAG = "voxpipe.val_digest"
EXPORT_TAG = "voxpipe.export_md5"
RULE_TAG = "voxpipe.rule."
MAX_TAG = 5000  # MLflow's limit on a tag value
CAS_TRIES = 3
# the pyfunc model's file, which MLflow runs (models from code); found, not imported: serve sits above track
SERVING_MODULE = "voxpipe.serve.pyfunc"


@dataclass(frozen=True)
class Decision:
    promoted: bool
    eval_loss: float
    compared_to: str  # "champion v3" or "baseline"
    compared_loss: float | None
    reason: str  # the rule's sentence: verdict and every criterion with its numbers
    criteria: list[dict[str, Any]] = field(default_factory=list)

    def tags(self) -> dict[str, str]:
        tags = {
            "voxpipe.decision": "promoted" if self.promoted else "not promoted",
            "voxpipe.decision_reason": self.reason[:MAX_TAG],
            LOSS_TAG: repr(self.eval_loss),
            "voxpipe.compared_to": self.compared_to,
            "voxpipe.compared_loss": repr(self.compared_loss),
        }
        for c in self.criteria:
            verdict = "ok" if c["passed"] else "FAIL"
            tags[f"{RULE_TAG}{_tag_key(c['name'])}"] = f"{verdict}: {c['detail']}"[:MAX_TAG]
        return tags

    @classmethod
    def from_tags(cls, tags: dict[str, str]) -> Decision:
        compared = tags.get("voxpipe.compared_loss", "None")
        criteria = [
            {"name": k.removeprefix(RULE_TAG), "passed": v.startswith("ok"), "detail": v.partition(": ")[2]}
            for k, v in sorted(tags.items()) if k.startswith(RULE_TAG)
        ]
        return cls(
            promoted=tags.get("voxpipe.decision") == "promoted",
            eval_loss=float(tags.get(LOSS_TAG, "nan")),
            compared_to=tags.get("voxpipe.compared_to", ""),
            compared_loss=None if compared == "None" else float(compared),
            reason=tags.get("voxpipe.decision_reason", ""),
            criteria=criteria,
        )

    @classmethod
    def from_verdict(cls, verdict: Verdict, eval_loss: float) -> Decision:
        loss = next((c for c in verdict.criteria if c.name == "loss"), None)
        return cls(verdict.promoted, eval_loss, verdict.against, loss.reference if loss else None,
                   verdict.sentence(), [c.as_dict() for c in verdict.criteria])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tag_key(name: str) -> str:
    """A criterion name as a tag key segment: similarity[spk_f] -> similarity.spk_f."""
    return re.sub(r"[^\w\-. /]", ".", name).strip(".").replace("..", ".")


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
    """Input: "text" and an optional "reference_audio" (base64 clip of the voice to clone).
    Params: seed, cfg_value, inference_timesteps, max_len (bounds: the synthesize section's fields),
    normalize (the text as ingest normalized training text, default true) and locale (how it is read; "":
    the model's own, recorded at register).
    Output: per text the 48 kHz float32 waveform, its sample rate, whether it hit max_len, and the text
    as spoken."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, ParamSchema, ParamSpec, Schema

    d = {k: getattr(SynthesizeParams(), k) for k in ("seed", "cfg_value", "inference_timesteps", "max_len")}

    return ModelSignature(
        inputs=Schema([ColSpec(DataType.string, "text"),
                       ColSpec(DataType.string, "reference_audio", required=False)]),
        outputs=Schema([
            ColSpec(Array(DataType.float), "audio"),
            ColSpec(DataType.long, "sample_rate"),
            ColSpec(DataType.boolean, "hit_length_limit"),
            ColSpec(DataType.string, "spoken_text"),
        ]),
        params=ParamSchema([
            # all double: MLflow's own type check answers a JSON 1e6 for a long with a multi-line error that
            # echoes the request; as doubles every value reaches the one request schema (serve/request.py),
            # which takes integral values as integers and refuses the rest in one line
            # max_len's default None: sized for the text (serve/request.py), never the 4096 maximum
            *(ParamSpec(k, DataType.double, None if v is None else float(v)) for k, v in d.items()),
            ParamSpec("normalize", DataType.boolean, SynthesizeParams().normalize),
            ParamSpec("locale", DataType.string, SynthesizeParams().locale),
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
    """The pyfunc model in the run; returns its model URI (models:/<model id>) and model id. Its
    model_config records the training text's locale (`training_locale`), left out when the data records none
    (the pyfunc then says what it assumes)."""
    import mlflow

    artifacts = {"checkpoint": str(art.export.resolve())}
    with tempfile.TemporaryDirectory(prefix="voxpipe-voices-") as tmp, active_run(run_id), \
            warnings.catch_warnings():
        if art.data is not None and write_training_voices(art.data.folder, art.data.rows, Path(tmp),
                                                            voice_consent(art.data.report)):
            artifacts["voices"] = tmp  # the speakers `voxpipe serve` lists, with no data folder at hand
        # no input example on purpose: validating one would load and run the full model at log time
        warnings.filterwarnings("ignore", message=".*input example was not provided.*")
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=find_spec(SERVING_MODULE).origin,
            artifacts=artifacts,
            code_paths=[str(Path(voxpipe.__file__).parent)],
            signature=signature(),
            pip_requirements=pinned_requirements(),
            # serve/pyfunc.py: load-time options
            model_config={"device": "auto", "dtype": "float32", "kernels": "auto",
                          "max_reference_seconds": SynthesizeParams().max_reference_seconds,
                          "deadline_s": SynthesizeParams().deadline_s, **_locale_config(art)},
            tags={EXPORT_TAG: art.export_md5},
        )
    return info.model_uri, info.model_id


def _locale_config(art: PipelineArtifacts) -> dict[str, str]:
    locale = training_locale(art.data.rows) if art.data is not None else None
    return {} if locale is None else {"locale": locale}


def alias_version(client: MlflowClient, name: str, alias: str) -> ModelVersion | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def decide(client: MlflowClient, name: str, evaluation: dict[str, Any]) -> tuple[Decision, str | None]:
    """The rule for this candidate (its eval.json) against the registry's current champion; also the
    champion's version."""
    verdict = Verdict.from_dict(evaluation["promotion"])
    candidate = Scores.from_dict(evaluation["scores"]["model"])
    champion = alias_version(client, name, CHAMPION)
    if not math.isfinite(candidate.loss):
        verdict = Verdict(False, verdict.against, verdict.criteria)
    elif champion is not None:
        label = f"champion v{champion.version}"
        recorded, std = champion.tags.get(LOSS_TAG), champion.tags.get(LOSS_STD_TAG, "0")
        digest, mine = champion.tags.get(VAL_TAG), evaluation.get("val_digest")
        again = evaluation.get("champion") or {}  # evaluate re-scored it on this val set
        if digest != mine and again.get("rescored") and (again.get("version"), again.get("val_digest")) == (
                champion.version, mine):
            label += " (re-scored on this val set)"
            recorded, std, digest = again["loss"], again["loss_std"], mine
        if recorded is None or digest != mine:
            why = (f"{label} has no recorded {LOSS_TAG}" if recorded is None else
                   f"{label} was scored on val set {digest}, this candidate on {mine} (other data, batching "
                   "or seeds): its loss is not comparable")
            return Decision(False, candidate.loss, label, None, f"not promoted over the {label}: {why}. To "
                            "challenge it, rerun evaluate with the registry reachable (it re-scores the "
                            "champion on this val set: evaluate.rescore_champion), or move @champion by "
                            "hand: `voxpipe promote --version N --reason ...`", verdict.as_dict()["criteria"]
                            ), champion.version
        reference = LossReference(label, float(recorded), float(std))
        verdict = with_loss_reference(verdict, candidate, reference)
    return Decision.from_verdict(verdict, candidate.loss), champion.version if champion else None


def ensure_registered_model(client: MlflowClient, name: str) -> None:
    """Created by the pipeline's account when missing (a concurrent register creating it first is fine)."""
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


def _check_eval(art: PipelineArtifacts) -> None:
    missing = [k for k in ("promotion", "scores", "val_digest") if k not in art.eval]
    if missing:
        raise StepError(f"{art.eval_path}: no {', '.join(missing)} (written by this version's `voxpipe "
                        "evaluate`); rerun evaluate, then register")
    chosen = art.eval.get("chosen", {}).get("md5")
    if chosen is not None and chosen != art.export_md5:
        raise StepError(f"{art.eval_path} judged {art.eval['chosen']['path']} (md5 {chosen}), but "
                        f"register.model {art.export} is another checkpoint (md5 {art.export_md5}); leave "
                        "register.model empty to register the one evaluate chose, or evaluate this one")


@dataclass(frozen=True)
class Place:
    """Where register writes: the store's URI (for messages), the pipeline-owned experiment (the lock's
    home) and how long to wait for the lock."""

    uri: str
    experiment_id: str
    lock_timeout_s: float


def promote(client: MlflowClient, place: Place, name: str, version: str, evaluation: dict[str, Any]
            ) -> Decision:
    """Under the registry lock: decide against the current champion, tag the version, move the aliases.

    Compare-and-set: the champion is read again right before `@champion` moves; if it changed (someone
    outside voxpipe moved it), the decision is made again, at most CAS_TRIES times, then refused."""
    with register_lock(client, place.uri, place.experiment_id, name, place.lock_timeout_s):
        for _ in range(CAS_TRIES):
            decision, read = decide(client, name, evaluation)
            now = alias_version(client, name, CHAMPION)
            if (now.version if now else None) == read:
                break
        else:
            decision = Decision(False, decision.eval_loss, decision.compared_to, decision.compared_loss,
                                f"not promoted: @champion kept moving while this register decided "
                                f"({CAS_TRIES} tries); rerun register", decision.criteria)
        mode, held = listening_mode(evaluation), {}
        if decision.promoted and mode == "required":  # @champion waits for the listening test (listen.py)
            decision = replace(decision, promoted=False, reason=f"{decision.reason}; {WAITS}")
            held = {AWAITS_TAG: read or NO_CHAMPION}
        for key, value in {**decision.tags(), LOSS_STD_TAG: repr(evaluation["scores"]["model"]["loss_std"]),
                           VAL_TAG: str(evaluation["val_digest"]), MODE_TAG: mode, **held}.items():
            client.set_model_version_tag(name, version, key, value)
        client.set_registered_model_alias(name, CANDIDATE, version)
        if decision.promoted:
            client.set_registered_model_alias(name, CHAMPION, version)
    return decision


def register_export(
    client: MlflowClient, place: Place, name: str, run_id: str, art: PipelineArtifacts,
    extra_tags: dict[str, str],
) -> Registration:
    _check_eval(art)
    existing = find_version(client, name, run_id, art.export_md5)
    if existing is not None:
        current = client.get_model_version(name, existing.version)
        return Registration(name, current.version, False, Decision.from_tags(current.tags), current.source,
                            sorted(current.aliases))
    model = LoggedModel(*log_model(run_id, art), art.export_md5)
    return register_logged(client, place, name, run_id, model, art.eval, extra_tags)


@dataclass(frozen=True)
class LoggedModel:
    """A pyfunc model already logged in a run (`log_model`): what a model version is made from."""

    uri: str  # models:/<model id>
    model_id: str
    export_md5: str


def register_logged(
    client: MlflowClient, place: Place, name: str, run_id: str, model: LoggedModel,
    evaluation: dict[str, Any], extra_tags: dict[str, str],
) -> Registration:
    """A new version of `name` from a model logged in `run_id`, then the promotion rule against the
    champion (`promote`); a sweep's close registers its best child this way (sweep.py)."""
    tags = {EXPORT_TAG: model.export_md5, KIND_TAG: str(evaluation.get("candidate_kind", "live")),
            **extra_tags}
    mv = client.create_model_version(name, model.uri, run_id=run_id, tags=tags, model_id=model.model_id)
    decision = promote(client, place, name, mv.version, evaluation)
    current = client.get_model_version(name, mv.version)  # what the registry holds now, not what we meant
    return Registration(name, current.version, True, decision, current.source, sorted(current.aliases))
