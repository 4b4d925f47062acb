"""`voxpipe validate`: check a manifest before an expensive run, listing every problem at once.

Paths resolve from the manifest's folder, as in `voxpipe manifest`. A file at the wrong sample
rate is a problem, not something to fix silently here: feeding 48 kHz audio to the 16 kHz AudioVAE
is a known cause of garbage fine-tunes, and the fix belongs upstream in ingest.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf

from voxpipe.data.audio import AudioDecodeError, decode
from voxpipe.data.jsonl import jsonl_records
from voxpipe.errors import StepError
from voxpipe.params import Params
from voxpipe.progress import bar
from voxpipe.report import write_json
from voxpipe.steps.ingest import IngestParams

# ingest measures durations from the decoded 16 kHz samples; anything beyond rounding is a stale field
DURATION_TOLERANCE_S = 0.05


@dataclass(frozen=True)
class Problem:
    line: int
    message: str


@dataclass
class ValidateResult:
    manifest: str
    rows: int = 0
    seconds: float = 0.0
    ref_rows: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems or self.rows == 0 else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest, "usable": self.exit_code == 0, "rows": self.rows,
            "hours": round(self.seconds / 3600, 6), "ref_rows": self.ref_rows,
            "problems": [{"line": p.line, "message": p.message} for p in self.problems],
        }

    def summary(self) -> str:
        lines = [f"{self.manifest}:{p.line}: {p.message}" for p in self.problems]
        if self.rows == 0:
            lines.append(f"{self.manifest}: no rows")
        bad_rows = len({p.line for p in self.problems})
        verdict = "usable" if self.exit_code == 0 else "NOT usable"
        found = f"{len(self.problems)} problem(s) on {bad_rows} line(s)" if self.problems else "no problems"
        lines.append(
            f"validate: {self.manifest}: {self.rows} rows, {self.seconds / 3600:.3f} h, "
            f"{self.ref_rows} with ref_audio; {found} → {verdict}"
        )
        return "\n".join(lines)


@dataclass(frozen=True)
class AudioCheck:
    problem: str | None  # what is wrong with the file, phrased to follow "<field> file <path> "
    seconds: float | None  # decoded length, when the file is usable


def check_audio(path: str, p: IngestParams) -> AudioCheck:
    """Exists, is mono at the expected rate (cheap header read), and decodes to the end."""
    if not os.path.isfile(path):
        return AudioCheck("does not exist", None)
    try:
        info = sf.info(path)
    except (sf.LibsndfileError, RuntimeError) as e:
        return AudioCheck(f"cannot be read as audio: {str(e).strip()}", None)
    if info.samplerate != p.sample_rate or info.channels != 1:
        return AudioCheck(
            f"has the wrong format: expected {p.sample_rate / 1000:g} kHz mono, "
            f"got {info.samplerate} Hz {info.channels} ch",
            None,
        )
    try:
        samples = decode(path, p.sample_rate)
    except AudioDecodeError as e:
        return AudioCheck(f"does not decode: {e}", None)
    if samples.size == 0:
        return AudioCheck("has no samples", None)
    return AudioCheck(None, samples.size / p.sample_rate)


class _Checker:
    """Checks rows one by one; each audio file is decoded once, however many rows name it."""

    def __init__(self, p: IngestParams, base: Path) -> None:
        self.p = p
        self.base = base
        self.cache: dict[str, AudioCheck] = {}

    def audio(self, rel: str) -> AudioCheck:
        path = os.path.normpath(os.path.join(self.base, rel))
        if path not in self.cache:
            self.cache[path] = check_audio(path, self.p)
        return self.cache[path]

    def file_field(self, row: dict[str, Any], key: str, duration_key: str) -> tuple[list[str], float | None]:
        """Problems with row[key] (an audio path) and with row[duration_key], if present."""
        rel = row[key]
        if not isinstance(rel, str) or not rel.strip():
            return [f"{key} must be a non-empty path, got {rel!r}"], None
        check = self.audio(rel)
        if check.problem is not None:
            return [f"{key} file {rel} {check.problem}"], None
        out = []
        if duration_key in row:
            stated = row[duration_key]
            if isinstance(stated, bool) or not isinstance(stated, int | float) or not math.isfinite(stated):
                out.append(f"{duration_key} must be a number of seconds, got {stated!r}")
            elif abs(stated - check.seconds) > DURATION_TOLERANCE_S:
                out.append(f"{duration_key} field says {stated:.3f} s but {key} file {rel} is "
                           f"{check.seconds:.3f} s")
        return out, check.seconds

    def row(self, row: dict[str, Any] | None, bad: str) -> tuple[list[str], float | None, bool]:
        """(problems, decoded seconds of `audio`, has a ref_audio) for one manifest line (None: `bad`)."""
        if row is None:
            return [bad], None, False
        problems = []
        text = row.get("text")
        if text is None:
            problems.append("text is missing")
        elif not isinstance(text, str):
            problems.append(f"text must be a string, got {text!r}")
        elif not text.strip():
            problems.append("text is blank")
        seconds = None
        if "audio" not in row:
            problems.append("audio is missing")
        else:
            found, seconds = self.file_field(row, "audio", "duration")
            problems += found
            if seconds is not None and not self.p.min_seconds <= seconds <= self.p.max_seconds:
                problems.append(f"audio file {row['audio']} is {seconds:.3f} s, outside "
                                f"[{self.p.min_seconds:g}, {self.p.max_seconds:g}] s")
        has_ref = row.get("ref_audio") is not None
        if has_ref:
            problems += self.file_field(row, "ref_audio", "ref_duration")[0]
        return problems, seconds, has_ref


def validate_manifest(params: Params) -> ValidateResult:
    """Check `validate.manifest` against ingest's sample rate and duration bounds (the data's promise)."""
    manifest = params.validate_.manifest
    path = Path(manifest)
    if not path.is_file():
        raise StepError(f"manifest {path} does not exist")
    records = list(jsonl_records(path))
    checker = _Checker(params.ingest, path.resolve().parent)
    result = ValidateResult(manifest=manifest)
    for n, row, bad in bar(records, desc=f"validate {path.name}", unit="row"):
        problems, seconds, has_ref = checker.row(row, bad)
        result.rows += 1
        result.seconds += seconds or 0.0
        result.ref_rows += has_ref
        result.problems += [Problem(n, m) for m in problems]
    write_json(Path(params.validate_.out) / "validate.json", result.as_dict())
    return result
