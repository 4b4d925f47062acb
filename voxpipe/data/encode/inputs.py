"""encode's inputs: manifest rows, their audio files (hashed once, cached) and decoded clips."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from voxpipe.data.audio import AudioDecodeError, decode
from voxpipe.data.jsonl import jsonl_records
from voxpipe.data.world import World
from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text
from voxpipe.integrity import file_entry

Hashes = dict[Path, tuple[str | None, str | None]]  # audio file -> (sha256, None) or (None, problem)


@dataclass
class Row:
    data: dict[str, Any]
    file: str
    line: int
    audio: Path
    ref: Path | None


@dataclass
class Quarantine:
    entries: list[dict[str, Any]] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)

    def add(self, file: str, line: int, reason: str, detail: str) -> None:
        self.entries.append({"source": {"file": file, "line": line}, "reason": reason, "detail": detail})
        self.reasons[reason] += 1


def _resolve(base: Path, value: Any) -> Path | None:
    if not isinstance(value, str) or not value.strip():
        return None
    path = Path(value)
    return path if path.is_absolute() else base / path


def read_manifest(path: Path, quarantine: Quarantine) -> list[Row]:
    """Rows with resolved audio paths (relative to the manifest's folder); malformed rows quarantined."""
    rows = []
    base = path.parent
    for line_no, data, bad in jsonl_records(path):
        if data is None:
            quarantine.add(str(path), line_no, "bad_json", bad)
            continue
        text = data.get("text")
        if not isinstance(text, str) or not text.strip():
            quarantine.add(str(path), line_no, "missing_text", f"text is {text!r}")
            continue
        audio = _resolve(base, data.get("audio"))
        if audio is None:
            quarantine.add(str(path), line_no, "no_audio", f"audio is {data.get('audio')!r}")
            continue
        ref = None
        if data.get("ref_audio") is not None:
            ref = _resolve(base, data["ref_audio"])
            if ref is None:
                quarantine.add(str(path), line_no, "no_ref_audio", f"ref_audio is {data['ref_audio']!r}")
                continue
        rows.append(Row(data, str(path), line_no, audio, ref))
    return rows


class FileHashes:
    """sha256 of audio files, cached by (path, size, mtime) so a rerun does not reread every file."""

    def __init__(self, cache_path: Path):
        self.path = cache_path
        self.cache: dict[str, list[Any]] = {}
        if cache_path.is_file():
            try:
                self.cache = json.loads(cache_path.read_text())
            except json.JSONDecodeError:
                self.cache = {}

    def _one(self, path: Path) -> tuple[str | None, str | None, list[Any] | None]:
        """(sha256, None, cache entry) or (None, problem, None)."""
        try:
            st = path.stat()
        except OSError:
            return None, f"audio file {path} does not exist", None
        if st.st_size == 0:
            return None, f"audio file {path} is empty (0 bytes)", None
        stamp = [st.st_size, st.st_mtime_ns]
        cached = self.cache.get(os.path.abspath(path))
        if cached and cached[:2] == stamp:
            return cached[2], None, cached
        try:
            sha = file_entry(path)["sha256"]
        except OSError as e:
            return None, f"cannot read {path}: {e}", None
        return sha, None, [*stamp, sha]

    def hash_all(self, paths: list[Path], world: World) -> Hashes:
        """Every file hashed once across the ranks; rank 0 keeps the cache."""
        results = world.map(self._one, paths, workers=4, desc="hash")
        if world.is_main:
            for path, (_, _, entry) in zip(paths, results, strict=True):
                if entry is not None:
                    self.cache[os.path.abspath(path)] = entry
            atomic_write_text(self.path, json.dumps(self.cache, sort_keys=True))
        return {p: (sha, problem) for p, (sha, problem, _) in zip(paths, results, strict=True)}



def estimate_samples(path: Path, sample_rate: int) -> tuple[int | None, str | None]:
    """Clip length at the VAE's rate from the file header, to sort clips before decoding them."""
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError) as e:
        return None, f"cannot decode {path}: {str(e).strip() or type(e).__name__}"
    if info.frames <= 0:
        return None, f"{path} has no audio samples"
    return math.ceil(info.frames * sample_rate / info.samplerate), None


def decode_all(paths: list[Path], sample_rate: int) -> list[np.ndarray | str]:
    out: list[np.ndarray | str] = []
    for path in paths:
        try:
            wav = decode(path, sample_rate)
        except AudioDecodeError as e:
            out.append(f"cannot decode {path}: {e}")
            continue
        if wav.size == 0:
            out.append(f"{path} has no audio samples")
        elif not np.isfinite(wav).all():
            out.append(f"{path} contains NaN or infinite samples")
        else:
            out.append(wav)
    return out



def manifest_files(paths: Iterable[str]) -> list[Path]:
    files = [Path(m) for m in paths]
    if not files:
        raise StepError("no manifest given (--manifest FILE...)")
    for f in files:
        if not f.is_file():
            raise StepError(f"manifest {f} does not exist (write it with `voxpipe manifest`)")
    names = Counter(f.name for f in files)
    clash = [n for n, c in names.items() if c > 1]
    if clash:
        raise StepError(f"manifests share the file name {clash[0]!r}; outputs are named after it, rename one")
    return files

