"""The trainer's view of `voxpipe encode` output: token-budget train batches and fixed val batches.

Train batches come from a deterministic sampler sharded across ranks whose position is saved in
every checkpoint; val batches are the same fixed list on every validation. Both are collated into
the batch contract of `VoxCPM2.forward` (upstream's packed layout, reference prompts included).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from voxpipe.data.batching import EvalBatches, TokenBudgetSampler
from voxpipe.data.dataset import EncodedDataset, collate
from voxpipe.data.shards import check_referenced, referenced_shards
from voxpipe.data.world import World
from voxpipe.errors import StepError
from voxpipe.files import read_json_object
from voxpipe.model.config import VoxCPM2Config
from voxpipe.model.encoder import load_encoder
from voxpipe.steps.train import TrainParams
from voxpipe.train.device import Runtime

Batch = dict[str, torch.Tensor]


def move_to(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@dataclass(frozen=True)
class ValBatch:
    key: int  # identifies the batch whatever the world size: seeds its flow-matching draws
    batch: Batch
    counted: bool  # False: a repeat that only keeps ranks in step


def _open(root: Path, split: str, config: VoxCPM2Config) -> EncodedDataset | None:
    try:
        data = EncodedDataset(root, split)
    except FileNotFoundError:
        return None
    if (data.patch_size, data.latent_dim) != (config.patch_size, config.feat_dim):
        raise StepError(
            f"{data.path}: encoded with patch_size {data.patch_size} and latent dim {data.latent_dim}, "
            f"but the model expects {config.patch_size} and {config.feat_dim}; "
            "encode with this model's checkpoint"
        )
    return data


def check_encoded_by(root: Path, base_dir: Path, rt: Runtime) -> None:
    """Latents from another VAE, or ids from another tokenizer, would silently train a garbage model.

    Collective: rank 0 compares the hashes `voxpipe encode` recorded with the base checkpoint's.
    """
    error = None
    if rt.is_main:
        report = root / "report.json"
        recorded = read_json_object(report, "the encode report") if report.is_file() else {}
        encoder = load_encoder(base_dir)
        for part, ours in (("vae", encoder.vae_hash), ("tokenizer", encoder.tokenizer_hash)):
            theirs = recorded.get(f"{part}_hash")
            if theirs != ours:
                error = (
                    f"{root} was encoded with {part} {str(theirs)[:12]}, but the base model {base_dir} has "
                    f"{part} {ours[:12]}; run `voxpipe encode --model-base {base_dir}` for this model"
                )
    verdict = [error]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise StepError(verdict[0], every_rank=True)


class TrainData:
    def __init__(self, root: Path, config: VoxCPM2Config, p: TrainParams, rt: Runtime):
        train = _open(root, "train", config)
        if train is None or not len(train):
            raise StepError(f"{root}: no encoded training rows (train.jsonl); run `voxpipe encode` first")
        self.train = train
        self.patch_size = config.patch_size
        self.max_len = config.max_length
        try:
            self.sampler = TokenBudgetSampler(
                train.lengths(), p.max_tokens, seed=p.seed, rank=rt.rank, world_size=rt.world_size
            )
        except ValueError as e:
            raise StepError(f"{train.path}: {e} (raise train.max_tokens)") from e
        self._batches = iter(self.sampler)
        self.val = _open(root, "val", config)
        self._val_plan = (
            EvalBatches(self.val.lengths(), p.max_tokens, rank=rt.rank, world_size=rt.world_size,
                        limit=p.val_batches)
            if self.val is not None and len(self.val)
            else None
        )
        self._val_cache: list[ValBatch] | None = None
        # before any tensor is read: every referenced shard as the encode index recorded it
        rows = train.rows + (self.val.rows if self.val is not None else [])
        check_referenced(root, referenced_shards(rows), World(rt.rank, rt.world_size))

    @property
    def rows_too_long(self) -> int:
        """Train rows that exceed the token budget and are never used (reported, not silently lost)."""
        return len(self.sampler.skipped)

    @property
    def has_val(self) -> bool:
        return self._val_plan is not None

    def next_train_batch(self) -> Batch:
        indices = next(self._batches, None)
        if indices is None:  # epoch over: the sampler has moved to the next one
            self._batches = iter(self.sampler)
            indices = next(self._batches)
        return self._collate(self.train, indices)

    def _collate(self, data: EncodedDataset, indices: list[int]) -> Batch:
        return collate([data[i] for i in indices], self.patch_size, self.max_len)

    def val_batches(self) -> list[ValBatch]:
        if self._val_plan is None:
            return []
        if self._val_cache is None:
            self._val_cache = [
                ValBatch(min(b.indices), self._collate(self.val, b.indices), b.counted)
                for b in self._val_plan
            ]
        return self._val_cache

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.sampler.load_state_dict(state)
        except ValueError as e:
            raise StepError(f"cannot resume the data order: {e}") from e
        self._batches = iter(self.sampler)
