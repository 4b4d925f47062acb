"""Find parquet inputs, check their columns up front, and stream their rows in bounded batches.

Checking every file's schema before decoding anything means a wrong column name fails in a second,
not after an hour of work. Rows are read with `iter_batches`, so memory stays flat however many GB
the files hold.
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
    speaker: str  # "" = the data set has one speaker and no speaker column


@dataclass(frozen=True)
class SourceFile:
    path: Path
    root: Path  # the dataset folder: audio paths must resolve inside it
    num_rows: int
    audio_kind: str  # "struct" (HF {bytes, path}), "bytes" or "path"


def find_parquet_files(inputs: list[str]) -> list[tuple[Path, Path]]:
    """(file, dataset root) for every input; folders are searched recursively in sorted order."""
    found: list[tuple[Path, Path]] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found += [(f, path) for f in sorted(path.rglob("*.parquet")) if f.is_file()]
        elif path.is_file():
            found.append((path, path.parent))
        else:
            raise StepError(f"input {item} does not exist")
    unique: dict[Path, tuple[Path, Path]] = {}
    for f, r in found:  # the same file named twice is read once
        unique.setdefault(f.resolve(), (f, r))
    if not unique:
        where = ", ".join(inputs) or "(no inputs given)"
        raise StepError(f"no input files: no *.parquet file found in {where}")
    return list(unique.values())


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


def open_source(path: Path, root: Path, cols: Columns) -> SourceFile:
    """Open one parquet file and check that the configured columns exist with usable types."""
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise StepError(f"{path}: unreadable parquet file: {e}") from e
    schema = pf.schema_arrow
    names = schema.names
    wanted = [("audio", cols.audio), ("text", cols.text)]
    if cols.speaker:
        wanted.append(("speaker", cols.speaker))
    for role, name in wanted:
        if name not in names:
            hint = " (set --speaker-column '' for a single-speaker data set)" if role == "speaker" else ""
            raise StepError(
                f"{path}: no {role} column {name!r}; the file has columns: {', '.join(names)}."
                f" Choose one with --{role}-column NAME{hint}."
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
    if cols.speaker:
        t = schema.field(cols.speaker).type
        if not (_is_string(t) or pa.types.is_integer(t)):
            raise StepError(f"{path}: speaker column {cols.speaker!r} has type {t}, not string or integer")
    return SourceFile(path=path, root=root, num_rows=pf.metadata.num_rows, audio_kind=kind)


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


def iter_rows(src: SourceFile, cols: Columns, batch_rows: int) -> Iterator[list[RawRow]]:
    """Batches of at most `batch_rows` rows, in file order."""
    names = [cols.audio, cols.text] + ([cols.speaker] if cols.speaker else [])
    start = 0
    try:
        pf = pq.ParquetFile(src.path)
        for batch in pf.iter_batches(batch_size=batch_rows, columns=names):
            audio = _audio_values(batch.column(cols.audio), src.audio_kind)
            text = batch.column(cols.text).to_pylist()
            if cols.speaker:
                speaker = [None if s is None else str(s) for s in batch.column(cols.speaker).to_pylist()]
            else:
                speaker = ["default"] * batch.num_rows
            yield [RawRow(start + i, audio[i], text[i], speaker[i]) for i in range(batch.num_rows)]
            start += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise StepError(f"{src.path}: unreadable parquet file after row {start}: {e}") from e
