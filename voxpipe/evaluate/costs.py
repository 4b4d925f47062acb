"""What evaluate's time went to: wall and CPU seconds per phase, and how many items each phase did.

run.json carries it (`costs`) so that a user can see, per clip, what generation, ASR, the speaker
encoder, pitch and DNSMOS cost on their own machine, and project a larger evaluation from it
(docs/evaluation.md). CPU seconds are the calling thread's own (`time.thread_time`): the scoring thread
runs beside generation, and the process's total would count each phase's neighbour too. Evaluate runs
torch on one intra-op thread on the CPU, so a phase's torch work is in its own thread's time.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Costs:
    """Seconds and CPU seconds per named phase, summed over its calls; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = defaultdict(float)
        self._cpu: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)

    @contextmanager
    def phase(self, name: str, items: int = 1) -> Iterator[None]:
        """Time the block as `items` more of phase `name` (a clip, a model load, a seed's loss)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            with self._lock:
                self._seconds[name] += wall
                self._cpu[name] += cpu
                self._counts[name] += items

    def as_dict(self) -> dict[str, Any]:
        """run.json's `costs`: per phase its seconds, CPU seconds, count and seconds per item."""
        with self._lock:
            names = sorted(self._seconds)
            return {
                "phase_seconds": {n: round(self._seconds[n], 3) for n in names},
                "phase_cpu_seconds": {n: round(self._cpu[n], 3) for n in names},
                "counts": {n: self._counts[n] for n in names},
                "seconds_per_item": {n: round(self._seconds[n] / max(self._counts[n], 1), 4) for n in names},
            }
