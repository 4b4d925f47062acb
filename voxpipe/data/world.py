"""The ranks of a data step under torchrun: who am I, share a list, wait for the others.

Data steps need no collectives on the accelerator, only a few small exchanges of Python objects
(file hashes, failures, counts), so they join a gloo group whatever the device: it works on CPU,
GPU and NPU alike and never touches the device. Outside torchrun the world is one process and
every exchange is a no-op, so the same code runs plain and distributed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from voxpipe.progress import bar

T = TypeVar("T")
R = TypeVar("R")
# ranks wait for each other at the end of the work: a slow rank's share may take hours
TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def map(self, fn: Callable[[T], R], items: Sequence[T], workers: int = 1, desc: str = "") -> list[R]:
        """[fn(x) for x in items], each rank computing every size-th item, the results shared by all.

        `workers` threads per rank (for I/O-bound fn: hashing releases the GIL); `desc` names the
        progress bar shown by rank 0 for long lists.
        """
        mine = items[self.rank :: self.size]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(bar(pool.map(fn, mine), enabled=bool(desc) and self.is_main and len(mine) >= 1000,
                               total=len(mine), desc=desc, unit="file"))
        parts = self.all_gather(results)
        out: list[Any] = [None] * len(items)
        for rank, part in enumerate(parts):
            out[rank :: self.size] = part
        return out


@contextmanager
def joined_world() -> Iterator[World]:
    """torchrun's world (env WORLD_SIZE, RANK, LOCAL_RANK) over gloo, or a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        yield World()
        return
    dist.init_process_group("gloo", timeout=TIMEOUT)
    try:
        yield World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    finally:
        dist.destroy_process_group()
