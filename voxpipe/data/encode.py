"""`voxpipe encode`: every manifest row's audio (and ref_audio) through the AudioVAE once, offline.

Upstream re-encodes each clip on every training step, one clip at a time. Here each clip is
padded on the right to a multiple of hop × patch_size (2560 samples), exactly as upstream's packer
pads it, and encoded in batches of similar length (small ones on CPU, where the VAE is
memory-bound); the encoder is causal, so the batch's extra right padding never changes a clip's
frames, which are then cropped back to the clip's own padded length. Text goes through the
checkpoint's tokenizer.

Layout of `out/`:
- `shards/lat-*.safetensors`: fp32 latents [frames, 64], one tensor per clip named by the sha256
  of the audio file's bytes; `shards/tok-*.safetensors`: int32 token ids named by sha256 of the text.
- `index.jsonl`: one line per complete shard (kind, VAE or tokenizer hash, entry → length). A
  clip is encoded again only when (audio sha256, VAE hash) is not in it, so reruns do no VAE work
  and an interrupted run resumes at the first shard it had not registered. Shards are written to a
  temp name and renamed before they are registered; their names derive from their content, so a
  resumed run produces the very files an uninterrupted one would.
- `<manifest name>.jsonl` per input manifest (see `encoded_row`), `quarantine.jsonl`, `report.json`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from voxpipe.data.audio import AudioDecodeError, decode
from voxpipe.data.dataset import sequence_length
from voxpipe.errors import StepError
from voxpipe.model.audiovae import AudioVAE, load_audiovae_state_dict, load_audiovae_weights
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.tokenizer import VoxTokenizer
from voxpipe.params import EncodeParams
from voxpipe.report import atomic_write_text, write_report

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
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                quarantine.add(str(path), line_no, "bad_json", str(e))
                continue
            if not isinstance(data, dict):
                quarantine.add(str(path), line_no, "bad_json", "a manifest line must be a JSON object")
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


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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

    def _one(self, path: Path) -> tuple[str | None, str | None]:
        """(sha256, None) or (None, problem)."""
        try:
            st = path.stat()
        except OSError:
            return None, f"audio file {path} does not exist"
        if st.st_size == 0:
            return None, f"audio file {path} is empty (0 bytes)"
        stamp = [st.st_size, st.st_mtime_ns]
        key = os.path.abspath(path)
        cached = self.cache.get(key)
        if cached and cached[:2] == stamp:
            return cached[2], None
        try:
            sha = _sha256_file(path)
        except OSError as e:
            return None, f"cannot read {path}: {e}"
        self.cache[key] = [*stamp, sha]
        return sha, None

    def hash_all(self, paths: list[Path]) -> Hashes:
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(tqdm(pool.map(self._one, paths), total=len(paths), desc="hash", unit="file",
                                disable=len(paths) < 1000))
        atomic_write_text(self.path, json.dumps(self.cache, sort_keys=True))
        return dict(zip(paths, results, strict=True))


# ---------------------------------------------------------------------------------------------
# Shards and the index that registers them
# ---------------------------------------------------------------------------------------------


class ShardIndex:
    """`index.jsonl`: one line per complete shard; the only record of what is already encoded."""

    def __init__(self, out: Path):
        self.path = out / "index.jsonl"
        self.entries: dict[tuple[str, str, str], tuple[str, int]] = {}
        if not self.path.is_file():
            return
        raw = self.path.read_bytes()
        good = raw[: raw.rfind(b"\n") + 1]  # a line torn by a kill mid-append is not registered
        if len(good) != len(raw):
            atomic_write_text(self.path, good.decode())
        for line in good.decode().splitlines():
            if line.strip():
                self._add(json.loads(line))

    def _add(self, record: dict[str, Any]) -> None:
        for name, length in record["entries"].items():
            self.entries[(record["kind"], record["hash"], name)] = (record["shard"], length)

    def has(self, kind: str, hash_: str, name: str) -> bool:
        return (kind, hash_, name) in self.entries

    def write_shard(self, out: Path, kind: str, hash_: str, tensors: dict[str, torch.Tensor]) -> str:
        """Save atomically under a content-derived name, then register it; returns its path in `out`."""
        key = hashlib.sha256(json.dumps([kind, hash_, sorted(tensors)]).encode()).hexdigest()[:20]
        rel = f"shards/{kind[:3]}-{key}.safetensors"
        final = out / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        # one metadata key: safetensors writes several in random order, and shards must be reproducible
        save_file(tensors, str(tmp), metadata={"voxpipe": json.dumps({"kind": kind, "hash": hash_})})
        os.replace(tmp, final)
        record = {"shard": rel, "kind": kind, "hash": hash_,
                  "entries": {name: int(t.shape[0]) for name, t in sorted(tensors.items())}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._add(record)
        return rel


def _remove_stale_temps(shards: Path) -> None:
    if shards.is_dir():
        for tmp in shards.glob(".*.tmp-*"):
            tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------


@dataclass
class EncodeResult:
    out: Path
    report: dict[str, Any]

    def summary(self) -> str:
        r = self.report
        clips = r["clips"]
        speed = ""
        if clips["encoded"]:
            rate = f"{r['clips_per_s']:.1f} clips/s on {r['device']}"
            speed = f" ({r['audio_seconds_encoded']:.1f} s of audio, {rate})"
        return (
            f"encode: {r['rows_in']} rows → {r['rows_kept']} kept, {r['rows_quarantined']} quarantined; "
            f"clips: {clips['encoded']} encoded{speed}, {clips['reused']} reused, {clips['failed']} failed "
            f"→ {self.out}"
        )


def _device(choice: str) -> torch.device:
    from voxpipe.train.device import resolve_device_type  # lazily: torch_npu is only probed here

    return torch.device(resolve_device_type(choice))


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


def _plan_shards(frames: list[int], latent_dim: int, shard_bytes: float) -> list[slice]:
    """Consecutive slices of the (sorted) pending clips holding about `shard_bytes` of latents each."""
    slices, start, size = [], 0, 0
    for i, n in enumerate(frames):
        clip_bytes = n * latent_dim * 4
        if i > start and size + clip_bytes > shard_bytes:
            slices.append(slice(start, i))
            start, size = i, 0
        size += clip_bytes
    if start < len(frames):
        slices.append(slice(start, len(frames)))
    return slices


def _encode_pending(
    enc: Encoder,
    index: ShardIndex,
    out: Path,
    pending: list[tuple[str, Path, int]],
    p: EncodeParams,
    device: torch.device,
) -> tuple[dict[str, str], float]:
    """Encode clips (sha, path, samples) shard by shard; returns failures (sha → problem), audio seconds.

    Shards and the VAE batches inside them are planned from the sorted pending list alone, so a
    resumed run (whose pending list is the old one minus its first, registered shards) repeats
    the uninterrupted run's remaining shards exactly.
    """
    vae, sr, multiple = enc.vae, enc.vae.sample_rate, enc.multiple
    batch_samples = int(batch_seconds(p, device) * sr)
    padded = [math.ceil(n / multiple) * multiple for _, _, n in pending]
    failed: dict[str, str] = {}
    seconds = 0.0
    bar = tqdm(total=len(pending), desc="encode", unit="clip")
    with ThreadPoolExecutor(max_workers=1) as reader:  # decodes the next batch while the VAE runs
        for shard in _plan_shards([n // vae.hop_length for n in padded], vae.latent_dim, p.shard_mb * 1e6):
            clips = pending[shard]
            batches = plan_batches(padded[shard], batch_samples)
            tensors: dict[str, torch.Tensor] = {}
            future = reader.submit(_decode_all, [clips[i][1] for i in batches[0]], sr)
            for k, batch in enumerate(batches):
                decoded = dict(zip((clips[i][0] for i in batch), future.result(), strict=True))
                if k + 1 < len(batches):
                    future = reader.submit(_decode_all, [clips[i][1] for i in batches[k + 1]], sr)
                failed.update((sha, w) for sha, w in decoded.items() if isinstance(w, str))
                good = {sha: w for sha, w in decoded.items() if not isinstance(w, str)}
                if good:
                    latents = encode_batch(vae, list(good.values()), multiple, device)
                    tensors.update(zip(good, latents, strict=True))
                    seconds += sum(len(w) for w in good.values()) / sr
                bar.update(len(batch))
            if tensors:
                index.write_shard(out, LATENTS, enc.vae_hash, tensors)
    bar.close()
    return failed, seconds


def _tokenize_pending(enc: Encoder, index: ShardIndex, out: Path, texts: dict[str, str]) -> int:
    """Token ids of texts not yet in the index, in one shard; returns how many were tokenized."""
    pending = sorted(k for k in texts if not index.has(TOKENS, enc.tokenizer_hash, k))
    if pending:
        ids = enc.tokenizer.encode_batch([texts[k] for k in pending])
        tensors = {k: torch.tensor(i, dtype=torch.int32) for k, i in zip(pending, ids, strict=True)}
        index.write_shard(out, TOKENS, enc.tokenizer_hash, tensors)
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


def encode(p: EncodeParams) -> EncodeResult:
    start = time.perf_counter()
    files = _manifest_files(p.manifest)
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out / "shards")
    enc = load_encoder(p.model)
    index = ShardIndex(out)

    quarantine = Quarantine()
    per_file = {f: read_manifest(f, quarantine) for f in files}
    rows = [r for rs in per_file.values() for r in rs]
    rows_in = len(rows) + len(quarantine.entries)
    paths = sorted({p_ for r in rows for p_ in (r.audio, r.ref) if p_ is not None})
    hashes = FileHashes(out / "file_hashes.json").hash_all(paths)

    # clips by content: one entry per distinct audio sha, whatever the number of paths or rows using it
    clip_path: dict[str, Path] = {}
    for path in paths:
        if hashes[path][0] is not None:
            clip_path.setdefault(hashes[path][0], path)
    problems: dict[str, str] = {}
    pending: list[tuple[str, Path, int]] = []
    reused = 0
    for sha, path in clip_path.items():
        if index.has(LATENTS, enc.vae_hash, sha):
            reused += 1
            continue
        samples, problem = _estimate_samples(path, enc.vae.sample_rate)
        if problem:
            problems[sha] = problem
        else:
            pending.append((sha, path, samples))
    pending.sort(key=lambda c: (c[2], c[0]))

    texts = {_text_key(r.data["text"]): r.data["text"] for r in rows}
    tokenized = _tokenize_pending(enc, index, out, texts)

    device = None
    failed: dict[str, str] = {}
    seconds = 0.0
    encode_start = time.perf_counter()
    if pending:
        device = _device(p.device)
        enc.vae.to(device)
        failed, seconds = _encode_pending(enc, index, out, pending, p, device)
    encode_seconds = time.perf_counter() - encode_start
    problems.update(failed)

    splits = {f.name: _write_split(out / f.name, file_rows, out, enc, index, hashes, problems, quarantine)
              for f, file_rows in per_file.items()}
    quarantine.entries.sort(key=lambda e: (e["source"]["file"], e["source"]["line"]))
    atomic_write_text(out / "quarantine.jsonl", "".join(json.dumps(e, ensure_ascii=False) + "\n"
                                                         for e in quarantine.entries))

    rows_kept = sum(s["rows"] for s in splits.values())
    encoded = len(pending) - len(failed)
    report = {
        "manifests": [str(f) for f in files],
        "model": str(p.model),
        "rows_in": rows_in,
        "rows_kept": rows_kept,
        "rows_quarantined": len(quarantine.entries),
        "reasons": dict(sorted(quarantine.reasons.items())),
        "splits": splits,
        "clips": {"total": len(clip_path), "encoded": encoded, "reused": reused, "failed": len(problems)},
        "texts_tokenized": tokenized,
        "audio_seconds_encoded": round(seconds, 3),
        "encode_seconds": round(encode_seconds, 3),
        "clips_per_s": round(encoded / encode_seconds, 3) if encoded and encode_seconds > 0 else 0.0,
        "seconds": round(time.perf_counter() - start, 3),
        "device": str(device) if device else None,
        "patch_size": enc.patch_size,
        "latent_dim": enc.vae.latent_dim,
        "vae_hash": enc.vae_hash,
        "tokenizer_hash": enc.tokenizer_hash,
        "batch_seconds": batch_seconds(p, device) if device else None,
        "shard_mb": p.shard_mb,
    }
    write_report(out, report)
    if rows_kept == 0:
        raise StepError(
            f"no row could be encoded ({rows_in} in, all quarantined: {report['reasons']}); "
            f"see {out / 'quarantine.jsonl'} for each row's file, line and reason"
        )
    return EncodeResult(out, report)

