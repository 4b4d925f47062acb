"""Parquet inputs: check their columns up front, and stream a row range in bounded batches.

Checking every file's schema before decoding anything means a wrong column name fails in a second,
not after an hour of work. Rows are read with `iter_batches` from only the row groups a range
covers, so memory stays flat however many GB the files hold, and a shard reads only its own part.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from voxpipe.data.ingest_row import RawRow
from voxpipe.errors import StepError

# What a row's audio cell holds: encoded bytes, a path to a file, or nothing (None).
AudioValue = bytes | str | None


@dataclass(frozen=True)
class Columns:
    audio: str
    text: str
    speaker: str  # "" = no speaker column: every row is the source's speaker (sources.py source_speaker)


def _is_string(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _audio_kind(t: pa.DataType) -> str | None:
    if pa.types.is_struct(t):
        fields = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        ok_bytes = "bytes" not in fields or _is_binary(fields["bytes"])
        ok_path = "path" not in fields or _is_string(fields["path"])
        if ok_bytes and ok_path and ({"bytes", "path"} & fields.keys()):
            return "struct"
        return None
    if _is_binary(t):
        return "bytes"
    if _is_string(t):
        return "path"
    return None


def open_parquet(path: Path, cols: Columns) -> tuple[int, str, Columns]:
    """(rows, audio kind, the columns to read) of one parquet file, after checking the columns exist
    with usable types. A file without the speaker column is read as one speaker."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise StepError(f"{path}: unreadable parquet file: {e}") from e
    schema = pf.schema_arrow
    names = schema.names
    for role, name in (("audio", cols.audio), ("text", cols.text)):
        if name not in names:
            raise StepError(
                f"{path}: no {role} column {name!r}; the file has columns: {', '.join(names)}."
                f" Choose one with --{role}-column NAME."
            )
    kind = _audio_kind(schema.field(cols.audio).type)
    if kind is None:
        raise StepError(
            f"{path}: audio column {cols.audio!r} has type {schema.field(cols.audio).type}; expected a struct"
            " {bytes, path}, binary (encoded audio) or string (a path)"
        )
    text_type = schema.field(cols.text).type
    if not _is_string(text_type):
        raise StepError(f"{path}: text column {cols.text!r} has type {text_type}, not string")
    if cols.speaker not in names:
        cols = Columns(cols.audio, cols.text, "")
    elif not (_is_string(t := schema.field(cols.speaker).type) or pa.types.is_integer(t)):
        raise StepError(f"{path}: speaker column {cols.speaker!r} has type {t}, not string or integer")
    return pf.metadata.num_rows, kind, cols


def row_groups(path: Path, audio_column: str) -> list[tuple[int, int]]:
    """(rows, compressed bytes of the audio column) per row group, from the footer alone: the
    planner's measure of a row group's audio volume."""
    meta = pq.ParquetFile(path).metadata
    groups = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        # a struct column is stored as several leaf columns: count every leaf under the audio column
        size = sum(group.column(c).total_compressed_size for c in range(group.num_columns)
                   if group.column(c).path_in_schema.split(".")[0] == audio_column)
        groups.append((group.num_rows, size))
    return groups


def _audio_values(column: pa.Array, kind: str) -> list[AudioValue]:
    values = column.to_pylist()
    if kind == "bytes":
        return values
    if kind == "path":
        return [v or None for v in values]
    # HF struct: bytes win; a row with no bytes falls back to its path.
    out: list[AudioValue] = []
    for cell in values:
        if cell is None:
            out.append(None)
        elif cell.get("bytes") is not None:
            out.append(cell["bytes"])
        else:
            out.append(cell.get("path") or None)
    return out


def iter_parquet(path: Path, audio_kind: str, cols: Columns, start: int, stop: int,
                 batch_rows: int, source_speaker: str) -> Iterator[list[RawRow]]:
    """Rows [start, stop) of one file in batches of at most `batch_rows`, reading only the row groups
    that hold them; without a speaker column every row is `source_speaker`."""
    names = [cols.audio, cols.text] + ([cols.speaker] if cols.speaker else [])
    row = start
    try:
        pf = pq.ParquetFile(path)
        wanted, first = [], None
        offset = 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if offset < stop and offset + n > start:
                wanted.append(g)
                first = offset if first is None else first
            offset += n
        if not wanted:
            return
        at = first
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=wanted, columns=names):
            lo, hi = max(start - at, 0), min(stop - at, batch.num_rows)
            at += batch.num_rows
            if lo >= hi:
                continue
            batch = batch.slice(lo, hi - lo)
            audio = _audio_values(batch.column(cols.audio), audio_kind)
            text = batch.column(cols.text).to_pylist()
            if cols.speaker:
                speaker = [None if s is None else str(s) for s in batch.column(cols.speaker).to_pylist()]
            else:
                speaker = [source_speaker] * batch.num_rows
            yield [RawRow(row + i, audio[i], text[i], speaker[i]) for i in range(batch.num_rows)]
            row += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise StepError(f"{path}: unreadable parquet file after row {row}: {e}") from e
