"""The voices a registered version can speak in: one reference clip and its transcript per speaker of its
training data, logged with the model (the artifact "voices") so that `voxpipe serve` lists and uses them
with no data folder at hand.

The folder holds `voices.json` (a list of {id, speaker, text, file, seconds, locale, consent}: locale is how
the speaker's training text was read, `ingest.locale`; absent for data ingested before it was recorded;
consent the {id, scope} of the speaker's consent record, absent without one) and the clips under `clips/`;
`voxpipe serve` keeps the voices a client adds (POST /v1/audio/voices) in the same layout.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from voxpipe.errors import StepError
from voxpipe.steps.ingest import IngestParams
from voxpipe.steps.synthesize import SynthesizeParams

VOICES_FILE = "voices.json"
CLIPS = "clips"
DEFAULT_VOICE = "default"  # no reference: the voice the model learned
ASSUMED_LOCALE: str = IngestParams.model_fields["locale"].default  # what a model or voice that recorded no
# locale was trained in: ingest's default
LOCALE_TAG = "voxpipe.locale"  # a run's and its version's: the locale most training rows were read in
PREFERRED_SECONDS = 6.0  # a few seconds of speech clone a voice; longer costs time, not quality
MAX_SECONDS: float = SynthesizeParams.model_fields["max_reference_seconds"].default


def voice_id(name: str) -> str:
    """A voice name as a URL-safe id ("Speaker A/1" -> "speaker-a-1"); `default` is never one."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-")[:64] or "voice"
    return f"{slug}-voice" if slug == DEFAULT_VOICE else slug


def training_locale(rows: list[dict[str, Any]]) -> str | None:
    """The locale most of the training rows were read in (raw.jsonl's `locale`, `ingest.locale`): the one
    the registered model reads a request's text in. None when no row records one (ingested before)."""
    counts = Counter(row["locale"] for row in rows if isinstance(row.get("locale"), str))
    return min(counts, key=lambda locale: (-counts[locale], locale)) if counts else None


def voice_consent(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{speaker: {id, scope}} of the consent records ingest relied on (its report.json `consent`)."""
    records = (report.get("consent") or {}).get("records") or []
    return {r["speaker"]: {"id": r["id"], "scope": r["scope"]} for r in records if r.get("valid")}


def write_training_voices(ingest: Path, rows: list[dict[str, Any]], out: Path,
                          consent: dict[str, dict[str, Any]] | None = None) -> Path | None:
    """out/voices.json + out/clips/: per speaker the kept clip nearest PREFERRED_SECONDS (at most the served
    reference limit), with its consent record's {id, scope} (`consent`); None when the rows name no
    speaker."""
    chosen: dict[str, dict[str, Any]] = {}
    for row in rows:
        speaker, seconds = row.get("speaker"), row.get("duration")
        if not isinstance(speaker, str) or not isinstance(seconds, int | float) or seconds > MAX_SECONDS:
            continue
        best = chosen.get(speaker)
        if best is None or abs(seconds - PREFERRED_SECONDS) < abs(best["duration"] - PREFERRED_SECONDS):
            chosen[speaker] = row
    if not chosen:
        return None
    (out / CLIPS).mkdir(parents=True, exist_ok=True)
    voices, taken = [], set()
    for speaker, row in sorted(chosen.items()):
        vid = voice_id(speaker)
        while vid in taken:
            vid += "-2"
        taken.add(vid)
        source = ingest / row["audio"]
        if not source.is_file():
            raise StepError(f"{ingest / 'raw.jsonl'}: row {row.get('id')}'s audio {source} is missing; rerun "
                            "`voxpipe ingest` into that folder")
        clip = Path(CLIPS) / f"{vid}{source.suffix}"
        shutil.copyfile(source, out / clip)
        voices.append({"id": vid, "speaker": speaker, "text": row.get("text", ""), "file": clip.as_posix(),
                       "seconds": round(float(row["duration"]), 3),
                       **({"locale": row["locale"]} if isinstance(row.get("locale"), str) else {}),
                       **({"consent": (consent or {})[speaker]} if speaker in (consent or {}) else {})})
    (out / VOICES_FILE).write_text(json.dumps(voices, ensure_ascii=False, indent=1) + "\n")
    return out
