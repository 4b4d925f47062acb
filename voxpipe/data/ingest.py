"""`voxpipe ingest`: input rows → 16 kHz mono FLAC files + raw.jsonl, bad rows quarantined.

The inputs (parquet, CSV/TSV/JSONL manifests, LJSpeech folders: `sources`) are streamed in small
batches; a process pool decodes, checks, resamples and
writes each row's audio, and the parent writes results strictly in input order. At most
`2 × workers` batches are in flight, so memory stays flat however large the data set is. Audio
files are named by a hash of the decoded 16 kHz samples: a rerun finds them already written and
produces byte-identical raw.jsonl. Every input row ends up either in raw.jsonl or, with a
machine-readable reason, in quarantine.jsonl — never dropped silently. Files left in `out/audio/`
by earlier runs on other inputs are kept (they are simply not referenced). With `shards` > 1 the
same work is planned, run shard by shard and merged (`ingest_shards`), with byte-identical raw.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from voxpipe.cores import usable_cores
from voxpipe.data.consent import FILE as CONSENT_FILE
from voxpipe.data.consent import load_records, records_file, today
from voxpipe.data.consent_voice import mismatched
from voxpipe.data.corrections import REASON as REVIEW_REASON
from voxpipe.data.corrections import Correction, Review, read_corrections
from voxpipe.data.data_report import write_data_report
from voxpipe.data.ingest_row import (
    FLAGS,
    REASONS,
    Batch,
    Kept,
    Rejected,
    RowChecks,
    normalize_text,
)
from voxpipe.data.language import detect_language
from voxpipe.data.parquet_source import Columns
from voxpipe.data.recording import process_any_batch, with_script
from voxpipe.data.segment import SegmentChecks
from voxpipe.data.sources import RECORDING, SourceFile, iter_rows, open_sources
from voxpipe.data.text_norm import spoken_form, unsure_readings
from voxpipe.data.transcribe import transcriber as load_transcriber
from voxpipe.errors import StepError
from voxpipe.progress import bar
from voxpipe.report import write_report
from voxpipe.steps.ingest import IngestParams, Locales

BATCH_ROWS = 8  # rows per unit of work: in-flight audio stays a few MB per worker
LOG_SECONDS = 30.0  # off a terminal: one progress line this often
SPEAKERS_NAMED = 5  # the summary names the speakers when there are this few
DEFAULT_LOCALE: str = IngestParams.model_fields["locale"].default  # of a source ingest.locale's mapping omits
log = logging.getLogger(__name__)


def decode_workers(requested: int) -> int:
    """`ingest.workers`, or all usable cores for 0; more processes than cores only crowd each other
    (and 100,000 of them take the machine down), so that is refused before anything starts."""
    cores = usable_cores()
    if requested > cores:
        raise StepError(
            f"ingest.workers={requested} is more than the {cores} cores this process may use (its CPU "
            f"affinity and cgroup quota): decode processes beyond the cores only slow each other down. "
            f"Set ingest.workers to {cores} or fewer, or 0 for all of them"
        )
    return requested or cores


def _ordered_map(fn: Callable[[Batch], Any], jobs: Iterable[Batch], workers: int) -> Iterator[Any]:
    """fn over jobs in a process pool, results in input order, at most 2 × workers jobs in flight."""
    if workers == 1:  # no pool: no pickling, and the parent is the one decoding process
        yield from map(fn, jobs)
        return
    # forkserver: workers fork from a clean server process that has imported only the row code, so
    # they start fast and inherit none of the parent's threads (pyarrow's, tqdm's).
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([fn.__module__])
    pool = ProcessPoolExecutor(workers, mp_context=ctx)
    pending: deque[Future] = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(fn, job))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class IngestResult:
    out: Path
    rows_in: int = 0
    rows_kept: int = 0
    rows_quarantined: int = 0
    reasons: Counter = field(default_factory=Counter)
    speakers: Counter = field(default_factory=Counter)
    seconds_kept: float = 0.0
    wall_seconds: float = 0.0
    workers: int = 1
    shards: int = 1
    notices: list[str] = field(default_factory=list)
    conditioning: Counter = field(default_factory=Counter)  # what was done to the kept rows (report.json)
    languages: Counter = field(default_factory=Counter)
    # every kept row whose text normalization changed its text, in raw.jsonl order: {id, before, after,
    # unsure: why it is worth proofreading (text_norm.unsure_readings)}
    # (report.json and the data report list them all, so a wrong reading is found by reading, not luck)
    text_changes: list[dict[str, str]] = field(default_factory=list)
    review: Review | None = None  # what the proofreading corrections did (corrections.py)

    def count_kept(self, row: dict[str, Any]) -> None:
        """Account for one kept raw.jsonl row: the single run and the merge count the same lines."""
        self.rows_kept += 1
        self.seconds_kept += row["duration"]
        self.speakers[row["speaker"]] += 1
        self.languages[row.get("language") or ""] += 1
        c = self.conditioning
        if row.get("text_raw") is not None and row["text"] != normalize_text(row["text_raw"]):
            c["text_normalized"] += 1
            self.text_changes.append({"id": row["id"], "before": row["text_raw"], "after": row["text"],
                                      "unsure": unsure_readings(row["text_raw"], row["text"])})
        if row.get("trim") and (row["trim"][0] or row["trim"][1]):
            c["trimmed"] += 1
            c["trimmed_seconds"] += row["duration_raw"] - row["duration"]
        if row.get("gain_db") is not None:
            c["loudness_normalized"] += 1
        if row.get("dnsmos") is not None:
            c["quality_scored"] += 1
        for flag in row.get("flags") or ():
            c[flag] += 1
        if row.get("asr"):  # transcribed at ingest (transcribe.py)
            c["transcribed"] += 1
            c["needs_review"] += bool(row.get("needs_review"))

    def conditioning_report(self) -> dict[str, Any]:
        c = self.conditioning
        keys = ("text_normalized", "trimmed", "loudness_normalized", "quality_scored", *FLAGS, "transcribed",
                "needs_review")
        return {**{k: c[k] for k in keys}, "trimmed_seconds": round(c["trimmed_seconds"], 3),
                "languages": dict(sorted(self.languages.items()))}

    @property
    def hours_kept(self) -> float:
        return self.seconds_kept / 3600

    def save(self, inputs: list[dict[str, Any]], error: str | None, run: dict[str, Any] | None = None,
             **extra: Any) -> None:
        """report.json (what was ingested: the same for the same inputs) and run.json (how fast)."""
        wall = max(self.wall_seconds, 1e-9)
        report: dict[str, Any] = {
            "rows_in": self.rows_in,
            "rows_kept": self.rows_kept,
            "rows_quarantined": self.rows_quarantined,
            "reasons": {r: self.reasons[r] for r in REASONS},
            "hours_kept": round(self.hours_kept, 6),
            "speakers": dict(sorted(self.speakers.items())),
            "conditioning": self.conditioning_report(),
            "text_changes": self.text_changes,
            "inputs": inputs,
            "notices": self.notices,
            **({"corrections": self.review.report()} if self.review else {}),
            **extra,
        }
        if error:
            report["error"] = error
        write_report(self.out, report, {
            **(run or {}),
            "workers": self.workers,
            "timings": {
                "seconds": round(self.wall_seconds, 3),
                "rows_per_s": round(self.rows_in / wall, 2),
                "audio_seconds_per_s": round(self.seconds_kept / wall, 2),
            },
        })

    def _speaker_names(self) -> str:
        """`: anna, bob` for a few speakers: a set without speakers is named after its source, so the
        summary shows what the voices came out as."""
        names = sorted(self.speakers)
        return f": {', '.join(names)}" if 0 < len(names) <= SPEAKERS_NAMED else ""

    def summary(self) -> str:
        bad = ", ".join(f"{r} {n}" for r, n in sorted(self.reasons.items()) if n) or "none"
        review = self.review.summary() if self.review else ""
        shards = f" in {self.shards} shards" if self.shards > 1 else ""
        n = len(self.notices)
        notices = f"; {n} notice{'s' if n > 1 else ''} (report.json)" if n else ""
        return (
            f"ingest: {self.rows_in} rows → {self.rows_kept} kept ({self.hours_kept:.3f} h, "
            f"{len(self.speakers)} speakers{self._speaker_names()}), {self.rows_quarantined} quarantined "
            f"({bad}) "
            f"in {self.wall_seconds:.1f} s with {self.workers} workers{shards} → {self.out / 'raw.jsonl'}"
            f"{review}{notices}"
        )


class _Writer:
    """Streams raw.jsonl / quarantine.jsonl to temp files; `close` renames them into place."""

    def __init__(self, out: Path) -> None:
        self.final = [out / "raw.jsonl", out / "quarantine.jsonl"]
        self.tmp = [p.with_name(f".{p.name}.tmp") for p in self.final]
        self.raw, self.quarantine = (open(p, "w", encoding="utf-8") for p in self.tmp)

    def close(self) -> None:
        self.raw.close()
        self.quarantine.close()
        for tmp, final in zip(self.tmp, self.final, strict=True):
            os.replace(tmp, final)

    def discard(self) -> None:
        """After a failed close (a full disk fails the last flush too): no temp file is left behind."""
        for f, tmp in zip((self.raw, self.quarantine), self.tmp, strict=True):
            try:
                f.close()
            except OSError:
                pass  # the same full disk; the file is removed next
            tmp.unlink(missing_ok=True)


def write_failed(e: OSError, out: Path, result: IngestResult) -> StepError:
    """A write into `out` failed (disk full, read-only, quota): say so in one paragraph."""
    return StepError(
        f"writing into {out} failed ({e.strerror or e}{f': {e.filename}' if e.filename else ''}) after "
        f"{result.rows_in} input rows. raw.jsonl, quarantine.jsonl and report.json hold those rows where "
        "they could still be written; no temp file is left. Free space (or make the folder writable) and "
        "rerun: audio already written is reused"
    )


def duplicate_detail(row_id: str) -> str:
    return f"same decoded audio and text as kept row {row_id}"


def json_line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _record(
    result: IngestResult, writer: _Writer, seen: set[int], src: SourceFile, outcome: Kept | Rejected
) -> None:
    """Append one outcome in input order; the duplicate check happens here because it needs that order."""
    source = {"file": src.path.as_posix(), "row": outcome.row}
    if outcome.span is not None:  # a clip cut from a long recording: where in it, seconds
        source["start"], source["end"] = outcome.span
    if isinstance(outcome, Kept):
        row_id = hashlib.blake2b(f"{outcome.audio_hash}\n{outcome.text}".encode(), digest_size=8).hexdigest()
        if int(row_id, 16) in seen:
            outcome = Rejected(outcome.row, "duplicate", duplicate_detail(row_id))
        else:
            seen.add(int(row_id, 16))
            info = dict(outcome.info)
            row = {"id": row_id, "audio": outcome.audio, "text": outcome.text,
                   "text_raw": info.pop("text_raw"), "language": info.pop("language"),
                   "locale": info.pop("locale"),
                   "speaker": outcome.speaker, "duration": outcome.duration, **info, "source": source}
            writer.raw.write(json_line(row))
            result.count_kept(row)
            return
    line = {"source": source, "reason": outcome.reason, "detail": outcome.detail}
    if outcome.similarity is not None:
        line["similarity"] = outcome.similarity
    writer.quarantine.write(json_line(line))
    result.rows_quarantined += 1
    result.reasons[outcome.reason] += 1


Range = tuple[int, int, int]  # (index into the sources, first row, row after the last)


def columns_of(p: IngestParams) -> Columns:
    return Columns(audio=p.audio_column, text=p.text_column, speaker=p.speaker_column)


def _batches(sources: Mapping[int, SourceFile], ranges: list[Range], checks: RowChecks,
             locale: Locales) -> Iterator[Batch]:
    for i, start, stop in ranges:
        src = sources[i]
        base = str(src.path.parent.resolve())
        root = str(src.root.resolve())
        source_checks = replace(checks, locale=source_locale(locale, src.path))
        for rows in iter_rows(src, start, stop, BATCH_ROWS):
            yield Batch(i, base, root, rows, source_checks, recording=src.kind == RECORDING)


def source_locale(locale: Locales, path: Path) -> str:
    """The locale of a source file: `ingest.locale` itself, or in its mapping form the value of the key
    naming the file or the nearest folder above it (relative to the working folder, as `ingest.input`);
    the schema's default where no key names it. A speaker key (`speaker_locales`) outranks it row by row."""
    if isinstance(locale, str):
        return locale
    real, found, depth = path.resolve(), DEFAULT_LOCALE, -1
    for key, value in locale.items():
        named = Path(key).resolve()
        if (named == real or named in real.parents) and len(named.parts) > depth:
            found, depth = value, len(named.parts)
    return found


def too_many_bad(result: IngestResult, max_bad_fraction: float, out: Path) -> StepError | None:
    """The run-level error when more rows were quarantined than `max_bad_fraction` allows."""
    if result.rows_quarantined <= max_bad_fraction * result.rows_in:
        return None
    share = result.rows_quarantined / result.rows_in
    return StepError(
        f"{result.rows_quarantined} of {result.rows_in} rows quarantined ({share:.0%}), "
        f"more than max_bad_fraction={max_bad_fraction}; "
        f"reasons: {dict((r, n) for r, n in result.reasons.items() if n)}. "
        f"See {out / 'quarantine.jsonl'} for each row's file, row and reason."
        + (f" no_consent: add or renew the speaker's record in the {CONSENT_FILE} of its input folder "
           "(docs/responsible-release.md)." if result.reasons["no_consent"] else "")
    )


def consent_checks(p: IngestParams) -> tuple[tuple[str, str], ...] | None:
    """(speaker, why not: "" = may be trained on) per consent record of the inputs; None when consent is
    not required. An input without a voices.yaml stops the run here, before anything is decoded."""
    if p.consent == "not_required":
        return None
    missing = [i for i in p.input if not records_file(i).is_file()]
    if missing:
        raise StepError(
            f"ingest.input {missing[0][:80]} has no consent records: {records_file(missing[0])} does not "
            f"exist, and ingest.consent is required. Add a {CONSENT_FILE} there with one record per "
            "speaker (id, speaker, subject, kind: person, scope: [tts], granted, licence, recording and "
            "recording_sha256 of the consent statement read aloud; docs/responsible-release.md), or, for "
            "data whose licence covers training, set ingest.consent: not_required with "
            "ingest.consent_reason"
        )
    now = today()
    return tuple(sorted((speaker, r.problem(now)) for speaker, (r, _) in load_records(p.input).items()))


def consent_report(p: IngestParams) -> dict[str, Any]:
    """report.json's `consent`: whether it was required (and if not, why), and the records it relied on,
    for the cards and for `consent-revoke` to find a voice's data."""
    if p.consent == "not_required":
        return {"required": False, "reason": p.consent_reason, "records": []}
    now = today()
    return {"required": True, "reason": None, "records": [
        {"id": r.id, "speaker": speaker, "kind": r.kind, "scope": list(r.scope), "licence": r.licence,
         "expires": r.expires.isoformat() if r.expires else None, "valid": not r.problem(now),
         "file": str(path)}
        for speaker, (r, path) in sorted(load_records(p.input).items())]}


def consent_of(p: IngestParams) -> dict[str, Any]:
    """The consent a run checks rows against ("checks": consent_checks' pairs, "report": report.json's), read
    once: a sharded run's plan carries it to every shard, which may not see the inputs' voices.yaml."""
    checks = consent_checks(p)
    now = today()
    recordings = {} if checks is None else {
        speaker: str(path.parent / r.recording) for speaker, (r, path) in load_records(p.input).items()
        if r.kind == "person" and r.recording and not r.problem(now)}
    return {"checks": None if checks is None else [list(c) for c in checks], "report": consent_report(p),
            "recordings": recordings}


def drop_mismatched_voices(out: Path, result: IngestResult, recordings: dict[str, str], threshold: float
                           ) -> None:
    """Move the kept rows of a speaker whose consent recording is another voice (consent_voice.py) from
    raw.jsonl to quarantine.jsonl, and count the kept rows again."""
    raw = [json.loads(line) for line in (out / "raw.jsonl").read_text(encoding="utf-8").splitlines()]
    clips: dict[str, list[Path]] = {}
    for row in raw:
        clips.setdefault(row["speaker"], []).append(out / row["audio"])
    bad = mismatched(recordings, clips, threshold)
    if not bad:
        return
    kept = [row for row in raw if row["speaker"] not in bad]
    with open(out / "quarantine.jsonl", "a", encoding="utf-8") as quarantine:
        for row in raw:
            if row["speaker"] in bad:
                quarantine.write(json_line({"source": row["source"], "reason": "consent_voice_mismatch",
                                            "detail": bad[row["speaker"]]}))
    tmp = out / ".raw.jsonl.tmp"
    tmp.write_text("".join(json_line(row) for row in kept), encoding="utf-8")
    os.replace(tmp, out / "raw.jsonl")
    moved = len(raw) - len(kept)
    result.rows_quarantined += moved
    result.reasons["consent_voice_mismatch"] += moved
    result.rows_kept, result.seconds_kept, result.text_changes = 0, 0.0, []
    result.speakers, result.languages, result.conditioning = Counter(), Counter(), Counter()
    for row in kept:
        result.count_kept(row)


def apply_review(out: Path, result: IngestResult, p: IngestParams, corrections: list[Correction]) -> None:
    """Apply the proofreading corrections to raw.jsonl, streamed: a fix's text is read as typed text is
    (normalized in the row's locale), a dropped row moves to quarantine.jsonl; the kept rows are counted
    again."""
    def respell(text: str, row: dict[str, Any]) -> tuple[str, str]:
        text = normalize_text(text)
        if p.normalize_text:
            return spoken_form(text, p.language, row.get("locale") or DEFAULT_LOCALE)
        return text, p.language or detect_language(text)

    review = Review(corrections, p.corrections, respell, p.max_text_chars)
    result.review = review
    if not corrections:
        return
    result.rows_kept, result.seconds_kept, result.text_changes = 0, 0.0, []
    result.speakers, result.languages, result.conditioning = Counter(), Counter(), Counter()
    tmp = out / ".raw.jsonl.tmp"
    with (open(out / "raw.jsonl", encoding="utf-8") as raw, open(tmp, "w", encoding="utf-8") as kept,
          open(out / "quarantine.jsonl", "a", encoding="utf-8") as quarantine):
        for line in raw:
            row = json.loads(line)
            dropped = review.apply(row)
            if dropped is None:
                kept.write(json_line(row))
                result.count_kept(row)
            else:
                quarantine.write(json_line(dropped))
                result.rows_quarantined += 1
                result.reasons[REVIEW_REASON] += 1
    os.replace(tmp, out / "raw.jsonl")
    review.finish()


def row_checks(p: IngestParams, out: Path, consent: dict[str, Any]) -> RowChecks:
    pairs = consent["checks"]
    return RowChecks(
        p.sample_rate, p.min_seconds, p.max_seconds, p.silence_threshold, str(out.resolve()),
        trim_silence=p.trim_silence, max_edge_silence=p.max_edge_silence,
        max_internal_pause=p.max_internal_pause, normalize_loudness=p.normalize_loudness,
        target_lufs=p.target_lufs, max_clipped_fraction=p.max_clipped_fraction,
        score_quality=p.score_quality, min_quality=p.min_quality if p.score_quality else 0.0,
        quality_score=p.quality_score,
        normalize_text=p.normalize_text, language=p.language, max_text_chars=p.max_text_chars,
        transcribe=bool(p.asr),
        speaker_locales=tuple(sorted(p.locale.items())) if isinstance(p.locale, dict) else (),
        consent=None if pairs is None else tuple((speaker, why) for speaker, why in pairs),
        segment=SegmentChecks(**p.segment.model_dump()),
    )


def ingest_ranges(p: IngestParams, sources: Mapping[int, SourceFile], ranges: list[Range], out: Path,
                  notices: list[str], whole_run: bool = True, consent: dict[str, Any] | None = None,
                  corrections: list[Correction] | None = None, asr: Mapping[str, Any] | None = None,
                  **extra: Any) -> IngestResult:
    """Ingest these row ranges into `out`, in order; `extra` goes into report.json. `whole_run` False
    (one shard of a sharded run): the empty-input and max_bad_fraction checks are left to the merge,
    which sees every row. `consent`: consent_of's, from the plan (None: read from `p.input` now).
    `corrections`: the proofreading decisions a whole run applies (None: none). `asr`: the asr section's
    values (the recognisers' model folders), for `ingest.asr`."""
    consent = consent_of(p) if consent is None else consent
    transcriber = load_transcriber(p, asr or {})  # loaded once, before any row is decoded
    (out / "audio").mkdir(parents=True, exist_ok=True)
    checks = row_checks(p, out, consent)
    workers = decode_workers(p.workers)
    result = IngestResult(out=out, workers=workers, notices=notices)
    writer = _Writer(out)
    seen: set[int] = set()
    error: StepError | None = None
    start = time.perf_counter()
    # a long recording is one input row that becomes as many rows as it has clips: a total of rows is not
    # known before it is cut
    cut = any(sources[i].kind == RECORDING for i, _, _ in ranges)
    total = None if cut else sum(stop - first for _, first, stop in ranges)
    try:
        with bar(total=total, unit="row", desc="ingest", mininterval=1.0) as shown:
            batches = _batches(sources, ranges, checks, p.locale)
            logged = start
            for file_index, outcomes in _ordered_map(process_any_batch, batches, workers):
                settled = [replace(transcriber.settle(o, out), span=o.span)
                           if isinstance(o, Kept) and o.untranscribed and transcriber is not None else o
                           for o in outcomes]
                if sources[file_index].kind == RECORDING:
                    settled = with_script(settled, sources[file_index].path, p.normalize_text)
                for outcome in settled:
                    _record(result, writer, seen, sources[file_index], outcome)
                result.rows_in += len(outcomes)
                shown.update(len(outcomes))
                if shown.disable and time.perf_counter() - logged >= LOG_SECONDS:  # a pod's log: a line
                    logged = time.perf_counter()
                    log.info("ingest: %d of %s rows, %d kept, %.0f rows/s", result.rows_in, total or "?",
                             result.rows_kept, result.rows_in / (logged - start))
    except StepError as e:
        error = e
    except BrokenProcessPool as e:
        error = StepError(f"a decode worker died ({e}); the reports cover the rows processed before it")
    except OSError as e:
        error = write_failed(e, out, result)
    result.wall_seconds = time.perf_counter() - start
    try:
        writer.close()  # not reached on Ctrl-C or a crash: earlier outputs are then left as they were
    except OSError as e:
        writer.discard()
        error = error or write_failed(e, out, result)
    if whole_run and error is None and consent.get("recordings"):
        try:
            drop_mismatched_voices(out, result, consent["recordings"], p.consent_voice_threshold)
        except OSError as e:
            error = write_failed(e, out, result)
        except StepError as e:
            error = e
    if whole_run and error is None and corrections is not None:
        try:
            apply_review(out, result, p, corrections)
        except OSError as e:
            error = write_failed(e, out, result)
    if whole_run and error is None and result.rows_in == 0:
        names = ", ".join(s.path.as_posix() for s in sources.values())
        error = StepError(f"the input files hold no rows: {names}")
    if whole_run and error is None:
        error = too_many_bad(result, p.max_bad_fraction, out)
    inputs = [{"file": sources[i].path.as_posix(), "rows": stop - first} for i, first, stop in ranges]
    try:
        result.save(inputs, str(error) if error else None, consent=consent["report"], **extra)
        if whole_run and (out / "raw.jsonl").is_file():  # a shard's page would show a part: the merge's
            write_data_report(out)
    except OSError as e:
        error = error or write_failed(e, out, result)
    if error is not None:
        raise error
    return result


def ingest_one_pass(p: IngestParams, asr: Mapping[str, Any] | None = None) -> IngestResult:
    """Ingest every input in one pass (the `ingest` step without shards, voxpipe/data/ingest_step.py);
    raises StepError on run-level problems (after writing the reports)."""
    notices: list[str] = []
    corrections = read_corrections(Path(p.corrections))  # a malformed file stops the run before decoding
    sources = open_sources(p.input, columns_of(p), notices)
    ranges = [(i, 0, src.num_rows) for i, src in enumerate(sources)]
    return ingest_ranges(p, dict(enumerate(sources)), ranges, Path(p.out), notices, corrections=corrections,
                         asr=asr)
