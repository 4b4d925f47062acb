"""`voxpipe manifest`: raw.jsonl from ingest → train.jsonl / val.jsonl in the upstream VoxCPM format.

Every choice is a pure function of the rows' ids (sha256, never Python's salted `hash`), so the
same rows give byte-identical manifests whatever the input order or the machine:

- split: a row is held out when its id hashes below `val_fraction`. A row keeps its side when
  the dataset grows, so an old checkpoint is never evaluated on rows it trained on. Then, while
  `val_fraction > 0`, every speaker with at least `min_speaker_rows_for_val` rows gets its
  lowest-hash row held out, and the lowest-hash rows overall top val up to `min_val`.
- reference audio: upstream advises a same-speaker `ref_audio` on 30-50 % of training rows so the
  voice stays stable after fine-tuning. The `ref_fraction` share of training rows with the lowest
  seeded hash among those whose speaker has another training clip gets one, drawn from that
  speaker's other training clips. Every val row whose speaker has a training clip gets one too:
  evaluation generates with a reference, and it must not be the clip being evaluated.

Paths in the output are relative to the output folder, where the manifests live.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxpipe.data.jsonl import jsonl_records
from voxpipe.errors import StepError, quoted
from voxpipe.files import atomic_write_text
from voxpipe.report import write_report
from voxpipe.steps.manifest import ManifestParams

REQUIRED_FIELDS = ("id", "audio", "text", "speaker", "duration")
# raw.jsonl fields the rows carry on to encode and evaluate: the transcript as written, and the row's
# language (evaluate picks the recogniser and CER/WER by it)
CARRIED_FIELDS = ("text_raw", "language")


@dataclass
class Clip:
    id: str
    speaker: str
    audio: str  # absolute, normalised
    text: str
    duration: float
    origin: str  # "file:line", for error messages
    raw_id: str | int  # id and speaker as written in raw.jsonl, kept in the output
    raw_speaker: str | int | None
    ref: Clip | None = None
    carried: dict[str, Any] = field(default_factory=dict)  # CARRIED_FIELDS the raw row has


@dataclass
class ManifestResult:
    out: Path
    report: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        r = self.report
        train, val = r["splits"]["train"], r["splits"]["val"]
        return (
            f"manifest: {r['rows_in']} rows from {len(r['inputs'])} input(s), {len(r['speakers'])} speaker(s)"
            f" → train {train['rows']} ({train['hours']:.3f} h, {train['ref_rows']} with ref_audio ="
            f" {100 * train['ref_fraction']:.1f} %), val {val['rows']} ({val['hours']:.3f} h)"
            f" → {self.out}"
        )


def _unit_hash(key: str) -> float:
    """A uniform number in [0, 1) from sha256: stable across processes, unlike `hash`."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def _input_file(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "raw.jsonl"
    if not p.is_file():
        raise StepError(f"input {p} does not exist (expected a raw.jsonl written by `voxpipe ingest`)")
    return p


def _parse_clip(row: dict[str, Any] | None, bad: str, where: str, base: Path) -> Clip:
    if row is None:
        raise StepError(f"{where}: {bad}")
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        raise StepError(f"{where}: missing field(s) {', '.join(missing)}")
    rid, audio, text, speaker, duration = (row[k] for k in REQUIRED_FIELDS)
    if isinstance(rid, bool) or not isinstance(rid, str | int) or str(rid) == "":
        raise StepError(f"{where}: id must be a non-empty string or integer, got {quoted(rid)}")
    if isinstance(speaker, bool) or not (speaker is None or isinstance(speaker, str | int)):
        raise StepError(f"{where}: speaker must be a string, an integer or null, got {quoted(speaker)}")
    if not isinstance(audio, str) or not audio:
        raise StepError(f"{where}: audio must be a non-empty path, got {quoted(audio)}")
    if not isinstance(text, str):
        raise StepError(f"{where}: text must be a string, got {quoted(text)}")
    if isinstance(duration, bool) or not isinstance(duration, int | float) or not math.isfinite(duration) \
            or duration <= 0:
        raise StepError(f"{where}: duration must be a positive number of seconds, got {quoted(duration)}")
    return Clip(
        id=str(rid),
        speaker="" if speaker is None else str(speaker),
        audio=os.path.normpath(os.path.join(base, audio)),
        text=text,
        duration=float(duration),
        origin=where,
        raw_id=rid,
        raw_speaker=speaker,
        carried={**{k: row[k] for k in CARRIED_FIELDS if k in row}, **_cut_from(row)},
    )


def _cut_from(row: dict[str, Any]) -> dict[str, Any]:
    """A clip cut from a long recording carries where it came from ({"source": {file, row, start, end}}),
    so a row of the training set can be found and heard in the recording it was cut from."""
    source = row.get("source")
    return {"source": source} if isinstance(source, dict) and "start" in source else {}


def read_clips(inputs: list[str]) -> list[Clip]:
    """All rows of all inputs; a repeated id is a run-level error naming both places."""
    if not inputs:
        raise StepError("no input given: pass one or more raw.jsonl files with --input")
    seen: dict[str, Clip] = {}
    for path in map(_input_file, inputs):
        base = path.resolve().parent
        for n, row, bad in jsonl_records(path):
            clip = _parse_clip(row, bad, f"{path}:{n}", base)
            if clip.id in seen:
                raise StepError(f"duplicate id {quoted(clip.id)}: {seen[clip.id].origin} and {clip.origin}")
            seen[clip.id] = clip
    if not seen:
        raise StepError(f"no rows in {', '.join(inputs)}: nothing to split")
    return sorted(seen.values(), key=lambda c: c.id)


def split(clips: list[Clip], p: ManifestParams) -> tuple[list[Clip], list[Clip]]:
    """(train, val), each sorted by id; see the module docstring for the rules."""

    def split_hash(c: Clip) -> float:
        return _unit_hash(f"split:{c.id}")

    val = {c.id for c in clips if split_hash(c) < p.val_fraction}
    if p.val_fraction > 0:
        by_speaker: dict[str, list[Clip]] = defaultdict(list)
        for c in clips:
            by_speaker[c.speaker].append(c)
        for rows in by_speaker.values():
            if len(rows) >= p.min_speaker_rows_for_val and not any(c.id in val for c in rows):
                val.add(min(rows, key=split_hash).id)
        for c in sorted(clips, key=split_hash):
            if len(val) >= p.min_val:
                break
            val.add(c.id)
    train = [c for c in clips if c.id not in val]
    if not train:
        raise StepError(
            f"all {len(clips)} rows went to val (min_val={p.min_val}, val_fraction={p.val_fraction}): "
            "give more rows or lower manifest.min_val"
        )
    return train, [c for c in clips if c.id in val]


def _pick_other(n: int, own: int | None, key: str) -> int | None:
    """A deterministic index in range(n) other than `own`, or None if there is none."""
    m = n - (own is not None)
    if m == 0:
        return None
    j = int(_unit_hash(key) * m)
    return j + 1 if own is not None and j >= own else j


def assign_refs(train: list[Clip], val: list[Clip], p: ManifestParams) -> None:
    """Set `ref` on the chosen train rows and on every val row that can have one.

    Candidates are a speaker's training clips, one per distinct audio file (ingest names files by
    content, so a shared file is the same recording), ordered by id, never by path, so moving the
    data folders does not change the choice.
    """
    candidates: dict[str, list[Clip]] = defaultdict(list)
    position: dict[tuple[str, str], int] = {}
    for c in train:  # sorted by id
        if (c.speaker, c.audio) not in position:
            position[c.speaker, c.audio] = len(candidates[c.speaker])
            candidates[c.speaker].append(c)

    def pick(c: Clip) -> Clip | None:
        mine = candidates.get(c.speaker, [])
        j = _pick_other(len(mine), position.get((c.speaker, c.audio)), f"ref-clip:{p.seed}:{c.id}")
        return mine[j] if j is not None else None

    eligible = [c for c in train if len(candidates[c.speaker]) > 1]
    eligible.sort(key=lambda c: _unit_hash(f"ref-row:{p.seed}:{c.id}"))
    for c in eligible[: round(p.ref_fraction * len(train))]:
        c.ref = pick(c)
    for c in val:
        c.ref = pick(c)


def _row(c: Clip, out_dir: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": c.raw_id,
        "speaker": c.raw_speaker,
        "audio": os.path.relpath(c.audio, out_dir),
        "text": c.text,
        **c.carried,
        "duration": c.duration,
    }
    if c.ref is not None:
        # upstream reads ref_duration to size sequences without decoding the reference
        row["ref_audio"] = os.path.relpath(c.ref.audio, out_dir)
        row["ref_duration"] = c.ref.duration
    return row


def _jsonl(clips: list[Clip], out_dir: str) -> str:
    return "".join(json.dumps(_row(c, out_dir), ensure_ascii=False) + "\n" for c in clips)


def _figures(clips: list[Clip]) -> dict[str, Any]:
    return {"rows": len(clips), "hours": round(sum(c.duration for c in clips) / 3600, 6)}


def _report(inputs: list[str], train: list[Clip], val: list[Clip]) -> dict[str, Any]:
    splits = {}
    for name, rows in (("train", train), ("val", val)):
        refs = sum(c.ref is not None for c in rows)
        fraction = round(refs / len(rows), 4) if rows else 0.0
        splits[name] = {**_figures(rows), "ref_rows": refs, "ref_fraction": fraction}
    by_speaker: dict[str, dict[str, list[Clip]]] = defaultdict(lambda: {"train": [], "val": []})
    for name, rows in (("train", train), ("val", val)):
        for c in rows:
            by_speaker[c.speaker][name].append(c)
    speakers = {s: {name: _figures(rows) for name, rows in parts.items()}
                for s, parts in sorted(by_speaker.items())}
    return {
        "inputs": inputs,
        "rows_in": len(train) + len(val),
        "splits": splits,
        "speakers": speakers,
    }


def build_manifest(p: ManifestParams) -> ManifestResult:
    start = time.perf_counter()
    clips = read_clips(p.input)
    train, val = split(clips, p)
    assign_refs(train, val, p)
    out = Path(p.out)
    out_dir = os.path.abspath(out)
    report = _report(list(p.input), train, val)
    try:
        atomic_write_text(out / "train.jsonl", _jsonl(train, out_dir))
        atomic_write_text(out / "val.jsonl", _jsonl(val, out_dir))
        write_report(out, report, run={"seconds": round(time.perf_counter() - start, 3)})
    except OSError as e:  # a full or read-only disk: each file is written whole or not at all
        raise StepError(
            f"writing the manifest into {out} failed ({e.strerror or e}). Each file there is either the new "
            "one, whole, or left as it was; no temp file is left. Free space (or make the folder writable) "
            "and rerun `voxpipe manifest`"
        ) from e
    return ManifestResult(out=out, report=report)
