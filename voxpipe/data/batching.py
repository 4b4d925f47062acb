"""Token-budget micro-batches: deterministic, length-bucketed, sharded across ranks, resumable.

A micro-batch is a list of row indices whose padded size (rows × longest row, in LM positions)
stays within `max_tokens`, so memory per step is bounded whatever the clip lengths, and rows of
similar length share a batch so little compute goes to padding. Each epoch: a seeded shuffle of
all rows, cut into windows of `window` rows, each window sorted by length and packed greedily,
then the batch order shuffled again (so lengths are not visited short-to-long). Every rank
computes the same list and takes every world_size-th batch; the list is padded by repeating
batches from its start (or cut, with drop_last) so all ranks run the same number of steps, which
FSDP's collectives require.

Rows longer than `max_tokens` can never fit; they are listed in `skipped` (the trainer reports
them) instead of being packed over budget.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from voxpipe.data.token_budget import TokenBudget


def pack_sorted(order: Sequence[int], lengths: Sequence[int], budget: TokenBudget) -> list[list[int]]:
    """Greedy batches over `order` (ascending length), each within `budget`."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and not budget.fits(len(current) + 1, lengths[i]):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def _fits(lengths: Sequence[int], budget: TokenBudget) -> tuple[list[int], list[int]]:
    fit = [i for i, n in enumerate(lengths) if budget.admits(n)]
    skipped = [i for i, n in enumerate(lengths) if not budget.admits(n)]
    return fit, skipped


def _shard(batches: list[list[int]], rank: int, world_size: int, drop_last: bool) -> list[list[int]]:
    per_rank = len(batches) // world_size if drop_last else -(-len(batches) // world_size)
    padded = [batches[i % len(batches)] for i in range(per_rank * world_size)] if batches else []
    return padded[rank::world_size]


class TokenBudgetSampler:
    """Yields lists of row indices, one micro-batch at a time, for this rank; see the module docstring.

    `position` counts batches handed out in the current epoch; `state_dict()` saved after a
    step and `load_state_dict()` on restart make the resumed run see exactly the batches the
    uninterrupted run would have seen next.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        window: int = 4096,
        drop_last: bool = False,
    ):
        self.budget = TokenBudget(max_tokens)
        if window <= 0:
            raise ValueError("window must be positive")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.lengths = [int(n) for n in lengths]
        self.max_tokens, self.seed, self.window, self.drop_last = max_tokens, seed, window, drop_last
        self.rank, self.world_size = rank, world_size
        self.fit, self.skipped = _fits(self.lengths, self.budget)
        if not self.fit:
            shortest = min(self.lengths, default=0)
            raise ValueError(f"no row fits max_tokens={max_tokens} (shortest row: {shortest} LM tokens)")
        self.epoch = 0
        self.position = 0
        self._cached: tuple[int, list[list[int]]] | None = None
        settings = [self.lengths, max_tokens, seed, world_size, window, drop_last]
        self.fingerprint = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:16]
        if not self.epoch_batches(0):
            raise ValueError(
                f"{len(self.global_batches(0))} batch(es) cannot go to {world_size} ranks with drop_last"
            )

    def global_batches(self, epoch: int) -> list[list[int]]:
        """All ranks' batches of `epoch`, before sharding."""
        rng = np.random.default_rng([self.seed, epoch])
        rows = [self.fit[i] for i in rng.permutation(len(self.fit))]
        batches: list[list[int]] = []
        for start in range(0, len(rows), self.window):
            chunk = sorted(rows[start : start + self.window], key=self.lengths.__getitem__)  # stable
            batches.extend(pack_sorted(chunk, self.lengths, self.budget))
        return [batches[i] for i in rng.permutation(len(batches))]

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of `epoch`, in order (a pure function of the settings and epoch)."""
        if self._cached is None or self._cached[0] != epoch:
            batches = _shard(self.global_batches(epoch), self.rank, self.world_size, self.drop_last)
            self._cached = (epoch, batches)
        return self._cached[1]

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank)."""
        return len(self.epoch_batches(self.epoch))

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch from `position`; then the epoch counter moves on."""
        batches = self.epoch_batches(self.epoch)
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                "sampler state was saved with different data or settings (rows, lengths, max_tokens, seed, "
                "world size, window or drop_last); resuming it would not continue the same batch sequence"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class EvalBatch(NamedTuple):
    indices: list[int]
    counted: bool  # False for a repeat that only keeps ranks in step: run it, leave it out of the metric


class EvalBatches:
    """Fixed validation batches: sorted by length, packed, sharded; identical on every call.

    Ranks that run out early get repeats marked `counted=False`, so every rank runs the same
    number of forwards and no row is counted twice.
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int, *, rank: int = 0, world_size: int = 1,
                 limit: int | None = None):
        self.lengths = [int(n) for n in lengths]
        budget = TokenBudget(max_tokens)
        fit, self.skipped = _fits(self.lengths, budget)
        order = sorted(fit, key=self.lengths.__getitem__)
        batches = pack_sorted(order, self.lengths, budget)[: limit or None]  # None / 0: all
        per_rank = -(-len(batches) // world_size)
        mine = batches[rank::world_size]
        filler = batches[: per_rank - len(mine)]
        self.batches = [EvalBatch(b, True) for b in mine] + [EvalBatch(b, False) for b in filler]

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[EvalBatch]:
        return iter(self.batches)


def fixed_size_batches(num_rows: int, batch_size: int, seed: int = 0) -> list[list[int]]:
    """Shuffled batches of `batch_size` rows regardless of length (upstream's DataLoader way)."""
    order = np.random.default_rng(seed).permutation(num_rows).tolist()
    return [order[i : i + batch_size] for i in range(0, num_rows, batch_size)]


def padding_waste(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Padding positions per real position: (Σ rows × longest − Σ lengths) / Σ lengths."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(TokenBudget.cost(len(b), max(lengths[i] for i in b)) for b in batches if b)
    return (padded - real) / real if real else 0.0
