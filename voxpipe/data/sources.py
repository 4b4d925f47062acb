"""Ingest inputs of every shape: find them, check each file's columns up front, stream row ranges.

An input is a parquet file, a CSV / TSV / JSONL manifest of audio paths, an LJSpeech folder
(`metadata.csv` + `wavs/`), or a folder searched recursively for all of these, in sorted order. A row
range (file, start, stop) is the unit both a whole run and one shard of a sharded run read.

A file or folder found in an input folder that is a link leading out of it is never opened: it
becomes one quarantined row (`unsafe_path`), so the run says what it did not read, and why.

An input folder that holds none of these is a folder of long recordings: each audio file in it
(.wav, .flac, .mp3, .ogg) is one row, which its decode worker cuts into clips (recording.py). A
recording's transcript, if there is one, is the text file beside it with the same stem (`x.wav`, `x.txt`).

A file without a speaker column is one speaker named after its source (`source_speaker`), and ingest
says so: an English and a Mandarin folder ingested together stay two voices, never one speaker
trained as both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from voxpipe.data.ingest_row import RawRow
from voxpipe.data.parquet_source import Columns, iter_parquet, open_parquet
from voxpipe.data.table_source import is_ljspeech, iter_table, open_table
from voxpipe.errors import StepError

log = logging.getLogger(__name__)
SUFFIXES = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}
RECORDING = "recording"  # a long audio file with no transcript: one row, cut into clips by its worker
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")


@dataclass(frozen=True)
class SourceFile:
    path: Path
    root: Path  # the dataset folder: audio paths must resolve inside it
    kind: str  # parquet | csv | tsv | jsonl | ljspeech | recording | unsafe (a link out of the input folder)
    num_rows: int
    audio_kind: str  # parquet: struct (HF {bytes, path}), bytes or path; manifests: path
    columns: Columns  # the columns read; speaker "" = none: every row is speaker `speaker`
    speaker: str = ""  # the source's own speaker (`source_speaker`), for a file without a speaker column


def source_speaker(path: Path) -> str:
    """The speaker of a file without a speaker column, named after the folder that holds it
    (`data/my-voice/metadata.csv` -> my-voice): the unit a voice comes in. An LJSpeech set, the shards
    of a Hugging Face set and a train/val pair of manifests stay one voice; two folders are two. The same
    for a whole run and for each shard of a sharded one."""
    return path.resolve().parent.name


def _kind(path: Path) -> str | None:
    return "ljspeech" if is_ljspeech(path) else SUFFIXES.get(path.suffix.lower())


UNSAFE = "unsafe"


def _outside(path: Path, real_root: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), real_root]) != real_root


def _walk(folder: Path, real_root: str) -> Iterator[Path]:
    """Files under `folder`, skipping hidden folders (.git, .dvc) and the output folders of voxpipe
    steps (they hold a report.json): an ingest's own raw.jsonl is not an input. A link that leads
    outside `real_root` is yielded as itself, not followed."""
    for name in os.listdir(folder):
        path = folder / name
        if path.is_symlink() and _outside(path, real_root):
            if not name.startswith("."):
                yield path
        elif path.is_dir():
            if not name.startswith(".") and not (path / "report.json").is_file():
                yield from _walk(path, real_root)
        elif path.is_file():
            yield path


def _found_kind(path: Path, real_root: str) -> str | None:
    """The kind of a file found in an input folder; UNSAFE for a link out of it that would be an input
    (a folder, or a file named like one): any other file there (a clip) is not an input anyway."""
    if path.is_symlink() and _outside(path, real_root):
        return UNSAFE if path.is_dir() or _kind(path) else None
    return _kind(path)


def _is_recording(path: Path, real_root: str) -> bool:
    return path.suffix.lower() in AUDIO_SUFFIXES and not (path.is_symlink() and _outside(path, real_root))


def find_inputs(inputs: list[str]) -> list[tuple[Path, Path, str]]:
    """(file, dataset root, kind) for every input; folders are searched recursively in sorted order."""
    found: list[tuple[Path, Path, str]] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            real = os.path.realpath(path)
            files = sorted(_walk(path, real))
            tables = [(f, path, k) for f in files if (k := _found_kind(f, real))]
            found += tables or [(f, path, RECORDING) for f in files if _is_recording(f, real)]
        elif path.is_file():
            kind = RECORDING if path.suffix.lower() in AUDIO_SUFFIXES else _kind(path)
            if kind is None:
                raise StepError(f"input {item}: not a .parquet, .csv, .tsv or .jsonl file (nor a long "
                                "recording: .wav, .flac, .mp3, .ogg)")
            found.append((path, path.parent, kind))
        else:
            raise StepError(f"input {item} does not exist")
    unique: dict[Path, tuple[Path, Path, str]] = {}
    for f, r, k in found:  # the same file named twice is read once
        unique.setdefault(f.resolve(), (f, r, k))
    if not unique:
        where = ", ".join(inputs) or "(no inputs given)"
        raise StepError(
            f"no input files: no *.parquet, *.csv, *.tsv, *.jsonl, LJSpeech metadata.csv or long recording "
            f"(*.wav, *.flac, *.mp3, *.ogg) in {where}"
        )
    return list(unique.values())


def open_source(path: Path, root: Path, kind: str, cols: Columns, notices: list[str]) -> SourceFile:
    """Check one input's columns; a file without a speaker column becomes one speaker, with a notice."""
    if kind == UNSAFE:  # one row, quarantined: the link is not opened
        return SourceFile(path, root, kind, 1, "path", cols)
    if kind == RECORDING:  # one row, cut by its worker: its voice is named after its folder, as a manifest's
        return SourceFile(path, root, kind, 1, "path", cols, source_speaker(path))
    if kind == "parquet":
        rows, audio_kind, used = open_parquet(path, cols)
    else:
        (rows, used), audio_kind = open_table(path, kind, cols), "path"
    if not used.speaker:
        why = "the LJSpeech layout has no speaker" if kind == "ljspeech" else (
            f"no speaker column {cols.speaker!r} (if it has another name: --speaker-column NAME)"
            if cols.speaker else "speaker_column is empty"
        )
        speaker = source_speaker(path)
        notices.append(f"{path}: {why}: its {rows} rows are one speaker, {speaker!r}, named after the source")
        log.warning(notices[-1])
    if used.audio != cols.audio:
        notices.append(f"{path}: no audio column {cols.audio!r}; read audio paths from {used.audio!r}")
        log.info(notices[-1])
    return SourceFile(path, root, kind, rows, audio_kind, used, "" if used.speaker else speaker)


def open_sources(inputs: list[str], cols: Columns, notices: list[str]) -> list[SourceFile]:
    return [open_source(f, root, kind, cols, notices) for f, root, kind in find_inputs(inputs)]


def iter_rows(src: SourceFile, start: int, stop: int, batch_rows: int) -> Iterator[list[RawRow]]:
    """Rows [start, stop) of one input, in file order, in batches of at most `batch_rows`."""
    if src.kind == UNSAFE:
        target = os.path.realpath(src.path)
        why = (f"input {src.path} is a link to {target}, outside the input folder {src.root}; it was not "
               "read. Copy the file into the folder (or name it as an input itself) to ingest it")
        return iter([[RawRow(0, None, None, None, why, "unsafe_path")]] if start < 1 <= stop else [])
    if src.kind == RECORDING:  # its script, if any, is aligned to the transcribed clips (recording.py)
        return iter([[RawRow(0, src.path.name, None, src.speaker)]] if start < 1 <= stop else [])
    if src.kind == "parquet":
        return iter_parquet(src.path, src.audio_kind, src.columns, start, stop, batch_rows, src.speaker)
    return iter_table(src.path, src.kind, src.columns, start, stop, batch_rows, src.speaker)
