"""Progress that both a terminal and a pod log can show.

On a terminal: tqdm bars, redrawn in place. Elsewhere (`kubectl logs`, the KFP log view, a CI log,
a pipe) a bar redrawn with `\\r` becomes thousands of lines, so bars are off and long steps log one
line every N units instead (`train.log_every` for training).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def on_terminal() -> bool:
    """Both streams a person would watch are a terminal (a pod, a pipe or a file: no)."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def bar(iterable: Iterable[Any] | None = None, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar that draws only on a terminal (and where `enabled`, e.g. on rank 0)."""
    return tqdm(iterable, disable=not (enabled and on_terminal()), **kwargs)


def _figure(value: Any, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{suffix}"


def step_line(record: dict[str, Any], total: int) -> str:
    """One training step as a log line: step, loss, lr, tokens/s, MFU, peak memory."""
    mfu = record.get("mfu")
    return (
        f"step {record['step']}/{total} loss {_figure(record.get('loss'), '.4f')} "
        f"lr {_figure(record.get('lr'), '.3g')} tokens/s {_figure(record.get('tokens_per_s'), '.0f')} "
        f"mfu {_figure(None if mfu is None else 100 * mfu, '.2f', ' %')} "
        f"peak_mem {_figure(record.get('memory/peak_gib'), '.2f', ' GiB')}"
    )


class StepProgress:
    """Training progress of one process: a bar on a terminal, else a log line every `every` steps (and
    at the last). Only where `enabled` (rank 0), so N ranks do not print N copies."""

    def __init__(self, total: int, initial: int, enabled: bool, every: int, logger: logging.Logger):
        self.total, self.every, self.enabled, self.logger = total, every, enabled, logger
        self.bar = bar(total=total, initial=initial, enabled=enabled, desc="train", unit="step")

    def update(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if not self.bar.disable:
            self.bar.update(1)
            self.bar.set_postfix_str(
                f"loss {record['loss']:.4f} lr {record['lr']:.2e} {record['tokens_per_s']:.0f} tok/s"
            )
        elif record["step"] % self.every == 0 or record["step"] == self.total:
            self.logger.info("%s", step_line(record, self.total))

    def close(self) -> None:
        self.bar.close()


class Progress:
    """Progress of one long stage that is not a training loop (evaluate's loss, generation, scoring): a
    bar on a terminal, else a log line at most every `every_s` seconds and one when the stage ends."""

    def __init__(
        self, total: int, desc: str, logger: logging.Logger, unit: str = "it", every_s: float = 30.0
    ) -> None:
        self.total, self.desc, self.unit, self.logger, self.every_s = total, desc, unit, logger, every_s
        self.bar = bar(total=total, desc=desc, unit=unit)
        self.done = 0
        self.start = self.last_line = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.bar.disable:
            self.bar.update(n)
        elif time.monotonic() - self.last_line >= self.every_s and self.done < self.total:
            self._line()

    def _line(self) -> None:
        self.last_line = time.monotonic()
        elapsed = self.last_line - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        self.logger.info("%s: %d/%d %s, %.0f s elapsed, eta %s", self.desc, self.done, self.total, self.unit,
                         elapsed, "n/a" if eta is None else f"{eta:.0f} s")

    def close(self) -> None:
        if self.bar.disable:
            self._line()
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
