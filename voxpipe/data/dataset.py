"""Read `voxpipe encode` output and pack rows into the batch VoxCPM2's forward takes.

`collate` builds the same tensors as upstream's training packer (AudioFeatureProcessingPacker)
builds from the same clips, without running the VAE:

    no reference:  [text…, 101, target patches…, 102]
    reference:     [103, ref patches…, 104, text…, 101, target patches…, 102]

Token slots under audio patches hold 0; text_mask / audio_mask pick the embedding source;
loss_mask is 1 on target patches only; labels (the stop target) is 1 on the last target patch;
position_ids count 0..len-1. Rows are right-padded with zeros to the longest row, which keeps
causal attention exact at the real positions, and cut at `max_len` like upstream.

Dtypes: text_tokens and position_ids int64, masks and labels int32 (as upstream), audio_feats
float32 [B, L, patch_size, latent_dim].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from voxpipe.data.jsonl import read_jsonl
from voxpipe.files import read_json_object
from voxpipe.model.config import AUDIO_END_ID, AUDIO_START_ID, REF_AUDIO_END_ID, REF_AUDIO_START_ID

BATCH_KEYS = ("text_tokens", "text_mask", "audio_feats", "audio_mask", "loss_mask", "position_ids", "labels")


@dataclass(frozen=True)
class Sample:
    text_ids: torch.Tensor  # [N] integer token ids
    latents: torch.Tensor  # [T, D] float32, T a multiple of patch_size
    ref_latents: torch.Tensor | None = None  # [R, D] or None


def sequence_length(text_tokens: int, audio_frames: int, ref_frames: int | None, patch_size: int) -> int:
    """LM positions of a packed row: text + 101 + patches + 102 (+ 103 + ref patches + 104)."""
    length = text_tokens + audio_frames // patch_size + 2
    if ref_frames is not None:
        length += ref_frames // patch_size + 2
    return length


def row_length(row: dict[str, Any], patch_size: int) -> int:
    """LM sequence length of one encoded row (for token budgets)."""
    return sequence_length(row["text_tokens"], row["audio_frames"], row.get("ref_frames"), patch_size)


class EncodedDataset:
    """One split of an encoded folder (`root/<split>.jsonl` + shards), tensors memory-mapped on demand.

    Shard handles are opened lazily per process and dropped when pickled, so the dataset can go
    to DataLoader workers.
    """

    def __init__(self, root: str | Path, split: str = "train"):
        self.root = Path(root)
        name = split if split.endswith(".jsonl") else f"{split}.jsonl"
        self.path = self.root / name
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such split (write it with `voxpipe encode`)")
        report_path = self.root / "report.json"
        report = read_json_object(report_path, "the encode report") if report_path.is_file() else {}
        self.patch_size: int = report.get("patch_size", 4)
        self.latent_dim: int = report.get("latent_dim", 64)
        self.vae_hash: str | None = report.get("vae_hash")
        self.rows: list[dict[str, Any]] = read_jsonl(self.path, "encoded rows")
        self._handles: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": {}}

    def lengths(self, patch_size: int | None = None) -> list[int]:
        """LM sequence length of every row, in row order."""
        p = patch_size or self.patch_size
        return [row_length(r, p) for r in self.rows]

    def _tensor(self, ref: dict[str, str]) -> torch.Tensor:
        shard = ref["shard"]
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = safe_open(str(self.root / shard), framework="pt")
        return handle.get_tensor(ref["key"])

    def __getitem__(self, index: int) -> Sample:
        row = self.rows[index]
        ref = row.get("ref_latents")
        return Sample(
            text_ids=self._tensor(row["tokens"]),
            latents=self._tensor(row["latents"]),
            ref_latents=self._tensor(ref) if ref else None,
        )


def _patches(latents: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[T, D] -> [T / P, P, D]: frame t*P + p lands in patch t, slot p (upstream's rearrange)."""
    frames, dim = latents.shape
    if frames % patch_size:
        raise ValueError(f"{frames} latent frames is not a multiple of patch_size {patch_size}")
    return latents.float().reshape(frames // patch_size, patch_size, dim)


def _pack_row(sample: Sample, patch_size: int) -> dict[str, torch.Tensor]:
    """One row's full-length tracks (before padding / truncation)."""
    text = sample.text_ids.long()
    target = _patches(sample.latents, patch_size)
    ref = _patches(sample.ref_latents, patch_size) if sample.ref_latents is not None else None
    n, a = text.numel(), target.shape[0]
    r = ref.shape[0] + 2 if ref is not None else 0  # 103, ref patches, 104
    length = r + n + a + 2
    tokens = torch.zeros(length, dtype=torch.long)
    feats = torch.zeros(length, patch_size, target.shape[-1], dtype=torch.float32)
    text_mask = torch.zeros(length, dtype=torch.int32)
    audio_mask = torch.zeros(length, dtype=torch.int32)
    if ref is not None:
        tokens[0], tokens[r - 1] = REF_AUDIO_START_ID, REF_AUDIO_END_ID
        text_mask[0] = text_mask[r - 1] = 1
        feats[1 : r - 1] = ref
        audio_mask[1 : r - 1] = 1
    start = r + n + 1  # first target patch
    tokens[r : r + n] = text
    tokens[start - 1] = AUDIO_START_ID
    tokens[-1] = AUDIO_END_ID
    text_mask[r:start] = 1
    text_mask[-1] = 1
    feats[start : start + a] = target
    audio_mask[start : start + a] = 1
    loss_mask = torch.zeros(length, dtype=torch.int32)
    loss_mask[start : start + a] = 1
    labels = torch.zeros(length, dtype=torch.int32)
    labels[-2] = 1  # stop on the last target patch
    return {"text_tokens": tokens, "text_mask": text_mask, "audio_feats": feats, "audio_mask": audio_mask,
            "loss_mask": loss_mask, "labels": labels, "position_ids": torch.arange(length)}


def collate(samples: list[Sample], patch_size: int, max_len: int | None = None) -> dict[str, torch.Tensor]:
    """Right-padded batch dict with BATCH_KEYS (see the module docstring for layout and dtypes)."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    rows = [_pack_row(s, patch_size) for s in samples]
    width = max(r["text_tokens"].numel() for r in rows)
    if max_len is not None:
        width = min(width, max_len)
    batch = {
        key: torch.zeros((len(rows), width, *value.shape[1:]), dtype=value.dtype)
        for key, value in rows[0].items()
    }
    for b, row in enumerate(rows):
        for key, value in row.items():
            kept = value[:width]
            batch[key][b, : kept.shape[0]] = kept
    return batch
