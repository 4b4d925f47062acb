"""Bounded concurrency for `voxpipe serve`: `slots` requests generate at once, `queue` more wait; past them
a 429 at once, and a request that waits past its deadline gets a 503. The model's memory is thus bounded by
`slots` generations, never by how many clients call at once."""

from __future__ import annotations

import threading

from voxpipe.errors import StepError
from voxpipe.serve.deadline import Deadline, RequestStopped

WAIT_STEP_S = 0.1  # how often a queued request looks whether its client is still there


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
        try:
            while not self._free.acquire(timeout=min(WAIT_STEP_S, max(0.0, deadline.remaining()))):
                deadline.gone_check()  # a client that left while queued gives its place back
                if deadline.remaining() <= 0:
                    raise RequestStopped(f"no free slot within the request's {deadline.seconds:g} s deadline "
                                         "(synthesize.deadline_s); the server is overloaded, retry later")
        except RequestStopped:
            with self._lock:
                self.admitted -= 1
            raise

    def leave(self) -> None:
        self._free.release()
        with self._lock:
            self.admitted -= 1
