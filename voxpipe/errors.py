"""Run-level errors: the CLI prints their message as one paragraph and exits non-zero."""

from __future__ import annotations

from typing import Any

QUOTE_CHARS = 80  # the most of a user's value an error message quotes


class StepError(Exception):
    """A problem that stops a whole step (bad params, no input, unreadable file, too many bad rows).

    `every_rank`: a collective decision (rank 0 decided, every rank of a torchrun world raises it), so
    only rank 0 prints it: the user reads it once, not once per rank."""

    def __init__(self, message: str, *, every_rank: bool = False):
        super().__init__(message)
        self.every_rank = every_rank


def quoted(value: Any, limit: int = QUOTE_CHARS) -> str:
    """A user's value as an error message quotes it: its repr, cut to `limit` characters with how long it
    was, so a 300,000-character text refused is a line, not 300 KB of message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str) else f"{len(text):,} characters written out"
    return f"{text[:limit]}... ({size})"


def quoted_path(path: Any, limit: int = QUOTE_CHARS) -> str:
    """A path as an error message names it: whole up to `limit` characters, else its end (the file's
    name is what the reader needs)."""
    text = str(path)
    return text if len(text) <= limit else "…" + text[-(limit - 1):]
