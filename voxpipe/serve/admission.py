"""Bounded concurrency for `voxpipe serve`: `slots` requests generate at once, `queue` more wait; past them
a 429 at once, and a request that waits past its deadline gets a 503. The model's memory is thus bounded by
`slots` generations, never by how many clients call at once."""

from __future__ import annotations

import threading

from voxpipe.errors import StepError
from voxpipe.serve.deadline import Deadline, RequestStopped


class Busy(StepError):
    """Every slot and queue place is taken: a 429, try again shortly."""


class Admission:
    def __init__(self, slots: int, queue: int) -> None:
        self.slots, self.queue = slots, queue
        self._free = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self.admitted = 0  # generating or waiting

    def enter(self, deadline: Deadline) -> None:
        """Take a slot (blocking while queued); leave() gives it back."""
        with self._lock:
            if self.admitted >= self.slots + self.queue:
                raise Busy(f"the server is busy: {self.slots} requests generating and {self.queue} waiting "
                           "(serve.concurrency, serve.queue); retry shortly")
            self.admitted += 1
        if not self._free.acquire(timeout=max(0.0, deadline.remaining())):
            with self._lock:
                self.admitted -= 1
            raise RequestStopped(f"no free slot within the request's {deadline.seconds:g} s deadline "
                                 "(synthesize.deadline_s); the server is overloaded, retry later")

    def leave(self) -> None:
        self._free.release()
        with self._lock:
            self.admitted -= 1
