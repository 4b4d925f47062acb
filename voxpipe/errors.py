"""Run-level errors: the CLI prints their message as one paragraph and exits non-zero."""


class StepError(Exception):
    """A problem that stops a whole step (bad params, no input, unreadable file, too many bad rows)."""
