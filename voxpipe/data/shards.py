"""`encode`'s shards and the index that registers them: written atomically, verified before reuse.

`index.jsonl` is the only record of what is already encoded: one line per complete shard (kind,
VAE or tokenizer hash, entry → length, and the file's size and sha256). Each rank appends the
shards it writes to its own `index.rank-N.jsonl` (one writer per file, so no locking); rank 0
folds the parts into `index.jsonl` at the start (what a killed run left) and at the end of a run.

A listed shard is reused only after its size and sha256 match the index (voxpipe.integrity): a
deleted, truncated or rewritten shard is set aside as `<name>.<reason>` (never deleted, so it can
be looked at), dropped from the index, and its clips are encoded again.

`train` checks the same before it reads anything (`check_referenced`): every shard the encoded
splits reference must be listed in the index with the size and sha256 it has now, or training
stops naming the shards, and rerunning `encode` re-encodes only their clips.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors.torch import save_file

from voxpipe.data.world import World
from voxpipe.files import as_os_error, atomic_write_text
from voxpipe.integrity import IntegrityError, check_file, file_entry

log = logging.getLogger(__name__)
INDEX = "index.jsonl"
_PART = re.compile(r"index\.rank-(\d+)\.jsonl")


def _records(path: Path) -> list[dict[str, Any]]:
    """The complete, well-formed lines of an index file.

    A line torn by a kill mid-append is not registered; a line that is not a shard record (edited,
    corrupted) is skipped with a warning, so its clips are encoded again rather than trusted.
    """
    if not path.is_file():
        return []
    raw = path.read_bytes()
    records = []
    for number, line in enumerate(raw[: raw.rfind(b"\n") + 1].splitlines(), 1):
        try:
            record = json.loads(line)
            entries = record["entries"]
            ok = isinstance(record["shard"], str) and isinstance(record["kind"], str) and isinstance(
                record["hash"], str) and all(isinstance(n, int) for n in entries.values())
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if ok:
            records.append(record)
        elif line.strip():
            log.warning("encode: %s line %d is not a shard record; not reused (its clips are encoded again)",
                        path, number)
    return records


def _lines(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def _parts(out: Path) -> list[Path]:
    found = [(int(m.group(1)), p) for p in out.glob("index.rank-*.jsonl") if (m := _PART.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def merge_parts(out: Path) -> None:
    """Fold every rank's part into index.jsonl (rank order, duplicates once), atomically; drop the parts.

    Rank 0 only, while no rank writes. Rewriting index.jsonl also cuts a torn last line off it.
    """
    index = out / INDEX
    records = _records(index)
    parts = _parts(out)
    seen = {json.dumps(r) for r in records}
    for part in parts:
        for record in _records(part):
            if json.dumps(record) not in seen:
                seen.add(json.dumps(record))
                records.append(record)
    if parts or (index.is_file() and index.read_bytes() != _lines(records).encode()):
        atomic_write_text(index, _lines(records))
    for part in parts:
        part.unlink()


def _problem(out: Path, record: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) if the record's shard cannot be trusted, else None."""
    rel = PurePosixPath(str(record.get("shard", "")))
    if rel.is_absolute() or ".." in rel.parts or rel.parts[:1] != ("shards",):
        return "bad-path", f"{out / INDEX}: shard path {str(rel)!r} is not under shards/"
    if not isinstance(record.get("size"), int) or not isinstance(record.get("sha256"), str):
        return "unverified", f"{out / rel}: the index has no size and sha256 for it (an older voxpipe)"
    try:
        check_file(out / rel, record)
    except IntegrityError as e:
        return e.reason, str(e)
    return None


def verify_index(out: Path, world: World) -> dict[str, str]:
    """Check every shard index.jsonl lists (split across ranks); rank 0 sets the failures aside.

    Returns {shard: reason} of the shards dropped from the index, the same on every rank.
    """
    records = _records(out / INDEX)
    problems = world.map(lambda r: _problem(out, r), records, workers=4, desc="verify shards")
    bad = {r["shard"]: p for r, p in zip(records, problems, strict=True) if p is not None}
    if bad and world.is_main:
        for shard, (reason, message) in sorted(bad.items()):
            path = out / shard
            aside = path.with_name(f"{path.name}.{reason}")
            if reason != "bad-path" and path.is_file():
                os.replace(path, aside)
                message += f"; set aside as {aside.name}"
            log.warning("encode: not reusing %s: %s; its clips are encoded again", shard, message)
        atomic_write_text(out / INDEX, _lines([r for r in records if r["shard"] not in bad]))
    world.barrier()  # nobody writes a shard before the bad ones are out of the way
    return {shard: reason for shard, (reason, _) in bad.items()}


def referenced_shards(rows: list[dict[str, Any]]) -> set[str]:
    """Every shard an encoded split's rows point at (tokens, latents, reference latents)."""
    return {ref["shard"] for row in rows for key in ("tokens", "latents", "ref_latents")
            if isinstance(ref := row.get(key), dict) and "shard" in ref}


def check_referenced(out: Path, shards: set[str], world: World) -> None:
    """StepError naming every referenced shard that is not in the index or fails its size/sha256 check.

    Collective (shards hashed in parallel across ranks); nothing is moved: `encode` does that."""
    listed = {r["shard"]: r for r in _records(out / INDEX)}
    names = sorted(shards)

    def problem(name: str) -> str | None:
        record = listed.get(name)
        if record is None:
            return f"{name} (not in {INDEX})"
        found = _problem(out, record)
        return None if found is None else f"{name} ({found[0]})"

    bad = [p for p in world.map(problem, names, workers=4, desc="verify shards") if p is not None]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise IntegrityError("bad-shards", (
            f"{out}: {len(bad)} of the {len(names)} encoded shards the splits reference fail their check "
            f"against {out / INDEX} (size and sha256): {', '.join(bad[:5])}{more}. Training reads nothing it "
            "cannot verify. Rerun `voxpipe encode` with the same params: it sets the damaged shards aside "
            "and encodes only their clips again, then rerun train"))


class ShardIndex:
    """The merged index as read at the start of a run, plus what this rank registers since."""

    def __init__(self, out: Path, rank: int = 0):
        self.out = out
        self.part = out / f"index.rank-{rank}.jsonl"
        self.entries: dict[tuple[str, str, str], tuple[str, int]] = {}
        for record in _records(out / INDEX):
            self._add(record)

    def _add(self, record: dict[str, Any]) -> None:
        for name, length in record["entries"].items():
            self.entries[(record["kind"], record["hash"], name)] = (record["shard"], length)

    def has(self, kind: str, hash_: str, name: str) -> bool:
        return (kind, hash_, name) in self.entries

    def write_shard(self, kind: str, hash_: str, tensors: dict[str, torch.Tensor]) -> str:
        """Save atomically under a content-derived name, then register it; returns its path in `out`."""
        key = hashlib.sha256(json.dumps([kind, hash_, sorted(tensors)]).encode()).hexdigest()[:20]
        rel = f"shards/{kind[:3]}-{key}.safetensors"
        final = self.out / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        # one metadata key: safetensors writes several in random order, and shards must be reproducible
        try:
            save_file(tensors, str(tmp), metadata={"voxpipe": json.dumps({"kind": kind, "hash": hash_})})
        except Exception as e:  # a full disk: no partial shard left taking the space
            tmp.unlink(missing_ok=True)
            if (error := as_os_error(e, tmp)) is e:
                raise
            raise error from e
        entry = file_entry(tmp)
        os.replace(tmp, final)
        record = {"shard": rel, "kind": kind, "hash": hash_,
                  "entries": {name: int(t.shape[0]) for name, t in sorted(tensors.items())}, **entry}
        with self.part.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._add(record)
        return rel


def remove_stale_temps(shards: Path) -> None:
    if shards.is_dir():
        for tmp in shards.glob(".*.tmp-*"):
            tmp.unlink(missing_ok=True)
