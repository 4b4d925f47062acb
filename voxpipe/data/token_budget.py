"""The batch rule, in one place: a micro-batch costs rows × longest LM positions, at most max_tokens.

Rows are right-padded to the longest row of their batch (voxpipe/data/dataset.py), so a batch of
`rows` rows whose longest is `longest` positions computes rows × longest positions whatever the other
rows hold; bounding that bounds memory per step. Shaped after Lhotse's SamplingConstraint: the code
that makes or sizes batches asks this object instead of writing the rule again. The training sampler
and the validation batches (voxpipe/data/batching.py) ask whether a row may join a batch, the memory
planner (voxpipe/train/plan.py) asks for the largest batch allowed, and the FLOPs meter
(voxpipe/train/throughput.py) asks what a batch cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenBudget:
    """At most `max_tokens` padded LM positions per micro-batch (`train.max_tokens`)."""

    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")

    @staticmethod
    def cost(rows: int, longest: int) -> int:
        """Padded LM positions of a batch of `rows` rows padded to `longest` (what the device computes)."""
        return rows * longest

    def fits(self, rows: int, longest: int) -> bool:
        """Whether a batch of `rows` rows whose longest is `longest` positions stays within the budget."""
        return self.cost(rows, longest) <= self.max_tokens

    def admits(self, length: int) -> bool:
        """Whether a row of `length` positions fits at all (alone); a longer one is skipped, not packed."""
        return self.fits(1, length)

    def largest_batch(self, max_length: int) -> tuple[int, int]:
        """(rows, positions) of the largest batch the budget allows when a row is at most `max_length`
        positions (collate cuts it there): the longest possible rows, as many as fit."""
        longest = min(self.max_tokens, max_length)
        return self.max_tokens // longest, longest

    def widened_to(self, length: int) -> TokenBudget:
        """This budget, or a larger one that admits a row of `length` positions (evaluate scores every
        val row, so the longest gets a batch of its own rather than being skipped)."""
        return self if self.admits(length) else TokenBudget(length)
