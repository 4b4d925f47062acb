"""Learning-rate schedule: linear warmup, then cosine decay that lands on min_lr at the last step.

Upstream's cosine keeps following the cosine past max_steps, so a run that goes on longer than
planned climbs back towards the peak; here the decay is clamped and stays at min_lr.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmupCosine:
    peak_lr: float
    min_lr: float
    warmup_steps: int
    total_steps: int

    def __post_init__(self) -> None:
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if not 0 <= self.min_lr <= self.peak_lr:
            raise ValueError(f"need 0 <= min_lr ({self.min_lr}) <= peak lr ({self.peak_lr})")

    def lr(self, step: int) -> float:
        """Learning rate for optimizer step `step` (1-based: step 1 is the first update)."""
        warmup = min(self.warmup_steps, self.total_steps - 1)  # leave at least one decay step
        if step <= warmup:
            return self.peak_lr * step / warmup
        progress = min(1.0, (step - warmup) / (self.total_steps - warmup))
        return self.min_lr + 0.5 * (self.peak_lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))
