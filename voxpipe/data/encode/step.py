"""`voxpipe encode`: the step (see the package docstring for the layout of its output)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from voxpipe.data.dataset import sequence_length
from voxpipe.data.encode.inputs import (
    FileHashes,
    Hashes,
    Quarantine,
    Row,
    decode_all,
    estimate_samples,
    manifest_files,
    read_manifest,
)
from voxpipe.data.encode.plan import Clip, group_shards, plan
from voxpipe.data.language import LATIN_DEFAULT, detect_language
from voxpipe.data.shards import ShardIndex, merge_parts, remove_stale_temps, verify_index
from voxpipe.data.world import World, joined_world
from voxpipe.device import cpu_threads
from voxpipe.errors import StepError
from voxpipe.files import DISK_ERRORS, atomic_write_text
from voxpipe.model.encoder import Encoder, encode_batch, load_encoder
from voxpipe.params import Params
from voxpipe.progress import bar as progress_bar
from voxpipe.report import write_report
from voxpipe.steps.encode import EncodeParams

log = logging.getLogger(__name__)
LATENTS, TOKENS = "latents", "tokens"
# auto batch sizes (padded audio seconds): accelerators idle on one clip per call; on CPU big batches
# fall out of cache while small ones still amortise per-op thread overhead (benchmarks/encode.py)
AUTO_BATCH_SECONDS = {"cpu": 8.0, "accelerator": 60.0}


@dataclass
class EncodeResult:
    out: Path
    report: dict[str, Any] | None  # report.json; None on ranks other than 0 (rank 0 reports for all)
    run: dict[str, Any] | None  # run.json: reuse counts and timings

    def summary(self) -> str:
        r, run = self.report, self.run
        if r is None or run is None:
            return ""
        speed = ""
        if run["clips"]["encoded"]:
            rate = f"{run['clips_per_s']:.1f} clips/s on {run['world_size']} × {run['ranks'][0]['device']}"
            speed = f" ({run['audio_seconds_encoded']:.1f} s of audio, {rate})"
        bad = run["shards_rejected"]
        rejected = f", {len(bad)} shard(s) failed verification and were re-encoded" if bad else ""
        return (
            f"encode: {r['rows_in']} rows → {r['rows_kept']} kept, {r['rows_quarantined']} quarantined; "
            f"clips: {run['clips']['encoded']} encoded{speed}, {run['clips']['reused']} reused, "
            f"{r['clips']['failed']} failed{rejected} → {self.out}"
        ) + byte_warning(r)


def byte_warning(report: dict[str, Any]) -> str:
    """A second line when the base's tokenizer spells a share of the rows in byte pieces, naming the
    script."""
    splits = report.get("splits", {}).values()
    rows = sum(s["rows"] for s in splits)
    spelled = sum(s["byte_token_rows"] for s in splits)
    if not rows or spelled / rows < BYTE_ROWS_WARN:
        return ""
    scripts: Counter[str] = Counter()
    for s in splits:
        scripts.update(s.get("byte_token_rows_by_script", {}))
    named = ", ".join(f"{script} {n}" for script, n in scripts.most_common())
    return (f"\nwarning: the base model's tokenizer has no tokens for some characters of {spelled} of {rows} "
            f"rows ({named}): they are spelled as byte pieces it has barely seen, and it will read them "
            "badly. The real VoxCPM2 checkpoint (model.base: models/VoxCPM2) has tokens for them; the demo "
            "base's small tokenizer covers few of them")


def _device(choice: str, local_rank: int) -> torch.device:
    from voxpipe.device import resolve_device_type  # lazily: torch_npu is only probed here

    kind = resolve_device_type(choice)
    return torch.device(kind) if kind == "cpu" else torch.device(kind, local_rank)


def batch_seconds(p: EncodeParams, device: torch.device) -> float:
    if p.batch_seconds:
        return p.batch_seconds
    return AUTO_BATCH_SECONDS["cpu" if device.type == "cpu" else "accelerator"]



@dataclass
class RankWork:
    """What one rank did: failures (sha → problem), new clips stored, their audio seconds, and the
    process's CPU seconds for it (a load-independent figure on a shared machine)."""

    failed: dict[str, str] = field(default_factory=dict)
    stored: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def _encode_batches(
    enc: Encoder, index: ShardIndex, batches: list[list[Clip]], new: set[str], p: EncodeParams,
    device: torch.device, show: bool,
) -> RankWork:
    """Encode whole batches; store the new clips' latents, a shard per `shard_mb`.

    A batch's already-encoded clips go through the VAE again with it (its composition is part of
    the result) but are not stored twice. The shards are grouped from the plan alone, so a resumed
    run (whose batches are the old ones minus its registered shards) writes the same shards.
    """
    vae, sr, multiple = enc.vae, enc.vae.sample_rate, enc.multiple
    frame_bytes = vae.latent_dim * 4 * multiple // vae.hop_length  # fp32 latent bytes per padded unit
    sizes = [sum(math.ceil(c.samples / multiple) * frame_bytes for c in b if c.sha in new) for b in batches]
    flat = [(g, batches[i]) for g, group in enumerate(group_shards(sizes, p.shard_mb * 1e6)) for i in group]
    work = RankWork()
    cpu = time.process_time()
    tensors: dict[str, torch.Tensor] = {}
    total = sum(len(b) for b in batches)
    bar = progress_bar(total=total, enabled=show, desc="encode", unit="clip")
    done = 0
    with ThreadPoolExecutor(max_workers=1) as reader:  # decodes the next batch while the VAE runs
        future = reader.submit(decode_all, [c.path for c in flat[0][1]], sr) if flat else None
        for k, (group, batch) in enumerate(flat):
            decoded = future.result()
            if k + 1 < len(flat):
                future = reader.submit(decode_all, [c.path for c in flat[k + 1][1]], sr)
            work.failed.update((c.sha, w) for c, w in zip(batch, decoded, strict=True)
                               if isinstance(w, str) and c.sha in new)
            good = [(c.sha, w) for c, w in zip(batch, decoded, strict=True) if not isinstance(w, str)]
            if any(sha in new for sha, _ in good):
                latents = encode_batch(vae, [w for _, w in good], multiple, device)
                for (sha, wav), z in zip(good, latents, strict=True):
                    if sha in new:
                        tensors[sha] = z
                        work.seconds += len(wav) / sr
            bar.update(len(batch))
            done += len(batch)
            if tensors and (k + 1 == len(flat) or flat[k + 1][0] != group):
                index.write_shard(LATENTS, enc.vae_hash, tensors)
                work.stored += len(tensors)
                tensors = {}
                if show and bar.disable:  # a pod log: one line per shard instead of a bar
                    log.info("encode: shard %d/%d written, %d/%d clips of this rank", group + 1,
                             flat[-1][0] + 1, done, total)
    bar.close()
    work.cpu_seconds = time.process_time() - cpu
    return work


def _tokenize_pending(enc: Encoder, index: ShardIndex, texts: dict[str, str]) -> int:
    """Token ids of texts not yet in the index, in one shard; returns how many were tokenized."""
    pending = sorted(k for k in texts if not index.has(TOKENS, enc.tokenizer_hash, k))
    if pending:
        ids = enc.tokenizer.encode_batch([texts[k] for k in pending])
        tensors = {k: torch.tensor(i, dtype=torch.int32) for k, i in zip(pending, ids, strict=True)}
        index.write_shard(TOKENS, enc.tokenizer_hash, tensors)
    return len(pending)


def _relative(path: Path, start: Path) -> str:
    return os.path.relpath(path.resolve(), start.resolve())


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def encoded_row(row: Row, out: Path, enc: Encoder, index: ShardIndex, hashes: Hashes) -> dict[str, Any]:
    """One line of out/<manifest name>: the manifest row plus where its tensors live.

    `audio` / `ref_audio` are rewritten relative to `out`; `source` is the manifest file and line;
    `tokens`, `latents`, `ref_latents` are {"shard": path relative to out, "key": tensor name};
    `text_tokens`, `audio_frames`, `ref_frames` count token ids and latent frames (a multiple of
    patch_size); `lm_tokens` is the packed LM sequence length.
    """

    def where(kind: str, hash_: str, key: str) -> tuple[dict[str, str], int]:
        shard, length = index.entries[(kind, hash_, key)]
        return {"shard": shard, "key": key}, length

    tokens, n_text = where(TOKENS, enc.tokenizer_hash, _text_key(row.data["text"]))
    latents, n_audio = where(LATENTS, enc.vae_hash, hashes[row.audio][0])
    data = dict(row.data)
    data.update(audio=_relative(row.audio, out), source={"file": row.file, "line": row.line},
                text_tokens=n_text, audio_frames=n_audio, tokens=tokens, latents=latents)
    n_ref = None
    if row.ref is not None:
        ref, n_ref = where(LATENTS, enc.vae_hash, hashes[row.ref][0])
        data.update(ref_audio=_relative(row.ref, out), ref_frames=n_ref, ref_latents=ref)
    data["lm_tokens"] = sequence_length(n_text, n_audio, n_ref, enc.patch_size)
    return data


# the script a row's language is detected from (voxpipe/data/language.py), to name in the warning
SCRIPTS = {"zh": "Han", "ja": "kana", "ko": "Hangul", LATIN_DEFAULT: "Latin or other alphabets"}
BYTE_ROWS_WARN = 0.05  # a share of rows spelled partly in byte pieces worth a warning in the summary


def byte_piece_ids(enc: Encoder) -> frozenset[int]:
    """Ids of the tokenizer's byte-fallback pieces (`<0x00>`..`<0xFF>`)."""
    found = (enc.tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256))
    return frozenset(i for i in found if i is not None)


def _write_split(path: Path, rows: list[Row], out: Path, enc: Encoder, index: ShardIndex, hashes: Hashes,
                 problems: dict[str, str], quarantine: Quarantine) -> dict[str, int]:
    """out/<manifest name> with every row whose clips were encoded; the others are quarantined.

    Each row counts its `byte_tokens`: characters the base model's tokenizer has no token for, spelled
    as byte-fallback pieces the model has barely seen (a new script, emoji). The check lives here, not
    in ingest, because the tokenizer is the base checkpoint's, and only encode has it."""
    lines, totals = [], Counter(rows=0, ref_rows=0, audio_frames=0, lm_tokens=0, byte_token_rows=0)
    scripts: Counter[str] = Counter()
    pieces = byte_piece_ids(enc)
    for row in rows:
        bad = _row_problem(row, hashes, problems)
        if bad:
            quarantine.add(row.file, row.line, *bad)
            continue
        data = encoded_row(row, out, enc, index, hashes)
        data["byte_tokens"] = sum(i in pieces for i in enc.tokenizer.encode(row.data["text"]))
        lines.append(json.dumps(data, ensure_ascii=False) + "\n")
        totals.update(rows=1, ref_rows=int(row.ref is not None), audio_frames=data["audio_frames"],
                      lm_tokens=data["lm_tokens"], byte_token_rows=int(data["byte_tokens"] > 0))
        if data["byte_tokens"]:
            scripts[SCRIPTS[detect_language(row.data["text"])]] += 1
    atomic_write_text(path, "".join(lines))
    return {**totals, "byte_token_rows_by_script": dict(sorted(scripts.items()))}


def _row_problem(row: Row, hashes: Hashes, problems: dict[str, str]) -> tuple[str, str] | None:
    for path, what in ((row.audio, "audio"), (row.ref, "ref_audio")):
        if path is None:
            continue
        sha, problem = hashes[path]
        if problem:
            return f"{what}_missing", problem
        if sha in problems:
            return f"{what}_undecodable", problems[sha]
    return None



def encode(params: Params) -> EncodeResult:
    """`encode`, reading the base checkpoint from model.base (train's base: latents must match it).

    Plain or under torchrun: every rank runs this; rank 0 merges, writes the splits and reports.
    """
    p = params.encode
    files = manifest_files(p.manifest)
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    with joined_world() as world:
        try:
            return _encode(world, p, params.model.base, files, out)
        except OSError as e:  # disk full, read-only, quota: what is registered stays, temp files go next run
            if e.errno not in DISK_ERRORS:
                raise
            raise StepError(
                f"writing into {out} failed ({e.strerror or e}{f': {e.filename}' if e.filename else ''}). "
                "Shards already registered in index.jsonl are kept and reused; a half-written one is "
                "removed on the next run. Free space (or make the folder writable) and rerun encode: it "
                "encodes only what is missing") from e


def _encode(world: World, p: EncodeParams, base: str, files: list[Path], out: Path) -> EncodeResult:
    start = time.perf_counter()
    if world.is_main:  # what a killed run left: temp files, unmerged rank parts, a torn index line
        remove_stale_temps(out / "shards")
        merge_parts(out)
    world.barrier()
    rejected = verify_index(out, world)
    enc = load_encoder(base)
    index = ShardIndex(out, world.rank)

    quarantine = Quarantine()
    per_file = {f: read_manifest(f, quarantine) for f in files}
    rows = [r for rs in per_file.values() for r in rs]
    rows_in = len(rows) + len(quarantine.entries)
    paths = sorted({p_ for r in rows for p_ in (r.audio, r.ref) if p_ is not None})
    hashes = FileHashes(out / "file_hashes.json").hash_all(paths, world)

    # clips by content: one entry per distinct audio sha, whatever the number of paths or rows using it
    clip_path: dict[str, Path] = {}
    for path in paths:
        if hashes[path][0] is not None:
            clip_path.setdefault(hashes[path][0], path)
    new = {sha for sha in clip_path if not index.has(LATENTS, enc.vae_hash, sha)}

    texts = {_text_key(r.data["text"]): r.data["text"] for r in rows}
    tokenized = _tokenize_pending(enc, index, texts) if world.is_main else 0

    device = None
    problems: dict[str, str] = {}
    work = RankWork()
    encode_start = time.perf_counter()
    if new:
        device = _device(p.device, world.local_rank)
        sr = enc.vae.sample_rate
        clips = []
        for (sha, path), (samples, problem) in zip(
            clip_path.items(), world.map(lambda path: estimate_samples(path, sr), list(clip_path.values())),
            strict=True,
        ):
            if problem:
                problems[sha] = problem
            else:
                clips.append(Clip(sha, path, samples))
        mine = plan(clips, new, enc.multiple, int(batch_seconds(p, device) * sr), world.size)[world.rank]
        with cpu_threads(device, p.cpu_threads):
            enc.vae.to(device)
            work = _encode_batches(enc, index, mine, new, p, device, show=world.is_main)
    done = world.all_gather((work, str(device)))
    encode_seconds = time.perf_counter() - encode_start
    if not world.is_main:
        return EncodeResult(out, None, None)

    merge_parts(out)
    index = ShardIndex(out)
    for rank_work, _ in done:
        problems.update(rank_work.failed)
    splits = {f.name: _write_split(out / f.name, file_rows, out, enc, index, hashes, problems, quarantine)
              for f, file_rows in per_file.items()}
    quarantine.entries.sort(key=lambda e: (e["source"]["file"], e["source"]["line"]))
    atomic_write_text(out / "quarantine.jsonl", "".join(json.dumps(e, ensure_ascii=False) + "\n"
                                                         for e in quarantine.entries))

    rows_kept = sum(s["rows"] for s in splits.values())
    encoded = sum(w.stored for w, _ in done)
    # report.json: what was produced (byte-identical for the same inputs); run.json: how this run went
    report = {
        "manifests": [str(f) for f in files],
        "model": str(base),
        "rows_in": rows_in,
        "rows_kept": rows_kept,
        "rows_quarantined": len(quarantine.entries),
        "reasons": dict(sorted(quarantine.reasons.items())),
        "splits": splits,
        "clips": {"total": len(clip_path), "failed": len(problems)},
        "patch_size": enc.patch_size,
        "latent_dim": enc.vae.latent_dim,
        "vae_hash": enc.vae_hash,
        "tokenizer_hash": enc.tokenizer_hash,
        "cpu_threads": p.cpu_threads,
        "shard_mb": p.shard_mb,
    }
    run = {
        "clips": {"encoded": encoded, "reused": len(clip_path) - len(new)},
        "shards_rejected": rejected,
        "texts_tokenized": tokenized,
        "audio_seconds_encoded": round(sum(w.seconds for w, _ in done), 3),
        "encode_seconds": round(encode_seconds, 3),
        "clips_per_s": round(encoded / encode_seconds, 3) if encoded and encode_seconds > 0 else 0.0,
        "seconds": round(time.perf_counter() - start, 3),
        "world_size": world.size,
        "ranks": [{"device": d, "clips_encoded": w.stored, "cpu_seconds": round(w.cpu_seconds, 3)}
                  for w, d in done],
        "batch_seconds": batch_seconds(p, device) if device else None,
    }
    write_report(out, report, run)
    if rows_kept == 0:
        raise StepError(
            f"no row could be encoded ({rows_in} in, all quarantined: {report['reasons']}); "
            f"see {out / 'quarantine.jsonl'} for each row's file, line and reason"
        )
    return EncodeResult(out, report, run)
