"""Fixed-seed validation loss: the one loss figure that shows a trend between checkpoints.

The per-step training loss redraws flow-matching t and noise every step, so it stays nearly flat
while the model learns. Here every val batch gets its own generator seeded from (seed, batch key),
condition dropout is off and the model is in eval mode: the same weights give the same numbers bit
for bit, and two checkpoints see exactly the same t, noise and batches (a paired comparison).
Batches are the length-sorted token-budget packing of the val set (`batching.EvalBatches`),
identical on every call; because each batch carries its own generator, the figures depend neither
on batch order nor on how batches are spread over ranks. The trainer's in-loop validation and
`voxpipe evaluate` both go through `fixed_seed_loss`, so their numbers agree for the same weights,
batches and seed.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from voxpipe.data.batching import EvalBatches
from voxpipe.data.dataset import EncodedDataset, collate

SEED_STRIDE = 1_000_003  # seed * stride + batch key: distinct streams for every (seed, batch)


@dataclass(frozen=True)
class LossBatch:
    key: int  # seeds the batch's draws wherever it runs: its smallest row index
    batch: dict[str, torch.Tensor]
    counted: bool = True  # False: a repeat that only keeps ranks in step


@dataclass(frozen=True)
class FixedSeedLoss:
    diff: float  # flow-matching loss, mean over target patches
    stop: float  # stop-head cross entropy, mean over target patches
    patches: float  # target patches counted

    @property
    def total(self) -> float:
        return self.diff + self.stop

    def as_dict(self) -> dict[str, float]:
        return {"total": self.total, "diff": self.diff, "stop": self.stop, "patches": self.patches}


def val_loss_batches(
    data: EncodedDataset,
    patch_size: int,
    max_tokens: int,
    max_len: int | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    limit: int | None = None,
) -> list[LossBatch]:
    """The fixed val batches, collated once (reused for every seed and every checkpoint)."""
    plan = EvalBatches(data.lengths(patch_size), max_tokens, rank=rank, world_size=world_size, limit=limit)
    return [
        LossBatch(min(b.indices), collate([data[i] for i in b.indices], patch_size, max_len), b.counted)
        for b in plan
    ]


def val_digest(batches: Iterable[LossBatch], seeds: Sequence[int]) -> str:
    """What a fixed-seed loss can be compared on: the collated val batches (rows, packing, cut) and the
    seeds. Two losses with the same digest saw the same tensors with the same draws; the promotion rule
    compares a candidate with a champion only then."""
    digest = hashlib.sha256(repr(list(seeds)).encode())
    for lb in batches:
        digest.update(f"{lb.key}:{lb.counted}".encode())
        for name in sorted(lb.batch):
            tensor = lb.batch[name].contiguous()
            digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
            digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


@torch.no_grad()
def fixed_seed_loss(
    model: nn.Module,
    batches: Iterable[LossBatch],
    device: torch.device,
    seed: int,
    reduce: Callable[[list[float]], list[float]] | None = None,
) -> FixedSeedLoss:
    """Loss over `batches` with seeded draws and no condition dropout; the model's mode is restored.

    Figures are weighted by target patches, so they are means over patches, not over batches.
    `reduce` sums [diff·w, stop·w, w] across ranks (e.g. an all_reduce) before dividing.
    """
    was_training = model.training
    model.eval()
    sums = [0.0, 0.0, 0.0]
    try:
        for lb in batches:
            generator = torch.Generator(device).manual_seed(seed * SEED_STRIDE + lb.key)
            batch = {k: v.to(device, non_blocking=True) for k, v in lb.batch.items()}
            out = model(**batch, generator=generator, cond_dropout=False)
            if lb.counted:
                weight = float(lb.batch["loss_mask"].sum())
                sums[0] += float(out["loss/diff"]) * weight
                sums[1] += float(out["loss/stop"]) * weight
                sums[2] += weight
    finally:
        model.train(was_training)
    if reduce is not None:
        sums = reduce(sums)
    weight = max(sums[2], 1.0)
    return FixedSeedLoss(sums[0] / weight, sums[1] / weight, sums[2])


def spread(values: Sequence[float]) -> dict[str, float]:
    """mean, std (sample std; 0 for a single value), min and max."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "min": min(values), "max": max(values)}


def summarize_seeds(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread over seeds of each model's figures and of the paired deltas (model − baseline).

    `seed_spread` is the larger of the two models' std of the total loss over seeds: how much the
    loss moves from the draw of t and noise alone. A delta smaller than that is not evidence.
    """
    out: dict[str, Any] = {}
    for who in ("model", "baseline"):
        out[who] = {k: spread([s[who][k] for s in per_seed]) for k in ("total", "diff", "stop")}
    out["delta"] = {
        k: spread([s["model"][k] - s["baseline"][k] for s in per_seed]) for k in ("total", "diff", "stop")
    }
    out["seed_spread"] = max(out["model"]["total"]["std"], out["baseline"]["total"]["std"])
    return out
