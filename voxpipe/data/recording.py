"""What a decode worker does with one long recording: cut it at pauses, keep its one voice, and run each
clip through the same row path as a clip from a manifest.

A recording is one unit of work (one row of its source, one piece of a sharded plan). The worker decodes
it once, finds speech with Silero VAD (vad.py), cuts clips at the pauses (segment.py), judges each clip's
voice against the recording's (one_voice.py), and hands every clip it keeps to `process_row` as a row with
no text: trimming, loudness, the quality score, the checks and the FLAC are a manifest clip's. The parent
transcribes such rows (`ingest.asr`, transcribe.py) and, where the recording has a script, gives each
clip its part of it (`with_script`). Each outcome carries its span of the recording, which raw.jsonl and
quarantine.jsonl record in `source` (`start`, `end`, seconds) beside the file; the recording itself is
only read.

Resumable per recording: the outcomes of a finished recording are kept in `out/segments/<key>.json`, the
key a hash of the recording's bytes and of every setting that shapes its rows, so a rerun after a kill
reuses each finished recording (its clips still on disk) and cuts only the rest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import soundfile as sf

from voxpipe.data.audio import to_mono_resampled
from voxpipe.data.ingest_row import (
    Batch,
    Kept,
    RawRow,
    Rejected,
    consent_problem,
    judge_audio,
    process_batch,
    process_row,
)
from voxpipe.data.one_voice import judge_clips
from voxpipe.data.script_align import align_script
from voxpipe.data.segment import Cut, Uncut, cut_points
from voxpipe.data.text_norm import spoken_form
from voxpipe.data.vad import RATE, speech_probabilities

SEGMENTS = "segments"  # under the output folder: one finished recording's outcomes per file


def _key(path: Path, raw: RawRow, batch: Batch) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(hashlib.file_digest(f, "sha256").digest())
    checks = dataclasses.replace(batch.checks, out_dir="")  # the same rows wherever the output lives
    digest.update(repr((checks, raw.text, raw.speaker)).encode())
    return digest.hexdigest()[:32]


def _load(cache: Path, out_dir: str) -> list[Kept | Rejected] | None:
    """A finished recording's outcomes, if every clip they keep is still in the output folder."""
    try:
        records = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    outcomes = [Kept(**r["kept"]) if "kept" in r else Rejected(**r["rejected"]) for r in records]
    if all(isinstance(o, Rejected) or Path(out_dir, o.audio).is_file() for o in outcomes):
        return outcomes
    return None


def _save(cache: Path, outcomes: list[Kept | Rejected]) -> None:
    records = [{"kept" if isinstance(o, Kept) else "rejected": dataclasses.asdict(o)} for o in outcomes]
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(records), encoding="utf-8")
    os.replace(tmp, cache)


def _wav(x: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, x, RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def _trimmed_span(outcome: Kept, start: float, end: float) -> tuple[float, float]:
    """The clip's span in the recording after process_row trimmed its edge silence."""
    head, tail = outcome.info.get("trim") or (0.0, 0.0)
    return round(start + head, 3), round(end - tail, 3)


def cut_recording(raw: RawRow, batch: Batch) -> list[Kept | Rejected]:
    """Every outcome of one recording, in time order: rows numbered by clip."""
    checks, segment = batch.checks, batch.checks.segment
    assert segment is not None, "a recording's batch carries the segment settings"
    if raw.problem:
        return [Rejected(0, raw.reason, raw.problem)]
    no_consent = consent_problem(0, raw.speaker or "", checks)
    if no_consent is not None:  # before decoding, as for a clip
        return [no_consent]
    decoded, bad = judge_audio(raw, batch)
    if bad is not None:
        return [bad]
    native, rate = decoded
    x = to_mono_resampled(native, rate, RATE)
    name = Path(str(raw.audio)).name
    if not np.isfinite(x).all():
        return [Rejected(0, "non_finite", f"recording {name[:80]} has NaN or infinite samples")]
    cuts = cut_points(speech_probabilities(x), threshold=segment.vad_threshold,
                      min_pause=segment.min_pause_seconds, min_s=segment.min_seconds,
                      max_s=segment.max_seconds, pad=segment.pad_seconds)
    if not cuts:
        return [Rejected(0, "no_speech", f"recording {name[:80]}: the VAD heard no speech in its "
                         f"{x.size / RATE:.1f} s (silent, or not speech)")]
    clips = {k: x[int(c.start * RATE):int(c.end * RATE)] for k, c in enumerate(cuts) if isinstance(c, Cut)}
    verdicts = dict(zip(clips, judge_clips(list(clips.values()), segment.speaker_threshold,
                                           segment.overlap_threshold, segment.enrolment), strict=True))
    outcomes: list[Kept | Rejected] = []
    for k, c in enumerate(cuts):
        span = (c.start, c.end)
        if isinstance(c, Uncut):
            outcomes.append(Rejected(k, "no_pause", f"{c.end - c.start:.1f} s of speech at {c.start:.1f} s "
                                     f"of {name[:80]} with no pause the VAD heard, longer than "
                                     f"ingest.segment.max_seconds={segment.max_seconds}: not cut, since a "
                                     "clip never cuts a word. Raise max_seconds, or cut it by hand",
                                     span=span))
            continue
        verdict = verdicts[k]
        if verdict.reason == "other_speaker":
            outcomes.append(Rejected(k, "other_speaker", "another voice than the recording's: speaker "
                                     f"similarity {verdict.similarity:.3f} < "
                                     f"ingest.segment.speaker_threshold={segment.speaker_threshold}",
                                     span=span, similarity=verdict.similarity))
            continue
        if verdict.reason == "overlap":
            outcomes.append(Rejected(k, "overlap", f"two voices in one clip: a 1.6 s window scores "
                                     f"{verdict.lowest_window:.3f} < ingest.segment.overlap_threshold="
                                     f"{segment.overlap_threshold} (the clip {verdict.similarity:.3f})",
                                     span=span, similarity=verdict.similarity))
            continue
        outcome = process_row(RawRow(k, _wav(clips[k]), None, raw.speaker), batch)
        if isinstance(outcome, Kept):
            outcome = dataclasses.replace(outcome, span=_trimmed_span(outcome, *span),
                                          info={**outcome.info, "speaker_similarity": verdict.similarity})
        else:
            outcome = dataclasses.replace(outcome, span=span)
        outcomes.append(outcome)
    return outcomes


def with_script(outcomes: list[Kept | Rejected], recording: Path, normalize: bool) -> list[Kept | Rejected]:
    """A recording's transcribed clips with the text of its script (`x.txt` beside `x.wav`, as read) in
    place of what the recogniser heard: `align_script` places each clip in the script. Each such row keeps
    the recogniser's words as `asr_text`, the script's span as `text_raw`, `script_match` (1 - CER between
    the two), and `needs_review` with the alignment's reason; a clip the script does not hold keeps its
    transcript, marked for review. Run in the parent, after the recogniser, once a recording's clips are
    all transcribed. Without a script, the outcomes as they are."""
    script = recording.with_suffix(".txt")
    heard = [o for o in outcomes if isinstance(o, Kept) and o.info.get("asr")]
    if not heard or not script.is_file():
        return outcomes
    language = heard[0].info["language"]
    aligned = align_script(script.read_text(encoding="utf-8"), [o.info["text_raw"] or "" for o in heard],
                           [o.duration for o in heard], language)
    placed: dict[int, Kept] = {}
    for o, a in zip(heard, aligned, strict=True):
        text = o.text  # a clip the script does not hold keeps its transcript
        if a.text:
            text = spoken_form(a.text, language, o.info["locale"])[0] if normalize else a.text
        info = {**o.info, "text_raw": a.text or o.info["text_raw"], "asr_text": o.info["text_raw"],
                "script": script.name, "script_match": round(a.match, 4), "needs_review": a.needs_review,
                "review_reason": a.reason}
        placed[id(o)] = dataclasses.replace(o, text=text, info=info)
    return [placed.get(id(o), o) for o in outcomes]


def process_any_batch(batch: Batch) -> tuple[int, list[Kept | Rejected]]:
    """What ingest's decode pool runs: a batch of clip rows row by row, a recording cut into its clips (the
    VAD and the speaker encoder load only then)."""
    if batch.recording:
        return batch.file_index, [o for raw in batch.rows for o in process_recording(raw, batch)]
    return process_batch(batch)


def process_recording(raw: RawRow, batch: Batch) -> list[Kept | Rejected]:
    """cut_recording, or the outcomes a finished run kept for this recording."""
    path = Path(batch.base, str(raw.audio))
    cache = None
    if not raw.problem and path.is_file():
        cache = Path(batch.checks.out_dir, SEGMENTS, f"{_key(path, raw, batch)}.json")
        found = _load(cache, batch.checks.out_dir)
        if found is not None:
            return found
    outcomes = cut_recording(raw, batch)
    if cache is not None:
        _save(cache, outcomes)
    return outcomes
