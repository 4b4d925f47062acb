"""One deadline per request (`synthesize.deadline_s`), checked between generated patches: when it passes, or
the client has gone, generation stops there (VoxCPM2.sample_patches calls `check`), its caches are freed with
the frame, and the answer is a 503 naming the limit. Without it a request that a client or a proxy had given
up on kept a core and gigabytes for minutes (issue 34)."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass, field

from voxpipe.errors import StepError
from voxpipe.params import SynthesizeParams

DEADLINE_S: float = SynthesizeParams.model_fields["deadline_s"].default


class RequestStopped(StepError):
    """A request's work ended before its audio was done: its deadline passed, or its client left."""


@dataclass
class Deadline:
    seconds: float = DEADLINE_S
    start: float = field(default_factory=time.monotonic)
    gone: threading.Event = field(default_factory=threading.Event)  # set when the client has left

    def remaining(self) -> float:
        return self.start + self.seconds - time.monotonic()

    def check(self) -> None:
        if self.gone.is_set():
            raise RequestStopped("the client closed the connection; its generation was stopped")
        if self.remaining() <= 0:
            raise RequestStopped(
                f"the request ran past its {self.seconds:g} s deadline (synthesize.deadline_s) and was "
                "stopped; send a shorter text, fewer inference_timesteps or a lower max_len"
            )


def release_memory() -> None:
    """What a stopped generation held goes back at once, not at the next collection (the accelerator's cache
    too)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
