"""SIGTERM (pod eviction, job preemption) becomes a flag the loop checks at the end of each step.

Killing the process mid-step would lose everything since the last checkpoint; with the flag the
loop finishes the step, saves a checkpoint and exits 0, and the restarted job resumes from it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType


class TerminationFlag:
    """Context manager: installs the SIGTERM handler on enter, restores the previous one on exit."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: signal.Handlers | None = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def __enter__(self) -> TerminationFlag:
        # signal handlers can only be set from the main thread (e.g. not inside a worker thread)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
