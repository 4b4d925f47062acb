"""Run-level errors: the CLI prints their message as one paragraph and exits non-zero."""

from __future__ import annotations


class StepError(Exception):
    """A problem that stops a whole step (bad params, no input, unreadable file, too many bad rows).

    `every_rank`: a collective decision (rank 0 decided, every rank of a torchrun world raises it), so
    only rank 0 prints it: the user reads it once, not once per rank."""

    def __init__(self, message: str, *, every_rank: bool = False):
        super().__init__(message)
        self.every_rank = every_rank
