"""`voxpipe promote`: a person moves `@champion` to a version, and the registry records who, when and why.

The promotion rule decides on its own only between checkpoints scored on the same data. When a person
decides otherwise (a voice they prefer by ear, a champion from an older data set they retire), this is
the way, instead of MLflow's UI: it takes the same registry lock and needs the same rights as `register`
(only the pipeline's account may edit the registered model: ownership.py), and tags the version with
who moved the alias, when, from which version, and the reason given.
"""

from __future__ import annotations

import getpass
import time
from dataclasses import dataclass
from pathlib import Path

from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.track.listening_gate import missing_listening
from voxpipe.track.ownership import check_owned
from voxpipe.track.registry import CHAMPION, alias_version
from voxpipe.track.reglock import register_lock
from voxpipe.track.tracking import (
    pipeline_experiments,
    redact_uri,
    resolve_tracking_uri,
    session,
)

TAG = "voxpipe.promoted."  # by, at, from, reason


@dataclass
class PromoteResult:
    name: str
    version: str
    previous: str | None
    by: str
    reason: str

    def summary(self) -> str:
        was = f"was v{self.previous}" if self.previous else "there was none"
        return (f"promote: models:/{self.name}/{self.version} is @champion ({was}), moved by {self.by}: "
                f"{self.reason}")


def promote(params: Params) -> PromoteResult:
    p, tracking = params.promote, params.tracking
    name = p.model or params.registered_model_name()
    if p.version < 1:
        raise StepError("promote.version is not set: name the version to make @champion with --version N")
    if not p.reason.strip():
        raise StepError("promote.reason is empty: say why @champion moves by hand (--reason '...'); it is "
                        "recorded on the version for whoever reads the registry later")
    uri = resolve_tracking_uri(tracking.uri, Path(tracking.work))
    from mlflow.exceptions import MlflowException

    with session(uri) as client:
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, Path(tracking.work))
        account = check_owned(uri, experiment, tracking.experiment, name, locks)
        try:
            tags = client.get_model_version(name, str(p.version)).tags
        except MlflowException:
            there = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
            raise StepError(f"promote.version {p.version}: registered model {name!r} at {redact_uri(uri)} "
                            f"has no such version (it has {', '.join(map(str, there)) or 'none'}); name one "
                            "with --version N, and another model with --model NAME") from None
        if (missing := missing_listening(str(p.version), tags)) is not None:
            raise StepError(f"promote.version {p.version}: {missing}")
        by = account.username if account else getpass.getuser()
        with register_lock(client, uri, locks, name, params.register_.lock_timeout_s):
            previous = alias_version(client, name, CHAMPION)
            tags = {"by": by, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reason": p.reason,
                    "from": previous.version if previous else "none"}
            for key, value in tags.items():
                client.set_model_version_tag(name, str(p.version), TAG + key, value)
            client.set_registered_model_alias(name, CHAMPION, str(p.version))
    return PromoteResult(name, str(p.version), previous.version if previous else None, by, p.reason)
