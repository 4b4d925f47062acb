"""`voxpipe encode`: every manifest row's audio (and ref_audio) through the AudioVAE once, offline.

Upstream re-encodes each clip on every training step, one clip at a time. Here each clip is
padded on the right to a multiple of hop × patch_size (2560 samples), exactly as upstream's packer
pads it, and encoded in batches of similar length (small ones on CPU, where the VAE is
memory-bound); the encoder is causal, so the batch's extra right padding never changes a clip's
frames, which are then cropped back to the clip's own padded length. Text goes through the
checkpoint's tokenizer.

Under torchrun the work is split without changing a single bit of the result. Batch composition
and the CPU thread count change float sums (by about 1e-7), so the batches are planned once over
every clip of the set, exactly as one process plans them, whole batches are dealt to the ranks,
and each process runs `encode.cpu_threads` threads whatever the world size. Each rank encodes on
its own device and writes its own shards; rank 0 merges the index (see voxpipe.data.shards).

Layout of `out/`:
- `shards/lat-*.safetensors`: fp32 latents [frames, 64], one tensor per clip named by the sha256
  of the audio file's bytes; `shards/tok-*.safetensors`: int32 token ids named by sha256 of the text.
- `index.jsonl`: one line per complete, checksummed shard. A clip is encoded again only when
  (audio sha256, VAE hash) is not in it, so reruns do no VAE work and an interrupted run resumes
  with the batches it had not registered. Shard names derive from their content, so a resumed
  1-process run produces the very files an uninterrupted one would.
- `<manifest name>.jsonl` per input manifest (see `encoded_row`), `quarantine.jsonl`, `report.json`.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

from voxpipe.data.audio import AudioDecodeError, decode
from voxpipe.data.dataset import sequence_length
from voxpipe.data.jsonl import jsonl_records
from voxpipe.data.shards import ShardIndex, merge_parts, remove_stale_temps, verify_index
from voxpipe.data.world import World, joined_world
from voxpipe.errors import StepError
from voxpipe.integrity import file_entry
from voxpipe.model.audiovae import AudioVAE, load_audiovae_state_dict, load_audiovae_weights
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.memory import ensure_fits, parameter_bytes
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.params import EncodeParams, Params
from voxpipe.progress import bar as progress_bar
from voxpipe.report import atomic_write_text, write_report

log = logging.getLogger(__name__)
# Bump when the latent recipe changes (padding, cropping) so older latents are never reused.
RECIPE = "pad-right-to-hop-x-patch/v1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
LATENTS, TOKENS = "latents", "tokens"
Hashes = dict[Path, tuple[str | None, str | None]]  # audio file -> (sha256, None) or (None, problem)
# auto batch sizes (padded audio seconds): accelerators idle on one clip per call; on CPU big batches
# fall out of cache while small ones still amortise per-op thread overhead (benchmarks/encode.py)
AUTO_BATCH_SECONDS = {"cpu": 8.0, "accelerator": 60.0}


# ---------------------------------------------------------------------------------------------
# The base checkpoint: VAE + tokenizer only (the LM is not needed to encode)
# ---------------------------------------------------------------------------------------------


@dataclass
class Encoder:
    vae: AudioVAE
    tokenizer: VoxTokenizer
    patch_size: int
    vae_hash: str
    tokenizer_hash: str

    @property
    def multiple(self) -> int:
        """Samples each clip is right-padded to a multiple of (hop × patch, 2560 for VoxCPM2)."""
        return self.vae.hop_length * self.patch_size


def _digest_tensors(state: dict[str, torch.Tensor], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for key in sorted(state):
        t = state[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def load_encoder(model_dir: str | Path) -> Encoder:
    """AudioVAE (fp32, eval, frozen) + tokenizer from a checkpoint dir, with their content hashes.

    The VAE hash covers the weights, the VAE config, the patch size and RECIPE: anything that
    changes a latent changes the key, so stale latents are never picked up.
    """
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise StepError(f"{model_dir}: not a VoxCPM2 checkpoint (no config.json); run `voxpipe init-model`")
    config = VoxCPM2Config.from_file(config_path)
    needed = parameter_bytes(lambda: AudioVAE(config.audio_vae_config))
    ensure_fits(needed, torch.device("cpu"), "the AudioVAE", config_path)
    vae = AudioVAE(config.audio_vae_config)
    try:
        state = load_audiovae_state_dict(model_dir)
        load_audiovae_weights(vae, state, source=str(model_dir))
        tokenizer = VoxTokenizer.from_dir(model_dir)
    except (FileNotFoundError, ValueError) as e:
        raise StepError(str(e)) from e
    vae.float().eval().requires_grad_(False)
    vae_hash = _digest_tensors(
        state, json.dumps([vae.config.model_dump(mode="json"), config.patch_size, RECIPE], sort_keys=True)
    )
    tok = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        tok.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return Encoder(vae, tokenizer, config.patch_size, vae_hash, tok.hexdigest())


def encode_batch(
    vae: AudioVAE, wavs: list[np.ndarray], multiple: int, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """Latents [frames, D] (fp32, CPU) of each 1-D waveform, encoded together in one VAE call.

    Each clip is right-padded to a multiple of `multiple` samples (as upstream's packer does),
    then to the longest clip; its frames are cropped back to its own padded length.
    """
    padded = [math.ceil(len(w) / multiple) * multiple for w in wavs]
    batch = torch.zeros(len(wavs), 1, max(padded), dtype=torch.float32)
    for i, w in enumerate(wavs):
        batch[i, 0, : len(w)] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    with torch.inference_mode():
        z = vae.encode(batch.to(device))
    return [z[i, :, : n // vae.hop_length].T.float().cpu().contiguous() for i, n in enumerate(padded)]


def plan_batches(lengths: list[int], max_samples: int) -> list[list[int]]:
    """Greedy consecutive groups whose padded size (count × longest) stays within max_samples.

    `lengths` should be sorted so neighbours have similar length; a clip longer than the budget
    gets a batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, n) > max_samples:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


# ---------------------------------------------------------------------------------------------
# Manifest rows and their audio files
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# The plan: batches over the whole set, whole batches dealt to the ranks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    sha: str
    path: Path
    samples: int  # at the VAE's rate, from the file header


def deal(costs: list[int], ranks: int) -> list[list[int]]:
    """Batch numbers per rank: costliest first onto the least-loaded rank; each list in plan order."""
    loads = [(0, rank) for rank in range(ranks)]  # a heap: the least-loaded rank (lowest on ties) first
    dealt: list[list[int]] = [[] for _ in range(ranks)]
    for b in sorted(range(len(costs)), key=lambda b: (-costs[b], b)):
        load, rank = heapq.heappop(loads)
        dealt[rank].append(b)
        heapq.heappush(loads, (load + costs[b], rank))
    return [sorted(d) for d in dealt]


def group_shards(sizes: list[int], shard_bytes: float) -> list[list[int]]:
    """Consecutive batches (by their new latent bytes) holding about `shard_bytes` each."""
    groups: list[list[int]] = []
    size = 0
    for i, n in enumerate(sizes):
        if not groups or size + n > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += n
    return groups


def plan(
    clips: list[Clip], new: set[str], multiple: int, batch_samples: int, ranks: int
) -> list[list[list[Clip]]]:
    """Each rank's batches (lists of clips, in plan order) that hold a clip not yet encoded.

    The batches are planned over every clip, encoded or not, and depend on nothing else: a clip
    always lands in the same batch, whatever the world size or how much an earlier run did.
    """
    clips = sorted(clips, key=lambda c: (c.samples, c.sha))
    padded = [math.ceil(c.samples / multiple) * multiple for c in clips]
    todo = [b for b in plan_batches(padded, batch_samples) if any(clips[i].sha in new for i in b)]
    costs = [len(b) * max(padded[i] for i in b) for b in todo]
    return [[[clips[i] for i in todo[b]] for b in mine] for mine in deal(costs, ranks)]


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------


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
        )


def _device(choice: str, local_rank: int) -> torch.device:
    from voxpipe.device import resolve_device_type  # lazily: torch_npu is only probed here

    kind = resolve_device_type(choice)
    return torch.device(kind) if kind == "cpu" else torch.device(kind, local_rank)


@contextmanager
def _cpu_threads(device: torch.device, threads: int) -> Iterator[None]:
    """A fixed intra-op thread count on CPU: latents depend on it, so never on the core count."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def batch_seconds(p: EncodeParams, device: torch.device) -> float:
    if p.batch_seconds:
        return p.batch_seconds
    return AUTO_BATCH_SECONDS["cpu" if device.type == "cpu" else "accelerator"]


def _estimate_samples(path: Path, sample_rate: int) -> tuple[int | None, str | None]:
    """Clip length at the VAE's rate from the file header, to sort clips before decoding them."""
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError) as e:
        return None, f"cannot decode {path}: {str(e).strip() or type(e).__name__}"
    if info.frames <= 0:
        return None, f"{path} has no audio samples"
    return math.ceil(info.frames * sample_rate / info.samplerate), None


def _decode_all(paths: list[Path], sample_rate: int) -> list[np.ndarray | str]:
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
        future = reader.submit(_decode_all, [c.path for c in flat[0][1]], sr) if flat else None
        for k, (group, batch) in enumerate(flat):
            decoded = future.result()
            if k + 1 < len(flat):
                future = reader.submit(_decode_all, [c.path for c in flat[k + 1][1]], sr)
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


def _write_split(path: Path, rows: list[Row], out: Path, enc: Encoder, index: ShardIndex, hashes: Hashes,
                 problems: dict[str, str], quarantine: Quarantine) -> dict[str, int]:
    """out/<manifest name> with every row whose clips were encoded; the others are quarantined."""
    lines, totals = [], Counter(rows=0, ref_rows=0, audio_frames=0, lm_tokens=0)
    for row in rows:
        bad = _row_problem(row, hashes, problems)
        if bad:
            quarantine.add(row.file, row.line, *bad)
            continue
        data = encoded_row(row, out, enc, index, hashes)
        lines.append(json.dumps(data, ensure_ascii=False) + "\n")
        totals.update(rows=1, ref_rows=int(row.ref is not None), audio_frames=data["audio_frames"],
                      lm_tokens=data["lm_tokens"])
    atomic_write_text(path, "".join(lines))
    return dict(totals)


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


def _manifest_files(paths: Iterable[str]) -> list[Path]:
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


def encode(params: Params) -> EncodeResult:
    """`encode`, reading the base checkpoint from model.base (train's base: latents must match it).

    Plain or under torchrun: every rank runs this; rank 0 merges, writes the splits and reports.
    """
    p = params.encode
    files = _manifest_files(p.manifest)
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    with joined_world() as world:
        return _encode(world, p, params.model.base, files, out)


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
            clip_path.items(), world.map(lambda path: _estimate_samples(path, sr), list(clip_path.values())),
            strict=True,
        ):
            if problem:
                problems[sha] = problem
            else:
                clips.append(Clip(sha, path, samples))
        mine = plan(clips, new, enc.multiple, int(batch_seconds(p, device) * sr), world.size)[world.rank]
        with _cpu_threads(device, p.cpu_threads):
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
