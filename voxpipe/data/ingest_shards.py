"""Sharded ingest: plan the inputs into shards, ingest each shard anywhere, merge into one output.

A shard is a contiguous run of the inputs in their global order (whole files, parquet row groups,
manifest records), cut so that shards hold about equal audio volume (parquet: the compressed bytes of
the audio column, from the footers; manifests: the sizes of the files they point to). Each shard is
an ordinary ingest of its row ranges. Because shards are contiguous and every row keeps its file
and row number, the merge only has to walk the shards in plan order: copy each kept line verbatim,
turn a row whose id an earlier shard already kept into a `duplicate` (as a single run would have),
and link each kept clip into the output's content-addressed `audio/`. The result, raw.jsonl included,
is byte-identical to a single `voxpipe ingest` of the same inputs.

The merge streams: it holds one line at a time plus the kept row ids as a sorted uint64 array
(8 bytes per kept row), whatever the size of the data set. Shard folders may come in any order
(KFP's `dsl.Collected` promises none): each shard's report names its plan and index.

Nothing is trusted after it was written. The plan records each input file's size and sha256, and a
shard refuses an input that changed since. A finished shard writes `outputs.sha256` (sha256sum's
format: raw.jsonl, quarantine.jsonl, then the clip of each raw.jsonl line in order), and the merge
checks both jsonl files before reading them and each clip before linking it: an edited transcript or
a replaced FLAC stops the merge, naming the file.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from voxpipe.data.data_report import write_data_report
from voxpipe.data.ingest import (
    IngestResult,
    columns_of,
    consent_of,
    drop_mismatched_voices,
    duplicate_detail,
    ingest_ranges,
    json_line,
    too_many_bad,
    write_failed,
)
from voxpipe.data.ingest_row import resolve_audio_path
from voxpipe.data.parquet_source import row_groups
from voxpipe.data.sources import UNSAFE, SourceFile, iter_rows, open_source, open_sources
from voxpipe.errors import StepError
from voxpipe.files import atomic_write_text, read_json_object
from voxpipe.params import Params
from voxpipe.report import read_run
from voxpipe.steps.ingest import IngestParams

log = logging.getLogger(__name__)
PLAN = "plan.json"
PIECE_ROWS = 64  # manifest rows are weighed and cut in pieces of this many
OUTPUT_HASHES = "outputs.sha256"  # a finished shard's files and their sha256, as sha256sum writes them
JSONL_OUTPUTS = ("raw.jsonl", "quarantine.jsonl")


@dataclass
class PlanResult:
    path: Path
    shards: int
    rows: int

    def summary(self) -> str:
        return f"ingest-plan: {self.rows} rows in {self.shards} shards → {self.path}"


def _path_weights(src: SourceFile, start: int, stop: int) -> int:
    """Bytes of the audio files that rows [start, stop) point to (missing or unsafe ones count 0)."""
    base, root = str(src.path.parent.resolve()), str(src.root.resolve())
    total = 0
    for rows in iter_rows(src, start, stop, PIECE_ROWS):
        for raw in rows:
            if isinstance(raw.audio, str):
                path, _ = resolve_audio_path(raw.audio, base, root)
                total += path.stat().st_size if path is not None and path.is_file() else 0
            elif isinstance(raw.audio, bytes):
                total += len(raw.audio)
    return total


def _pieces(src: SourceFile) -> Iterator[tuple[int, int, int]]:
    """(start, stop, audio bytes) of the smallest parts a shard boundary may fall between."""
    if src.kind == "parquet" and src.audio_kind != "path":
        start = 0
        for rows, size in row_groups(src.path, src.columns.audio):
            yield start, start + rows, size
            start += rows
        return
    for start in range(0, src.num_rows, PIECE_ROWS):
        stop = min(start + PIECE_ROWS, src.num_rows)
        yield start, stop, _path_weights(src, start, stop)


def plan_shards(sources: list[SourceFile], shards: int) -> list[dict[str, Any]]:
    """Contiguous shards of about equal audio volume; fewer than asked when there are too few pieces."""
    pieces = [(i, a, b, w + (b - a)) for i, src in enumerate(sources) for a, b, w in _pieces(src) if b > a]
    total = sum(w for *_, w in pieces) or 1
    plan: list[dict[str, Any]] = []
    done = 0
    for i, a, b, w in pieces:
        # a piece goes to the shard its middle falls in: boundaries near k/shards of the volume
        k = min(shards - 1, int((done + w / 2) * shards / total))
        done += w
        if not plan or plan[-1]["k"] != k:
            plan.append({"k": k, "ranges": [], "rows": 0, "audio_bytes": 0})
        shard = plan[-1]
        if shard["ranges"] and shard["ranges"][-1][0] == i and shard["ranges"][-1][2] == a:
            shard["ranges"][-1][2] = b
        else:
            shard["ranges"].append([i, a, b])
        shard["rows"] += b - a
        shard["audio_bytes"] += w - (b - a)
    return [{k: v for k, v in s.items() if k != "k"} for s in plan]


def plan(p: IngestParams) -> PlanResult:
    """`voxpipe ingest-plan`: out/plan.json splitting the inputs into `p.shards` shards."""
    notices: list[str] = []
    sources = open_sources(p.input, columns_of(p), notices)
    shards = plan_shards(sources, p.shards)
    if not shards:
        names = ", ".join(s.path.as_posix() for s in sources)
        raise StepError(f"the input files hold no rows: {names}")
    out = Path(p.out)
    atomic_write_text(out / PLAN, json.dumps({
        "inputs": [{"file": s.path.as_posix(), "root": s.root.as_posix(), "kind": s.kind, "rows": s.num_rows,
                    **_fingerprint(s)} for s in sources],
        "notices": notices,
        "consent": consent_of(p),
        "shards": shards,
    }, indent=1) + "\n")
    return PlanResult(out / PLAN, len(shards), sum(s.num_rows for s in sources))


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fingerprint(src: SourceFile) -> dict[str, Any]:
    """What a shard checks an input against: its size and sha256 (a link out of the input folder is
    never opened: None)."""
    if src.kind == UNSAFE:
        return {"size": None, "sha256": None}
    return {"size": src.path.stat().st_size, "sha256": file_sha256(src.path)}


def _check_unchanged(src: SourceFile, entry: dict[str, Any], plan_path: str) -> None:
    if "sha256" not in entry:
        raise StepError(f"{plan_path} records no input hashes (an older voxpipe wrote it): run "
                        "`voxpipe ingest-plan` again")
    if _fingerprint(src) != {"size": entry["size"], "sha256": entry["sha256"]}:
        raise StepError(
            f"{src.path} is not the file the plan {plan_path} recorded (its size or sha256 differs): the "
            "input changed after planning. Run `voxpipe ingest-plan` again"
        )


def write_output_hashes(out: Path) -> None:
    """out/outputs.sha256 for a finished shard, streamed: one line per raw.jsonl row."""
    tmp = out / f".{OUTPUT_HASHES}.tmp"
    with open(tmp, "w", encoding="utf-8") as f, open(out / "raw.jsonl", encoding="utf-8") as raw:
        for name in JSONL_OUTPUTS:
            f.write(f"{file_sha256(out / name)}  {name}\n")
        for line in raw:
            clip = json.loads(line)["audio"]
            f.write(f"{file_sha256(out / clip)}  {clip}\n")
    os.replace(tmp, out / OUTPUT_HASHES)


def _shard_hashes(folder: Path) -> Iterator[tuple[str, str]]:
    """(sha256, clip) for each raw.jsonl line of a shard, after checking its two jsonl files."""
    path = folder / OUTPUT_HASHES
    if not path.is_file():
        raise StepError(f"{folder} has no {OUTPUT_HASHES}: the shard did not finish (or an older voxpipe "
                        "wrote it). Run that shard again")
    with open(path, encoding="utf-8") as f:
        for name in JSONL_OUTPUTS:
            expected, _, listed = f.readline().rstrip("\n").partition("  ")
            if listed != name or file_sha256(folder / name) != expected:
                raise StepError(f"{folder / name} does not match the sha256 its shard recorded in {path}: "
                                "the shard folder was changed after it finished. Run that shard again")
        for line in f:
            digest, _, clip = line.rstrip("\n").partition("  ")
            yield digest, clip


def _read_plan(path: str) -> tuple[dict[str, Any], str]:
    if not path:
        raise StepError("no plan: set ingest.plan to the plan.json that `voxpipe ingest-plan` wrote")
    data = read_json_object(Path(path), "an ingest plan (plan.json from `voxpipe ingest-plan`)")
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return data, digest


def ingest_shard_step(params: Params) -> IngestResult:
    """`voxpipe ingest-shard`: the ingest section, with the asr section's model folders."""
    return ingest_shard(params.ingest, params.asr.model_dump())


def ingest_shard(p: IngestParams, asr: Mapping[str, Any] | None = None) -> IngestResult:
    """The rows of shard `p.shard` of the plan, ingested into `p.out`; `asr`: the recognisers' folders."""
    data, digest = _read_plan(p.plan)
    shards = data["shards"]
    if not 0 <= p.shard < len(shards):
        raise StepError(f"{p.plan}: ingest.shard={p.shard}, but the plan has shards 0..{len(shards) - 1}")
    ranges = [tuple(r) for r in shards[p.shard]["ranges"]]
    sources: dict[int, SourceFile] = {}
    for i in sorted({r[0] for r in ranges}):
        entry = data["inputs"][i]
        src = open_source(Path(entry["file"]), Path(entry["root"]), entry["kind"], columns_of(p), [])
        if src.num_rows != entry["rows"]:
            raise StepError(
                f"{src.path} has {src.num_rows} rows, the plan {p.plan} counted {entry['rows']}: the input "
                "changed after planning. Run `voxpipe ingest-plan` again."
            )
        _check_unchanged(src, entry, p.plan)
        sources[i] = src
    shard = {"index": p.shard, "of": len(shards), "plan": digest}
    out = Path(p.out)
    (out / OUTPUT_HASHES).unlink(missing_ok=True)  # present only once this run of the shard finished
    result = ingest_ranges(p, sources, ranges, out, [], whole_run=False, consent=data.get("consent"),
                           asr=asr, shard=shard)
    try:
        write_output_hashes(out)
    except OSError as e:
        raise write_failed(e, out, result) from e
    return result


def _shard_folders(p: IngestParams, digest: str, count: int) -> list[Path]:
    """The shard folders in plan order, each checked to be a finished shard of this plan."""
    found: dict[int, Path] = {}
    for folder in map(Path, p.shard_dirs):
        report = read_json_object(folder / "report.json", "an ingest-shard report")
        shard = report.get("shard") or {}
        if shard.get("plan") != digest:
            raise StepError(f"{folder} is not a shard of the plan {p.plan} (its report names another plan)")
        if report.get("error"):
            raise StepError(f"{folder}: shard {shard['index']} failed: {report['error']}. Rerun that shard.")
        found[shard["index"]] = folder
    missing = sorted(set(range(count)) - set(found))
    if missing:
        raise StepError(f"shards {missing} of the plan {p.plan} are missing from ingest.shard_dirs; "
                        f"give all {count} ingest-shard folders")
    return [found[i] for i in range(count)]


def _lines(path: Path, positions: dict[str, int]) -> Iterator[tuple[tuple[int, int], str, dict[str, Any]]]:
    """((input index, row), line, parsed) for each line of a shard's jsonl, in file order."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            yield (positions[obj["source"]["file"]], obj["source"]["row"]), line, obj


def _replace_with(source: str, target: str, link: bool) -> None:
    """`target` becomes `source`'s content atomically: a hard link, or a copy, under a temp name first."""
    tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{os.getpid()}.tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    if link:
        os.link(source, tmp)
    else:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def merge(p: IngestParams) -> IngestResult:
    """`voxpipe ingest-merge`: the shards of a plan → one output, as a single `voxpipe ingest` writes it."""
    return _merge(p, time.perf_counter())


class _Merger:
    """The merge's running state: the output files, the counts, and the ids kept so far."""

    def __init__(self, out: Path, result: IngestResult, positions: dict[str, int]) -> None:
        self.out, self.result, self.positions = out, result, positions
        self.kept = np.empty(0, dtype=np.uint64)  # sorted ids kept by the shards merged so far
        self.final = [out / "raw.jsonl", out / "quarantine.jsonl"]
        self.tmp = [f.with_name(f".{f.name}.tmp") for f in self.final]
        self.raw, self.bad = (open(t, "w", encoding="utf-8") for t in self.tmp)
        self.folders: set[str] = set()  # audio/xx folders known to exist

    def add(self, folder: Path) -> None:
        """One shard, in plan order: its lines interleaved by input position, as a single run wrote them."""
        hashes = _shard_hashes(folder)  # checks raw.jsonl and quarantine.jsonl before they are read
        with open(folder / "raw.jsonl", encoding="utf-8") as f:
            ids = np.fromiter((int(json.loads(line)["id"], 16) for line in f), dtype=np.uint64)
        repeated = np.isin(ids, self.kept)
        self.kept = np.union1d(self.kept, ids[~repeated])
        raws = ((pos, line, obj, bool(dup), digest) for (pos, line, obj), dup, digest in
                zip(_lines(folder / "raw.jsonl", self.positions), repeated, _clip_hashes(hashes, ids.size),
                    strict=True))
        quarantined = _lines(folder / "quarantine.jsonl", self.positions)
        bads = ((pos, line, obj, False, None) for pos, line, obj in quarantined)
        for _, line, obj, dup, digest in heapq.merge(raws, bads, key=lambda t: t[0]):
            if "id" not in obj:  # the shard's own quarantine line, already in single-run form
                self._quarantine(line, obj["reason"])
            elif dup:  # an earlier shard kept this row: a single run would have called it a duplicate
                why = duplicate_detail(obj["id"])
                self._quarantine(json_line({"source": obj["source"], "reason": "duplicate", "detail": why}),
                                 "duplicate")
            else:
                self._keep(folder, line, obj, digest)

    def _quarantine(self, line: str, reason: str) -> None:
        self.bad.write(line)
        self.result.rows_quarantined += 1
        self.result.reasons[reason] += 1

    def _keep(self, folder: Path, line: str, obj: dict[str, Any], digest: tuple[str, str]) -> None:
        self.raw.write(line)
        source = os.path.join(folder, obj["audio"])
        try:
            if digest[1] != obj["audio"] or file_sha256(source) != digest[0]:
                raise StepError(f"{source} does not match the sha256 its shard recorded in "
                                f"{folder / OUTPUT_HASHES}: the shard folder was changed after it finished. "
                                "Run that shard again")
            self._link(source, os.path.join(self.out, obj["audio"]))
        except OSError as e:
            raise StepError(f"{folder}: cannot take its clip {obj['audio']} ({e}); the shard folder was "
                            "changed after it finished: run that shard again") from e
        self.result.count_kept(obj)

    def _link(self, source: str, target: str) -> None:
        """Put the shard's clip at its content-addressed place in the output: a hard link (a new name
        for a finished file: it appears whole), a copy across filesystems. One or two syscalls a clip:
        this is the merge's hot loop."""
        parent = os.path.dirname(target)
        if parent not in self.folders:
            os.makedirs(parent, exist_ok=True)
            self.folders.add(parent)
        try:
            os.link(source, target)
        except FileExistsError:  # an earlier run's clip of the same name: keep it only if it is this file
            if not os.path.samefile(source, target):
                _replace_with(source, target, link=True)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            _replace_with(source, target, link=False)  # another filesystem, or one without hard links

    def close(self, keep: bool) -> None:
        """Rename the outputs into place (keep) or drop them."""
        self.raw.close()
        self.bad.close()
        for tmp, final in zip(self.tmp, self.final, strict=True):
            if keep:
                os.replace(tmp, final)
            else:
                tmp.unlink(missing_ok=True)


def _clip_hashes(hashes: Iterator[tuple[str, str]], rows: int) -> Iterator[tuple[str, str]]:
    """The recorded (sha256, clip) of each of `rows` raw.jsonl lines; a count that differs is a change."""
    count = 0
    for pair in hashes:
        count += 1
        if count > rows:
            break
        yield pair
    if count != rows:
        more = 'more' if count > rows else count
        raise StepError(f"{OUTPUT_HASHES} lists {more} clips for {rows} raw.jsonl "
                        "rows: the shard folder was changed after it finished. Run that shard again")


def _merge(p: IngestParams, start: float) -> IngestResult:
    """The merge; run.json times it from `start` (`ingest --shards`: the whole run)."""
    data, digest = _read_plan(p.plan)
    folders = _shard_folders(p, digest, len(data["shards"]))
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    result = IngestResult(out=out, shards=len(folders), notices=list(data["notices"]))
    merger = _Merger(out, result, {entry["file"]: i for i, entry in enumerate(data["inputs"])})
    shard_runs = []
    try:
        for folder in folders:
            report = read_json_object(folder / "report.json", "an ingest-shard report")
            shard_runs.append({"rows_in": report["rows_in"], **_run_facts(folder)})
            result.workers = max(result.workers, shard_runs[-1]["workers"] or 1)
            result.rows_in += report["rows_in"]
            merger.add(folder)
    except BaseException:
        merger.close(keep=False)
        raise
    balanced = result.rows_in == result.rows_kept + result.rows_quarantined
    merger.close(keep=balanced)
    if not balanced:
        raise StepError(
            f"the shards report {result.rows_in} rows but hold {result.rows_kept} kept and "
            f"{result.rows_quarantined} quarantined: a shard folder was changed after it finished"
        )
    if recordings := (data.get("consent") or {}).get("recordings"):  # needs every shard's clips of a voice
        drop_mismatched_voices(out, result, recordings, p.consent_voice_threshold)
    result.wall_seconds = time.perf_counter() - start
    error = too_many_bad(result, p.max_bad_fraction, out)
    inputs = [{"file": e["file"], "rows": e["rows"]} for e in data["inputs"]]
    try:
        result.save(inputs, str(error) if error else None, run={"shards": shard_runs},
                    consent=(data.get("consent") or {}).get("report"))
        write_data_report(out)
    except OSError as e:
        raise write_failed(e, out, result) from e
    if error is not None:
        raise error
    return result


def _run_facts(folder: Path) -> dict[str, Any]:
    facts = read_run(folder)
    return {"workers": facts.get("workers"), "seconds": facts.get("timings", {}).get("seconds")}


def ingest_sharded(p: IngestParams, asr: Mapping[str, Any] | None = None) -> IngestResult:
    """`voxpipe ingest --shards N`: plan, each shard, merge, on this machine; the shards' folders
    (out/shards/) are removed once merged: every kept clip is linked into out/audio."""
    start = time.perf_counter()
    out = Path(p.out)
    work = out / "shards"
    shutil.rmtree(work, ignore_errors=True)
    planned = plan(p.model_copy(update={"out": str(work)}))
    folders = []
    for index in range(planned.shards):
        folder = work / f"{index:04d}"
        log.info("ingest shard %d of %d", index + 1, planned.shards)
        shard = p.model_copy(update={"plan": str(planned.path), "shard": index, "out": str(folder)})
        ingest_shard(shard, asr)
        folders.append(str(folder))
    merged = p.model_copy(update={"plan": str(planned.path), "shard_dirs": folders})
    result = _merge(merged, start)
    shutil.rmtree(work)
    return result

