"""Text manifests as ingest inputs: the LJSpeech layout, and CSV / TSV / JSONL tables of audio paths.

Most voice data is not parquet: it is a folder of WAVs with `metadata.csv` (LJSpeech: `id|text|
normalized_text` lines, audio in `wavs/<id>.wav`), or a table with a path, a text and maybe a speaker
column. Each record becomes the same `RawRow` a parquet row does (audio = a path relative to the
manifest's folder), so quarantine, accounting and content addressing are the ones parquet gets. A
record that cannot be read as a row (wrong field count, bad JSON, a CSV field longer than Python's
csv limit of 131,072 characters) is quarantined as `malformed_row` with its line number; only an
unreadable file stops the run.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from voxpipe.data.ingest_row import RawRow
from voxpipe.data.jsonl import jsonl_records, utf8_lines
from voxpipe.data.parquet_source import Columns
from voxpipe.errors import StepError

# Audio column names used when the configured one is absent: generic tables, HF audiofolder metadata.
AUDIO_FALLBACKS = ("path", "file_name")
DELIMITERS = {"csv": ",", "tsv": "\t"}

Record = tuple[int, dict[str, Any] | None, str]  # (line number, fields, why the record is malformed)


def is_ljspeech(path: Path) -> bool:
    """`metadata.csv` next to a `wavs/` folder: the LJSpeech layout."""
    return path.name == "metadata.csv" and (path.parent / "wavs").is_dir()


def _records(path: Path, kind: str) -> Iterator[Record]:
    """Every non-blank record of the file, in order, as a dict of fields (None when malformed)."""
    if kind == "jsonl":
        for number, value, problem in jsonl_records(path):
            yield number, value, f"line {number} is {problem}" if problem else ""
    elif kind == "ljspeech":
        for number, line in utf8_lines(path):
            fields = line.lstrip("\ufeff").rstrip("\r\n").split("|")
            if len(fields) < 2 or not fields[0].strip():
                yield number, None, f"line {number} is not `id|text|normalized_text`"
                continue
            # the normalized text (numbers and abbreviations spelled out) is what is spoken
            text = fields[2] if len(fields) > 2 and fields[2].strip() else fields[1]
            yield number, {"audio": f"wavs/{fields[0].strip()}.wav", "text": text}, ""
    else:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, delimiter=DELIMITERS[kind])
            header = next(reader, [])
            while True:
                try:
                    fields = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:  # a field over the limit: the reader resumes at the next line
                    yield reader.line_num, None, f"line {reader.line_num}: {e}; no transcript is that long"
                    continue
                if not fields:
                    continue
                if len(fields) != len(header):
                    why = f"line {reader.line_num} has {len(fields)} fields, the header has {len(header)}"
                    yield reader.line_num, None, why
                    continue
                yield reader.line_num, dict(zip(header, fields, strict=True)), ""


def _header(path: Path, kind: str) -> list[str]:
    """The column names: a CSV/TSV header, or the keys of a JSONL file's first object."""
    if kind == "ljspeech":
        return ["audio", "text"]
    if kind == "jsonl":
        return next((list(r) for _, r, _ in _records(path, kind) if r is not None), [])
    with open(path, encoding="utf-8-sig", newline="") as f:
        return next(csv.reader(f, delimiter=DELIMITERS[kind]), [])


def open_table(path: Path, kind: str, cols: Columns) -> tuple[int, Columns]:
    """(records, the columns to read) of one manifest, after checking the audio and text columns.
    Without the speaker column every row is the source's speaker (sources.py source_speaker)."""
    try:
        names = _header(path, kind)
        rows = sum(1 for _ in _records(path, kind))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise StepError(f"{path}: unreadable {kind} manifest: {e}") from e
    if kind == "ljspeech":
        return rows, Columns("audio", "text", "")
    audio = cols.audio if cols.audio in names else next((n for n in AUDIO_FALLBACKS if n in names), None)
    for role, name in (("audio", audio), ("text", cols.text)):
        if name not in names:
            shown = cols.audio if role == "audio" else name
            raise StepError(
                f"{path}: no {role} column {shown!r}; the file has columns: {', '.join(names) or '(none)'}."
                f" Choose one with --{role}-column NAME."
            )
    return rows, Columns(audio, cols.text, cols.speaker if cols.speaker in names else "")


def _cell(fields: dict[str, Any], name: str, role: str) -> tuple[str | None, str]:
    """A field as a string or None; (None, why) when JSON gave it a type that cannot be one."""
    value = fields.get(name)
    if value is None or isinstance(value, str):
        return value, ""
    if role == "speaker" and isinstance(value, int) and not isinstance(value, bool):
        return str(value), ""
    return None, f"the {role} field {name!r} is a JSON {type(value).__name__}, not a string"


def _row(row: int, fields: dict[str, Any], cols: Columns, source_speaker: str) -> RawRow:
    audio, bad_audio = _cell(fields, cols.audio, "audio")
    text, bad_text = _cell(fields, cols.text, "text")
    speaker, bad_speaker = _cell(fields, cols.speaker, "speaker") if cols.speaker else (source_speaker, "")
    problem = bad_audio or bad_text or bad_speaker
    return RawRow(row, audio or None, text, speaker, problem)


def iter_table(path: Path, kind: str, cols: Columns, start: int, stop: int,
               batch_rows: int, source_speaker: str) -> Iterator[list[RawRow]]:
    """Records [start, stop) of one manifest in batches of at most `batch_rows`; without a speaker column
    every row is `source_speaker`."""
    batch: list[RawRow] = []
    row = -1
    try:
        for row, (_, fields, problem) in enumerate(_records(path, kind)):
            if row < start:
                continue
            if row >= stop:
                break
            batch.append(RawRow(row, None, None, None, problem) if fields is None
                         else _row(row, fields, cols, source_speaker))
            if len(batch) == batch_rows:
                yield batch
                batch = []
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise StepError(f"{path}: unreadable {kind} manifest after record {row}: {e}") from e
    if batch:
        yield batch
