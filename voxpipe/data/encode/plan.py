"""encode's plan: batches over the whole set, whole batches dealt to the ranks.

A clip always lands in the same batch whatever the world size or how much an earlier run did,
because batch composition changes the AudioVAE's float sums (see voxpipe.data.encode).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path


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

