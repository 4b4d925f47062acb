"""What a decode worker does with one ingest row: judge it, condition it, and for a good row write
its FLAC.

A kept row's audio is trimmed of edge silence and brought to the target loudness (`conditioning`),
scored (`quality`), and its text spelled out for speech (`text_norm`), each switchable by an `ingest`
key; what was there before (the raw text, the original duration, the level) is kept in the row.

Kept apart from `ingest` so the decode workers import only numpy, soundfile and soxr (not pyarrow
or pydantic), plus what the conditioning they are asked for needs: they start in a fraction of the
time.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from voxpipe.data.audio import AudioDecodeError, decode_native, flac16_bytes, to_mono_resampled
from voxpipe.data.conditioning import clipped_fraction, find_trim, normalize_loudness
from voxpipe.data.language import detect_language
from voxpipe.data.quality import Dnsmos
from voxpipe.data.segment import SegmentChecks
from voxpipe.data.text_norm import normalize_text, spoken_form
from voxpipe.voxcpm2_format import SAMPLE_RATE

# Machine-readable quarantine reasons in the order the checks run; a row gets the first that applies.
# `duplicate` is judged last, by the parent, because it depends on the rows before it.
REASONS = (
    "malformed_row",
    "missing_text",
    "text_too_long",
    "missing_speaker",
    "no_consent",
    "no_audio",
    "empty_audio",
    "unsafe_path",
    "missing_file",
    "undecodable",
    "non_finite",
    "too_short",
    "too_long",
    "silent",
    "clipped",
    "low_quality",
    "no_recogniser",  # a row with no text whose language no ingest.asr recogniser covers (transcribe.py)
    "duplicate",
    "consent_voice_mismatch",  # judged after the pass, over each speaker's kept clips (consent_voice.py)
    "dropped_in_review",  # dropped on the proofreading page (ingest.corrections, corrections.py)
    # a long recording's (recording.py): its clips, or the recording itself
    "no_speech",
    "no_pause",
    "other_speaker",
    "overlap",
)
FLAGS = ("long_pause", "peak_limited")  # kept rows, marked for a look: raw.jsonl `flags`


@dataclass(frozen=True)
class RawRow:
    """One input row as read: audio is encoded bytes, a path to a file, or None."""

    row: int  # index within its file
    audio: bytes | str | None
    text: str | None
    speaker: str | None
    problem: str = ""  # why the record could not be read as a row (a malformed manifest line)
    reason: str = "malformed_row"  # the quarantine reason when there is a problem


@dataclass(frozen=True)
class RowChecks:
    """What a worker needs to judge and convert one row."""

    sample_rate: int
    min_seconds: float
    max_seconds: float
    silence_threshold: float
    out_dir: str
    trim_silence: bool = True
    max_edge_silence: float = 0.5
    max_internal_pause: float = 1.0
    normalize_loudness: bool = True
    target_lufs: float = -23.0
    max_clipped_fraction: float = 1.0
    score_quality: bool = False
    min_quality: float = 0.0
    quality_score: str = "bak"
    normalize_text: bool = True
    language: str = ""  # "" = detected per row
    locale: str = "en-US"  # text normalization's locale for this source (ingest.locale)
    speaker_locales: tuple[tuple[str, str], ...] = ()  # (speaker, locale): ingest.locale's speaker keys
    max_text_chars: int = 2000
    transcribe: bool = False  # ingest.asr is set: a row with no text is kept for the parent to transcribe
    # (speaker, why its rows may not be trained on; "" = a valid consent record); None: consent not required
    consent: tuple[tuple[str, str], ...] | None = None
    segment: SegmentChecks | None = None  # how long recordings are cut (ingest.segment)


@dataclass(frozen=True)
class Batch:
    file_index: int
    base: str  # the input file's folder: relative audio paths start here
    root: str  # the dataset folder: audio paths must stay inside it
    rows: list[RawRow]
    checks: RowChecks
    recording: bool = False  # one long recording to cut into clips (recording.py)


@dataclass(frozen=True)
class Kept:
    row: int
    audio_hash: str
    audio: str  # relative to the output folder
    duration: float
    text: str
    speaker: str
    info: dict[str, Any]  # what conditioning did, in raw.jsonl order: text_raw, language, levels, ...
    untranscribed: bool = False  # no text yet: the parent transcribes it (transcribe.py), text is ""
    span: tuple[float, float] | None = None  # a long recording's clip: its start and end there, seconds


@dataclass(frozen=True)
class Rejected:
    row: int
    reason: str
    detail: str
    span: tuple[float, float] | None = None
    similarity: float | None = None  # other_speaker, overlap: the clip's to the recording's voice


def resolve_audio_path(rel: str, base: str, root: str) -> tuple[Path | None, str]:
    """(file, "") for a path-only row, or (None, why it must not be opened). Nothing is opened here."""
    if os.path.isabs(rel) or rel.startswith("~"):
        return None, f"audio path {rel!r} is absolute; paths must be relative to the input file"
    inside = os.path.normpath(os.path.join(os.path.relpath(base, root), rel))
    if inside == ".." or inside.startswith(".." + os.sep):
        return None, f"audio path {rel!r} escapes the dataset folder {root}"
    path = Path(root, inside)
    real_root = os.path.realpath(root)
    if os.path.commonpath([os.path.realpath(path), real_root]) != real_root:
        return None, f"audio path {rel!r} is a link that leads outside the dataset folder {root}"
    return path, ""


def judge_audio(raw: RawRow, batch: Batch) -> tuple[tuple[np.ndarray, int] | None, Rejected | None]:
    """The decoded mono samples at their own rate, or why the row has none."""
    audio = raw.audio
    if audio is None:
        return None, Rejected(raw.row, "no_audio", "the row has no audio (null bytes and no path)")
    if isinstance(audio, str):
        path, unsafe = resolve_audio_path(audio, batch.base, batch.root)
        if path is None:
            return None, Rejected(raw.row, "unsafe_path", unsafe)
        if not path.is_file():
            return None, Rejected(raw.row, "missing_file", f"audio file {path} does not exist")
        if path.stat().st_size == 0:
            return None, Rejected(raw.row, "empty_audio", f"audio file {path} is empty (0 bytes)")
        source: bytes | Path = path
    elif len(audio) == 0:
        return None, Rejected(raw.row, "empty_audio", "the audio bytes are empty")
    else:
        source = audio
    try:
        return decode_native(source), None
    except (AudioDecodeError, ValueError, OSError) as e:
        # libsndfile names in-memory input by its object address; drop it so details are reproducible
        detail = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "audio bytes", str(e))
        return None, Rejected(raw.row, "undecodable", f"cannot decode the audio: {detail}")


def _judge_samples(x: np.ndarray, row: int, checks: RowChecks) -> Rejected | None:
    seconds = x.size / checks.sample_rate
    if not np.isfinite(x).all():
        return Rejected(row, "non_finite", "the decoded audio contains NaN or infinite samples")
    if seconds < checks.min_seconds:
        return Rejected(row, "too_short", f"{seconds:.3f} s is shorter than min_seconds={checks.min_seconds}")
    if seconds > checks.max_seconds:
        return Rejected(row, "too_long", f"{seconds:.3f} s is longer than max_seconds={checks.max_seconds}")
    peak = float(np.abs(x).max()) if x.size else 0.0
    if peak <= checks.silence_threshold:
        limit = checks.silence_threshold
        return Rejected(row, "silent", f"no sample louder than silence_threshold={limit} (peak {peak:.2g})")
    return None


def _pcm_digest(pcm: np.ndarray) -> str:
    return hashlib.blake2b(pcm.tobytes(), digest_size=16).hexdigest()


def _already_stored(path: Path, digest: str) -> bool:
    """A clip from an earlier run is reused only if it still decodes to exactly the same samples."""
    if not path.is_file():
        return False
    try:
        stored, _ = sf.read(path, dtype="int16")
    except (sf.LibsndfileError, RuntimeError):
        return False
    return _pcm_digest(stored) == digest


def _store(x: np.ndarray, checks: RowChecks) -> tuple[str, str]:
    """Write the clip as 16-bit FLAC named by the hash of its 16-bit samples, unless it is already there."""
    # Quantize here (clipping resampler overshoot) so the name hashes exactly the samples in the file.
    pcm = np.round(np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)
    digest = _pcm_digest(pcm)
    rel = f"audio/{digest[:2]}/{digest}.flac"
    path = Path(checks.out_dir, rel)
    if not _already_stored(path, digest):
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_bytes(flac16_bytes(pcm, checks.sample_rate))
            os.replace(tmp, path)  # atomic: a clip is never seen half-written under its final name
        except OSError:
            tmp.unlink(missing_ok=True)  # a full or read-only disk leaves no half-written temp file
            raise
    return digest, rel


@cache
def _scorer() -> Dnsmos:
    """One DNSMOS session per worker process, on one thread: the pool is the parallelism, and the
    scores must not depend on the machine's core count. A short clip is scored on one tiled window:
    a screen, a seventh of the reference's cost at 2 s (voxpipe/data/quality.py)."""
    return Dnsmos(threads=1, short="tile")


def _condition(x: np.ndarray, row: int, checks: RowChecks) -> tuple[np.ndarray, dict[str, Any]] | Rejected:
    """Trim, level and score a clip that passed the checks: (the clip, what was done) or why not kept."""
    sr = checks.sample_rate
    info: dict[str, Any] = {"duration_raw": round(x.size / sr, 4), "trim": None, "lufs_raw": None,
                            "gain_db": None, "dnsmos": None, "flags": []}
    if checks.trim_silence:
        cut = find_trim(x, sr, checks.max_edge_silence)
        info["trim"] = [round(cut.start / sr, 4), round((x.size - cut.stop) / sr, 4)]  # seconds cut, each end
        x = x[cut.start:cut.stop]
        if x.size / sr < checks.min_seconds:
            return Rejected(row, "too_short", f"{x.size / sr:.3f} s after trimming silence is shorter than "
                            f"min_seconds={checks.min_seconds}")
        if cut.longest_pause > checks.max_internal_pause:
            info["flags"].append("long_pause")
    if checks.normalize_loudness:
        x, level = normalize_loudness(x, sr, checks.target_lufs)
        info["lufs_raw"], info["gain_db"] = level.lufs_raw, level.gain_db
        if level.peak_limited:
            info["flags"].append("peak_limited")
    if checks.score_quality:
        scores = _scorer().score(to_mono_resampled(x, sr, SAMPLE_RATE), SAMPLE_RATE)
        info["dnsmos"] = {k: round(v, 3) for k, v in scores.items()}
        if info["dnsmos"][checks.quality_score] < checks.min_quality:
            shown = ", ".join(f"{k} {v:.2f}" for k, v in info["dnsmos"].items())
            return Rejected(row, "low_quality", f"DNSMOS {checks.quality_score} is below min_quality="
                            f"{checks.min_quality} ({shown})")
    return x, info


def _spoken_text(text: str, checks: RowChecks, locale: str = "") -> tuple[str, str]:
    """(the text to train on, the row's language): spoken_form in `locale` (the row's; "": the source's), as
    synthesize and serving say it."""
    if checks.normalize_text:
        return spoken_form(text, checks.language, locale or checks.locale)
    return text, checks.language or detect_language(text)


def consent_problem(row: int, speaker: str, checks: RowChecks) -> Rejected | None:
    if checks.consent is None:
        return None
    problem = dict(checks.consent).get(speaker, f"no consent record for speaker {speaker[:80]!r} in the "
                                                "voices.yaml of its input")
    return Rejected(row, "no_consent", f"speaker {speaker[:80]!r}: {problem}") if problem else None


def process_row(raw: RawRow, batch: Batch) -> Kept | Rejected:
    """Judge one row; for a good row condition its audio and text and write its 16 kHz FLAC. Cheap
    checks run before decoding, the costly quality score last."""
    checks = batch.checks
    if raw.problem:
        return Rejected(raw.row, raw.reason, raw.problem)
    text = normalize_text(raw.text) if raw.text is not None else ""
    if not text and not checks.transcribe:
        what = "null" if raw.text is None else "blank"
        return Rejected(raw.row, "missing_text", f"the text is {what} (ingest.asr transcribes such rows)")
    if len(text) > checks.max_text_chars:  # before anything costly: normalization reads every character
        return Rejected(raw.row, "text_too_long", f"the text is {len(text)} characters, more than "
                        f"max_text_chars={checks.max_text_chars}; split the clip and its transcript, or "
                        "raise ingest.max_text_chars")
    speaker = raw.speaker.strip() if raw.speaker is not None else ""
    if not speaker:
        return Rejected(raw.row, "missing_speaker", "the speaker is null or blank")
    no_consent = consent_problem(raw.row, speaker, checks)
    if no_consent is not None:  # before decoding: a voice without consent is never even written
        return no_consent
    decoded, bad = judge_audio(raw, batch)
    if bad is not None:
        return bad
    native, native_sr = decoded
    x = to_mono_resampled(native, native_sr, checks.sample_rate)
    bad = _judge_samples(x, raw.row, checks)
    if bad is not None:
        return bad
    clipped = clipped_fraction(native)  # at the file's rate: resampling smooths the flat tops away
    if clipped > checks.max_clipped_fraction:
        return Rejected(raw.row, "clipped", f"{clipped:.2%} of the samples are at full scale, more than "
                        f"max_clipped_fraction={checks.max_clipped_fraction}")
    conditioned = _condition(x, raw.row, checks)
    if isinstance(conditioned, Rejected):
        return conditioned
    x, info = conditioned
    locale = dict(checks.speaker_locales).get(speaker, checks.locale)  # the speaker's, else the source's
    if text:
        spoken, language = _spoken_text(text, checks, locale)
    else:  # no script to tell the language: ingest.language, else the locale's (en-GB -> en)
        spoken, language = "", checks.language or locale.split("-")[0].lower()
    digest, rel = _store(x, checks)
    info = {"text_raw": raw.text, "language": language, "locale": locale, **info}
    return Kept(raw.row, digest, rel, round(x.size / checks.sample_rate, 4), spoken, speaker, info,
                untranscribed=not text)


def process_batch(batch: Batch) -> tuple[int, list[Kept | Rejected]]:
    return batch.file_index, [process_row(raw, batch) for raw in batch.rows]
