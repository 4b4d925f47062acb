"""Consent records: who agreed that their voice be trained on or cloned, to what, until when.

A data set carries its records in a `voices.yaml` beside the data (in an `ingest.input` folder, or the
folder of an input file), so DVC versions the records with the clips they cover. One record per
speaker of the data:

    voices:
      - id: consent-anna-2026
        speaker: anna              # the speaker column's value (or the folder name of a one-voice set)
        subject: Anna Example      # who agreed
        kind: person               # person | synthetic (a generated voice, nobody's)
        scope: [tts, voice_clone]
        granted: 2026-01-10
        expires: 2027-01-10        # null: no end
        licence: CC-BY-4.0
        recording: consent/anna.flac   # the consent statement read aloud (not needed for synthetic)
        recording_sha256: 3f1a...
        revoked: false
        revoked_reason: ""

ingest quarantines a speaker's rows (`no_consent`) unless its record is valid today;
`voxpipe consent-revoke` writes `revoked` here so the next `dvc repro` drops the voice.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from voxpipe.errors import StepError

FILE = "voices.yaml"
Scope = Literal["tts", "voice_clone"]


class ConsentRecord(BaseModel):
    """One voice's consent, as a record of `voices.yaml`."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=120, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    speaker: str = Field(min_length=1)
    subject: str = Field(min_length=1)
    kind: Literal["person", "synthetic"]
    scope: list[Scope] = Field(min_length=1)
    granted: datetime.date
    expires: datetime.date | None = None
    licence: str = Field(min_length=1)
    recording: str | None = None
    recording_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    revoked: bool = False
    revoked_reason: str = ""

    @model_validator(mode="after")
    def _a_person_has_a_recording(self) -> ConsentRecord:
        """A person's consent is only as good as the recording of it; a synthetic voice has nobody's."""
        if self.kind == "person" and not (self.recording and self.recording_sha256):
            raise ValueError("a record of kind person needs recording and recording_sha256 (the consent "
                             "statement read aloud by that person, and its sha256)")
        return self

    def problem(self, today: datetime.date, need: Scope = "tts") -> str:
        """Why this record does not allow `need` (tts: training a voice) today, or ""."""
        if self.revoked:
            return f"consent {self.id} was revoked ({self.revoked_reason[:80] or 'no reason given'})"
        if self.granted > today:
            return f"consent {self.id} is granted from {self.granted}, after today ({today})"
        if self.expires is not None and self.expires < today:
            return f"consent {self.id} expired on {self.expires}"
        if need not in self.scope:
            what = "training a voice" if need == "tts" else "cloning a voice"
            return f"consent {self.id}'s scope {self.scope} does not include {need} ({what})"
        return ""


class VoicesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voices: list[ConsentRecord] = Field(default_factory=list)


def records_file(input_path: str | Path) -> Path:
    """Where an input's records live: `voices.yaml` in the input folder, or beside an input file."""
    path = Path(input_path)
    return (path if path.is_dir() else path.parent) / FILE


def read_records(path: Path) -> list[ConsentRecord]:
    """The records of one voices.yaml, or a one-paragraph StepError naming the file and the key."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise StepError(f"{path}: cannot read the consent records ({str(e)[:200]}). Fix the file (see "
                        "docs/responsible-release.md for its fields) and rerun") from None
    try:
        records = VoicesFile.model_validate(data).voices
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise StepError(f"{path}: key {key}: {first['msg']} ({e.error_count()} problem"
                        f"{'s' if e.error_count() > 1 else ''} in all). Each record under `voices:` "
                        "needs id, speaker, subject, kind (person | synthetic), scope (tts, voice_clone), "
                        "granted, licence, and for a person recording + recording_sha256 "
                        "(docs/responsible-release.md)") from None
    seen: dict[str, str] = {}
    for i, r in enumerate(records):
        for key, value in (("id", r.id), ("speaker", r.speaker)):
            if f"{key}:{value}" in seen:
                raise StepError(f"{path}: key voices.{i}.{key}: {value[:80]!r} is given twice; one record "
                                f"per voice, each with its own id")
            seen[f"{key}:{value}"] = value
        if r.recording:
            _check_recording(path, i, r)
    return records


def _check_recording(path: Path, i: int, r: ConsentRecord) -> None:
    """The consent recording is the evidence: it must be there and be the file the record hashed."""
    audio = path.parent / r.recording
    if not audio.is_file():
        raise StepError(f"{path}: key voices.{i}.recording: {r.recording[:80]!r} is not a file beside "
                        f"{path.name}; put the consent recording there or fix the path")
    if r.recording_sha256 and hashlib.sha256(audio.read_bytes()).hexdigest() != r.recording_sha256:
        raise StepError(f"{path}: key voices.{i}.recording_sha256 does not match {audio}: the recording "
                        "changed since the record was written. Restore it, or take consent again")


def load_records(inputs: list[str]) -> dict[str, tuple[ConsentRecord, Path]]:
    """{speaker: (record, its voices.yaml)} over every input's records file (one read once)."""
    found: dict[str, tuple[ConsentRecord, Path]] = {}
    for path in dict.fromkeys(records_file(i).resolve() for i in inputs):
        if path.is_file():
            for r in read_records(path):
                found.setdefault(r.speaker, (r, path))
    return found


def today() -> datetime.date:
    return datetime.datetime.now(datetime.UTC).date()


def write_revocation(path: Path, consent_id: str, reason: str) -> ConsentRecord:
    """Mark record `consent_id` of `path` revoked (with its reason), keeping the file's other records."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    records = read_records(path)
    for i, r in enumerate(records):
        if r.id == consent_id:
            data["voices"][i].update(revoked=True, revoked_reason=reason)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
            tmp.replace(path)
            return records[i].model_copy(update={"revoked": True, "revoked_reason": reason})
    raise StepError(f"{path}: no record has id {consent_id[:80]!r}; ids there: "
                    f"{', '.join(r.id for r in records)[:200] or 'none'}")
