"""`voxpipe listen-record`: one listener's answers to listen.html into the registered run in MLflow.

The answers are checked against the key evaluate sealed beside the page (listen_answers.py), and the key
against the model version register made (the same export md5), before anything is written. Then the
listener's per-trial judgements become the run's artifact `listening/answers/<listener>.json` (recording
the same listener again replaces their answers), and every listener recorded so far is pooled: the
figures (mean CMOS with its Wilcoxon p-value, preference rate with its binomial interval, per question)
go to the run as metrics and `listening/summary.json` (a null with its reason there), the verdict and
listeners to the run and the model version as tags. With `evaluate.listening: required` a passing test
moves @champion to the version the rule held back (listening_gate.py), under register's lock and only
while @champion is still the version the rule judged it against.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxpipe.errors import StepError, quoted
from voxpipe.evaluate.listen_answers import dump, judgements, read_answers, read_key, summarize
from voxpipe.files import read_json_object
from voxpipe.params import Params
from voxpipe.track.listening_gate import AWAITS_TAG, NO_CHAMPION, VERDICT_TAG
from voxpipe.track.ownership import check_owned
from voxpipe.track.registry import CHAMPION, EXPORT_TAG, MAX_TAG, alias_version
from voxpipe.track.reglock import register_lock
from voxpipe.track.tracking import pipeline_experiments, redact_uri, resolve_tracking_uri, session

if TYPE_CHECKING:
    from mlflow import MlflowClient

ANSWERS_DIR = "listening/answers"
SUMMARY = "listening/summary.json"
LISTENERS_TAG = "voxpipe.listening_listeners"


@dataclass
class ListenResult:
    name: str
    version: str
    listener: str
    figures: dict[str, Any]  # every listener so far, pooled (listen_answers.summarize)
    champion: str  # what happened to @champion

    def summary(self) -> str:
        return (f"listen-record: {self.listener}'s answers logged to the run of models:/{self.name}/"
                f"{self.version}; {self.figures['verdict']}; {self.champion}")


def _file_name(listener: str) -> str:
    """The listener id as an artifact file name (one file per listener)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", listener)[:80] or "listener"


def _registered(path: Path) -> tuple[str, str, str]:
    record = read_json_object(path, "register's registered.json")
    if record.get("version") is None or not record.get("run_id"):
        raise StepError(f"{path} names no model version (a sweep's child run: `voxpipe sweep-close` "
                        "registers the sweep's best); record the answers against the registered.json of the "
                        "register that made the version (--registered)")
    return str(record["name"]), str(record["version"]), str(record["run_id"])


def _pooled(client: MlflowClient, run_id: str) -> list[dict[str, Any]]:
    """Every listener's judgements logged to the run so far."""
    out = []
    with tempfile.TemporaryDirectory(prefix="voxpipe-listening-") as tmp:
        for info in client.list_artifacts(run_id, ANSWERS_DIR):
            local = client.download_artifacts(run_id, info.path, tmp)
            out += json.loads(Path(local).read_text(encoding="utf-8"))
    return out


def _metrics(summary: dict[str, Any]) -> dict[str, float]:
    out = {"listening/judgements": float(summary["judgements"]),
           "listening/listeners": float(len(summary["listeners"]))}
    for q, figures in summary["questions"].items():
        for key in ("cmos_mean", "wilcoxon_p", "preference", "preference_low", "preference_high",
                    "preference_p"):
            if isinstance(figures.get(key), int | float):
                out[f"listening/{q}_{key}"] = float(figures[key])
    return out


def _move_champion(client: MlflowClient, name: str, version: str, tags: dict[str, str], verdict: str,
                   lock: tuple[str, str, float]) -> str:
    """@champion to `version` when the rule promoted it and @champion is still what it was judged against."""
    judged = tags.get(AWAITS_TAG)
    if judged is None:
        return "@champion left alone (the rule did not hold this version back for a listening test)"
    with register_lock(client, lock[0], lock[1], name, lock[2]):
        now = alias_version(client, name, CHAMPION)
        current = now.version if now else NO_CHAMPION
        if current != judged:
            return (f"@champion not moved: it is {_named(current)} now, but the rule judged v{version} "
                    f"against {_named(judged)}; rerun register to judge it again, or `voxpipe promote "
                    f"--version {version} --reason ...`")
        client.set_model_version_tag(name, version, "voxpipe.decision", "promoted")
        client.set_model_version_tag(name, version, "voxpipe.decision_reason",
                                     f"promoted after the {verdict}"[:MAX_TAG])
        client.delete_model_version_tag(name, version, AWAITS_TAG)
        client.set_registered_model_alias(name, CHAMPION, version)
    return f"@champion moved to v{version} (was {_named(judged)})"


def _named(version: str) -> str:
    return "no champion" if version == NO_CHAMPION else f"v{version}"


def listen_record(params: Params) -> ListenResult:
    p, tracking = params.listen, params.tracking
    if not p.answers:
        raise StepError("listen.answers is not set: name the answers file listen.html saved (--answers FILE)")
    key_path = Path(p.key)
    key = read_key(key_path)
    answers = read_answers(Path(p.answers), key, key_path)
    judged = judgements(key, answers)
    name, version, run_id = _registered(Path(p.registered))
    uri = resolve_tracking_uri(tracking.uri, Path(tracking.work))
    from mlflow.exceptions import MlflowException

    with session(uri) as client:
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, Path(tracking.work))
        check_owned(uri, experiment, tracking.experiment, name, locks)
        try:
            mv = client.get_model_version(name, version)
        except MlflowException:
            raise StepError(f"{p.registered}: models:/{name}/{version} is not in the registry at "
                            f"{redact_uri(uri)}; name the registered.json of this registry's register "
                            "(--registered), or the registry it went to (--tracking-uri)") from None
        if mv.tags.get(EXPORT_TAG) != key["export_md5"]:
            raise StepError(f"{key_path} seals a listening test of export md5 {quoted(key['export_md5'])}, "
                            f"but models:/{name}/{version} is export {mv.tags.get(EXPORT_TAG)}: the page is "
                            "of another evaluation than the one registered. Record it against the register "
                            "of that evaluation (--registered), or take the test on this evaluation's "
                            "listen.html")
        client.log_text(run_id, dump(judged), f"{ANSWERS_DIR}/{_file_name(answers['listener'])}.json")
        summary = summarize(_pooled(client, run_id))
        client.log_text(run_id, json.dumps(summary, indent=1, sort_keys=True) + "\n", SUMMARY)
        from mlflow.entities import Metric

        stamp = time.time_ns() // 1_000_000
        client.log_batch(run_id, metrics=[Metric(k, v, stamp, 0) for k, v in _metrics(summary).items()],
                         synchronous=True)
        listeners = ", ".join(summary["listeners"])[:MAX_TAG]
        for key_, value in ((VERDICT_TAG, summary["verdict"][:MAX_TAG]), (LISTENERS_TAG, listeners)):
            client.set_tag(run_id, key_, value)
            client.set_model_version_tag(name, version, key_, value)
        if CHAMPION in mv.aliases:
            champion = f"v{version} is @champion"
        elif summary["passed"]:
            champion = _move_champion(client, name, version, mv.tags, summary["verdict"],
                                      (uri, locks, params.register_.lock_timeout_s))
        else:
            champion = "@champion left alone (the test did not pass)"
    return ListenResult(name, version, answers["listener"], summary, champion)
