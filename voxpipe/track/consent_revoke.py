"""`voxpipe consent-revoke`: a person withdraws consent; everything trained on their voice stops being used.

Three places learn of it: the record in the data's voices.yaml is marked revoked (the next `dvc repro`
sees voices.yaml changed with its input and ingest quarantines the voice's rows, `no_consent`); every
registered version whose training data held the voice (register's `voxpipe.consent_ids` tag) is tagged
`voxpipe.consent_revoked` with the reason; and `@champion` moves off a revoked version to the newest one
that is not, or is removed when none is left. serve and synthesize refuse a revoked version
(serve/models.py). It takes register's lock and needs register's rights on the registered model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxpipe.data.consent import load_records, records_file, write_revocation
from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.track.ownership import check_owned
from voxpipe.track.registry import CHAMPION, alias_version
from voxpipe.track.reglock import register_lock
from voxpipe.track.tracking import pipeline_experiments, resolve_tracking_uri, session

CONSENT_IDS_TAG = "voxpipe.consent_ids"  # register: the consent ids of the voices a version was trained on
REVOKED_TAG = "voxpipe.consent_revoked"  # "ID: reason" on a version trained on a revoked voice
SQLITE = "sqlite:///"


@dataclass
class RevokeResult:
    consent_id: str
    records_file: Path
    name: str
    revoked: list[str] = field(default_factory=list)  # versions tagged
    champion: tuple[str | None, str | None] = (None, None)  # (before, after)

    def summary(self) -> str:
        before, after = self.champion
        moved = ("@champion unchanged" if before == after else f"@champion moved from v{before} to v{after}"
                 if after else f"@champion removed from v{before}")
        versions = ", ".join(f"v{v}" for v in self.revoked) or "none registered"
        return (f"consent-revoke: {self.consent_id} revoked in {self.records_file} (the next `dvc repro` "
                f"quarantines its rows); versions of {self.name!r} trained on it, now refused by serve: "
                f"{versions}; {moved}")


def consent_ids(version_tags: dict[str, str]) -> list[str]:
    return [i for i in version_tags.get(CONSENT_IDS_TAG, "").split(",") if i]


def trained_consent_ids(report: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The consent ids of the voices in the training rows (ingest's report.json `consent`), for register
    to tag the version with, so that a revocation finds it."""
    speakers = {row.get("speaker") for row in rows}
    records = (report.get("consent") or {}).get("records") or []
    return sorted(r["id"] for r in records if r.get("speaker") in speakers)


def _find_record(params: Params, consent_id: str) -> Path:
    for path in dict.fromkeys(records_file(i).resolve() for i in params.ingest.input):
        if path.is_file() and any(r.id == consent_id for r, _ in load_records([str(path)]).values()):
            return path
    raise StepError(f"consent.id {consent_id[:80]!r}: no record has this id in the voices.yaml of "
                    f"ingest.input ({', '.join(params.ingest.input)[:200]}); name the data with --set "
                    "ingest.input=FOLDER and the record with --id (voices.yaml's `id:`)")


def consent_revoke(params: Params) -> RevokeResult:
    p, tracking = params.consent, params.tracking
    if not p.id.strip() or not p.reason.strip():
        raise StepError("consent-revoke needs --id (the consent record's id in voices.yaml) and --reason "
                        "(why; recorded on the record and on every model version trained on the voice)")
    path = _find_record(params, p.id)
    name = params.registered_model_name()
    result = RevokeResult(p.id, path, name)
    write_revocation(path, p.id, p.reason)  # first: the data stops training even if the registry is down
    uri = resolve_tracking_uri(tracking.uri, Path(tracking.work))
    if uri.startswith(SQLITE) and not Path(uri.removeprefix(SQLITE)).is_file():
        return result  # no registry yet: nothing was registered from this voice
    from mlflow.exceptions import MlflowException

    with session(uri) as client:
        try:
            client.get_registered_model(name)
        except MlflowException:
            return result
        experiment, locks = pipeline_experiments(client, tracking.experiment, uri, Path(tracking.work))
        check_owned(uri, experiment, tracking.experiment, name, locks)
        with register_lock(client, uri, locks, name, params.register_.lock_timeout_s):
            versions = sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for v in versions:
                if p.id in consent_ids(v.tags):
                    client.set_model_version_tag(name, v.version, REVOKED_TAG, f"{p.id}: {p.reason}"[:5000])
                    client.set_model_version_tag(name, v.version, f"{REVOKED_TAG}_at", stamp)
                    v.tags[REVOKED_TAG] = p.id
                    result.revoked.append(v.version)
            champion = alias_version(client, name, CHAMPION)
            before = champion.version if champion else None
            after = before
            if champion is not None and before in result.revoked:
                usable = [v.version for v in versions if REVOKED_TAG not in v.tags]
                after = usable[-1] if usable else None
                if after:
                    client.set_registered_model_alias(name, CHAMPION, after)
                else:
                    client.delete_registered_model_alias(name, CHAMPION)
            result.champion = (before, after)
    return result
